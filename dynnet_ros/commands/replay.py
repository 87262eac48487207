"""`dynnet replay BAG`: run the vehicle graph on a recorded bag instead of the simulator.

The graph starts as `dynnet up --no-sim` starts it, with ``use_sim_time: true`` on every node;
once every model node subscribes (its model is loaded) the bag plays: its camera, CameraInfo and
LiDAR topics (and any other topic whose type ROS knows) as recorded, paced by the bag's
timestamps / ``--rate``, with /clock carrying the bag's time. With ``--no-graph`` only the
playing happens, into whatever graph is running (as ``ros2 bag play`` would).

Nothing is lost by default: the model nodes it starts read the played topics over reliable,
transient-local links (QoS overrides), and each camera frame waits until every model node has
finished the previous one (their reports on ``dynnet/frames``), so a replay is paced by the
slowest node when the bag's clock is faster. The report lists, per node and camera topic,
frames published / received / processed / dropped / failed; a lost frame is a warning, and exit
status 1 with ``--strict``. ``--realtime`` plays on the bag's clock alone, as a live camera would.

The bag is opened and its topics checked before anything starts, so a missing, truncated or
corrupt bag, a requested topic it lacks or a sensor topic of the wrong type is one error line
(exit status 2); damage found halfway through the bag stops the replay with the same line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dynnet_ros.bags.pacing import Pacing, Step, loop_period_ns, paced_steps
from dynnet_ros.bags.reader import BAG_FORMS, Bag
from dynnet_ros.bags.topics import SINGLE_CAMERA, CameraTopics, Remap, TopicPlan
from dynnet_ros.bags.writer import standard_typestore
from dynnet_ros.commands import CommandError
from dynnet_ros.commands.bag_player import ACK_WAIT_S, BagPlayer
from dynnet_ros.graph_config import GraphConfig, ProcessSpec, fq_node_name, map_hosted, recorder_process
from dynnet_ros.graph_transport import use_image_profile
from dynnet_ros.nodes.camera_inputs import camera_inputs
from dynnet_ros.nodes.message_types import message_class
from dynnet_ros.nodes.recording_graph import wait_for_recorder
from dynnet_ros.supervisor.runner import GraphRunner, StopRequest, load_config

#: the model nodes' executables: they read the played sensor topics reliably and pace the camera frames
MODEL_EXECUTABLES = ("lane_node", "pedestrian_node", "depth_node")
#: executables that subscribe to the sensor topics: playing starts once each of them does
SENSOR_CONSUMERS = (*MODEL_EXECUTABLES, "recorder")
#: the QoS override that makes a model node's link to a played topic lossless: reliable (nothing lost
#: in transport), transient-local (a frame sent before DDS matched the subscription still arrives)
LOSSLESS_LINK = {"reliability": "reliable", "durability": "transient_local"}
#: a graph whose model nodes do not all subscribe within this long ends the replay with status 1
STARTUP_TIMEOUT_S = 240.0
#: how long playing waits, with --record, for the recorder to follow every topic of the graph
RECORDER_WAIT_S = 30.0
#: how long playing waits for DDS to match the played topics' publishers with every subscription the
#: graph shows (a topic nobody reads holds it this long)
DISCOVERY_WAIT_S = 5.0


def graph_cameras(config: GraphConfig | None) -> tuple[CameraTopics, ...]:
    """The cameras the graph's model nodes read (their ``cameras``), each once; the single camera
    when no node lists any, or without a graph (``--no-graph``)."""
    found: dict[str, CameraTopics] = {}
    for node in config.nodes if config is not None else []:
        if node.executable in MODEL_EXECUTABLES:
            for camera in camera_inputs(list(node.parameters.get("cameras", []))):
                found.setdefault(camera.image_topic, CameraTopics(camera.image_topic, camera.info_topic))
    return tuple(found.values()) or (SINGLE_CAMERA,)


def open_checked(path: str, topics: list[str] | None = None, remaps: tuple[Remap, ...] = (), namespace: str = "",
                 loop: bool = False, cameras: tuple[CameraTopics, ...] = (SINGLE_CAMERA,)) -> tuple[Bag, TopicPlan]:
    """The bag and what of it plays, both checked (ValueError naming the bag otherwise); ``cameras``:
    the graph's (their topics must carry camera messages)."""
    bag = Bag(path)
    try:
        plan = bag.plan(topics, remaps, namespace, type_available=lambda msgtype: message_class(msgtype) is not None,
                        cameras=cameras)
        if loop:
            loop_period_ns(bag.start_ns, bag.end_ns)
    except ValueError:
        bag.close()
        raise
    return bag, plan


def model_nodes(runner: GraphRunner) -> list[str]:
    """Fully qualified names of the graph's nodes that consume the sensor topics."""
    return [fq_node_name(n) for n in runner.hosted_nodes() if n.executable in SENSOR_CONSUMERS]


def camera_transport(node: ProcessSpec, plan: TopicPlan) -> ProcessSpec:
    """``node`` reading the camera the way the bag has it: a model node whose config leaves
    ``image_transport`` unset takes ``compressed`` when the bag plays the compressed camera topic
    and not the raw one (a robot's usual recording)."""
    roles = {topic.role for topic in plan.played}
    if node.executable not in MODEL_EXECUTABLES or "image_transport" in node.parameters \
            or "compressed camera" not in roles or "camera" in roles:
        return node
    return replace(node, parameters={**node.parameters, "image_transport": "compressed"})


def lossless_links(node: ProcessSpec, plan: TopicPlan) -> ProcessSpec:
    """``node`` with reliable, transient-local subscriptions to every played topic (QoS override
    parameters; an override the graph config sets for a topic itself is kept). Other nodes, and
    topics the node does not subscribe to, are left as they are (rclpy reads only the overrides
    of the topics a node creates)."""
    if node.executable not in MODEL_EXECUTABLES:
        return node
    overrides = {topic: dict(entry) for topic, entry in (node.parameters.get("qos_overrides") or {}).items()}
    for topic in plan.played:
        entry = overrides.setdefault(topic.target, {})
        ours = {policy: value for policy, value in LOSSLESS_LINK.items()  # the config's flat keys win too
                if f"qos_overrides.{topic.target}.subscription.{policy}" not in node.parameters}
        entry["subscription"] = {**ours, **(entry.get("subscription") or {})}
    return replace(node, parameters={**node.parameters, "qos_overrides": overrides})


class Supervision:
    """Calls ``runner.supervise()`` every 0.2 s on a thread (restarts crashed nodes) while the
    main thread plays the bag."""

    def __init__(self, runner: GraphRunner) -> None:
        self.runner = runner
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._done.wait(0.2):
            self.runner.supervise()

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5.0)


class BackgroundReplay:
    """A bag played in a loop on a thread into a graph started with ``sim_time`` (``dynnet demo
    --bag``): checked when made, playing once the graph's model nodes subscribe, until ``close``."""

    def __init__(self, path: str, namespace: str = "", cameras: tuple[CameraTopics, ...] = (SINGLE_CAMERA,)) -> None:
        self.bag, self.plan = open_checked(path, namespace=namespace, loop=True, cameras=cameras)
        self.error: str | None = None  # damage found while playing (the bag's ValueError)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._player: BagPlayer | None = None

    def start(self, runner: GraphRunner) -> None:
        self._player = BagPlayer(self.plan, Pacing(loop=True), name="dynnet_demo_replay")
        self._thread = threading.Thread(target=self._play, args=(self._player, model_nodes(runner)), daemon=True)
        self._thread.start()

    def _play(self, player: BagPlayer, nodes: list[str]) -> None:
        try:
            if not player.wait_for_nodes(nodes, self._stop, STARTUP_TIMEOUT_S):
                player.wait_for_subscribers(self._stop, DISCOVERY_WAIT_S)
                player.play(paced_steps(lambda: self.bag.messages(self.plan), self.bag.start_ns, self.bag.end_ns,
                                        player.pacing), self._stop)
        except ValueError as exc:
            self.error = str(exc)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        if self._player is not None:
            self._player.close()
        self.bag.close()


def play_with_progress(player: BagPlayer, bag: Bag, plan: TopicPlan, stop: threading.Event,
                       console: Console) -> bool:
    """Play the bag once (or until ``stop`` with ``--loop``) under a progress bar; True when it
    was played to its end."""
    pacing = player.pacing
    total = None if pacing.loop else plan.message_count
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bar = progress.add_task(f"replay {bag.path.name}", total=total)

        def advance(step: Step) -> None:
            if step.message is not None:
                progress.update(bar, advance=1,
                                description=f"replay {bag.path.name} (pass {step.loop + 1})" if pacing.loop else None)

        steps = paced_steps(lambda: bag.messages(plan), bag.start_ns, bag.end_ns, pacing)
        return player.play(steps, stop, advance)


def run(args: argparse.Namespace) -> int:
    if args.bag is None:
        raise CommandError(f"give the BAG to play ({BAG_FORMS})")
    if args.record is not None and args.no_graph:
        raise CommandError("--record records the graph this command starts; it cannot be used with --no-graph")
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # the player too, as the graph's nodes
    use_image_profile()  # the player publishes the bag's camera frames: before its first participant
    config: GraphConfig | None = None if args.no_graph else load_config(args.config)
    bag, plan = open_checked(args.bag, args.topics, tuple(args.remap), args.namespace, args.loop, graph_cameras(config))
    with bag:
        pacing = Pacing(rate=args.rate, loop=args.loop)
        for warning in plan.warnings():
            print(f"dynnet replay: warning: {warning}", file=sys.stderr, flush=True)
        return replay(args, bag, plan, pacing, config)


def replay(args: argparse.Namespace, bag: Bag, plan: TopicPlan, pacing: Pacing, config: GraphConfig | None) -> int:
    console = Console()
    runner = None if config is None else GraphRunner(config, use_sim=False, namespace=args.namespace,
                                                     ros_link=True, sim_time=True)
    if runner is not None:
        configured = runner.hosted_nodes()
        runner.nodes = [map_hosted(process, lambda node: lossless_links(camera_transport(node, plan), plan))
                        for process in runner.nodes]
        switched = [new.name for old, new in zip(configured, runner.hosted_nodes())
                    if new.parameters.get("image_transport") != old.parameters.get("image_transport")]
        if switched:
            print(f"dynnet replay: {', '.join(switched)} take image_transport=compressed: the bag's camera is "
                  "compressed", flush=True)
    span_s = (bag.end_ns - bag.start_ns) / 1e9
    target = "the ROS graph as it is (--no-graph: no nodes started)" if runner is None or config is None else \
        f"{len(runner.hosted_nodes())} nodes from {config.source}"
    print(f"dynnet replay: {bag.path}: {plan.message_count} messages on {len(plan.played)} topics over "
          f"{span_s:.1f} s, at {pacing.rate:g}x{' in a loop' if pacing.loop else ''}, into {target}; Ctrl-C stops",
          flush=True)
    status, completed = 0, False
    codes: dict[str, int] = {}
    player = BagPlayer(plan, pacing, namespace=args.namespace, frame_wait_s=args.frame_timeout)
    if runner is not None and args.record is not None:  # what the graph and the player publish, on the bag's time
        runner.nodes.append(recorder_process(runner.namespace, args.record, "mcap",
                                             [fq_node_name(n) for n in runner.hosted_nodes()]
                                             + [player.node.get_fully_qualified_name()], sim_time=True))
    supervision: Supervision | None = None
    unread_models: list[str] = []  # model nodes subscribed to none of the bag's camera topics
    with StopRequest() as stop:
        try:
            if runner is not None:
                graph = runner
                graph.start()
                supervision = Supervision(graph)
                waiting = model_nodes(graph)
                print(f"dynnet replay: waiting for {', '.join(waiting) or 'no model node'} to subscribe", flush=True)
                missing = player.wait_for_nodes(waiting, stop.event, STARTUP_TIMEOUT_S,
                                                alive=lambda: not graph.all_down())
                if missing and not stop.event.is_set():
                    print(f"dynnet replay: failure: {', '.join(missing)} did not subscribe to the bag's topics within "
                          f"{STARTUP_TIMEOUT_S:.0f} s", file=sys.stderr, flush=True)
                    status = 1
                if status == 0 and args.record is not None:
                    _wait_for_recorder(graph, player, stop.event)
            if status == 0 and not stop.event.is_set():
                player.wait_for_subscribers(stop.event, DISCOVERY_WAIT_S)
                if runner is not None:
                    readers = player.frame_readers(models := [fq_node_name(n) for n in runner.hosted_nodes()
                                                              if n.executable in MODEL_EXECUTABLES])
                    unread = [n for n in models if not any(n in nodes for nodes in readers.values())]
                    if unread:
                        print(f"dynnet replay: warning: {', '.join(unread)} read(s) no camera topic the bag plays "
                              f"({', '.join(sorted(player.frame_topics)) or 'it has none'}); check the remaps "
                              "and image_transport", file=sys.stderr, flush=True)
                        unread_models.extend(unread)
                    player.pace(readers, hold=not args.realtime)
                completed = play_with_progress(player, bag, plan, stop.event, console)
                if completed:
                    player.wait_for_frames(stop.event)
                    unacknowledged = player.wait_for_acks()
                    if unacknowledged:
                        print(f"dynnet replay: warning: subscribers of {', '.join(unacknowledged)} did not "
                              f"acknowledge the last messages within {ACK_WAIT_S:.0f} s", file=sys.stderr, flush=True)
                if completed and runner is not None:
                    player.keep_clock(stop.event, args.linger)
        finally:
            if supervision is not None:
                supervision.close()
            if runner is not None:
                codes = runner.stop()
            player.close()
    print(f"dynnet replay: {'played' if completed else 'stopped'}: "
          + ", ".join(f"{topic} {count}" for topic, count in sorted(player.published.items())), flush=True)
    lost = report_frames(player, args.frame_timeout)
    if (lost or unread_models) and args.strict:
        status = max(status, 1)
    if runner is not None:
        status = max(status, int(runner.report_failures("dynnet replay")))
    if args.json is not None:
        Path(args.json).write_text(json.dumps(summary(bag, plan, player, completed, codes), indent=2, sort_keys=True))
    return status


def report_frames(player: BagPlayer, frame_timeout_s: float) -> int:
    """Print, per model node and camera topic, what became of the frames played, and a warning
    for every node that did not process them all; returns the frames lost."""
    counts = player.frame_counts()
    if not counts:
        return 0
    print("dynnet replay: frames per model node and camera topic:", flush=True)
    for (node, topic), row in counts.items():
        print(f"  {node} <- {topic}: {row.line()}", flush=True)
    lost = {key: row for key, row in counts.items() if row.lost}
    if not lost:
        print("dynnet replay: every model node processed every frame", flush=True)
        return 0
    for (node, topic), row in lost.items():
        reasons = [f"{row.published - row.received} never arrived" if row.published > row.received
                   else "", f"{row.dropped} dropped (replaced by a newer frame before the model took it)"
                   if row.dropped else "", f"{row.failed} failed" if row.failed else "",
                   f"{player.late[node]} played after waiting {frame_timeout_s:g} s for the node"
                   if player.late[node] else ""]
        print(f"dynnet replay: warning: {node} lost {row.lost} of {row.published} frames from {topic}: "
              + ", ".join(r for r in reasons if r), file=sys.stderr, flush=True)
    return sum(row.lost for row in lost.values())


def _wait_for_recorder(graph: GraphRunner, player: BagPlayer, stop: threading.Event) -> None:
    """Hold the bag until the recorder subscribes to every topic the graph and the player publish,
    so the recording starts with the first played frame and its outputs."""
    recorder = next(fq_node_name(n) for n in graph.hosted_nodes() if n.executable == "recorder")
    others = [fq_node_name(n) for n in graph.hosted_nodes() if n.executable != "recorder"]
    storable = standard_typestore().fielddefs  # what the recorder can write; it skips the rest
    missing = wait_for_recorder(player.node, recorder, [*others, player.node.get_fully_qualified_name()],
                                stop, RECORDER_WAIT_S, storable=lambda msgtype: msgtype in storable)
    if missing is None or missing:
        what = "the recorder is not up" if missing is None else \
            f"the recorder does not subscribe to {', '.join(missing)} yet"
        print(f"dynnet replay: warning: {what} after {RECORDER_WAIT_S:.0f} s; the recording may miss the first "
              "messages", file=sys.stderr, flush=True)


def summary(bag: Bag, plan: TopicPlan, player: BagPlayer, completed: bool, codes: dict[str, int]) -> dict[str, Any]:
    return {
        "bag": str(bag.path),
        "start_ns": bag.start_ns,
        "end_ns": bag.end_ns,
        "rate": player.pacing.rate,
        "loop": player.pacing.loop,
        "completed": completed,
        "passes": player.passes,
        "topics": {t.target: {"source": t.source, "type": t.msgtype, "role": t.role, "in_bag": t.count,
                              "published": player.published[t.target]} for t in plan.played},
        "skipped": dict(plan.skipped),
        "last_clock_ns": player.clock_ns,
        "frames": {f"{node} {topic}": {"node": node, "topic": topic, **row.as_dict()}
                   for (node, topic), row in player.frame_counts().items()},
        "exit_codes": codes,
    }
