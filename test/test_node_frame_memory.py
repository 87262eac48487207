"""The model nodes' lean frame path: same model input and outputs as the plain numpy path, fewer
bytes, and an honest account of what the node holds per frame (nodes/frame_memory.py)."""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.nodes.convert import array_to_image, image_to_array, image_to_rgb_float
from dynnet_ros.nodes.frame_memory import MESSAGE_COPIES, InputBuffer, frame_bytes, resize_plane_into, to_source_lean
from dynnet_ros.nodes.geometry import plan_letterbox, resize_bilinear, to_nchw


def _image(encoding: str, height: int, width: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if encoding in ("rgb8", "bgr8"):
        return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    if encoding in ("rgba8", "bgra8"):
        return rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    if encoding == "mono8":
        return rng.integers(0, 256, (height, width), dtype=np.uint8)
    if encoding == "mono16":
        return rng.integers(0, 65536, (height, width), dtype=np.uint16)
    return rng.uniform(-0.2, 1.2, (height, width)).astype(np.float32)  # 32FC1, clipped to [0, 1]


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8", "mono8", "mono16", "32FC1"])
@pytest.mark.parametrize("size,max_side", [((96, 160), 640), ((240, 320), 640), ((200, 300), 128), ((72, 1280), 640)])
@pytest.mark.parametrize("pad_value", [0.0, 0.5])
def test_input_buffer_matches_the_plain_numpy_path_bit_for_bit(encoding, size, max_side, pad_value):
    msg = array_to_image(_image(encoding, *size), encoding)
    letterbox = plan_letterbox(*size, multiple=32, max_side=max_side)
    expected = to_nchw(letterbox.apply(image_to_rgb_float(msg), pad_value=pad_value))
    got = InputBuffer(3).fill_image(image_to_array(msg), encoding, letterbox, pad_value)
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


def test_input_buffer_is_reused_and_reallocated_only_for_a_new_size():
    buf = InputBuffer(3)
    a = image_to_array(array_to_image(_image("rgb8", 96, 160), "rgb8"))
    lb = plan_letterbox(96, 160)
    first = buf.fill_image(a, "rgb8", lb, 0.0)
    second = buf.fill_image(a, "rgb8", lb, 0.0)
    assert first is second and buf.nbytes == 3 * 96 * 160 * 4
    bigger = plan_letterbox(120, 160)
    third = buf.fill_image(image_to_array(array_to_image(_image("rgb8", 120, 160), "rgb8")), "rgb8", bigger, 0.0)
    assert third is not first and third.shape == (1, 3, 128, 160)


def test_nan_in_a_float_image_is_rejected_with_the_same_reason():
    image = _image("32FC1", 32, 32)
    image[3, 4] = np.nan
    msg = array_to_image(image, "32FC1")
    with pytest.raises(ValueError, match="NaN"):
        InputBuffer(3).fill_image(image_to_array(msg), "32FC1", plan_letterbox(32, 32), 0.0)


def test_image_to_array_is_a_view_over_the_message_data_when_rows_are_unpadded():
    msg = array_to_image(_image("rgb8", 48, 64), "rgb8")
    array = image_to_array(msg)
    assert np.shares_memory(array, np.frombuffer(msg.data, dtype=np.uint8))


@pytest.mark.parametrize("src,dst", [((90, 160), (48, 64)), ((48, 64), (90, 160)), ((37, 50), (37, 50))])
def test_chunked_resize_equals_resize_bilinear(src, dst):
    plane = np.random.default_rng(1).random(src, dtype=np.float32)
    out = np.empty(dst, np.float32)
    resize_plane_into(plane, out, chunk_rows=7)
    np.testing.assert_array_equal(out, resize_bilinear(plane, *dst))


def test_to_source_lean_is_a_view_unless_rescaled_and_equals_to_source():
    same = plan_letterbox(100, 150)  # padded to 128x160, not rescaled
    model_map = np.random.default_rng(2).random((same.pad_h, same.pad_w), dtype=np.float32)
    lean = to_source_lean(same, model_map)
    assert np.shares_memory(lean, model_map)
    np.testing.assert_array_equal(lean, same.to_source(model_map))
    scaled = plan_letterbox(720, 1280, max_side=640)
    model_map = np.random.default_rng(3).random((scaled.pad_h, scaled.pad_w), dtype=np.float32)
    np.testing.assert_array_equal(to_source_lean(scaled, model_map), scaled.to_source(model_map))


def test_frame_bytes_counts_messages_inputs_and_the_larger_of_scratch_and_outputs():
    lb = plan_letterbox(480, 640)
    fb = frame_bytes(640 * 480 * 3, lb, input_channels=4, output_bytes_per_pixel=12.0)
    assert fb.messages == MESSAGE_COPIES * 640 * 480 * 3
    assert fb.inputs == 4 * 480 * 640 * 4
    assert fb.scratch == 0 and fb.outputs == 12 * 640 * 480
    assert fb.total == fb.messages + fb.inputs + fb.outputs
    scaled = plan_letterbox(720, 1280, max_side=640)
    fs = frame_bytes(1280 * 720 * 3, scaled, scaled_output_bytes_per_pixel=4.0, output_bytes_per_pixel=3.0)
    assert fs.inputs == 3 * scaled.pad_h * scaled.pad_w * 4
    assert fs.scratch > 0 and fs.outputs >= 7 * 1280 * 720
    # a larger camera costs more than a smaller one of the same model input size
    small = frame_bytes(640 * 360 * 3, plan_letterbox(360, 640), scaled_output_bytes_per_pixel=4.0,
                        output_bytes_per_pixel=3.0)
    assert small.inputs == fs.inputs and fs.total > small.total


def test_the_lean_path_allocates_less_than_the_plain_path():
    import tracemalloc

    msg = array_to_image(_image("rgb8", 480, 640), "rgb8")
    lb = plan_letterbox(480, 640)
    buf = InputBuffer(3)
    buf.fill_image(image_to_array(msg), "rgb8", lb, 0.0)  # allocate the reused tensor first
    tracemalloc.start()
    buf.fill_image(image_to_array(msg), "rgb8", lb, 0.0)
    lean_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    to_nchw(lb.apply(image_to_rgb_float(msg), pad_value=0.0))
    plain_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert lean_peak < 0.05 * plain_peak, (lean_peak, plain_peak)


def test_published_profile_adds_the_frame_buffers_to_every_engine_level():
    from dynnet_ros.budget.protocol import ModelProfile
    from dynnet_ros.nodes.budget_profile import shift_profile

    engine = ModelProfile(node="/lane_node", min_mb=33.0, full_mb=64.0, table=((33.0, 120.0), (64.0, 80.0)),
                          rss_mb=140.0, held_mb=30.0, budget_mb=45.0)
    node = shift_profile(engine, 8.0)
    assert (node.min_mb, node.full_mb) == (41.0, 72.0)
    assert node.table == ((41.0, 120.0), (72.0, 80.0))
    assert (node.held_mb, node.budget_mb, node.rss_mb) == (30.0, 45.0, 140.0)  # measured values stay
    single = ModelProfile(node="/x", min_mb=48.0, full_mb=48.0, table=(), held_mb=44.0)
    assert shift_profile(single, 8.0) == single  # a measured footprint already includes them
