"""Segments of a Relax function: runs of ops that one runtime device calls as one.

:func:`cut` finds the segments of a placement on an ONNX Runtime device
(:meth:`autoplace.Device.onnxruntime`), :func:`export` turns one into an ONNX model: each op is
computed by its PyTorch equivalent (:func:`autoplace.backend.torch_equivalents.node_equivalent`)
under a module scope of its own, and the whole traced by PyTorch's ONNX exporter, so that every
ONNX node is known to come from one op (:attr:`~autoplace.backend.ort_segments.OrtSegment.onnx_nodes`)
and ORT rewrites the segment as a whole.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from autoplace.backend.ort_segments import (OrtSegment, OrtSegmentError, onnx_export, refuse,
                                            random_inputs, scope)
from autoplace.graph.opgraph import OpGraph, is_op_call, iter_bindings


@dataclass(frozen=True)
class Span:
    """Where a segment is in a Relax function: its bindings (``first`` to ``stop``, by position
    among the function's bindings), its op-graph nodes, the variables it reads from outside
    (``inputs``) and those read after it or returned (``outputs``)."""

    first: int
    stop: int
    nodes: tuple[int, ...]
    inputs: tuple = ()
    outputs: tuple = ()


def cut(func, on: Sequence[bool]) -> list[Span]:
    """The segments of Relax function ``func`` where ``on[i]`` says whether op-graph node ``i``
    runs on the ORT device: each a maximal run of such ops, in binding order (with the bindings
    between them that are no op calls, and the tuple items right after the last), so that no
    path leaves a segment and comes back into it."""
    bindings = list(iter_bindings(func))
    node_at, k = {}, 0
    for i, b in enumerate(bindings):
        if is_op_call(b.value):
            node_at[i], k = k, k + 1
    spans, i = [], 0
    while i < len(bindings):
        if i not in node_at or not on[node_at[i]]:
            i += 1
            continue
        first, last = i, i
        j = i + 1
        while j < len(bindings) and (j not in node_at or on[node_at[j]]):
            if j in node_at:
                last = j
            j += 1
        stop = last + 1
        defined = {bindings[n].var for n in range(first, stop)}
        while stop < len(bindings) and stop not in node_at and _reads_only(
                bindings[stop].value, defined):
            defined.add(bindings[stop].var)
            stop += 1
        spans.append(_with_interface(func, bindings, first, stop,
                                     tuple(node_at[n] for n in range(first, stop) if n in node_at)))
        i = stop
    return spans


def _reads_only(value, defined) -> bool:
    """Whether ``value`` (no op call) is a tuple item of a tuple ``defined`` holds."""
    from tvm import relax

    return isinstance(value, relax.TupleGetItem) and value.tuple_value in defined


def _free_vars(expr) -> list:
    from tvm import relax

    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _free_vars(f)]
    if isinstance(expr, relax.TupleGetItem):
        return _free_vars(expr.tuple_value)
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _free_vars(a)]
    return []


def _with_interface(func, bindings, first: int, stop: int, nodes: tuple[int, ...]) -> Span:

    consts = {b.var for b in bindings if _is_const(b.value)}
    inside = {bindings[n].var for n in range(first, stop)}
    inputs = []
    for n in range(first, stop):
        for v in _free_vars(bindings[n].value):
            if v not in inside and v not in consts and v not in inputs:
                inputs.append(v)
    later = {v for b in bindings[stop:] for v in _free_vars(b.value)}
    later.update(_free_vars(func.body.body))
    outputs = tuple(bindings[n].var for n in range(first, stop)
                    if bindings[n].var in later and bindings[n].var not in consts)
    return Span(first, stop, nodes, tuple(inputs), outputs)


# module -> {(function name, first, stop): (the function, its segment)}: what :func:`export`
# made of a module's segments, while the module lives (a plan's build annotates it more than
# once: each would export its segments again).
_EXPORTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def export(mod, span: Span, func_name: str = "main") -> OrtSegment:
    """Segment ``span`` of ``mod[func_name]`` (:func:`cut`) as an ONNX model; raises
    :class:`OrtSegmentError` naming the op where one has no PyTorch equivalent or the export
    fails. The same segment of the same module is exported once."""
    func, key = mod[func_name], (func_name, span.first, span.stop)
    try:
        kept = _EXPORTED.setdefault(mod, {})
    except TypeError:  # a module that cannot be referenced weakly: not kept
        kept = {}
    hit = kept.get(key)
    if hit is not None and hit[0].same_as(func):
        return hit[1]
    segment = _export(mod, span, func_name)
    kept[key] = (func, segment)
    return segment


def _export(mod, span: Span, func_name: str) -> OrtSegment:
    import torch
    from tvm import relax

    from autoplace.backend.torch_equivalents import node_equivalent

    graph = OpGraph.from_relax(mod, func_name)
    bindings = list(iter_bindings(mod[func_name]))
    consts = {b.var: b.value for b in bindings if _is_const(b.value)}
    steps, nodes = [], iter(span.nodes)
    for b in bindings[span.first:span.stop]:
        if isinstance(b.value, relax.Call):
            node = graph.nodes[next(nodes)]
            op = node_equivalent(node, tuples=True)
            if op is None:
                raise OrtSegmentError(f"node {node.name!r} ({node.op_type}) has no PyTorch "
                                      "equivalent to export to ONNX from")
            steps.append((b.var, node.name, op, [a for a in b.value.args
                                                 if _is_tensor(a) or _is_tuple(a)]))
        else:
            steps.append((b.var, None, None, b.value))
    module = _segment_module(steps, consts, span.inputs, span.outputs)
    inputs = tuple(_sig(v) for v in span.inputs)
    args = tuple(torch.from_numpy(a) for a in random_inputs(inputs))
    names = [f"in{i}" for i in range(len(span.inputs))]
    outs = [f"out{i}" for i in range(len(span.outputs))]
    try:
        model, replaced = refuse(onnx_export(module, args, input_names=names,
                                             output_names=outs, opset_version=17))
    except Exception as e:  # noqa: BLE001 - the exporter fails in many ways; name the ops
        ops = ", ".join(f"{n} ({graph.node(n).op_type})" for _, n, _, _ in steps if n)
        raise OrtSegmentError(f"the ONNX export of the segment of {ops} failed: "
                              f"{type(e).__name__}: {str(e).strip()[:300]}") from e
    ops = tuple(n for _, n, _, _ in steps if n)
    return OrtSegment(model, inputs, tuple(_sig(v) for v in span.outputs), ops,
                      _onnx_nodes(model, ops, replaced))


def _is_const(expr) -> bool:
    from tvm import ir, relax

    return isinstance(expr, ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType)


def _is_tuple(expr) -> bool:
    """Whether ``expr`` is a tuple of tensors (not of numbers: a slice's bounds)."""
    from tvm import relax

    if isinstance(expr, relax.Tuple):
        return bool(expr.fields) and all(_is_tensor(f) or _is_tuple(f) for f in expr.fields)
    return isinstance(getattr(expr, "ty", None), relax.TupleType)


def _is_tensor(expr) -> bool:
    from tvm import relax

    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def _sig(var) -> tuple:
    from tvm import relax

    ty = var.ty
    if not isinstance(ty, relax.TensorType):
        raise OrtSegmentError(f"{var.name!r} is no tensor: a segment takes and gives tensors")
    if ty.shape is None:
        raise OrtSegmentError(f"{var.name!r}: a tensor whose shape depends on the data cannot "
                              "cross into an ONNX Runtime segment")
    return tuple(int(d) for d in ty.shape), str(ty.dtype)


def _segment_class():
    """The ``torch.nn.Module`` class a segment is traced as (defined on first use: PyTorch is
    imported only where a segment is exported)."""
    import torch

    class OpCall(torch.nn.Module):
        def __init__(self, op):
            super().__init__()
            self.op = op

        def forward(self, *tensors):
            return self.op.call(list(tensors))

    class Segment(torch.nn.Module):
        """The segment's bindings run in order, each op its PyTorch equivalent."""

        def __init__(self, steps, consts, inputs, outputs):
            super().__init__()
            self.steps, self.inputs, self.outputs = steps, inputs, outputs
            self.consts = {v: torch.from_numpy(c.value.numpy()) for v, c in consts.items()}
            self.calls = torch.nn.ModuleDict(
                {scope(name): OpCall(op) for _, name, op, _ in steps if name})

        def forward(self, *args):
            from tvm import relax

            env = dict(zip(self.inputs, args))

            def value(expr):
                if isinstance(expr, relax.Var):
                    return env[expr] if expr in env else self.consts[expr]
                if _is_const(expr):
                    return torch.from_numpy(expr.value.numpy())
                if isinstance(expr, relax.Tuple):
                    return tuple(value(f) for f in expr.fields)
                if isinstance(expr, relax.TupleGetItem):
                    return value(expr.tuple_value)[expr.index]
                raise OrtSegmentError(f"a segment cannot hold {type(expr).__name__}")

            for var, name, op, args_ in self.steps:
                if name is None:
                    env[var] = value(args_)
                else:
                    env[var] = self.calls[scope(name)](*[value(a) for a in args_])
            return tuple(env[v] for v in self.outputs)

    return Segment


def _segment_module(steps, consts, inputs, outputs):
    """The module computing a segment's ``steps`` (``(var, node name or None, op, args)``, a
    binding each) from its ``inputs`` to its ``outputs``, ``consts`` its constants."""
    return _segment_class()(steps, consts, inputs, outputs)


def _onnx_nodes(model: bytes, ops: Sequence[str],
                replaced: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[str, ...]]:
    """Per op name, the nodes of the exported ONNX graph traced under its scope, or, for an op
    whose nodes a rewrite replaced (``replaced``: new node -> the scopes it replaced,
    :func:`~autoplace.backend.ort_segments.refuse`), the node that replaced them."""
    import onnx

    graph = onnx.load_from_string(model).graph
    out = {}
    for op in ops:
        prefix = f"/{scope(op)}/"
        out[op] = tuple(n.name for n in graph.node if n.name.startswith(prefix)) or tuple(
            node for node, scopes in (replaced or {}).items() if scope(op) in scopes)
    return out
