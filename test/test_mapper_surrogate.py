"""The XGBoost cost model learns known synthetic cost functions and keeps measured points exact."""
from __future__ import annotations

import numpy as np
import pytest

from dynnet_ros.mapper.hardware import parse_hardware
from dynnet_ros.mapper.profile_io import Measurement
from dynnet_ros.mapper.surrogate import LayerFeatures, Sample, Surrogate, samples_from_profile

HW = parse_hardware({"name": "synthetic", "units": [
    {"name": "fast", "kind": "gpu", "dvfs": [{"name": "hi", "frequency_mhz": 1000, "power_w": 20},
                                              {"name": "lo", "frequency_mhz": 500, "power_w": 8}]},
    {"name": "slow", "kind": "dla", "dvfs": [{"name": "hi", "frequency_mhz": 1000, "power_w": 3},
                                              {"name": "lo", "frequency_mhz": 400, "power_w": 1}]}]})
RATE = {"fast": 4e9, "slow": 1e9}          # FLOPs per ms at 1000 MHz
OVERHEAD = {"fast": 0.05, "slow": 0.2}     # ms per layer


def true_cost(f: LayerFeatures, unit: str, dvfs: str) -> tuple[float, float]:
    level = HW.unit(unit).level(dvfs)
    clock = (level.frequency_mhz or 1000) / 1000
    ms = OVERHEAD[unit] + f.flops / (RATE[unit] * clock) + (f.in_bytes + f.out_bytes) / 2e7
    return ms, ms * level.power_w


def random_layers(rng: np.random.Generator, n: int) -> list[LayerFeatures]:
    out = []
    for _ in range(n):
        cin, cout = (int(v) for v in rng.choice([16, 32, 64, 128, 256], size=2))
        side = int(rng.choice([8, 16, 32, 64]))
        fin, fout = (float(v) for v in rng.choice([0.25, 0.5, 0.75, 1.0], size=2))
        k = int(rng.choice([1, 3]))
        flops = 2.0 * cin * fin * cout * fout * k * k * side * side
        out.append(LayerFeatures("Conv", flops, 4.0 * cin * fin * side * side * 4, 4.0 * cout * fout * side * side,
                                 4.0 * cin * cout * k * k * fin * fout, cin, cout, side, side, fin, fout))
    return out


def samples(rng, n):
    out = []
    for f in random_layers(rng, n):
        for unit in ("fast", "slow"):
            for dvfs in ("hi", "lo"):
                ms, mj = true_cost(f, unit, dvfs)
                out.append(Sample(f, unit, dvfs, ms, mj))
    return out


def test_fits_a_synthetic_cost_function_per_unit():
    rng = np.random.default_rng(3)
    model = Surrogate(HW, seed=1, threads=1)
    report = model.fit(samples(rng, 250))
    assert {r.unit for r in report} == {"fast", "slow"}
    for r in report:
        assert r.r2 > 0.9, r
        assert r.mape < 0.15, r
    fresh = samples(np.random.default_rng(99), 60)
    latency, energy = model.predict([(s.features, s.unit, s.dvfs) for s in fresh])
    truth = np.array([s.latency_ms for s in fresh])
    assert np.mean(np.abs(latency - truth) / truth) < 0.2
    # ordering facts the model must get: the slow unit is slower at equal settings, lower clocks are slower
    f = random_layers(np.random.default_rng(5), 1)[0]
    assert model.predict_one(f, "slow", "hi")[0] > model.predict_one(f, "fast", "hi")[0]
    assert model.predict_one(f, "fast", "lo")[1] < model.predict_one(f, "fast", "hi")[1]


def test_measured_points_are_returned_exactly_and_fits_are_seeded():
    data = samples(np.random.default_rng(4), 40)
    a = Surrogate(HW, seed=7, threads=1)
    a.fit(data)
    b = Surrogate(HW, seed=7, threads=1)
    b.fit(data)
    point = data[5]
    assert a.predict_one(point.features, point.unit, point.dvfs) == (point.latency_ms, point.energy_mj)
    other = LayerFeatures("Conv", 1e6, 1e4, 1e4, 1e3, 8, 8, 4, 4, 0.5, 0.5)
    assert a.predict_one(other, "fast", "hi") == b.predict_one(other, "fast", "hi")


def test_samples_from_profile_rows_and_refusals():
    feats = random_layers(np.random.default_rng(0), 1)[0].as_dict()
    rows = [Measurement("c", "fast", "hi", 1.0, None, None, feats, 2)]
    sample = samples_from_profile(rows, HW)[0]
    assert sample.energy_mj == pytest.approx(20.0)     # modelled: the level's power x time
    with pytest.raises(ValueError, match="no layer features"):
        samples_from_profile([Measurement("c", "fast", "hi", 1.0)], HW)
    with pytest.raises(ValueError, match="too few"):
        Surrogate(HW).fit(samples(np.random.default_rng(0), 1))
    with pytest.raises(ValueError, match="not fitted"):
        Surrogate(HW).predict_one(sample.features, "fast")
