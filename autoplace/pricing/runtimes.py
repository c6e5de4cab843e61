"""Runtime devices beside TVM's: which ops they take and what their calls cost.

A runtime device (PyTorch's kernels, :meth:`Device.torch <autoplace.devices.Device.torch>`;
ONNX Runtime's, :meth:`Device.onnxruntime <autoplace.devices.Device.onnxruntime>`) runs ops as
calls from the VM of a TVM device. :func:`runtime_devices` adds one where the model
needs it, :func:`with_runtime_costs` gives each a column of costs (its calls as its profile
measured them or timed here, the hand-off included), and :func:`fused_runtime_calls` charges a
chain a build runs as one call as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from autoplace.devices import Device, runtime_threads, torch_threads
from autoplace.graph import OpGraph
from autoplace.pricing.auto import fingerprints
from autoplace.pricing.prices import Prices, check_runnable
from autoplace.solve import InfeasibleError


def runtime_devices(graph: OpGraph, devices: list[Device], objective: str = "latency"
                     ) -> tuple[list[Device], tuple[str, ...]]:
    """The devices with the runtime devices (PyTorch, ONNX Runtime) after TVM's, a torch device
    added where the model calls PyTorch and none was given; and lines saying which ops run in
    PyTorch and why. A throughput plan with a runtime device is refused (not built yet)."""
    torch_nodes = [n for n in graph.nodes if n.is_torch]
    runtimes = [d for d in devices if d.runtime != "tvm"]
    given = [d for d in runtimes if d.runtime == "torch"]
    if (torch_nodes or runtimes) and objective == "throughput":
        raise ValueError("pipelines with PyTorch calls or runtime devices (torch, ORT) are not "
                         "built yet: optimize this model with objective='latency'")
    if any(d.runtime == "ort" for d in runtimes):
        from autoplace.backend.ort_segments import require

        require()
    if given or torch_nodes:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ImportError("a torch device needs PyTorch: pip install 'autoplace[frontends]'"
                              ) from None
    if runtimes and not any(d.runtime == "tvm" for d in devices):
        tvm_op = next((n for n in graph.nodes
                       if not any(d.can_run(n.op_type) for d in runtimes)), None)
        if tvm_op is not None:
            raise InfeasibleError(f"node {tvm_op.name!r} ({tvm_op.op_type}) can run on no "
                                  f"device: {', '.join(d.name for d in runtimes)} "
                                  f"{'has' if len(runtimes) == 1 else 'have'} no PyTorch "
                                  "equivalent for it; add a TVM device (Device.cpu(0))")
        raise ValueError(f"a {runtimes[0].runtime} device runs inside the VM of a TVM device: "
                         "add one (Device.cpu(0))")
    if not torch_nodes:
        return ([d for d in devices if d.runtime == "tvm"] + runtimes if runtimes else devices), ()
    if not given:  # for the calls only: ordinary ops on PyTorch are the caller's choice
        given = [Device.torch(fallback_only=True)]
        if any(d.name == "torch" for d in devices):
            raise ValueError("the model calls PyTorch and a device is named 'torch': pass a "
                             "torch device (Device.torch(name=...)) yourself")
    out = [d for d in devices if d.runtime == "tvm"] + given + [
        d for d in runtimes if d.runtime != "torch"]
    return out, (f"runs in PyTorch ({given[0].name}), {len(torch_nodes)} op(s): "
                 + "; ".join(_why_torch(torch_nodes)),)


def _why_torch(torch_nodes) -> list[str]:
    """Why the PyTorch calls of the model run there, a part per reason."""
    lacked, dynamic, other = set(), set(), {}
    for n in torch_nodes:
        why, op = dict(n.attrs).get("why", ""), n.op_type.removeprefix("torch.")
        if why.startswith("the importer lacks"):
            lacked.add(op)
        elif "shape depends on the data" in why:
            dynamic.add(op)
        else:  # the importer failed on it, or complex numbers: each its own words
            other.setdefault(why or f"aten.{op}", None)
    return ([f"the importer lacks aten.{', aten.'.join(sorted(lacked))}"] if lacked else []) + (
        [f"aten.{', aten.'.join(sorted(dynamic))} give or read a tensor whose shape depends "
         "on the data"] if dynamic else []) + list(other)


def competes(devices: Sequence[Device]) -> bool:
    """Whether a runtime device of ``devices`` may take the model's ordinary ops (not only the
    calls nothing else runs)."""
    from autoplace.backend.torch_equivalents import EQUIVALENTS

    return any(d.runtime != "tvm" and any(map(d.can_run, EQUIVALENTS)) for d in devices)


def runtime_chains(graph: OpGraph, devices: Sequence[Device],
                   pinned: Mapping[int, str]) -> tuple[tuple[int, ...], ...]:
    """The chains of a conv or linear, its bias add (or a conv's batch norm) and its activation
    (:func:`~autoplace.graph.chains.fused_chains`) that a runtime device of ``devices`` may run
    as one call: none without one, and none that the pins (``pinned``: node index -> device
    name) put on two devices."""
    if all(d.runtime == "tvm" for d in devices):
        return ()
    from autoplace.graph.chains import fused_chains

    return tuple(tuple(c) for c in fused_chains(graph)
                 if len({pinned[i] for i in c if i in pinned}) <= 1)


def with_runtime_costs(graph: OpGraph, costs: Prices, tvm_devices: Sequence[Device],
                       torch_devices: Sequence[Device], db=None,
                       chains: Sequence[Sequence[int]] = (), mod=None,
                       func_name: str = "main", models: Mapping | None = None) -> Prices:
    """``costs`` (of ``tvm_devices``) with a column per runtime device (``torch_devices``).
    A torch device's: its PyTorch calls as a profile of it measured them (given to the cost
    model, in store ``db``, or shipped), those it lacks timed here, plus the hand-off of a call
    from the VM (:func:`~autoplace.profile.torch_timings.time_torch_device`, each of
    ``chains``, which a build may run as one call, timed as one too: :func:`runtime_chains`;
    :class:`~autoplace.predict.torch_costs.TorchCostModel`). An ORT device's: its ops as ORT's
    profiler splits the segments of ``mod[func_name]`` it can run, read from or written to
    store ``db`` where it is a path (:func:`~autoplace.profile.ort_timings.time_ort_device`,
    :class:`~autoplace.predict.ort_costs.OrtCostModel`). On TVM devices, PyTorch calls cost
    ``inf``. ``models``: the runtime devices' cost models where the caller has them
    (:func:`runtime_models`); else they are made here."""
    if not torch_devices:
        check_runnable(graph, tvm_devices, costs.cost, costs.model)
        return costs
    from autoplace.predict.torch_costs import WithTorch

    if models is None:
        models = runtime_models(graph, costs, tvm_devices, torch_devices, db, chains, mod,
                                func_name)
    model = WithTorch(costs.model, models)
    torch_nodes = [n.index for n in graph.nodes if n.is_torch]
    cost = costs.cost.copy()
    cost[torch_nodes] = np.inf
    cols = [model.predict(graph, d) for d in torch_devices]
    by_torch = [model.sources(graph, d) for d in torch_devices]  # measured or timed here
    runs = [[t[n.index] for t in by_torch if t[n.index] != "unsupported"] for n in graph.nodes]
    sources = tuple("+".join(dict.fromkeys(r if n.is_torch else [s, *r]))
                    for n, s, r in zip(graph.nodes, costs.sources, runs))
    spread = np.column_stack([costs.spread] + [
        np.where(np.isfinite(c), models[d.name].spread, np.nan)
        for c, d in zip(cols, torch_devices)])
    overhead = costs.overheads.charged
    if isinstance(overhead, Mapping):  # the hand-off is charged per call, in each node's cost
        overhead = {**overhead, **{d.name: 0.0 for d in torch_devices}}
    note = tuple(f"{d.name}: {models[d.name].describe(graph)}" for d in torch_devices)
    cost = np.column_stack([cost] + cols)
    check_runnable(graph, [*tvm_devices, *torch_devices], cost, model)
    sources_of = {**costs.overheads.sources, **{d.name: "measured" for d in torch_devices}}
    return replace(costs, model=model, cost=cost, sources=sources, spread=spread,
                   overheads=replace(costs.overheads, charged=overhead, sources=sources_of),
                   notes=replace(costs.notes, profiles=costs.notes.profiles + note))


def runtime_models(graph: OpGraph, costs: Prices, tvm_devices: Sequence[Device],
                   torch_devices: Sequence[Device], db=None,
                   chains: Sequence[Sequence[int]] = (), mod=None,
                   func_name: str = "main") -> dict:
    """The cost model of each runtime device of ``torch_devices`` (by name), its ops timed or
    read as :func:`with_runtime_costs` says: what that function charges."""
    from autoplace.backend.threads import calls_at
    from autoplace.predict.torch_costs import TorchCostModel
    from autoplace.profile import check_present
    from autoplace.profile.torch_runner import preceding_bytes
    from autoplace.profile.torch_timings import time_torch_device, torch_profile

    models = {}
    # ONNX Runtime's devices first: what they charge tells which chains PyTorch would lose.
    for d in sorted(torch_devices, key=lambda d: d.runtime != "ort"):
        check_present(d)  # timed here, whatever check_devices says
        if d.runtime == "ort":
            from autoplace.predict.ort_costs import OrtCostModel
            from autoplace.profile.ort_timings import time_ort_device

            if mod is None:
                raise ValueError(f"{d.name}: pricing an ONNX Runtime device needs the module")
            store = db if isinstance(db, (str, Path)) and str(db) != "auto" else None
            models[d.name] = OrtCostModel(time_ort_device(
                mod, graph, d, func_name=func_name, db=store,
                threads=runtime_threads(tvm_devices)))
            continue
        callers = fingerprints([t for t in tvm_devices if t.memory == d.memory])
        with calls_at(torch_threads([*tvm_devices, *torch_devices])):  # as a build calls it
            timings = time_torch_device(graph, d, callers=callers, chains=chains,
                                        profile=torch_profile(d, db=db, cost_model=costs.model),
                                        others=_least_other(graph, torch_devices, models),
                                        between=preceding_bytes(graph))
        models[d.name] = TorchCostModel(timings)
    return {d.name: models[d.name] for d in torch_devices}


def _least_other(graph: OpGraph, devices: Sequence[Device], models: Mapping
                 ) -> np.ndarray | None:
    """Per node, the least an ONNX Runtime device of ``devices`` priced already (``models``:
    measured in context) is charged; None where there is none. TVM's costs before calibration
    are no bound: they may be several times too low."""
    cols = [models[d.name].predict(graph, d) for d in devices
            if d.runtime == "ort" and d.name in models]
    return np.min(np.column_stack(cols), axis=1) if cols else None


#: How far off TVM's costs before calibration are taken to be, at most, where they are screened
#: against the runtime devices' measured ones (:func:`tvm_loses`).
CALIBRATION_MARGIN = 4.0


def tvm_loses(graph: OpGraph, costs: Prices, devices: Sequence[Device], models: Mapping,
              margin: float = CALIBRATION_MARGIN) -> frozenset[str]:
    """The workload keys of ``graph`` whose every op a runtime device of ``devices`` (its cost
    model in ``models``, by name) runs in under ``1 / margin`` of what ``costs`` (of the TVM
    devices, before calibration) charge the fastest TVM device for it: ops a calibration of
    TVM's costs need not time, since TVM would lose them even were its costs ``margin`` times
    too high."""
    from autoplace.predict.torch_costs import WithTorch

    runtimes = [d for d in devices if d.name in models]
    if not runtimes or not graph.nodes:
        return frozenset()
    model = WithTorch(costs.model, dict(models))
    best = np.min(np.column_stack([model.predict(graph, d) for d in runtimes]), axis=1)
    on_tvm = np.min(costs.cost, axis=1) if costs.cost.shape[1] else np.full(len(best), np.inf)
    loses = np.isfinite(best) & (on_tvm >= margin * best)
    return frozenset(key for key, idx in graph.workloads().items() if loses[idx].all())



def fused_runtime_calls(graph: OpGraph, devices: Sequence[Device], costs: Prices,
                        chains: Sequence[Sequence[int]]) -> Prices:
    """``costs`` where a build runs several ops as one PyTorch call: each of ``chains``
    (:func:`runtime_chains`) that a torch device can run whole is charged there as one call
    (the anchor the call's cost,
    :meth:`~autoplace.predict.torch_costs.TorchCostModel.fused_cost`; the others nothing) and
    kept on one device (``groups``), as annotate makes one call of a chain placed whole on
    PyTorch. A chain that could not be timed as one call stays ops of their own, charged as
    their calls."""
    models = getattr(costs.model, "models", {})
    torch_cols = [(k, d) for k, d in enumerate(devices) if d.name in models and d.runtime == "torch"]
    if not torch_cols:
        return costs
    cost, kept = costs.cost.copy(), []
    for chain in chains:
        runs = [(k, d) for k, d in torch_cols
                if all(d.can_run(graph.nodes[i].op_type) for i in chain)]
        if not runs:
            continue
        timed = [(k, c) for k, d in runs
                 if np.isfinite(c := models[d.name].fused_cost(graph, d, chain))]
        for k, c in timed:  # (one that could not be timed is charged as its ops' calls)
            cost[chain[0], k] = c
            cost[list(chain[1:]), k] = 0.0
        if timed:
            kept.append(tuple(chain))
    note = (f"{', '.join(d.name for _, d in torch_cols)}: {len(kept)} chain(s) of a conv or "
            "linear, its bias add or batch norm and activation, each charged as one call "
            "(timed as one)",) if kept else ()
    return replace(costs, cost=cost, groups=tuple(kept),
                   notes=replace(costs.notes, profiles=costs.notes.profiles + note))

