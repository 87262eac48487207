"""The planned backend's single session runs lean (runtime/ort_executor.py, OrtExecutor): no memory
patterns and arena blocks mapped afresh. Same kernels, same outputs; over a sequence of input
shapes it holds less than onnxruntime's defaults, each side measured in a fresh process."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dynnet_ros.commands.bench import make_feeds
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor, session_options
from dynnet_ros.zoo import resolve_model_spec

pytestmark = pytest.mark.graph

SIDES = (224, 640, 320, 512, 288, 416, 608, 256)  # a camera crop that changes size, as in the benchmark

#: one side's process: load the session, run the sizes once, report its peak over the baseline
_PEAK_SCRIPT = """
import json, sys
import numpy as np
from dynnet_ros.commands.bench import make_feeds
from dynnet_ros.engine.runtime.ort_executor import OrtExecutor
from dynnet_ros.engine.modelio.models import input_specs, load_model
from dynnet_ros.procmem import reset_peak_rss, status_bytes
path, lean, sides = sys.argv[1], sys.argv[2] == "lean", json.loads(sys.argv[3])
specs = input_specs(load_model(path, check=False, external_data=False))
rng = np.random.default_rng(0)
feeds = [make_feeds(specs, side, side, rng) for side in sides]
reset_peak_rss()
base = status_bytes("VmRSS")
executor = OrtExecutor(path, threads=2, lean=lean)
for feed in feeds + feeds:
    executor.run(feed)
print(json.dumps({"peak": status_bytes("VmHWM") - base}))
"""


def _peak(path: str, side: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, path, side, json.dumps(SIDES)],
                          capture_output=True, text=True, timeout=300, check=True)
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["peak"])


def test_lean_options_drop_memory_patterns_only():
    lean, default = session_options(2, lean=True), session_options(2)
    assert lean.enable_mem_pattern is False and default.enable_mem_pattern is True
    assert lean.intra_op_num_threads == default.intra_op_num_threads == 2
    assert lean.enable_cpu_mem_arena is True  # onnxruntime's arena still serves the tensors


def test_a_lean_session_gives_onnxruntimes_outputs_at_every_size():
    path = resolve_model_spec("zoo:pedestrian")
    specs = input_specs(load_model(path, check=False, external_data=False))
    lean, default = OrtExecutor(path, threads=2, lean=True), OrtExecutor(path, threads=2)
    assert lean.lean and not default.lean
    rng = np.random.default_rng(0)
    for side in SIDES[:4]:
        feeds = make_feeds(specs, side, side, rng)
        got, want = lean.run(feeds), default.run(feeds)
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def test_options_given_explicitly_are_not_made_lean():
    path = resolve_model_spec("zoo:pedestrian")
    executor = OrtExecutor(path, options=session_options(2), lean=True)
    assert executor.lean is False


@pytest.mark.parametrize("model", ["zoo:pedestrian", "zoo:multiexit"])
def test_a_lean_session_holds_less_than_onnxruntimes_defaults_over_changing_sizes(model):
    path = resolve_model_spec(model)
    lean, default = _peak(path, "lean"), _peak(path, "default")
    assert lean < default, f"lean {lean / 2**20:.1f} MB, onnxruntime's defaults {default / 2**20:.1f} MB"
