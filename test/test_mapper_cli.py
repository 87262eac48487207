"""`dynnet map stages` and `dynnet map run` end to end (their bad input is in test_cli_errors.py)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import yaml

from dynnet_ros import cli
from dynnet_ros.mapper.stages import StageSet


def test_map_stages_writes_the_stage_models_and_the_summary(tmp_path, capsys):
    out = tmp_path / "stages"
    assert cli.main(["map", "stages", "zoo:multiexit", "--out", str(out), "--json", str(tmp_path / "s.json")]) == 0
    assert "3 depth-wise stages" in capsys.readouterr().out
    summary = json.loads((tmp_path / "s.json").read_text())
    assert [s["exit"]["outputs"] for s in summary["stages"]] == [["exit0"], ["exit1"], ["exit2"]]
    for k in range(3):
        onnx.checker.check_model(str(out / f"stage_{k}.onnx"))
    assert len(StageSet.load(out).stages) == 3


def test_map_stages_width_split_reports_its_agreement(tmp_path, capsys):
    partition = tmp_path / "w.yaml"
    partition.write_text(yaml.safe_dump({"width": {"stages": 2, "P": [0.5, 0.5], "I": [0, 0]}}))
    assert cli.main(["map", "stages", "zoo:multiexit", "--partition", str(partition), "--out", str(tmp_path / "w"),
                     "--calibration", "4", "--size", "64x64", "--json", str(tmp_path / "w.json")]) == 0
    summary = json.loads((tmp_path / "w.json").read_text())
    assert summary["kind"] == "width" and summary["agreement"]["frames"] == 4
    assert "argmax agreement" in capsys.readouterr().out


def test_map_run_prints_exits_and_stage_times(tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text(yaml.safe_dump({"hardware": "this-machine:1",
                                       "stages": [{"unit": "cpu0", "threshold": 0.0}, {"unit": "cpu0"}]}))
    frame = tmp_path / "f.npz"
    rng = np.random.default_rng(0)
    np.savez(frame, image=rng.random((1, 3, 64, 96), dtype=np.float32),
             lidar_depth=np.zeros((1, 1, 64, 96), np.float32))
    assert cli.main(["map", "run", "zoo:depth", "--mapping", str(mapping), "--inputs", str(frame), str(frame),
                     "--json", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["summary"]["frames"] == 2
    assert all(row["exit"] == 0 and row["early"] and row["skipped"] == [1] for row in result["frames"])
    assert "mean" in capsys.readouterr().out


def test_map_run_says_no_exit_where_an_exit_has_no_confidence(tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text(yaml.safe_dump({"hardware": "this-machine:1", "partition": {"exits": ["relu_4", "lane_prob"]},
                                       "stages": ["cpu0", "cpu0"]}))
    assert cli.main(["map", "run", "zoo:lane", "--mapping", str(mapping), "--frames", "2", "--size", "64x64",
                     "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "no exit" in out and "inf" not in out
    result = json.loads((tmp_path / "r.json").read_text())
    assert all(row["confidence"] is None for row in result["frames"])
    assert "one stage is faster" in result["summary"]["advice"]     # the cut has no exit that can answer
