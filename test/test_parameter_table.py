"""docs/ros.md's parameter tables are the nodes' declarations, printed by dynnet_ros.nodes.parameter_table."""
from __future__ import annotations

import re
from pathlib import Path

from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.nodes.parameter_table import (
    MODEL_NODES,
    ORDER,
    TABLES,
    main,
    markdown_tables,
    range_text,
    row,
    shared_model_rows,
    value_text,
)

ROOT = Path(__file__).resolve().parents[1]
ROS_MD = ROOT / "docs" / "ros.md"


def test_ros_md_holds_the_generated_tables():
    assert markdown_tables() in ROS_MD.read_text(), (
        "docs/ros.md's parameter tables differ from the nodes' declarations: replace them with the output "
        "of `python -m dynnet_ros.nodes.parameter_table`")


def test_every_declared_parameter_has_a_row_and_no_row_is_undeclared():
    tables = markdown_tables()
    documented: dict[str, set[str]] = {}
    for section in tables.split("### ")[1:]:
        heading, _, body = section.partition("\n")
        documented[heading] = set(re.findall(r"^\| `([a-z_]+)` \|", body, flags=re.M))
    shared = documented.pop(next(h for h in documented if h.startswith("Every model node")))
    assert set(documented) == set(ORDER)
    for name in ORDER:
        rows = documented[name] | (shared if name in MODEL_NODES else set())
        assert rows == {spec.name for spec in TABLES[name]}, name


def test_rows_show_type_default_range_and_read_only():
    spec = ParamSpec("side", 640, "Square side.", low=-1, high=8192, read_only=True)
    assert row(spec) == "| `side` | int | `640` | -1..8192 | yes | Square side. |"
    double = ParamSpec("rate", 2.0, "Rate | in Hz.", low=0.5, high=1e6)
    assert row(double) == "| `rate` | double | `2.0` | 0.5..1e+06 |  | Rate \\| in Hz. |"
    assert range_text(ParamSpec("enc", "rgb8", "Encoding.", choices=("rgb8", "bgr8"))) == "`rgb8`, `bgr8`"
    assert value_text(["a", ""]) == '["a", ""]'
    assert value_text([0.0, -1.5707963267948966]) == "[0.0, -1.5708]"
    assert value_text(False) == "false"


def test_shared_rows_are_those_every_model_node_declares_alike():
    shared = shared_model_rows()
    for name in MODEL_NODES:
        own = [row(spec) for spec in TABLES[name]]
        assert all(line in own for line in shared)
    # model_path names each task's zoo model, so it is per node, not shared
    assert not any(line.startswith("| `model_path` |") for line in shared)
    assert any(line.startswith("| `memory_budget_mb` |") for line in shared)


def test_main_prints_the_tables(capsys):
    main()
    assert capsys.readouterr().out == markdown_tables()


def test_readme_names_only_declared_parameters():
    """The README's short parameter table names parameters the nodes it lists declare."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Main parameters", 1)[1].split("\n## ", 1)[0]
    node = ""
    checked = 0
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) < 2 or cells[1] == "parameter":
            continue
        node = cells[0] or node
        nodes = MODEL_NODES if node == "model nodes" else (node,)
        for name in re.findall(r"`([a-z_]+)`", cells[1]):
            for each in nodes:
                assert name in {spec.name for spec in TABLES[each]}, f"README: {each} declares no {name}"
                checked += 1
    assert checked >= 10
