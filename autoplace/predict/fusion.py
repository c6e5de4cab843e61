"""GPU node costs per fused kernel: a profile times each op as its own kernel launch, a model
runs one kernel per fused group.

On a GPU small ops take about a kernel launch, so the ops that TVM fuses into another op's kernel
(an elementwise op after a conv, a bias add) cost next to nothing in the built model although
each costs a launch alone: each kernel is charged its anchor's time (the member with the most
FLOPs) instead. The anchors are those of the model built for the GPU alone: in a plan that moves
an anchor off the GPU, the members left there are still charged nothing. CPU costs are left as
they are. docs/results.md gives the measurements behind this choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoplace.graph.fusion import anchor, fused_groups

if TYPE_CHECKING:
    import tvm

    from autoplace.devices import Device
    from autoplace.graph import OpGraph


def kernel_anchors(groups: Sequence[Sequence[int]], graph: OpGraph,
                   cost: np.ndarray) -> np.ndarray:
    """A boolean per node of ``graph``: whether it is the anchor of its fused kernel, ``groups``
    being each kernel's nodes (:func:`autoplace.graph.fusion.fused_groups`; ties by
    ``cost``). Nodes that become views or constants are in no group and are no anchor."""
    anchors = np.zeros(len(graph.nodes), dtype=bool)
    for nodes in groups:
        if nodes:
            anchors[anchor(nodes, graph, cost)] = True
    return anchors


def fused_gpu_costs(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                    cost: np.ndarray, func_name: str = "main") -> np.ndarray:
    """``cost`` (nodes x devices) with every GPU column charging each fused kernel once: its
    anchor keeps its cost, the other members and the nodes without a kernel cost 0 there
    (``inf``, a device that cannot run the op, stays)."""
    gpus = [k for k, d in enumerate(devices) if d.is_gpu]
    if not gpus or not len(graph.nodes):
        return cost
    groups = [nodes for _, nodes in fused_groups(mod, func_name, gpu=True)]
    out = np.array(cost, dtype=float)
    for k in gpus:
        finite = np.isfinite(out[:, k])
        anchors = kernel_anchors(groups, graph, np.where(finite, out[:, k], 0.0))
        out[~anchors & finite, k] = 0.0
    return out
