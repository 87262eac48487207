"""The node parameter tables of docs/ros.md, printed from the nodes' own declarations.

Why: each node declares its parameters once, as `ParamSpec`s (name, type, default, range,
read-only, description: what ``ros2 param describe`` shows and what ``dynnet up`` checks a graph
config against). Printing the docs' tables from the same list means a parameter added, renamed or
given another default cannot leave the docs behind: ``python -m dynnet_ros.nodes.parameter_table``
prints the markdown, and test/test_parameter_table.py keeps docs/ros.md equal to it.

The three model nodes share most parameters; a row that reads the same on all three is printed
once, under "Every model node", and each model node's table holds only the rest. A parameter
declared once per camera of a node's ``cameras`` is printed as ``<camera>.<parameter>``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from dynnet_ros.nodes import foxglove_view
from dynnet_ros.nodes.base import ParamSpec
from dynnet_ros.nodes.parameter_check import DECLARED, PER_CAMERA

MODEL_NODES = ("lane_node", "pedestrian_node", "depth_node")
#: every node with parameters, in the order the docs list them
TABLES: dict[str, list[ParamSpec]] = {**DECLARED, "foxglove_view": foxglove_view.PARAMETERS}
ORDER = (*MODEL_NODES, "sensor_sim", "budget_manager", "foxglove_view")

_HEADER = "| parameter | type | default | range | read-only | description |\n|---|---|---|---|---|---|"
_TYPE_NAMES = {bool: "bool", int: "int", float: "double", str: "string",
               "double_array": "double[]", "string_array": "string[]"}


def type_name(spec: ParamSpec) -> str:
    """The ROS parameter type, as ``ros2 param describe`` names it in short."""
    return _TYPE_NAMES[spec.type_key]


def number_text(value: float) -> str:
    """A double as a parameter file must write it: with a decimal point (rclpy refuses ``2`` for a
    double), six significant digits at most."""
    text = f"{value:.6g}"
    return text if any(c in text for c in ".en") else f"{text}.0"


def value_text(value: Any) -> str:
    """A default as a parameter file would write it: strings quoted, doubles with a decimal point."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return number_text(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return str(value)


def range_text(spec: ParamSpec) -> str:
    """The declared constraints: numeric bounds and choices (a spec's own ``check`` is prose in
    its description)."""
    parts = []
    if spec.low is not None or spec.high is not None:
        low = _bound_text(spec, spec.low) if spec.low is not None else ""
        high = _bound_text(spec, spec.high) if spec.high is not None else ""
        parts.append(f"{low}..{high}")
    if spec.choices:
        parts.append(", ".join(f"`{choice}`" for choice in spec.choices))
    return "; ".join(parts)


def _bound_text(spec: ParamSpec, bound: float) -> str:
    return str(int(bound)) if spec.type_key is int else number_text(float(bound))


def row(spec: ParamSpec) -> str:
    """One table row; a ``|`` inside a description is escaped so the row keeps its columns."""
    description = spec.description.replace("|", "\\|")
    return (f"| `{spec.name}` | {type_name(spec)} | `{value_text(spec.default)}` | {range_text(spec)} | "
            f"{'yes' if spec.read_only else ''} | {description} |")


def shared_model_rows() -> list[str]:
    """Rows that read the same on every model node, in lane_node's order."""
    per_node = [[row(spec) for spec in TABLES[name]] for name in MODEL_NODES]
    return [line for line in per_node[0] if all(line in rows for rows in per_node[1:])]


def markdown_tables() -> str:
    """docs/ros.md's parameter tables: every model node's shared parameters, then each node's own."""
    shared = shared_model_rows()
    sections = ["### Every model node (" + ", ".join(f"`{name}`" for name in MODEL_NODES) + ")\n\n"
                + "\n".join([_HEADER, *shared])]
    for name in ORDER:
        rows = [line for line in (row(spec) for spec in TABLES[name])
                if name not in MODEL_NODES or line not in shared]
        rows += [row(dataclasses.replace(spec, name=f"<camera>.{spec.name}")) for spec in PER_CAMERA.get(name, [])]
        sections.append(f"### {name}\n\n" + "\n".join([_HEADER, *rows]))
    return "\n\n".join(sections) + "\n"


def main() -> None:
    """Print the tables (``python -m dynnet_ros.nodes.parameter_table``)."""
    print(markdown_tables(), end="")


if __name__ == "__main__":
    main()
