"""`dynnet up` as the graph tests run it: its own session, stdout and stderr collected apart."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from dynnet_ros.graph_config import separate_processes  # noqa: F401 — the tests' import point
from dynnet_ros.supervisor.runner import stop_process_group

REPO = Path(__file__).resolve().parents[1]


class Up:
    """`dynnet up --config CONFIG --namespace NAMESPACE [extra ...]`."""

    def __init__(self, config: Path, namespace: str, extra: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "dynnet_ros.cli", "up", "--config", str(config),
                                      "--namespace", namespace, *extra], cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def supervisor(self, level: str, node: str) -> list[str]:
        """The supervisor's own lines of ``level`` about ``node``."""
        prefix = f"[dynnet up] {level}: {node} "
        return [line for line in list(self.out) if line.startswith(prefix)]

    def pid(self, node: str) -> int | None:
        module = f"dynnet_ros.nodes.{node}"
        for child in psutil.Process(self.proc.pid).children():
            try:
                if module in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def log(self) -> str:
        return "\n".join(self.out[-120:] + ["--- stderr ---"] + self.err[-40:])

    def stop(self) -> int:
        code = stop_process_group(self.proc, timeout=60.0)
        for reader in self._readers:
            reader.join(timeout=5.0)
        return code
