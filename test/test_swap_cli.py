"""`dynnet swap prepare|bench` end to end on a small model."""
from __future__ import annotations

import json

import pytest
from _swap_models import conv_chain

from dynnet_ros.cli import main


@pytest.fixture()
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path / "stores"))
    return conv_chain(tmp_path / "chain.onnx")


def test_prepare_writes_the_weight_file_and_rebuilds_a_damaged_one(model, tmp_path):
    assert main(["swap", "prepare", model, "--layout", "as-given", "--json", str(tmp_path / "t.json")]) == 0
    summary = json.loads((tmp_path / "t.json").read_text())
    assert summary["layout"] == "as-given" and summary["tensors"] >= 4 and summary["rebuilt"] is None
    weights = tmp_path / "stores" / "stream"
    (bin_path,) = weights.glob("*/weights.bin")
    bin_path.write_bytes(b"\0" * 10)  # damaged: the next prepare reports the reason and rebuilds
    assert main(["swap", "prepare", model, "--layout", "as-given", "--json", str(tmp_path / "t2.json")]) == 0
    assert "truncated" in json.loads((tmp_path / "t2.json").read_text())["rebuilt"]


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert main(["swap", "prepare", str(tmp_path / "missing.onnx")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["swap", "bench", str(tmp_path / "missing.onnx")]) == 2


def test_bench_reports_all_configurations(model, tmp_path):
    result_path, png = tmp_path / "bench.json", tmp_path / "bench.png"
    assert main(["swap", "bench", model, "--budgets", "25%", "--size", "64x64", "--iters", "2", "--threads", "1",
                 "--json", str(result_path), "--png", str(png)]) == 0
    result = json.loads(result_path.read_text())
    rows = {row["config"]: row for row in result["summary"]}
    assert {"ort", "inmemory", "swap@25%", "naive@25%"} <= set(rows)
    swap = rows["swap@25%"]
    assert "error" not in swap, swap
    assert swap["max_abs_diff"] < 1e-4 and swap["peak_mb"] > 0 and swap["mean_ms"] > 0
    assert swap["store_cached_mb"] <= result["weight_mb"]
    assert "ab_ratio_mean" in swap and "switch_p95_ms" in swap
    assert swap["ab_inmemory_ratio_mean"] > 0 and swap["ab_inmemory_cpu_ratio"] > 0
    assert png.stat().st_size > 1000
