"""The `dynnet` CLI's one error path: every bad input ends in exit status 2 and one error line.

The rule checked for every sub-command (found in ``cli.build_parser``, nested ones included):

* exit status 2, nothing on stdout, no traceback;
* stderr's last line is ``dynnet SUB: error: REASON`` and no other line says ``error:``;
* any lines before it are argparse's usage block *of that sub-command* (``usage: dynnet SUB …``
  and its indented continuation lines) — argparse prints it for what the argument types refuse;
  what a command can only check once it runs (a mismatch with the model's inputs) is the line
  alone;
* no work was done: the zoo, layout and weight-file caches (temporary directories here) are
  never created, so a bad value is refused before a model is built.

Every sub-command needs its own entries in ``CASES`` (a new sub-command fails
``test_every_command_has_cases`` until it has them); on top of those, every option whose type is
one of ``commands/arguments.py``'s number, model or output-file types gets a bad value
generically, and every sub-command an unknown flag.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from dynnet_ros import cli
from dynnet_ros.commands import arguments

pytestmark = pytest.mark.graph

REPO = Path(__file__).resolve().parents[1]
CACHES = ("DYNNET_ZOO_DIR", "DYNNET_LAYOUT_DIR", "DYNNET_SWAP_DIR", "DYNNET_MAP_DIR")

# Placeholders in CASES, replaced by files the fixture writes.
TINY, EMPTY, TEXT, A_DIR, A_FILE = "<tiny.onnx>", "<empty.onnx>", "<text.onnx>", "<dir>", "<file>"
# mapper files with one mistake each: partitions with a P not summing to 1 or an I reading a later stage,
# mappings naming those partitions or a unit the hardware lacks
BAD_P, BAD_I = "<bad_p.yaml>", "<bad_i.yaml>"
BAD_P_MAP, BAD_I_MAP, BAD_UNIT = "<bad_p_map.yaml>", "<bad_i_map.yaml>", "<bad_unit.yaml>"
# bags cut short or not a database at all
TRUNCATED_BAG, CORRUPT_BAG = "<truncated.mcap>", "<corrupt.db3>"

#: sub-command -> (arguments, a substring the error line must contain)
CASES: dict[str, list[tuple[list[str], str]]] = {
    "dynnet analyze": [
        ([EMPTY], "empty (0 bytes)"),
        ([TEXT], "not a readable ONNX model"),
        (["missing.onnx"], "model file not found"),
        (["zoo:nope"], "unknown zoo model 'nope'"),
        ([], "give a MODEL"),
        ([TINY, "--input-shape", "image=1x3xAx4"], "argument --input-shape"),
        ([TINY, "--input-shape", "nosuch=1x3x32x32"], "no input 'nosuch'"),
        ([TINY, "--divisor", "H=0"], "argument --divisor"),
        ([TINY, "--top", "-1"], "argument --top"),
        ([TINY, "--json", A_DIR], "is a directory"),
    ],
    "dynnet bench": [
        (["zoo:lane", "--shapes", "240x320"], "multiples of 32"),
        (["zoo:lane", "--shapes", "640-224:32"], "argument --shapes"),
        (["zoo:lane", "--shapes", "big"], "argument --shapes"),
        (["zoo:lane", "--samples", "0"], "argument --samples"),
        (["zoo:lane", "--repeats", "0"], "argument --repeats"),
        (["zoo:lane", "--threads", "x"], "argument --threads"),
        (["zoo:lane", "--engine-backend", "gpu"], "argument --engine-backend"),
        ([EMPTY], "argument model"),
    ],
    "dynnet demo": [
        (["--duration", "-1"], "argument --duration"),
        (["--duration", "1", "--config", "missing.yaml"], "argument --config"),
        (["--duration", "1", "--namespace", "1bad"], "argument --namespace"),
        (["--duration", "1", "--report", A_FILE], "not a directory"),
        (["--duration", "1", "--bag", "missing-bag"], "no such file or directory"),
        (["--duration", "1", "--bag", TRUNCATED_BAG], "not a readable bag"),
    ],
    "dynnet map run": [
        ([TINY, "--mapping", BAD_UNIT], "has no unit 'npu0'"),
        ([TINY, "--mapping", BAD_P_MAP], "must sum to 1"),
        ([TINY, "--mapping", BAD_I_MAP], "features from later stage 1"),
        ([TINY, "--mapping", "missing.yaml"], "no such file"),
        ([TINY], "--mapping"),
        ([TINY, "--mapping", BAD_UNIT, "--size", "100x100"], "multiples of 32"),
    ],
    "dynnet map profile": [
        ([], "give a MODEL to measure, or --import FILE"),
        ([TINY, "--import", A_FILE], "not both"),
        (["--import", "missing.csv"], "cannot read it"),
        (["--import", "x.json"], "needs its unit"),
        (["--import", A_FILE, "--hw", "no-such-board"], "unknown hardware"),
    ],
    "dynnet map search": [
        ([], "give either a MODEL or --profile"),
        (["--profile", "missing.csv"], "cannot read it"),
        (["--profile", A_FILE], "header lacks"),
        ([TINY, "--width", "9"], "a width split needs 2 to"),
        (["--profile", A_FILE, "--max-accuracy-drop", "2"], "argument --max-accuracy-drop"),
        (["--profile", A_FILE, "--prefer", "speed"], "argument --prefer"),
        (["--profile", A_FILE, "--memory-mb", "npu=10"], "has no unit 'npu'"),
        (["--profile", A_FILE, "--memory-mb", "cpu0=x"], "--memory-mb cpu0=x"),
        (["--profile", A_FILE, "--runtime-costs", A_FILE], "argument --runtime-costs"),
        (["--profile", A_FILE, "--runtime-costs", "missing.json"], "cannot read it"),
    ],
    "dynnet map show": [
        ([], "give the JSON file"),
        (["missing.json"], "no such file"),
        ([A_FILE], "not JSON"),
        ([BAD_UNIT], "not JSON"),
    ],
    "dynnet map exits": [
        ([TINY], "--frames"),
        ([TINY, "--frames", A_DIR], "--out"),
        ([TINY, "--frames", A_DIR, "--out", "x.onnx"], "one-channel maps only"),
        ([TINY, "--frames", A_DIR, "--out", "x.onnx", "--task", "classifier"], "not [N, K] class scores"),
        ([TINY, "--frames", A_DIR, "--out", "x.onnx", "--held-out", "2"], "argument --held-out"),
        (["zoo:nope", "--frames", A_DIR, "--out", "x.onnx"], "unknown zoo model"),
    ],
    "dynnet map stages": [
        ([TINY, "--out", A_FILE], "not a directory"),
        ([TINY, "--out", "o", "--partition", "missing.yaml"], "no such file"),
        ([TINY, "--out", "o", "--partition", BAD_P], "must sum to 1"),
        ([TINY, "--out", "o", "--partition", BAD_I], "features from later stage 1"),
        ([TINY], "--out"),
        (["zoo:nope", "--out", "o"], "unknown zoo model"),
    ],
    "dynnet infer": [
        ([EMPTY, A_FILE], "argument model"),
        (["zoo:nope", A_FILE], "unknown zoo model"),
        ([TINY, "missing.png"], "no such file"),
        ([TINY], "give at least one IMAGE"),
        ([TINY, A_FILE], "not a readable image"),
        ([TINY, A_FILE, "--model-format", "yolov8"], "fits no detect, segment or depth format named 'yolov8'"),
        ([TINY, A_FILE, "--mean", "1,2"], "argument --mean"),
        ([TINY, A_FILE, "--task", "classify"], "argument --task"),
        ([TINY, A_FILE, "--json", A_DIR], "is a directory"),
    ],
    "dynnet plan": [
        ([TINY, "--input-shape", "image=1x3x32"], "rank 4"),
        ([TINY, "--input-shape", "image=2x3x32x32"], "fixed at 1"),
        ([TINY, "--granularity", "huge"], "argument --granularity"),
        ([TEXT], "argument model"),
        (["zoo:nope"], "unknown zoo model"),
    ],
    "dynnet replay": [
        ([], "give the BAG"),
        (["missing-bag"], "no such file or directory"),
        ([TRUNCATED_BAG], "not a readable bag (truncated or corrupt?)"),
        ([CORRUPT_BAG], "not a readable bag"),
        ([A_DIR], "a directory without metadata.yaml"),
        ([TEXT], "unknown file type '.onnx'"),
        ([TRUNCATED_BAG, "--remap", "nope"], "argument --remap"),
        ([TRUNCATED_BAG, "--namespace", "1bad"], "argument --namespace"),
        ([TRUNCATED_BAG, "--config", "missing.yaml"], "argument --config"),
    ],
    "dynnet swap prepare": [
        ([EMPTY], "argument model"),
        (["zoo:nope"], "unknown zoo model"),
        ([TINY, "--layout", "blocked"], "argument --layout"),
        ([TINY, "--json", A_DIR], "is a directory"),
    ],
    "dynnet swap bench": [
        (["zoo:lane", "--size", "240x320"], "multiples of 32"),
        (["zoo:lane", "--size", "480"], "expected HxW"),
        (["zoo:lane", "--sizes", "480x640,100x100"], "multiples of 32"),
        (["zoo:lane", "--budgets", "-5"], "must be positive"),
        (["zoo:lane", "--budgets", "150%"], "between 0% and 100%"),
        (["zoo:lane", "--budgets", "50%,lots"], "argument --budgets"),
        (["zoo:lane", "--budgets", ","], "at least one budget"),
        (["zoo:lane", "--iters", "0"], "argument --iters"),
        (["zoo:lane", "--size", "480x640", "--sizes", "480x640"], "not allowed with"),
        ([EMPTY], "argument model"),
    ],
    "dynnet up": [
        (["--duration", "0"], "--duration"),
        (["--duration", "1", "--config", "missing.yaml"], "not found"),
        (["--duration", "1", "--namespace", "1bad"], "argument --namespace"),
        (["--duration", "1", "--memory-root", A_FILE], "no such directory"),
        (["--duration", "1", "--foxglove", "--foxglove-port", "70000"], "not a TCP port"),
        (["--duration", "1", "--foxglove-port", "8765"], "--foxglove-port needs --foxglove"),
        (["--duration", "1", "--record", A_FILE], "exists already"),
        (["--duration", "1", "--record", "/proc/dynnet-test.mcap"], "is not writable"),
        (["--duration", "1", "--record", "no-such-dir/out.mcap"], "does not exist"),
    ],
    "dynnet sim": [
        ([], "--record"),
        (["--record", A_FILE], "exists already"),
        (["--record", A_DIR], "exists already"),
        (["--record", "/proc/dynnet-test.mcap"], "is not writable"),
        (["--record", "out.mcap", "--format", "sqlite3"], "a .mcap output is an MCAP file"),
        (["--record", "out.db3"], "rosbag2 directory"),
        (["--record", "out.mcap", "--frames", "2", "--duration", "1"], "not allowed with argument"),
        (["--record", "out.mcap", "--rate", "100"], "rate_hz must be in 0.2..60"),
        (["--record", "out.mcap", "--resolutions", "640x480,8x8"], "outside 16..8192"),
        (["--record", "out.mcap", "--pedestrians", "9"], "argument --pedestrians"),
    ],
    "dynnet zoo build": [
        (["--out", A_FILE], "not a directory"),
        (["--json", "no-such-dir/x.json"], "does not exist"),
    ],
    "dynnet zoo info": [
        (["--runs", "0"], "argument --runs"),
        (["--threads", "-2"], "argument --threads"),
        (["--json", A_DIR], "is a directory"),
    ],
}

#: bad values for the argument types, by type (generic cases)
BAD_VALUES = {arguments.positive_int: "0", arguments.nonnegative_int: "-1", arguments.positive_float: "-1",
              arguments.model_spec: EMPTY, arguments.output_file: "no-such-dir/out.json", arguments.fraction: "1.5",
              arguments.tcp_port: "65536", arguments.bag_output: A_FILE, arguments.camera_resolutions: "640"}


def _leaves() -> dict[str, argparse.ArgumentParser]:
    """Sub-commands that run (no sub-commands of their own), by prog."""
    parsers = cli.command_parsers(cli.build_parser())
    return {p.prog: p for p in parsers if not cli.command_parsers(p)}


LEAVES = _leaves()


@pytest.fixture
def files(tmp_path, monkeypatch):
    """The placeholder files, caches in temporary directories, and the work dir to run in."""
    for name in CACHES:
        monkeypatch.setenv(name, str(tmp_path / "cache" / name.lower()))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["image"], ["out"])], "tiny",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3, "H", "W"])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(work / "tiny.onnx"))
    (work / "empty.onnx").write_bytes(b"")
    (work / "text.onnx").write_text("not a model\n")
    (work / "a_dir").mkdir()
    (work / "a_file").write_text("x\n")
    (work / "bad_p.yaml").write_text("width: {stages: 2, P: [0.5, 0.6]}\n")
    (work / "bad_i.yaml").write_text("width: {stages: 2, P: [0.5, 0.5], I: [[0, 1], [0, 0]]}\n")
    (work / "bad_p_map.yaml").write_text("partition: bad_p.yaml\nstages: [cpu0]\n")
    (work / "bad_i_map.yaml").write_text("partition: bad_i.yaml\nstages: [cpu0]\n")
    (work / "bad_unit.yaml").write_text("hardware: this-machine\nstages: [{unit: npu0}]\n")
    (work / "truncated.mcap").write_bytes(b"\x89MCAP0\r\n\x01\x00\x00\x00")  # the magic, then it stops
    (work / "corrupt.db3").write_text("not a database\n")
    return {TINY: "tiny.onnx", EMPTY: "empty.onnx", TEXT: "text.onnx", A_DIR: "a_dir", A_FILE: "a_file",
            BAD_P: "bad_p.yaml", BAD_I: "bad_i.yaml", BAD_P_MAP: "bad_p_map.yaml", BAD_I_MAP: "bad_i_map.yaml",
            BAD_UNIT: "bad_unit.yaml", TRUNCATED_BAG: "truncated.mcap", CORRUPT_BAG: "corrupt.db3",
            "cache": tmp_path / "cache"}


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error(prog: str, code: int, out: str, err: str, expected: str = "") -> None:
    assert code == 2, (code, err)
    assert out == "", f"work started before the error: {out!r}"
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith(f"{prog}: error: ") and len(last) > len(f"{prog}: error: "), err
    assert expected in last, (expected, last)
    assert sum("error:" in line for line in lines) == 1, err
    usage = lines[:-1]
    if usage:
        assert usage[0].startswith(f"usage: {prog} ") or usage[0] == f"usage: {prog}", err
        assert all(line.startswith(" ") for line in usage[1:]), err


def _argv(prog: str, args: list[str], files: dict) -> list[str]:
    return prog.split()[1:] + [files.get(a, a) for a in args]


def test_every_command_has_cases():
    assert set(LEAVES) == set(CASES), "every sub-command needs bad-input cases in CASES"
    assert all(len(cases) >= 2 for cases in CASES.values())


@pytest.mark.parametrize("prog,args,expected",
                         [(prog, args, expected) for prog, cases in CASES.items() for args, expected in cases],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_bad_input_is_one_line_and_exit_2(prog, args, expected, files, capsys):
    code, out, err = run_cli(_argv(prog, args, files), capsys)
    assert_one_error(prog, code, out, err, expected)
    assert not files["cache"].exists(), "a cache was written: the command did work before refusing"


@pytest.mark.parametrize("prog", sorted(LEAVES))
def test_unknown_flag_shows_the_subcommands_usage(prog, files, capsys):
    base = [TINY] if any(a.dest == "model" for a in LEAVES[prog]._actions) else []
    code, out, err = run_cli(_argv(prog, base + ["--no-such-flag"], files), capsys)
    assert_one_error(prog, code, out, err, "unrecognized arguments: --no-such-flag")
    assert err.startswith(f"usage: {prog}")


def _generic_cases() -> list[tuple[str, list[str], str]]:
    found = []
    for prog, parser in sorted(LEAVES.items()):
        needs_model = any(a.dest == "model" and not a.option_strings for a in parser._actions)
        for action in parser._actions:
            bad = BAD_VALUES.get(action.type)  # type: ignore[call-overload]
            if bad is None:
                continue
            if action.option_strings:
                args = ([TINY] if needs_model else []) + [action.option_strings[-1], bad]
                name = action.option_strings[-1]
            else:
                args, name = [bad], action.dest
            found.append((prog, args, f"argument {name}"))
    return found


@pytest.mark.parametrize("prog,args,expected", _generic_cases(),
                         ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_every_typed_argument_rejects_a_bad_value(prog, args, expected, files, capsys):
    code, out, err = run_cli(_argv(prog, args, files), capsys)
    assert_one_error(prog, code, out, err, expected)
    assert not files["cache"].exists()


@pytest.mark.parametrize("argv,prog", [(["swap"], "dynnet swap"), (["zoo"], "dynnet zoo"),
                                       (["nosuch"], "dynnet"), ([], "dynnet")])
def test_missing_or_unknown_command(argv, prog, files, capsys):
    code, out, err = run_cli(argv, capsys)
    assert_one_error(prog, code, out, err)


def test_the_installed_command_follows_the_rule(files, tmp_path):
    """The console script itself (not just ``cli.main``): exit 2, usage of the sub-command, one line."""
    script = Path(sys.executable).with_name("dynnet")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "dynnet_ros.cli"]
    proc = subprocess.run(command + ["swap", "bench", "zoo:lane", "--budgets", "100%", "--size", "240x320"],
                          capture_output=True, text=True, timeout=300)
    assert_one_error("dynnet swap bench", proc.returncode, proc.stdout, proc.stderr, "argument --size")
    assert not files["cache"].exists()
