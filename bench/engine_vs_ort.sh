#!/usr/bin/env bash
# Planned engine vs plain onnxruntime on every zoo model and every installed corpus model
# (test/_corpus.py), each side in a fresh process, min of 2 repeats (docs/engine.md "Benchmark").
# Usage: bench/engine_vs_ort.sh [OUTDIR] [--models a,b] [--threads N] [--samples N] [--repeats N]
# Writes OUTDIR/engine_vs_ort.json (with the machine's load and versions) and OUTDIR/engine_vs_ort.md.
set -euo pipefail
out=${1:-bench-results/engine}
shift || true
"${PYTHON:-.venv/bin/python}" bench/engine_vs_ort.py "$out" "$@"
