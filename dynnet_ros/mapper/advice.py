"""When stages do not pay, and the mapper's advice then: run the model as one stage.

Why a module of its own: stages gain only where an early exit answers (or where width-wise
stages run side by side); without one, every cut adds a hand-off and a dispatch to the same
computation. ``map stages``, ``map run`` and ``map search`` say so with the same words.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types only: a node's cached pick (choices.py) needs neither module loaded
    from .search import Candidate
    from .stages import StageSet

ONE_STAGE = ("one stage is faster: run the model unmapped (a node's `mapping` empty), or learn early exits "
             "with `dynnet map exits`")


def early_exits(stage_set: StageSet) -> list[int]:
    """The stages before the last whose exit can answer (a criterion, an answer)."""
    return [s.index for s in stage_set.stages[:-1] if s.exit.answer != "none" and s.exit.criterion != "none"]


def no_early_exit(stage_set: StageSet) -> str | None:
    """Why ``stage_set``'s stages cannot pay, or None: a depth-wise set without an early exit
    computes what one stage does, plus a hand-off per cut."""
    if stage_set.kind != "depth" or len(stage_set.stages) < 2 or early_exits(stage_set):
        return None
    return (f"stages do not pay here: no stage before the last has an exit that can answer, so the "
            f"{len(stage_set.stages)} stages compute what one stage does and add {len(stage_set.stages) - 1} "
            f"hand-off(s); {ONE_STAGE}")


def never_early(stage_set: StageSet, histogram: Mapping[int, int], thresholds: Sequence[float | None]) -> str | None:
    """Why the stages did not pay on the frames just run, or None: no frame answered early."""
    reason = no_early_exit(stage_set)
    if reason is not None or stage_set.kind != "depth" or len(stage_set.stages) < 2:
        return reason
    frames = sum(histogram.values())
    if frames and all(count == 0 for k, count in histogram.items() if k != len(stage_set.stages) - 1):
        shown = ", ".join("none" if t is None else f"{t:g}" for t in thresholds[:-1])
        return (f"stages did not pay on these {frames} frames: no early exit answered at its threshold ({shown}), "
                f"so every frame paid the hand-offs for the model's own answer; lower the thresholds if the "
                f"agreement allows (`dynnet map exits` reports it), else {ONE_STAGE}")
    return None


def no_exit_taken(chosen: Candidate) -> str | None:
    """Why a depth-wise pick's stages do not pay, or None: none of its early exits fires at its
    thresholds on the calibration frames, so its stages only add dispatches and hand-offs."""
    if chosen.partition is not None or len(chosen.exit_rates) < 2 or any(chosen.exit_rates[:-1]):
        return None
    return (f"no early exit fires at the pick's thresholds on the calibration frames, so its "
            f"{len(chosen.exit_rates)} stages do what one stage does; {ONE_STAGE}")


def one_stage_guard(chosen: Candidate, candidates: Sequence[Candidate], base_accuracy: float = 1.0,
                    max_accuracy_drop: float = 1.0) -> tuple[Candidate, str | None]:
    """``chosen``, or the fastest of ``candidates`` that keep every stage on one unit (within the
    accuracy drop) with why, when ``chosen`` is predicted slower than it, or spreads depth-wise
    stages over units without taking an early exit: such a mapping is never worth its stages,
    whatever a noisy profile predicts for it."""
    single = [c for c in candidates if c.partition is None and len({u for _, u in c.assignment}) == 1
              and base_accuracy - c.accuracy <= max_accuracy_drop + 1e-12]
    if not single:
        return chosen, None
    fastest = min(single, key=lambda c: (c.latency_ms, c.energy_mj))
    unit = fastest.assignment[0][1]
    keep = "--allow-slower-than-one-stage keeps the rule's pick"
    if chosen.partition is None and len({u for _, u in chosen.assignment}) > 1 and not any(chosen.exit_rates[:-1]):
        return fastest, (f"the rule's pick ({dict(chosen.assignment)}) takes no early exit, so its depth-wise stages "
                         f"compute what one stage does plus hand-offs between units (its prediction, "
                         f"{chosen.latency_ms:.3f} ms, beside {fastest.latency_ms:.3f} ms on {unit} alone, is the "
                         f"profile's noise): stages across units do not pay here, so every stage goes to {unit}; "
                         f"{keep}")
    if chosen.latency_ms <= fastest.latency_ms:
        return chosen, None
    return fastest, (f"the rule's pick ({chosen.latency_ms:.3f} ms predicted, {dict(chosen.assignment)}) is slower "
                     f"than every stage on {unit} ({fastest.latency_ms:.3f} ms): stages across units do not pay "
                     f"here, so every stage goes to {unit}; {keep}")
