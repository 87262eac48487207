"""Bags written from the simulator (`dynnet sim --record`, bags/scenes.py, bags/writer.py).

Read back two ways — rosbags and the `mcap` library with its ROS 2 decoder — and compared with
what the live sensor_sim node builds for the same frame, so a recorded bag replays into the graph
like the simulator feeds it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.serialization import serialize_message
from rosbags.highlevel import AnyReader
from rosbags.rosbag2 import Reader
from sensor_msgs.msg import CameraInfo
from std_msgs.msg import Header

from dynnet_ros import cli
from dynnet_ros.bags.scenes import (
    CLOUD_TOPIC,
    DEFAULT_START_NS,
    IMAGE_TOPIC,
    INFO_TOPIC,
    SIM_TOPICS,
    SceneSerializer,
    frame_count,
    frame_stamp_ns,
    record_scenes,
)
from dynnet_ros.bags.writer import BagWriter, TopicQos, check_output, standard_typestore
from dynnet_ros.nodes.convert import array_to_image, cloud_to_xyzi, image_to_array, xyzi_to_cloud
from dynnet_ros.sim.frames import (
    SimSettings,
    camera_info_fields,
    parse_resolution,
    render_frame,
    render_image,
    scan_points,
)

#: small frames, a resolution switch every 2 frames: the schedule shows within a few frames
SMALL = SimSettings(rate_hz=5.0, resolutions=("64x48", "96x64"), resolution_period_s=0.4, lidar_azimuth_steps=64)


def read_rosbags(path: Path) -> list[tuple[str, int, bytes]]:
    """(topic, log time, CDR) of every message, in the bag's order."""
    with Reader(path) as reader:
        return [(conn.topic, stamp, bytes(raw)) for conn, stamp, raw in reader.messages()]


def decoded_rosbags(path: Path) -> list[tuple[str, int, object]]:
    with AnyReader([path], default_typestore=standard_typestore()) as reader:
        return [(conn.topic, stamp, reader.deserialize(raw, conn.msgtype)) for conn, stamp, raw in reader.messages()]


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * 10**9 + int(stamp.nanosec)


@pytest.fixture(scope="module")
def seven(tmp_path_factory) -> Path:
    """Six frames with seed 7 as one MCAP file."""
    path = tmp_path_factory.mktemp("bags") / "seven.mcap"
    counts = record_scenes(path, SimSettings(**{**SMALL.__dict__, "seed": 7}), 6)
    assert counts == {INFO_TOPIC: 6, IMAGE_TOPIC: 6, CLOUD_TOPIC: 6}
    return path


def test_same_seed_same_bag_other_seed_other_scene(seven, tmp_path):
    again = tmp_path / "again.mcap"
    record_scenes(again, SimSettings(**{**SMALL.__dict__, "seed": 7}), 6)
    assert read_rosbags(again) == read_rosbags(seven)
    other = tmp_path / "other.mcap"
    record_scenes(other, SimSettings(**{**SMALL.__dict__, "seed": 8}), 6)
    mine = {(t, s): d for t, s, d in read_rosbags(seven)}
    theirs = {(t, s): d for t, s, d in read_rosbags(other)}
    assert mine.keys() == theirs.keys()  # same topics and stamps ...
    assert all(mine[key] != theirs[key] for key in mine if key[0] == IMAGE_TOPIC)  # ... other scenes


def test_counts_stamps_frame_ids_and_schedule(seven):
    messages = decoded_rosbags(seven)
    with Reader(seven) as reader:
        assert {c.topic: (c.msgtype, c.msgcount) for c in reader.connections} == {
            topic: (msgtype, 6) for topic, (msgtype, _) in SIM_TOPICS.items()}
        assert reader.message_count == 18
    # per frame: camera_info, image, cloud, all with the frame's stamp, which is also the log time
    assert [t for t, _, _ in messages] == [INFO_TOPIC, IMAGE_TOPIC, CLOUD_TOPIC] * 6
    for n, (topic, log_time, msg) in enumerate(messages):
        index = n // 3
        assert log_time == stamp_ns(msg.header.stamp) == DEFAULT_START_NS + index * 200_000_000
        assert msg.header.frame_id == ("lidar" if topic == CLOUD_TOPIC else "camera_optical_frame")
        if topic != CLOUD_TOPIC:  # the resolution schedule: 2 frames (0.4 s at 5 Hz) per size
            assert (msg.width, msg.height) == parse_resolution(SMALL.resolutions[(index // 2) % 2])
    clouds = [msg for topic, _, msg in messages if topic == CLOUD_TOPIC]
    assert len({msg.width for msg in clouds}) > 1  # the point count changes frame to frame
    assert [f.name for f in clouds[0].fields] == ["x", "y", "z", "intensity"]


def test_the_mcap_library_reads_it(seven):
    with seven.open("rb") as stream:
        reader = make_reader(stream, decoder_factories=[DecoderFactory()])
        summary = reader.get_summary()
        assert summary is not None
        channels = {c.id: c for c in summary.channels.values()}
        assert {c.topic: (summary.schemas[c.schema_id].name, c.message_encoding) for c in channels.values()} == {
            topic: (msgtype, "cdr") for topic, (msgtype, _) in SIM_TOPICS.items()}
        assert {channels[cid].topic: n for cid, n in summary.statistics.channel_message_counts.items()} == {
            topic: 6 for topic in SIM_TOPICS}
        decoded = list(reader.iter_decoded_messages())
    expected = decoded_rosbags(seven)
    assert len(decoded) == len(expected)
    for (_, channel, message, ros), (topic, log_time, msg) in zip(decoded, expected):
        assert channel.topic == topic and message.log_time == log_time
        assert (ros.header.stamp.sec, ros.header.stamp.nanosec) == (msg.header.stamp.sec, msg.header.stamp.nanosec)
        if topic == IMAGE_TOPIC:
            assert bytes(ros.data) == bytes(msg.data) and ros.encoding == "rgb8"


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8"])
def test_messages_equal_what_the_live_node_publishes(encoding):
    """The node's rclpy messages (convert.py) and the bag's, for the same frame, have equal fields:
    rclpy's CDR leaves padding bytes unset, so they are compared through one decoder."""
    settings = SimSettings(**{**SMALL.__dict__, "encoding": encoding, "seed": 3})
    frame = render_frame(settings, 4, 4 / settings.rate_hz)
    ours = SceneSerializer(settings).messages(frame)
    store = standard_typestore()
    stamp_ns_ = frame_stamp_ns(settings, 4)
    header = Header(frame_id=settings.camera_frame_id)
    header.stamp.sec, header.stamp.nanosec = stamp_ns_ // 10**9, stamp_ns_ % 10**9
    cloud_header = Header(stamp=header.stamp, frame_id=settings.lidar_frame_id)
    info = CameraInfo(header=header, width=frame.width, height=frame.height, **camera_info_fields(frame.camera_matrix))
    live = [info,
            array_to_image(frame.image, encoding, header), xyzi_to_cloud(frame.points, cloud_header)]
    for message, published in zip(ours, live):
        msgtype = SIM_TOPICS[message.topic][0]
        mine = store.deserialize_cdr(message.data, msgtype)
        theirs = store.deserialize_cdr(serialize_message(published), msgtype)
        assert bytes(store.serialize_cdr(mine, msgtype)) == bytes(store.serialize_cdr(theirs, msgtype))
    image = store.deserialize_cdr(ours[1].data, "sensor_msgs/msg/Image")
    assert image.encoding == encoding and image.step == frame.width * 3
    published = array_to_image(frame.image, encoding, header)
    np.testing.assert_array_equal(image_to_array(published), frame.image)
    np.testing.assert_array_equal(cloud_to_xyzi(live[2]), frame.points)


def test_sqlite3_directory_reads_back(tmp_path):
    path = tmp_path / "dirbag"
    counts = record_scenes(path, SMALL, 3, storage="sqlite3")
    assert counts == {topic: 3 for topic in SIM_TOPICS}
    assert (path / "metadata.yaml").is_file() and (path / "dirbag.db3").is_file()
    assert [t for t, _, _ in decoded_rosbags(path)] == [INFO_TOPIC, IMAGE_TOPIC, CLOUD_TOPIC] * 3
    mcap_dir = tmp_path / "mcapdir"
    record_scenes(mcap_dir, SMALL, 2)
    assert (mcap_dir / "mcapdir.mcap").is_file() and len(read_rosbags(mcap_dir)) == 6


def test_an_interrupted_recording_leaves_nothing(tmp_path):
    path = tmp_path / "cut.mcap"

    def interrupt(index: int) -> None:
        if index == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record_scenes(path, SMALL, 5, on_frame=interrupt)
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_bad_outputs_and_unknown_types(tmp_path):
    (tmp_path / "taken.mcap").write_bytes(b"")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for path, storage, reason in [(tmp_path / "taken.mcap", "mcap", "exists already"),
                                  (tmp_path / "missing" / "x.mcap", "mcap", "does not exist"),
                                  (a_file / "x.mcap", "mcap", "does not exist"),
                                  (Path("/proc/dynnet-test.mcap"), "mcap", "not writable"),
                                  (tmp_path / "x.mcap", "sqlite3", "a .mcap output is an MCAP file"),
                                  (tmp_path / "x.db3", "sqlite3", "rosbag2 directory"),
                                  (tmp_path / "x", "zip", "unknown bag storage")]:
        with pytest.raises(ValueError, match=reason):
            check_output(path, storage)
    with BagWriter(tmp_path / "ok.mcap") as bag:
        bag.add_topic("/a", "std_msgs/msg/String", TopicQos(reliable=True, depth=2))
        with pytest.raises(ValueError, match="no definition"):
            bag.add_topic("/b", "my_msgs/msg/Nope")
        with pytest.raises(ValueError, match="already in the bag"):
            bag.add_topic("/a", "std_msgs/msg/String")
        with pytest.raises(ValueError, match="was not added"):
            bag.write("/c", 1, b"")
        bag.write("/a", 5, bytes(store_string("hi")))
    assert [(t, s) for t, s, _ in read_rosbags(tmp_path / "ok.mcap")] == [("/a", 5)]


def store_string(text: str) -> memoryview:
    store = standard_typestore()
    return store.serialize_cdr(store.types["std_msgs/msg/String"](data=text), "std_msgs/msg/String")


def test_frame_count():
    assert frame_count(SMALL, frames=7) == 7
    assert frame_count(SMALL, duration_s=2.0) == 10
    for kwargs in ({}, {"frames": 1, "duration_s": 1.0}, {"frames": 0}, {"duration_s": -1.0}):
        with pytest.raises(ValueError):
            frame_count(SMALL, **kwargs)


def test_the_sim_command(tmp_path, capsys):
    out, report = tmp_path / "cli.mcap", tmp_path / "cli.json"
    code = cli.main(["sim", "--record", str(out), "--frames", "4", "--seed", "5", "--rate", "5",
                     "--resolutions", "64x48", "--json", str(report)])
    assert code == 0
    assert "wrote 4 frames" in capsys.readouterr().out
    data = json.loads(report.read_text())
    assert data["seed"] == 5 and data["frames"] == 4 and data["start_ns"] == DEFAULT_START_NS
    assert {topic: entry["messages"] for topic, entry in data["topics"].items()} == {t: 4 for t in SIM_TOPICS}
    same = tmp_path / "same.mcap"
    record_scenes(same, SimSettings(rate_hz=5.0, resolutions=("64x48",), seed=5), 4)
    assert read_rosbags(out) == read_rosbags(same)
    assert cli.main(["sim", "--record", str(out), "--frames", "1"]) == 2  # exists: not overwritten
    assert "exists already" in capsys.readouterr().err


def test_the_sim_command_records_several_cameras_of_one_scene(tmp_path):
    """`dynnet sim --cameras 4`: each camera's CameraInfo and image under its name and frame_id,
    one stamp per frame for all of them and the LiDAR, which covers every camera; each camera's
    image is what that camera of the live simulator renders."""
    out, report = tmp_path / "rig.mcap", tmp_path / "rig.json"
    assert cli.main(["sim", "--record", str(out), "--frames", "3", "--rate", "5", "--resolutions", "64x48",
                     "--cameras", "4", "--json", str(report)]) == 0
    names = ("front", "left", "right", "rear")
    data = json.loads(report.read_text())
    assert data["cameras"] == {"front": 0.0, "left": 90.0, "right": -90.0, "rear": 180.0}
    expected = {f"/{n}/{kind}": 3 for n in names for kind in ("image_raw", "camera_info")} | {"/lidar/points": 3}
    assert {topic: entry["messages"] for topic, entry in data["topics"].items()} == expected
    messages = decoded_rosbags(out)
    settings = SimSettings(rate_hz=5.0, resolutions=("64x48",))
    for name, yaw in data["cameras"].items():
        images = [msg for topic, _, msg in messages if topic == f"/{name}/image_raw"]
        assert {msg.header.frame_id for msg in images} == {f"{name}_optical_frame"}
        for index, msg in enumerate(images):
            assert stamp_ns(msg.header.stamp) == DEFAULT_START_NS + index * 200_000_000
            assert np.array_equal(image_to_array(msg), render_image(settings, index, index / 5.0, yaw).image)
    clouds = [msg for topic, _, msg in messages if topic == "/lidar/points"]
    points = cloud_to_xyzi(clouds[0])
    assert np.array_equal(points, scan_points(settings, 0, 0.0, (0.0, 90.0, -90.0, 180.0)))
    assert (points[:, 0] < -1.0).any() and (points[:, 1] > 1.0).any()  # behind and to the left, too
