"""`dynnet demo` end to end (short): the graph runs, the report is written from real diagnostics."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dynnet_ros.graph_config import default_config_path
from dynnet_ros.zoo import ensure_model

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.timeout(600), pytest.mark.graph]


def test_demo_writes_summary_and_plot(tmp_path):
    for task in ("lane", "pedestrian", "depth"):
        ensure_model(task)
    data = yaml.safe_load(default_config_path().read_text())
    for node in data["nodes"]:
        if node["name"] == "sensor_sim":  # smaller frames, quicker switches: the run is short
            node["parameters"].update(rate_hz=5.0, resolutions=["320x240", "640x480"], resolution_period_s=3.0)
    config = tmp_path / "graph.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    report = tmp_path / "report"
    out = subprocess.run([sys.executable, "-m", "dynnet_ros.cli", "demo", "--duration", "20", "--report", str(report),
                          "--config", str(config), "--namespace", f"/demotest_{os.getpid()}"],
                         capture_output=True, text=True, timeout=540, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((report / "summary.json").read_text())
    assert set(summary["models"]) == {"lane_node", "pedestrian_node", "depth_node"}
    for name, model in summary["models"].items():
        assert model["frames_processed"] > 0 and model["mean_hz"] > 0, (name, model)
        assert model["latency_p95_ms"] >= model["latency_p50_ms"] > 0
        assert model["input_shapes_seen"] and model["rss_mb_max"] > 50
    log = (report / "nodes.log").read_text()
    assert set(summary["exit_codes"].values()) == {0}, (summary["exit_codes"], log[-6000:])
    assert summary["memory_samples"] > 0
    assert (report / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the montage: outputs paired with the camera frames of their stamps
    assert (report / "montage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out.stdout[-2000:]
    # the lane node's lines, under its container's prefix (the model nodes share model_container)
    assert any(line.startswith("[model_container]") and "lane_node]" in line for line in log.splitlines()), log[-3000:]
    assert "Traceback" not in log
    assert "report:" in out.stdout and "lane_node" in out.stdout
