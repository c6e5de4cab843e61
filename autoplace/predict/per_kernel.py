"""Node costs per fused kernel: a profile times each op as its own kernel, a model runs one
kernel per fused group, and some ops run no kernel at all.

On every device, an op that the build turns into no kernel costs nothing: a transpose of a
weight (computed once, when constants are lifted) and a reshape that becomes a view, though
timed alone each is a copy. On a GPU small ops take about a kernel launch, so the
ops that TVM fuses into another op's kernel (an elementwise op after a conv, a bias add) also
cost next to nothing in the built model although each costs a launch alone: each kernel is
charged its anchor's time (the member with the most FLOPs) instead. On a CPU the members keep
their cost (an elementwise op computed inline still reads and writes). The groups are those of
the model built for each kind of device alone: in a plan that moves an anchor off the GPU, the
members left there are still charged nothing. docs/results.md gives the measurements behind
these choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from autoplace.graph.fusion import anchor, fused_groups

if TYPE_CHECKING:
    import tvm

    from autoplace.devices import Device
    from autoplace.graph import OpGraph


#: The kernels of a model built for each kind of device: ``{is_gpu: fused_groups(...)}``.
KernelGroups = Mapping[bool, Sequence[tuple[str, tuple[int, ...]]]]


def groups_by_kind(mod: tvm.IRModule, devices: Sequence[Device],
                   func_name: str = "main") -> dict[bool, list[tuple[str, tuple[int, ...]]]]:
    """:func:`autoplace.graph.fusion.fused_groups` of ``mod`` built for each kind of device
    (CPU, GPU) among ``devices``, by ``is_gpu``: computed once, for the functions here that
    take ``groups``."""
    return {gpu: fused_groups(mod, func_name, gpu=gpu)
            for gpu in sorted({d.is_gpu for d in devices})}


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


def fused_costs(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                cost: np.ndarray, func_name: str = "main",
                groups: KernelGroups | None = None) -> np.ndarray:
    """``cost`` (nodes x devices) as the built model runs it: on every device the nodes without
    a kernel cost 0; on a GPU each fused kernel is charged once, its anchor's cost, the other
    members 0 (``inf``, a device that cannot run the op, stays). ``groups``: the model's
    :func:`groups_by_kind`, if the caller has them."""
    if not len(graph.nodes):
        return cost
    out = np.array(cost, dtype=float)
    groups = groups if groups is not None else groups_by_kind(mod, devices, func_name)
    for gpu in sorted({d.is_gpu for d in devices}):
        kernels = [nodes for _, nodes in groups[gpu]]
        in_kernel = np.zeros(len(graph.nodes), dtype=bool)
        for nodes in kernels:
            in_kernel[list(nodes)] = True
        for k in (k for k, d in enumerate(devices) if d.is_gpu == gpu):
            finite = np.isfinite(out[:, k])
            charged = (kernel_anchors(kernels, graph, np.where(finite, out[:, k], 0.0)) if gpu
                       else in_kernel)
            out[~charged & finite, k] = 0.0
    return out


def kernel_floor(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                 cost: np.ndarray, floors: Mapping[str, float],
                 func_name: str = "main", groups: KernelGroups | None = None) -> np.ndarray:
    """``cost`` (nodes x devices, as :func:`fused_costs` charges them) with every fused kernel
    on a device named in ``floors`` charged at least that device's figure: the least a kernel
    costs inside a built model, where the VM dispatches each one and a GPU's are launched one
    after another from the host (``autoplace profile`` measures it:
    :func:`autoplace.run.overhead.measure_kernel_floor`). A kernel timed alone, back to back
    with itself, may take less. What a kernel falls short of the floor is added to its costliest
    op; ops without a kernel (cost 0) and ops a device cannot run (``inf``) stay as they are.
    ``groups``: the model's :func:`groups_by_kind`, if the caller has them."""
    out = np.array(cost, dtype=float)
    floored = [k for k, d in enumerate(devices) if floors.get(d.name, 0.0) > 0]
    groups = groups if groups is not None else groups_by_kind(
        mod, [devices[k] for k in floored], func_name)
    for gpu in sorted({devices[k].is_gpu for k in floored}):
        kernels = [list(nodes) for _, nodes in groups[gpu] if nodes]
        for k in (k for k in floored if devices[k].is_gpu == gpu):
            floor = floors[devices[k].name]
            for nodes in kernels:
                c = out[nodes, k]
                ok = np.isfinite(c) & (c > 0)
                if ok.any() and c[ok].sum() < floor:
                    top = nodes[int(np.argmax(np.where(ok, c, -1.0)))]
                    out[top, k] += floor - c[ok].sum()
    return out


def model_seconds(cost_model, mod: tvm.IRModule, graph: OpGraph, device: Device,
                  func_name: str = "main") -> float:
    """Predicted seconds of the kernels of ``mod`` built for ``device`` alone: ``cost_model``'s
    cost of every node, charged as :func:`fused_costs` charges them (without the call)."""
    cost = np.asarray(cost_model.predict(graph, device), dtype=float)[:, None]
    return float(fused_costs(mod, graph, [device], cost, func_name).sum())
