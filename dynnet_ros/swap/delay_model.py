"""SwapNet's delay model: t_in = α·s + β·d, t_ex = γ·f, t_out = η·d, fitted per device.

s = block weight bytes, d = parameter depth (tensors bound by reference), f = FLOPs.  The
coefficients are device properties (I/O bandwidth, per-tensor bookkeeping, compute rate), so
they are profiled once per machine (``dynnet swap profile``) and stored as YAML with the R²
of each fitted term, which tells whether the linear model explains this machine at all.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import yaml

PROFILE_VERSION = 1


@dataclass(frozen=True)
class BlockSample:
    """One measured block: its size, depth and FLOPs, and the three delays in seconds."""

    s: float
    d: float
    f: float
    t_in: float
    t_ex: float
    t_out: float


@dataclass
class DelayModel:
    alpha: float   # s / byte        (swap-in I/O)
    beta: float    # s / tensor      (assembly: binding one tensor by reference)
    gamma: float   # s / FLOP        (execution)
    eta: float     # s / tensor      (swap-out: releasing one tensor)
    r2: dict = field(default_factory=dict)
    samples: int = 0
    device: str = ""
    created: float = 0.0
    source: str = "default"

    def t_in(self, s: float, d: float) -> float:
        return self.alpha * s + self.beta * d

    def t_ex(self, f: float) -> float:
        return self.gamma * f

    def t_out(self, d: float) -> float:
        return self.eta * d

    # ---------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> None:
        data = {"version": PROFILE_VERSION, **asdict(self)}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(yaml.safe_dump(data, sort_keys=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "DelayModel":
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read device profile {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("version") != PROFILE_VERSION:
            raise ValueError(f"{path} is not a version-{PROFILE_VERSION} dynnet swap device profile")
        values = {}
        for key in ("alpha", "beta", "gamma", "eta"):
            value = data.get(key)
            if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise ValueError(f"device profile {path}: '{key}' must be a non-negative number, got {value!r}")
            values[key] = float(value)
        return cls(**values, r2=dict(data.get("r2") or {}), samples=int(data.get("samples") or 0),
                   device=str(data.get("device") or ""), created=float(data.get("created") or 0.0),
                   source=str(path))


#: Used until ``dynnet swap profile`` has run: ~1 GB/s direct reads, 50 µs per bound tensor
#: (the paper's figure), 5 GFLOP/s, 5 µs per released tensor.
DEFAULT_MODEL = DelayModel(alpha=1e-9, beta=50e-6, gamma=2e-10, eta=5e-6)


def default_profile_path() -> Path:
    env = os.environ.get("DYNNET_SWAP_PROFILE")
    if env:
        return Path(env)
    return Path(os.path.expanduser("~")) / ".cache" / "dynnet_ros" / "swap" / "device_profile.yaml"


def load_or_default(path: str | os.PathLike | None = None) -> DelayModel:
    path = Path(path) if path else default_profile_path()
    if path.is_file():
        return DelayModel.load(path)
    return DEFAULT_MODEL


def _r2(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    residual = float(np.sum((y - predicted) ** 2))
    return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)


def _nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares; a coefficient that comes out negative (noise) is dropped and refitted."""
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    if np.all(coef >= 0) or x.shape[1] == 1:
        return np.maximum(coef, 0.0)
    keep = coef >= 0
    out = np.zeros_like(coef)
    sub, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
    out[keep] = np.maximum(sub, 0.0)
    return out


def fit(samples: list[BlockSample], *, device: str | None = None) -> DelayModel:
    """Fit the three delay terms by least squares (numpy.linalg.lstsq), R² per term."""
    if len(samples) < 3:
        raise ValueError(f"need at least 3 block samples to fit the delay model, got {len(samples)}")
    s = np.array([x.s for x in samples], float)
    d = np.array([x.d for x in samples], float)
    f = np.array([x.f for x in samples], float)
    t_in = np.array([x.t_in for x in samples], float)
    t_ex = np.array([x.t_ex for x in samples], float)
    t_out = np.array([x.t_out for x in samples], float)
    alpha, beta = _nonneg_lstsq(np.stack([s, d], 1), t_in)
    (gamma,) = _nonneg_lstsq(f[:, None], t_ex)
    (eta,) = _nonneg_lstsq(d[:, None], t_out)
    r2 = {"t_in": _r2(t_in, alpha * s + beta * d), "t_ex": _r2(t_ex, gamma * f), "t_out": _r2(t_out, eta * d)}
    return DelayModel(float(alpha), float(beta), float(gamma), float(eta), r2=r2, samples=len(samples),
                      device=device or f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
                      created=time.time(), source="fit")
