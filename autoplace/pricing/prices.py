"""What the solver charges: every node's cost on every device, with where each came from.

:func:`price` assembles it from a cost model (fused kernels charged once, tuned kernels' timed
times, the measured kernel floor), the overheads the profiles measured and the tuning records a
build applies; :mod:`autoplace.pricing.runtimes` adds the columns of runtime devices (PyTorch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.predict import RooflineCostModel
from autoplace.predict.per_kernel import fused_costs, groups_by_kind, kernel_floor
from autoplace.predict.protocol import CostModel, ProfiledCostModel, outside_training
from autoplace.predict.protocol import sources as cost_sources
from autoplace.pricing.auto import ROOFLINE, auto_cost_model, fingerprints
from autoplace.solve import InfeasibleError

log = logging.getLogger(__name__)


class TunedKernels(NamedTuple):
    """What timing the build's tuned kernels again needs (the all-threads baseline's costs):
    the model, the store and its records, the CPU build's kernels and the node costs."""

    mod: Any
    db: Any
    records: Any
    func_name: str
    cpu_groups: Any
    cost: np.ndarray


@dataclass(frozen=True)
class Overheads:
    """What running a plan costs each device beyond its kernels.

    ``charged``: a throughput plan's stage or a latency plan's segment overhead (one figure, a
    mapping by device name, or None); ``sources``: by device name, ``"given"``, ``"measured"``
    or ``"default"``; ``calls``: a call's overhead by device name (measured only);
    ``measured``: every overhead the profiles measured, by device name and kind.
    """

    charged: Any
    sources: Mapping[str, str]
    calls: Mapping[str, float]
    measured: Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class Notes:
    """Lines that say where the costs came from, as ``summary()`` prints them."""

    records: tuple[str, ...] = ()     # per device, which tuning records apply
    profiles: tuple[str, ...] = ()    # per device, which measured profile applies
    overheads: tuple[str, ...] = ()   # per device, the overheads charged and their source
    outside: tuple[str, ...] = ()     # per device, the learned costs outside their training


@dataclass(frozen=True, eq=False)
class Prices:
    """What the solver charges (:func:`price`).

    ``cost``/``sources``/``spread``: per node and device, seconds, their source and relative
    spread; ``records``: the tuning records builds apply (None: TVM's default kernels);
    ``tuned``: what the all-threads baseline's tuned kernel costs need (None without records);
    ``threads_all``: the CPU devices' threads together (None with fewer than two);
    ``outside``: by device name, the nodes whose learned costs lie outside their training;
    ``groups``: node indices a build runs as one call, each kept on one device.
    """

    model: Any
    described: str
    cost: np.ndarray
    sources: tuple[str, ...]
    spread: np.ndarray
    overheads: Overheads
    notes: Notes
    records: Any = None
    store: Any = None
    tuned: TunedKernels | None = None
    threads_all: int | None = None
    outside: Mapping[str, tuple[int, ...]] = None
    groups: tuple[tuple[int, ...], ...] = ()
    #: The kernels of each kind of device's build (:func:`groups_by_kind`), for a second
    #: pricing of the same module and devices.
    kernels: Any = None


def price(mod, graph: OpGraph, devices: Sequence[Device], objective: str, cost_model, db,
          func_name: str, here: bool, given_overhead, calibrate: bool = False,
          mixed: bool = False, calibration_skip: frozenset[str] = frozenset(),
          kernels=None) -> Prices:
    """Every node's cost on every TVM device of ``devices`` (the cost model's, fused kernels
    charged once, tuned kernels' timed times, the measured kernel floor), their spread, the
    overheads and which records the build applies.

    ``cost_model="auto"``: :func:`~autoplace.pricing.auto_cost_model` (``here``: the devices
    are on this machine, so ``mod``'s workloads may be timed to calibrate it; ``mixed``: a
    runtime device competes for the model's ops, so a calibration times more of them; none of
    ``calibration_skip``, workload keys).
    ``given_overhead``: the caller's stage (throughput) or segment (latency) overhead, or None.
    ``kernels``: ``Prices.kernels`` of an earlier pricing of the same module and devices.
    """
    if isinstance(cost_model, str) and cost_model == "auto":
        from autoplace.pricing.calibrate import MIXED_CALIBRATION_WORKLOADS

        cost_model, described = auto_cost_model(
            devices, mod if here else None, calibrate=calibrate, func_name=func_name,
            graph=graph, workloads=MIXED_CALIBRATION_WORKLOADS if mixed else None,
            skip=calibration_skip)
    else:
        described = (ROOFLINE if cost_model is None or isinstance(cost_model, RooflineCostModel)
                     else type(cost_model).__name__)
    threads_all = _all_threads(devices)
    profiles_note = _profile_notes(cost_model, devices, here, threads_all)
    overheads = getattr(cost_model, "overheads", None)
    measured = overheads(devices) if callable(overheads) else {}
    overhead, overhead_sources, overheads_note = _overheads(objective, devices, cost_model,
                                                           measured, given_overhead)
    cost, sources = node_costs(graph, devices, cost_model)
    check_runnable(graph, devices, cost, cost_model, runtimes_follow=True)
    # The kernels of each kind of device's build, once for every charge that needs them.
    groups = kernels if kernels is not None or not graph.nodes else groups_by_kind(
        mod, devices, func_name)
    cost = fused_costs(mod, graph, devices, cost, func_name, groups)
    db, records, records_note = (None, None, ()) if db is None else _tuning_records(db, devices)
    tuned = None
    if records:
        tuned, sources, more = _with_tuned_costs(mod, graph, devices, cost, sources, db, records,
                                                 func_name, (groups or {}).get(False))
        cost = tuned.cost
        records_note += more
    floors = {name: kinds["kernel"] for name, kinds in measured.items() if "kernel" in kinds}
    if floors:
        cost = kernel_floor(mod, graph, devices, cost, floors, func_name, groups)
        overheads_note += ("kernel floor: " + ", ".join(
            f"{name} {s * 1e6:.2f} us" for name, s in floors.items()) + " (measured by their "
            "profiles): every kernel on these devices costs at least this",)
    # Flagged where the model's cost is charged: not where a tuned time replaced it, nor at 0.
    charged = np.where(np.array(["tuned" in s for s in sources])[:, None], 0.0, cost)
    charged[[n.index for n in graph.nodes if n.is_torch]] = 0.0  # PyTorch's, not the model's
    outside, outside_note = outside_training(graph, devices, cost_model, charged)
    calls, call_note = _call_overheads(measured, objective)
    return Prices(
        model=cost_model, described=described, cost=cost, sources=sources,
        spread=_spread(graph, devices, cost_model, tuned),
        overheads=Overheads(overhead, overhead_sources, calls, measured),
        notes=Notes(records=records_note, profiles=profiles_note,
                    overheads=overheads_note + call_note, outside=outside_note),
        records=records, store=db,
        tuned=None if not records else TunedKernels(mod, db, records, func_name,
                                                    (groups or {}).get(False), cost),
        threads_all=threads_all, outside=outside, kernels=groups)


def node_costs(graph: OpGraph, devices: Sequence[Device], cost_model=None):
    """``(n, d)`` seconds per node per device (``inf`` where a device cannot run the op) and the
    source of each node's costs (``"measured+roofline"``: measured on some devices only)."""
    model = cost_model if cost_model is not None else RooflineCostModel()
    if not isinstance(model, CostModel):
        raise TypeError(f"cost_model must have predict(graph, device); got {type(model).__name__}")
    cost = np.column_stack([np.asarray(model.predict(graph, d), dtype=float) for d in devices])
    if cost.shape != (len(graph.nodes), len(devices)):
        raise ValueError(f"cost model returned shape {cost.shape}, expected "
                         f"({len(graph.nodes)}, {len(devices)})")
    for k, d in enumerate(devices):
        for n in graph.nodes:
            if not d.can_run(n.op_type):
                cost[n.index, k] = np.inf
    per_device = [cost_sources(model, graph, d) for d in devices]
    sources = tuple("+".join(dict.fromkeys(s[i] for s in per_device)) for i in range(len(graph.nodes)))
    return cost, sources


def _overheads(objective: str, devices: Sequence[Device], cost_model, measured, given):
    """The overhead the solver charges each device: a throughput plan's stage (per input), a
    latency plan's segment. ``given`` (the caller's figure or mapping) wins; else each device's
    figure in ``measured`` (``cost_model.overheads(devices)``; a stage hand-off gets
    ``STAGE_SLOWDOWN_S`` added), else the constant of its kind.

    Returns ``(figure or {name: seconds}, {name: "given" | "measured" | "default"}, lines)``.
    """
    from autoplace.solve.problem import SEGMENT_OVERHEAD_S, STAGE_OVERHEAD_S, STAGE_SLOWDOWN_S

    kind = "stage" if objective == "throughput" else "segment"
    what = f"{kind} overhead"
    if given is not None:
        shown = (", ".join(f"{n} {v * 1e6:.1f} us" for n, v in given.items())
                 if isinstance(given, Mapping) else f"{given * 1e6:.1f} us per device")
        return (given, {d.name: "given" for d in devices},
                (f"{what}: {shown} (given: {kind}_overhead_s)",))
    out, sources, lines = {}, {}, []
    for d in devices:
        m = measured.get(d.name, {}).get(kind)
        prof = getattr(cost_model, "profile_for", lambda _: None)(d)
        if m is None:
            const = (STAGE_OVERHEAD_S if kind == "stage" else SEGMENT_OVERHEAD_S)[d.kind]
            name = "STAGE_OVERHEAD_S" if kind == "stage" else "SEGMENT_OVERHEAD_S"
            out[d.name], sources[d.name] = const, "default"
            why = "its profile measured none" if prof else "no profile"
            lines.append(f"{what}: {d.name} {const * 1e6:.1f} us (default for a {d.kind} "
                         f"device, {name}: {why})")
        elif kind == "stage":
            slow = STAGE_SLOWDOWN_S[d.kind]
            out[d.name], sources[d.name] = m + slow, "measured"
            lines.append(f"{what}: {d.name} {(m + slow) * 1e6:.1f} us (hand-off {m * 1e6:.1f} us "
                         f"measured by its profile {prof.fingerprint}, + {slow * 1e6:.1f} us "
                         f"STAGE_SLOWDOWN_S: a {d.kind} stage's call slowed in a pipeline)")
        else:
            out[d.name], sources[d.name] = m, "measured"
            lines.append(f"{what}: {d.name} {m * 1e6:.1f} us (measured by its profile "
                         f"{prof.fingerprint})")
    return out, sources, tuple(lines)


def _call_overheads(measured: Mapping[str, Mapping[str, float]], objective: str
                    ) -> tuple[dict[str, float], tuple[str, ...]]:
    """What a call costs beyond its kernels, by device: the ``call`` overhead each device's
    profile measured (one stage called directly, the inputs' upload and the outputs' download
    included), and a line saying how it is charged. A latency plan's build pays the largest
    figure of the devices it runs kernels on (:func:`autoplace.report.choose.call_of`): a
    GPU's call moves the inputs and outputs between host and GPU, a CPU's does not. A
    throughput plan pays each device's figure per input for every stage on it, and every
    replica its own."""
    calls = {name: kinds["call"] for name, kinds in measured.items() if "call" in kinds}
    if not calls:
        return {}, ("call overhead: not charged (no profile of these devices measured it)",)
    shown = ", ".join(f"{name} {s * 1e6:.1f} us" for name, s in calls.items())
    how = ("a build pays the largest of the devices it uses, added to the plan's and every "
           "baseline's prediction" if objective == "latency" else
           "each stage and each replica pays its device's per input, a plan of one stage too")
    return calls, (f"call overhead: {shown} (measured by their profiles); {how}",)


def _profile_notes(model, devices: Sequence[Device], here: bool,
                   all_threads: int | None = None) -> tuple[str, ...]:
    """For a :class:`MeasuredCostModel`: a line per device on the profile that gives its costs
    (and on the one measured with the ``all_threads`` of all the CPU devices, if given), and a
    warning (logged too) per other profile that gives no device its costs and, when the devices
    are ``here`` on this machine, per device whose profile was measured on other hardware or
    settings (another fingerprint)."""
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import LocalRunner, fingerprint

    if not isinstance(model, MeasuredCostModel):
        return ()
    lines, warnings, used = [], [], set()

    def label(prof) -> str:
        return f"{prof.info.get('hardware', '?')} ({prof.name}, {prof.fingerprint})"

    for d in devices:
        prof = model.profile_for(d)
        if prof is None:
            lines.append(f"profile: {d.name} has none (fallback costs)")
            continue
        used.add(id(prof))
        lines.append(f"profile: {d.name} <- {label(prof)}")
        # (a cluster host's device is not this machine's: its profile was timed on its host)
        info = LocalRunner(d).info() if here and d.host is None else None
        if info is not None and fingerprint(info) != prof.fingerprint:
            differ = [f"{k} {prof.info.get(k)!r} there, {info.get(k)!r} here" if k != "target"
                      else "target" for k in ("kind", "hardware", "threads", "tvm", "remote",
                                              "target") if prof.info.get(k) != info.get(k)]
            warnings.append(f"{d.name}'s profile {label(prof)} was measured on another device or "
                            f"settings ({'; '.join(differ)}): its costs may not hold here "
                            "(measure this device with 'autoplace profile')")
    if all_threads is not None:
        for d in devices:
            prof = None if d.is_gpu else model.profile_at(d, all_threads)
            if prof is not None and id(prof) not in used:
                used.add(id(prof))
                lines.append(f"profile: all-threads baseline ({all_threads} threads) <- "
                             f"{label(prof)}")
    for prof in model.given():
        # (a torch device's profile: runtimes.with_runtime_costs)
        if id(prof) not in used and prof.kind != "torch":
            mine = [d.name for d in devices if d.kind == prof.kind]
            why = (f"no device is of kind {prof.kind}" if not mine else
                   f"several {prof.kind} profiles were given: pass {{device name: profile}}")
            warnings.append(f"profile {label(prof)} gives no device its costs ({why})")
    for w in warnings:
        log.warning("%s", w)
    return tuple(lines) + tuple(f"warning: {w}" for w in warnings)


def _tuning_records(db, devices: Sequence[Device]):
    """The store whose tuning records ``devices`` get (``db``, or with ``"auto"`` the shipped one
    of this machine, if any), those records, and a line per device on them."""
    from autoplace.tuning import open_records, shipped_store

    prints = fingerprints(devices)
    if isinstance(db, str) and db == "auto":
        db = shipped_store(prints)
        if db is None:
            return None, None, ("kernels: no tuning records of this machine are shipped: TVM's "
                                "default kernels (autoplace tune makes them)",)
    records, lines = open_records(db, devices, prints)
    for line in lines:
        log.info("%s", line)
    return db, records, tuple(f"kernels: {line}" for line in lines)


def _with_tuned_costs(mod, graph: OpGraph, devices: Sequence[Device], cost: np.ndarray,
                      sources: tuple[str, ...], db, records, func_name: str, cpu_groups=None):
    """The costs with the tuned kernels timed in store ``db`` charged (a
    :class:`~autoplace.tuning.costs.TunedCosts`; ``records``: the ones the build applies;
    ``cpu_groups``: the kernels of the model's CPU build, if known), the sources, and a line on
    what they cover."""
    from autoplace.tuning.costs import tuned_costs

    tc = tuned_costs(mod, graph, devices, cost, db, records, fingerprints(devices), func_name,
                     cpu_groups)
    everywhere, somewhere = tc.tuned.all(axis=1), tc.tuned.any(axis=1)
    sources = tuple("tuned" if everywhere[i] else f"{s}+tuned" if somewhere[i] else s
                    for i, s in enumerate(sources))
    lines = (f"costs: {int(somewhere.sum())} of {len(graph.nodes)} ops in tuned kernels, timed "
             f"tuned in {db}",)
    if tc.untimed:
        lines += (f"costs: {tc.untimed} tuned kernel(s) not timed yet: run autoplace tune "
                  "again to time them",)
    return tc, sources, lines


def check_runnable(graph: OpGraph, devices: Sequence[Device], cost: np.ndarray, model, *,
                   runtimes_follow: bool = False) -> None:
    """Name the op, and why, when no device can run a node. ``runtimes_follow``: ``devices``
    are the TVM devices, priced before the runtime devices; an op that a torch device may run
    instead (one with a PyTorch equivalent) is checked when those are priced."""
    for n in graph.nodes:
        if n.is_torch and not any(d.runtime == "torch" for d in devices):
            continue  # a torch device runs it (runtime_devices added one; checked after)
        if runtimes_follow and np.isinf(cost[n.index]).all() and _has_equivalent(n):
            continue
        if np.isinf(cost[n.index]).all():
            why = []
            for d in devices:
                if n.is_torch and d.runtime != "torch":
                    why.append(f"{d.name} runs TVM's kernels, not PyTorch calls")
                elif not n.is_torch and d.runtime == "torch" and not d.can_run(n.op_type):
                    why.append(f"{d.name} has no PyTorch equivalent for it")
                elif not d.can_run(n.op_type):
                    why.append(f"{d.name} declares {n.op_type} unsupported")
                elif cost_sources(model, graph, d)[n.index] == "unsupported":
                    why.append(f"{d.name} failed to build or run it when profiled")
                else:
                    why.append(f"{d.name}'s cost model returned inf")
            raise InfeasibleError(f"node {n.name!r} ({n.op_type}) can run on no device: "
                                  f"{'; '.join(why)}. Add a device that runs it, or check the "
                                  "profile's errors (autoplace profile-export)")


def _has_equivalent(node) -> bool:
    """Whether a torch device could run ``node`` as its PyTorch equivalent (False without
    PyTorch)."""
    from autoplace.backend.torch_equivalents import node_equivalent

    try:
        return node_equivalent(node) is not None
    except ImportError:
        return False


def all_threads_costs(graph: OpGraph, devices: Sequence[Device], prices: Prices):
    """For :func:`~autoplace.report.baselines.predict_baselines`: None with fewer than two CPU
    devices, else ``(index of the first CPU device that can run every op, threads,
    ThreadedCosts)`` for one CPU device with the threads of all of them
    (:attr:`Prices.threads_all`): from its build's kernels timed at that count in the tuning
    store, where the costs have tuned kernels (:attr:`Prices.tuned`) and the store has them
    all; else, unless the costs include tuned kernels, from a profile at that count (a shipped
    profile of this machine counts when the costs are the shipped ones)."""
    from autoplace.predict.at_threads import ThreadedCosts, costs_at_threads

    threads, kernels, sources = prices.threads_all, prices.tuned, prices.sources
    if threads is None:
        return None
    cpus = [k for k, d in enumerate(devices) if d.kind == "cpu"]
    k = next((k for k in cpus if all(devices[k].can_run(n.op_type) for n in graph.nodes
                                     if not n.is_torch)),
             cpus[0])
    why = ""
    if kernels is not None:
        from autoplace.tuning.costs import kernel_costs

        timed, spread, why = kernel_costs(kernels.mod, graph, devices[k], threads,
                                          kernels.cost[:, k], kernels.db, kernels.records,
                                          kernels.func_name, kernels.cpu_groups)
        if timed is not None:
            return k, threads, ThreadedCosts(timed, spread, f"measured ({why})")
    if any("tuned" in s for s in sources):
        return k, threads, ThreadedCosts(
            None, None, f"not predicted: the plan's costs include tuned kernels, and "
                        f"{why or 'no tuning store times them at that count'}; a build of one "
                        f"device with all {threads} threads may well be faster: compile() of a "
                        "latency plan times it beside the plan (optimize --run, a pipeline's)")
    extra = []
    cost_model = prices.model
    if prices.described.startswith("measured") and isinstance(cost_model, ProfiledCostModel):
        from autoplace.profile import LocalRunner, fingerprint
        from autoplace.profile.profiles import shipped_profile

        info = {**LocalRunner(devices[k]).info(), "threads": threads}
        found = shipped_profile(fingerprint(info))
        extra = [found[0]] if found else []
    return k, threads, costs_at_threads(cost_model, graph, devices[k], threads, extra)


def _all_threads(devices: Sequence[Device]) -> int | None:
    """TVM threads the CPU devices have together (None: fewer than two CPU devices)."""
    from autoplace.run.cores import all_threads

    share = all_threads(devices)
    return None if share is None else share[0]


def _spread(graph: OpGraph, devices: Sequence[Device], cost_model, tuned=None) -> np.ndarray:
    """``(n, d)`` relative spread of the costs the solver saw (``nan``: unknown): the cost
    model's, and where a tuned kernel's time replaced its cost, the tuned one's (``tuned``: a
    :class:`autoplace.tuning.costs.TunedCosts`)."""
    from autoplace.predict.spread import cost_spread

    spread = cost_spread(graph, devices, cost_model)
    if tuned is not None:
        spread[tuned.tuned] = tuned.spread[tuned.tuned]
    return spread

