"""What TVM and LLVM make of a workload's op, computed once per workload key for the life of one
:class:`KernelAnalysis`.

The op is rebuilt from its key (:func:`autoplace.profile.workload.module_from_key`) and legalized
as a build for the device's target lowers it (:func:`autoplace.backend.lowering.legalize`: TVM's
``LegalizeOps``, GELU with a fast ``erf`` on a CPU). From its PrimFuncs come
MetaSchedule's per-store features, the LLVM IR a CPU target compiles them to, and the loop nest's
cache misses. The feature functions of :mod:`autoplace.predict.features` read them through an
analysis object: pass one object to every call (and every cost model) that sees the same workloads.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from autoplace.backend.lowering import legalize
from autoplace.backend.threads import process_cpus
from autoplace.predict.misses import MISS_NAMES
from autoplace.predict.misses import misses as cache_misses
from autoplace.predict.llvm_ir import EXECUTED_COUNT_NAMES, FLOAT_VECTOR, line_kind
from autoplace.predict.llvm_ir import executed_counts as executed_ir_counts
from autoplace.profile.workload import module_from_key

# MetaSchedule's PerStoreFeature: 164 floats per buffer store (5 buffers per store, 10 samples of
# the arithmetic-intensity curve); a workload's vector is the maximum over its PrimFunc's stores.
TIR_FEATURE_NAMES: tuple[str, ...] = tuple(f"tir{i}" for i in range(164))

# Counted in the optimized LLVM IR of the op compiled for a CPU target (counts log2(1 + n)).
CODE_FEATURE_NAMES: tuple[str, ...] = (
    "code_vector_ops", "code_scalar_ops", "code_vector_share", "code_vector_loads",
    "code_scalar_loads", "code_branches", "code_lines",
)

# Cache lines and TLB pages the untuned loop nest misses per executed load, on a reference CPU.
CACHE_FEATURE_NAMES: tuple[str, ...] = tuple(f"{n}_per_load" for n in MISS_NAMES)


class KernelAnalysis:
    """The legalized PrimFuncs of workload keys and what is computed from them, each computed once
    per key (and target) for the life of this object. Results are shared: read them only.

    >>> analysis = KernelAnalysis()
    >>> key = '["relax.nn.relu",[[[1,64],"float32"]],{},[]]'
    >>> analysis.tir_vector(key) is analysis.tir_vector(key)      # doctest: +SKIP
    True
    """

    def __init__(self):
        self._funcs: dict[tuple[str, bool], dict | None] = {}
        self._tir: dict[tuple[str, bool], np.ndarray] = {}
        self._code: dict[tuple[str, str | None], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._misses: dict[str, dict[str, float] | None] = {}
        self._context = None

    def prim_funcs(self, key: str, target: str | None = None) -> dict | None:
        """The PrimFuncs of the key's op legalized for ``target`` (a target string or its JSON;
        ``None``: TVM's own ``LegalizeOps``), named for building; ``None`` when the key cannot
        rebuild the op (attributes it does not carry, e.g. ``strided_slice``'s bounds)."""
        cpu = _is_cpu(target)
        if (key, cpu) not in self._funcs:
            self._funcs[key, cpu] = _legalized(key, "llvm" if cpu else None)
        return self._funcs[key, cpu]

    def tir_vector(self, key: str, target: str | None = None) -> np.ndarray:
        """MetaSchedule ``PerStoreFeature`` of the key's PrimFuncs for ``target``, the maximum
        over stores."""
        cpu = _is_cpu(target)
        if (key, cpu) not in self._tir:
            self._tir[key, cpu] = self._extract_tir(key, "llvm" if cpu else None)
        return self._tir[key, cpu]

    def code_counts(self, key: str, target: str | None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(code features, executed counts, cache misses per load) of the key on ``target`` (a
        target string or its JSON); ``nan`` where there is no LLVM target or no PrimFunc. What
        a CPU target compiles to is also kept on disk (:func:`counts_dir`), so that another
        process, or another model with the same workloads, compiles nothing again."""
        self.count([(key, target)])
        return self._code[key, target]

    def count(self, pairs) -> None:
        """Compute :meth:`code_counts` of every (key, target) pair in ``pairs`` not yet known
        here or on disk. The LLVM builds run on threads, one per core this process may use (LLVM
        gives the interpreter up while it compiles): call it with every pair a prediction needs,
        where nothing is being timed."""
        todo = []
        for key, target in dict.fromkeys(pairs):
            if (key, target) in self._code:
                continue
            path = _counts_path(key, target)
            found = _read_counts(path) if path is not None else None
            if found is not None:
                self._code[key, target] = found
            else:
                todo.append((key, target, path))
        for key, target, _ in todo:  # the interpreter's part first, shared by the threads
            if _is_cpu(target) and self.prim_funcs(key, "llvm"):
                self.loop_misses(key)
        if len(todo) > 1 and len(cpus := process_cpus()) > 1:
            with ThreadPoolExecutor(min(len(todo), len(cpus)), initializer=_unpin,
                                    initargs=(cpus,)) as pool:
                counted = list(pool.map(lambda t: self._compile_and_count(t[0], t[1]), todo))
        else:
            counted = [self._compile_and_count(key, target) for key, target, _ in todo]
        for (key, target, path), found in zip(todo, counted):
            if path is not None:
                _write_counts(path, found)
            self._code[key, target] = found

    def loop_misses(self, key: str) -> dict[str, float] | None:
        """:func:`autoplace.predict.misses.misses` of the key's PrimFuncs as a CPU build lowers
        them; ``None`` for a nest the estimate cannot follow (symbolic extents, other
        indices)."""
        if key not in self._misses:
            try:
                self._misses[key] = cache_misses(self.prim_funcs(key, "llvm").values())
            except ValueError:
                self._misses[key] = None
        return self._misses[key]

    def _extract_tir(self, key: str, target: str | None) -> np.ndarray:
        import tvm
        from tvm.s_tir import meta_schedule as ms

        funcs = self.prim_funcs(key, target)
        if funcs is None:
            return np.full(len(TIR_FEATURE_NAMES), np.nan)
        context, extractor = self._tune_context(), ms.feature_extractor.PerStoreFeature()
        stores = [extractor.extract_from(context, [ms.MeasureCandidate(
                      tvm.s_tir.Schedule(tvm.IRModule({"main": f})), [])])[0].numpy()
                  for f in funcs.values()]
        stores = [m for m in stores if m.shape[0]]
        return np.concatenate(stores).max(axis=0) if stores else np.zeros(len(TIR_FEATURE_NAMES))

    def _compile_and_count(self, key: str, target: str | None):
        import tvm

        widths = len(CODE_FEATURE_NAMES), len(EXECUTED_COUNT_NAMES), len(CACHE_FEATURE_NAMES)
        nan = tuple(np.full(w, np.nan) for w in widths)
        if target is None:
            return nan
        target_ = _parse_target(target)
        funcs = self.prim_funcs(key, "llvm") if target_.kind.name == "llvm" else None
        if funcs is None:
            return nan
        if not funcs:
            return tuple(np.zeros(w) for w in widths)
        try:
            lib = tvm.compile(tvm.IRModule(funcs), target=target_)
            ir = getattr(lib, "mod", lib).inspect_source("ll")
        except Exception:  # noqa: BLE001 - a kernel LLVM cannot build here tells nothing
            return nan
        static, lanes = Counter(), 0
        for line in ir.splitlines():
            static[kind := line_kind(line)] += 1
            if kind == "vector_float_ops":
                lanes += int(FLOAT_VECTOR.search(line).group(1))
        scalar_ops = static["scalar_float_ops"]
        share = lanes / (lanes + scalar_ops) if lanes + scalar_ops else 0.0
        counts = (static["vector_float_ops"], scalar_ops, static["vector_loads"],
                  static["scalar_loads"], ir.count("br i1 "), ir.count("\n"))
        log2 = [math.log2(1 + c) for c in counts]
        executed = executed_ir_counts(ir)
        missed = self.loop_misses(key)
        loads = executed["vector_loads"] + executed["scalar_loads"] + 1
        rates = nan[2] if missed is None else np.array([missed[n] / loads for n in MISS_NAMES])
        return (np.array([*log2[:2], share, *log2[2:]]),
                np.array([executed[n] for n in EXECUTED_COUNT_NAMES]), rates)

    def _tune_context(self):
        """A bare MetaSchedule ``TuneContext`` (target llvm), all that ``PerStoreFeature`` reads.

        ``TuneContext()`` itself first imports ``tvm.s_tir.tensor_intrin``, which parses ~500
        TVMScript functions (1-2 minutes on a small CPU); the FFI constructor skips that.
        """
        if self._context is None:
            import tvm
            from tvm.s_tir import meta_schedule as ms
            from tvm.s_tir.meta_schedule import _ffi_api

            context = ms.TuneContext.__new__(ms.TuneContext)
            context.__init_handle_by_constructor__(_ffi_api.TuneContext, None,
                                                   tvm.target.Target("llvm"), None, None, "main",
                                                   1, -1, None)
            self._context = context
        return self._context


def _unpin(cpus) -> None:
    """Let a worker thread run on ``cpus``: a thread starts on its creator's cores, and the
    thread that runs TVM's kernels is pinned to one."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _parse_target(target: str):
    """A target from its string or its JSON (a profile's ``info["target"]``)."""
    import tvm

    return tvm.target.Target(json.loads(target) if target.startswith("{") else target)


@functools.lru_cache(maxsize=64)
def _is_cpu(target: str | None) -> bool:
    return target is not None and _parse_target(target).kind.name == "llvm"


def _legalized(key: str, target: str | None) -> dict | None:
    import tvm

    try:
        mod = legalize(module_from_key(key), target)
    except Exception:  # noqa: BLE001 - any op the key cannot rebuild has no such features
        return None
    return {gv: f.with_attr("global_symbol", gv.name_hint) for gv, f in mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc)}


def counts_dir():
    """Where the code counts of workloads are kept between processes: a folder per TVM version
    under :func:`autoplace.profile.calibration_cache.cache_dir`."""
    import tvm

    from autoplace.profile.calibration_cache import cache_dir

    return cache_dir() / f"code_counts_tvm{tvm.__version__}"


def _counts_path(key: str, target: str | None):
    """The file of ``key``'s counts on ``target``, or None where there is nothing to keep (no
    target)."""
    import hashlib

    if target is None:
        return None
    digest = hashlib.sha1(f"{target}\n{key}".encode()).hexdigest()[:24]
    return counts_dir() / f"{digest}.json"


def _read_counts(path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The counts kept at ``path``, or None where there are none or they cannot be read."""
    try:
        parts = json.loads(path.read_text())["counts"]
        return tuple(np.array([np.nan if v is None else v for v in p], dtype=float)
                     for p in parts)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_counts(path, counts) -> None:
    """Keep ``counts`` at ``path`` (written whole); a folder that cannot be written keeps
    nothing."""
    from autoplace.profile.calibration_cache import write_whole

    try:
        write_whole(path, {"counts": [[None if np.isnan(v) else float(v) for v in p]
                                      for p in counts]})
    except OSError:
        pass
