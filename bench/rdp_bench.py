#!/usr/bin/env python3
"""RDP benchmark: analysis time and coverage vs onnx and onnxruntime shape inference.

For each zoo model and each `light` model of the onnx package (made as symbolic as
onnxruntime allows), the true shape of every intermediate tensor is taken from
onnxruntime at three input sizes.  A tool's answer for a tensor is *right* when
its dims evaluate to the true shape at every size, *wrong* when a dim it states
evaluates to something else, else unresolved.  Generated chains of 1k/10k/50k
nodes measure scaling.  Results go to stdout, a JSON file and (``--docs``) the
bench section of docs/rdp.md.

    nice -n 10 .venv/bin/python bench/rdp_bench.py --docs docs/rdp.md
"""
from __future__ import annotations

import argparse
import copy
import glob
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynnet_ros.engine.rdp import analyze  # noqa: E402
from dynnet_ros.engine.rdp.expr import evaluate  # noqa: E402

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


# ----------------------------------------------------------------- ground truth
def _session(model):
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _inputs(model):
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def runtime_shapes(model, size_sets):
    res = analyze(model)
    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have and res.tensors.get(o) is not None and res.tensors[o].dtype:
                m.graph.output.append(helper.make_tensor_value_info(o, res.tensors[o].dtype, None))
                have.add(o)
    sess = _session(m)
    names = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(0)
    out = []
    for shapes in size_sets:
        feed = {}
        for i in _inputs(model):
            shp = shapes[i.name]
            et = i.type.tensor_type.elem_type
            if et == TensorProto.FLOAT:
                feed[i.name] = (np.full(shp, 0.5, np.float32) if int(np.prod(shp)) == 1
                                else rng.random(shp).astype(np.float32))
            else:
                feed[i.name] = np.full(shp, 10, np.int64)
        vals = sess.run(names, feed)
        out.append({n: tuple(np.shape(v)) for n, v in zip(names, vals)})
    return out


def envs_for(size_sets, model):
    """Symbol -> value per size, from the declared dim_params."""
    envs = []
    for shapes in size_sets:
        env = {}
        for i in _inputs(model):
            for d, v in zip(i.type.tensor_type.shape.dim, shapes[i.name]):
                if d.HasField("dim_param"):
                    env[d.dim_param] = v
        envs.append(env)
    return envs


# ----------------------------------------------------------------- the three tools
def judge(dims_per_size, truths):
    """dims_per_size: list (per size) of tuple|None -> 'right'|'wrong'|'unresolved' per tensor."""
    wrong = False
    for dims, real in zip(dims_per_size, truths):
        if dims is None:
            return "unresolved"
        if len(dims) != len(real):
            return "wrong"
        for d, r in zip(dims, real):
            if d is None:
                return "unresolved" if not wrong else "wrong"
            if d != r:
                wrong = True
    return "wrong" if wrong else "right"


def tally(answers, truths_per_size):
    names = list(truths_per_size[0])
    c = {"right": 0, "wrong": 0, "unresolved": 0}
    for n in names:
        c[judge([answers(n, k) for k in range(len(truths_per_size))], [t[n] for t in truths_per_size])] += 1
    total = len(names)
    return {"coverage": 100.0 * c["right"] / total, "wrong": 100.0 * c["wrong"] / total, "tensors": total}


def ours(model, envs, truths, divisors=None, repeat=3):
    secs = float("inf")
    for _ in range(repeat):  # best of `repeat`: the machine is shared
        t0 = time.perf_counter()
        res = analyze(model, divisors=divisors)
        secs = min(secs, time.perf_counter() - t0)

    def ans(name, k):
        if name not in res.tensors:
            return None
        dims = res.tensor_dims(name)
        if dims is None:
            return None
        return tuple(None if d is None else evaluate(d, envs[k]) for d in dims)

    return {**tally(ans, truths), "seconds": secs}


def _vi_dims(model):
    out = {}
    for v in list(model.graph.value_info) + list(model.graph.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            out[v.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                           for d in v.type.tensor_type.shape.dim]
    return out


def onnx_infer(model, envs, truths, repeat=3):
    secs = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - reported as a crash
            return {"crash": f"{type(exc).__name__}: {str(exc)[:80]}", "seconds": time.perf_counter() - t0}
        secs = min(secs, time.perf_counter() - t0)
    dims = _vi_dims(inferred)

    def ans(name, k):
        if name not in dims:
            return None
        return tuple(d if isinstance(d, int) else envs[k].get(d) for d in dims[name])

    return {**tally(ans, truths), "seconds": secs}


def ort_infer(model, envs, truths, timeout_nodes=5000):
    try:
        import sympy
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as exc:
        return {"crash": f"unavailable: {exc}"}
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = SymbolicShapeInference.infer_shapes(copy.deepcopy(model), auto_merge=True)
    except Exception as exc:  # noqa: BLE001 - reported as a crash
        return {"crash": f"{type(exc).__name__}: {str(exc)[:80]}", "seconds": time.perf_counter() - t0}
    secs = time.perf_counter() - t0
    if inferred is None:
        return {"crash": "returned None", "seconds": secs}
    dims = _vi_dims(inferred)
    cache: dict = {}

    def ev(d, env):
        if isinstance(d, int) or d is None:
            return d
        key = (d, tuple(sorted(env.items())))
        if key not in cache:
            try:
                syms = {s: sympy.Symbol(s, integer=True, positive=True) for s in env}
                v = sympy.sympify(d, locals=syms).subs({syms[s]: val for s, val in env.items()})
                cache[key] = int(v) if v.is_integer else None
            except Exception:  # noqa: BLE001 - an expression we cannot evaluate is unresolved
                cache[key] = None
        return cache[key]

    def ans(name, k):
        if name not in dims:
            return None
        return tuple(ev(d, envs[k]) for d in dims[name])

    return {**tally(ans, truths), "seconds": secs}


# ----------------------------------------------------------------- model sets
def light_models():
    variants = [(True, True, (2, 160, 192), [(1, 224, 224), (2, 160, 192), (3, 256, 224)]),
                (True, False, (2, 224, 224), [(1, 224, 224), (2, 224, 224), (3, 224, 224)]),
                (False, True, (1, 160, 192), [(1, 224, 224), (1, 160, 192), (1, 256, 224)])]
    for p in sorted(glob.glob(str(LIGHT_DIR / "*.onnx"))):
        chosen = None
        for batch, spatial, probe, sizes in variants:
            m = onnx.load(p)
            x = _inputs(m)[0]
            dims = x.type.tensor_type.shape.dim
            if batch:
                dims[0].dim_param = "N"
            if spatial:
                dims[2].dim_param, dims[3].dim_param = "H", "W"
            for o in m.graph.output:
                o.type.tensor_type.ClearField("shape")
            try:
                _session(m).run(None, {x.name: np.zeros((probe[0], 3, probe[1], probe[2]), np.float32)})
                chosen = (m, sizes, ("N" if batch else "") + ("HW" if spatial else ""))
                break
            except Exception:  # noqa: BLE001 - onnxruntime rejects that size
                continue
        if chosen is None:
            m = onnx.load(p)
            chosen = (m, [(1, 224, 224)], "static")
        m, sizes, kind = chosen
        name = _inputs(m)[0].name
        yield f"{Path(p).stem} ({kind})", m, [{name: (n, 3, h, w)} for n, h, w in sizes], None


def zoo_models():
    from dynnet_ros.zoo import MODEL_NAMES, ensure_model

    for name in MODEL_NAMES:
        m = onnx.load(str(ensure_model(name)))
        sets = []
        for h, w in [(64, 96), (96, 64), (128, 160)]:
            s = {}
            for i in _inputs(m):
                dims = [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                s[i.name] = (1, dims[1], h, w) if len(dims) == 4 else tuple(d or 1 for d in dims)
            sets.append(s)
        yield f"zoo/{name}", m, sets, {"H": 32, "W": 32}


# ----------------------------------------------------------------- generated chains
def chain_model(n_nodes: int) -> onnx.ModelProto:
    """Blocks of 5 nodes: Conv -> Relu -> Shape -> Reshape(relu, shape) -> Add(prev)."""
    nodes = []
    w = numpy_helper.from_array(np.zeros((4, 4, 3, 3), np.float32), "w")
    cur = "x"
    i = 0
    while len(nodes) + 5 <= n_nodes:
        nodes += [helper.make_node("Conv", [cur, "w"], [f"c{i}"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"]),
                  helper.make_node("Shape", [f"r{i}"], [f"s{i}"]),
                  helper.make_node("Reshape", [f"r{i}", f"s{i}"], [f"h{i}"]),
                  helper.make_node("Add", [f"h{i}", cur], [f"a{i}"])]
        cur = f"a{i}"
        i += 1
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def bench_chains(sizes, with_others: int):
    rows = []
    for n in sizes:
        m = chain_model(n)
        ours_s = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            res = analyze(m)
            ours_s = min(ours_s, time.perf_counter() - t0)
        row = {"nodes": len(m.graph.node), "ours": ours_s, "nac": res.to_json()["stats"]["nac"]}
        if n <= with_others:
            t0 = time.perf_counter()
            onnx.shape_inference.infer_shapes(m, data_prop=True)
            row["onnx"] = time.perf_counter() - t0
            try:
                from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

                t0 = time.perf_counter()
                SymbolicShapeInference.infer_shapes(m, auto_merge=True)
                row["ort"] = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                row["ort"] = f"crash: {type(exc).__name__}"
        rows.append(row)
        print(f"chain {row}", flush=True)
    return rows


# ----------------------------------------------------------------- report
def fmt(r):
    if "crash" in r:
        return "crash", "", f"{r.get('seconds', 0):.2f}" if "seconds" in r else ""
    return f"{r['coverage']:.1f}", f"{r['wrong']:.1f}", f"{r['seconds']:.3f}"


def markdown(rows, chains, command):
    lines = [f"Made with `{command}` (one run on the development machine, 2 shared cores).", "",
             "RDP times are the best of 3 runs, onnx's too; ORT-sym runs once. \"RDP no-hint\" is RDP's "
             "coverage without the zoo's multiple-of-32 promise.", "",
             "| model | tensors | RDP cov % | RDP wrong % | RDP s | RDP no-hint cov % | onnx cov % | onnx wrong % "
             "| onnx s | ORT-sym cov % | ORT-sym wrong % | ORT-sym s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        o, x, s = fmt(r["ours"]), fmt(r["onnx"]), fmt(r["ort"])
        plain = f"{r['ours_plain']['coverage']:.1f}" if "ours_plain" in r else "="
        lines.append(f"| {r['model']} | {r['ours'].get('tensors', '')} | {o[0]} | {o[1]} | {o[2]} | {plain} | {x[0]} "
                     f"| {x[1]} | {x[2]} | {s[0]} | {s[1]} | {s[2]} |")
    lines += ["", "Generated chains (Conv → Relu → Shape → Reshape → Add blocks, symbolic N, H, W):", "",
              "| nodes | RDP s | RDP µs/node | onnx s | ORT-sym s |", "|---|---|---|---|---|"]
    for c in chains:
        ort_s = c.get("ort", "—")
        lines.append(f"| {c['nodes']} | {c['ours']:.3f} | {1e6 * c['ours'] / c['nodes']:.0f} | "
                     f"{c['onnx']:.3f} | " if "onnx" in c else f"| {c['nodes']} | {c['ours']:.3f} | "
                     f"{1e6 * c['ours'] / c['nodes']:.0f} | — | ")
        lines[-1] += (f"{ort_s:.3f} |" if isinstance(ort_s, float) else f"{ort_s} |")
    for c in chains:
        if c["nac"]:
            lines.append(f"\n(chain of {c['nodes']} nodes: {c['nac']} nac tensors)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chains", default="1000,10000,50000")
    ap.add_argument("--others-up-to", type=int, default=10000, help="largest chain given to onnx/ORT too")
    ap.add_argument("--json", default=str(ROOT / "build" / "rdp-bench.json"))
    ap.add_argument("--docs", help="rewrite the bench section of this Markdown file (docs/rdp.md)")
    ap.add_argument("--no-zoo", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    sets = list(light_models())
    if not args.no_zoo:
        sets = list(zoo_models()) + sets
    for label, model, size_sets, divisors in sets:
        truths = runtime_shapes(model, size_sets)
        envs = envs_for(size_sets, model)
        row = {"model": label, "ours": ours(model, envs, truths, divisors), "onnx": onnx_infer(model, envs, truths),
               "ort": ort_infer(model, envs, truths)}
        if divisors:
            row["ours_plain"] = ours(model, envs, truths, None, repeat=1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    chains = bench_chains([int(x) for x in args.chains.split(",") if x], args.others_up_to)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"models": rows, "chains": chains}, indent=1))
    cmd = "nice -n 10 .venv/bin/python bench/rdp_bench.py" + (f" --docs {args.docs}" if args.docs else "")
    md = markdown(rows, chains, cmd)
    print(md)
    if args.docs:
        p = Path(args.docs)
        text = p.read_text() if p.exists() else ""
        start, end = "<!-- bench:start -->", "<!-- bench:end -->"
        if start in text and end in text:
            text = text[:text.index(start) + len(start)] + "\n" + md + text[text.index(end):]
        else:
            text += f"\n{start}\n{md}{end}\n"
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
