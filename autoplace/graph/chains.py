"""Chains of a conv or linear, its bias add (or batch norm) and its activation, on the op graph:
what a torch device runs as one PyTorch call
(:func:`autoplace.backend.torch_calls.with_fused_tail`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplace.backend.torch_calls import FUSED_ACTIVATIONS, PACKABLE
from autoplace.backend.torch_equivalents import clip_bounds, node_equivalent


def chain_activation(op_types) -> str | None:
    """The activation that the ops of a chain of :func:`fused_chains` after its bias add compute,
    given their op types in order (:func:`autoplace.backend.torch_calls.pointwise` applies it): None
    for none, the op itself for one of :data:`~autoplace.backend.torch_calls.FUSED_ACTIVATIONS`, and
    for several, as ``torch.export`` decomposes an activation: ``"nn.silu"`` (``x * sigmoid(x)``),
    ``"hardswish"`` (``x * relu6(x + 3) / 6``) or ``"hardsigmoid"`` (``relu6(x + 3) / 6``)."""
    op_types = tuple(op_types)
    if len(op_types) <= 1:
        return op_types[0] if op_types else None
    if op_types == ("sigmoid", "multiply"):
        return "nn.silu"
    if op_types[0] == "add":
        return "hardswish" if "multiply" in op_types else "hardsigmoid"
    raise ValueError(f"no activation is written as {', '.join(op_types)}")


def fused_chains(graph) -> list[tuple[int, ...]]:
    """The chains of op graph ``graph`` that a torch device runs as one call
    (:func:`~autoplace.backend.torch_calls.with_fused_tail`), each ``(anchor, bias add,
    *activation)`` node indices: a conv2d or a matmul by a 2-D weight, float32, whose weight is a
    constant (no tensor computed at run time reaches it but its data); the add of a constant bias of
    its output's channels (a conv) or last axis (a matmul), its only consumer; and the activation
    after it, if any: one op of :data:`~autoplace.backend.torch_calls.FUSED_ACTIVATIONS`, the add's
    only consumer, or one that ``torch.export`` writes as several ops (:func:`chain_activation`
    names them), which alone read the add's output and each other's: SiLU's ``x * sigmoid(x)``,
    hardswish's ``x * relu6(x + 3) / 6`` and hardsigmoid's ``relu6(x + 3) / 6`` (relu6: clips to [0,
    6]). For a conv, a batch norm in inference (its statistics constants, folded into the conv's
    weight and bias: :func:`~autoplace.backend.torch_calls.fold_batch_norm`) may stand for the bias
    add. Only the last may be an output of the model. A PyTorch user gets the same from
    ``nn.Conv2d`` or ``nn.Linear`` and its activation, with or without ``nn.BatchNorm2d``
    between."""
    around = _Around.of(graph)
    preds, fed = around.preds, around.fed
    constant = [not preds[i] and not fed[i] for i in range(len(graph.nodes))]  # folded

    def runtime_inputs(i):
        return len({p for p in preds[i] if not constant[p]}) + fed[i]

    chains = []
    for node in graph.nodes:
        i = node.index
        if node.op_type not in PACKABLE or len(node.inputs) != 2 or len(node.outputs) != 1 \
                or any(t.dtype != "float32" for t in (*node.inputs, *node.outputs)) \
                or runtime_inputs(i) != 1 or node_equivalent(node) is None:
            continue
        out = node.outputs[0].shape
        if len(out) < 2 or (node.op_type == "matmul" and len(node.inputs[1].shape) != 2):
            continue
        j = around.sole(i)
        conv = node.op_type == "nn.conv2d"
        if j is None or not (_is_bias_add(graph.nodes[j], out, 1 if conv else len(out) - 1)
                             or (conv and _is_batch_norm(graph.nodes[j], out))) \
                or {p for p in preds[j] if not constant[p]} != {i} or fed[j]:
            continue
        chain = (i, j)
        k = around.sole(j)
        if k is not None and graph.nodes[k].op_type in FUSED_ACTIVATIONS \
                and len(graph.nodes[k].inputs) == 1 and graph.nodes[k].outputs[0].shape == out:
            chain = (i, j, k)
        elif (composite := around.activation_after(j)) is not None:
            chain = (i, j, *composite)
        chains.append(chain)
    return chains


@dataclass(frozen=True)
class _Around:
    """What :func:`fused_chains` reads of an op graph's nodes: each node's producers and
    consumers (``preds``, ``succs``: node indices) and how many graph inputs it reads
    (``fed``)."""

    graph: Any
    preds: list
    succs: list
    fed: list

    @classmethod
    def of(cls, graph) -> _Around:
        n = len(graph.nodes)
        preds, succs, fed = [[] for _ in range(n)], [[] for _ in range(n)], [0] * n
        for e in graph.edges:
            preds[e.dst].append(e.src)
            succs[e.src].append(e.dst)
        for gin in graph.inputs:
            for c in set(gin.consumers):
                fed[c] += 1
        return cls(graph, preds, succs, fed)

    def sole(self, k: int) -> int | None:
        """Node ``k``'s only consumer, where it is not an output of the model."""
        out = set(self.succs[k])
        return out.pop() if len(out) == 1 and not self.graph.nodes[k].is_output else None

    def activation_after(self, j: int) -> tuple[int, ...] | None:
        """The nodes, in order, of an activation written as several ops after node ``j``
        (:func:`fused_chains`), or None where none is."""
        if self.graph.nodes[j].is_output:
            return None
        readers = set(self.succs[j])
        by_type = {self.graph.nodes[r].op_type: r for r in readers}
        if len(by_type) != len(readers):
            return None
        if readers == {by_type.get("sigmoid"), by_type.get("multiply")}:  # x * sigmoid(x)
            s, m = by_type["sigmoid"], by_type["multiply"]
            return (s, m) if self.reads(s, j, {j}) and self.reads(m, j, {j, s}) \
                and self.sole(s) == m else None
        a = by_type.get("add")
        if a is None or not self.reads(a, j, {j}, 3.0):
            return None
        clips, q, bounds = [], a, (-np.inf, np.inf)
        while (c := self.sole(q)) is not None and self.graph.nodes[c].op_type == "clip" \
                and self.reads(c, j, {q}) \
                and (b := clip_bounds(self.graph.nodes[c].extra_args)) is not None:
            clips, q, bounds = clips + [c], c, (max(bounds[0], b[0]), min(bounds[1], b[1]))
        if not clips or bounds != (0.0, 6.0):
            return None
        relu6 = (a, *clips)
        nxt, others = self.sole(q), readers - {a}
        if not others:  # relu6(x + 3) / 6
            return (*relu6, nxt) if self.divides(nxt, j, q) else None
        m = others.pop() if len(others) == 1 else None
        if m is None or self.graph.nodes[m].op_type != "multiply":
            return None
        if nxt == m and self.reads(m, j, {j, q}) and self.divides(d := self.sole(m), j, m):
            return (*relu6, m, d)  # x * relu6(x + 3) / 6
        if self.divides(nxt, j, q) and self.reads(m, j, {j, nxt}):
            return (*relu6, nxt, m)  # x * (relu6(x + 3) / 6)
        return None

    def reads(self, k: int, j: int, sources: set, scalar: float | None = None) -> bool:
        """Whether node ``k`` reads the tensors of ``sources`` and no other but, with
        ``scalar``, one constant of that value; its output the shape and type of ``j``'s."""
        node = self.graph.nodes[k]
        if set(self.preds[k]) != sources or self.fed[k] \
                or node.outputs[0] != self.graph.nodes[j].outputs[0]:
            return False
        constants = [v for v in node.scalars if v is not None]
        tensors = len(node.inputs) - len(constants)
        return (constants == [scalar] and tensors == 1) if scalar is not None \
            else (not constants and tensors == len(node.inputs))

    def divides(self, k: int | None, j: int, src: int) -> bool:
        """Whether node ``k`` divides node ``src``'s output by 6 (and nothing else)."""
        return k is not None and self.graph.nodes[k].op_type == "divide" \
            and self.reads(k, j, {src}, 6.0) and self.graph.nodes[k].scalars[1:] == (6.0,)


def _is_batch_norm(node, out_shape) -> bool:
    """Whether op-graph node ``node`` is a batch norm in inference over the channels of a tensor of
    ``out_shape`` (NCHW) that PyTorch computes
    (:func:`~autoplace.backend.torch_equivalents.equivalent`)."""
    return node.op_type == "nn.batch_norm" and len(node.inputs) == 5 \
        and node.outputs[0].shape == out_shape and node_equivalent(node) is not None


def _is_bias_add(node, out_shape, axis: int) -> bool:
    """Whether op-graph node ``node`` adds to a tensor of ``out_shape`` a bias along ``axis``:
    one input of that shape, the other of shape ``(..., 1, out_shape[axis], 1, ...)``, the
    axes after ``axis`` of extent 1 (a conv's ``(1, C, 1, 1)``, a linear's ``(N,)``)."""
    if node.op_type != "add" or len(node.inputs) != 2 or node.outputs[0].shape != out_shape:
        return False
    shapes = [tuple(t.shape) for t in node.inputs]
    if tuple(out_shape) not in shapes:
        return False
    bias = list(shapes[1] if shapes[0] == tuple(out_shape) else shapes[0])
    while bias and bias[0] == 1:
        bias.pop(0)
    return out_shape[axis] > 1 and bias == [out_shape[axis]] + [1] * (len(out_shape) - axis - 1)
