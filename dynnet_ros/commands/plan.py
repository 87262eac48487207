"""`dynnet plan`: show what the planned engine does with a model — simplification, partitions,
execution order and the memory plan at one input shape (arena height vs the lower bound)."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import onnxruntime as ort

from dynnet_ros.bytesize import MB
from dynnet_ros.commands import arguments
from dynnet_ros.engine.backends.cpu_planned import create_planned_executor, timed_point
from dynnet_ros.engine.backends.cut_verdict import cut_verdict
from dynnet_ros.engine.backends.registry import load_for_backend
from dynnet_ros.engine.modelio import onnx_proto
from dynnet_ros.engine.plan.compile import reference_shapes
from dynnet_ros.engine.plan.graph import node_name
from dynnet_ros.engine.plan.memory_plan import greedy_by_size
from dynnet_ros.engine.plan.options import plan_profile
from dynnet_ros.engine.runtime.executor import PlannedExecutor
from dynnet_ros.zoo import resolve_model_spec


def build_report(model_spec: str, shapes: dict[str, tuple[int, ...]], granularity: str = "choose",
                 layout: str = "nchwc") -> dict:
    path = resolve_model_spec(model_spec)
    # the cut verdict Engine runs under (the profile's; timed under "auto", cached per model file)
    verdict = cut_verdict(path, None, layout, plan_profile()) if granularity == "choose" else None
    timing = (verdict or {}).get("timing")
    if verdict and verdict.get("fallback"):
        return {"model": path, "fallback": verdict["reason"], "cuts": verdict.get("cuts"), "timing": timing,
                "lean": verdict.get("lean", True), "lean_ratio": verdict.get("lean_ratio")}
    skeleton = load_for_backend("cpu", path)
    executor = create_planned_executor(skeleton, layout=layout, granularity=granularity, versions=False,
                                       **timed_point(verdict))
    if not isinstance(executor, PlannedExecutor):
        plan = executor.executor_stats().details.get("plan")
        executor.close()
        if plan is None:
            raise ValueError(f"the planned engine cannot run {path}; Engine would fall back to plain onnxruntime")
        return {"model": path, "fallback": plan["reason"], "cuts": plan["cuts"], "timing": timing,
                "lean": plan.get("lean", False), "lean_ratio": None}
    try:
        graph = executor.graph
        if not shapes:
            shapes = reference_shapes(graph, executor.options.reference_side)
        unknown = sorted(set(shapes) - set(graph.inputs))
        if unknown:
            raise ValueError(f"unknown input(s) {unknown}; the model takes {graph.inputs}")
        plan = executor.plan_for(shapes)
        buffers = executor.plan_buffers(plan)
        _, greedy_height = greedy_by_size(buffers) if buffers else ([], 0)
        report = executor.simplify_report.to_json() if executor.simplify_report else {}
        report["ort_extended_nodes"] = _ort_extended_nodes(path)
        return {
            "model": path,
            "input_shapes": {k: list(v) for k, v in shapes.items()},
            "shape_source": executor.shape_source.name,
            "simplify": report,
            "nodes": {"model": len(skeleton.graph.node), "planned_graph": executor.original_nodes,
                      "executed": len(graph.nodes),
                      "nchwc": sum(1 for n in graph.nodes if n.domain == "com.microsoft.nchwc")},
            "layout": executor.options.layout,
            "granularity": executor.granularity,
            "cuts": None if executor.cut_choice is None else executor.cut_choice.describe(),
            "timing": timing,
            "partitions": [s.describe(graph) for s in executor.segments],
            "order": [node_name(graph.nodes[n], n) for n in executor.order],
            "memory_plan": {
                "boundary_tensors": len(plan.slots),
                "in_arena": len(buffers),
                "left_to_onnxruntime": sum(1 for s in plan.slots.values() if s.offset is None),
                "arena_bytes": plan.height,
                "lower_bound_bytes": plan.lower_bound,
                "greedy_by_size_bytes": int(greedy_height),
                "planning_ms": round(plan.seconds * 1e3, 3),
            },
        }
    finally:
        executor.close()


def _ort_extended_nodes(path: str) -> int | None:
    """Nodes left in onnxruntime's own ORT_ENABLE_EXTENDED-optimised graph (for comparison)."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp, "opt.onnx"))
        options.log_severity_level = 3
        try:
            ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
            return len(onnx_proto.load(options.optimized_model_filepath, load_external_data=False).graph.node)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types; the comparison is optional
            print(f"onnxruntime's optimised graph is not counted: {type(exc).__name__}: {exc}", file=sys.stderr)
            return None


def _print_cuts(cuts: dict | None) -> None:
    """The cost model's latency-vs-memory curve (plan/cost_model.py) and the point chosen."""
    if not cuts:
        return
    reference = cuts["onnxruntime_activation_bytes"]
    print("cut sets considered (predicted at the reference shape; activations incl. 0.25 MB per session; "
          "1 (ort): one plain onnxruntime session; 1 (lean): one lean session):")
    print("      segments  latency ms  activation MB  x onnxruntime")
    for k, point in enumerate(cuts["curve"]):
        mark = "->" if k == cuts["chosen"] else "  "
        label = ("1 (lean)" if point.get("lean") else "1 (ort)") if point["single_session"] else str(point["segments"])
        ratio = point["activation_bytes"] / reference if reference else float("nan")
        print(f"  {mark} {label:>8s}  {point['latency_ms']:10.2f}  {point['activation_bytes'] / MB:13.2f}"
              f"  {ratio:13.2f}")
    print(f"chosen: {cuts['reason']}")


def _print_timing(timing: dict | None) -> None:
    """The points the "auto" profile timed against one plain onnxruntime session (cut_timing.py)."""
    if not timing:
        return
    if "error" in timing:
        print(f"not timed: {timing['error']}")
        return
    shapes = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in timing["shapes"].items())
    probes = ", ".join(f"{p['segments']} segments {p['ratio']:.3f}x" for p in timing["probes"])
    print(f"timed at {shapes} against one onnxruntime session (limit {timing['limit']:.2f}x, load "
          f"{timing['load_per_core']:.2f} per core): {probes}")


def _session_kind(report: dict) -> str:
    """How the single session is configured (runtime/ort_executor.py, OrtExecutor) and what timed it so."""
    ratio = report.get("lean_ratio")
    if report.get("lean"):
        timed = "" if ratio is None else f", timed {ratio:.3f}x onnxruntime's defaults"
        return f"lean: no memory patterns, arena blocks mapped afresh{timed}"
    timed = "" if ratio is None else f": lean timed {ratio:.3f}x"
    return f"onnxruntime's defaults, its own arena{timed}"


def _print(report: dict, show_order: bool) -> None:
    if "fallback" in report:
        print(f"model {report['model']}")
        _print_cuts(report["cuts"])
        _print_timing(report.get("timing"))
        print(f"verdict: {report['fallback']}")
        print(f"Engine runs this model as one plain onnxruntime session ({_session_kind(report)}); "
              "Engine.stats()['plan'] says so too")
        return
    simp, mem = report["simplify"], report["memory_plan"]
    print(f"model {report['model']}  (shapes from {report['shape_source']})")
    nodes = report["nodes"]
    print(f"layout: {report['layout']}" + (f" (onnxruntime's rewrite: {nodes['planned_graph']} nodes, "
                                           f"{nodes['nchwc']} on its NCHWc kernels)"
                                           if report["layout"] == "nchwc" else ""))
    print(f"nodes: {report['nodes']['model']} in the model -> {report['nodes']['executed']} executed "
          f"(onnxruntime's own EXTENDED graph: {report['simplify'].get('ort_extended_nodes')})")
    if simp:
        removed = ", ".join(f"{k} {v}" for k, v in simp["removed_by_pass"].items()) or "none"
        fused = ", ".join(f"{k} {v}" for k, v in simp["fused"].items()) or "none"
        print(f"simplification: removed {removed}; fused/rewritten {fused}")
        print(f"shape ops before {simp['shape_ops_before']} after {simp['shape_ops_after']}")
    _print_cuts(report["cuts"])
    _print_timing(report.get("timing"))
    print(f"partitions: {len(report['partitions'])} (granularity {report['granularity']})")
    for part in report["partitions"]:
        ops = ", ".join(part["nodes"][:6]) + (" ..." if len(part["nodes"]) > 6 else "")
        print(f"  [{part['index']:3d}] {part['label']:14s} {part['kind']:8s} {len(part['nodes']):3d} nodes: {ops}")
    if show_order:
        print("order: " + " -> ".join(report["order"]))
    lb = mem["lower_bound_bytes"]
    print(f"memory plan at {report['input_shapes']}: arena {mem['arena_bytes'] / MB:.2f} MB, lower bound "
          f"{lb / MB:.2f} MB ({(mem['arena_bytes'] / lb if lb else 1):.3f}x), greedy-by-size "
          f"{mem['greedy_by_size_bytes'] / MB:.2f} MB; {mem['in_arena']} tensors in the arena, "
          f"{mem['left_to_onnxruntime']} left to onnxruntime; planned in {mem['planning_ms']} ms")


def run(args: argparse.Namespace) -> int:
    model = resolve_model_spec(args.model)
    arguments.check_input_shapes(model, args.input_shape)
    report = build_report(model, dict(args.input_shape), args.granularity, args.layout)
    _print(report, args.order)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0
