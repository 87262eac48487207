"""A learned per-layer cost model: latency and energy of a (sub)layer on a unit at a DVFS level.

Why a surrogate: the search prices thousands of candidate partitions, and a sub-layer holding a
fraction of a layer's channels at a clock that was not profiled has no measurement. Map-and-Conquer
trains XGBoost on per-layer measurements; so does this module (the pinned ``xgboost-cpu`` wheel),
on features that do not depend on the layer's name: operator, FLOPs, bytes in/out/weights, channel
counts, spatial size, the channel fractions, the unit (and its kind) and the DVFS level's clock.
Targets are log-latency and log-energy (layers span three orders of magnitude; a tree on the log
has a relative error, which is what MAPE measures).

A query that matches a profiled point exactly (same features, unit and level) returns the
measurement itself: the model only fills the gaps.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, fields
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from dynnet_ros.mapper.hardware import UNIT_KINDS, Hardware
from dynnet_ros.mapper.profile_io import Measurement

if TYPE_CHECKING:
    import xgboost as xgb


@dataclass(frozen=True)
class LayerFeatures:
    """What the cost of one (sub)layer depends on, independent of its name."""

    op: str
    flops: float              # multiply-adds x 2 of this (sub)layer
    in_bytes: float
    out_bytes: float
    weight_bytes: float
    in_channels: float
    out_channels: float
    out_height: float
    out_width: float
    in_fraction: float = 1.0   # share of the layer's input channels this sub-layer reads
    out_fraction: float = 1.0  # share of the layer's output channels it computes

    @classmethod
    def from_mapping(cls, values: Mapping[str, object], where: str = "") -> LayerFeatures:
        """From a profile row's feature columns; ValueError naming what is missing."""
        missing = [f.name for f in fields(cls) if f.name not in values and f.name not in ("in_fraction",
                                                                                           "out_fraction")]
        if missing:
            raise ValueError(f"{where}: no layer features {', '.join(missing)} (profile written by "
                             "`dynnet map profile`, or give the measured table only)")
        kwargs: dict[str, Any] = {f.name: (str(values[f.name]) if f.name == "op" else float(str(values[f.name])))
                                  for f in fields(cls) if f.name in values}
        return cls(**kwargs)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class Sample:
    """One measured point: a layer's features on a unit at a DVFS level."""

    features: LayerFeatures
    unit: str
    dvfs: str                # "" = the unit's default
    latency_ms: float
    energy_mj: float


@dataclass(frozen=True)
class Accuracy:
    """Held-out quality of the latency model on one unit."""

    unit: str
    samples: int
    r2: float
    mape: float           # mean absolute percentage error, fraction (0.1 = 10 %)


def _xgboost() -> ModuleType:
    """The xgboost module, imported where a cost model is fitted or queried."""
    # xgboost (with the scikit-learn and SciPy it loads): the search stack, not a serving node's
    import xgboost
    return xgboost


def samples_from_profile(measurements: Sequence[Measurement], hardware: Hardware) -> list[Sample]:
    """Samples from profile rows that carry layer features (energy modelled where not measured)."""
    out = []
    for m in measurements:
        features = LayerFeatures.from_mapping(m.features, f"{m.layer} on {m.unit}")
        energy, _ = m.energy_mj(hardware)
        out.append(Sample(features, m.unit, m.dvfs, m.latency_ms, energy))
    return out


def r2_score(truth: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((truth - truth.mean()) ** 2).sum())
    return 1.0 - float(((truth - predicted) ** 2).sum()) / total if total > 0 else float("nan")


def mape(truth: np.ndarray, predicted: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - truth) / truth))


#: Least rows a fit spreads over several threads.
PARALLEL_ROWS = 2000


class Surrogate:
    """XGBoost regressors for log-latency and log-energy, with the measured table in front."""

    def __init__(self, hardware: Hardware, *, seed: int = 0, trees: int = 400, depth: int = 6,
                 threads: int = 2) -> None:
        self.hardware = hardware
        self.seed = seed
        self._threads = threads
        self._rounds = trees
        self._params = {"max_depth": depth, "eta": 0.08, "subsample": 0.9, "colsample_bytree": 0.9,
                        "seed": seed, "nthread": threads, "tree_method": "hist", "objective": "reg:squarederror"}
        self._ops: dict[str, int] = {}
        self._units = {u.name: i for i, u in enumerate(hardware.units)}
        self._table: dict[tuple, tuple[float, float]] = {}
        self._latency: xgb.Booster | None = None
        self._energy: xgb.Booster | None = None
        self.report: tuple[Accuracy, ...] = ()

    def _row(self, features: LayerFeatures, unit: str, dvfs: str) -> list[float]:
        level = self.hardware.unit(unit).level(dvfs or None)
        kind = UNIT_KINDS.index(self.hardware.unit(unit).kind)
        clock = level.frequency_mhz if level.frequency_mhz is not None else 0.0
        values = astuple(features)
        return [float(self._ops.get(features.op, -1)), float(self._units[unit]), float(kind), clock,
                level.power_w] + [float(v) for v in values[1:]]

    def _matrix(self, samples: Sequence[Sample]) -> np.ndarray:
        return np.array([self._row(s.features, s.unit, s.dvfs) for s in samples], dtype=float)

    def _train(self, x: np.ndarray, y: np.ndarray) -> xgb.Booster:
        # a small table trains on one thread: splitting a few rows across threads costs a
        # synchronisation per tree, which on a busy machine waits for a core
        threads = self._threads if len(x) >= PARALLEL_ROWS else 1
        xgboost = _xgboost()
        return xgboost.train(dict(self._params, nthread=threads), xgboost.DMatrix(x, label=y),
                             num_boost_round=self._rounds)

    def fit(self, samples: Sequence[Sample], holdout: float = 0.2) -> tuple[Accuracy, ...]:
        """Fit on ``samples``; held-out R² and MAPE of latency per unit (a random ``holdout``
        share, seeded), then refit on everything. ValueError with fewer than 5 samples."""
        if len(samples) < 5:
            raise ValueError(f"{len(samples)} measurements: too few to fit a cost model (need >= 5)")
        for s in samples:
            if s.unit not in self._units:
                raise ValueError(f"measurement on unit {s.unit!r}, which hardware {self.hardware.name!r} lacks")
            if not (s.latency_ms > 0 and s.energy_mj > 0):
                raise ValueError(f"measurement of {s.features.op} on {s.unit}: latency and energy must be > 0")
        self._ops = {op: i for i, op in enumerate(sorted({s.features.op for s in samples}))}
        x = self._matrix(samples)
        latency = np.log(np.array([s.latency_ms for s in samples]))
        energy = np.log(np.array([s.energy_mj for s in samples]))
        rng = np.random.default_rng(self.seed)
        order = rng.permutation(len(samples))
        cut = int(round(len(samples) * holdout)) if 0 < holdout < 1 else 0
        test, train = order[:cut], order[cut:]
        report = []
        if cut:
            model = self._train(x[train], latency[train])
            predicted = np.exp(model.predict(_xgboost().DMatrix(x[test])))
            truth = np.exp(latency[test])
            units = np.array([samples[i].unit for i in test])
            for unit in dict.fromkeys(units.tolist()):
                pick = units == unit
                report.append(Accuracy(unit, int(pick.sum()), r2_score(truth[pick], predicted[pick]),
                                       mape(truth[pick], predicted[pick])))
        self._latency = self._train(x, latency)
        self._energy = self._train(x, energy)
        self._table = {(astuple(s.features), s.unit, s.dvfs): (s.latency_ms, s.energy_mj) for s in samples}
        self.report = tuple(report)
        return self.report

    def predict(self, queries: Sequence[tuple[LayerFeatures, str, str]]) -> tuple[np.ndarray, np.ndarray]:
        """(latency_ms, energy_mj) per (features, unit, dvfs): the measurement where one matches,
        else the model's."""
        if self._latency is None or self._energy is None:
            raise ValueError("the cost model is not fitted")
        latency = np.empty(len(queries))
        energy = np.empty(len(queries))
        missing = []
        for i, (features, unit, dvfs) in enumerate(queries):
            hit = self._table.get((astuple(features), unit, dvfs))
            if hit is None:
                missing.append(i)
            else:
                latency[i], energy[i] = hit
        if missing:
            x = np.array([self._row(*queries[i]) for i in missing], dtype=float)
            matrix = _xgboost().DMatrix(x)
            latency[missing] = np.exp(self._latency.predict(matrix))
            energy[missing] = np.exp(self._energy.predict(matrix))
        return latency, energy

    def predict_one(self, features: LayerFeatures, unit: str, dvfs: str = "") -> tuple[float, float]:
        latency, energy = self.predict([(features, unit, dvfs)])
        return float(latency[0]), float(energy[0])
