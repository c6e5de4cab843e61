"""ONNX Runtime segments called from a Relax VM: a run of a model's ops as one ORT session.

A segment is a run of a Relax function's bindings, in order: the ops an ORT device
(:meth:`autoplace.Device.onnxruntime`) runs, with the aliases, tuples and tuple items between
them. :func:`autoplace.graph.segments.cut` finds the segments of a placement and
:func:`autoplace.graph.segments.export` turns one into an ONNX model (:class:`OrtSegment`):
each op is computed by its PyTorch equivalent
(:func:`autoplace.backend.torch_equivalents.node_equivalent`), under a module scope of its own,
and the whole traced by PyTorch's ONNX exporter, so that every ONNX node is known to come from
one op (:attr:`OrtSegment.onnx_nodes`) and ORT rewrites the segment as a whole (its layouts
kept from conv to conv, batch norms folded, activations fused). :func:`register` makes an ORT
session of it a packed function that the VM calls
(``R.call_pure_packed("autoplace.ort_segment.<id>", inputs..., outputs' types)``): the VM's
tensors are read in place, and the VM adopts the 64-byte-aligned buffers ORT returns its
outputs in through DLPack. How a segment is timed (each op's seconds by ORT's profiler, the
fastest level and thread count) is :mod:`autoplace.backend.ort_profiling`.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoplace.backend.tensors import aligned_empty

#: Prefix of the global function names of ORT segments.
PREFIX = "autoplace.ort_segment."
#: Graph optimization levels by name (``SessionOptions.graph_optimization_level``).
LEVELS = ("all", "extended", "basic")
#: ONNX Runtime's graph transformers that fuse several nodes into one kernel, by the name
#: ``disabled_optimizers`` takes, and the ops their fused nodes are (``"domain:op_type"``; a
#: domain alone for all its ops). A fused kernel is not faster than the nodes it replaces on
#: every CPU: where the optimized graph has one,
#: :func:`~autoplace.backend.ort_profiling.fastest_variant` times the graph with
#: that transformer disabled too. A level names the transformers it disables after a ``-``
#: each: ``"extended-SkipLayerNormFusion"`` (:func:`level_parts`).
FUSIONS = {
    "SkipLayerNormFusion": ("com.microsoft:SkipLayerNormalization",
                            "com.microsoft:SkipSimplifiedLayerNormalization"),
    "LayerNormFusion": ("com.microsoft:SimplifiedLayerNormalization",),
    "MatMulScaleFusion": ("com.microsoft:FusedMatMul",),
    "MatMulAddFusion": ("ai.onnx:Gemm",),
    "GemmActivationFusion": ("com.microsoft:FusedGemm",),
    "GeluFusion": ("com.microsoft:Gelu",),
    "BiasGeluFusion": ("com.microsoft:BiasGelu",),
    "FastGeluFusion": ("com.microsoft:FastGelu",),
    "QuickGeluFusion": ("com.microsoft:QuickGelu",),
    "BiasSoftmaxFusion": ("com.microsoft:BiasSoftmax",),
    "AttentionFusion": ("com.microsoft:Attention",),
    "EmbedLayerNormFusion": ("com.microsoft:EmbedLayerNormalization",),
    "ConvActivationFusion": ("com.microsoft:FusedConv",),
    "NchwcTransformer": ("com.microsoft.nchwc",),
}
_SCOPED = r"/(op_[^/]+)/"  # an ONNX node name's op scope (see scope())
#: How a session's threads wait (:func:`session`) and how the VM calls it (:func:`register`),
#: part of what its timings are kept under.
THREADS_WAIT = "spin-in-call-run"

# global name -> (segment, threads, level). Kept for the life of the process: builds call the
# functions by name.
_REGISTRY: dict[str, tuple] = {}


class OrtSegmentError(RuntimeError):
    """A segment that cannot be exported to ONNX or run by ONNX Runtime; the message names its
    ops."""


def require() -> None:
    """Raise ``ImportError`` with the install command where ONNX Runtime or PyTorch (which
    exports the segments) is missing."""
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise ImportError("an ONNX Runtime device needs onnxruntime and PyTorch: "
                          "pip install 'autoplace[ort]'") from None


@dataclass(frozen=True, eq=False)
class OrtSegment:
    """One segment as an ONNX model: ``onnx`` (its bytes), its inputs and outputs (``(shape,
    dtype)`` each, in the order of :attr:`Span.inputs` and :attr:`Span.outputs`), the op-graph
    node names it computes, and per node name the ONNX nodes it became."""

    onnx: bytes = field(repr=False)
    inputs: tuple
    outputs: tuple
    ops: tuple[str, ...]
    onnx_nodes: Mapping[str, tuple[str, ...]]

    @functools.cached_property
    def id(self) -> str:
        return hashlib.sha1(self.onnx).hexdigest()[:16]

    def session(self, threads: int = 1, level: str = "all"):
        """An ORT CPU session of the segment on ``threads`` intra-op threads at graph
        optimization ``level`` (:func:`level_parts`)."""
        return session(self.onnx, threads, level)


def onnx_export(module, inputs: Sequence, **kwargs) -> bytes:
    """``module`` (a ``torch.nn.Module``) traced on ``inputs`` (torch tensors) and exported to
    ONNX by PyTorch's TorchScript-based exporter (the one that needs no onnxscript), with
    ``kwargs`` (``input_names``, ``output_names``, ...). Quiet: its deprecation and tracer
    warnings are not shown, and its log, which it turns on for good and prints a failed graph
    to, is kept as it was. Where ``opset_version`` is given and an op was added to ONNX only in
    a later opset (``bitwise_and``: 18), the whole module is exported at that opset instead."""
    try:
        return _onnx_export(module, inputs, **kwargs)
    except Exception as e:  # noqa: BLE001 - the exporter's UnsupportedOperatorError, by text
        later = re.search(r"added in version (\d+)", str(e))
        if "opset_version" not in kwargs or later is None \
                or int(later.group(1)) <= kwargs["opset_version"]:
            raise
        return _onnx_export(module, inputs, **{**kwargs, "opset_version": int(later.group(1))})


def _onnx_export(module, inputs: Sequence, **kwargs) -> bytes:
    import contextlib
    import io
    import warnings
    from unittest import mock

    import torch

    exporter = getattr(getattr(torch.onnx, "_internal", None), "torchscript_exporter", None)
    quiet = (mock.patch.object(exporter.utils, "setup_onnx_logging",
                               lambda verbose: contextlib.nullcontext())
             if hasattr(getattr(exporter, "utils", None), "setup_onnx_logging")
             else contextlib.nullcontext())
    logging_was = torch._C._jit_is_onnx_log_enabled()
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings(), quiet, torch.no_grad():
            warnings.simplefilter("ignore", DeprecationWarning)  # the exporter is legacy
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(module, tuple(inputs), buf, dynamo=False, **kwargs)
    finally:
        torch._C._jit_set_onnx_log_enabled(logging_was)
    return buf.getvalue()


def session(model: bytes, threads: int, level: str, profile_prefix: str | None = None,
            optimized: str | None = None, spin_after: bool = False):
    """An ORT session of ONNX ``model`` on the CPU execution provider: ``threads`` intra-op
    threads that spin while a call runs and stop when it ends (with ``spin_after``, go on
    spinning for a while after it, ORT's default), one inter-op thread, graph
    optimization ``level`` (one of :data:`LEVELS`, or ORT's name, ``"ORT_ENABLE_ALL"``; with
    the fusions it disables, :func:`level_parts`);
    profiled into files of ``profile_prefix`` where given, its optimized graph saved at
    ``optimized`` where given."""
    import onnxruntime as ort

    level, disabled = level_parts(level)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    # Threads that sleep between nodes wake late for each node's work; threads that go on
    # spinning after a call (ORT's default) take the cores TVM's kernels and PyTorch's calls
    # need next.
    if not spin_after:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                            f"ORT_ENABLE_{level.upper()}")
    opts.log_severity_level = 3
    if optimized is not None:  # the graph is what is read of it: weights in a file apart
        opts.optimized_model_filepath = optimized
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                      os.path.basename(optimized) + ".weights")
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    more = {"disabled_optimizers": list(disabled)} if disabled else {}
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"], **more)


def level_parts(level: str) -> tuple[str, tuple[str, ...]]:
    """A level's graph optimization level (of :data:`LEVELS`; ORT's name, ``"ORT_ENABLE_ALL"``,
    is taken too) and the graph transformers it disables (:data:`FUSIONS`), from
    ``"<level>[-<transformer>...]"``. A ValueError names what is wrong with any other text."""
    base, *disabled = str(level).split("-")
    base = base.removeprefix("ORT_ENABLE_").lower()
    if base not in LEVELS:
        raise ValueError(f"graph optimization level {level!r}: one of {LEVELS}, then the "
                         f"transformers it disables after a '-' each (of {sorted(FUSIONS)})")
    unknown = [f for f in disabled if f not in FUSIONS]
    if unknown:
        raise ValueError(f"graph optimization level {level!r} disables {unknown}: not among "
                         f"the fusions autoplace times ({sorted(FUSIONS)})")
    return base, tuple(disabled)


def level_text(level: str) -> str:
    """A level in words, its graph optimization level as written: ``"extended without
    SkipLayerNormFusion"``, ``"ORT_ENABLE_ALL without SkipLayerNormFusion"``."""
    _, disabled = level_parts(level)
    base = str(level).split("-")[0]
    return base + (f" without {', '.join(disabled)}" if disabled else "")


def refuse(model: bytes) -> tuple[bytes, dict[str, tuple[str, ...]]]:
    """``model`` (an exported segment) with the ops that ``torch.export``'s decompositions split put
    back together. A mean over every spatial axis of an image (an adaptive average pool to one
    pixel, as ``torch.export`` writes it) becomes the global average pool it was: ORT keeps the
    blocked layout of the convs around a ``GlobalAveragePool`` and reorders it back and forth around
    a ``ReduceMean``. Then, by onnxscript's rewrite rules where onnxscript is installed: a clip
    written as two, hard sigmoid (``clip(x + 3, 0, 6) / 6``) and hard swish (``x`` times that). ORT
    fuses a ``HardSwish`` into the conv before it and keeps the blocked layout across it; the ops it
    came from it runs one by one, each between layout reorders. A node the rules make is named in
    the scope of the op whose output it gives (the op that computed that tensor before), so
    :func:`op_of` knows it; and per such node, the scopes of the exported nodes it replaced.
    ``model`` itself (the same bytes, not written again: a segment of a large model is hundreds of
    megabytes) where nothing applies, the rules fail, or onnxscript is missing."""
    import onnx

    try:
        proto = onnx.load_from_string(model)
        _infer_shapes(proto)
        pools = _global_pools(proto)
    except Exception:  # noqa: BLE001 - the rewrites are an optimization: the segment as exported
        return model, {}
    fused = _rules_applied(proto)
    if fused is None:
        return (proto.SerializeToString() if pools else model), {}
    producer = {o: n for n in proto.graph.node for o in n.output}
    replaced = {}
    for k, node in enumerate(fused.graph.node):
        was = producer.get(node.output[0]) if node.output else None
        m = re.search(_SCOPED, was.name) if was is not None else None
        if m is None or re.search(_SCOPED, node.name):
            continue
        node.name = f"/{m.group(1)}/{node.op_type}_fused{k}"
        # the exported nodes between the new node's inputs and its output
        scopes, todo, seen = set(), [was], set(node.input)
        while todo:
            n = todo.pop()
            if (sm := re.search(_SCOPED, n.name)) is not None:
                scopes.add(sm.group(1))
            for t in n.input:
                if t and t not in seen and t in producer:
                    seen.add(t)
                    todo.append(producer[t])
        replaced[node.name] = tuple(sorted(scopes))
    return fused.SerializeToString(), replaced


def _rules_applied(proto):
    """``proto`` rewritten by onnxscript's rules of :func:`refuse` (unused nodes dropped), or
    None where none applies, they fail, or onnxscript is missing."""
    try:
        import onnx_ir.passes.common as passes
        from onnxscript import ir
        from onnxscript.rewriter import RewritePass
        from onnxscript.rewriter.rules import common as rules
    except ImportError:
        return None
    try:
        model = ir.serde.deserialize_model(proto)
        found = RewritePass([
            rules.successive_clip_rule, rules.successive_relu_rule,
            rules.successive_clip_relu_rule, rules.successive_relu_clip_rule,
            *rules.fuse_hardswish_rules()])(model)
        if not found.modified:
            return None
        passes.RemoveUnusedNodesPass()(found.model)
        return ir.serde.serialize_model(found.model)
    except Exception:  # noqa: BLE001 - the rules are an optimization: the segment as exported
        return None


def _global_pools(proto) -> int:
    """Make each ``ReduceMean`` of ``proto`` (a shape-inferred ONNX model: :func:`_infer_shapes`)
    that averages a float tensor of rank 4 or more over all its spatial axes (every axis after
    the channels) and keeps them a ``GlobalAveragePool``, in place, under the same node name;
    returns how many. A mean over the last axis of a rank-3 tensor (a norm's, in a transformer)
    stays a mean: ORT's norm fusions look for it."""
    from onnx import TensorProto, helper, numpy_helper

    graph = proto.graph
    means = [n for n in graph.node
             if n.op_type == "ReduceMean" and n.domain in ("", "ai.onnx") and n.input]
    if not means:
        return 0
    types = {v.name: v.type.tensor_type for v in (*graph.input, *graph.value_info, *graph.output)}
    # tensors by name, decoded only where a mean's axes are one (not the segment's weights)
    consts = {i.name: i for i in graph.initializer}
    consts.update({n.output[0]: t for n in graph.node if (t := _constant(n)) is not None})
    floats = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}
    made = 0
    for n in means:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        ty = types.get(n.input[0])
        if ty is None or ty.elem_type not in floats or not ty.HasField("shape"):
            continue
        rank = len(ty.shape.dim)
        axes = attrs.get("axes")
        if axes is None and len(n.input) > 1 and n.input[1] in consts:
            axes = numpy_helper.to_array(consts[n.input[1]]).reshape(-1).tolist()
        if rank < 4 or axes is None or attrs.get("keepdims", 1) != 1 \
                or sorted(int(a) % rank for a in axes) != list(range(2, rank)):
            continue
        n.op_type = "GlobalAveragePool"
        del n.input[1:]
        del n.attribute[:]
        made += 1
    return made


#: Initializers and ``Constant`` nodes of more elements than this are weights: shape inference
#: needs their type and shape, not their values (it reads the values of small ones, e.g. a
#: reshape's target shape).
_WEIGHT_ELEMENTS = 4096


def _infer_shapes(proto) -> None:
    """Give ``proto``'s graph the type and shape of each of its tensors (its ``value_info``, in
    place), as ONNX's shape inference finds them on a copy of the graph whose large weights
    (:data:`_WEIGHT_ELEMENTS`), initializers or ``Constant`` nodes, are graph inputs of their
    type and shape: the weights are neither copied nor written out for it."""
    import onnx

    graph = proto.graph
    light = onnx.ModelProto(ir_version=proto.ir_version, opset_import=proto.opset_import)
    g = light.graph
    for n in graph.node:
        value = _constant(n)
        typed = None if value is None else _as_input(n.output[0], value)
        if typed is None:
            g.node.append(n)
        else:
            g.input.append(typed)
    g.input.extend(graph.input)
    g.output.extend(graph.output)
    g.value_info.extend(graph.value_info)
    inputs = {i.name for i in graph.input}
    for t in graph.initializer:
        if t.name in inputs:  # listed among the inputs already (IR version 3)
            continue
        typed = _as_input(t.name, t)
        if typed is None:
            g.initializer.append(t)
        else:
            g.input.append(typed)
    inferred = onnx.shape_inference.infer_shapes(light).graph.value_info
    del graph.value_info[:]
    graph.value_info.extend(inferred)


def _constant(node):
    """The tensor a ``Constant`` node gives, or None for any other node."""
    if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return node.attribute[0].t
    return None


def _as_input(name: str, tensor):
    """A graph input named ``name`` of ``tensor``'s type and shape where it is a weight (more
    than :data:`_WEIGHT_ELEMENTS` elements), else None."""
    import math

    from onnx import helper

    if math.prod(tensor.dims) <= _WEIGHT_ELEMENTS:
        return None
    return helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))


def scope(node: str) -> str:
    """The submodule name a node's call is traced under (ONNX nodes are named ``/scope/...``)."""
    return "op_" + re.sub(r"\W", "_", node)


def op_of(onnx_node: str, ops: Sequence[str]) -> str | None:
    """The op (of ``ops``) an ONNX node name of the exported graph, or of ORT's optimized graph
    (which keeps the name of a node a fused node grew from: ``"fused /op_x/MatMul/..."``), was
    traced under; None for the nodes ORT adds (layout reorders)."""
    m = re.search(_SCOPED, onnx_node)
    if not m:
        return None
    scopes = {scope(o): o for o in ops}
    return scopes.get(m.group(1))


# ----------------------------------------------------------------------------- calls from the VM


def register(segment: OrtSegment, threads: int = 1, level: str = "all") -> str:
    """Register a packed function running ``segment`` in an ORT session (``threads`` intra-op
    threads, graph optimization ``level``) under its global name, once per segment and
    settings, and return the name. The function takes the segment's inputs as TVM CPU tensors
    and returns its outputs as new TVM tensors (a tuple where it has several); an ORT error is
    an :class:`OrtSegmentError` naming the segment's ops."""
    import tvm

    name = f"{PREFIX}{segment.id}_{threads}_{level}"
    if name not in _REGISTRY:
        fn = _function(segment, segment.session(threads, level))
        tvm.register_global_func(name, fn, override=True)
        _REGISTRY[name] = (segment, threads, level)
    return name


def called(mod) -> list[str]:
    """The global names of the ORT segments module ``mod`` (or its text) calls, sorted."""
    return sorted(set(re.findall(re.escape(PREFIX) + r"[0-9a-f]{16}_\d+_[a-z]+(?:-[A-Za-z]+)*",
                                 str(mod))))


def saved(name: str) -> tuple[bytes, dict]:
    """What brings registered segment ``name`` back in another process
    (:func:`register_saved`): its ONNX model, and the rest as JSON."""
    if name not in _REGISTRY:
        raise KeyError(f"{name} is no ORT segment registered in this process")
    seg, threads, level = _REGISTRY[name]
    return seg.onnx, {"inputs": [[list(s), d] for s, d in seg.inputs],
                      "outputs": [[list(s), d] for s, d in seg.outputs], "ops": list(seg.ops),
                      "threads": threads, "level": level}


def register_saved(onnx: bytes, spec: Mapping) -> str:
    """Register again a segment :func:`saved` gave; returns its global name (the same)."""
    seg = OrtSegment(onnx, tuple((tuple(s), d) for s, d in spec["inputs"]),
                     tuple((tuple(s), d) for s, d in spec["outputs"]), tuple(spec["ops"]), {})
    return register(seg, int(spec["threads"]), str(spec["level"]))


def relax_call(name: str, args, outputs):
    """The Relax call of segment function ``name`` on ``args`` giving ``outputs`` (Relax
    tensor types): a tuple of them, or the one."""
    from tvm import relax

    ty = outputs[0] if len(outputs) == 1 else relax.TupleType(list(outputs))
    return relax.op.call_pure_packed(name, *args, ty_args=ty)


def own_run(sess):
    """``sess``'s own run, called as ``run(output_names, feeds, None)``: the session's
    ``InferenceSession.run`` without the Python wrapper's checks of the feed's names (the
    caller's are the session's) and its fallback off a GPU provider; the wrapper's where
    ``sess`` has none."""
    inner = getattr(sess, "_sess", None)
    return inner.run if hasattr(inner, "run") else sess.run


def _function(segment: OrtSegment, sess):
    import tvm

    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    outs = [(tuple(s), np.dtype(d)) for s, d in segment.outputs]
    ops = ", ".join(segment.ops)
    # ORT reads the VM's tensors in place and returns its outputs in buffers of its own, 64-byte
    # aligned, which the VM adopts: binding new output buffers each call (I/O binding) costs
    # ORT more than it saves.
    run = own_run(sess)
    several = len(outs) > 1

    def call(*args):
        try:
            got = run(out_names, {n: np.from_dlpack(t) for n, t in zip(in_names, args)}, None)
        except Exception as e:  # noqa: BLE001 - any ORT error, named for the caller
            raise OrtSegmentError(f"ONNX Runtime segment of {ops} raised "
                                  f"{type(e).__name__}: {e}") from e
        out = [_adopted(a, shape, dtype, ops) for a, (shape, dtype) in zip(got, outs)]
        return tvm.runtime.convert(out) if several else out[0]

    return call


def _adopted(a: np.ndarray, shape: tuple, dtype: np.dtype, ops: str):
    """ORT's output ``a`` as the TVM tensor the segment gives: ``a`` itself where it is of
    ``dtype`` in memory TVM adopts (64-byte aligned, contiguous: TVM's own check, cheaper than
    reading the address from numpy), else a copy into such memory; an
    :class:`OrtSegmentError` where its shape is not ``shape``."""
    import tvm

    a = np.asarray(a)
    if a.shape != shape:
        raise OrtSegmentError(f"ONNX Runtime segment of {ops} gave an output of shape "
                              f"{a.shape} where {shape} was expected")
    if a.dtype == dtype:
        try:
            return tvm.runtime.from_dlpack(a)
        except RuntimeError:  # not aligned, or not contiguous
            pass
    out = aligned_empty(shape, dtype)
    np.copyto(out, a, casting="unsafe")
    return tvm.runtime.from_dlpack(out)


# ------------------------------------------------------------------------------------ profiling

def random_inputs(inputs: Sequence[tuple]) -> list[np.ndarray]:
    """Random arrays of ``inputs``' ``(shape, dtype)`` (small integers, half-true masks)."""
    rng = np.random.default_rng(0)
    out = []
    for shape, dtype in inputs:
        if dtype == "bool":
            a = rng.random(shape) < 0.5
        elif dtype.startswith(("int", "uint")):
            a = rng.integers(0, 2, shape).astype(dtype)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        out.append(np.asarray(a))  # an array, also of shape (): numpy gives those as scalars
    return out
