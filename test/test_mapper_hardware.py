"""Hardware descriptions: the Jetson presets, the discovered machine, and bad files refused."""
from __future__ import annotations

import os

import pytest
import yaml

from dynnet_ros.mapper.hardware import Exchange, load_hardware, parse_hardware, preset_names, split_cores


@pytest.mark.parametrize("name", ["jetson-agx-orin", "jetson-agx-xavier"])
def test_presets_have_the_four_units_with_dvfs_tables(name):
    hw = load_hardware(name)
    assert hw.unit_names == ("gpu", "dla0", "dla1", "cpu")
    assert [u.kind for u in hw.units] == ["gpu", "dla", "dla", "cpu"]
    for unit in hw.units:
        assert len(unit.dvfs) >= 4
        assert unit.level().name == unit.default_dvfs
        assert all(level.power_w > 0 and level.frequency_mhz for level in unit.dvfs)
    # the DLA is the efficient unit: less power than the GPU at every shared level
    for level in hw.unit("dla0").dvfs:
        assert level.power_w < hw.unit("gpu").level(level.name).power_w
    assert hw.exchange_cost("gpu", "gpu") == Exchange(0.0, 0.0)
    assert hw.exchange_cost("gpu", "dla0").cost_ms(1 << 20) > hw.exchange_cost("cpu", "gpu").cost_ms(0)


def test_presets_are_listed_and_named_by_file():
    assert {"jetson-agx-orin", "jetson-agx-xavier"} <= set(preset_names())


def test_this_machine_splits_the_usable_cores_into_disjoint_groups():
    cores = sorted(os.sched_getaffinity(0))
    hw = load_hardware("this-machine")
    assert all(u.kind == "cpu" for u in hw.units)
    assert sorted(c for u in hw.units for c in u.cores) == cores
    assert len(hw.units) == min(2, len(cores))
    one = load_hardware("this-machine:1")
    assert one.unit_names == ("cpu0",) and one.units[0].cores == tuple(cores)


def test_split_cores_is_even_and_contiguous():
    assert split_cores((0, 1, 2, 3, 4), 2) == [(0, 1, 2), (3, 4)]
    assert split_cores((0, 1), 4) == [(0,), (1,)]
    with pytest.raises(ValueError, match=">= 1"):
        split_cores((0, 1), 0)


def test_unknown_unit_names_the_known_ones():
    with pytest.raises(ValueError, match="its units: gpu, dla0, dla1, cpu"):
        load_hardware("jetson-agx-orin").unit("npu")


GOOD = {"name": "board", "units": [
    {"name": "gpu", "kind": "gpu", "dvfs": [{"name": "max", "frequency_mhz": 1000, "power_w": 10}]},
    {"name": "cpu", "kind": "cpu", "cores": [0], "dvfs": [{"name": "d", "frequency_mhz": None, "power_w": 2}]}],
    "exchange": {"default": {"latency_ms": 0.1, "ms_per_mb": 0.01},
                 "pairs": [{"between": ["gpu", "cpu"], "latency_ms": 0.5, "ms_per_mb": 0.2}]}}


def test_a_good_file_round_trips(tmp_path):
    path = tmp_path / "board.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    hw = load_hardware(path)
    assert hw.exchange_cost("cpu", "gpu") == Exchange(0.5, 0.2)
    assert hw.unit("cpu").level().frequency_mhz is None
    assert hw.to_json()["units"][1]["cores"] == [0]


def _bad(change):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    change(data)
    return data


@pytest.mark.parametrize("change,reason", [
    (lambda d: d["units"][0].update(kind="tpu"), "'kind' must be one of cpu, gpu, dla"),
    (lambda d: d["units"][1].update(name="gpu"), "unit names must be unique"),
    (lambda d: d["units"][0].update(cores=[1]), "only a cpu unit has 'cores'"),
    (lambda d: d["units"][0].update(default_dvfs="turbo"), "default_dvfs 'turbo'"),
    (lambda d: d["units"][0]["dvfs"][0].update(power_w=-1), "power_w must be a finite number"),
    (lambda d: d["units"][0].update(dvfs=[]), "'dvfs' must be a non-empty list"),
    (lambda d: d["exchange"]["pairs"][0].update(between=["gpu", "npu"]), "unknown unit 'npu'"),
    (lambda d: d.update(extra=1), "unknown keys ['extra']"),
])
def test_bad_files_are_refused_with_the_reason(change, reason):
    with pytest.raises(ValueError, match="hardware file .*" + reason.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        parse_hardware(_bad(change), source="x.yaml")


def test_unreadable_or_unknown_specs(tmp_path):
    with pytest.raises(ValueError, match="unknown hardware 'nope'"):
        load_hardware("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("units: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_hardware(bad)
    with pytest.raises(ValueError, match="this-machine:N"):
        load_hardware("this-machine:x")
