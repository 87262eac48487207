"""Import each module of a package as the package's first import, in a forked child per module.

A module that only imports because some other module of its package happened to be imported
first hides an import cycle (``cannot import name X from partially initialized module``) that
no import statement shows. Starting a fresh interpreter per module finds it but costs a
second of third-party imports each time; here one parent imports the third-party packages the
modules import at their top, with none of the package's own modules loaded, and forks a child
per module, so every child starts with the package unimported and pays only for its own code.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

_PARENT = r'''
import importlib, json, os, sys, traceback
package, modules, preload, jobs = json.loads(sys.argv[1])
for name in preload:
    try:
        importlib.import_module(name)
    except Exception:  # an optional dependency that is absent here: the child reports it if needed
        pass
loaded = sorted(m for m in sys.modules if m == package or m.startswith(package + "."))
if loaded:
    sys.exit(f"the preload imported {loaded}: the children would not start with the package unimported")
failures, running = {}, {}

def reap():
    pid, _ = os.wait()
    name, read_fd = running.pop(pid)
    with os.fdopen(read_fd, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    if message:
        failures[name] = message

for name in modules:
    while len(running) >= jobs:
        reap()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            os.write(write_fd, traceback.format_exc()[-3000:].encode())
            code = 1
        os._exit(code)
    os.close(write_fd)
    running[pid] = (name, read_fd)
while running:
    reap()
print(json.dumps(failures))
'''


def first_import_failures(package: str, modules: list[str], preload: list[str], *, jobs: int = 2,
                          cwd: Path | None = None, timeout: float = 600) -> dict[str, str]:
    """``{module: traceback}`` for each module of ``package`` that fails as the first import."""
    argument = json.dumps([package, modules, preload, jobs])
    result = subprocess.run([sys.executable, "-c", _PARENT, argument], capture_output=True, text=True,
                            cwd=cwd, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def package_modules(package_dir: Path) -> list[str]:
    """Every module of the package at ``package_dir``, by its dotted name."""
    names = []
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def top_level_third_party(package_dir: Path) -> list[str]:
    """The modules outside the package that its modules import at their top (not in functions)."""
    package = package_dir.name
    found: set[str] = set()
    for path in sorted(package_dir.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module)
    return sorted(name for name in found if name.split(".")[0] not in (package, "__future__"))
