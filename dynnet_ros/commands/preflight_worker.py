"""The child `dynnet up` runs before it starts a graph (``preflight``): the parameter check and
the models' footprints, with the node modules and the engine they import.

``python -m dynnet_ros.commands.preflight_worker check CONFIG``: exit 0, or 2 with the first
problem on stderr (``check_graph_parameters``' line). ``... measure``: reads the model nodes as
JSON on stdin (``[{"name", "executable", "parameters"}]``) and prints one line per node as it
is measured (``prepare_graph_models``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dynnet_ros.commands.size_classes import prepare_graph_models
from dynnet_ros.graph_config import ProcessSpec, load_graph
from dynnet_ros.nodes.parameter_check import check_graph_parameters


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"] and len(argv) == 2:
        try:
            graph = load_graph(Path(argv[1]))
            check_graph_parameters(graph, graph.source)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    if argv == ["measure"]:
        processes = [ProcessSpec(name=item["name"], executable=item["executable"], namespace="",
                                 parameters=item["parameters"], remappings=())
                     for item in json.loads(sys.stdin.read())]
        prepare_graph_models(processes, lambda message: print(message, flush=True))
        return 0
    print("usage: python -m dynnet_ros.commands.preflight_worker check CONFIG | measure < NODES.json", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
