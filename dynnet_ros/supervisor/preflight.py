"""What `dynnet up` checks and prepares before it starts a graph, in a child process of its own.

Why a child: the parameter check reads what each node declares (the node modules, which import
the engine), and measuring the models' footprints runs them. The supervisor then watches the
graph for as long as it runs; done in its own process it would hold the engine, onnx and
onnxruntime for hours without using them again. The child exits and gives that memory back.

The child is ``preflight_worker``; this module, which the supervisor imports, starts it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from dynnet_ros.graph_config import ProcessSpec

#: the child's module: it imports the node modules and the engine, this one does not
WORKER = "dynnet_ros.commands.preflight_worker"


def check_in_child(config: Path) -> None:
    """``check_graph_parameters`` of the config at ``config``, in a child; ValueError with its line."""
    result = subprocess.run([sys.executable, "-m", WORKER, "check", str(config)], capture_output=True, text=True)
    if result.returncode == 2:
        raise ValueError(result.stderr.strip().splitlines()[-1])
    if result.returncode != 0:
        raise RuntimeError(f"the parameter check of {config} failed (exit status {result.returncode}): "
                           f"{result.stderr.strip()[-2000:]}")


def measure_in_child(processes: list[ProcessSpec], report: Callable[[str], None]) -> None:
    """``prepare_graph_models`` for ``processes`` in a child, each of its lines to ``report``."""
    request = json.dumps([{"name": p.name, "executable": p.executable, "parameters": p.parameters}
                          for p in processes])
    with subprocess.Popen([sys.executable, "-m", WORKER, "measure"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        child.stdin.write(request)
        child.stdin.close()
        for line in child.stdout:
            report(line.rstrip("\n"))
        errors = child.stderr.read()
    if child.returncode != 0:
        report(f"model footprints not measured ahead (exit status {child.returncode}): "
               f"{errors.strip()[-2000:]}; the nodes measure them")
