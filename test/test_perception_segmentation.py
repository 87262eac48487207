"""Segmenter formats: per-class logits, one-channel probabilities or logits, several outputs, the zoo."""
from __future__ import annotations

import numpy as np
import pytest
from _perception_models import pixel_map

from dynnet_ros.perception import Segmenter

# three classes: 0 background (dark), 1 "red" where R dominates, 2 "blue" where B dominates
WEIGHTS = np.array([[-1.0, -1.0, -1.0], [4.0, -2.0, -2.0], [-2.0, -2.0, 4.0]], np.float32)
BIAS = np.array([1.5, 0.0, 0.0], np.float32)
NAMES = "['background', 'red', 'blue']"


def scene(height=64, width=96) -> np.ndarray:
    img = np.full((height, width, 3), 20, np.uint8)
    img[8:40, 10:50] = (230, 30, 30)
    img[30:60, 60:90] = (30, 30, 230)
    return img


def reference_logits(img: np.ndarray) -> np.ndarray:
    """(C, H, W): the fixture's 1x1 convolution on pixels / 255, computed here in numpy."""
    x = img.astype(np.float32) / 255.0
    return np.einsum("cj,hwj->chw", WEIGHTS, x) + BIAS[:, None, None]


def test_class_logits_argmax_and_selected_classes(tmp_path):
    path = pixel_map(tmp_path / "seg.onnx", WEIGHTS, BIAS, metadata={"names": NAMES})
    img = scene()
    logits = reference_logits(img)
    soft = np.exp(logits - logits.max(0)) / np.exp(logits - logits.max(0)).sum(0)
    seg = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0)   # 64x96: no resize, no padding
    assert seg.format_name == "logits"
    out = seg(img)
    np.testing.assert_array_equal(out.class_map, logits.argmax(0))
    np.testing.assert_array_equal(out.mask, logits.argmax(0) > 0)   # default: every class but 0
    np.testing.assert_allclose(out.probability, soft[1:].sum(0), atol=1e-5)
    only_blue = Segmenter(path, classes=["blue"], mean=(0, 0, 0), std=(1, 1, 1), input_size=0)(img)
    np.testing.assert_array_equal(only_blue.mask, logits.argmax(0) == 2)
    np.testing.assert_allclose(only_blue.probability, soft[2], atol=1e-5)
    with pytest.raises(ValueError, match="unknown class name 'green'"):
        Segmenter(path, classes=["green"])


def test_low_resolution_output_comes_back_at_source_size(tmp_path):
    path = pixel_map(tmp_path / "seg4.onnx", WEIGHTS, BIAS, stride=4)
    img = scene(61, 93)   # odd: letterboxed to 64x96, output 16x24
    seg = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0)
    out = seg(img)
    assert out.mask.shape == (61, 93) and out.class_map.shape == (61, 93)
    expected = reference_logits(img).argmax(0)
    # away from the class borders (the 4x4 pooling blurs them) the classes agree
    assert (out.class_map[12:36, 14:46] == 1).all() and (out.class_map[34:56, 64:86] == 2).all()
    assert np.mean(out.class_map == expected) > 0.9


@pytest.mark.parametrize("sigmoid", [True, False], ids=["probabilities", "logits"])
@pytest.mark.parametrize("squeeze", [False, True], ids=["1x1xHxW", "1xHxW"])
def test_one_channel_probabilities_or_logits(tmp_path, sigmoid, squeeze):
    weights = np.array([[4.0, -2.0, -2.0]], np.float32)
    path = pixel_map(tmp_path / "bin.onnx", weights, np.array([-0.5], np.float32), sigmoid=sigmoid, squeeze=squeeze)
    img = scene()
    logit = np.einsum("j,hwj->hw", weights[0], img.astype(np.float32) / 255.0) - 0.5
    prob = 1.0 / (1.0 + np.exp(-logit))
    seg = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0)
    assert seg.format_name == "binary"
    out = seg(img)
    np.testing.assert_allclose(out.probability, prob, atol=1e-5)
    np.testing.assert_array_equal(out.mask, prob >= 0.5)
    assert out.class_map is None
    high = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0, threshold=0.9)(img)
    np.testing.assert_array_equal(high.mask, prob >= 0.9)
    with pytest.raises(ValueError, match="no classes to select"):
        Segmenter(path, classes=[1])


def test_output_name_picks_one_of_several_outputs(tmp_path):
    weights = np.array([[4.0, -2.0, -2.0]], np.float32)
    path = pixel_map(tmp_path / "multi.onnx", weights, np.array([-0.5], np.float32), sigmoid=True,
                     extra_outputs=["aux"], output_name="main")
    img = scene()
    by_default = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0)   # the first output: "aux"
    named = Segmenter(path, mean=(0, 0, 0), std=(1, 1, 1), input_size=0, output_name="main")
    assert by_default.output_name == "aux" and named.output_name == "main"
    assert not np.array_equal(by_default(img).mask, named(img).mask)
    red = np.zeros(img.shape[:2], bool)
    red[8:40, 10:50] = True
    np.testing.assert_array_equal(named(img).mask, red)
    with pytest.raises(ValueError, match="no output named 'nope'"):
        Segmenter(path, output_name="nope")


def test_zoo_lane_model_is_recognised_and_matches_a_direct_run():
    import onnxruntime as ort

    from dynnet_ros.zoo import ensure_model

    path = str(ensure_model("lane"))
    seg = Segmenter(path)
    assert seg.format_name == "zoo" and seg.output_name == "lane_prob"
    img = np.random.default_rng(0).integers(0, 256, (100, 150, 3), dtype=np.uint8)
    out = seg(img)
    tensor = np.zeros((1, 3, 128, 160), np.float32)
    tensor[0, :, :100, :150] = img.transpose(2, 0, 1) / np.float32(255.0)
    prob = ort.InferenceSession(path).run(["lane_prob"], {"image": tensor})[0][0, 0, :100, :150]
    np.testing.assert_allclose(out.probability, prob, atol=1e-4)
    np.testing.assert_array_equal(out.mask, prob >= 0.5)


def test_ambiguous_and_unfit_models(tmp_path):
    path = pixel_map(tmp_path / "seg.onnx", WEIGHTS, BIAS, metadata={"names": "['a', 'b']"})
    with pytest.raises(ValueError, match="no segmentation format fits"):
        Segmenter(path)   # 3 channels but 2 names
    with pytest.raises(ValueError, match="model_format 'binary' does not fit"):
        Segmenter(pixel_map(tmp_path / "seg3.onnx", WEIGHTS, BIAS), model_format="binary")
