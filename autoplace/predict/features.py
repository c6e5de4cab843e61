"""Features of one workload on one device, for the learned cost models.

A workload is known by its key (:attr:`autoplace.OpNode.workload_key`: op, input shapes and dtypes,
attributes) and the FLOP / byte counts the op graph computes for it. The same numbers are in a
profile store's ``workloads`` table, so the features of a measured row and of a graph node that
was never measured are computed by one function from the same inputs.

:func:`tir_features` adds what TVM's own cost model sees: the op is rebuilt from its key,
legalized to the PrimFunc a default build compiles, and described by MetaSchedule's
``PerStoreFeature`` (loop extents, vectorisation, bytes, strides and reuse of every buffer access).
:func:`code_features` adds what LLVM made of that PrimFunc for a CPU target: how much of its float
arithmetic came out as SIMD vectors. An untuned kernel's loops are vectorised or not by LLVM's own
heuristics (a ``[4,32]x[32,32]`` matmul is, ``[4,40]x[40,32]`` is not, and runs at half the FLOP/s),
which no shape feature tells. :func:`executed_counts` estimates how many of those instructions
run (:mod:`autoplace.predict.llvm_ir`), for the learned model's baseline
(:class:`~autoplace.predict.instructions.InstructionModel`). :func:`cache_features` adds how often
the loop nest misses the caches and TLBs per load (:mod:`autoplace.predict.misses`): two scalar
matmuls of one FLOP count differ several-fold in time when one walks a matrix's columns with a
stride of a large power of two. These four read TVM through a
:class:`~autoplace.predict.kernels.KernelAnalysis`, which computes each workload once.

>>> from autoplace.predict.features import features
>>> row = {"key": '["relax.nn.relu",[[[1,64,56,56],"float32"]],{},[]]',
...        "flops": 200704.0, "bytes_read": 802816, "bytes_written": 802816}
>>> x, names = features(row, {"threads": 1, "peak_flops": 4e9, "mem_bandwidth": 1e10})
>>> len(x) == len(names) == len(FEATURE_NAMES)
True
>>> float(x[names.index("op=nn.relu")])
1.0
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from autoplace.graph.opgraph import dtype_bits
from autoplace.predict.kernels import (CACHE_FEATURE_NAMES, CODE_FEATURE_NAMES, TIR_FEATURE_NAMES,
                                       KernelAnalysis)
from autoplace.predict.llvm_ir import EXECUTED_COUNT_NAMES

# Op types with their own one-hot column; any other op type gets ``op=other`` and still its class.
OP_TYPES = (
    "add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "nn.relu", "nn.gelu",
    "nn.silu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "clip", "nn.conv2d", "matmul",
    "nn.batch_norm", "nn.layer_norm", "nn.softmax", "nn.max_pool2d", "nn.avg_pool2d",
    "nn.adaptive_avg_pool2d", "mean", "sum", "max", "concat", "reshape", "permute_dims",
    "broadcast_to", "strided_slice", "squeeze", "expand_dims", "take", "zeros_like", "astype",
)
# Coarse classes, so that an op type never seen in training still shares a column with its kin.
OP_CLASSES = ("elementwise", "conv", "matmul", "norm", "softmax", "pool", "reduce", "layout")
_CLASS_OF = {
    "nn.conv2d": "conv", "nn.conv1d": "conv", "nn.conv2d_transpose": "conv",
    "matmul": "matmul", "nn.linear": "matmul", "nn.batch_norm": "norm", "nn.layer_norm": "norm",
    "nn.group_norm": "norm", "nn.rms_norm": "norm", "nn.softmax": "softmax",
    "nn.log_softmax": "softmax", "nn.max_pool2d": "pool", "nn.avg_pool2d": "pool",
    "nn.adaptive_avg_pool2d": "pool", "mean": "reduce", "sum": "reduce", "max": "reduce",
    "min": "reduce", "prod": "reduce", "variance": "reduce", "concat": "layout",
    "reshape": "layout", "permute_dims": "layout", "broadcast_to": "layout",
    "strided_slice": "layout", "squeeze": "layout", "expand_dims": "layout", "take": "layout",
    "split": "layout", "flatten": "layout", "zeros_like": "layout", "ones_like": "layout",
}
MAX_INPUTS, MAX_RANK = 3, 4

FEATURE_NAMES: tuple[str, ...] = (
    *(f"op={t}" for t in OP_TYPES), "op=other", *(f"class={c}" for c in OP_CLASSES),
    "n_inputs", "rank",
    *(f"in{i}_dim{j}" for i in range(MAX_INPUTS) for j in range(MAX_RANK)),
    "log2_in_elems", "log2_out_elems", "out_over_in",
    "kernel_h", "kernel_w", "stride_h", "stride_w", "padding", "dilation", "log2_groups",
    "depthwise", "n_axes", "keepdims",
    "log10_flops", "log10_bytes_read", "log10_bytes_written", "log10_intensity", "dtype_bits",
    "inner_mod4", "inner_mod8", "inner_mod16", "in1_inner_mod8", "in0_row_pow2", "in1_row_pow2",
    "log2_walk_lines_per_set",
    "threads", "log10_peak_flops", "log10_mem_bandwidth", "log10_t_compute", "log10_t_memory",
)
_INDEX = {n: i for i, n in enumerate(FEATURE_NAMES)}




def _pow2_factor(n: int, cap: int = 16) -> int:
    """log2 of the largest power of two dividing ``n`` (at most ``cap``): a row stride of a
    large power of two bytes maps a column walk onto few cache sets."""
    return min((n & -n).bit_length() - 1, cap) if n > 0 else 0


# An L1 data cache of 64-byte lines in 64 sets: x86 cores of the last decade (32 KiB 8-way,
# 48 KiB 12-way) and most Arm big cores.
_L1_SETS, _LINE = 64, 64


def _reduction_walk(op: str, inputs, attrs) -> tuple[int, int] | None:
    """``(stride bytes, length)`` of the strided walk of an untuned kernel's innermost reduction.

    TVM's default (untuned) matmul loops ``i, j, k`` read ``B[k, j]`` down a column; an NCHW
    conv reads its input across channels a padded plane apart. Other ops: ``None``.
    """
    if op == "matmul" and len(inputs) == 2 and len(inputs[1][0]) >= 2:
        (b, dtype) = inputs[1]
        return b[-1] * dtype_bits(dtype) // 8, b[-2]
    if op == "nn.conv2d" and len(inputs) == 2 and len(inputs[0][0]) == 4 \
            and (attrs.get("data_layout") or "NCHW") == "NCHW":
        (x, dtype), pad = inputs[0], attrs.get("padding") or [0, 0, 0, 0]  # Relax: 4 values
        plane = (x[2] + pad[0] + pad[2]) * (x[3] + pad[1] + pad[3])
        return plane * dtype_bits(dtype) // 8, x[1] // int(attrs.get("groups") or 1)
    return None


def _lines_per_set(stride: int, length: int) -> float:
    """Lines per L1 set that a walk of ``length`` accesses ``stride`` bytes apart keeps live: more
    than the cache's ways and each access misses (a large power-of-two stride hits few sets)."""
    if length <= 1:
        return 1.0
    sets = _L1_SETS if stride % _LINE else _L1_SETS // math.gcd(stride // _LINE, _L1_SETS)
    return length / min(length, sets)


def parse_key(key: str) -> tuple[str, list[tuple[tuple[int, ...], str]], dict[str, Any]]:
    """``(op_type, [(shape, dtype), ...], attrs)`` of a workload key."""
    op, inputs, attrs, _extra = json.loads(key)
    return op.removeprefix("relax."), [(tuple(s), d) for s, d in inputs], attrs or {}


def workload_row(node) -> dict:
    """The store-row view (key, op_type, flops, bytes) of an :class:`autoplace.OpNode`."""
    return {"key": node.workload_key, "op_type": node.op_type, "flops": float(node.flops),
            "bytes_read": node.bytes_read, "bytes_written": node.bytes_written}


def workload_rows(graph_or_rows) -> list[dict]:
    """:func:`workload_row` of every node of an op graph, or the rows given as a list."""
    if hasattr(graph_or_rows, "nodes"):
        return [workload_row(n) for n in graph_or_rows.nodes]
    return list(graph_or_rows)


def features(workload, device=None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Fixed-width feature vector of a workload on a device, and the feature names.

    Parameters
    ----------
    workload : OpNode or mapping
        A graph node, or a store row with ``key``, ``flops``, ``bytes_read``, ``bytes_written``.
    device : mapping, object or None
        Read for ``threads``, ``peak_flops`` and ``mem_bandwidth`` (a mapping's keys or an
        object's attributes, e.g. :class:`autoplace.Device`); a missing value is ``nan``.

    Returns
    -------
    x : ndarray of float, shape (len(FEATURE_NAMES),)
        Dimensions, sizes and work are log-scaled; absent entries are 0 (padding) or ``nan``.
    names : tuple of str
        :data:`FEATURE_NAMES`.
    """
    row = workload if isinstance(workload, Mapping) else workload_row(workload)
    op, inputs, attrs = parse_key(row["key"])
    x = np.zeros(len(FEATURE_NAMES))
    put = lambda name, value: x.__setitem__(_INDEX[name], value)  # noqa: E731

    put(f"op={op}" if op in OP_TYPES else "op=other", 1.0)
    if op in _CLASS_OF:
        put(f"class={_CLASS_OF[op]}", 1.0)
    elif not op.startswith("nn."):
        put("class=elementwise", 1.0)
    shapes = [s for s, _ in inputs]
    put("n_inputs", len(shapes))
    put("rank", len(shapes[0]) if shapes else 0)
    for i, shape in enumerate(shapes[:MAX_INPUTS]):
        for j, d in enumerate(shape[-MAX_RANK:][::-1]):  # innermost first, so columns line up
            put(f"in{i}_dim{MAX_RANK - 1 - j}", math.log2(d + 1))
    bits = dtype_bits(inputs[0][1]) if inputs else 32
    in_elems = sum(math.prod(s) for s in shapes)
    out_elems = row["bytes_written"] * 8 / bits
    put("log2_in_elems", math.log2(in_elems + 1))
    put("log2_out_elems", math.log2(out_elems + 1))
    put("out_over_in", out_elems / max(in_elems, 1))

    kernel = attrs.get("pool_size")
    if kernel is None and op.startswith("nn.conv") and len(shapes) > 1:
        kernel = shapes[1][2:]
    kernel = list(kernel or [])
    strides, dilation = list(attrs.get("strides") or []), list(attrs.get("dilation") or [])
    put("kernel_h", kernel[0] if kernel else 0)
    put("kernel_w", kernel[-1] if kernel else 0)
    put("stride_h", strides[0] if strides else 0)
    put("stride_w", strides[-1] if strides else 0)
    put("padding", sum(attrs.get("padding") or []))
    put("dilation", max(dilation) if dilation else 0)
    groups = int(attrs.get("groups") or 1)
    put("log2_groups", math.log2(groups))
    put("depthwise", float(groups > 1 and len(shapes[0]) > 1 and groups == shapes[0][1]))
    axes = attrs.get("axis", attrs.get("axes"))
    put("n_axes", len(axes) if isinstance(axes, list) else (0 if axes is None else 1))
    put("keepdims", float(bool(attrs.get("keepdims"))))

    flops, read, written = float(row["flops"]), float(row["bytes_read"]), float(row["bytes_written"])
    put("log10_flops", math.log10(flops + 1))
    put("log10_bytes_read", math.log10(read + 1))
    put("log10_bytes_written", math.log10(written + 1))
    put("log10_intensity", math.log10((flops + 1) / (read + written + 1)))
    put("dtype_bits", bits)
    inner = shapes[0][-1] if shapes and shapes[0] else 1
    for m in (4, 8, 16):
        put(f"inner_mod{m}", float(inner % m == 0))
    put("in1_inner_mod8", float(len(shapes) > 1 and bool(shapes[1]) and shapes[1][-1] % 8 == 0))
    for i, (shape, dtype) in enumerate(inputs[:2]):
        put(f"in{i}_row_pow2", _pow2_factor(shape[-1] * dtype_bits(dtype) // 8) if shape else 0)
    walk = _reduction_walk(op, inputs, attrs)
    put("log2_walk_lines_per_set", math.log2(_lines_per_set(*walk)) if walk else 0.0)

    threads, peak, bw = (_get(device, k) for k in ("threads", "peak_flops", "mem_bandwidth"))
    put("threads", threads)
    put("log10_peak_flops", math.log10(peak) if peak > 0 else math.nan)
    put("log10_mem_bandwidth", math.log10(bw) if bw > 0 else math.nan)
    put("log10_t_compute", math.log10((flops + 1) / peak) if peak > 0 else math.nan)
    put("log10_t_memory", math.log10((read + written + 1) / bw) if bw > 0 else math.nan)
    return x, FEATURE_NAMES


def feature_matrix(workloads, devices) -> np.ndarray:
    """Rows of :func:`features`; ``devices`` is one device for all or one per workload."""
    workloads = list(workloads)
    if not isinstance(devices, (list, tuple)):
        devices = [devices] * len(workloads)
    if not workloads:
        return np.zeros((0, len(FEATURE_NAMES)))
    return np.stack([features(w, d)[0] for w, d in zip(workloads, devices)])


def tir_features(workloads, analysis: KernelAnalysis | None = None, targets=None) -> np.ndarray:
    """MetaSchedule ``PerStoreFeature`` of each workload's legalized PrimFunc, max over stores.

    The op is rebuilt from its workload key, legalized as a default build for its target lowers
    it (:func:`autoplace.backend.lowering.legalize`) and each store's 164 features are
    extracted; a workload gets their element-wise maximum. Workloads whose op cannot be rebuilt
    from the key (attributes the key does not carry, e.g. ``strided_slice``'s bounds) get
    ``nan``. About 10 ms per workload on a small CPU; each distinct key is extracted once per
    ``analysis`` and kind of target (CPU or not).

    Parameters
    ----------
    workloads : iterable of OpNode or mapping
        As for :func:`features`.
    analysis : KernelAnalysis, optional
        Where each key's PrimFuncs and features are remembered; default: a new one.
    targets : str, tvm Target or None, or a list of them (one per workload)
        The device's TVM target; ``None`` (the default): TVM's own ``LegalizeOps``.

    Returns
    -------
    ndarray of float, shape (n, len(TIR_FEATURE_NAMES))
        Columns named by :data:`TIR_FEATURE_NAMES`, in TVM's order (``per_store_feature.cc``).
    """
    keys, analysis = _keys(workloads), analysis or KernelAnalysis()
    if not isinstance(targets, (list, tuple)):
        targets = [targets] * len(keys)
    return (np.stack([analysis.tir_vector(k, None if t is None else str(t))
                      for k, t in zip(keys, targets)]) if keys
            else np.zeros((0, len(TIR_FEATURE_NAMES))))


def code_features(workloads, targets, analysis: KernelAnalysis | None = None) -> np.ndarray:
    """How LLVM compiled each workload's legalized op for a CPU target: SIMD or scalar.

    The PrimFuncs of :func:`tir_features` are compiled for the target and their optimized LLVM IR
    is counted: float arithmetic (multiply, add, fused multiply-add, compare, min, max, exp,
    sqrt) on vectors and on scalars, the vectors' share of the lanes,
    vector and scalar loads, conditional branches and lines. About 60 ms per distinct workload and
    target on a small CPU, remembered by ``analysis`` (default: a new one).

    Parameters
    ----------
    workloads : iterable of OpNode or mapping
        As for :func:`features`.
    targets : str, tvm Target or None, or a list of them (one per workload)
        The device's TVM target (a profile's ``info["target"]``). A target that is not LLVM (a
        GPU), ``None``, or an op the key cannot rebuild gives ``nan``.

    Returns
    -------
    ndarray of float, shape (n, len(CODE_FEATURE_NAMES))
    """
    return _per_key(workloads, targets, analysis, 0, len(CODE_FEATURE_NAMES))


def executed_counts(workloads, targets, analysis: KernelAnalysis | None = None) -> np.ndarray:
    """What the compiled code of :func:`code_features` executes, per workload: the columns of
    :data:`~autoplace.predict.llvm_ir.EXECUTED_COUNT_NAMES`, estimated from the IR's loop trip
    counts (:mod:`autoplace.predict.llvm_ir`). Same arguments, cost and ``nan`` cases."""
    return _per_key(workloads, targets, analysis, 1, len(EXECUTED_COUNT_NAMES))


def cache_features(workloads, targets, analysis: KernelAnalysis | None = None) -> np.ndarray:
    """Cache and TLB misses of each workload's legalized loop nest
    (:mod:`autoplace.predict.misses`) per load that :func:`executed_counts` counts; same arguments,
    cost and ``nan`` cases, and ``nan`` for a loop nest the estimate cannot follow."""
    return _per_key(workloads, targets, analysis, 2, len(CACHE_FEATURE_NAMES))


def _per_key(workloads, targets, analysis, part: int, width: int) -> np.ndarray:
    keys, analysis = _keys(workloads), analysis or KernelAnalysis()
    if not isinstance(targets, (list, tuple)):
        targets = [targets] * len(keys)
    if not keys:
        return np.zeros((0, width))
    targets = [None if t is None else str(t) for t in targets]
    analysis.count(zip(keys, targets))
    return np.stack([analysis.code_counts(k, t)[part] for k, t in zip(keys, targets)])


def _keys(workloads) -> list[str]:
    return [(w if isinstance(w, Mapping) else workload_row(w))["key"] for w in workloads]


def _get(device, name: str) -> float:
    if device is None:
        return math.nan
    value = device.get(name) if isinstance(device, Mapping) else getattr(device, name, None)
    return math.nan if value is None else float(value)
