"""dynnet_ros.settings: typed parsing of every DYNNET_* variable, the README's table of them, and
that no other module reads one from the environment."""
from __future__ import annotations

import ast
import re
import socket
from pathlib import Path

import pytest

from dynnet_ros import settings as settings_module
from dynnet_ros.engine.backends.trt_config import PRECISIONS, TrtOptions
from dynnet_ros.engine.plan.options import PROFILES
from dynnet_ros.settings import (
    PLAN_PROFILES,
    TRT_PRECISIONS,
    VARIABLES,
    _machine_host_id,
    load_settings,
    markdown_table,
    settings,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dynnet_ros"
#: Modules that still read DYNNET_* variables themselves, to be converted or deleted; the test
#: fails once a listed module no longer does, so this list only shrinks.
PENDING_ENV_READERS: frozenset[str] = frozenset()


class _Recorder(dict):
    """An env mapping that remembers which names were asked for."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        super().__init__(values or {})
        self.asked: set[str] = set()

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)


def test_defaults_without_any_variable():
    s = load_settings({})
    home = Path.home() / ".cache" / "dynnet_ros"
    assert (s.cache.zoo_dir, s.cache.layout_dir, s.cache.swap_dir) == (home / "zoo", home / "layout", home / "swap")
    assert s.planner.profile == "auto"
    trt = s.tensorrt
    assert (trt.precision, trt.dla_core, trt.gpu_fallback, trt.shapes) == ("fp32", None, True, None)
    assert trt.max_profiles == 4
    assert (trt.budget_mb, trt.workspace_mb, trt.cache_dir, trt.rebuild_on_miss, trt.device) == \
        (None, None, home / "trt", True, 0)


def test_good_values_are_parsed_to_their_types(tmp_path):
    s = load_settings({
        "DYNNET_ZOO_DIR": str(tmp_path / "z"), "DYNNET_LAYOUT_DIR": "~/lay", "DYNNET_SWAP_DIR": f" {tmp_path} ",
        "DYNNET_PLAN_PROFILE": "Balanced",
        "DYNNET_TRT_PRECISION": "FP16", "DYNNET_TRT_DLA_CORE": "1", "DYNNET_TRT_GPU_FALLBACK": "no",
        "DYNNET_TRT_SHAPES": "H=480,W=640", "DYNNET_TRT_MAX_PROFILES": "6", "DYNNET_TRT_BUDGET_MB": "300.5",
        "DYNNET_TRT_WORKSPACE_MB": "64", "DYNNET_TRT_CACHE": str(tmp_path / "trt"), "DYNNET_TRT_REBUILD": "0",
        "DYNNET_TRT_DEVICE": "2",
    })
    assert s.cache.zoo_dir == tmp_path / "z" and s.cache.swap_dir == tmp_path
    assert s.cache.layout_dir == Path.home() / "lay"
    assert s.planner.profile == "balanced"
    trt = s.tensorrt
    assert (trt.precision, trt.dla_core, trt.gpu_fallback, trt.shapes) == ("fp16", 1, False, "H=480,W=640")
    assert (trt.max_profiles, trt.budget_mb, trt.workspace_mb) == (6, 300.5, 64.0)
    assert (trt.cache_dir, trt.rebuild_on_miss, trt.device) == (tmp_path / "trt", False, 2)


def test_host_id_is_this_machine_unless_set(tmp_path):
    default = load_settings({}).host_id
    assert default.split("/")[0] == socket.gethostname()
    assert load_settings({"DYNNET_HOST_ID": " robot-b "}).host_id == "robot-b"
    machine_id = tmp_path / "machine-id"
    machine_id.write_text("0123456789abcdef0123456789abcdef\n")
    assert _machine_host_id(machine_id) == f"{socket.gethostname()}/0123456789ab"
    assert _machine_host_id(tmp_path / "absent") == socket.gethostname()


@pytest.mark.parametrize("value", ["", "  ", "none", "-1"])
def test_dla_core_unset_spellings(value):
    assert load_settings({"DYNNET_TRT_DLA_CORE": value}).tensorrt.dla_core is None


@pytest.mark.parametrize("name, value", [
    ("DYNNET_PLAN_PROFILE", "fastest"), ("DYNNET_TRT_PRECISION", "fp8"), ("DYNNET_TRT_DLA_CORE", "x"),
    ("DYNNET_TRT_GPU_FALLBACK", "maybe"), ("DYNNET_TRT_REBUILD", "2"), ("DYNNET_TRT_MAX_PROFILES", "4.5"),
    ("DYNNET_TRT_BUDGET_MB", "lots"), ("DYNNET_TRT_WORKSPACE_MB", "inf"), ("DYNNET_TRT_DEVICE", "gpu0"),
])
def test_bad_values_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        load_settings({name: value})


def test_parser_reads_exactly_the_documented_variables():
    env = _Recorder()
    load_settings(env)
    assert env.asked == {v.name for v in VARIABLES}
    assert len({v.name for v in VARIABLES}) == len(VARIABLES)


def test_choices_match_the_modules_that_use_them():
    assert set(PLAN_PROFILES) == set(PROFILES)
    assert set(TRT_PRECISIONS) == set(PRECISIONS)


def test_accessor_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNNET_ZOO_DIR", str(tmp_path / "a"))
    first = settings()
    assert first.cache.zoo_dir == tmp_path / "a" and settings() is first  # parsed once
    monkeypatch.setenv("DYNNET_ZOO_DIR", str(tmp_path / "b"))
    assert settings().cache.zoo_dir == tmp_path / "b"
    monkeypatch.setenv("DYNNET_TRT_DEVICE", "x")
    with pytest.raises(ValueError, match="DYNNET_TRT_DEVICE"):
        settings()


def test_trt_options_come_from_the_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNNET_TRT_CACHE", str(tmp_path))
    monkeypatch.setenv("DYNNET_TRT_PRECISION", "tf32")
    opts = TrtOptions.from_env()
    assert (opts.cache_dir, opts.precision) == (tmp_path, "tf32")
    assert TrtOptions().cache_dir == tmp_path


def test_readme_table_is_the_settings_table():
    readme = (ROOT / "README.md").read_text()
    table = markdown_table()
    assert table in readme
    documented = set(re.findall(r"^\| `(DYNNET_[A-Z0-9_]+)` \|", readme, flags=re.M))
    assert documented == {v.name for v in VARIABLES}


def _env_reads(tree: ast.AST) -> set[str]:
    """DYNNET_* names used as a key: ``x.get("DYNNET_…")``, ``x["DYNNET_…"]``, ``getenv("DYNNET_…")``,
    ``"DYNNET_…" in x`` — every way of reading a variable out of a mapping."""
    def name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("DYNNET_"):
            return node.value
        return None

    found: set[str] = set()
    for node in ast.walk(tree):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Call) and node.args:
            keys.append(node.args[0])
        elif isinstance(node, ast.Subscript):
            keys.append(node.slice)
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            keys.append(node.left)
        found |= {n for n in map(name, keys) if n}
    return found


def test_only_settings_reads_dynnet_variables():
    readers: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path == Path(settings_module.__file__).resolve():
            continue
        names = _env_reads(ast.parse(path.read_text(), filename=rel))
        if names:
            readers[rel] = names
    assert set(readers) - PENDING_ENV_READERS == set(), readers
    stale = {p for p in PENDING_ENV_READERS if (ROOT / p).exists() and p not in readers}
    assert not stale, f"no longer read the environment: remove from PENDING_ENV_READERS: {stale}"


def test_variables_named_in_the_package_exist():
    """Messages such as "set DYNNET_TRT_PRECISION=fp16" must name a real variable."""
    known = {v.name for v in VARIABLES}
    unknown: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in PENDING_ENV_READERS or path == Path(settings_module.__file__).resolve():
            continue
        tokens = re.findall(r"DYNNET_[A-Z0-9_]*\*?", path.read_text())  # "DYNNET_TRT_*" names a family
        names = {t for t in tokens if not t.endswith("*")} - known
        if names:
            unknown[rel] = names
    assert not unknown
