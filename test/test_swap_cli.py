"""`dynnet swap prepare|bench` end to end on a small model."""
from __future__ import annotations

import json

import pytest
from _swap_models import conv_chain

from dynnet_ros.cli import main
from dynnet_ros.commands.swap_bench import OVER_LIMIT, sweep_sizes

pytestmark = pytest.mark.slow


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
    # an absolute budget: this tiny model's weights are a sliver of its footprint, so a P% budget
    # off the in-memory planned engine's peak can fall below the streamed engine's minimum
    assert main(["swap", "bench", model, "--budgets", "40MB", "--size", "64x64", "--iters", "2", "--threads", "1",
                 "--json", str(result_path), "--png", str(png)]) == 0
    result = json.loads(result_path.read_text())
    rows = {row["config"]: row for row in result["summary"]}
    assert {"ort", "inmemory", "swap@40MB", "naive@40MB"} <= set(rows)
    swap = rows["swap@40MB"]
    assert "error" not in swap, swap
    assert swap["max_abs_diff"] < 1e-4 and swap["peak_mb"] > 0 and swap["mean_ms"] > 0
    assert swap["store_cached_mb"] <= result["weight_mb"]
    assert "ab_ratio_mean" in swap and "switch_p95_ms" in swap
    assert swap["ab_inmemory_ratio_mean"] > 0 and swap["ab_inmemory_cpu_ratio"] > 0
    assert png.stat().st_size > 1000


def test_sweep_sizes_are_every_padded_input_the_nodes_feed():
    # 320x240 -> 256x320; 640x480 ... 1600x1200 -> 480x640; 1280x720, 1920x1080 -> 384x640; 1280x800 -> 416x640;
    # 1280x1024 -> 512x640 (max_input_side 640, multiples of 32)
    assert sweep_sizes() == [(256, 320), (384, 640), (416, 640), (480, 640), (512, 640)]
    assert sweep_sizes([(1920, 1080)], max_side=0) == [(1088, 1920)]


def test_size_sweep_reports_peak_over_budget_per_size_and_flags_rows_above_the_limit(model, tmp_path, capsys):
    result_path = tmp_path / "sweep.json"
    assert main(["swap", "bench", model, "--budgets", "40MB,1MB", "--sizes", "64x64,96x128", "--iters", "2",
                 "--threads", "1", "--json", str(result_path)]) == 0
    result = json.loads(result_path.read_text())
    assert [tuple(s) for s in result["sizes"]] == [(64, 64), (96, 128)]
    rows = {(tuple(r["size"]), r["config"]): r for r in result["rows"]}
    assert set(rows) == {(s, c) for s in [(64, 64), (96, 128)] for c in ("inmemory", "swap@40MB", "swap@1MB")}
    for size in [(64, 64), (96, 128)]:
        served = rows[(size, "swap@40MB")]
        assert "error" not in served, served
        assert served["over"] == (served["peak_over_budget"] > OVER_LIMIT) and served["peak_mb"] > 0
        assert "below this model's minimum" in rows[(size, "swap@1MB")]["error"]  # refused, minimum stated
    assert result["refused"] == 2 and result["over"] == sum(1 for r in result["rows"] if r.get("over"))
    out = capsys.readouterr().out
    assert "above 1.05 x budget" in out and "2 refused" in out
