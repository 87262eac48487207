#!/usr/bin/env bash
# Planned engine vs plain onnxruntime on every zoo model, each side in a fresh process
# (docs/engine.md "Benchmark"). Usage: bench/engine_vs_ort.sh [OUTDIR] [extra `dynnet bench` args]
set -euo pipefail
out=${1:-bench-results/engine}
shift || true
mkdir -p "$out"
for model in lane pedestrian depth gated multiexit; do
  "${PYTHON:-.venv/bin/python}" -m dynnet_ros.cli bench "zoo:$model" --repeats 2 --json "$out/$model.json" --plot "$out/$model.png" "$@" | tee "$out/$model.txt"
done
