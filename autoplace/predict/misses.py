"""Cache and TLB misses of an untuned kernel, estimated from its TIR loop nests.

TVM's default lowering of an op is a plain loop nest whose order LLVM keeps, so the loop that
carries each access's reuse decides how often its lines come back: a ``[M,K]x[K,N]`` matmul reads
``B`` down a column, and once that column's ``K`` lines overflow a cache (few sets when the row
stride is a power of two) every access misses. Nothing here is measured: a reference hierarchy
(:data:`CACHES`, :data:`TLBS`: this project's CPU) is modelled, and the learned cost model gets
the miss rates as features whose cost it learns per device.

For each access and each loop around it, the footprint of the loops inside (distinct lines per
in-page offset, and pages) is enumerated up to 2^18 points and grown from the inner loops' beyond.
Going outwards, what one iteration of a loop touches again from the previous one hits in the
share of lines that the iteration's footprint (every access under that loop) keeps: lines in sets
that do not overflow, a page's lines landing on the cache's page colours at random. Misses are
per run in a steady state of repeated runs.
"""

from __future__ import annotations

import math

import numpy as np

LINE, PAGE = 64, 4096
# (name, sets, ways): 64-byte lines, physically indexed beyond the 4 KiB page.
CACHES = (("l1", 64, 8), ("l2", 1024, 8), ("l3", 32768, 16))
TLBS = (("l1_tlb", 64), ("l2_tlb", 2048))  # data TLB entries of AMD Zen 3 (this CPU, family 25)
MISS_NAMES = tuple(f"{name}_misses" for name, *_ in (*CACHES, *TLBS))
_CLASSES = PAGE // LINE  # in-page line offsets: what a virtual address fixes of a cache set
_ENUMERATED = 1 << 18


def misses(funcs) -> dict[str, float]:
    """Lines missed in each cache and pages missed in each TLB (:data:`MISS_NAMES`) per run of
    the legalized PrimFuncs ``funcs``.

    Raises ``ValueError`` on a nest it cannot follow: a loop of symbolic extent, an index other
    than integer arithmetic of loop and block variables.
    """
    try:
        accesses = [a for f in funcs for a in _accesses(f)]
        whole = sum({a.buffer.name: a.whole for a in accesses}.values())
        out = {}
        for level in (*CACHES, *TLBS):
            kept_between_runs = 1 - _lost(whole, level) if accesses else 0.0
            pages = len(level) == 2
            n = sum(_nest_misses(a, accesses, level) - a.touched(0, pages) * kept_between_runs
                    for a in accesses)
            out[f"{level[0]}_misses"] = max(float(n), 0.0)
    except (TypeError, KeyError) as err:
        raise ValueError(f"cannot follow this loop nest: {err}") from err
    return out


class _Access:
    """One buffer access of a block, the loops around it (outermost first) and the bindings of
    its block variables."""

    def __init__(self, buffer, indices, loops, bind):
        self.buffer, self.indices, self.loops, self.bind = buffer, indices, loops, bind
        shape = [int(s) for s in buffer.shape]
        self.strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        self.itemsize = max(1, _bits(buffer.dtype) // 8)
        lines = -(-math.prod(shape) * self.itemsize // LINE)
        self.whole = np.append(np.full(_CLASSES, lines / _CLASSES), -(-lines // _CLASSES))
        self._footprints: dict[int, np.ndarray] = {}

    def addresses(self, env) -> np.ndarray:
        """Byte offsets for loop variables bound in ``env`` (arrays), the others at 0."""
        env = {**{v: 0 for v, _ in self.loops}, **env}
        flat = sum(_evaluate(i, env, self.bind) * s for i, s in zip(self.indices, self.strides))
        return np.asarray(flat) * self.itemsize

    def footprint(self, depth: int) -> np.ndarray:
        """Lines per in-page offset (64 counts) and pages (last) touched while the loops from
        ``depth`` inwards run, the outer ones at their first iteration."""
        if depth not in self._footprints:
            if math.prod(e for _, e in self.loops[depth:]) <= _ENUMERATED:
                f = self._enumerate(depth)
            else:
                f = self._extrapolate(depth)
            self._footprints[depth] = f
        return self._footprints[depth]

    def _extrapolate(self, depth: int) -> np.ndarray:
        """The footprint of the loop at ``depth`` grown from its inner loops' (``one``).

        Each further iteration adds what iteration ``k`` adds to iteration 0, over ``k``, where
        ``k`` iterations of the loop's step cross a line (a page); where two iterations are too
        many points to enumerate, the step's share of ``one``. A loop that does not move the
        access adds nothing. The lines spread over in-page offsets as the iterations shift them.
        """
        (var, extent), below = self.loops[depth], math.prod(e for _, e in self.loops[depth + 1:])
        one = self.footprint(depth + 1)
        first, second = np.broadcast_to(self.addresses({var: np.arange(2)}), 2)
        step = abs(int(second) - int(first))
        grown = one.copy()
        for part, unit in ((slice(0, -1), LINE), (slice(-1, None), PAGE)):
            if step and below <= _ENUMERATED:
                k = min(-(-unit // step), extent - 1)
                added = (self._enumerate(depth, np.array([0, k]))[part] - one[part]) / k
            else:  # each iteration shifts every unit by a step's share of it
                added = one[part] * min(1.0, step / unit)
            grown[part] += added * (extent - 1)
        lines = min(grown[:-1].sum(), self.whole[:-1].sum())
        shifts = (np.arange(extent) * step // LINE) % _CLASSES
        spread = sum(times * np.roll(one[:-1], shift) for shift, times in
                     enumerate(np.bincount(shifts, minlength=_CLASSES)))
        spread = spread * (lines / spread.sum()) if spread.sum() else spread
        return np.append(np.minimum(spread, self.whole[:-1]), min(grown[-1], self.whole[-1]))

    def touched(self, depth: int, pages: bool) -> float:
        f = self.footprint(depth)
        return float(f[-1] if pages else f[:-1].sum())

    def _enumerate(self, depth: int, first: np.ndarray | None = None) -> np.ndarray:
        """The footprint of the loops from ``depth`` inwards, all their iterations, or those of
        the loop at ``depth`` in ``first``."""
        values = [np.arange(e) for _, e in self.loops[depth:]]
        if first is not None:
            values[0] = first
        env = {v: x.reshape([-1 if j == i else 1 for j in range(len(values))])
               for i, ((v, _), x) in enumerate(zip(self.loops[depth:], values))}
        lines = np.broadcast_to(self.addresses(env), [len(x) for x in values]) // LINE
        return _distinct(lines.ravel())


def _distinct(lines: np.ndarray) -> np.ndarray:
    """Distinct ``lines`` per in-page offset (64 counts) and distinct pages (last): marked in a
    table of the lines they span where that is not much larger than they are, else sorted."""
    if not lines.size:
        return np.zeros(_CLASSES + 1)
    low = int(lines.min()) // _CLASSES * _CLASSES
    span = int(lines.max()) + 1 - low
    if span > 8 * lines.size + _ENUMERATED:
        lines = np.unique(lines)
        return np.append(np.bincount(lines % _CLASSES, minlength=_CLASSES),
                         np.unique(lines // _CLASSES).size).astype(float)
    seen = np.zeros(-(-span // _CLASSES) * _CLASSES, dtype=bool)
    seen[lines - low] = True
    pages = seen.reshape(-1, _CLASSES)
    return np.append(pages.sum(axis=0), pages.any(axis=1).sum()).astype(float)


def _nest_misses(a: _Access, accesses, level) -> float:
    """Misses of ``a`` in one run of its loop nest: outwards from one access, each loop's
    iterations miss what they touch anew plus what they touch again and the cache lost."""
    pages = len(level) == 2
    n = 1.0
    for d in range(len(a.loops) - 1, -1, -1):
        extent = a.loops[d][1]
        if extent <= 1:
            continue
        one, all_ = a.touched(d + 1, pages), a.touched(d, pages)
        again = max(one - (all_ - one) / (extent - 1), 0.0)
        under = sum(b.footprint(d + 1) for b in accesses if _shares(a, b, d))
        # an iteration misses at least what it touches, whatever the estimates' rounding
        n = max(extent * max(n, one) - (extent - 1) * again * (1 - _lost(under, level)), all_)
    return n


def _shares(a: _Access, b: _Access, depth: int) -> bool:
    """Whether ``b`` sits inside ``a``'s loop at ``depth`` (and the loops outside it)."""
    return len(b.loops) > depth and all(x[0].same_as(y[0]) for x, y in
                                        zip(a.loops[:depth + 1], b.loops[:depth + 1]))


def _lost(footprint: np.ndarray, level) -> float:
    """Share of a footprint's lines (pages) a cache (TLB) cannot keep: lines in sets holding
    more than their ways, with a page's 64 lines placed on a random colour of ``sets / 64``."""
    from scipy.special import bdtrc

    if len(level) == 2:
        return float(footprint[-1] > level[1])
    _, sets, ways = level
    n = footprint[:-1]
    if n.sum() <= 0:
        return 0.0
    colours = sets // _CLASSES
    if colours == 1:
        return float(n[n > ways].sum() / n.sum())
    # E[X; X > ways] for X ~ Binomial(n, 1/colours) is n/colours * P(Binomial(n-1, .) >= ways)
    # (bdtrc: the binomial's upper tail, nan where n - 1 < ways, which has none)
    others = np.maximum(np.round(n), 1).astype(np.int64) - 1
    tail = np.where(others >= ways, bdtrc(ways - 1, np.maximum(others, ways), 1 / colours), 0.0)
    return float((n * tail).sum() / n.sum())


def _accesses(func) -> list[_Access]:
    """Every distinct buffer region a leaf block reads or writes, with the loops around it."""
    from tvm import s_tir
    from tvm.tirx import stmt

    out: list[_Access] = []

    def walk(node, loops, bind):
        if isinstance(node, stmt.For):
            walk(node.body, [*loops, (node.loop_var, int(node.extent))], bind)
        elif isinstance(node, stmt.SeqStmt):
            for s in node.seq:
                walk(s, loops, bind)
        elif isinstance(node, s_tir.SBlockRealize):
            block = node.block
            bind = {**bind, **{iv.var: v for iv, v in zip(block.iter_vars, node.iter_values)}}
            if isinstance(block.body, (stmt.For, stmt.SeqStmt, s_tir.SBlockRealize)):
                walk(block.body, loops, bind)
                return
            seen = set()
            for region in (*block.reads, *block.writes):
                indices = [r.min for r in region.region]
                key = (region.source.name, tuple(_structural_hash(i) for i in indices))
                if key not in seen:
                    seen.add(key)
                    out.append(_Access(region.source, indices, loops, bind))
        elif hasattr(node, "body"):
            walk(node.body, loops, bind)

    walk(func.body, [], {})
    return out


def _evaluate(expr, env, bind):
    """An integer index expression over numpy arrays: loop variables from ``env``, block
    variables through their ``bind``-ings."""
    from tvm.tirx import expr as e

    if isinstance(expr, e.IntImm):
        return int(expr.value)
    if isinstance(expr, e.Var):
        if expr not in env:
            env[expr] = _evaluate(bind[expr], env, bind)
        return env[expr]
    if isinstance(expr, e.Cast):
        return _evaluate(expr.value, env, bind)
    for kind, fn in ((e.Add, np.add), (e.Sub, np.subtract), (e.Mul, np.multiply),
                     (e.FloorDiv, np.floor_divide), (e.FloorMod, np.mod),
                     (e.Min, np.minimum), (e.Max, np.maximum)):
        if isinstance(expr, kind):
            return fn(_evaluate(expr.a, env, bind), _evaluate(expr.b, env, bind))
    raise TypeError(f"cannot evaluate the index expression {type(expr).__name__}")


def _structural_hash(expr) -> int:
    import tvm_ffi

    return tvm_ffi.structural_hash(expr)


def _bits(dtype) -> int:
    import tvm

    return tvm.DataType(str(dtype)).bits
