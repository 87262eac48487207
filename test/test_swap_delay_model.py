"""Delay model fit: recovers known coefficients, reports R², round-trips through YAML."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

from dynnet_ros.swap.delay_model import DEFAULT_MODEL, BlockSample, DelayModel, fit, load_or_default


def synthetic(noise: float, n: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    truth = dict(alpha=8e-10, beta=4e-5, gamma=3e-10, eta=6e-6)
    samples = []
    for _ in range(n):
        s, d, f = rng.uniform(1e5, 5e7), float(rng.integers(1, 40)), rng.uniform(1e6, 5e9)
        jitter = lambda: 1 + noise * rng.standard_normal()  # noqa: E731
        samples.append(BlockSample(s, d, f, (truth["alpha"] * s + truth["beta"] * d) * jitter(),
                                   truth["gamma"] * f * jitter(), truth["eta"] * d * jitter()))
    return truth, samples


def test_fit_recovers_known_coefficients():
    truth, samples = synthetic(noise=0.0)
    model = fit(samples)
    for key, value in truth.items():
        assert getattr(model, key) == pytest.approx(value, rel=1e-6)
    assert all(r2 == pytest.approx(1.0) for r2 in model.r2.values())


def test_fit_under_noise_stays_close_and_r2_reflects_it():
    truth, samples = synthetic(noise=0.05)
    model = fit(samples)
    for key in ("alpha", "gamma", "eta"):
        assert getattr(model, key) == pytest.approx(truth[key], rel=0.1)
    # beta*d is ~4 % of t_in here, below the noise: only the predictions must stay close.
    scale = max(x.t_in for x in samples)
    for sample in samples:
        exact = truth["alpha"] * sample.s + truth["beta"] * sample.d
        assert model.t_in(sample.s, sample.d) == pytest.approx(exact, abs=0.03 * scale)
    assert 0.8 < model.r2["t_ex"] < 1.0


def test_negative_coefficient_from_noise_is_clamped():
    # t_in independent of d: the fitted beta must not go negative.
    samples = [BlockSample(s, d, 1.0, 1e-9 * s, 1.0, 1e-6 * d) for s, d in
               [(1e6, 30), (2e6, 1), (3e6, 20), (4e6, 2), (5e6, 10)]]
    assert fit(samples).beta >= 0.0


def test_too_few_samples():
    with pytest.raises(ValueError, match="at least 3"):
        fit(synthetic(0.0, n=2)[1])


def test_yaml_round_trip_and_validation(tmp_path):
    model = fit(synthetic(0.01)[1])
    path = tmp_path / "profile.yaml"
    model.save(path)
    loaded = DelayModel.load(path)
    assert (loaded.alpha, loaded.beta, loaded.gamma, loaded.eta) == (model.alpha, model.beta, model.gamma, model.eta)
    assert loaded.r2 == model.r2
    data = yaml.safe_load(path.read_text())
    data["gamma"] = -1
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="gamma"):
        DelayModel.load(path)
    path.write_text("!!python/object:os.system 'true'")
    with pytest.raises(ValueError):
        DelayModel.load(path)


def test_missing_profile_falls_back_to_default(tmp_path):
    assert load_or_default(tmp_path / "absent.yaml") is DEFAULT_MODEL
