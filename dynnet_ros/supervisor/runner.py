"""The graph supervisor: start the vehicle graph's processes, watch them, restart them, stop them.

``GraphRunner`` runs what `ros2 launch dynnet_ros vehicle.launch.py` starts, without needing
`launch`: one `python -m dynnet_ros.nodes.<x> --ros-args ...` process per node, or one component
container (`python -m dynnet_ros.nodes.container --components FILE ...`) per group of nodes the
config puts in one, each process in its own process group, output forwarded line by line with a
`[name]` prefix (a container's nodes share its prefix; their log lines name them). ``stop`` stops
them all with SIGINT; a node that needs SIGTERM or SIGKILL after a timeout makes the run a
failure. Children also get SIGTERM from the kernel if the supervisor itself is killed
(PR_SET_PDEATHSIG). `dynnet up`, `dynnet demo` and `dynnet replay` (commands/) run graphs with it.

A process that dies on its own (a crash, the kernel's OOM killer) is restarted under its
RespawnPolicy (a container with all its nodes) while the others keep running; one that keeps
crashing, has respawn off, or exits with status 0 unasked is left down, reported as an ERROR
line (`[dynnet up] ERROR: ...`) and on stderr, and makes the run a failure; so does one that
crashed again after a restart (a crash loop not yet at its limit when the run ends) or is still
down awaiting a restart at the end.

With its ROS link (`dynnet up` itself; nodes/supervisor_link.py) the supervisor also tells an
OOM kill from another SIGKILL (budget/oom.py: kernel counters read around the death), reports
it to the budget manager on dynnet/node_events and waits up to OOM_ANSWER_TIMEOUT_S for the
manager's answer, so the node restarts with the lowered budget; and it restarts every node with
the parameter values set on it at run time (seen on /parameter_events) over the config's; a
container's nodes each get their own.

Why a module of its own: the supervisor runs for as long as the graph does, so it holds rclpy
and the graph config only; the parameter check and the models' footprints run in a child
(``preflight``), and it never loads the engine, the mapper or the commands
(test/test_lean_imports.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynnet_ros.budget.oom import MemorySignals, oom_evidence, process_cgroup, read_signals
from dynnet_ros.budget.protocol import BUDGET_PARAM, OWNER_PARAM, NodeEvent
from dynnet_ros.bytesize import to_mb
from dynnet_ros.graph_config import (
    GraphConfig,
    ProcessSpec,
    RuntimeParameters,
    default_config_path,
    fq_node_name,
    graph_processes,
    load_graph,
    node_command,
    restart_process,
    validate_namespace,
    with_parameters,
    write_process_files,
)
from dynnet_ros.graph_transport import transport_env
from dynnet_ros.nodes.supervisor_link import SupervisorLink
from dynnet_ros.supervisor.preflight import check_in_child, measure_in_child
from dynnet_ros.supervisor.shm_orphans import remove_orphans

_PR_SET_PDEATHSIG = 1
#: how often the supervisor reads each live node's memory counters (the "before" of an OOM verdict)
SIGNALS_PERIOD_S = 1.0
#: how long a node killed for memory waits, beyond its respawn delay, for the budget manager's answer
OOM_ANSWER_TIMEOUT_S = 5.0
def graph_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Child environment: loopback-only discovery unless the user chose otherwise."""
    env = dict(os.environ if base is None else base)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _child_setup() -> None:  # runs in the child between fork and exec
    """Its own process group (the supervisor signals a node together with whatever it started),
    but not its own session: a session is also a scheduler autogroup where the kernel has them,
    and one per node would give a graph of separate processes one CPU share per node against the
    machine's other jobs, and a container one share for all of its nodes."""
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    """One node's current process and its crash history (the process is replaced on a restart)."""

    node: ProcessSpec
    argv: list[str]
    proc: subprocess.Popen
    reader: threading.Thread
    crashes: list[float] = field(default_factory=list)  # monotonic times of crashes within the window
    restart_at: float | None = None  # pending restart (monotonic time)
    restarts: int = 0
    signals: MemorySignals = field(default_factory=MemorySignals)  # its latest memory counters
    earlier: MemorySignals | None = None  # the reading before that: the baseline at its death
    signals_at: float = -1.0e9
    #: the NodeEvent number of each hosted node's last OOM kill (fully qualified name), until it restarts
    oom_events: dict[str, int] = field(default_factory=dict)
    answer_deadline: float = 0.0  # restart without the manager's answer after this


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def stop_process_group(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """Stop a process started with ``start_new_session=True`` (e.g. ``dynnet up``) and everything it
    started: SIGINT to the group (a clean shutdown), SIGKILL if it is still there after ``timeout``."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
    return proc.wait()

class GraphRunner:
    """Start, watch and stop one process per node. Use as a context manager."""

    def __init__(self, config: GraphConfig, *, use_sim: bool = True,
                 sink: Callable[[str, str], None] | None = None, env: dict[str, str] | None = None,
                 namespace: str = "", ros_link: bool = False, memory_root: Path = Path("/"),
                 sim_time: bool = False, extra: tuple[ProcessSpec, ...] = ()) -> None:
        self.config = config
        self.namespace = validate_namespace(namespace)
        self.nodes = graph_processes(config, use_sim, self.namespace)
        if sim_time:  # every node's ROS time follows /clock (`dynnet replay` publishes a bag's time there)
            self.nodes = [with_parameters(n, {"use_sim_time": True}) for n in self.nodes]
        if not self.nodes:
            raise ValueError(f"{config.source}: no nodes to start (all are sim nodes and --no-sim was given)")
        self.nodes += extra  # processes the command line adds (`--foxglove`), supervised like the rest
        self.env = graph_env(env)
        self.children: list[Child] = []
        self.stopping = False
        self.escalated: dict[str, str] = {}  # node -> SIGTERM/SIGKILL it needed after SIGINT (see stop)
        self.left_down: dict[str, str] = {}  # node -> why the supervisor stopped restarting it
        self.crash_looped: dict[str, str] = {}  # node -> its crashes, once it crashed again after a restart
        self._lock = threading.Lock()  # supervise() and stop() never interleave: no restart after a stop
        self._print_lock = threading.Lock()
        self._sink = sink or self._print
        self._tmp = tempfile.TemporaryDirectory(prefix="dynnet-up-")
        self.memory_root = memory_root
        self.runtime = RuntimeParameters()
        self._ros_link = ros_link
        self.link: SupervisorLink | None = None
        self._events = 0
        #: (node, parameter) changes the supervisor makes itself: not reported as set at run time
        self.own_changes: set[tuple[str, str]] = set()

    def _print(self, name: str, line: str) -> None:
        with self._print_lock:
            sys.stdout.write(f"[{name}] {line}\n")
            sys.stdout.flush()

    def hosted_nodes(self) -> list[ProcessSpec]:
        """Every node the graph runs, a container's one by one, in process order."""
        return [node for process in self.nodes for node in process.hosted]

    def prepare_models(self) -> None:
        """Build the zoo models the graph uses and measure each model's footprint at its size
        classes, one model at a time, before the nodes race to do both at once (in a child: the
        supervisor never loads the engine)."""
        measure_in_child(self.hosted_nodes(), lambda message: self._report("INFO", message))

    def commands(self) -> list[tuple[ProcessSpec, list[str]]]:
        """Each process's argv, what it reads at start (parameters, a container's components)
        written to the files the argv names."""
        return [(process, node_command(process, write_process_files(process, self._tmp.name)))
                for process in self.nodes]

    def start(self) -> None:
        self.prepare_models()
        if self._ros_link:
            nodes = [fq_node_name(n) for n in self.hosted_nodes()]
            recorder = next((fq_node_name(n) for n in self.hosted_nodes() if n.executable == "recorder"), None)
            self.link = SupervisorLink(self.namespace, nodes, self.runtime, self._on_parameter_change,
                                       recorder=recorder)
        for node, cmd in self.commands():
            proc, reader = self._spawn(node, cmd)
            self.children.append(Child(node, cmd, proc, reader))

    def _spawn(self, process: ProcessSpec, cmd: list[str]) -> tuple[subprocess.Popen, threading.Thread]:
        env = {**self.env, **transport_env(process, self.env)}
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env, text=True, bufsize=1, preexec_fn=_child_setup)
        reader = threading.Thread(target=self._forward, args=(process.name, proc), daemon=True)
        reader.start()
        return proc, reader

    def _report(self, level: str, message: str) -> None:
        """The supervisor's own line among the nodes' output; an ERROR also goes to stderr."""
        self._sink("dynnet up", f"{level}: {message}")
        if level == "ERROR":
            print(f"dynnet up: {message}", file=sys.stderr, flush=True)

    def _on_parameter_change(self, node: str, name: str, value: Any) -> None:
        if (node, name) in self.own_changes:
            self.own_changes.discard((node, name))
            return
        if name not in (BUDGET_PARAM, OWNER_PARAM):  # the budget manager's pushes are logged on its side
            short = next((n.name for n in self.hosted_nodes() if fq_node_name(n) == node), node)
            self._report("INFO", f"{short} {name} = {value!r} set at run time; kept for its restarts")

    def supervise(self) -> None:
        """One supervision step: note nodes that died, restart those whose delay has passed.

        Call it periodically (`run` does, every 0.2 s); without it nothing is restarted.
        """
        with self._lock:
            if self.stopping:
                return
            now = time.monotonic()
            for child in self.children:
                if child.node.name in self.left_down:
                    continue
                if child.restart_at is not None:
                    if now >= child.restart_at and self._answered(child, now):
                        self._restart(child)
                    continue
                code = child.proc.poll()
                if code is not None:
                    self._on_exit(child, code, now)
                elif now - child.signals_at >= SIGNALS_PERIOD_S:
                    child.earlier = child.signals
                    child.signals = read_signals(self.memory_root, process_cgroup(child.proc.pid))
                    child.signals_at = now

    def _manager_up(self) -> bool:
        """A budget manager of this graph is running (it answers OOM kills)."""
        return any(any(n.executable == "budget_manager" for n in c.node.hosted) and c.restart_at is None
                   and c.proc.poll() is None and c.node.name not in self.left_down for c in self.children)

    def _answered(self, child: Child, now: float) -> bool:
        """An OOM-killed process restarts once the manager answered for each of its nodes (or it
        waited long enough)."""
        link = self.link
        if link is None or all(link.oom_answer(event) is not None for event in child.oom_events.values()):
            return True
        if now < child.answer_deadline and self._manager_up():
            return False
        self._report("WARN", f"{child.node.name}: no answer from the budget manager to its OOM kill within "
                             f"{OOM_ANSWER_TIMEOUT_S:g} s; restarting it without a lowered budget")
        return True

    def _on_exit(self, child: Child, code: int, now: float) -> None:
        name, policy = child.node.name, child.node.respawn
        with contextlib.suppress(ProcessLookupError, PermissionError):  # what the node itself started goes with it
            os.killpg(child.proc.pid, signal.SIGKILL)
        self._remove_shm_orphans()
        if code == 0:
            self._leave_down(name, "exited with status 0 without being asked to stop; not restarted")
            return
        evidence = oom_evidence(code, *self._death_readings(child))
        what = describe_exit(code) if evidence is None else f"was OOM-killed ({evidence})"
        child.crashes = [t for t in child.crashes if now - t < policy.window_s] + [now]
        crashes = len(child.crashes)
        delay: float | None = None
        if not policy.enabled:
            self._leave_down(name, f"{what}; respawn is off, left down")
        elif policy.gives_up(crashes):
            self._leave_down(name, f"{what}; {crashes} crashes within {policy.window_s:g} s "
                                   f"(respawn_max_retries {policy.max_retries}), left down")
        else:
            if crashes > 1:  # a restart that did not help: the run is not a success even if a later one does
                self.crash_looped[name] = f"{what}; {crashes} crashes within {policy.window_s:g} s"
            delay = policy.delay_after(crashes)
            child.restart_at = now + delay
            self._report("WARN", f"{name} {what}; restarting in {delay:g} s "
                                 f"(restart {crashes} of {policy.max_retries} within {policy.window_s:g} s)")
        child.oom_events = {}
        child.answer_deadline = now + (delay or 0.0) + OOM_ANSWER_TIMEOUT_S
        for node in child.node.hosted:  # a container's death is each of its nodes' death
            self._events += 1
            if evidence is not None:
                child.oom_events[fq_node_name(node)] = self._events
            if self.link is not None:
                self.link.publish(NodeEvent(fq_node_name(node), "exit" if evidence is None else "oom_kill",
                                            self._events, code, child.proc.pid, evidence or "", delay))

    def _death_readings(self, child: Child) -> tuple[MemorySignals, MemorySignals]:
        """(before, after) for the OOM verdict on a node found dead.

        The latest reading may have been taken between the kernel's kill and the process's exit:
        the counters already risen, and a dying process's /proc/<pid>/cgroup no longer names its
        group. So the baseline is the reading before it (one to two seconds before the death),
        and its cgroup is the one read again.
        """
        before = child.earlier if child.earlier is not None else child.signals
        return before, read_signals(self.memory_root, before.cgroup)

    def _leave_down(self, name: str, reason: str) -> None:
        self.left_down[name] = reason
        self._report("ERROR", f"{name} {reason}")

    def _restart(self, child: Child) -> None:
        """Start the process again: each node with its config's parameters, the values set on it
        at run time over them, and the budget manager's lowered budget after an OOM kill over those."""
        overrides: dict[str, dict[str, Any]] = {}
        notes = []
        for node in child.node.hosted:
            name = fq_node_name(node)
            values = self.runtime.for_node(name)
            whose = f" on {node.name}" if child.node.components else ""
            if values:
                notes.append(f"values set at run time{whose}: "
                             f"{', '.join(f'{k}={v!r}' for k, v in sorted(values.items()))}")
            event = child.oom_events.get(name)
            answer = None if event is None or self.link is None else self.link.oom_answer(event)
            if answer is not None and answer.get("start_budget_mb") is not None:
                values[BUDGET_PARAM] = float(answer["start_budget_mb"])
                notes.append(f"{BUDGET_PARAM}={values[BUDGET_PARAM]!r}{whose} from the budget manager's answer "
                             "to its OOM kill")
            if values:
                overrides[name] = values
        argv = child.argv
        if overrides:
            spec = restart_process(child.node, overrides)
            argv = node_command(spec, write_process_files(spec, self._tmp.name, suffix=".restart"))
        child.proc, child.reader = self._spawn(child.node, argv)
        child.restart_at, child.oom_events = None, {}
        child.signals, child.earlier, child.signals_at = MemorySignals(), None, -1.0e9
        child.restarts += 1
        self._report("INFO", f"{child.node.name} restarted (pid {child.proc.pid})"
                             + (f" with {'; '.join(notes)}" if notes else ""))

    def all_down(self) -> bool:
        """Every node is left down: nothing is serving and nothing will be restarted."""
        return len(self.left_down) == len(self.children)

    def report_failures(self, command: str) -> bool:
        """Print on stderr, as ``command``, why the run failed although it stopped: nodes left
        down, crash-looping (crashed again after a restart) or down awaiting a restart at the end,
        nodes that ignored SIGINT. True when there was such a failure."""
        failures = []
        looped = {name: why for name, why in self.crash_looped.items() if name not in self.left_down}
        if looped:
            listing = "; ".join(f"{name} {why}" for name, why in sorted(looped.items()))
            failures.append(f"node(s) crash-looped: {listing}")
        pending = sorted(c.node.name for c in self.children
                         if c.restart_at is not None and c.node.name not in {*self.left_down, *looped})
        if pending:
            failures.append(f"node(s) down at the end of the run, waiting to be restarted: {', '.join(pending)}")
        if self.left_down:
            listing = "; ".join(f"{name} {why}" for name, why in sorted(self.left_down.items()))
            failures.append(f"node(s) left down: {listing}")
        if self.escalated:
            listing = ", ".join(f"{name} ({sig})" for name, sig in sorted(self.escalated.items()))
            failures.append(f"node(s) ignored SIGINT and had to be stopped with: {listing}")
        for failure in failures:
            print(f"{command}: failure: {failure}", file=sys.stderr, flush=True)
        return bool(failures)

    def _forward(self, name: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._sink(name, line.rstrip("\n"))

    def pids(self) -> dict[str, int]:
        return {c.node.name: c.proc.pid for c in self.children}

    def dead(self) -> list[tuple[str, int]]:
        """Nodes that exited on their own: (name, exit code)."""
        return [(c.node.name, c.proc.returncode) for c in self.children if c.proc.poll() is not None]

    def stop(self, *, int_timeout: float = 8.0, term_timeout: float = 4.0) -> dict[str, int]:
        """SIGINT every process group, then SIGTERM, then SIGKILL; returns exit codes.

        A node still running when SIGTERM or SIGKILL goes out is recorded in ``escalated`` (name ->
        the last signal it needed): every node is expected to stop on the first SIGINT, so the
        escalation is a failure to report, not a routine step.
        """
        with self._lock:
            self.stopping = True
        for sig, timeout in ((signal.SIGINT, int_timeout), (signal.SIGTERM, term_timeout), (signal.SIGKILL, 5.0)):
            alive = [c for c in self.children if c.proc.poll() is None]
            if not alive:
                break
            for child in alive:
                if sig != signal.SIGINT:
                    self.escalated[child.node.name] = sig.name
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.proc.pid, sig)
            deadline = time.monotonic() + timeout
            for child in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for child in self.children:  # leftovers in a group (a node's own subprocesses)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.proc.pid, signal.SIGKILL)
            child.reader.join(timeout=2.0)
        if self.link is not None:
            self.link.close()
        self._tmp.cleanup()
        self._remove_shm_orphans()
        return {c.node.name: c.proc.returncode for c in self.children}

    def _remove_shm_orphans(self) -> None:
        """Free the shared memory that killed processes left behind (``shm_orphans``)."""
        removed = remove_orphans()
        segments = [size for path, size in removed if not path.name.endswith("_el")]
        if segments:
            self._report("INFO", f"removed {len(segments)} shared-memory segments ({to_mb(sum(segments)):.1f} MB) "
                                 "that ended DDS participants left in /dev/shm")

    def __enter__(self) -> GraphRunner:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        if not self.stopping:
            self.stop()


class StopRequest:
    """SIGINT/SIGTERM set an event instead of raising, so shutdown runs in one place."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None
        self._old: dict[int, Any] = {}  # what signal.signal returned

    def _handle(self, signum, _frame) -> None:
        self.signal = signum
        self.event.set()

    def __enter__(self) -> StopRequest:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def load_config(path: Path | None) -> GraphConfig:
    """The graph config, its parameters checked against what each node declares (ValueError
    naming the file, node, parameter and reason: nothing is started). The check runs in a child
    (``preflight``): what each node declares lives in the node modules, which import the engine."""
    path = path if path is not None else default_config_path()
    graph = load_graph(path)
    check_in_child(path)
    return graph
