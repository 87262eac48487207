"""Input shapes a model can run: preferred sizes moved only as far as RDP's requirements demand.

Why: an engine with no input size given still needs one before its first frame (a budget's
minimum is measured at it), and a generic guess (224 for every free side) may be a size the
model cannot run — a text-line recogniser whose height must fit one 48-row stripe, say.
RDP states each such requirement as ``a >= 0`` or ``a == b`` over the input symbols, so a
symbol that breaks one takes the value closest to its preferred size that satisfies every
requirement it appears in; multiples of the strides those requirements divide by come first
(a stride-48 dim runs without padding at 48, 96, ...), so a dim constrained to one value takes it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from .expr import Expr, FDiv, MinMax, evaluate
from .result import AnalysisResult

#: largest size tried for one dim
MAX_DIM = 4096

Shapes = dict[str, tuple[int, ...]]


def _strides(expr, symbol: str) -> set[int]:
    """Denominators of the floor divisions in ``expr`` whose numerator involves ``symbol``."""
    out: set[int] = set()
    if not isinstance(expr, Expr):
        return out
    for mono, _ in expr.terms:
        for atom in mono:
            if isinstance(atom, FDiv):
                if symbol in atom.num.symbols():
                    out.add(int(atom.den))
                out |= _strides(atom.num, symbol)
            elif isinstance(atom, MinMax):
                for arg in atom.args:
                    out |= _strides(arg, symbol)
    return out


def _symbols(expr) -> set[str]:
    return expr.symbols() if isinstance(expr, Expr) else set()


def _holds(constraint: tuple, env: Mapping[str, int]) -> bool:
    """Whether one requirement holds at ``env`` (True where it names a symbol not bound)."""
    a, b, _ = constraint
    try:
        va = evaluate(a, env)
        if b is None:
            return va is None or va >= 0
        vb = evaluate(b, env)
    except KeyError:
        return True
    return va is None or vb is None or va == vb


def _candidates(preferred: int, strides: set[int]) -> Iterator[int]:
    """Sizes to try for a dim: multiples of each stride (largest stride first), then any size;
    each group closest to ``preferred`` first, the larger size on a tie."""
    seen: set[int] = set()
    for step in sorted((s for s in strides if s > 1), reverse=True) + [1]:
        values = range(step, MAX_DIM + 1, step)
        for value in sorted(values, key=lambda v: (abs(v - preferred), -v)):
            if value not in seen:
                seen.add(value)
                yield value


def _where(result: AnalysisResult, symbols: set[str]) -> list[str]:
    places = []
    for name in sorted(symbols):
        info = result.symbols.get(name) or result.alias_info.get(name)
        if info is not None:
            places.append(f"input '{info.input}' axis {info.axis}")
    return places or [f"symbol {name}" for name in sorted(symbols)]


def runnable_shapes(result: AnalysisResult, preferred: Mapping[str, Sequence[int]]) -> Shapes:
    """``preferred`` (one shape per input) with each symbolic dim that breaks one of RDP's
    requirements moved to the closest size that meets them all. ValueError naming the inputs
    and axes (and the requirement) where no such size exists within ``MAX_DIM``: those need
    their shapes given."""
    env: dict[str, int] = {}
    for name, info in result.symbols.items():
        shape = preferred.get(info.input)
        if shape is not None and info.axis < len(shape):
            env[name] = int(shape[info.axis])
    constraints = list(result.constraints)
    broken = [c for c in constraints if not _holds(c, env)]
    for constraint in broken:
        if _holds(constraint, env):  # met by a symbol moved for an earlier one
            continue
        for symbol in sorted(_symbols(constraint[0]) | _symbols(constraint[1])):
            if symbol not in env:
                continue
            involved = [c for c in constraints if symbol in _symbols(c[0]) | _symbols(c[1])]
            strides = set().union(*(_strides(c[0], symbol) | _strides(c[1], symbol) for c in involved))
            for value in _candidates(env[symbol], strides):
                trial = {**env, symbol: value}
                if all(_holds(c, trial) for c in involved):
                    env = trial
                    break
            if _holds(constraint, env):
                break
    still = [c for c in constraints if not _holds(c, env)]
    if still:
        a, b, why = still[0]
        names = _symbols(a) | _symbols(b)
        text = f"{a} >= 0" if b is None else f"{a} == {b}"
        raise ValueError(f"no input size up to {MAX_DIM} the model can run was found for "
                         f"{', '.join(_where(result, names))} "
                         f"(requirement {text}: {why}); give these inputs' shapes (input_shapes)")
    shapes: Shapes = {}
    for name, shape in preferred.items():
        dims = result.inputs.get(name)
        if dims is None or len(dims) != len(shape):
            shapes[name] = tuple(int(d) for d in shape)
            continue
        out: list[int] = []
        for declared, size in zip(dims, shape):
            solved: int | None = None
            if declared is not None:
                try:
                    solved = evaluate(declared, env)
                except KeyError:  # a symbol RDP keeps free: the preferred size stands
                    solved = None
            out.append(int(size) if solved is None else int(solved))
        shapes[name] = tuple(out)
    try:
        result.bind(shapes)  # the declared dims and the requirements, as a frame's shapes are checked
    except ValueError as exc:
        raise ValueError(f"no input size the model can run was found: {exc}; give the inputs' shapes "
                         "(input_shapes)") from None
    return shapes
