"""bench/soak.py: its stall rule on synthetic arrivals, and a short soak of the real graph.

The short soak (2 minutes of `dynnet up` with the camera cycling resolutions, budget changes
and a memory hog) asserts no stall and no growth of open file descriptors or threads in any
node process between the first and the last third of the run after warm-up.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.graph

REPO = Path(__file__).resolve().parents[1]
FD_SLACK = 2       # descriptors a node may hold more at the end than at its early peak
THREAD_SLACK = 2   # threads likewise


def load_soak():
    """bench/soak.py as a module (bench/ is scripts, not a package)."""
    if "soak" not in sys.modules:
        spec = importlib.util.spec_from_file_location("soak", REPO / "bench" / "soak.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["soak"] = module  # dataclasses resolve their annotations through sys.modules
        spec.loader.exec_module(module)
    return sys.modules["soak"]


def test_stall_rule_needs_input_and_scales_with_the_load():
    soak = load_soak()
    inputs = [i * 0.2 for i in range(0, 300)]                        # camera at 5 Hz for 60 s
    outputs = [t for t in inputs if not 20.0 < t < 26.0]              # the node stops for 6 s
    stalls, long_gaps = soak.find_gaps(outputs, inputs, 0.0, 60.0)
    assert [s["gap_s"] for s in stalls] == [pytest.approx(6.0, abs=0.05)] and long_gaps == []
    # the camera itself stopped too: not the node's stall
    starved = [t for t in inputs if not 20.0 < t < 26.0]
    assert soak.find_gaps(outputs, starved, 0.0, 60.0) == ([], [])
    # ... unless the node's own counter shows frames kept arriving at the node
    counters = [(t, int(t * 5), int(t * 5) if t < 20 else 100) for t in range(0, 60)]
    stalls, _ = soak.find_gaps(outputs, starved, 0.0, 60.0, counters)
    assert len(stalls) == 1
    # the observer missed outputs the node did process (its frames_processed rose): no gap at all
    processed = [(t, int(t * 5), int(t * 5)) for t in range(0, 60)]
    assert soak.find_gaps(outputs, inputs, 0.0, 60.0, processed) == ([], [])
    # outputs 2.5 s apart: stalls when the camera keeps its rate; with the camera at 2/3 of its
    # rate (the machine slows the whole graph) the threshold is 3 s: long gaps instead
    slow = [i * 2.5 for i in range(0, 24)]
    assert len(soak.find_gaps(slow, inputs, 0.0, 60.0)[0]) == 24  # 23 between outputs, 1 open at the end
    stalls, long_gaps = soak.find_gaps(slow, inputs, 0.0, 60.0, slowdown=1.5)
    assert stalls == [] and len(long_gaps) == 24
    # silence until the end while input arrives is an open stall
    stalls, _ = soak.find_gaps([t for t in inputs if t < 40.0], inputs, 0.0, 60.0)
    assert len(stalls) == 1 and stalls[0]["open"]


def test_slope_and_ranges():
    soak = load_soak()
    times = [i * 60.0 for i in range(11)]
    assert soak.rss_slope_mb_per_h(times, [100.0 + 0.1 * i for i in range(11)]) == pytest.approx(6.0)
    assert soak.rss_slope_mb_per_h(times[:2], [1.0, 2.0]) is None
    growing = soak.range_stats([10, 10, 11, 12, 13, 14])
    assert growing["growth"] == 4 and growing["min"] == 10 and growing["max"] == 14
    assert soak.range_stats([20, 22, 21, 20, 22, 21])["growth"] == 0


@pytest.mark.timeout(900)
def test_short_soak_has_no_stall_and_no_fd_or_thread_growth(tmp_path):
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--minutes", "2", "--warmup-min", "0.5",
                           "--sample-s", "3", "--rate-hz", "4", "--hog-mb", "128", "--hog-period-s", "30",
                           "--hog-on-s", "10", "--budget-period-s", "20", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=840)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    result = json.loads((out / "soak.json").read_text())
    assert (out / "soak.png").stat().st_size > 0
    assert result["dynnet_up_exit_code"] == 0, log
    # the soak did what it says: the hog came and went, budgets were changed, every model served
    assert any(h["end_s"] is not None for h in result["hog_events"]), result["hog_events"]
    assert result["budget_sets"], log
    for topic, entry in result["outputs"].items():
        assert entry["count"] > 0, (topic, log)
        assert entry["stalls"] == [], (topic, entry["stalls"])
    for name, entry in result["nodes"].items():
        assert entry["restarts"] == 0, (name, log)
        assert entry["fds"]["growth"] <= FD_SLACK, (name, entry["fds"])
        assert entry["threads"]["growth"] <= THREAD_SLACK, (name, entry["threads"])
    for name in ("lane_node", "pedestrian_node", "depth_node"):
        assert result["nodes"][name]["plan_cache_entries"]["max"] is not None, name
