"""Check user feeds against a model's inputs by onnxruntime's own rules, before any backend sees them.

Why: a caller choosing this engine over a plain ``InferenceSession`` must be able to feed it
exactly what that session takes. ``validate_feeds`` accepts what ``InferenceSession.run``
accepts (test/test_feeds.py compares the two on every rule below and by fuzzing) and refuses
the rest with one ValueError that names the input, leaving the engine usable:

- names: every input without a default must be fed; an input with an initializer default
  (onnxruntime's overridable initializer) and an ``optional`` input may be left out; any other
  name is refused;
- values: numpy arrays, or lists that convert to the input's element type; the element type
  must match, strings as ``str`` or ``object`` arrays. A foreign byte order is accepted, as
  onnxruntime does, and converted (onnxruntime does not always swap the bytes itself);
- shapes: the rank must match the declared one, and a size only where the model writes a
  non-negative value. Dims that are ``-1``, unnamed or named are not checked, nor are the
  shapes of inputs declared without a shape or as rank 0 (onnxruntime skips empty shapes), and
  empty tensors pass;
- sequence, map and sparse values are onnxruntime's to check (the engine runs such models
  through it).

``plan_breach`` then says which accepted feeds fall outside what the model *declares*, the
contract the planned engine's plan is proved under (one symbol, one size; a scalar is a scalar;
initializers are constants). Those feeds run through plain onnxruntime, which does not hold the
model to its declaration.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dynnet_ros.engine.modelio.models import InputSpec, is_dim_symbol

_UNCHECKED_KINDS = ("sequence", "map", "sparse")


def _as_array(spec: InputSpec, value: Any) -> np.ndarray:
    """The fed value as an array of the input's element type, or ValueError (onnxruntime's rules)."""
    if isinstance(value, np.ndarray) and value.dtype == spec.dtype:  # the usual feed: nothing to convert
        return value
    if isinstance(value, list):  # onnxruntime converts lists to the expected element type
        try:
            return np.array(value, dtype=spec.dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"input '{spec.name}': cannot make a {spec.dtype.name} tensor from the "
                             f"list ({exc}); expected {spec.describe()}") from None
    if not isinstance(value, np.ndarray):
        raise ValueError(f"input '{spec.name}' must be a numpy array (or a list), got "
                         f"{type(value).__name__}; expected {spec.describe()}")
    if spec.dtype == np.dtype(object):  # a string input takes str and object arrays
        if value.dtype.kind not in "UO":
            raise ValueError(f"input '{spec.name}' has dtype {value.dtype}, expected {spec.describe()}")
        return value
    if value.dtype.newbyteorder("=") != spec.dtype:
        raise ValueError(f"input '{spec.name}' has dtype {value.dtype}, expected {spec.describe()}")
    if not value.dtype.isnative:
        value = value.astype(spec.dtype)  # same values in this machine's byte order, as onnxruntime reads them
    return value


def _check_shape(spec: InputSpec, value: np.ndarray) -> None:
    if spec.any_shape:
        return
    if value.ndim != spec.rank:
        raise ValueError(f"input '{spec.name}' has rank {value.ndim} (shape {list(value.shape)}), "
                         f"expected {spec.describe()}")
    for axis, (size, want) in enumerate(zip(value.shape, spec.dims)):
        if isinstance(want, int) and size != want:
            raise ValueError(f"input '{spec.name}' axis {axis} is {size}, expected {spec.describe()}")


def validate_feeds(specs: Sequence[InputSpec], feeds: Mapping[str, Any],
                   defaults: Sequence[InputSpec] = ()) -> dict[str, Any]:
    """``feeds`` checked as onnxruntime checks them: C-contiguous arrays in the expected element
    type (sequence / map values as given, an omitted optional input absent). ``defaults``: the
    inputs an initializer gives a value to (``model_io.default_specs``)."""
    if not isinstance(feeds, Mapping):
        raise ValueError(f"feeds must be a dict of input name -> numpy array, got {type(feeds).__name__}")
    by_name = {spec.name: spec for spec in [*specs, *defaults]}
    unknown = sorted(str(name) for name in feeds if name not in by_name)
    if unknown:
        expected = ", ".join(spec.describe() for spec in specs)
        raise ValueError(f"unknown input(s) {unknown}; the model takes {expected}")
    missing = [spec for spec in specs if spec.name not in feeds and spec.kind != "optional"]
    if missing:
        raise ValueError(f"missing input(s): {', '.join(spec.describe() for spec in missing)}")
    checked: dict[str, Any] = {}
    for name, value in feeds.items():
        spec = by_name[name]
        if spec.kind in _UNCHECKED_KINDS or (spec.kind == "optional" and value is None):
            checked[name] = value
            continue
        array = _as_array(spec, value)
        _check_shape(spec, array)
        # raw pointers are bound downstream; np.require keeps a 0-d feed 0-d (ascontiguousarray would not)
        checked[name] = array if array.flags.c_contiguous else np.require(array, requirements="C")
    return checked


class FeedCheck:
    """``validate_feeds`` for one model, its inputs indexed once.

    Why: a small model (a voice-activity detector runs in well under a millisecond) pays the
    checks on every call. The usual feed (each input a tensor, fed once as an array of its
    element type, C-contiguous, at its declared sizes) passes in one loop here and is returned
    as a new dict, as ``validate_feeds`` returns it; anything else goes through
    ``validate_feeds``, for its conversion or its error.
    """

    def __init__(self, specs: Sequence[InputSpec], defaults: Sequence[InputSpec] = ()) -> None:
        self.specs, self.defaults = tuple(specs), tuple(defaults)
        # name -> (element type, rank or None where no shape is checked, the fixed (axis, size) pairs)
        self._usual: dict[str, tuple[np.dtype, int | None, tuple[tuple[int, int], ...]]] = {
            spec.name: (spec.dtype, None if spec.any_shape else spec.rank,
                        tuple((axis, d) for axis, d in enumerate(spec.dims) if isinstance(d, int)))
            for spec in specs if spec.kind == "tensor"}
        self._all_usual = len(self._usual) == len(self.specs)

    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        if self._all_usual and type(feeds) is dict and len(feeds) == len(self._usual):
            for name, value in feeds.items():
                expected = self._usual.get(name)
                if (expected is None or type(value) is not np.ndarray or value.dtype != expected[0]
                        or not value.flags.c_contiguous):
                    break
                rank, fixed = expected[1], expected[2]
                if rank is not None and (value.ndim != rank or any(value.shape[a] != d for a, d in fixed)):
                    break
            else:
                return dict(feeds)
        return validate_feeds(self.specs, feeds, self.defaults)


def plan_breach(specs: Sequence[InputSpec], feeds: Mapping[str, Any]) -> str | None:
    """Why these accepted feeds are outside the model's declared inputs (None when they are not):
    an initializer fed over, a rank-0 input fed a non-scalar, or one dim name bound to two
    sizes. onnxruntime runs such feeds; a plan proved under the declaration may not."""
    by_name = {spec.name: spec for spec in specs}
    seen: dict[str, tuple[str, int, int]] = {}
    for name, value in feeds.items():
        spec = by_name.get(name)
        if spec is None:
            return f"input '{name}' overrides its initializer"
        shape = getattr(value, "shape", None)
        if spec.kind not in ("tensor", "optional") or shape is None or not spec.shaped:
            continue
        if not spec.dims and shape:
            return f"input '{name}' is declared a scalar (rank 0) but fed shape {list(shape)}"
        for axis, want in enumerate(spec.dims):
            if isinstance(want, str) and is_dim_symbol(want):
                other = seen.setdefault(want, (name, axis, int(shape[axis])))
                if other[2] != shape[axis]:
                    return (f"dimension '{want}' is {other[2]} on input '{other[0]}' axis {other[1]} but "
                            f"{shape[axis]} on input '{name}' axis {axis}")
    return None


def shape_signature(feeds: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Hashable key of the concrete input shapes (plan caches and stats use it); values without
    a shape (sequences, maps, an omitted optional) count as shape ().

    Runs once per frame, so it builds no tuple through a generator: CPython sizes those by guess
    and shrinks them, and each one freed then grows the interpreter's tuple free list (bounded,
    but memory plain onnxruntime's run loop does not hold). A numpy shape is a tuple of ints already."""
    return tuple(sorted((name, tuple(getattr(value, "shape", ()))) for name, value in feeds.items()))
