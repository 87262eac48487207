"""The package's dependency rules, read from the source's imports (docs/architecture.md).

* Layers: utilities <- model I/O <- rdp <- plan <- runtime (executors) <- backends / swap / budget
  <- engine <- perception <- nodes and commands. No module imports from a layer above its own.
* No import cycles among the package's modules.
* Imports sit at module top. An import inside a function is allowed only for an optional
  dependency (TensorRT, pycuda, ROS packages without wheels) or a child-process entry point, or
  in a package ``__init__``'s ``__getattr__`` (a lazy re-export), and it carries a one-line
  reason as a comment on its line or the line above.
* The core (everything below the nodes) never imports ROS.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.graph

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dynnet_ros"

#: Module-name prefixes to layers, most specific prefix wins. Lower layers never import higher ones.
#: A package's layer is its folder's: every module below a prefix shares its layer. The package
#: root's single-file modules are named one by one (layer 0 utilities beside the layer 8 entry points).
LAYERS: dict[str, int] = {
    "dynnet_ros.settings": 0,
    "dynnet_ros.bytesize": 0,
    "dynnet_ros.hostcaps": 0,
    "dynnet_ros.procmem": 0,
    "dynnet_ros.memtrim": 0,
    "dynnet_ros.shared_lock": 0,
    "dynnet_ros.geometry": 0,
    "dynnet_ros.layouts": 0,
    "dynnet_ros.compressed": 0,
    "dynnet_ros.frame_reports": 0,
    "dynnet_ros.engine.modelio": 1,
    "dynnet_ros.zoo": 1,
    "dynnet_ros.sim": 1,
    "dynnet_ros.engine.rdp": 2,
    "dynnet_ros.engine.plan": 3,
    "dynnet_ros.engine.runtime": 4,
    "dynnet_ros.engine.backends": 5,
    "dynnet_ros.swap": 5,
    "dynnet_ros.budget": 5,
    "dynnet_ros.mapper": 5,
    "dynnet_ros.engine": 6,
    "dynnet_ros.perception": 7,
    "dynnet_ros.bags": 7,
    "dynnet_ros.view": 7,  # live view: ROS-free conversions to Foxglove messages, the loopback server
    "dynnet_ros.graph_config": 8,
    "dynnet_ros.graph_cameras": 8,
    "dynnet_ros.graph_transport": 8,
    "dynnet_ros.nodes": 8,
    "dynnet_ros.supervisor": 8,
    "dynnet_ros.commands": 8,
    "dynnet_ros.cli": 8,
    "dynnet_ros": 8,
}
CORE_LAYER_MAX = 7
ROS_PACKAGES = ("rclpy", "std_msgs", "sensor_msgs", "diagnostic_msgs", "visualization_msgs",
                "rcl_interfaces", "vision_msgs", "launch", "launch_ros", "builtin_interfaces",
                "geometry_msgs", "ament_index_python")
#: Top-level names a function may import lazily: optional, possibly absent or slow to import.
OPTIONAL_IMPORTS = ("tensorrt", "pycuda", "vision_msgs", "launch", "launch_ros", "ament_index_python",
                    # heavy, loaded only by the feature that uses them (the mapper's search and
                    # cost model, plots, the CLI's terminal UI): a serving process never pays for them
                    "pymoo", "xgboost", "matplotlib", "rich",
                    # image codecs, loaded by a node's first compressed camera frame (or dynnet sim --compress)
                    "PIL", "simplejpeg",
                    # composable-node services, served by the container where a ROS install has them
                    "composition_interfaces",
                    # onnx's C++ library (checker, shape inference, inliner, schemas) and ml_dtypes:
                    # loaded by the features that use them; models are read with onnx's protobuf
                    # classes alone (engine/modelio/onnx_proto.py)
                    "onnx")


@dataclass(frozen=True)
class ImportSite:
    module: str          # importing module
    target: str          # imported module (resolved, absolute)
    line: int
    nested: bool         # inside a function or class body
    has_reason: bool     # a comment on its line or the line above
    reexport: bool = False  # inside a package __init__'s module-level __getattr__ (PEP 562)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    if node.level:
        base = module.split(".")
        if path.name != "__init__.py":
            base = base[:-1]
        base = base[:len(base) - node.level + 1]
        package = ".".join(base + ([node.module] if node.module else []))
    else:
        package = node.module or ""
    targets = []
    for alias in node.names:
        full = f"{package}.{alias.name}"
        targets.append(full if full in modules else package)
    return targets


def import_sites(modules: dict[str, Path]) -> list[ImportSite]:
    sites = []
    for module, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        nested_nodes = set()
        reexport_nodes = set()
        if path.name == "__init__.py":
            for scope in tree.body:
                if isinstance(scope, ast.FunctionDef) and scope.name == "__getattr__":
                    reexport_nodes.update(id(inner) for inner in ast.walk(scope)
                                          if isinstance(inner, (ast.Import, ast.ImportFrom)))
        for scope in ast.walk(tree):
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                for inner in ast.walk(scope):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        nested_nodes.add(id(inner))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                targets = _resolve(module, path, node, modules)
            else:
                continue
            here = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            has_reason = "#" in here or above.startswith("#")
            for target in targets:
                sites.append(ImportSite(module, target, node.lineno, id(node) in nested_nodes, has_reason,
                                        id(node) in reexport_nodes))
    return sites


def layer_of(module: str) -> int:
    best = max((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")),
               key=len)
    return LAYERS[best]


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    found = all_modules()
    assert len(found) > 60  # the walk really found the package
    return found


@pytest.fixture(scope="module")
def sites(modules) -> list[ImportSite]:
    return import_sites(modules)


def _internal(site: ImportSite) -> bool:
    return site.target == "dynnet_ros" or site.target.startswith("dynnet_ros.")


def test_every_layer_entry_names_a_module_or_package(modules):
    ghosts = [prefix for prefix in LAYERS if prefix not in modules]
    assert ghosts == [], f"the layer table names modules that do not exist: {ghosts}"


def test_no_module_imports_from_a_layer_above_its_own(sites):
    upward = [f"{s.module}:{s.line} (layer {layer_of(s.module)}) imports {s.target} "
              f"(layer {layer_of(s.target)})"
              for s in sites if _internal(s) and layer_of(s.target) > layer_of(s.module)]
    assert upward == [], "\n".join(upward)


def test_no_import_cycles(modules, sites):
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for site in sites:
        if _internal(site) and site.target in graph and site.target != site.module:
            graph[site.module].add(site.target)
    cycles = _strongly_connected(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative; returns the components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def test_strongly_connected_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _strongly_connected(graph) == [{"a", "b", "c"}]


def test_imports_inside_functions_are_optional_dependencies_with_a_reason(sites):
    bad = []
    for site in sites:
        if not site.nested:
            continue
        top = site.target.split(".")[0]
        if _internal(site) and site.reexport and site.has_reason:
            continue  # a package's lazy re-export of a module that imports the package's lower layers
        if _internal(site):
            bad.append(f"{site.module}:{site.line} imports {site.target} inside a function")
        elif top not in OPTIONAL_IMPORTS:
            bad.append(f"{site.module}:{site.line} imports {site.target} inside a function "
                       f"(not an optional dependency)")
        elif not site.has_reason:
            bad.append(f"{site.module}:{site.line} imports {site.target} lazily without a reason comment")
    assert bad == [], "\n".join(bad)


def test_core_source_never_imports_ros(sites):
    offenders = [f"{s.module}:{s.line} imports {s.target}" for s in sites
                 if layer_of(s.module) <= CORE_LAYER_MAX and s.target.split(".")[0] in ROS_PACKAGES]
    assert offenders == [], "\n".join(offenders)


def test_core_modules_import_without_pulling_in_ros(modules):
    core = [name for name in modules if layer_of(name) <= CORE_LAYER_MAX]
    assert len(core) > 40
    script = (
        "import importlib, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        f"ros = sorted(m for m in sys.modules if m.split('.')[0] in {ROS_PACKAGES!r})\n"
        "print(','.join(ros))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"core modules imported ROS packages: {result.stdout.strip()}"
