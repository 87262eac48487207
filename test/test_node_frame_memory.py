"""An honest account of what a model node holds per frame outside its engine (perception/frame_memory.py)."""
from __future__ import annotations

from dynnet_ros.budget.protocol import ModelProfile
from dynnet_ros.nodes.budget_profile import shift_profile
from dynnet_ros.perception.frame_memory import MESSAGE_COPIES, frame_bytes
from dynnet_ros.perception.letterbox import plan_letterbox


def test_frame_bytes_counts_messages_inputs_and_the_larger_of_scratch_and_outputs():
    lb = plan_letterbox(480, 640, target=(640, 640), multiple=32, scaleup=False)
    fb = frame_bytes(640 * 480 * 3, lb, input_channels=4, output_bytes_per_pixel=12.0)
    assert fb.messages == MESSAGE_COPIES * 640 * 480 * 3
    assert fb.inputs == 4 * 480 * 640 * 4
    assert fb.scratch == 0 and fb.outputs == 12 * 640 * 480
    assert fb.total == fb.messages + fb.inputs + fb.outputs
    scaled = plan_letterbox(720, 1280, target=(640, 640), multiple=32, scaleup=False)
    fs = frame_bytes(1280 * 720 * 3, scaled, output_bytes_per_pixel=0.0)
    assert (scaled.pad_h, scaled.pad_w) == (384, 640)
    assert fs.inputs == 3 * 384 * 640 * 4
    assert fs.scratch > 0 and fs.total == fs.messages + fs.inputs + fs.scratch
    # a larger camera costs more than a smaller one of the same model input size
    small = frame_bytes(640 * 360 * 3, plan_letterbox(360, 640, target=(640, 640), multiple=32, scaleup=False),
                        output_bytes_per_pixel=3.0)
    assert small.inputs == fs.inputs and fs.total > small.total


def test_published_profile_adds_the_frame_buffers_to_every_engine_level():
    engine = ModelProfile(node="/lane_node", min_mb=33.0, full_mb=64.0, table=((33.0, 120.0), (64.0, 80.0)),
                          rss_mb=140.0, held_mb=30.0, budget_mb=45.0)
    node = shift_profile(engine, 8.0)
    assert (node.min_mb, node.full_mb) == (41.0, 72.0)
    assert node.table == ((41.0, 120.0), (72.0, 80.0))
    assert (node.held_mb, node.budget_mb, node.rss_mb) == (30.0, 45.0, 140.0)  # measured values stay
    single = ModelProfile(node="/x", min_mb=48.0, full_mb=48.0, table=(), held_mb=44.0)
    assert shift_profile(single, 8.0) == single  # a measured footprint already includes them
