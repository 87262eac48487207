"""Every module imports as the first import of its package: no import cycle hides behind import order."""
from __future__ import annotations

from pathlib import Path

import pytest
from _first_import import first_import_failures, package_modules, top_level_third_party

pytestmark = pytest.mark.slow

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dynnet_ros"


def test_every_module_imports_as_the_first_import():
    modules = package_modules(PACKAGE_DIR)
    assert len(modules) > 200  # the walk really found the package
    failures = first_import_failures("dynnet_ros", modules, top_level_third_party(PACKAGE_DIR))
    assert failures == {}, "\n\n".join(f"import {name} first:\n{trace}" for name, trace in failures.items())


def test_a_cycle_behind_import_order_is_found(tmp_path):
    # a package re-exports a facade whose policy imports a lower module through that package:
    # importing the package first works, importing the policy first does not
    package = tmp_path / "cyc"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("from cyc.core.facade import Facade\n")
    (package / "core" / "facade.py").write_text("from cyc.policy import Policy\nclass Facade(Policy): pass\n")
    (package / "core" / "low.py").write_text("import json\nLOW = 1\n")
    (package / "policy.py").write_text("from cyc.core.low import LOW\nclass Policy: pass\n")
    modules = package_modules(package)
    assert top_level_third_party(package) == ["json"]
    failures = first_import_failures("cyc", modules, ["json"], cwd=tmp_path)
    assert set(failures) == {"cyc.policy"}
    assert "partially initialized module" in failures["cyc.policy"]
