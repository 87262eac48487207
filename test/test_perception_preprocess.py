"""Letterbox round trips at odd sizes and the preprocessing each option asks for."""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.perception.letterbox import plan_letterbox
from dynnet_ros.perception.model_info import TensorInfo
from dynnet_ros.perception.preprocess import PreprocessDefaults, PreprocessOptions, build_preprocess

ODD_SIZES = [(37, 53), (53, 37), (481, 641), (1, 7), (719, 1279), (300, 451)]
PLANS = {
    "fixed-centred": {"target": (64, 96), "fixed": True, "center": True},
    "fixed-corner": {"target": (320, 320), "fixed": True},
    "dynamic-fit": {"target": (640, 640), "multiple": 32, "center": True},
    "dynamic-keep": {"target": None, "multiple": 14},
    "dynamic-shrink-only": {"target": (256, 256), "multiple": 32, "scaleup": False},
    "stretch-fixed": {"target": (64, 64), "fixed": True, "stretch": True},
    "stretch-dynamic": {"target": (320, 320), "multiple": 32, "stretch": True},
}


def forward_box(box, lb):
    """Source-pixel box -> model-input pixels: the mapping the letterbox describes."""
    x1, y1, x2, y2 = box
    return [x1 * lb.scale_x + lb.left, y1 * lb.scale_y + lb.top, x2 * lb.scale_x + lb.left,
            y2 * lb.scale_y + lb.top]


@pytest.mark.parametrize("size", ODD_SIZES, ids=lambda s: f"{s[1]}x{s[0]}")
@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_letterbox_round_trips(size, plan):
    height, width = size
    lb = plan_letterbox(height, width, **PLANS[plan])
    # the scaled frame fits inside the input, and the input is what the plan promises
    assert lb.top >= 0 and lb.top + lb.new_h <= lb.pad_h and lb.left >= 0 and lb.left + lb.new_w <= lb.pad_w
    options = PLANS[plan]
    if options.get("fixed"):
        assert (lb.pad_h, lb.pad_w) == options["target"]
    else:
        assert lb.pad_h % options["multiple"] == 0 and lb.pad_w % options["multiple"] == 0
    if plan == "dynamic-shrink-only":
        assert lb.new_h <= height and lb.new_w <= width
    # boxes: source -> input -> source is the identity (inside the frame)
    rng = np.random.default_rng(height * 1000 + width)
    xs = np.sort(rng.uniform(0, width, (20, 2)), axis=1)
    ys = np.sort(rng.uniform(0, height, (20, 2)), axis=1)
    boxes = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
    sent = np.array([forward_box(b, lb) for b in boxes])
    back = lb.boxes_to_source(sent)
    np.testing.assert_allclose(back, boxes, atol=1e-3)
    # dense maps: a map made at input resolution from the frame comes back to the frame
    frame_map = (np.arange(height)[:, None] * 0.5 + np.arange(width)[None, :] * 0.25).astype(np.float32)
    model_map = np.zeros((lb.pad_h, lb.pad_w), np.float32)
    rows = (np.arange(lb.new_h) + 0.5) / lb.new_h * height - 0.5
    cols = (np.arange(lb.new_w) + 0.5) / lb.new_w * width - 0.5
    model_map[lb.top: lb.top + lb.new_h, lb.left: lb.left + lb.new_w] = \
        np.clip(rows, 0, height - 1)[:, None] * 0.5 + np.clip(cols, 0, width - 1)[None, :] * 0.25
    restored = lb.to_source(model_map)
    assert restored.shape == (height, width)
    step = max(height / lb.new_h, width / lb.new_w)   # one input pixel in frame pixels
    interior = (slice(int(step) + 1, height - int(step) - 1), slice(int(step) + 1, width - int(step) - 1))
    np.testing.assert_allclose(restored[interior], frame_map[interior], atol=0.5 * step + 1e-3)


def test_intrinsics_follow_the_letterbox():
    lb = plan_letterbox(37, 53, target=(64, 64), fixed=True, center=True)
    k = np.array([[40.0, 0, 26.0], [0, 40.0, 18.0], [0, 0, 1]])
    point = np.array([0.3, -0.2, 2.0])
    u, v = (k @ point)[:2] / point[2]
    ks = lb.scale_intrinsics(k)
    us, vs = (ks @ point)[:2] / point[2]
    # half-pixel centres: input pixel centre = (source centre + 0.5) * scale - 0.5 + offset
    assert us == pytest.approx((u + 0.5) * lb.scale_x - 0.5 + lb.left)
    assert vs == pytest.approx((v + 0.5) * lb.scale_y - 0.5 + lb.top)


def spec(dims, dtype=np.float32, name="images") -> TensorInfo:
    return TensorInfo(name, np.dtype(dtype), tuple(dims))


def solid(colour, height=5, width=7) -> np.ndarray:
    return np.broadcast_to(np.array(colour, np.uint8), (height, width, 3)).copy()


def test_normalisation_order_and_padding():
    pre = build_preprocess(spec([1, 3, 8, 8]), {}, PreprocessDefaults(pad_value=114.0),
                           PreprocessOptions(channel_order="BGR", mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.2)))
    tensor, lb = pre(solid((255, 51, 0)))
    # BGR: channel 0 is blue. value = (pixel/255 - mean) / std with mean/std given in RGB order
    inside = tensor[0, :, lb.top + 1, lb.left + 1]
    np.testing.assert_allclose(inside, [(0 - 0.3) / 0.2, (0.2 - 0.2) / 0.25, (1.0 - 0.1) / 0.5], atol=1e-6)
    pad = tensor[0, :, 0, 0]   # centred letterbox: the top row is padding
    assert lb.top > 0
    np.testing.assert_allclose(pad, [(114 / 255 - 0.3) / 0.2, (114 / 255 - 0.2) / 0.25, (114 / 255 - 0.1) / 0.5],
                               atol=1e-6)


def test_metadata_supplies_what_options_do_not():
    meta = {"mean": "[0.5, 0.5, 0.5]", "std": "[0.5, 0.5, 0.5]", "imgsz": "[96, 128]", "stride": "16"}
    pre = build_preprocess(spec([1, 3, "h", "w"]), meta, PreprocessDefaults(), PreprocessOptions(std=(1, 1, 1)))
    assert pre.mean == (0.5, 0.5, 0.5) and pre.std == (1.0, 1.0, 1.0)   # the option wins over metadata
    assert pre.target == (96, 128) and pre.multiple == 16 and not pre.fixed


def test_nhwc_float16_and_scale():
    pre = build_preprocess(spec([1, 4, 6, 3], np.float16), {}, PreprocessDefaults(pad_value=0.0),
                           PreprocessOptions(scale=255.0))
    tensor, lb = pre(solid((10, 20, 30), 4, 6))
    assert pre.layout == "NHWC" and tensor.dtype == np.float16 and tensor.shape == (1, 4, 6, 3)
    np.testing.assert_array_equal(tensor[0, 0, 0], np.array([10, 20, 30], np.float16))


def test_resized_values_are_bilinear():
    """A horizontal ramp scaled by 1/2 samples between source pixels (half-pixel centres)."""
    frame = np.repeat(np.arange(0, 80, 10, dtype=np.uint8)[None, :, None], 3, axis=2).repeat(4, axis=0)
    pre = build_preprocess(spec([1, 3, 2, 4]), {}, PreprocessDefaults(center=False),
                           PreprocessOptions(scale=255.0))
    tensor, lb = pre(frame)
    assert (lb.new_h, lb.new_w) == (2, 4)
    np.testing.assert_allclose(tensor[0, 0, 0], [5, 25, 45, 65], atol=1e-4)


def test_reused_buffer_is_refilled():
    pre = build_preprocess(spec([1, 3, 8, 8]), {}, PreprocessDefaults(), PreprocessOptions())
    first, _ = pre(solid((255, 255, 255)))
    kept = first.copy()
    second, _ = pre(solid((0, 0, 0)), first)
    assert second is first and not np.array_equal(second, kept)


@pytest.mark.parametrize("dims,options,message", [
    ([1, 3, 8, 8], PreprocessOptions(input_size=16), "contradicts the model's fixed input"),
    ([1, 3, "h", "w"], PreprocessOptions(resize="stretch", input_size=0), "needs a size to stretch to"),
    ([1, 3, 8, 8], PreprocessOptions(layout="NHWC"), "contradicts"),
    ([1, 3, 8], PreprocessOptions(), "is not NCHW, NHWC or CHW"),
    ([1, 5, 8, 8], PreprocessOptions(), "is not NCHW, NHWC or CHW"),
    ([3, "h", "w"], PreprocessOptions(layout="NCHW"), "contradicts"),
    ([1, 3, "h", "w"], PreprocessOptions(input_size=-3), ">= 0"),
    ([1, 3, "h", "w"], PreprocessOptions(input_size=(1, 2, 3)), "height, width"),
    ([1, 3, "h", "w"], PreprocessOptions(input_multiple=0), "input_multiple"),
    ([1, 3, 8, 8], PreprocessOptions(scale=-1.0), "scale must be a positive"),
    ([1, 3, 8, 8], PreprocessOptions(pad_value=300.0), "pad_value"),
])
def test_contradictions_are_value_errors(dims, options, message):
    with pytest.raises(ValueError, match=message):
        build_preprocess(spec(dims), {}, PreprocessDefaults(), options)


def test_unsupported_input_type():
    with pytest.raises(ValueError, match="element type int64"):
        build_preprocess(spec([1, 3, 8, 8], np.int64), {}, PreprocessDefaults(), PreprocessOptions())


def test_bad_metadata_is_named():
    with pytest.raises(ValueError, match="metadata 'mean' is not a literal"):
        build_preprocess(spec([1, 3, 8, 8]), {"mean": "numpy.zeros(3)"}, PreprocessDefaults(), PreprocessOptions())


def test_a_frame_that_needs_no_resize_is_normalised_as_a_resized_one_is():
    """A frame already at the input size is normalised straight into the tensor: the same float32
    arithmetic per pixel as the resize path's rows (divide, then subtract), padding included."""
    pre = build_preprocess(spec([1, 3, "H", "W"]), {}, PreprocessDefaults(),
                           PreprocessOptions(channel_order="BGR", mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 0.2),
                                             input_size=64))
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    tensor, box = pre(frame)
    assert (box.new_h, box.new_w) == (48, 64)
    divisor, offset = pre._affine()
    for c, source in enumerate((2, 1, 0)):
        expected = np.subtract(np.divide(frame[:, :, source], divisor[c], dtype=np.float32), offset[c],
                               dtype=np.float32)
        np.testing.assert_array_equal(tensor[0, c, box.top: box.top + 48, box.left: box.left + 64], expected)
