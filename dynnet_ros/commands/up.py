"""`dynnet up`: start the vehicle graph from config/vehicle.yaml as plain processes; Ctrl-C stops it.

The command line over the supervisor (``dynnet_ros.supervisor``: ``GraphRunner`` starts, watches,
restarts and stops the processes; ``RecordingHold`` holds the model nodes for ``--record``).
Ctrl-C/SIGTERM (or --duration) stops them all with SIGINT; a node that needs SIGTERM or SIGKILL
after a timeout, a node left down, or one still crash-looping at the end makes the run a failure
(exit status 1, the node named on stderr).

With ``--record`` the model nodes start with ``enabled: false`` and the supervisor enables each
one once the recorder has a message from each of its sensor inputs and subscribes to each of its
outputs (``RecordingHold``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from dynnet_ros.commands import CommandError
from dynnet_ros.graph_config import fq_node_name, recorder_process, view_process
from dynnet_ros.supervisor.recording_hold import RecordingHold
from dynnet_ros.supervisor.runner import GraphRunner, StopRequest, load_config
from dynnet_ros.view import DEFAULT_PORT


def run(args: argparse.Namespace) -> int:
    if args.duration is not None and args.duration <= 0:
        raise CommandError(f"--duration must be positive, got {args.duration}")
    if args.foxglove_port is not None and not args.foxglove:
        raise CommandError("--foxglove-port needs --foxglove")
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # the supervisor's own ROS link too
    config = load_config(args.config)
    extra = (view_process(args.namespace, DEFAULT_PORT if args.foxglove_port is None else args.foxglove_port),) \
        if args.foxglove else ()
    runner = GraphRunner(config, use_sim=not args.no_sim, namespace=args.namespace, ros_link=True,
                         memory_root=args.memory_root, extra=extra)
    hold: RecordingHold | None = None
    if args.record is not None:  # follows every node started so far: the inputs and every output
        recorder = recorder_process(runner.namespace, args.record, "mcap",
                                    [fq_node_name(n) for n in runner.hosted_nodes()])
        held = RecordingHold.hold(runner)
        runner.nodes.append(recorder)
        if held:
            hold = RecordingHold(runner, fq_node_name(recorder), held)
    env = runner.env
    processes = f" in {len(runner.nodes)} processes" if len(runner.nodes) != len(runner.hosted_nodes()) else ""
    print(f"dynnet up: {len(runner.hosted_nodes())} nodes{processes} from {config.source} "
          f"(ROS_DOMAIN_ID={env.get('ROS_DOMAIN_ID', '0')}, "
          f"ROS_AUTOMATIC_DISCOVERY_RANGE={env['ROS_AUTOMATIC_DISCOVERY_RANGE']}"
          f"{', namespace ' + runner.namespace if runner.namespace else ''}); Ctrl-C stops",
          flush=True)
    status = 0
    with StopRequest() as stop:
        runner.start()
        if hold is not None:
            runner._report("INFO", f"{', '.join(n.rpartition('/')[2] for n in hold.waiting)} start with enabled=false "
                                   "until the recorder records their inputs (--record)")
        deadline = None if args.duration is None else time.monotonic() + args.duration
        try:
            while not stop.event.is_set():
                runner.supervise()
                if hold is not None and not hold.done():
                    hold.step(time.monotonic())
                if runner.all_down():
                    print("dynnet up: every node is down; stopping", file=sys.stderr, flush=True)
                    status = 1
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                stop.event.wait(0.2)
        finally:
            codes = runner.stop()
    reason = "signal" if stop.signal is not None else "duration" if status == 0 else "failure"
    print(f"dynnet up: stopped ({reason}); exit codes {codes}", flush=True)
    if runner.report_failures("dynnet up"):
        status = 1
    return status
