"""Planned engine vs plain onnxruntime on the zoo and the real-model corpus, fresh process per side.

Each measurement is a worker process (``--worker``) that imports everything, takes its baseline,
loads the model (``Engine`` or an ``InferenceSession`` with default options, same threads), runs
the model's feed sequence once, then again until a second has passed, and reports:

- total peak: VmHWM above the baseline, model load included;
- activation peak: the total peak less the model's weight bytes (both sides hold the weights
  once; VmHWM growth after loading would miss what onnxruntime's arena takes from heap pages
  its load freed);
- first-run latency (the first inference after loading) and steady latency (mean wall time of the
  second pass, which repeats the sequence for at least a second), plus CPU time per run of it.

Corpus models are built with the ``input_shapes`` test/_corpus.py gives them (the size their
application feeds, what a node passes); zoo models at the planner's default reference size.

Sides alternate (ours, onnxruntime, ours, ...) and each figure is the minimum over ``--repeats``.
The output is self-describing: a JSON file with the machine's state (load average, cores,
onnxruntime version, the command) and a markdown table (docs/measurements.md, "Engine vs
onnxruntime: every run").
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ZOO = ("lane", "pedestrian", "depth", "gated", "multiexit")
STEADY_MIN_S = 1.0  # the steady pass repeats the feed sequence until this much wall time has passed


def _corpus():
    sys.path.insert(0, str(REPO / "test"))
    import _corpus  # test helper module, found through the path set just above
    return _corpus


def model_path(name: str) -> str:
    if name.startswith("zoo:"):
        from dynnet_ros.zoo import resolve_model_spec  # keeps the parent's imports light
        return resolve_model_spec(name)
    path = _corpus().by_name(name).path()
    if path is None:
        raise SystemExit(f"corpus model {name} is not installed")
    return str(path)


def feed_sequence(name: str, samples: int, seed: int) -> list[dict[str, np.ndarray]]:
    """The same feeds for both sides: zoo models over image sizes 224..640, corpus models over
    their own feeds (test/_corpus.py), cycled to ``samples``."""
    rng = np.random.default_rng(seed)
    if name.startswith("zoo:"):
        from dynnet_ros.commands.bench import make_feeds
        from dynnet_ros.commands.parsers.bench import ShapeSpec
        from dynnet_ros.engine.modelio.models import input_specs, load_model
        specs = input_specs(load_model(model_path(name), check=False, external_data=False))
        pairs = ShapeSpec(sides=tuple(range(224, 641, 32))).sequence(samples, seed)
        return [make_feeds(specs, h, w, rng) for h, w in pairs]
    feeds = _corpus().by_name(name).feeds(rng)
    return [feeds[k % len(feeds)] for k in range(samples)]


def worker(name: str, side: str, threads: int, samples: int, seed: int) -> dict:
    import onnxruntime as ort  # imported before the baseline in both sides

    from dynnet_ros.engine import Engine
    from dynnet_ros.procmem import reset_peak_rss, status_bytes
    path = model_path(name)
    feeds = feed_sequence(name, samples, seed)
    reset_peak_rss()
    base = status_bytes("VmRSS")
    start = time.perf_counter()
    if side == "engine":
        # a corpus model is sized as its application feeds it (text lines 48 pixels high), as a
        # node passes the size it will feed; zoo models at the planner's default reference size
        shapes = None if name.startswith("zoo:") else _corpus().by_name(name).input_shapes
        engine = Engine(path, threads=threads, input_shapes=shapes)
        run = engine.run
    else:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        run = lambda f: session.run(None, f)  # noqa: E731
    load_s = time.perf_counter() - start
    load_peak = status_bytes("VmHWM") - base
    reset_peak_rss()
    after_load = status_bytes("VmRSS")
    first = []
    for f in feeds:
        t0 = time.perf_counter()
        run(f)
        first.append(time.perf_counter() - t0)
    c0, t0 = time.process_time(), time.perf_counter()
    runs = 0
    while runs == 0 or time.perf_counter() - t0 < STEADY_MIN_S:  # sub-millisecond models: enough runs to time
        for f in feeds:
            run(f)
        runs += len(feeds)
    steady_s = (time.perf_counter() - t0) / runs
    cpu_s = (time.process_time() - c0) / runs
    run_peak = status_bytes("VmHWM")
    result = {"model": name, "side": side, "load_s": load_s, "first_run_ms": first[0] * 1e3,
              "first_pass_ms": float(np.mean(first)) * 1e3, "steady_ms": steady_s * 1e3, "cpu_ms": cpu_s * 1e3,
              "total_peak_mb": max(load_peak, run_peak - base) / 2**20,
              "activation_peak_mb": (run_peak - after_load) / 2**20}
    if side == "engine":
        stats = engine.stats()
        plan = stats.get("plan") or {}
        result.update(executor=stats["executor"], segments=plan.get("segments"),
                      fallback=bool(plan.get("fallback")), lean=plan.get("lean"), lean_ratio=plan.get("lean_ratio"),
                      cut_reason=plan.get("reason") or (plan.get("cuts") or {}).get("reason"),
                      timing=plan.get("timing"))
    return result


def measure(name: str, threads: int, samples: int, seed: int, repeats: int) -> dict:
    runs: dict[str, list[dict]] = {"engine": [], "onnxruntime": []}
    for _ in range(repeats):
        for side in runs:
            proc = subprocess.run([sys.executable, __file__, "--worker", name, side, str(threads), str(samples),
                                   str(seed)], capture_output=True, text=True, cwd=REPO, check=False)
            if proc.returncode != 0:
                error = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                print(f"{name}: {side} failed: {error}", flush=True)
                return {"model": name, "error": f"{side}: {error}"}
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return summarise(name, runs)


def summarise(name: str, runs: dict[str, list[dict]]) -> dict:
    """Minimum over the repeats per side and figure; activation = total peak less the weights."""
    best = {}
    for side, results in runs.items():
        best[side] = {k: min(r[k] for r in results) if isinstance(results[0][k], float) else results[0][k]
                      for k in results[0]}
    e, o = best["engine"], best["onnxruntime"]
    for side in (e, o):
        side["weights_mb"] = weights_mb(name)
        side["activation_peak_mb"] = max(0.0, side["total_peak_mb"] - side["weights_mb"])
    ratios = {k: e[k] / o[k] if o[k] else None for k in
              ("activation_peak_mb", "total_peak_mb", "steady_ms", "cpu_ms", "first_run_ms")}
    return {"model": name, "engine": e, "onnxruntime": o, "ratios": ratios, "all_runs": runs}


def weights_mb(name: str) -> float:
    """Bytes of the model's initializers and Constant tensors (paddle2onnx stores weights as either)."""
    import onnx
    from onnx import numpy_helper
    def tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
        found = list(graph.initializer)
        for node in graph.node:
            for attr in node.attribute:
                if attr.name == "value" and node.op_type == "Constant":
                    found.append(attr.t)
                found += [t for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs))
                          for t in tensors(g)]
        return found

    return sum(numpy_helper.to_array(t).nbytes for t in tensors(onnx.load(model_path(name)).graph)) / 2**20


def _runs_as(engine: dict) -> str:
    """How our side ran: its segments, or the single session (lean or onnxruntime's defaults, and
    the lean session's timing where the verdict took one)."""
    if not engine.get("fallback"):
        return f"{engine.get('segments')} segments"
    kind = "one lean session" if engine.get("lean") else "one session, onnxruntime's defaults"
    ratio = engine.get("lean_ratio")
    return kind + ("" if ratio is None else f" (lean timed {ratio:.2f}x)")


def markdown(results: list[dict], meta: dict) -> str:
    fresh = " (verdicts taken in this run)" if meta.get("fresh_verdicts") else ""
    lines = [f"Measured {meta['utc']} on {meta['cpus']} cores, load average {meta['loadavg_before']} before / "
             f"{meta['loadavg_after']} after, onnxruntime {meta['onnxruntime']}, {meta['threads']} threads per side, "
             f"{meta['samples']} feeds, a first pass and a steady one of at least {STEADY_MIN_S:.0f} s, "
             f"min of {meta['repeats']} fresh processes per side, planner profile "
             f"{meta.get('plan_profile', 'memory')}{fresh}.",
             f"Command: `{meta['command']}`", "",
             "| model | ours runs as | activation peak MB ours / ORT (ratio) | total peak MB ours / ORT (ratio) | "
             "steady ms ours / ORT (ratio) | CPU ms per run (ratio) | first run ms ours / ORT (ratio) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | fails: {r['error'][:160]} | — | — | — | — | — |")
            continue
        e, o, q = r["engine"], r["onnxruntime"], r["ratios"]
        runs_as = _runs_as(e)
        probes = (e.get("timing") or {}).get("probes")
        if probes:  # the auto profile's timed verdict: what it ran against one session
            runs_as += "; timed " + ", ".join(f"{p['segments']} segments {p['ratio']:.2f}x" for p in probes)

        cells = [f"{e[k]:.1f} / {o[k]:.1f} (**{q[k]:.2f}**)" if q[k] is not None else "—"
                 for k in ("activation_peak_mb", "total_peak_mb", "steady_ms", "cpu_ms", "first_run_ms")]
        lines.append(f"| {r['model']} | {runs_as} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--table":  # rebuild the table from a JSON this script wrote
        data = json.loads(Path(sys.argv[2]).read_text())
        data["results"] = [r if "error" in r else summarise(r["model"], r["all_runs"]) for r in data["results"]]
        Path(sys.argv[2]).write_text(json.dumps(data, indent=1))
        print(markdown(data["results"], data["meta"]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        name, side, threads, samples, seed = sys.argv[2:7]
        print(json.dumps(worker(name, side, int(threads), int(samples), int(seed))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for engine_vs_ort.json and engine_vs_ort.md")
    parser.add_argument("--models", default=",".join([f"zoo:{m}" for m in ZOO] + ["corpus"]),
                        help="comma-separated zoo:NAME or corpus model names; 'corpus' = every installed one")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--fresh-verdicts", action="store_true",
                        help="a cache of this run's own (OUT/layout-cache): the cost table and the planner's "
                             "cut verdicts (timed under the auto profile) are taken anew, in this run's conditions")
    args = parser.parse_args()
    if args.fresh_verdicts:
        os.environ["DYNNET_LAYOUT_DIR"] = str((args.out / "layout-cache").resolve())  # the workers inherit it
    names: list[str] = []
    for item in args.models.split(","):
        names += [m.name for m in _corpus().available_models()] if item == "corpus" else [item]
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime as ort
    meta = {"utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpus": os.cpu_count(), "machine": platform.platform(), "onnxruntime": ort.__version__,
            "loadavg_before": " ".join(f"{v:.1f}" for v in os.getloadavg()), "threads": args.threads,
            "samples": args.samples, "repeats": args.repeats,
            "plan_profile": os.environ.get("DYNNET_PLAN_PROFILE", "auto (default)"),
            "fresh_verdicts": args.fresh_verdicts,
            "command": " ".join(["bench/engine_vs_ort.sh"] + sys.argv[1:])}
    results = []
    for name in names:
        results.append(measure(name, args.threads, args.samples, args.seed, args.repeats))
        if "error" in results[-1]:
            continue
        r = results[-1]["ratios"]
        print(f"{name}: activation {r['activation_peak_mb']:.2f}x, total {r['total_peak_mb']:.2f}x, "
              f"steady {r['steady_ms']:.2f}x, cpu {r['cpu_ms']:.2f}x, first run {r['first_run_ms']:.2f}x", flush=True)
    meta["loadavg_after"] = " ".join(f"{v:.1f}" for v in os.getloadavg())
    (args.out / "engine_vs_ort.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    table = markdown(results, meta)
    (args.out / "engine_vs_ort.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

