"""The bookkeeping behind lossless replay, without a graph: the frame reports' wire format, the
stamp read from a message's CDR bytes, the player's ledger (who is still busy with a frame, what
the report lists), a node's count of frames missing from the camera's stamps, and what the
replay changes in the graph it starts (lossless links, the compressed camera)."""
from __future__ import annotations

import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import CameraInfo, CompressedImage, Image
from std_msgs.msg import Header

from dynnet_ros.bags.progress import FrameCounts, FrameLedger, header_stamp_ns
from dynnet_ros.bags.topics import BagTopic, plan_topics
from dynnet_ros.commands.replay import camera_transport, lossless_links
from dynnet_ros.frame_reports import FrameOutcome
from dynnet_ros.graph_config import ProcessSpec
from dynnet_ros.perception.frame_stats import StampGaps

NS = 1_000_000_000


def header(stamp_ns: int) -> Header:
    h = Header(frame_id="camera")
    h.stamp.sec, h.stamp.nanosec = stamp_ns // NS, stamp_ns % NS
    return h


@pytest.mark.parametrize("msg", [Image(header=header(1234 * NS + 5678), width=2, height=1, encoding="rgb8",
                                       step=6, data=bytes(6)),
                                 CompressedImage(header=header(1234 * NS + 5678), format="jpeg", data=b"\xff\xd8"),
                                 CameraInfo(header=header(1234 * NS + 5678))])
def test_the_stamp_is_read_from_the_serialized_message(msg):
    assert header_stamp_ns(serialize_message(msg)) == 1234 * NS + 5678


def test_a_big_endian_cdr_stamp_reads_too():
    data = b"\x00\x00\x00\x00" + (7).to_bytes(4, "big") + (9).to_bytes(4, "big")
    assert header_stamp_ns(data) == 7 * NS + 9
    with pytest.raises(ValueError, match="no header stamp"):
        header_stamp_ns(b"\x00\x01\x00\x00\x01")


def test_a_frame_report_round_trips_and_malformed_ones_are_named():
    report = FrameOutcome("/ns/lane_node", "/ns/camera/image_raw", 42, "dropped")
    assert FrameOutcome.from_json(report.to_json()) == report
    for text, what in [("{", "not JSON"), ("[]", "JSON object"), ('{"node": 1, "topic": "t"}', "string"),
                       ('{"node": "n", "topic": "t", "stamp_ns": 1.5, "outcome": "processed"}', "integer"),
                       ('{"node": "n", "topic": "t", "stamp_ns": 1, "outcome": "eaten"}', "outcome")]:
        with pytest.raises(ValueError, match=what):
            FrameOutcome.from_json(text)


def test_the_ledger_waits_for_every_reader_of_a_topic_and_counts_their_outcomes():
    ledger = FrameLedger({"/cam": ["/a", "/b"]})
    ledger.published("/cam", 1)
    assert ledger.waiting_for("/cam", 1) == ["/a", "/b"]
    ledger.reported(FrameOutcome("/a", "/cam", 1, "processed"))
    assert ledger.waiting_for("/cam", 1) == ["/b"]
    ledger.reported(FrameOutcome("/b", "/cam", 1, "failed"))
    assert ledger.waiting_for("/cam", 1) == []
    assert ledger.waiting_for("/other", 1) == []  # nobody paces a topic without readers
    ledger.published("/cam", 1)  # a loop plays the same stamp again: each pass is waited for
    assert ledger.waiting_for("/cam", 1) == ["/a", "/b"]
    ledger.reported(FrameOutcome("/a", "/cam", 1, "processed"))
    ledger.reported(FrameOutcome("/b", "/cam", 1, "dropped"))
    ledger.published("/cam", 2)
    counts = ledger.counts()
    assert counts[("/a", "/cam")] == FrameCounts(published=3, received=2, processed=2)
    assert counts[("/b", "/cam")] == FrameCounts(published=3, received=2, failed=1, dropped=1)
    assert counts[("/a", "/cam")].lost == 1 and counts[("/b", "/cam")].lost == 3
    assert set(ledger.lost()) == {("/a", "/cam"), ("/b", "/cam")}


def test_a_disabled_nodes_skipped_frames_are_not_lost():
    ledger = FrameLedger({"/cam": ["/a"]})
    ledger.published("/cam", 1)
    ledger.reported(FrameOutcome("/a", "/cam", 1, "skipped"))
    assert ledger.lost() == {} and ledger.counts()[("/a", "/cam")].line().endswith("skipped 1 (disabled)")


def test_a_node_that_reads_no_paced_topic_is_still_reported():
    ledger = FrameLedger({})
    ledger.reported(FrameOutcome("/live", "/cam", 5, "processed"))
    assert ledger.counts()[("/live", "/cam")] == FrameCounts(published=0, received=1, processed=1)


def stamps(*indices: float, period_ns: int = NS // 10) -> list[int]:
    return [round(i * period_ns) for i in indices]


def test_gaps_in_the_camera_stamps_count_the_frames_missing():
    gaps = StampGaps()
    for stamp in stamps(0, 1, 2, 3, 5, 6, 9, 10):
        gaps.observe(stamp)
    assert (gaps.lost, gaps.out_of_order) == (1 + 2, 0)


def test_stamps_out_of_order_are_counted_and_repeats_ignored():
    gaps = StampGaps()
    for stamp in stamps(0, 1, 2, 3, 2, 4, 4, 5):
        gaps.observe(stamp)
    assert (gaps.lost, gaps.out_of_order) == (0, 1)


def test_no_gap_is_counted_before_the_cameras_rate_is_known_nor_for_jitter():
    gaps = StampGaps()
    for stamp in stamps(0, 3, 4, 5, 6.4, 7.3, 8.6, 9.5):  # a first step of 3 periods, then jitter
        gaps.observe(stamp)
    assert (gaps.lost, gaps.out_of_order) == (0, 0)


def test_a_recordings_frame_reports_are_not_played_back_into_the_graph():
    topics = {"/dynnet/frames": BagTopic("/dynnet/frames", "std_msgs/msg/String", 4),
              "/camera/image_raw": BagTopic("/camera/image_raw", "sensor_msgs/msg/Image", 4)}
    plan = plan_topics("run.mcap", topics, namespace="/ns")
    assert [t.target for t in plan.played] == ["/ns/camera/image_raw"]
    assert plan.warnings() == ["topic /dynnet/frames is not played: the model nodes of the graph publish their own "
                               "frame reports there"]


def test_replay_makes_only_the_model_nodes_links_lossless_and_the_configs_own_overrides_win():
    plan = plan_topics("run.mcap", {"/camera/image_raw": BagTopic("/camera/image_raw", "sensor_msgs/msg/Image", 4),
                                    "/lidar/points": BagTopic("/lidar/points", "sensor_msgs/msg/PointCloud2", 4)})
    lane = ProcessSpec("lane_node", "lane_node", "", {"threads": 1}, ())
    assert lossless_links(lane, plan).parameters["qos_overrides"] == {
        "/camera/image_raw": {"subscription": {"reliability": "reliable", "durability": "transient_local"}},
        "/lidar/points": {"subscription": {"reliability": "reliable", "durability": "transient_local"}}}
    own = ProcessSpec("depth_node", "depth_node", "", {
        "qos_overrides": {"/lidar/points": {"subscription": {"reliability": "best_effort"}}},
        "qos_overrides./camera/image_raw.subscription.durability": "volatile"}, ())
    assert lossless_links(own, plan).parameters["qos_overrides"] == {
        "/camera/image_raw": {"subscription": {"reliability": "reliable"}},
        "/lidar/points": {"subscription": {"reliability": "best_effort", "durability": "transient_local"}}}
    manager = ProcessSpec("budget_manager", "budget_manager", "", {}, ())
    assert lossless_links(manager, plan) == manager


def test_replay_takes_the_compressed_camera_when_the_bag_has_only_that():
    compressed = plan_topics("robot.mcap", {"/camera/image_raw/compressed": BagTopic(
        "/camera/image_raw/compressed", "sensor_msgs/msg/CompressedImage", 4)})
    raw = plan_topics("sim.mcap", {"/camera/image_raw": BagTopic("/camera/image_raw", "sensor_msgs/msg/Image", 4)})
    lane = ProcessSpec("lane_node", "lane_node", "", {}, ())
    assert camera_transport(lane, compressed).parameters == {"image_transport": "compressed"}
    assert camera_transport(lane, raw) == lane
    chosen = ProcessSpec("lane_node", "lane_node", "", {"image_transport": "raw"}, ())
    assert camera_transport(chosen, compressed) == chosen  # the config's choice stands (the report warns)
    with pytest.raises(ValueError, match="must be sensor_msgs/msg/CompressedImage"):
        plan_topics("bad.mcap", {"/camera/image_raw/compressed": BagTopic(
            "/camera/image_raw/compressed", "sensor_msgs/msg/Image", 4)})
