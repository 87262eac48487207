"""`dynnet infer` end to end on real photographs and models, and its one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from _corpus import by_name, package_dir
from matplotlib import image as mpimg

from dynnet_ros import cli
from dynnet_ros.commands.infer import read_rgb

DETECTOR = by_name("yolov8n-detector")
TEXT = by_name("ppocr-text-detector")
SKIMAGE = package_dir("skimage")
needs_photo = pytest.mark.skipif(SKIMAGE is None, reason="scikit-image is not installed (real-model corpus)")


def photo(name: str) -> Path:
    assert SKIMAGE is not None
    return SKIMAGE / "data" / name


def one_error(capsys, argv: list[str], expected: str) -> None:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, (code, out, err)
    assert lines[0].startswith("dynnet infer: error: ") and expected in lines[0], lines[0]


@needs_photo
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_detector_on_real_photos_writes_pngs_and_json(tmp_path, capsys):
    out = tmp_path / "out"
    report = tmp_path / "report.json"
    code = cli.main(["infer", str(DETECTOR.path()), str(photo("astronaut.png")), str(photo("coffee.png")),
                     "--out", str(out), "--json", str(report), "--repeat", "2"])
    assert code == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert data["task"] == "detect" and data["format"] == "yolov8" and "auto chose yolov8" in data["format_reason"]
    first, second = data["images"]
    assert (first["width"], first["height"]) == (512, 512) and (second["width"], second["height"]) == (600, 400)
    faces = [d for d in first["detections"] if d["class_name"] == "FACE_FEMALE"]
    assert faces and faces[0]["score"] > 0.5
    x1, y1, x2, y2 = faces[0]["box_xyxy"]
    assert 150 < x1 < x2 < 300 and 60 < y1 < y2 < 200   # the astronaut's face
    assert first["latency_ms"] > 0 and first["first_run_ms"] > 0
    for entry in data["images"]:
        png = mpimg.imread(entry["annotated"])
        assert png.shape[:2] == (entry["height"], entry["width"])
    # the box is drawn: the annotated picture differs from the photo along the box's edge
    drawn = read_rgb(Path(first["annotated"]))
    original = read_rgb(photo("astronaut.png"))
    edge = (slice(int(y1) + 5, int(y2) - 5), int(round(x1)))
    assert np.abs(drawn[edge].astype(int) - original[edge].astype(int)).mean() > 40


@needs_photo
@pytest.mark.skipif(not TEXT.available(), reason=TEXT.skip_reason)
def test_segmenter_task_must_be_named_when_several_fit(tmp_path, capsys):
    model, page = str(TEXT.path()), str(photo("page.png"))
    one_error(capsys, ["infer", model, page, "--out", str(tmp_path)], "fits several tasks: segment (binary); "
              "depth (metric, relative); give --task")
    code = cli.main(["infer", model, page, "--task", "segment", "--out", str(tmp_path), "--mean", "0.5,0.5,0.5",
                     "--std", "0.5,0.5,0.5", "--channel-order", "BGR"])
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["format"] == "binary" and "BGR" in data["preprocess"]
    assert 0.02 < data["images"][0]["segmentation"]["mask_fraction"] < 0.6
    assert Path(data["images"][0]["annotated"]).is_file()


def test_zoo_models_through_every_task(tmp_path, capsys):
    img = np.full((120, 160, 3), 90, np.uint8)
    img[30:90, 70:85] = (240, 30, 30)
    path = tmp_path / "frame.png"
    mpimg.imsave(path, img)
    for spec, task in (("zoo:pedestrian", "detect"), ("zoo:lane", "segment"), ("zoo:depth", "depth")):
        out = tmp_path / task
        code = cli.main(["infer", spec, str(path), "--out", str(out)] + (["--task", task] if task != "detect" else []))
        assert code == 0, capsys.readouterr().err
        data = json.loads((out / "results.json").read_text())
        assert data["task"] == task and data["format"] == "zoo"
        key = {"detect": "detections", "segment": "segmentation", "depth": "depth"}[task]
        assert key in data["images"][0]
        assert mpimg.imread(data["images"][0]["annotated"]).shape[0] == 120


@needs_photo
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_one_line_errors(tmp_path, capsys):
    model, image = str(DETECTOR.path()), str(photo("astronaut.png"))
    one_error(capsys, ["infer", model, image, "--task", "detect", "--model-format", "yolo-end2end",
                       "--out", str(tmp_path)], "model_format 'yolo-end2end' does not fit")
    one_error(capsys, ["infer", model, image, "--classes", "UNICORN", "--out", str(tmp_path)],
              "unknown class name 'UNICORN'")
    one_error(capsys, ["infer", model, image, "--task", "depth", "--classes", "FACE_FEMALE", "--out",
                       str(tmp_path)], "--classes and --labels-file apply to detect and segment")
    not_image = tmp_path / "notes.png"
    not_image.write_text("hello\n")
    one_error(capsys, ["infer", model, str(not_image), "--out", str(tmp_path)], "not a readable image")


@needs_photo
@pytest.mark.skipif(not DETECTOR.available(), reason=DETECTOR.skip_reason)
def test_infer_takes_the_pedestrian_nodes_parameters_and_prints_a_line_per_image(tmp_path, capsys):
    from dynnet_ros.nodes import pedestrian_node

    model, images = str(DETECTOR.path()), [str(photo("astronaut.png")), str(photo("coffee.png"))]
    assert cli.main(["infer", model, *images, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 3 and out[0].startswith("astronaut.png 512x512: 1 detection: FACE_FEMALE 0.")
    assert out[1].startswith("coffee.png 600x400: ") and "results.json" in out[2]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["node"] == "pedestrian_node"
    assert data["parameters"] == {**{spec.name: spec.default for spec in pedestrian_node.PARAMETERS},
                                  "model_path": model}
    assert data["score_threshold"] == 0.3 and "fit into 320x320" in data["preprocess"]   # the export's imgsz

    # a graph config's pedestrian_node parameters apply, the flags over them
    config = tmp_path / "vehicle.yaml"
    config.write_text(yaml.safe_dump({"nodes": [{"name": "pedestrian_node", "executable": "pedestrian_node",
                                                 "parameters": {"max_input_side": 640, "score_threshold": 0.5,
                                                                "model_path": ""}}]}))
    assert cli.main(["infer", model, images[0], "--out", str(tmp_path), "--config", str(config),
                     "--score-threshold", "0.6", "--param", "max_detections=3"]) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / "results.json").read_text())
    assert (data["score_threshold"], data["max_detections"]) == (0.6, 3)
    assert data["format"] == "yolov8" and data["parameters"]["model_path"] == model   # MODEL, not the config's
    assert "fit into 640x640" in data["preprocess"]

    one_error(capsys, ["infer", model, images[0], "--out", str(tmp_path), "--score-threshold", "2"],
              "--score-threshold: score_threshold must be in [0.0, 1.0], got 2.0")
    one_error(capsys, ["infer", model, images[0], "--out", str(tmp_path), "--param", "lane_threshold=0.4"],
              "--param lane_threshold: pedestrian_node declares no such parameter")
    one_error(capsys, ["infer", model, images[0], "--out", str(tmp_path), "--param", "model_path=x.onnx"],
              "the model is the MODEL argument")
    one_error(capsys, ["infer", model, images[0], "--out", str(tmp_path), "--output-name", "x"],
              "--output-name does not apply to detect")
