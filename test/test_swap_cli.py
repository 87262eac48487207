"""`dynnet swap prepare|profile|bench` end to end on a small model."""
from __future__ import annotations

import json

import pytest

from _swap_models import conv_chain
from dynnet_ros.cli import main
from dynnet_ros.swap.delay_model import DelayModel


@pytest.fixture()
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNNET_SWAP_DIR", str(tmp_path / "stores"))
    monkeypatch.setenv("DYNNET_SWAP_PROFILE", str(tmp_path / "no-profile.yaml"))
    return conv_chain(tmp_path / "chain.onnx")


def test_prepare_writes_store_and_block_table(model, tmp_path):
    out = tmp_path / "store"
    assert main(["swap", "prepare", model, "--out", str(out), "--max-atoms", "3", "--json", str(tmp_path / "t.json")]) == 0
    table = json.loads((tmp_path / "t.json").read_text())
    assert table["store"] == str(out) and len(table["atoms"]) >= 2
    assert all(row["flops"] > 0 for row in table["atoms"])
    assert (out / "index.json").is_file() and (out / "weights.bin").is_file()
    # Corrupt it: the next prepare reports the reason and rebuilds.
    (out / "weights.bin").write_bytes(b"\0" * 10)
    assert main(["swap", "prepare", model, "--out", str(out), "--json", str(tmp_path / "t2.json")]) == 0
    assert "truncated" in json.loads((tmp_path / "t2.json").read_text())["rebuilt"]


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    assert main(["swap", "prepare", str(tmp_path / "missing.onnx")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["swap", "bench", str(tmp_path / "missing.onnx")]) == 2


def test_profile_fits_and_writes_yaml(model, tmp_path):
    out = tmp_path / "profile.yaml"
    assert main(["swap", "profile", model, "--sizes", "32x32,64x64", "--repeats", "1", "--out", str(out),
                 "--json", str(tmp_path / "p.json")]) == 0
    profile = DelayModel.load(out)
    assert set(profile.r2) == {"t_in", "t_ex", "t_out"} and profile.samples >= 3
    assert json.loads((tmp_path / "p.json").read_text())["samples"]


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
