"""Parts of the platform subset (`make test-subset`, which `.ci/run` runs on Python 3.10 and 3.12
and on the oldest onnxruntime): the whole package imports on this interpreter, and a sample of
ONNX's operator suite gets the same RDP verdicts as in the full run. The other members carry
the ``subset`` marker in their own files (zoo engine vs onnxruntime, one ROS graph test,
test_ort_features.py, test_platform.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest
from test_rdp_conformance import _cases, _tensor_only, judge

pytestmark = [pytest.mark.subset, pytest.mark.graph]

#: every this-many-th tensor-only case of onnx's node tests (~150 of ~1,860, all op families)
SAMPLE_EVERY = 12

IMPORT_ALL = """
import importlib, pkgutil, dynnet_ros
names = sorted(m.name for m in pkgutil.walk_packages(dynnet_ros.__path__, "dynnet_ros."))
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_imports_in_a_fresh_interpreter():
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 100


def test_rdp_conformance_sample_has_no_wrong_shape_and_no_crash():
    cases = [case for case in _cases() if _tensor_only(case)][::SAMPLE_EVERY]
    verdicts = {case.name: judge(case) for case in cases}
    bad = {name: verdict for name, verdict in verdicts.items() if verdict[0] in ("wrong", "crash")}
    assert len(cases) >= 100 and not bad, bad
    exact = sum(1 for status, _ in verdicts.values() if status == "exact")
    assert exact / len(cases) >= 0.95, f"{exact} of {len(cases)} exact"
