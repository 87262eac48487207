"""This process's memory counters from /proc/self/status (Linux), in bytes.

Why one helper: budgets, calibration and the benchmarks all measure the same quantity — RSS
growth (``VmRSS``) and its high-water mark (``VmHWM``) since a baseline — and must read it alike.
"""
from __future__ import annotations


def status_bytes(key: str) -> int:
    """``VmRSS``, ``VmHWM``, ... of this process in bytes (KeyError if the kernel has no such line)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)
