"""Reading bags (dynnet_ros.bags, no ROS): streaming order, topic choice, remaps, type checks,
pacing, and every kind of bad bag as a ValueError naming it."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from _bags import (
    CLOUD,
    IMAGE,
    INFO,
    NS,
    STRING,
    UNKNOWN_TYPE,
    storage_file,
    truncate,
    typestore,
    write_bag,
    write_cameras_bag,
    write_ros1_bag,
)

from dynnet_ros.bags.pacing import Pacing, loop_period_ns, paced_steps
from dynnet_ros.bags.reader import Bag, BagMessage
from dynnet_ros.bags.topics import (
    BagTopic,
    CameraTopics,
    Remap,
    absolute_topic,
    parse_remap,
    plan_topics,
    role_targets,
)

KNOWN = {IMAGE, INFO, CLOUD, STRING}


def known(msgtype: str) -> bool:
    """Stands in for "rclpy has the message class" (the ROS side passes that check)."""
    return msgtype in KNOWN


def stamp_ns(message: BagMessage, ros2_store) -> int | None:
    msg = ros2_store.deserialize_cdr(message.data, message.msgtype)
    header = getattr(msg, "header", None)
    return None if header is None else header.stamp.sec * NS + header.stamp.nanosec


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("bags")
    written = {"sqlite3": write_bag(root / "sq", storage="sqlite3"), "mcap": write_bag(root / "mc", storage="mcap"),
               "ros1": write_ros1_bag(root / "one.bag")}
    paths = {"sqlite3": root / "sq", "mcap": root / "mc", "db3 file": storage_file(root / "sq"),
             "mcap file": storage_file(root / "mc"), "ros1": root / "one.bag"}
    expected = {"sqlite3": written["sqlite3"], "mcap": written["mcap"], "db3 file": written["sqlite3"],
                "mcap file": written["mcap"], "ros1": written["ros1"]}
    return paths, expected


@pytest.mark.parametrize("form", ["sqlite3", "mcap", "db3 file", "mcap file", "ros1"])
def test_messages_stream_in_time_order_with_the_recorded_stamps(bags, form):
    paths, expected = bags
    store = typestore()
    with Bag(paths[form]) as bag:
        plan = bag.plan(type_available=known)
        messages = list(bag.messages(plan))
        assert bag.is_ros1 == (form == "ros1")
        assert bag.start_ns == expected[form][0].timestamp_ns
    wanted = [r for r in expected[form] if r.topic != "/thing"]  # its type is unknown: skipped
    assert [(m.topic, m.timestamp_ns) for m in messages] == [(r.topic, r.timestamp_ns) for r in wanted]
    assert [m.timestamp_ns for m in messages] == sorted(m.timestamp_ns for m in messages)
    # CDR as ROS 2 publishes it (ROS 1 converted): the header stamps are the recorded ones
    assert [stamp_ns(m, store) for m in messages] == [r.stamp_ns for r in wanted]
    assert {m.msgtype for m in messages if m.topic == "/camera/image_raw"} == {IMAGE}


def test_unknown_types_are_skipped_with_a_warning_naming_the_type(bags):
    paths, _ = bags
    with Bag(paths["mcap"]) as bag:
        plan = bag.plan(type_available=known)
    assert [p.source for p in plan.played] == ["/camera/camera_info", "/camera/image_raw", "/chatter",
                                               "/lidar/points"]
    assert len(plan.warnings()) == 1 and "/thing" in plan.warnings()[0] and UNKNOWN_TYPE in plan.warnings()[0]
    assert {p.source: p.role for p in plan.played} == {"/camera/camera_info": "camera_info",
                                                        "/camera/image_raw": "camera", "/chatter": None,
                                                        "/lidar/points": "lidar"}


def test_an_unknown_type_asked_for_by_name_is_an_error(bags):
    paths, _ = bags
    with Bag(paths["sqlite3"]) as bag, pytest.raises(ValueError, match=f"/thing.*{UNKNOWN_TYPE}"):
        bag.plan(["/thing"], type_available=known)


def test_topic_selection_plays_only_those_topics(bags):
    paths, expected = bags
    with Bag(paths["sqlite3"]) as bag:
        plan = bag.plan(["/camera/image_raw", "lidar/points"], type_available=known)
        topics = [m.topic for m in bag.messages(plan)]
    assert set(topics) == {"/camera/image_raw", "/lidar/points"}
    assert len(topics) == sum(1 for r in expected["sqlite3"] if r.topic in set(topics))


def test_a_requested_topic_the_bag_lacks_names_it_and_the_bag(bags):
    paths, _ = bags
    with Bag(paths["mcap"]) as bag, pytest.raises(ValueError, match=r"bag .*mc: no topic /front/image .*the bag has"):
        bag.plan(["/front/image"], type_available=known)


def test_remap_and_namespace_set_the_published_names(tmp_path):
    write_bag(tmp_path / "front", storage="mcap", camera_topic="/front/image", extra=False)
    with Bag(tmp_path / "front") as bag:
        plan = bag.plan(remaps=(parse_remap("/front/image:=camera/image_raw"),), namespace="/robot1",
                        type_available=known)
        targets = {m.topic for m in bag.messages(plan)}
    camera = next(p for p in plan.played if p.source == "/front/image")
    assert camera.target == "/robot1/camera/image_raw" and camera.role == "camera"
    assert targets == {"/robot1/camera/image_raw", "/robot1/camera/camera_info", "/robot1/lidar/points"}


FOUR = tuple(CameraTopics(f"{name}/image_raw", f"{name}/camera_info") for name in ("front", "left", "right", "rear"))


def test_a_multi_camera_bag_plays_each_camera_on_its_own_topics_with_its_stamps(tmp_path):
    written = write_cameras_bag(tmp_path / "rig")
    with Bag(tmp_path / "rig") as bag:
        plan = bag.plan(namespace="/car", type_available=known, cameras=FOUR)
        played = [(m.topic, stamp_ns(m, typestore())) for m in bag.messages(plan)]
    roles = {p.target: p.role for p in plan.played}
    for name in ("front", "left", "right", "rear"):
        assert roles[f"/car/{name}/image_raw"] == "camera" and roles[f"/car/{name}/camera_info"] == "camera_info"
        stamps = [stamp for topic, stamp in played if topic == f"/car/{name}/image_raw"]
        assert stamps == [r.stamp_ns for r in written if r.topic == f"/{name}/image_raw"] and len(stamps) == 4
    assert roles["/car/lidar/points"] == "lidar"
    # a graph reading one camera takes the others as plain topics (no sensor role)
    with Bag(tmp_path / "rig") as bag:
        single = {p.target: p.role for p in bag.plan(namespace="/car", type_available=known).played}
    assert single["/car/front/image_raw"] is None and single["/car/lidar/points"] == "lidar"


def test_camera_topics_are_placed_under_the_namespace_unless_absolute():
    roles = role_targets("/car", (CameraTopics("front/image_raw", "front/camera_info"),
                                  CameraTopics("/cams/left/image_color", "/cams/left/camera_info")))
    assert roles == {"/car/lidar/points": "lidar", "/car/front/image_raw": "camera",
                     "/car/front/image_raw/compressed": "compressed camera", "/car/front/camera_info": "camera_info",
                     "/cams/left/image_color": "camera", "/cams/left/image_color/compressed": "compressed camera",
                     "/cams/left/camera_info": "camera_info"}
    assert set(role_targets("")) == {"/lidar/points", "/camera/image_raw", "/camera/image_raw/compressed",
                                     "/camera/camera_info"}


def test_remaps_put_a_rigs_topics_onto_the_graphs_cameras_and_check_their_types(tmp_path):
    write_cameras_bag(tmp_path / "rig", cameras=("cam0", "cam1"), topic="/{name}/image")
    rules = (parse_remap("/cam0/image:=/front/image_raw"), parse_remap("/cam1/image:=/rear/image_raw"),
             parse_remap("/cam0/camera_info:=/front/camera_info"), parse_remap("/cam1/camera_info:=/rear/camera_info"))
    cameras = (CameraTopics("front/image_raw", "front/camera_info"), CameraTopics("rear/image_raw", "rear/camera_info"))
    with Bag(tmp_path / "rig") as bag:
        plan = bag.plan(remaps=rules, namespace="/car", type_available=known, cameras=cameras)
    roles = {p.target: (p.source, p.role) for p in plan.played}
    assert roles["/car/front/image_raw"] == ("/cam0/image", "camera")
    assert roles["/car/rear/image_raw"] == ("/cam1/image", "camera")
    assert roles["/car/rear/camera_info"] == ("/cam1/camera_info", "camera_info")
    with Bag(tmp_path / "rig") as bag, pytest.raises(ValueError, match="/car/front/image_raw.*must be sensor_msgs"):
        bag.plan(remaps=(parse_remap("/lidar/points:=/front/image_raw"),), namespace="/car", type_available=known,
                 cameras=cameras)


def test_a_sensor_topic_of_the_wrong_type_is_an_error(tmp_path):
    write_bag(tmp_path / "wrong", camera_type=CLOUD, extra=False)
    with Bag(tmp_path / "wrong") as bag, pytest.raises(ValueError, match=(
            r"topic /camera/image_raw .*camera topic\) has type sensor_msgs/msg/PointCloud2; "
            r"the camera topic must be sensor_msgs/msg/Image")):
        bag.plan(type_available=known)


def test_a_remap_onto_a_sensor_topic_checks_the_type(bags):
    paths, _ = bags
    with Bag(paths["sqlite3"]) as bag, pytest.raises(ValueError, match=r"/chatter .*lidar topic.*std_msgs/msg/String"):
        bag.plan(["/chatter"], remaps=(Remap("/chatter", "/lidar/points"),), type_available=known)


@pytest.mark.parametrize("rules,match", [
    ([Remap("/nope", "/x")], "remap rule /nope:=/x: the bag has no topic /nope"),
    ([Remap("/chatter", "/a"), Remap("/chatter", "/b")], "two remap rules for /chatter"),
    ([Remap("/chatter", "/other")], "topics /chatter and /other would both be played as /other"),
])
def test_bad_remap_rules(rules, match):
    topics = {"/chatter": BagTopic("/chatter", STRING, 3), "/other": BagTopic("/other", STRING, 3)}
    with pytest.raises(ValueError, match=match):
        plan_topics("b", topics, None, rules, "", known)


@pytest.mark.parametrize("text", ["a", "a:=", ":=b", "a b:=c", "/x//y:=/z"])
def test_parse_remap_rejects_malformed_rules(text):
    with pytest.raises(ValueError, match="remap rule"):
        parse_remap(text)


def test_parse_remap_makes_names_absolute():
    assert parse_remap("front/image:=/camera/image_raw") == Remap("/front/image", "/camera/image_raw")
    assert absolute_topic("/a/b_1") == "/a/b_1"


def test_nothing_playable_is_an_error():
    topics = {"/thing": BagTopic("/thing", UNKNOWN_TYPE, 2)}
    with pytest.raises(ValueError, match=f"nothing to play .*{UNKNOWN_TYPE}"):
        plan_topics("b", topics, type_available=known)


# ----------------------------------------------------------------------------- bad bags

def _bad(tmp_path: Path, kind: str) -> Path:
    """A bad bag of one kind; the path to hand to Bag."""
    if kind == "missing":
        return tmp_path / "nope"
    if kind == "empty dir":
        (tmp_path / "d").mkdir()
        return tmp_path / "d"
    if kind == "text file":
        (tmp_path / "notes.txt").write_text("hello\n")
        return tmp_path / "notes.txt"
    if kind in ("garbage.db3", "garbage.mcap", "garbage.bag"):
        path = tmp_path / kind
        path.write_bytes(b"this is not a bag at all\n" * 40)
        return path
    if kind == "empty.mcap":
        (tmp_path / "empty.mcap").write_bytes(b"")
        return tmp_path / "empty.mcap"
    if kind.startswith("truncated"):
        storage = kind.split()[1]
        if storage == "ros1":
            write_ros1_bag(tmp_path / "r.bag", frames=20)
            truncate(tmp_path / "r.bag", 0.5)
            return tmp_path / "r.bag"
        write_bag(tmp_path / "b", frames=20, storage=storage)
        truncate(storage_file(tmp_path / "b"), 0.5)
        return tmp_path / "b"
    if kind == "database missing":
        write_bag(tmp_path / "b", frames=2)
        storage_file(tmp_path / "b").unlink()
        return tmp_path / "b"
    if kind == "bad metadata":
        write_bag(tmp_path / "b", frames=2)
        (tmp_path / "b" / "metadata.yaml").write_text("rosbag2_bagfile_information: {version: [")
        return tmp_path / "b"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind,match", [
    ("missing", "no such file or directory"),
    ("empty dir", "a directory without metadata.yaml"),
    ("text file", "unknown file type '.txt'"),
    ("garbage.db3", "not a readable bag"),
    ("garbage.mcap", "not a readable bag"),
    ("garbage.bag", "not a readable bag"),
    ("empty.mcap", "the file is empty"),
    ("truncated sqlite3", "not a readable bag"),
    ("truncated mcap", "not a readable bag"),
    ("truncated ros1", "not a readable bag"),
    ("database missing", "database files are missing"),
    ("bad metadata", "not a readable bag"),
])
def test_bad_bags_are_value_errors_naming_the_bag(tmp_path, kind, match):
    path = _bad(tmp_path, kind)
    with pytest.raises(ValueError, match=match) as info, Bag(path) as bag:
        list(bag.messages(bag.plan(type_available=known)))
    assert str(info.value).startswith(f"bag {path}: ")
    assert "\n" not in str(info.value)


def test_damage_inside_an_mcap_chunk_is_found_while_streaming(tmp_path):
    """A damaged chunk loses its records silently in the MCAP reader; the index's counts catch it
    once the played messages run out, after everything readable has played."""
    write_bag(tmp_path / "b", frames=40, storage="mcap")
    path = storage_file(tmp_path / "b")
    data = bytearray(path.read_bytes())
    third = len(data) // 3  # the middle third: record headers as well as payloads
    data[third:2 * third] = b"\x07" * third
    path.write_bytes(bytes(data))
    read = 0
    with Bag(tmp_path / "b") as bag, pytest.raises(ValueError, match="more messages than could be read"):
        for _ in bag.messages(bag.plan(type_available=known)):
            read += 1
    assert 0 < read < 40 * 5


def test_a_bag_without_messages_is_an_error(tmp_path):
    write_bag(tmp_path / "b", frames=0)
    with pytest.raises(ValueError, match="has no messages"):
        Bag(tmp_path / "b")


# ----------------------------------------------------------------------------- pacing

def _messages(times_s: list[float], topic: str = "/t") -> list[BagMessage]:
    return [BagMessage(topic, STRING, round(t * NS), b"") for t in times_s]


def test_steps_follow_the_bag_time_divided_by_the_rate():
    messages = _messages([10.0, 10.5, 12.0])
    steps = list(paced_steps(lambda: messages, 10 * NS, 12 * NS + 1, Pacing(rate=2.0, clock_hz=1.0)))
    sent = [s for s in steps if s.message is not None]
    assert [s.at_s for s in sent] == pytest.approx([0.0, 0.25, 1.0])
    assert [s.clock_ns for s in sent] == [m.timestamp_ns for m in messages]
    assert all(s.loop == 0 for s in steps)


def test_clock_ticks_fill_gaps_between_messages_and_never_go_back_within_a_pass():
    messages = _messages([0.0, 3.0])
    steps = list(paced_steps(lambda: messages, 0, 3 * NS + 1, Pacing(rate=1.0, clock_hz=4.0)))
    ticks = [s for s in steps if s.message is None]
    assert [s.at_s for s in ticks] == pytest.approx([0.25 * i for i in range(1, 12)])
    assert [s.clock_ns for s in ticks] == [round(0.25 * i * NS) for i in range(1, 12)]
    clocks = [s.clock_ns for s in steps]
    assert clocks == sorted(clocks)
    assert [s.at_s for s in steps] == sorted(s.at_s for s in steps)


def test_a_loop_replays_each_pass_after_the_last_and_the_clock_starts_again():
    messages = _messages([1.0, 1.5, 2.0])
    calls = []

    def passes():
        calls.append(1)
        return iter(messages)

    steps = [s for s in paced_steps(passes, NS, 2 * NS + 1, Pacing(rate=0.5, loop=True, clock_hz=0.1),
                                    max_passes=3) if s.message is not None]
    assert len(calls) == 3, "each pass streams the bag again"
    period_s = (NS + 1) / NS / 0.5
    assert [s.loop for s in steps] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [s.at_s for s in steps] == pytest.approx([k * period_s + d for k in range(3) for d in (0.0, 1.0, 2.0)])
    assert [s.clock_ns for s in steps] == [m.timestamp_ns for m in messages] * 3


def test_looping_a_bag_with_one_timestamp_is_refused():
    assert loop_period_ns(5, 10) == 5
    with pytest.raises(ValueError, match="same timestamp"):
        loop_period_ns(5, 6)


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
def test_the_rate_must_be_positive_and_finite(rate):
    with pytest.raises(ValueError, match="rate"):
        Pacing(rate=rate)
