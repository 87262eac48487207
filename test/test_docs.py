"""The examples in README.md and docs/*.md that are marked runnable run, as written.

Marker: an HTML comment ``<!-- runnable -->`` on the line right before a ```` ```bash ```` or
```` ```python ```` fence. Each marked block runs in a temporary directory with this
interpreter's ``bin/`` (``python``, ``dynnet``) first on PATH and the caches in one temporary
directory shared by the blocks (empty at the start, so first-use builds are exercised too);
bash blocks run with ``set -euo pipefail``. Unmarked blocks are left alone.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.graph

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced example: where it is, its language, its text."""

    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    runnable: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with whether the line before it is the marker."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{path}:{i + 1}: unclosed fence"
        runnable = i > 0 and lines[i - 1].strip() == MARKER
        blocks.append(Block(path, i + 1, match.group(1), "\n".join(lines[i + 1:end]) + "\n", runnable))
        i = end + 1
    return blocks


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BLOCKS = [block for path in DOCS for block in fenced_blocks(path)]
RUNNABLE = [block for block in BLOCKS if block.runnable]


def test_markers_sit_on_bash_or_python_fences():
    for path in DOCS:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            if line.strip() == MARKER:
                following = lines[number] if number < len(lines) else ""
                assert re.match(r"^```(bash|python)\s*$", following), \
                    f"{path.relative_to(REPO)}:{number}: the marker must be followed by a ```bash or ```python fence"
    assert {b.language for b in RUNNABLE} == {"bash", "python"}
    assert {b.path.name for b in RUNNABLE} >= {"README.md", "rdp.md", "planner.md", "zoo.md"}


@pytest.fixture(scope="module")
def doc_env(tmp_path_factory) -> dict[str, str]:
    cache = tmp_path_factory.mktemp("doc-cache")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for name in ("DYNNET_ZOO_DIR", "DYNNET_LAYOUT_DIR", "DYNNET_SWAP_DIR", "DYNNET_TRT_CACHE"):
        env[name] = str(cache / name.lower())
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_runnable_example(block: Block, doc_env, tmp_path):
    if block.language == "python":
        script = tmp_path / "example.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        script = tmp_path / "example.sh"
        script.write_text("set -euo pipefail\n" + block.code)
        command = ["bash", str(script)]
    proc = subprocess.run(command, cwd=tmp_path, env=doc_env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, \
        f"{block.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


QOS_KEY = re.compile(r"qos_overrides\.(/[\w/]+)\.(subscription|publisher)\.(\w+): (\w+)")


def test_qos_override_keys_the_docs_quote_pass_the_preflight():
    """A QoS override written as README.md and docs/ros.md quote it is one `dynnet up` accepts on
    the node kind that has such an entity (model nodes subscribe, sensor_sim publishes)."""
    import yaml

    from dynnet_ros.graph_config import default_config_path, parse_graph
    from dynnet_ros.nodes.parameter_check import parameter_problems

    quoted = [match for path in (REPO / "README.md", REPO / "docs" / "ros.md")
              for match in QOS_KEY.finditer(path.read_text())]
    assert quoted, "the docs quote no QoS override"
    for match in quoted:
        topic, entity, policy, value = match.groups()
        data = yaml.safe_load(default_config_path().read_text())
        node = next(n for n in data["nodes"]
                    if n["name"] == ("sensor_sim" if entity == "publisher" else "lane_node"))
        node.setdefault("parameters", {})[f"qos_overrides.{topic}.{entity}.{policy}"] = value
        assert parameter_problems(parse_graph(data, "docs.yaml")) == [], match.group(0)
