"""`dynnet map search`: NSGA-II over stage mappings (with a model) or layer-group chains (profile only)."""
from __future__ import annotations

import argparse
import functools
import json
from dataclasses import asdict, replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from dynnet_ros.commands import CommandError
from dynnet_ros.commands._search_inputs import cached_profile, frames, model_stages
from dynnet_ros.engine.backends.trt_cache import model_sha256
from dynnet_ros.engine.rdp import analyze
from dynnet_ros.mapper.advice import no_early_exit, no_exit_taken, one_stage_guard
from dynnet_ros.mapper.choices import (
    Constraints,
    SearchChoices,
    cache_file,
    covering_set,
    write_choices,
)
from dynnet_ros.mapper.exit_heads import agrees, model_task
from dynnet_ros.mapper.hardware import load_hardware
from dynnet_ros.mapper.model_search import (
    WidthSpace,
    calibrate,
    fit_surrogate,
    measure_mappings,
    measured_costs,
    split_layers,
    stage_costs,
    to_mapping,
)
from dynnet_ros.mapper.nsga import run_search
from dynnet_ros.mapper.partition import WidthSpec
from dynnet_ros.mapper.plot import plot_pareto
from dynnet_ros.mapper.profile_io import combine, read_profile
from dynnet_ros.mapper.profiler import measure_stages, stage_feeds
from dynnet_ros.mapper.runtime_cache import KeptCosts, costs_file, search_costs, write_costs
from dynnet_ros.mapper.runtime_costs import Observation, contention_matters, fit_runtime_costs, relative_errors
from dynnet_ros.mapper.search import NEVER, ChainSpace, StageSpace, pick
from dynnet_ros.mapper.stages import StageSet
from dynnet_ros.mapper.system_model import RuntimeCosts
from dynnet_ros.mapper.width import width_stages
from dynnet_ros.settings import settings


def run(args: argparse.Namespace) -> int:
    console = Console()
    hardware = load_hardware(args.hw)
    if bool(args.profile) == (args.model is not None):
        raise CommandError("give either a MODEL or --profile FILE (profile-only search)")
    if args.width is not None and not 2 <= args.width <= len(hardware.units):
        raise CommandError(f"--width {args.width}: a width split needs 2 to {len(hardware.units)} stages "
                           f"(one per unit of {hardware.name}; stages run side by side on distinct units)")
    report: dict = {"hardware": hardware.name, "hardware_source": hardware.source}
    memory = _memory_limits(args.memory_mb, hardware)
    map_dir = settings().cache.map_dir
    used = search_costs(map_dir, hardware, args.runtime_costs)
    report.update(used.to_json())
    extra = []
    if args.profile:
        profile = combine([read_profile(spec, hardware) for spec in args.profile], hardware)
        space: ChainSpace | StageSpace | WidthSpace = ChainSpace(hardware, profile, deadline_ms=args.deadline_ms,
                                                                    runtime=used.costs)
        report.update(kind="chain", profile=[str(p) for p in args.profile], energy=profile.power_label())
        base_accuracy = 1.0
    else:
        path, model, stage_set = model_stages(args.model)
        size = f"{args.size[0]}x{args.size[1]}"
        calibration_frames = frames(model, args.size, args.frames, npz=args.calibration)
        console.print(f"{len(stage_set.stages)} stages; profiling at {size} (cached per model + hardware) …")
        if args.width is None and no_early_exit(stage_set):
            console.print(f"[yellow]{no_early_exit(stage_set)}[/yellow]")
        profile, cache, hit, skipped, notes = cached_profile(path, stage_set, hardware, calibration_frames[:1],
                                                             [size], args.repeats, not args.no_layers)
        for line in skipped + notes:
            console.print(line)
        learned = model_task(model)        # learned exits (`map exits`) say how their answers agree
        calibration = calibrate(stage_set, calibration_frames,
                                agree=None if learned is None else functools.partial(agrees, learned))
        surrogate = fit_surrogate(profile, hardware, seed=args.seed)
        costs = stage_costs(stage_set, profile, hardware, size, calibration,
                            stage_feeds(stage_set, calibration_frames[0]), surrogate)
        space = StageSpace(hardware, costs, calibration.exits, deadline_ms=args.deadline_ms, memory_mb=memory,
                           runtime=used.costs)
        base_accuracy = calibration.exits.base_accuracy
        depth_set = stage_set
        if args.width is not None:
            extra.extend(space.baselines())
            space, built = _width_space(args, model, hardware, calibration_frames, surrogate, profile.units, memory,
                                        used.costs)
            base_accuracy = 1.0
        report.update(kind="stages", model=path, size=size, profile_cache=str(cache), energy=profile.power_label(),
                      calibration_frames=len(calibration_frames),
                      surrogate=[{"unit": a.unit, "r2": a.r2, "mape": a.mape} for a in
                                 (surrogate.report if surrogate is not None else ())])
    if used.warning:
        console.print(f"[yellow]warning:[/yellow] {used.warning}")
    console.print(f"runtime costs: {used.source}")
    with Progress(TextColumn("NSGA-II"), BarColumn(), TextColumn("gen {task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("search", total=args.generations)
        result = run_search(space, generations=args.generations, population=args.population, seed=args.seed,
                            on_generation=lambda gen: bar.update(task, completed=gen))
    chosen = pick(result, args.prefer, args.max_accuracy_drop, base_accuracy)
    if isinstance(space, (StageSpace, WidthSpace)):
        guarded, advice = one_stage_guard(chosen, list(result.pareto) if isinstance(space, StageSpace) else extra,
                                          base_accuracy, args.max_accuracy_drop)
        if advice:
            report["advice"] = advice
            console.print(f"[yellow]{advice}[/yellow]")
            if not args.allow_slower_than_one_stage:
                chosen = guarded
        idle = no_exit_taken(chosen)
        if idle:
            report["advice"] = " ".join(filter(None, [report.get("advice"), idle]))
            console.print(f"[yellow]{idle}[/yellow]")
    if isinstance(space, StageSpace):
        extra.append(space.static(chosen))
        kept, cache = _keep_choices(path, hardware, size, base_accuracy, memory, args, result, chosen,
                                    used.to_json())
        report["search_cache"] = str(cache)
        console.print(f"kept {kept} candidates for `mapping: auto` in {cache}")
    elif isinstance(space, WidthSpace):
        stage_set = built[chosen.partition] if chosen.partition else depth_set
    report.update(pick=dict(chosen.to_json(), rule=f"prefer {args.prefer}, accuracy drop <= {args.max_accuracy_drop}"),
                  pareto=[c.to_json() for c in result.pareto],
                  baselines=[c.to_json() for c in list(result.baselines) + extra],
                  search={"seed": result.seed, "generations": result.generations, "population": result.population,
                          "evaluated": result.evaluated, "feasible": result.feasible,
                          "seconds": round(result.seconds, 3)})
    console.print(f"{result.evaluated} candidates evaluated ({result.feasible} feasible) in {result.seconds:.1f} s; "
                  f"Pareto set {len(result.pareto)}")
    for c in list(result.baselines) + extra:
        console.print(f"  {c.label:>14}: {c.latency_ms:8.3f} ms {c.energy_mj:9.3f} mJ  accuracy {c.accuracy:.3f}")
    console.print(f"  {'pick':>14}: {chosen.latency_ms:8.3f} ms {chosen.energy_mj:9.3f} mJ  accuracy "
                  f"{chosen.accuracy:.3f}  {dict(chosen.assignment)}")
    if isinstance(space, (StageSpace, WidthSpace)):
        mapping = to_mapping(chosen, stage_set, hardware)
        if args.mapping:
            data = mapping.to_json()
            data["hardware"] = args.hw
            args.mapping.write_text(yaml.safe_dump(data, sort_keys=False))
            console.print(f"wrote {args.mapping}")
        if args.measure:
            bases = [b for b in list(result.baselines) + extra if b.partition is None]
            if isinstance(space, StageSpace):
                bases.extend(_crossing(space))
            runs = [(stage_set, mapping)] + [(depth_set, to_mapping(b, depth_set, hardware)) for b in bases]
            results = measure_mappings(runs, calibration_frames)
            errors = []
            report["measured_baselines"] = {}
            for label, candidate, got in zip(["pick"] + [b.label for b in bases], [chosen] + bases, results):
                error = abs(candidate.latency_ms - got["min_ms"]) / got["min_ms"]
                errors.append(error)
                entry = dict(got, predicted_ms=candidate.latency_ms, error=error)
                if label == "pick":
                    report["measured"] = entry
                else:
                    report["measured_baselines"][label] = entry
                console.print(f"  {label:>14}: measured {got['min_ms']:.3f} ms in the stage runtime (min of "
                              f"rounds; mean {got['mean_ms']:.3f}), predicted {candidate.latency_ms:.3f} ms, "
                              f"error {error:.1%}; exits {got['exit_rates']}")
            report["measured_mape"] = sum(errors) / len(errors)
            console.print(f"MAPE of predicted vs measured latency over {len(errors)} mappings: "
                          f"{report['measured_mape']:.1%}")
            if isinstance(space, StageSpace) and bases:
                _calibrated_pick(space, chosen, bases, results, report, console)
                _keep_runtime_costs(space, [chosen] + bases, results, path, map_dir, report, console)
    if args.png:
        title = f"{report.get('model', 'profile')} on {hardware.name} (energy {report['energy']})"
        plot_pareto(result, chosen, args.png, Path(title).name if "/" in title else title, extra)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _keep_choices(path: str, hardware, size: str, base_accuracy: float, memory: dict[str, float],
                  args: argparse.Namespace, result, chosen, runtime_costs: dict) -> tuple[int, Path]:
    """Cache the candidates a later pick under another budget may need (``mapper.choices``)."""
    model_bytes = Path(path).read_bytes()
    rule = Constraints(memory, args.deadline_ms, args.prefer, args.max_accuracy_drop, args.allow_slower_than_one_stage)
    choices = SearchChoices(model_sha256(model_bytes), hardware.name, size, base_accuracy, rule,
                            tuple(covering_set(result.everything)), chosen, runtime_costs)
    cache = cache_file(settings().cache.map_dir, model_bytes, hardware)
    write_choices(cache, choices)
    return len(choices.candidates), cache


def _crossing(space: StageSpace) -> list:
    """Two calibration mappings whose stages alternate between the first two units every stage
    may use, starting on either (no early exit): the measured mappings then include handing
    features between units, so the handoff cost can be fitted even when the pick is one of them.
    None when fewer than two such units, or one stage."""
    count = len(space.stages.names)
    common = [u for u in space.hardware.unit_names if all(u in allowed for allowed in space.stages.allowed)]
    if count < 2 or len(common) < 2:
        return []
    out = []
    for first, label in ((0, "alternating"), (1, "alternating-flipped")):
        units = [common[(k + first) % 2] for k in range(count)]
        levels = {u: space.hardware.unit(u).default_dvfs for u in dict.fromkeys(units)}
        out.append(space.score(units, levels, [NEVER] * (count - 1), label=label))
    return out


def _calibrated_pick(space: StageSpace, chosen, bases, results, report: dict, console: Console) -> None:
    """The runtime costs (dispatch, handoff, slowdown; contention where a baseline runs two units
    at once) fitted to the measured baselines other than the pick's own mapping, and the pick's
    prediction with them: a held-out figure."""
    same = (chosen.assignment, chosen.dvfs, chosen.exit_rates)
    observations = [Observation(space.graph([u for _, u in b.assignment], dict(b.dvfs)), b.exit_rates, got["min_ms"])
                    for b, got in zip(bases, results[1:]) if (b.assignment, b.dvfs, b.exit_rates) != same]
    if not observations:
        console.print("  no measured mapping other than the pick's own: the runtime costs are not fitted")
        return
    fitted = fit_runtime_costs(observations, space.hardware,
                               None if contention_matters(observations, space.hardware) else [1.0])
    calibrated = replace(space, runtime=fitted).score([u for _, u in chosen.assignment], dict(chosen.dvfs),
                                                      chosen.thresholds)
    predicted = calibrated.latency_ms
    measured = report["measured"]["min_ms"]
    report["measured"].update(runtime_costs=asdict(fitted), predicted_calibrated_ms=predicted,
                              calibrated_error=abs(predicted - measured) / measured)
    console.print(f"  runtime costs fitted to the baselines: dispatch {fitted.dispatch_ms:.3f} ms, handoff "
                  f"{fitted.handoff_ms:.3f} ms, slowdown {fitted.slowdown:.2f}, contention {fitted.contention:.2f}; "
                  f"the pick: predicted {predicted:.3f} ms, measured {measured:.3f} ms "
                  f"(error {report['measured']['calibrated_error']:.1%})")


def _keep_runtime_costs(space: StageSpace, candidates: list, results: list[dict], model_path: str, map_dir: Path,
                        report: dict, console: Console) -> None:
    """Fit the runtime costs to every measured mapping (the pick's included) and keep them for
    the hardware, so later searches on it predict with them (``mapper.runtime_cache``)."""
    observations = [Observation(space.graph([u for _, u in c.assignment], dict(c.dvfs)), c.exit_rates, got["min_ms"])
                    for c, got in zip(candidates, results)]
    fitted = fit_runtime_costs(observations, space.hardware,
                               None if contention_matters(observations, space.hardware) else [1.0])
    mape = float(relative_errors(observations, space.hardware, fitted).mean())
    kept = KeptCosts(fitted, space.hardware.name, f"dynnet map search --measure, {Path(model_path).name}",
                     len(observations), mape)
    path = costs_file(map_dir, space.hardware)
    write_costs(path, kept)
    report["runtime_costs_kept"] = dict(kept.to_json(), file=str(path))
    console.print(f"  kept the runtime costs fitted to all {len(observations)} measured mappings (fit error "
                  f"{mape:.1%}) for later searches on {space.hardware.name}: {path}")


def _memory_limits(specs: list[str], hardware) -> dict[str, float]:
    """``UNIT=MB`` options -> {unit: MB}; CommandError naming a bad one."""
    limits = {}
    for spec in specs:
        unit, sep, value = spec.partition("=")
        try:
            hardware.unit(unit.strip())
            mb = float(value)
        except ValueError as exc:
            raise CommandError(f"--memory-mb {spec}: {exc if sep else 'expected UNIT=MB'}") from None
        if not mb > 0:
            raise CommandError(f"--memory-mb {spec}: the memory must be positive")
        limits[unit.strip()] = mb
    return limits


def _width_space(args: argparse.Namespace, model, hardware, calibration_frames, surrogate, units,
                 memory: dict[str, float], runtime: RuntimeCosts | None) -> tuple[WidthSpace, dict[str, StageSet]]:
    """The width-split space; each distinct (P, I) is built (probe exits fitted on the calibration
    frames), calibrated, and its stages timed on each unit (the cost model scales them to other
    DVFS levels)."""
    rdp = analyze(model)
    even = tuple([1.0 / args.width] * args.width)
    no_reuse = tuple(tuple(0 for _ in range(args.width)) for _ in range(args.width))
    trial = width_stages(model, WidthSpec(args.width, even, {}, no_reuse), None, rdp=rdp)
    p_layers, i_layers = split_layers(trial)
    built: dict[str, StageSet] = {}
    usable = [u for u in units if u in hardware.unit_names]

    def build(spec: WidthSpec):
        stage_set = width_stages(model, spec, calibration_frames, rdp=rdp)
        built[json.dumps(spec.to_json(), sort_keys=True)] = stage_set
        calibration = calibrate(stage_set, calibration_frames)
        measured = measure_stages(stage_set, hardware, usable, calibration_frames[0], repeats=args.repeats)
        costs = measured_costs(stage_set, calibration, stage_feeds(stage_set, calibration_frames[0]), hardware,
                               measured, surrogate)
        return costs, calibration.exits
    space = WidthSpace(hardware, p_layers, i_layers, args.width, build, reuse_cap=args.reuse_cap,
                       deadline_ms=args.deadline_ms, memory_mb=memory, runtime=runtime)
    return space, built
