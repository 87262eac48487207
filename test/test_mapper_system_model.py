"""The concurrent execution model against hand-computed schedules (sequential, concurrent, with
transmission, with exits)."""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.mapper.hardware import parse_hardware
from dynnet_ros.mapper.system_model import Task, TaskGraph, chain_graph, evaluate, schedule, width_graph

MB = 1 << 20


def _hardware(idle_w: float = 0.0, latency_ms: float = 1.0, ms_per_mb: float = 2.0):
    unit = {"kind": "cpu", "idle_power_w": idle_w, "dvfs": [{"name": "hi", "power_w": 10.0}]}
    return parse_hardware({"name": "t", "units": [dict(unit, name="a"), dict(unit, name="b")],
                           "exchange": {"default": {"latency_ms": latency_ms, "ms_per_mb": ms_per_mb}}})


def test_sequential_chain_adds_up_and_pays_a_handoff_between_units():
    hw = _hardware()
    one_unit = chain_graph([("g0", "a", 2.0, 20.0, MB, None), ("g1", "a", 3.0, 30.0, MB, None)])
    out = evaluate(one_unit, hw, [1.0])
    assert out.latency_ms == pytest.approx(5.0) and out.energy_mj == pytest.approx(50.0)
    # g0 on a, g1 on b: 1 MB crosses, 1 ms + 2 ms/MB
    split = chain_graph([("g0", "a", 2.0, 20.0, MB, None), ("g1", "b", 3.0, 30.0, MB, None)])
    assert evaluate(split, hw, [1.0]).latency_ms == pytest.approx(2.0 + 3.0 + 3.0)
    measured = chain_graph([("g0", "a", 2.0, 20.0, MB, 0.5), ("g1", "b", 3.0, 30.0, MB, None)])
    assert evaluate(measured, hw, [1.0]).latency_ms == pytest.approx(5.5)   # the profile's transition wins


def test_concurrent_stages_without_reuse_take_the_longer_stage():
    hw = _hardware()
    tasks = (Task(0, "s0l0", "a", 4.0, 1.0), Task(0, "s0l1", "a", 4.0, 1.0, needs=(0,)),
             Task(1, "s1l0", "b", 1.0, 1.0), Task(1, "s1l1", "b", 1.0, 1.0, needs=(2,)))
    sched = schedule(TaskGraph(tasks, (1, 3)), hw)
    assert sched.exit_ms.tolist() == [8.0, 2.0]
    assert sched.exit_latency().tolist() == [8.0, 8.0]   # leaving at stage 1 waits for exit 0 too
    # the same two stages on one unit serialise, earlier stage first
    shared = tuple(Task(t.stage, t.name, "a", t.latency_ms, t.energy_mj, needs=t.needs) for t in tasks)
    assert schedule(TaskGraph(shared, (1, 3)), hw).exit_ms.tolist() == [8.0, 10.0]


def test_reused_features_wait_for_their_transfer():
    # T_1^1 = tau + max(T_1^0, T_0^0 + u): stage 0 layer 0 finishes at 4, 0.5 MB cost 1 + 1 = 2 -> 6
    hw = _hardware()
    tasks = (Task(0, "s0l0", "a", 4.0, 0.0, out_bytes=MB // 2), Task(0, "s0l1", "a", 4.0, 0.0, needs=(0,)),
             Task(1, "s1l0", "b", 1.0, 0.0), Task(1, "s1l1", "b", 1.0, 0.0, needs=(2, 0)))
    sched = schedule(TaskGraph(tasks, (1, 3)), hw)
    assert sched.finish.tolist() == [4.0, 8.0, 1.0, 7.0]


def test_width_graph_matches_the_recurrence_by_hand():
    hw = _hardware(latency_ms=0.0, ms_per_mb=1.0)
    # cost: latency = 10 * in_fraction * out_fraction ms on a, twice that on b; energy = latency * 10 W
    def cost(layer, unit, fin, fout):
        ms = 10.0 * fin * fout * (1 if unit == "a" else 2)
        return ms, ms * 10.0
    partition = np.array([[0.5, 0.5], [0.5, 0.5]])
    reuse = np.array([[1, 0], [0, 0]])
    graph = width_graph(["l0", "l1"], [4 * MB, 4 * MB], partition, reuse, ["a", "b"], cost)
    sched = schedule(graph, hw)
    # stage 0 on a: l0 = 10*1*0.5 = 5, l1 = 10*0.5*0.5 = 2.5 -> 7.5
    # stage 1 on b: l0 = 2*10*1*0.5 = 10; l1 reads its own (0.5) + reused stage-0 (0.5): 2*10*1*0.5 = 10,
    # starts at max(10, 5 + 2 MB * 1 ms/MB = 7) = 10 -> 20
    assert sched.exit_ms.tolist() == pytest.approx([7.5, 20.0])
    assert graph.tasks[3].needs == (2, 0)


def test_expected_latency_and_energy_over_exit_rates():
    hw = _hardware(idle_w=1.0)
    tasks = (Task(0, "s0", "a", 2.0, 20.0), Task(1, "s1", "b", 6.0, 60.0))
    graph = TaskGraph(tasks, (0, 1))
    oracle = evaluate(graph, hw, [0.75, 0.25], accounting="oracle")
    assert oracle.exit_latency_ms == (2.0, 6.0)
    # idle: both units, 1 W each, over the frame
    assert oracle.exit_energy_mj == pytest.approx((20.0 + 2 * 2.0, 80.0 + 2 * 6.0))
    assert oracle.latency_ms == pytest.approx(0.75 * 2 + 0.25 * 6)
    assert oracle.energy_mj == pytest.approx(0.75 * 24 + 0.25 * 92)
    # speculative: stage 1 started with stage 0 and ran 2 of its 6 ms before the exit at 2 ms
    speculative = evaluate(graph, hw, [0.75, 0.25])
    assert speculative.exit_energy_mj[0] == pytest.approx(20.0 + 60.0 * 2 / 6 + 4.0)
    assert speculative.exit_energy_mj[1] == pytest.approx(oracle.exit_energy_mj[1])


def test_bad_inputs_are_refused():
    hw = _hardware()
    graph = chain_graph([("g0", "a", 1.0, 1.0, 0, None)])
    with pytest.raises(ValueError, match="sum to 1"):
        evaluate(graph, hw, [0.5])
    with pytest.raises(ValueError, match="not before it"):
        TaskGraph((Task(0, "x", "a", 1.0, 1.0, needs=(0,)),), (0,))
    with pytest.raises(ValueError, match="share"):
        width_graph(["l"], [0], np.array([[1.0], [0.0]]), np.zeros((2, 1)), ["a", "b"], lambda *a: (1.0, 1.0))


def test_runtime_costs_dispatch_contention_slowdown_and_handoff_by_hand():
    from dynnet_ros.mapper.system_model import RuntimeCosts
    hw = _hardware()
    # two independent 4 ms and 2 ms tasks on a and b at contention 1.5: both advance at 2/3 until b's
    # finishes at 3 ms (2 ms of work); a has 2 ms left, alone at full rate -> 5 ms
    pair = TaskGraph((Task(0, "x", "a", 4.0, 1.0), Task(1, "y", "b", 2.0, 1.0)), (0, 1))
    assert schedule(pair, hw, RuntimeCosts(0.0, 1.5)).finish.tolist() == pytest.approx([5.0, 3.0])
    assert schedule(pair, hw).finish.tolist() == pytest.approx([4.0, 2.0])
    # one unit: no overlap, so contention changes nothing; dispatch 0.5 per task; slowdown 2 doubles
    # each task's own time (2 * 2 + 0.5, then 3 * 2 + 0.5)
    chain = chain_graph([("g0", "a", 2.0, 20.0, 0, None), ("g1", "a", 3.0, 30.0, 0, None)])
    assert schedule(chain, hw, RuntimeCosts(0.5, 2.0)).finish.tolist() == pytest.approx([2.5, 6.0])
    assert schedule(chain, hw, RuntimeCosts(0.5, 1.0, 2.0)).finish.tolist() == pytest.approx([4.5, 11.0])
    # a handoff between units is paid on top of the transfer (no bytes here: no exchange cost)
    cross = chain_graph([("g0", "a", 2.0, 20.0, 0, None), ("g1", "b", 3.0, 30.0, 0, None)])
    assert schedule(cross, hw, RuntimeCosts(handoff_ms=0.5)).finish.tolist() == pytest.approx([2.0, 5.5])
    assert schedule(chain, hw, RuntimeCosts(handoff_ms=0.5)).finish.tolist() == pytest.approx([2.0, 5.0])
    # with a transfer (0.5 MB: 1 + 2 * 0.5 = 2 ms) at contention 2: s0l0 and s1l0 share 0..2 (s1l0 done),
    # s0l0 alone 2..5; s0l1 starts at 5, s1l1 waits for 5 + 2 = 7; both share 7..9 (s1l1 done at 9),
    # s0l1 has 1 ms left -> 10
    tasks = (Task(0, "s0l0", "a", 4.0, 0.0, out_bytes=MB // 2), Task(0, "s0l1", "a", 4.0, 0.0, needs=(0,)),
             Task(1, "s1l0", "b", 1.0, 0.0), Task(1, "s1l1", "b", 1.0, 0.0, needs=(2, 0)))
    sched = schedule(TaskGraph(tasks, (1, 3)), hw, RuntimeCosts(0.0, 2.0))
    assert sched.finish.tolist() == pytest.approx([5.0, 10.0, 2.0, 9.0])
    assert sched.start.tolist() == pytest.approx([0.0, 5.0, 0.0, 7.0])
    # the event simulation at (d, 1, 1) is the list schedule of the tasks lengthened by d
    longer = tuple(Task(t.stage, t.name, t.unit, t.latency_ms + 0.25, t.energy_mj, t.out_bytes, t.needs)
                   for t in tasks)
    assert schedule(TaskGraph(tasks, (1, 3)), hw, RuntimeCosts(0.25)).finish.tolist() == \
        pytest.approx(schedule(TaskGraph(longer, (1, 3)), hw).finish.tolist())
    # expected latency over exits goes through the same schedule
    out = evaluate(pair, hw, [0.5, 0.5], runtime=RuntimeCosts(0.0, 1.5))
    assert out.exit_latency_ms == pytest.approx((5.0, 5.0))
    with pytest.raises(ValueError, match="contention >= 1"):
        RuntimeCosts(0.0, 0.5)
    with pytest.raises(ValueError, match="slowdown > 0"):
        RuntimeCosts(0.0, 1.0, 0.0)
