"""`dynnet up --record OUT`: the recorder node writes the graph's inputs and outputs to MCAP.

The graph runs under `dynnet up` on loopback with this run's ROS_DOMAIN_ID (conftest) in a
namespace of its own; it is stopped with SIGINT (Ctrl-C) once both model nodes' outputs reached
the bag, or by `--duration`; `dynnet replay --record` records a bag's replay. Either way the MCAP
must be complete: rosbags and the `mcap` library read it, and each output's stamp is the stamp
of a recorded camera frame.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from _up import REPO, Up
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rosbags.highlevel import AnyReader

from dynnet_ros import cli
from dynnet_ros.bags.scenes import SIM_TOPICS
from dynnet_ros.bags.writer import standard_typestore
from dynnet_ros.supervisor.runner import stop_process_group

pytestmark = pytest.mark.graph

NS = "/rec_test"
INPUTS = (f"{NS}/camera/image_raw", f"{NS}/camera/camera_info", f"{NS}/lidar/points")
OUTPUTS = (f"{NS}/lane/mask", f"{NS}/depth/image")
SIZE = "160x128"


def graph_config(path: Path, models: bool = True) -> Path:
    """The simulator at 2 Hz with small frames, and (``models``) the lane and depth nodes."""
    nodes = [{"name": "sensor_sim", "executable": "sensor_sim", "sim": True,
              "parameters": {"rate_hz": 2.0, "resolutions": [SIZE], "lidar_azimuth_steps": 64, "seed": 3}}]
    if models:
        nodes += [{"name": name, "executable": name, "parameters": {"threads": 1, "camera_sizes": [SIZE]}}
                  for name in ("lane_node", "depth_node")]
    path.write_text(yaml.safe_dump({"nodes": nodes}, sort_keys=False))
    return path


def wait_for(predicate, timeout: float, what: str, up: Up) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if up.proc.poll() is not None:
            pytest.fail(f"dynnet up ended while waiting for {what}:\n{up.log()}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}:\n{up.log()}")


def read_back(path: Path) -> tuple[dict[str, int], dict[str, list]]:
    """Messages per topic, and the decoded messages of the camera and output topics, via rosbags."""
    with AnyReader([path], default_typestore=standard_typestore()) as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
        decoded: dict[str, list] = {}
        wanted = [c for c in reader.connections if c.topic in (INPUTS[0], *OUTPUTS)]
        for conn, _, raw in reader.messages(connections=wanted):
            decoded.setdefault(conn.topic, []).append(reader.deserialize(raw, conn.msgtype))
    return counts, decoded


def mcap_counts(path: Path) -> dict[str, int]:
    """Messages per topic as the `mcap` library decodes them (every message decoded)."""
    counts: dict[str, int] = {}
    with path.open("rb") as stream:
        for _, channel, _, message in make_reader(stream, decoder_factories=[DecoderFactory()]).iter_decoded_messages():
            assert message is not None
            counts[channel.topic] = counts.get(channel.topic, 0) + 1
    return counts


def stamp(msg) -> tuple[int, int, str]:
    return msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id


def test_up_record_writes_inputs_and_outputs_and_ctrl_c_finalises(tmp_path):
    """`--no-sim`, the simulator started apart as a robot's driver would be: its topics are recorded
    because the graph's nodes subscribe to them, and the model nodes are held until the recorder
    gets their inputs. The driver's camera is reliable (a QoS override), so the recorder, which
    then subscribes reliable, loses no frame a best-effort model node gets."""
    out = tmp_path / "graph.mcap"
    driver = subprocess.Popen([sys.executable, "-m", "dynnet_ros.nodes.sensor_sim", "--ros-args", "-r", f"__ns:={NS}",
                               "-p", "rate_hz:=2.0", "-p", f"resolutions:=['{SIZE}']", "-p", "lidar_azimuth_steps:=64",
                               "-p", f"qos_overrides.{INPUTS[0]}.publisher.reliability:=reliable"],
                              cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    up = Up(graph_config(tmp_path / "graph.yaml"), NS, ("--no-sim", "--record", str(out), "--duration", "900"))
    try:
        first = [f"first message on {topic}" for topic in (*INPUTS, *OUTPUTS)]
        wait_for(lambda: all(any(f in line for line in list(up.out)) for f in first), 420,
                 "the recorder's first message on every input and output topic", up)
        time.sleep(3.0)  # a few frames more
        assert not out.exists()  # the MCAP appears complete or not at all
    finally:
        code = up.stop()  # SIGINT to the process group: Ctrl-C
        stop_process_group(driver)
    assert code == 0, up.log()
    written = [line for line in up.out if line.startswith("[recorder] recorder: wrote ")]
    assert written, up.log()
    counts, decoded = read_back(out)
    assert sum(counts.values()) == int(re.search(r"wrote (\d+) messages", written[0]).group(1))
    for topic in (*INPUTS, *OUTPUTS):
        assert counts.get(topic, 0) >= 1, (topic, counts)
    assert counts.get(f"{NS}/dynnet/model_profiles", 0) >= 1  # every topic the graph's nodes publish
    assert "/rosout" not in counts and "/parameter_events" not in counts
    assert up.out[0].startswith("dynnet up: 3 nodes")  # lane, depth, recorder: the simulator is no graph node
    for node in ("lane_node", "depth_node"):  # held until the recorder got the driver's frames
        assert up.supervisor("INFO", f"{node} enabled: the recorder records"), up.log()
    frames = {stamp(msg) for msg in decoded[INPUTS[0]]}
    for topic in OUTPUTS:  # outputs copy their camera frame's header; that frame is in the bag too
        stamps = [stamp(msg) for msg in decoded[topic]]
        assert stamps and all(s in frames for s in stamps), (topic, stamps[:3], sorted(frames)[:3])
        assert all((msg.width, msg.height) == (160, 128) for msg in decoded[topic])
    assert mcap_counts(out) == {topic: n for topic, n in counts.items() if n}


def test_up_record_is_finalised_at_the_end_of_duration(tmp_path):
    out = tmp_path / "sim.mcap"
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "up", "--config",
                           str(graph_config(tmp_path / "sim.yaml", models=False)), "--namespace", NS,
                           "--duration", "20", "--record", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    match = re.search(r"\[recorder\] recorder: wrote (\d+) messages on (\d+) topics", proc.stdout)
    assert match, proc.stdout[-4000:]
    counts, _ = read_back(out)
    assert sum(counts.values()) == int(match.group(1)) and len(counts) == int(match.group(2))
    assert set(counts) <= {*INPUTS, "/diagnostics"}
    assert mcap_counts(out) == {topic: n for topic, n in counts.items() if n}
    assert not list(tmp_path.glob(".*partial"))


def test_replay_record_keeps_the_bag_frames_and_records_every_output_on_bag_time(tmp_path):
    """`dynnet replay BAG --record OUT` on a bag from `dynnet sim --record`: the recording holds the
    played frames unchanged, one lane mask per frame with its frame's stamp, all logged on the
    bag's clock (/clock), not the wall clock."""
    source, out = tmp_path / "sim.mcap", tmp_path / "replayed.mcap"
    assert cli.main(["sim", "--record", str(source), "--frames", "6", "--rate", "2", "--resolutions", SIZE,
                     "--seed", "3"]) == 0
    config = tmp_path / "lane.yaml"
    # the camera link reliable and transient-local, as in the replay parity test: a frame lost in
    # transport would leave its frame without a mask
    camera_link = {f"{NS}/camera/image_raw": {"subscription": {"reliability": "reliable",
                                                               "durability": "transient_local"}}}
    config.write_text(yaml.safe_dump({"nodes": [{"name": "lane_node", "executable": "lane_node",
                                                 "parameters": {"threads": 1, "camera_sizes": [SIZE],
                                                                "qos_overrides": camera_link}}]}))
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "replay", str(source), "--config", str(config),
                           "--namespace", NS, "--record", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "warning" not in proc.stderr, proc.stderr
    with AnyReader([source], default_typestore=standard_typestore()) as reader:
        played = {f"{NS}{c.topic}": [(t, bytes(raw)) for _, t, raw in reader.messages(connections=[c])]
                  for c in reader.connections}
        start, end = reader.start_time, reader.end_time
    counts, decoded = read_back(out)
    with AnyReader([out], default_typestore=standard_typestore()) as reader:
        recorded = {c.topic: [(t, bytes(raw)) for _, t, raw in reader.messages(connections=[c])]
                    for c in reader.connections if c.topic in played}
    store = standard_typestore()
    for topic, messages in played.items():  # the middleware may pad the CDR's end: compare re-encoded
        msgtype = {t: c for t, (c, _) in SIM_TOPICS.items()}[topic[len(NS):]]

        def canonical(raw: bytes, msgtype: str = msgtype) -> bytes:
            return bytes(store.serialize_cdr(store.deserialize_cdr(raw, msgtype), msgtype))

        assert [canonical(raw) for _, raw in recorded[topic]] == [canonical(raw) for _, raw in messages], topic
    frames = [stamp(msg) for msg in decoded[INPUTS[0]]]
    assert [stamp(msg) for msg in decoded[f"{NS}/lane/mask"]] == frames  # one mask per frame, in order
    log_times = [t for messages in recorded.values() for t, _ in messages]
    assert min(log_times) >= start and max(log_times) <= end + 10**9  # the bag's clock, not the wall clock
    assert mcap_counts(out) == {topic: n for topic, n in counts.items() if n}


CAMERAS = ("front", "left", "right", "rear")


def test_up_record_writes_every_camera_of_a_multi_camera_sim(tmp_path):
    """A simulator with four cameras: the recording holds each camera's image and CameraInfo with
    its own frame_id at its own rate, and the one LiDAR, which shares the front camera's stamps
    (the first camera at the simulator's rate_hz)."""
    config = tmp_path / "cams.yaml"
    config.write_text(yaml.safe_dump({"nodes": [{
        "name": "sensor_sim", "executable": "sensor_sim", "sim": True,
        "parameters": {"rate_hz": 2.0, "resolutions": [SIZE], "lidar_azimuth_steps": 32, "cameras": list(CAMERAS),
                       "rear.rate_hz": 1.0}}]}, sort_keys=False))
    out = tmp_path / "cams.mcap"
    proc = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(config), "--namespace", NS,
                           "--duration", "8", "--record", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    images = {f"{NS}/{name}/image_raw": name for name in CAMERAS}
    headers: dict[str, list[tuple[int, int, str]]] = {}
    with AnyReader([out], default_typestore=standard_typestore()) as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
        wanted = [c for c in reader.connections if c.topic in images or c.topic.endswith(("camera_info", "points"))]
        pixels: dict[str, bytes] = {}
        for conn, _, raw in reader.messages(connections=wanted):
            msg = reader.deserialize(raw, conn.msgtype)
            headers.setdefault(conn.topic, []).append(stamp(msg))
            if conn.topic in images:
                pixels[conn.topic] = bytes(msg.data)
    for topic, name in images.items():
        for recorded in (topic, f"{NS}/{name}/camera_info"):
            assert counts.get(recorded, 0) >= 2, (recorded, counts)
            assert {frame for _, _, frame in headers[recorded]} == {f"{name}_optical_frame"}
    assert f"{NS}/camera/image_raw" not in counts
    front, rear = counts[f"{NS}/front/image_raw"], counts[f"{NS}/rear/image_raw"]
    assert front > 1.4 * rear, counts  # 2 Hz against 1 Hz
    lidar = {(sec, nanosec) for sec, nanosec, _ in headers[f"{NS}/lidar/points"]}
    assert lidar and lidar <= {(sec, nanosec) for sec, nanosec, _ in headers[f"{NS}/front/image_raw"]}
    # each camera's own view (left and right see the same mirror-symmetric roadside, pixel for pixel)
    assert len({pixels[f"{NS}/{name}/image_raw"] for name in ("front", "left", "rear")}) == 3
