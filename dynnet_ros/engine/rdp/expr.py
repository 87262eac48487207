"""Canonical symbolic dimension expressions.

A dimension is an ``int``, an :class:`Expr` (a non-constant expression) or ``None``
(nac).  An :class:`Expr` is a polynomial with integer coefficients over *atoms*:
symbols, ``e // k`` (k a positive int), ``min(..)`` and ``max(..)``.  Every
constructor normalises, so two equal dimensions built along different paths (two
stride-2 convolutions, ``(a*b)*c`` and ``a*(b*c)``) compare and hash equal.  The
rules used are all exact over the integers:

* ``(k*q + r) // k == q + r // k`` (q integral): the residual keeps coefficients in
  ``[0, k)`` so ``(W - 1)//2 + 1`` and ``(W + 1)//2`` are the same object;
* ``(g*a) // (g*k) == a // k``;  ``(a // m + c) // k == (a + m*c) // (m*k)``;
* ``a % k == a - k*(a // k)`` (no separate modulo atom to canonicalise);
* ``min``/``max`` are flattened, de-duplicated and pruned by interval bounds,
  where every symbol is a tensor dimension and therefore ``>= 0``.

No sympy: everything is tuples of ints and strings, hashed once.
"""
from __future__ import annotations

import ast
import contextlib
import math
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Union, overload

INF = math.inf

Dim = Union[int, "Expr", None]

# upper bounds of body-local symbols (a Loop's iteration counter): name -> max value
_UPPER: ContextVar[Mapping[str, int]] = ContextVar("rdp_symbol_upper", default=MappingProxyType({}))


@contextlib.contextmanager
def symbol_upper_bound(name: str, hi: int):
    """Within the block, symbol ``name`` is known to lie in [0, hi]."""
    tok = _UPPER.set({**_UPPER.get(), name: hi})
    try:
        yield
    finally:
        _UPPER.reset(tok)


# --------------------------------------------------------------------------- atoms
class Atom:
    """Base of the non-polynomial building blocks; subclasses are immutable."""

    __slots__ = ("key", "_hash")
    key: tuple[Any, ...]
    _hash: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Atom) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    def __lt__(self, other: Atom) -> bool:
        return self.key < other.key


class Sym(Atom):
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name
        self.key = (0, name)
        self._hash = hash(self.key)


class FDiv(Atom):
    __slots__ = ("num", "den")

    def __init__(self, num: Expr, den: int):
        self.num, self.den = num, den
        self.key = (1, num.key, den)
        self._hash = hash(self.key)


class MinMax(Atom):
    __slots__ = ("is_max", "args")

    def __init__(self, is_max: bool, args: tuple[Expr, ...]):
        self.is_max, self.args = is_max, args
        self.key = (3 if is_max else 2, tuple(a.key for a in args))
        self._hash = hash(self.key)


AnyAtom = Sym | FDiv | MinMax  # the closed set of atom kinds
Mono = tuple  # sorted tuple of atoms (repetition = power); () is the constant monomial


def _mono_key(m: Mono) -> tuple:
    return tuple(a.key for a in m)


# --------------------------------------------------------------------------- Expr
class Expr:
    """Immutable canonical polynomial over atoms; never a bare constant."""

    __slots__ = ("terms", "key", "_hash", "_str")

    def __init__(self, terms: tuple):
        self.terms = terms  # tuple of (mono, coeff), sorted by mono key, coeff != 0
        self.key = tuple((_mono_key(m), c) for m, c in terms)
        self._hash = hash(self.key)
        self._str: str | None = None

    # ---- construction helpers
    @staticmethod
    def from_dict(d: dict) -> Dim:
        items = [(m, c) for m, c in d.items() if c != 0]
        if not items:
            return 0
        if len(items) == 1 and items[0][0] == ():
            return items[0][1]
        items.sort(key=lambda mc: _mono_key(mc[0]))
        return Expr(tuple(items))

    def as_dict(self) -> dict:
        return dict(self.terms)

    # ---- comparisons
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and self.key == other.key

    def __hash__(self) -> int:
        return self._hash

    # ---- arithmetic with ints / Exprs
    def __add__(self, other):
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return add(self, mul(other, -1))

    def __rsub__(self, other):
        return add(other, mul(self, -1))

    def __mul__(self, other):
        return mul(self, other)

    __rmul__ = __mul__

    def __neg__(self):
        return mul(self, -1)

    def __floordiv__(self, k):
        return floordiv(self, k)

    def __mod__(self, k):
        return mod(self, k)

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def __str__(self) -> str:
        if self._str is None:
            self._str = _render(self)
        return self._str

    def symbols(self) -> set[str]:
        out: set[str] = set()
        _collect_syms(self, out)
        return out

    @property
    def const(self) -> int:
        for m, c in self.terms:
            if m == ():
                return c
        return 0


def _collect_syms(e: Expr, out: set) -> None:
    for m, _ in e.terms:
        for a in m:
            if isinstance(a, Sym):
                out.add(a.name)
            elif isinstance(a, FDiv):
                _collect_syms(a.num, out)
            else:
                for x in a.args:
                    _collect_syms(x, out)


def _poly(x) -> dict:
    if isinstance(x, Expr):
        return dict(x.terms)
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return {(): x} if x else {}
    if isinstance(x, bool):
        return {(): int(x)} if x else {}
    raise TypeError(f"not a dimension: {x!r}")


def sym(name: str) -> Expr:
    return Expr((((Sym(name),), 1),))


def _atom_expr(a: Atom) -> Expr:
    return Expr((((a,), 1),))


# Memo of symbolic arithmetic: networks repeat the same dims thousands of times.  Results
# depend on bounds only through _UPPER, so the memo is used only while that is empty.
_MEMO: dict = {}
_MEMO_MAX = 200_000


def _memo_get(key):
    if _UPPER.get():
        return None, False
    try:
        return _MEMO[key], True
    except KeyError:
        return None, False


def _memo_put(key, value):
    if _UPPER.get():
        return value
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[key] = value
    return value


def add(a, b) -> Dim:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    key = ("+", a, b)
    hit, ok = _memo_get(key)
    if ok:
        return hit
    return _memo_put(key, _add(a, b))


def _add(a, b) -> Dim:
    d = _poly(a)
    for m, c in _poly(b).items():
        d[m] = d.get(m, 0) + c
    return Expr.from_dict(d)


def sub(a, b) -> Dim:
    if a is None or b is None:
        return None
    return add(a, mul(b, -1))


def _mono_mul(m1: Mono, m2: Mono) -> Mono:
    if not m1:
        return m2
    if not m2:
        return m1
    return tuple(sorted(m1 + m2, key=lambda a: a.key))


def mul(a, b) -> Dim:
    if a is None or b is None:
        return None
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    key = ("*", a, b)
    hit, ok = _memo_get(key)
    if ok:
        return hit
    return _memo_put(key, _mul(a, b))


def _mul(a, b) -> Dim:
    if isinstance(b, int):
        a, b = b, a
    if isinstance(a, int):
        if a == 0:
            return 0
        if a == 1:
            return b
        return Expr.from_dict({m: c * a for m, c in b.terms})
    d: dict = {}
    for m1, c1 in a.terms:
        for m2, c2 in b.terms:
            m = _mono_mul(m1, m2)
            d[m] = d.get(m, 0) + c1 * c2
    return Expr.from_dict(d)


def floordiv(a, k) -> Dim:
    """``a // k`` for a positive int k (or an exactly dividing Expr k)."""
    if a is None or k is None:
        return None
    if isinstance(k, Expr):
        q = exact_div(a, k)
        return q
    if k <= 0:
        raise ValueError("floordiv by a non-positive integer")
    if isinstance(a, int):
        return a // k
    if k == 1:
        return a
    key = ("//", a, k)
    hit, ok = _memo_get(key)
    if ok:
        return hit
    return _memo_put(key, _floordiv(a, k))


def _floordiv(a: Expr, k: int) -> Dim:
    q: dict = {}
    r: dict = {}
    for m, c in a.terms:
        qc, rc = divmod(c, k)
        if qc:
            q[m] = qc
        if rc:
            r[m] = rc
    qexpr = Expr.from_dict(q)
    if not r:
        return qexpr
    if len(r) == 1 and () in r:
        return add(qexpr, r[()] // k)  # 0 <= rc < k: contributes 0
    # the residual is >= its constant part? only bounds can tell; keep an atom.
    g = k
    for c in r.values():
        g = math.gcd(g, c)
    if g > 1:
        r = {m: c // g for m, c in r.items()}
        k //= g
    rexpr = Expr.from_dict(r)
    if not isinstance(rexpr, Expr):  # r holds a non-constant monomial, so this is a bug
        raise TypeError(f"floordiv residual {rexpr!r} of {a} is not symbolic")
    if k == 1:
        return add(qexpr, rexpr)
    # (a // m + c) // k == (a + m*c) // (m*k)
    nonconst = [(m, c) for m, c in rexpr.terms if m != ()]
    if len(nonconst) == 1 and nonconst[0][1] == 1 and len(nonconst[0][0]) == 1 \
            and isinstance(nonconst[0][0][0], FDiv):
        inner: FDiv = nonconst[0][0][0]
        return add(qexpr, floordiv(add(inner.num, inner.den * rexpr.const), inner.den * k))
    # bounds: if 0 <= rexpr < k the atom is 0
    lo, hi = bounds(rexpr)
    if lo >= 0 and hi < k:
        return qexpr
    return add(qexpr, _atom_expr(FDiv(rexpr, k)))


def ceildiv(a, k) -> Dim:
    if a is None or k is None:
        return None
    if isinstance(k, Expr):
        return exact_div(a, k)
    return floordiv(add(a, k - 1), k)


def mod(a, k) -> Dim:
    if a is None or k is None:
        return None
    if isinstance(k, Expr):
        return None
    if isinstance(a, int):
        return a % k
    return sub(a, mul(k, floordiv(a, k)))


# --------------------------------------------------------------------------- exact division
def _mono_divides(d: Mono, m: Mono) -> Mono | None:
    rest = list(m)
    for a in d:
        try:
            rest.remove(a)
        except ValueError:
            return None
    return tuple(rest)


def exact_div(a, b) -> Dim:
    """``a / b`` when b divides a exactly as polynomials, else None (nac)."""
    if a is None or b is None:
        return None
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        if all(c % b == 0 for _, c in a.terms):
            return Expr.from_dict({m: c // b for m, c in a.terms})
        return None
    if a == b:
        return 1
    if isinstance(a, int):
        return 0 if a == 0 else None  # 0 / b == 0 wherever b != 0
    # polynomial long division with the largest monomial (by degree, then key) as leader
    def lead(d: dict):
        return max(d.items(), key=lambda mc: (len(mc[0]), _mono_key(mc[0])))

    rem = dict(a.terms)
    bd = dict(b.terms)
    bm, bc = lead(bd)
    quot: dict = {}
    for _ in range(64):
        if not rem:
            return Expr.from_dict(quot)
        rm, rc = lead(rem)
        qm = _mono_divides(bm, rm)
        if qm is None or rc % bc != 0:
            return None
        qc = rc // bc
        quot[qm] = quot.get(qm, 0) + qc
        for m, c in bd.items():
            mm = _mono_mul(qm, m)
            v = rem.get(mm, 0) - qc * c
            if v:
                rem[mm] = v
            else:
                rem.pop(mm, None)
    return None


# --------------------------------------------------------------------------- min / max
def _minmax(is_max: bool, args: Iterable) -> Dim:
    flat: list = []
    for x in _const_unwrap(args):
        if x is None:
            return None
        if isinstance(x, Expr) and len(x.terms) == 1 and x.terms[0][1] == 1 \
                and len(x.terms[0][0]) == 1 and isinstance(x.terms[0][0][0], MinMax) \
                and x.terms[0][0][0].is_max == is_max:
            flat.extend(x.terms[0][0][0].args)
        else:
            flat.append(x)
    flat = list(_const_unwrap(flat))
    ints = [x for x in flat if isinstance(x, int)]
    exprs: list = []
    for x in flat:
        if isinstance(x, Expr) and x not in exprs:
            exprs.append(x)
    cands: list = exprs + ([max(ints) if is_max else min(ints)] if ints else [])
    # prune by bounds: drop y when some other x already dominates it
    keep: list = []
    for i, y in enumerate(cands):
        dominated = False
        for j, x in enumerate(cands):
            if i == j:
                continue
            lo, hi = bounds(sub(x, y))
            always_equal = lo == hi == 0  # keep exactly one of equal candidates (the first)
            if is_max and lo >= 0 and (not always_equal or j < i):
                dominated = True
            if not is_max and hi <= 0 and (not always_equal or j < i):
                dominated = True
            if dominated:
                break
        if not dominated:
            keep.append(y)
    if len(keep) == 1:
        return keep[0]
    keep.sort(key=lambda v: (1, v) if isinstance(v, int) else (0, v.key))
    args_e = tuple(v if isinstance(v, Expr) else Expr((((), v),)) for v in keep)
    return _atom_expr(MinMax(is_max, args_e))


def _const_unwrap(args):
    """min/max arguments are stored as Exprs; constant ones come back as ints."""
    for x in args:
        if isinstance(x, Expr) and len(x.terms) == 1 and x.terms[0][0] == ():
            yield x.terms[0][1]
        else:
            yield x


def dmin(*args) -> Dim:
    return _minmax(False, args)


def dmax(*args) -> Dim:
    return _minmax(True, args)


# --------------------------------------------------------------------------- bounds
def _imul(a: tuple, b: tuple) -> tuple:
    vals = []
    for x in a:
        for y in b:
            if (x == 0 and abs(y) == INF) or (y == 0 and abs(x) == INF):
                vals.append(0)
            else:
                vals.append(x * y)
    return min(vals), max(vals)


def _atom_bounds(a: AnyAtom) -> tuple:
    if isinstance(a, Sym):
        return 0, _UPPER.get().get(a.name, INF)
    if isinstance(a, FDiv):
        lo, hi = bounds(a.num)
        return (lo // a.den if lo != -INF else -INF), (hi // a.den if hi != INF else INF)
    bs = [bounds(x) for x in a.args]
    if a.is_max:
        return max(b[0] for b in bs), max(b[1] for b in bs)
    return min(b[0] for b in bs), min(b[1] for b in bs)


def bounds(e) -> tuple:
    """Interval (lo, hi) of a dim over all symbol values >= 0 (may be +-inf)."""
    if e is None:
        return -INF, INF
    if isinstance(e, int):
        return e, e
    lo = hi = 0
    terms = dict(e.terms)
    for m, t in list(e.terms):
        if len(m) == 1 and isinstance(m[0], FDiv) and m in terms:
            k = m[0].den
            if t < 0 and t % k == 0:
                c = -t // k
                part = [(mm, cc * c) for mm, cc in m[0].num.terms]
                if all(terms.get(mm) == cc for mm, cc in part):
                    for mm, _ in part:  # c*num - c*k*(num//k) == c*(num mod k)
                        del terms[mm]
                    del terms[m]
                    hi += c * (k - 1)
    for m, c in terms.items():
        iv = (1, 1)
        for a in m:
            iv = _imul(iv, _atom_bounds(a))
        iv = _imul(iv, (c, c))
        lo, hi = lo + iv[0], hi + iv[1]
    return lo, hi


def is_nonneg(d) -> bool:
    return d is not None and bounds(d)[0] >= 0


def provably_ne(d, v: int) -> bool:
    """True when dim d can never equal int v."""
    if d is None:
        return False
    if isinstance(d, int):
        return d != v
    lo, hi = bounds(d)
    if lo > v or hi < v:
        return True
    g = 0
    for _, c in d.terms:
        g = math.gcd(g, c)
    return g > 1 and v % g != 0  # every value is a multiple of g


# --------------------------------------------------------------------------- evaluation
@overload
def evaluate(d: int | Expr, env: Mapping[str, int]) -> int: ...


@overload
def evaluate(d: None, env: Mapping[str, int]) -> None: ...


def evaluate(d: Dim, env: Mapping[str, int]) -> int | None:
    """Value of dim ``d`` with symbols bound by ``env`` (KeyError for an unbound symbol)."""
    if d is None:
        return None
    if isinstance(d, int):
        return d
    return _evaluate_expr(d, env)


def _evaluate_expr(e: Expr, env: Mapping[str, int]) -> int:
    total = 0
    for m, c in e.terms:
        v = c
        for a in m:
            v *= _eval_atom(a, env)
        total += v
    return total


def _eval_atom(a: AnyAtom, env: Mapping[str, int]) -> int:
    if isinstance(a, Sym):
        return env[a.name]
    if isinstance(a, FDiv):
        return _evaluate_expr(a.num, env) // a.den
    vals = [_evaluate_expr(x, env) for x in a.args]
    return max(vals) if a.is_max else min(vals)


def substitute(d, mapping: Mapping[str, Dim]) -> Dim:
    """Replace symbols by dims (None makes the result nac)."""
    if not isinstance(d, Expr):
        return d
    total: Dim = 0
    for m, c in d.terms:
        v: Dim = c
        for a in m:
            v = mul(v, _subst_atom(a, mapping))
            if v is None:
                return None
        total = add(total, v)
    return total


def _subst_atom(a: AnyAtom, mapping: Mapping[str, Dim]) -> Dim:
    if isinstance(a, Sym):
        return mapping[a.name] if a.name in mapping else _atom_expr(a)
    if isinstance(a, FDiv):
        return floordiv(substitute(a.num, mapping), a.den)
    return _minmax(a.is_max, [substitute(x, mapping) for x in a.args])


# --------------------------------------------------------------------------- rendering
def _render_atom(a: AnyAtom, alone: bool) -> str:
    if isinstance(a, Sym):
        return a.name
    if isinstance(a, FDiv):
        inner = str(a.num)
        if not (len(a.num.terms) == 1 and a.num.terms[0][1] == 1 and len(a.num.terms[0][0]) == 1
                and not isinstance(a.num.terms[0][0][0], FDiv)):
            inner = f"({inner})"
        s = f"{inner}//{a.den}"
        return s if alone else f"({s})"
    fn = "max" if a.is_max else "min"
    return f"{fn}({', '.join(str(x) for x in a.args)})"


def _render_mono(m: Mono, c: int, first: bool) -> str:
    """Render abs-valued term; sign handled by the caller."""
    ac = abs(c)
    if not m:
        return str(ac)
    alone = ac == 1 and len(m) == 1 and (c > 0)
    parts = [_render_atom(a, alone) for a in m]
    body = "*".join(parts)
    return body if ac == 1 else f"{ac}*{body}"


def _render(e: Expr) -> str:
    terms = sorted(e.terms, key=lambda mc: (-len(mc[0]) if mc[0] else 1, _mono_key(mc[0])))
    out = []
    for i, (m, c) in enumerate(terms):
        body = _render_mono(m, c, i == 0)
        if i == 0:
            out.append(("-" + (body if m == () or not any(isinstance(a, FDiv) for a in m)
                               or len(m) > 1 or abs(c) != 1 else f"({body})")) if c < 0 else body)
        else:
            out.append((" - " if c < 0 else " + ") + body)
    return "".join(out)


def to_json_dim(d) -> int | str | None:
    if d is None or isinstance(d, int):
        return d
    return str(d)


# --------------------------------------------------------------------------- parsing
_BINOPS = {ast.Add: add, ast.Sub: sub, ast.Mult: mul}


def parse(text: str, numeric_env: Mapping[str, int] | None = None) -> Dim:
    """Parse a rendered expression (restricted grammar, no eval).

    With ``numeric_env`` the symbols are replaced by their ints, which evaluates it.
    """
    node = ast.parse(text.strip(), mode="eval").body

    def walk(n) -> Dim:
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return n.value
        if isinstance(n, ast.Name):
            if numeric_env is not None:
                if n.id not in numeric_env:
                    raise ValueError(f"unbound symbol {n.id!r} in {text!r}")
                return int(numeric_env[n.id])
            return sym(n.id)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return mul(walk(n.operand), -1)
        if isinstance(n, ast.BinOp):
            lhs, rhs = walk(n.left), walk(n.right)
            if type(n.op) in _BINOPS:
                return _BINOPS[type(n.op)](lhs, rhs)
            if isinstance(n.op, (ast.FloorDiv, ast.Mod)):
                if not isinstance(rhs, int) or rhs <= 0:
                    if isinstance(lhs, int) and isinstance(rhs, int) and rhs != 0:
                        return lhs // rhs if isinstance(n.op, ast.FloorDiv) else lhs % rhs
                    raise ValueError(f"division by a non-positive or symbolic value in {text!r}")
                return floordiv(lhs, rhs) if isinstance(n.op, ast.FloorDiv) else mod(lhs, rhs)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("min", "max") \
                and not n.keywords and n.args:
            args = [walk(a) for a in n.args]
            return dmin(*args) if n.func.id == "min" else dmax(*args)
        raise ValueError(f"unsupported syntax in dimension expression {text!r}")

    return walk(node)


def eval_str(text, env: Mapping[str, int]) -> int | None:
    """Evaluate a JSON dim (int, expression string or None) with symbol values."""
    if text is None or isinstance(text, int):
        return text
    v = parse(text, env)
    assert isinstance(v, int)
    return v


# --------------------------------------------------------------------------- rational values
class Ratio:
    """An exact dyadic rational ``num / den`` held by a *float* shape tensor.

    Shape sub-graphs often compute ``Cast(H) / 32.0 → Ceil → Cast``.  With a
    power-of-two ``den`` (≤ 2**7) and values below 2**16 float32 arithmetic on
    these numbers is exact, so ``floor``/``ceil`` of the ratio are the runtime's.
    """

    __slots__ = ("num", "den")
    MAX_DEN = 128

    def __init__(self, num, den: int):
        self.num, self.den = num, den

    def __eq__(self, other):
        return isinstance(other, Ratio) and self.num == other.num and self.den == other.den

    def __hash__(self):
        return hash((self.num, self.den))

    def __repr__(self):
        return f"Ratio({self.num}, {self.den})"


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def make_ratio(num, den: int):
    """Normalised num/den: an int/Expr when exact, a Ratio, or None (not dyadic)."""
    if num is None or den == 0:
        return None
    if den < 0:
        num, den = mul(num, -1), -den
    if isinstance(num, int):
        g = math.gcd(num, den)
    else:
        g = den
        for _, c in num.terms:
            g = math.gcd(g, c)
    if g > 1:
        num = exact_div(num, g)
        den //= g
    if den == 1:
        return num
    if not _pow2(den) or den > Ratio.MAX_DEN:
        return None
    if isinstance(num, int):
        return num / den
    return Ratio(num, den)


def as_ratio(x):
    """(num, den) of an int / Expr / Ratio / dyadic float, else None."""

    if isinstance(x, bool):
        return int(x), 1
    if isinstance(x, (int, Expr)):
        return x, 1
    if isinstance(x, Ratio):
        return x.num, x.den
    if isinstance(x, float) and math.isfinite(x):
        f = Fraction(x)
        if f.denominator <= Ratio.MAX_DEN:
            return f.numerator, f.denominator
    return None


def ratio_op(op: str, a, b):
    """Add/Sub/Mul/Div on exact values where one side is symbolic."""
    ra, rb = as_ratio(a), as_ratio(b)
    if ra is None or rb is None:
        return None
    (an, ad), (bn, bd) = ra, rb
    if op == "Add":
        return make_ratio(add(mul(an, bd), mul(bn, ad)), ad * bd)
    if op == "Sub":
        return make_ratio(sub(mul(an, bd), mul(bn, ad)), ad * bd)
    if op == "Mul":
        num = mul(an, bn)
        return make_ratio(num, ad * bd)
    if op == "Div":
        if not isinstance(bn, int) or bn == 0:
            q = exact_div(mul(an, bd), mul(bn, ad)) if bn != 0 else None
            return q
        return make_ratio(mul(an, bd), ad * bn)
    return None


def ratio_floor(x, ceil: bool = False):
    r = as_ratio(x) if isinstance(x, (Ratio, Expr, int)) else None
    if r is None:
        return None
    num, den = r
    return ceildiv(num, den) if ceil else floordiv(num, den)
