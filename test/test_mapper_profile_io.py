"""Profile files: the documented CSV and trtexec's --exportProfile JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.profile_io import (
    Measurement,
    combine,
    parse_csv,
    read_profile,
    read_trtexec_profile,
    to_csv,
)

FIXTURE = Path(__file__).parent / "data" / "mapper" / "trtexec_profile.json"

CSV = """layer,unit,dvfs,latency_ms,power_w,transition_ms
conv1,gpu,,0.30,12.5,
conv2,gpu,,0.50,,0.1
fc,gpu,,1.00,13,
conv1,dla0,,0.90,3.0,0.2
fc,dla0,,2.50,,
"""


def _hw():
    return load_hardware("jetson-agx-xavier")


def test_csv_reads_rows_order_and_optional_columns():
    profile = parse_csv(CSV, "p.csv", hardware=_hw())
    assert profile.layers == ("conv1", "conv2", "fc")
    assert profile.units == ("gpu", "dla0")
    rows = profile.lookup()
    assert rows[("conv2", "gpu", "")].power_w is None and rows[("conv2", "gpu", "")].transition_ms == 0.1
    assert rows[("conv1", "dla0", "")].latency_ms == 0.9
    assert profile.power_label() == "mixed"
    energy, measured = rows[("conv1", "gpu", "")].energy_mj(_hw())
    assert measured and energy == pytest.approx(12.5 * 0.3)
    modelled, measured = rows[("fc", "dla0", "")].energy_mj(_hw())
    assert not measured and modelled == pytest.approx(_hw().unit("dla0").level().power_w * 2.5)
    again = parse_csv(to_csv(profile), "again.csv")
    assert [(m.layer, m.unit, m.latency_ms, m.power_w) for m in again.measurements] == \
        [(m.layer, m.unit, m.latency_ms, m.power_w) for m in profile.measurements]


def test_units_that_skip_layers_merge_into_one_order():
    text = "layer,unit,dvfs,latency_ms,power_w\na,dla0,,1,\nc,dla0,,1,\na,gpu,,1,\nb,gpu,,1,\nc,gpu,,1,\n"
    assert parse_csv(text).layers == ("a", "b", "c")


@pytest.mark.parametrize("text, message", [
    ("", "empty file"),
    ("layer,unit,latency_ms\n", "header lacks dvfs, power_w"),
    ("layer,unit,dvfs,latency_ms,power_w\nconv1,gpu,,abc,\n", "line 2: latency_ms 'abc' is not a number"),
    ("layer,unit,dvfs,latency_ms,power_w\nconv1,gpu,,0,\n", "line 2: latency_ms must be a finite number > 0"),
    ("layer,unit,dvfs,latency_ms,power_w\nconv1,gpu,,1,-2\n", "line 2: power_w must be"),
    ("layer,unit,dvfs,latency_ms,power_w\nconv1,gpu,,1\n", "line 2: 4 fields, the header has 5"),
    ("layer,unit,dvfs,latency_ms,power_w\nconv1,gpu,,1,\nconv1,gpu,,2,\n",
     "line 3: layer 'conv1' on gpu repeats line 2"),
    ("layer,unit,dvfs,latency_ms,power_w\na,gpu,,1,\nb,gpu,,1,\nb,dla0,,1,\na,dla0,,1,\n",
     "line 5: layer 'a' on dla0 follows 'b'"),
    ("layer,unit,dvfs,latency_ms,power_w\na,npu,,1,\n", "line 2: .*no unit 'npu'"),
    ("layer,unit,dvfs,latency_ms,power_w\na,gpu,turbo,1,\n", "line 2: .*no DVFS level 'turbo'"),
    ("layer,unit,dvfs,latency_ms,power_w\n", "no measurements"),
])
def test_csv_errors_name_the_line(text, message):
    with pytest.raises(ValueError, match=message):
        parse_csv(text, "p.csv", hardware=_hw())


def test_trtexec_profile_fixture_in_tensorrt_format():
    profile = read_trtexec_profile(FIXTURE, "dla0", hardware=_hw())
    # the input reformat is dropped, the output reformat becomes conv2's transition, the fused
    # (0 ms) pool vanishes, averageMs is the latency
    assert profile.layers == ("conv1 + relu1", "conv2 + relu2", "fc")
    rows = {m.layer: m for m in profile.measurements}
    assert rows["conv1 + relu1"].latency_ms == pytest.approx(0.3)
    assert rows["conv2 + relu2"].transition_ms == pytest.approx(0.1)
    assert rows["fc"].unit == "dla0" and rows["fc"].power_w is None


def test_trtexec_without_average_uses_time_over_count(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps([{"count": 10}, {"name": "l", "timeMs": 5.0, "percentage": 100}]))
    assert read_trtexec_profile(path, "gpu").measurements[0].latency_ms == pytest.approx(0.5)


@pytest.mark.parametrize("content, message", [
    ("{", "not JSON"),
    ('{"count": 1}', "not a trtexec --exportProfile file"),
    ('[{"count": 0}]', "count must be a positive number"),
    ('[{"count": 1}, {"timeMs": 1}]', "entry 1: expected an object with a string 'name'"),
    ('[{"count": 1}, {"name": "x"}]', "neither averageMs nor timeMs"),
    ('[{"count": 1}, {"name": "x", "averageMs": -1}]', "latency must be"),
])
def test_trtexec_errors(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_trtexec_profile(path, "gpu")


def test_read_profile_dispatches_and_combines_units(tmp_path):
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps([{"count": 1}, {"name": "conv1 + relu1", "averageMs": 0.1},
                               {"name": "conv2 + relu2", "averageMs": 0.2}, {"name": "fc", "averageMs": 0.3}]))
    merged = combine([read_profile(f"dla0={FIXTURE}"), read_profile(f"gpu={gpu}")], hardware=_hw())
    assert merged.units == ("dla0", "gpu") and len(merged.measurements) == 6
    with pytest.raises(ValueError, match="needs its unit"):
        read_profile(str(gpu))


def test_measurement_without_power_needs_hardware():
    with pytest.raises(ValueError, match="no power measured"):
        Measurement("l", "gpu", "", 1.0).energy_mj(None)


def test_power_rails_from_a_jetson_sysfs_tree(tmp_path):
    """INA3221 rails as L4T exposes them (hwmon: mV and mA per channel, with labels)."""
    from dynnet_ros.mapper.profiler import PowerRails
    hwmon = tmp_path / "ina3221" / "1-0040" / "hwmon" / "hwmon3"
    hwmon.mkdir(parents=True)
    for channel, (label, mv, ma) in enumerate([("VDD_GPU_SOC", 5000, 1200), ("VDD_CPU_CV", 5000, 400)], start=1):
        (hwmon / f"in{channel}_label").write_text(label + "\n")
        (hwmon / f"in{channel}_input").write_text(f"{mv}\n")
        (hwmon / f"curr{channel}_input").write_text(f"{ma}\n")
    rails = PowerRails.discover(tmp_path)
    assert rails is not None and set(rails.rails) == {"VDD_GPU_SOC", "VDD_CPU_CV"}
    orin = load_hardware("jetson-agx-orin")
    assert rails.rail_for(orin.unit("gpu")) == "VDD_GPU_SOC"
    assert rails.rail_for(orin.unit("dla0")) == "VDD_CPU_CV"      # Orin's DLAs share the CPU's rail
    assert rails.read_w("VDD_GPU_SOC") == pytest.approx(6.0)
    assert PowerRails.discover(tmp_path / "none") is None


def test_node_features_count_conv_flops_and_bytes():
    from onnx import helper

    from dynnet_ros.mapper.profiler import node_features
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    shapes = {"x": [1, 8, 16, 16], "w": [4, 8, 3, 3], "y": [1, 4, 16, 16]}
    f = node_features(node, shapes, out_fraction=0.5)
    assert f.flops == 2 * 4 * 16 * 16 * 8 * 9
    assert f.in_bytes == 4 * 8 * 16 * 16 and f.out_bytes == 4 * 4 * 16 * 16 and f.weight_bytes == 4 * 4 * 8 * 9
    assert (f.in_channels, f.out_channels, f.out_height, f.out_fraction) == (8, 4, 16, 0.5)
    assert node_features(node, {"x": [1, 8, 16, 16]}) is None
