"""TensorRT optimisation profiles for dynamic inputs, decided in plain Python.

A TensorRT engine serves a dynamic input only inside one of its optimisation profiles
(min/opt/max per input). Few wide profiles cost memory and speed: an execution context reserves
activation memory for the profile's *max* and tunes kernels for its *opt*; many narrow profiles
cost build time and engine size. This is the SoD² paper's multi-version code on a GPU: a bounded
number of shape-specialised versions chosen from the model's shape distribution.

The planner buckets a (weighted) set of concrete input signatures into at most ``N`` profiles,
each the bounding box of its members, minimising the *waste*::

    waste = sum_s w_s * (work(max of s's profile) - work(s)) / sum_s w_s * work(s)

where ``work`` = elements over all inputs. That is exactly the padding overhead if every input
were padded to its profile's max (what a static-shape engine per profile needs), and the
over-reservation of activation memory of a dynamic one. One dynamic coordinate is solved exactly
(optimal partitions are contiguous in sorted order, found by dynamic programming); with several
coordinates (H and W) the same DP runs over a few orderings and the best result is kept.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynnet_ros.engine.modelio.models import InputSpec

Shape = tuple[int, ...]
Signature = tuple[tuple[str, Shape], ...]  # sorted (input name, shape) pairs: feeds.shape_signature

#: the paper's image-side distribution: 224..1280 in steps of 32
DEFAULT_SIDES = tuple(range(224, 1281, 32))
MAX_DISTINCT_SHAPES = 5000  # the DP holds an n x n cost matrix
EXACT_SEARCH_LIMIT = 20_000_000  # corner sets x samples x profiles evaluated by exhaustive search
SMALL_FOR_DP_ORDERS = 400      # below this many shapes, also run the DP over several orderings


def as_signature(shapes: Mapping[str, Sequence[int]] | Signature) -> Signature:
    """Normalise {name: shape} (or an existing signature) to the hashable sorted form."""
    items = shapes.items() if isinstance(shapes, Mapping) else shapes
    out = []
    for name, shape in items:
        dims = tuple(int(d) for d in shape)
        if any(d <= 0 for d in dims):
            raise ValueError(f"input '{name}' shape {list(dims)} has a non-positive dimension")
        out.append((str(name), dims))
    return tuple(sorted(out))


def work(signature: Signature) -> int:
    """Elements over all inputs: the cost unit of the waste metric."""
    return sum(math.prod(shape) for _, shape in signature)


@dataclass(frozen=True)
class InputRange:
    """min/opt/max of one input inside one profile (TensorRT ``profile.set_shape``)."""

    min: Shape
    opt: Shape
    max: Shape

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"min/opt/max ranks differ: {self.min} {self.opt} {self.max}")
        if any(not (a <= b <= c) for a, b, c in zip(self.min, self.opt, self.max)):
            raise ValueError(f"need min <= opt <= max per axis, got {self.min} {self.opt} {self.max}")

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.min) and all(a <= d <= c for a, d, c in zip(self.min, shape, self.max))

    @property
    def static(self) -> bool:
        return self.min == self.max


@dataclass(frozen=True)
class Profile:
    """One optimisation profile: a range per input, sorted by input name."""

    inputs: tuple[tuple[str, InputRange], ...]

    def range(self, name: str) -> InputRange:
        return dict(self.inputs)[name]

    def contains(self, signature: Signature) -> bool:
        ranges = dict(self.inputs)
        return len(signature) == len(ranges) and all(
            name in ranges and ranges[name].contains(shape) for name, shape in signature)

    @property
    def static(self) -> bool:
        return all(r.static for _, r in self.inputs)

    def max_work(self) -> int:
        return sum(math.prod(r.max) for _, r in self.inputs)

    def to_dict(self) -> dict:
        return {name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for name, r in self.inputs}

    def describe(self) -> str:
        parts = []
        for name, r in self.inputs:
            dims = [str(a) if a == c else f"{a}..{c}" for a, c in zip(r.min, r.max)]
            parts.append(f"{name}[{','.join(dims)}]")
        return " ".join(parts)


@dataclass(frozen=True)
class ProfileSet:
    """The profiles of one engine, in TensorRT's profile-index order."""

    profiles: tuple[Profile, ...]

    def __post_init__(self) -> None:
        if not self.profiles:
            raise ValueError("a profile set needs at least one profile")
        names = {tuple(n for n, _ in p.inputs) for p in self.profiles}
        if len(names) != 1:
            raise ValueError(f"profiles disagree on the inputs they cover: {sorted(names)}")

    def __len__(self) -> int:
        return len(self.profiles)

    def select(self, signature: Signature | Mapping[str, Sequence[int]]) -> int | None:
        """Profile index for a concrete shape: among profiles containing it, the one reserving
        least (smallest max work; lowest index on ties) — never a rebuild. None: outside all."""
        sig = as_signature(signature)
        best: tuple[int, int] | None = None
        for index, profile in enumerate(self.profiles):
            if profile.contains(sig):
                key = (profile.max_work(), index)
                best = key if best is None or key < best else best
        return None if best is None else best[1]

    @property
    def static(self) -> bool:
        return all(p.static for p in self.profiles)

    def to_json(self) -> str:
        """Canonical text (cache keys hash it)."""
        return json.dumps([p.to_dict() for p in self.profiles], sort_keys=True, separators=(",", ":"))

    def describe(self) -> str:
        return "; ".join(f"#{i}: {p.describe()}" for i, p in enumerate(self.profiles))


@dataclass(frozen=True)
class ProfilePlan:
    """A planned profile set and how well it fits the distribution it was planned for."""

    profiles: ProfileSet
    waste: float           # see module docstring; 0 = every shape at its profile's max
    baseline_waste: float  # one profile covering everything
    covered: float         # weight fraction of the samples inside some profile (1.0 when dynamic)
    order: str             # which ordering the DP kept


def weighted_samples(samples: Iterable[Signature | Mapping[str, Sequence[int]]] | Mapping) -> dict[Signature, float]:
    """Signature -> weight. Accepts a list (repeats count) or a {signature: weight} mapping."""
    out: dict[Signature, float] = {}
    if isinstance(samples, Mapping) and samples and all(isinstance(k, tuple) for k in samples):
        items = [(as_signature(k), float(v)) for k, v in samples.items()]
    else:
        items = [(as_signature(s), 1.0) for s in samples]
    for sig, weight in items:
        if not weight > 0:
            raise ValueError(f"sample weight must be positive, got {weight} for {sig}")
        out[sig] = out.get(sig, 0.0) + weight
    if not out:
        raise ValueError("no sample shapes to plan profiles for")
    layouts = {tuple((n, len(s)) for n, s in sig) for sig in out}
    if len(layouts) != 1:
        raise ValueError(f"samples disagree on inputs or ranks: {sorted(layouts)}")
    return out


def waste_of(profiles: ProfileSet, samples) -> tuple[float, float]:
    """(waste, covered weight fraction) of ``profiles`` under the runtime selection rule."""
    weights = weighted_samples(samples)
    spent = useful = total = inside = 0.0
    for sig, w in weights.items():
        total += w
        index = profiles.select(sig)
        if index is None:
            continue
        inside += w
        useful += w * work(sig)
        spent += w * profiles.profiles[index].max_work()
    return ((spent - useful) / useful if useful else 0.0), inside / total


def _profile_for(members: list[Signature], weights: Mapping[Signature, float]) -> Profile:
    """Bounding box of the members; opt = the heaviest member (ties: nearest the mean work)."""
    names = [n for n, _ in members[0]]
    mean = sum(weights[m] * work(m) for m in members) / sum(weights[m] for m in members)
    opt_sig = min(members, key=lambda m: (-weights[m], abs(work(m) - mean), m))
    ranges = []
    for k, name in enumerate(names):
        shapes = np.array([m[k][1] for m in members], dtype=np.int64)
        ranges.append((name, InputRange(tuple(int(v) for v in shapes.min(0)), opt_sig[k][1],
                                        tuple(int(v) for v in shapes.max(0)))))
    return Profile(tuple(ranges))


def _segment_costs(points: np.ndarray, blocks: list[slice], w: np.ndarray, own: np.ndarray) -> np.ndarray:
    """C[i, j] = waste numerator of grouping points i..j (in this order) under their box."""
    n = len(points)
    cost = np.full((n, n), np.inf)
    cum_w = np.concatenate(([0.0], np.cumsum(w)))
    cum_own = np.concatenate(([0.0], np.cumsum(w * own)))
    for i in range(n):
        box = np.maximum.accumulate(points[i:], axis=0).astype(np.float64)
        box_work = sum(np.prod(box[:, b], axis=1) for b in blocks)
        j = np.arange(i, n)
        cost[i, i:] = (cum_w[j + 1] - cum_w[i]) * box_work - (cum_own[j + 1] - cum_own[i])
    return cost


def _partition(cost: np.ndarray, groups: int) -> list[tuple[int, int]]:
    """Contiguous partition of 0..n-1 into <= ``groups`` segments of least total cost (DP)."""
    n = len(cost)
    best = cost[0].copy()                  # best[j]: least cost covering 0..j so far
    layers: list[np.ndarray] = [np.zeros(n, dtype=np.int64)]  # per layer: start of the last segment, -1 = unchanged
    for _ in range(1, min(groups, n)):
        prev = np.concatenate(([np.inf], best[:-1]))  # cover of 0..i-1 before a segment at i
        total = prev[:, None] + cost                   # [i, j]; inf where i > j
        start = np.argmin(total, axis=0)
        new = total[start, np.arange(n)]
        improved = new < best - 1e-9 * np.maximum(1.0, np.abs(best))
        best = np.where(improved, new, best)
        layers.append(np.where(improved, start, -1))
    segments: list[tuple[int, int]] = []
    j, layer = n - 1, len(layers) - 1
    while j >= 0:
        if layer == 0:
            segments.append((0, j))
            break
        s = int(layers[layer][j])
        if s == -1:
            layer -= 1
            continue
        segments.append((s, j))
        j, layer = s - 1, layer - 1
    return segments[::-1]


def _corner_search(points: np.ndarray, blocks: list[slice], w: np.ndarray, varying: list[int],
                   rep: list[int | None], groups: int, max_candidates: int = 2500) -> list[int]:
    """Pick <= ``groups`` profile maxima ("corners") by greedy addition then swaps.

    A sample is served by the cheapest corner that dominates it (the runtime rule), so this is a
    facility-location problem under dominance; greedy + swap is the standard strong heuristic and
    catches partitions that are not contiguous in any single ordering (e.g. tall-narrow and
    wide-short images on separate profiles). Returns each sample's group label.
    """
    values = [np.unique(points[:, c]) for c in varying]
    if math.prod(len(v) for v in values) <= max_candidates:
        grid = np.array(list(itertools.product(*values)), dtype=np.int64).reshape(-1, len(varying))
    else:
        grid = np.unique(points[:, varying], axis=0)
    cand = np.repeat(points[:1], len(grid), axis=0)
    for c, r in enumerate(rep):
        if r is not None:
            cand[:, c] = grid[:, varying.index(r)]
    area = sum(np.prod(cand[:, b].astype(np.float64), axis=1) for b in blocks)
    dominated = np.ones((len(points), len(cand)), dtype=bool)
    for k, c in enumerate(varying):
        dominated &= points[:, c][:, None] <= grid[:, k][None, :]
    cost = np.where(dominated, w[:, None] * area[None, :], np.inf)
    k = min(groups, len(grid))
    if math.comb(len(grid), k) * len(points) * k <= EXACT_SEARCH_LIMIT:  # small: try every corner set
        best_total, best_set = math.inf, None
        combos = itertools.combinations(range(len(grid)), k)
        while True:
            chunk = np.array(list(itertools.islice(combos, 4096)), dtype=np.int64)
            if not len(chunk):
                break
            totals = cost[:, chunk].min(axis=2).sum(axis=0)
            i = int(np.argmin(totals))
            if totals[i] < best_total:
                best_total, best_set = float(totals[i]), [int(c) for c in chunk[i]]
        assert best_set is not None
        return [int(x) for x in np.argmin(cost[:, best_set], axis=1)]
    chosen = [int(np.argmax(np.all(dominated, axis=0) * (1.0 / area)))]  # cheapest corner covering all
    current = cost[:, chosen[0]].copy()
    for _ in range(groups - 1):  # greedy additions
        totals = np.minimum(current[:, None], cost).sum(axis=0)
        best = int(np.argmin(totals))
        if not totals[best] < current.sum() - 1e-9:
            break
        chosen.append(best)
        current = np.minimum(current, cost[:, best])
    for _ in range(10):  # swap passes until no single swap helps
        improved = False
        for i in range(len(chosen)):
            others = [c for j, c in enumerate(chosen) if j != i]
            rest = cost[:, others].min(axis=1) if others else np.full(len(points), np.inf)
            totals = np.minimum(rest[:, None], cost).sum(axis=0)
            best = int(np.argmin(totals))
            if totals[best] < current.sum() - 1e-9 * max(1.0, current.sum()) and best not in chosen:
                chosen[i] = best
                current = np.minimum(rest, cost[:, best])
                improved = True
        if not improved:
            break
    return [int(x) for x in np.argmin(cost[:, chosen], axis=1)]


def _shrink(profiles: ProfileSet, weights: Mapping[Signature, float]) -> ProfileSet:
    """Reassign every sample as the runtime would (``select``) and shrink each profile to the
    bounding box of what it serves; repeat until stable. Never increases the waste."""
    for _ in range(20):
        groups: dict[int, list[Signature]] = {}
        for sig in weights:
            index = profiles.select(sig)
            assert index is not None, "every sample lies in the box it was planned into"
            groups.setdefault(index, []).append(sig)
        shrunk = ProfileSet(tuple(sorted((_profile_for(sorted(m), weights) for m in groups.values()),
                                         key=lambda p: (p.max_work(), repr(p.to_dict())))))
        if shrunk == profiles:
            break
        profiles = shrunk
    return profiles


def plan_profiles(samples, max_profiles: int) -> ProfilePlan:
    """Bucket the samples into at most ``max_profiles`` dynamic profiles of least waste."""
    if not isinstance(max_profiles, int) or max_profiles < 1:
        raise ValueError(f"max_profiles must be a positive integer, got {max_profiles!r}")
    weights = weighted_samples(samples)
    sigs = sorted(weights)
    if len(sigs) > MAX_DISTINCT_SHAPES:
        raise ValueError(f"{len(sigs)} distinct shapes to plan for (limit {MAX_DISTINCT_SHAPES}); "
                         "give a coarser shape distribution")
    # Flatten each signature into one row; blocks = the columns of each input.
    blocks, col = [], 0
    for _, shape in sigs[0]:
        blocks.append(slice(col, col + len(shape)))
        col += len(shape)
    points = np.array([[d for _, shape in sig for d in shape] for sig in sigs], dtype=np.int64)
    w = np.array([weights[s] for s in sigs])
    own = np.array([work(s) for s in sigs], dtype=np.float64)
    # distinct varying coordinates (tied axes, e.g. image H and lidar H, count once)
    varying: list[int] = []
    for c in range(points.shape[1]):
        if len(np.unique(points[:, c])) > 1 and not any(np.array_equal(points[:, c], points[:, v]) for v in varying):
            varying.append(c)
    rep: list[int | None] = [next((v for v in varying if np.array_equal(points[:, c], points[:, v])), None)
                             for c in range(points.shape[1])]
    best: tuple[float, str, ProfileSet] = (math.inf, "", ProfileSet((_profile_for(sigs, weights),)))

    def consider(label: str, groups: list[list[Signature]]) -> None:
        nonlocal best
        profile_set = _shrink(ProfileSet(tuple(_profile_for(m, weights) for m in groups)), weights)
        waste, _ = waste_of(profile_set, weights)
        if waste < best[0] - 1e-12:
            best = (waste, label, profile_set)

    orders: dict[str, np.ndarray] = {}
    if len(varying) <= 1:  # one size varies: contiguous runs in sorted order are optimal (exact DP)
        orders["sorted-dp"] = np.lexsort((own, points[:, varying[0]])) if varying else np.argsort(own, kind="stable")
    elif len(sigs) <= SMALL_FOR_DP_ORDERS:  # cheap extra candidates for the corner search
        orders["largest-side-dp"] = np.lexsort((own, points[:, varying].max(axis=1)))
        orders["work-dp"] = np.argsort(own, kind="stable")
        for c in varying[:3]:
            orders[f"axis{c}-dp"] = np.lexsort((own, points[:, c]))
    for label, order in orders.items():
        cost = _segment_costs(points[order], blocks, w[order], own[order])
        consider(label, [[sigs[k] for k in order[a:b + 1]] for a, b in _partition(cost, max_profiles)])
    if varying:
        labels = _corner_search(points, blocks, w, varying, rep, max_profiles)
        consider("corners", [[sigs[k] for k in range(len(sigs)) if labels[k] == g] for g in sorted(set(labels))])
    if not best[1]:
        best = (waste_of(best[2], weights)[0], "single", best[2])
    single = ProfileSet((_profile_for(sigs, weights),))
    return ProfilePlan(best[2], best[0], waste_of(single, weights)[0], 1.0, best[1])


def plan_static_profiles(samples, max_profiles: int) -> ProfilePlan:
    """Static profiles (min = opt = max, as DLA requires): the ``max_profiles`` heaviest exact
    signatures. Other shapes are *not* covered (padding would change the outputs)."""
    if not isinstance(max_profiles, int) or max_profiles < 1:
        raise ValueError(f"max_profiles must be a positive integer, got {max_profiles!r}")
    weights = weighted_samples(samples)
    chosen = sorted(weights, key=lambda s: (-weights[s], -work(s), s))[:max_profiles]
    profiles = ProfileSet(tuple(Profile(tuple((n, InputRange(s, s, s)) for n, s in sig)) for sig in sorted(chosen)))
    waste, covered = waste_of(profiles, weights)
    single = ProfileSet((_profile_for(sorted(weights), weights),))
    return ProfilePlan(profiles, waste, waste_of(single, weights)[0], covered, "heaviest")


# ------------------------------------------------------------------------- shape distributions
def parse_shape_spec(text: str) -> dict[str, tuple[int, ...]]:
    """``"H=224:1280:32,W=480"`` -> {"H": (224, 256, ..., 1280), "W": (480,)}.

    Each entry is ``SYMBOL=VALUE``, ``SYMBOL=START:STOP:STEP`` (STOP inclusive) or
    ``SYMBOL=V1|V2|...``.
    """
    out: dict[str, tuple[int, ...]] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise ValueError(f"shape spec entry {part!r} is not SYMBOL=VALUES")
        try:
            if ":" in value:
                start, stop, step = (int(v) for v in value.split(":"))
                if step <= 0 or stop < start:
                    raise ValueError
                values = tuple(range(start, stop + 1, step))
            else:
                values = tuple(int(v) for v in value.split("|"))
        except ValueError:
            raise ValueError(f"shape spec entry {part!r}: values must be N, START:STOP:STEP or N|N|...") from None
        if not values or min(values) <= 0:
            raise ValueError(f"shape spec entry {part!r} needs positive sizes")
        out[name] = values
    if not out:
        raise ValueError(f"empty shape spec {text!r}")
    return out


def default_symbol_values(specs: Sequence[InputSpec],
                          given: Mapping[str, Sequence[int]] | None = None) -> dict[str, tuple[int, ...]]:
    """Values for every named dynamic dim: ``given`` first, then batch-like axis 0 -> 1 and image
    axes 2 and 3 of a rank-4 input -> ``DEFAULT_SIDES``. Anything else has no sensible default:
    ValueError names it."""
    given = dict(given or {})
    known = {d for s in specs for d in s.dims if isinstance(d, str)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"shape spec names {unknown}, but the model's dynamic dimensions are {sorted(known)}")
    values: dict[str, tuple[int, ...]] = {k: tuple(int(x) for x in v) for k, v in given.items()}
    for spec in specs:
        for axis, dim in enumerate(spec.dims):
            if isinstance(dim, int) or dim in values:
                continue
            if dim is None:
                raise ValueError(f"input '{spec.name}' axis {axis} is dynamic without a name; "
                                 "TensorRT profiles need it named or pinned (give input shapes)")
            guess: tuple[int, ...]
            if axis == 0:
                guess = (1,)
            elif spec.rank == 4 and axis in (2, 3):
                guess = DEFAULT_SIDES
            else:
                raise ValueError(f"input '{spec.name}' axis {axis} ('{dim}') is dynamic and has no default "
                                 f"range; give one, e.g. DYNNET_TRT_SHAPES='{dim}=1:64:1'")
            values.setdefault(dim, guess)
    return values


def grid_samples(specs: Sequence[InputSpec], values: Mapping[str, Sequence[int]],
                 limit: int = MAX_DISTINCT_SHAPES) -> list[Signature]:
    """Every combination of the symbols' values, as input signatures (shared symbols agree)."""
    symbols = sorted({d for s in specs for d in s.dims if isinstance(d, str)})
    missing = [s for s in symbols if s not in values]
    if missing:
        raise ValueError(f"no sizes given for dynamic dimension(s) {missing}")
    count = math.prod(len(values[s]) for s in symbols) if symbols else 1
    if count > limit:
        raise ValueError(f"the shape grid has {count} combinations (limit {limit}); give fewer sizes")
    out = []
    for combo in itertools.product(*(values[s] for s in symbols)):
        bound = dict(zip(symbols, combo))
        out.append(as_signature({spec.name: tuple(d if isinstance(d, int) else bound[str(d)] for d in spec.dims)
                                 for spec in specs}))
    return out
