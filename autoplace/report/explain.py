"""Why each node of a plan is where it is, and what the plan costs, as text and as rows.

Every number comes from the problem the solver saw and from the simulator
(:mod:`autoplace.solve.simulate`); the reason given for a node is what happens to the predicted
objective when that node alone moves to another device.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from autoplace.predict.spread import cost_spread
from autoplace.solve.problem import InfeasibleError
from autoplace.solve.simulate import (check_feasible, copies_needed, device_loads, link_loads,
                                      replica_periods,
                                      simulate_latency, simulate_throughput)

from autoplace.report.placement import device_label, hosts_line

if TYPE_CHECKING:
    from autoplace.report.placement import PlacementResult

# Costs within this fraction of each other count as equal ("as fast on b").
_SAME_COST = 0.02


class Copy(NamedTuple):
    """The output of node ``tensor`` copied from device ``src`` to ``dst``."""

    tensor: str
    src: str
    dst: str
    nbytes: float
    seconds: float


@dataclass(frozen=True)
class NodeExplanation:
    """One node: where it runs, what it costs everywhere, the copies it causes, and why.

    ``cost_s`` and ``spread`` map every device name to seconds (``inf``: cannot run it) and to
    the relative uncertainty of that cost (``nan``: unknown). ``move_s`` maps every other device
    to the change of the simulated objective if this node moved there, alone or with the
    other nodes of its colocation group (a chain that a torch device runs as one call)
    (``nan``: not allowed); for latency both schedules follow the solver's node order and the
    simulator's default copy order.
    """

    index: int
    name: str
    op: str
    device: str
    stage: int | None
    cost_s: Mapping[str, float]
    source: str
    spread: Mapping[str, float]
    copies_in: tuple[Copy, ...]
    copies_out: tuple[Copy, ...]
    move_s: Mapping[str, float]
    reason: str
    host: str | None = None  # the device's host (a cluster's), None: this process's

    def record(self) -> dict[str, Any]:
        """A flat dict (one table row): ``cost_<device>_s`` per device, copy counts and bytes."""
        row = {"index": self.index, "node": self.name, "op": self.op, "device": self.device,
               "host": self.host, "stage": self.stage, "source": self.source,
               "spread": self.spread[self.device]}
        row.update({f"cost_{d}_s": c for d, c in self.cost_s.items()})
        row.update({"copies_in": len(self.copies_in),
                    "bytes_in": sum(c.nbytes for c in self.copies_in),
                    "copies_out": len(self.copies_out),
                    "bytes_out": sum(c.nbytes for c in self.copies_out),
                    "reason": self.reason})
        return row


@dataclass(frozen=True)
class Explanation:
    """A plan explained: a :class:`NodeExplanation` per node and the plan's totals.

    ``str()`` gives the summary and a table of nodes; :meth:`records` the rows for a table;
    :meth:`to_dict` the totals as JSON-ready values.
    """

    nodes: tuple[NodeExplanation, ...]
    objective: str
    value_s: float
    status: str
    gap: float
    device_s: Mapping[str, float]               # compute seconds per device, per input
    link_s: Mapping[tuple[str, str], float]     # copy seconds per directed link, per input
    copies: tuple[Copy, ...]
    baselines_s: Mapping[str, float]
    sources: Mapping[str, int]                  # cost source -> number of nodes
    cost_model: str
    plan: str                                   # str(plan)
    runs: str = ""                              # how the build runs it (latency plans)
    baseline_notes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    guard: str = ""                             # why this plan, not the solver's or a baseline
    overheads: tuple[str, ...] = ()             # per device, the overhead charged and its source
    hosts: Mapping[str, str] = dataclasses.field(default_factory=dict)  # device -> its host

    @property
    def bytes_moved(self) -> float:
        return float(sum(c.nbytes for c in self.copies))

    @property
    def best_single(self) -> tuple[str, float] | None:
        """The fastest single-device baseline, ``(name, seconds)``."""
        singles = {k: v for k, v in self.baselines_s.items() if k.startswith("only ")}
        return min(singles.items(), key=lambda kv: kv[1]) if singles else None

    def gain_over(self, baseline: str) -> float | None:
        """``baseline``'s predicted time over the plan's (2.0: the plan is twice as fast)."""
        value = self.baselines_s.get(baseline)
        return None if value is None or self.value_s <= 0 else value / self.value_s

    def records(self) -> list[dict[str, Any]]:
        """One flat dict per node (``pandas.DataFrame(expl.records())`` makes a table)."""
        return [n.record() for n in self.nodes]

    def to_dict(self) -> dict[str, Any]:
        """The totals, JSON-ready (seconds, bytes, ratios)."""
        single = self.best_single
        return {
            "objective": self.objective, "predicted_s": self.value_s, "status": self.status,
            "gap": self.gap, "cost_model": self.cost_model,
            "device_s": dict(self.device_s),
            "link_s": {f"{a}->{b}": s for (a, b), s in self.link_s.items()},
            "copies": len(self.copies), "bytes_moved": self.bytes_moved,
            "baselines_s": dict(self.baselines_s),
            "gain_over_best_single": None if single is None else self.gain_over(single[0]),
            "gain_over_greedy": self.gain_over("greedy"),
            "cost_sources": dict(self.sources),
            "baseline_notes": dict(self.baseline_notes),
            "guard": self.guard or None,
            "overheads": list(self.overheads),
            "hosts": dict(self.hosts),
        }

    def summary(self) -> str:
        """The plan's totals in a few lines."""
        what = "latency" if self.objective == "latency" else "time per input"
        lines = [self.plan, f"costs: {self.cost_model}",
                 f"predicted {what}: {_fmt_s(self.value_s)} ({self.status}, gap {self.gap:.1%})"]
        if self.objective == "throughput" and self.value_s > 0:
            lines[-1] += f", {1 / self.value_s:.1f} inputs/s"
        if self.runs:
            lines.append(f"runs as: {self.runs}")
        if self.hosts:
            lines.append(hosts_line(_Named(d, h) for d, h in self.hosts.items()))
        lines += self.overheads
        gains = []
        single = self.best_single
        if single is not None:
            gains.append(f"{self.gain_over(single[0]):.2f}x the best single device "
                         f"({single[0]}: {_fmt_s(single[1])})")
        if "greedy" in self.baselines_s:
            gains.append(f"{self.gain_over('greedy'):.2f}x greedy "
                         f"({_fmt_s(self.baselines_s['greedy'])})")
        for name in ("all threads", "replicas"):
            if name in self.baselines_s:
                gains.append(f"{self.gain_over(name):.2f}x {name} "
                             f"({_fmt_s(self.baselines_s[name])})")
            elif name in self.baseline_notes:
                gains.append(f"{name} {self.baseline_notes[name]}")
        if gains:
            lines.append("speed-up: " + ", ".join(gains))
        if self.guard:
            lines.append(f"why this plan: {self.guard}")
        lines.append("compute per device: " + ", ".join(
            f"{d} {_fmt_s(s)}" for d, s in self.device_s.items()))
        lines.append(f"copies: {len(self.copies)}, {_fmt_bytes(self.bytes_moved)} moved" + "".join(
            f"; {a} -> {b} {_fmt_s(s)}" for (a, b), s in self.link_s.items()))
        spread = []
        for src, count in self.sources.items():
            values = [n.spread[n.device] for n in self.nodes if n.source == src]
            values = [v for v in values if not math.isnan(v)]
            note = f" (median spread ±{np.median(values):.1%})" if values else ""
            spread.append(f"{count} {src}{note}")
        lines.append("cost sources: " + ", ".join(spread))
        return "\n".join(lines)

    def table(self) -> str:
        """One line per node: device (and stage), cost on every device, source, copies, why."""
        head = ["#", "node", "op", "device", *(f"on {d}" for d in self.device_s), "source",
                "copies in/out", "why"]
        rows = [head]
        for n in self.nodes:
            spread = n.spread[n.device]
            cin = sum(c.nbytes for c in n.copies_in)
            cout = sum(c.nbytes for c in n.copies_out)
            device = device_label(_Named(n.device, n.host))
            where = device if n.stage is None else f"{device}/{n.stage}"
            rows.append([
                str(n.index), n.name, n.op, where,
                *(_fmt_s(n.cost_s[d]) for d in self.device_s),
                n.source + ("" if math.isnan(spread) else f" ±{spread:.0%}"),
                f"{_fmt_bytes(cin) if cin else '-'}/{_fmt_bytes(cout) if cout else '-'}",
                n.reason])
        widths = [max(len(r[c]) for r in rows) for c in range(len(head) - 1)]
        right = {0} | set(range(4, 4 + len(self.device_s)))  # numbers align right
        return "\n".join(
            "  ".join(cell.rjust(w) if c in right else cell.ljust(w)
                      for c, (cell, w) in enumerate(zip(r, widths))) + "  " + r[-1]
            for r in rows)

    def __str__(self) -> str:
        return self.summary() + "\n\n" + self.table()


def explain(result: PlacementResult) -> Explanation:
    """Explain ``result``'s plan: see :class:`Explanation`.

    >>> print(autoplace.optimize(mod, devs).explain())     # doctest: +SKIP
    """
    problem, sol, graph, plan = result.problem, result.solution, result.graph, result.plan
    a = np.asarray(sol.assignment, dtype=np.int64)
    names = problem.device_names
    spread = (cost_spread(graph, plan.devices, result.predictor)
              if result.predictor is not None else np.full(problem.cost.shape, np.nan))
    needed = copies_needed(problem, a)
    copies = tuple(_copy(problem, u, int(a[u]), k) for u, k in needed)
    base_bytes = sum(problem.out_bytes[u] for u, _ in needed)
    preds = [set() for _ in range(problem.num_nodes)]
    for u, v in problem.edges.tolist():
        preds[v].add(u)

    whole = _whole_model_reason(plan)
    host_of = {d.name: d.host for d in plan.devices}

    def score(assignment, stages=None) -> float:
        if sol.objective == "latency":
            return simulate_latency(problem, assignment, sol.order).makespan
        return simulate_throughput(problem, assignment, stages)

    base = score(a, sol.stages)
    base_copy_s = link_loads(problem, a).sum()
    nodes = []
    for node in graph.nodes:
        i, k = node.index, int(a[node.index])
        # a node of a colocation group moves with it (a chain run as one PyTorch call)
        group = (np.flatnonzero(problem.groups == problem.groups[i]) if problem.groups[i] >= 0
                 else np.array([i]))
        move, extra_copy_s, extra_bytes, why_not = {}, {}, {}, {}
        for j in range(problem.num_devices if whole is None else 0):
            if j == k:
                continue
            moved = a.copy()
            moved[group] = j
            try:
                check_feasible(problem, moved)
            except InfeasibleError as e:
                move[names[j]], why_not[j] = math.nan, str(e)
                continue
            move[names[j]] = score(moved) - base
            extra_copy_s[j] = link_loads(problem, moved).sum() - base_copy_s
            extra_bytes[j] = (sum(problem.out_bytes[u] for u, _ in copies_needed(problem, moved))
                              - base_bytes)
        nodes.append(NodeExplanation(
            index=i, name=node.name, op=node.op_type, device=names[k],
            stage=None if plan.stages is None else plan.stages[i],
            cost_s={names[j]: float(problem.cost[i, j]) for j in range(problem.num_devices)},
            source=plan.cost_sources[i] if plan.cost_sources else "unknown",
            spread={names[j]: float(spread[i, j]) for j in range(problem.num_devices)},
            copies_in=tuple(c for c, (u, dst) in zip(copies, needed) if dst == k and u in preds[i]),
            copies_out=tuple(c for c, (u, _) in zip(copies, needed) if u == i),
            move_s=move, host=host_of.get(names[k]),
            reason=whole or _torch_reason(node) or _reason(problem, sol, i, k, move,
                                                           extra_copy_s, extra_bytes, why_not,
                                                           base, group)))
    sources = Counter(n.source for n in nodes)
    return Explanation(
        nodes=tuple(nodes), objective=sol.objective,
        value_s=float(result.predicted_latency_s), status=sol.status,
        gap=sol.gap,
        device_s={names[k]: float(s) for k, s in enumerate(_device_s(problem, sol, a))},
        link_s={(names[s], names[t]): float(x) for (s, t), x in np.ndenumerate(
            link_loads(problem, a)) if x > 0},
        copies=copies, baselines_s=dict(result.baselines), sources=dict(sources),
        cost_model=result.cost_model, plan=str(plan),
        runs=str(result.delivery or ""),
        baseline_notes=dict(getattr(result, "baseline_notes", None) or {}),
        guard=_guard_text(result),
        overheads=tuple(getattr(result, "overheads_note", ())) + machine_lines(
            problem, sol, host_of),
        hosts={name: h for name, h in host_of.items() if h is not None})


def machine_lines(problem, sol, host_of: Mapping[str, str | None]) -> tuple[str, ...]:
    """One line per machine that hosts of ``problem``'s devices share (``problem.machines``):
    its hosts and cores, the CPU seconds ``sol`` spends there per input (by what) and the cores
    its processes leave free between calls, and so the least time per input (throughput) or
    per input alone (latency) it allows."""
    from autoplace.solve.segments import segments
    from autoplace.solve.simulate import (machine_cpu, machine_loads, replica_machine_s,
                                          stage_counts)

    mach = problem.machines
    if mach is None:
        return ()
    a = np.asarray(sol.assignment, dtype=np.int64)
    if sol.replicas is not None:
        used = np.zeros(problem.num_devices, dtype=bool)
        used[np.asarray(sol.replicas)] = True
        least, cpu = replica_machine_s(problem, sol.replicas), None
    else:
        if sol.objective == "latency":
            seg = segments(problem, a, sol.order)
            _, first = np.unique(seg, return_index=True)
            calls = np.bincount(a[first], minlength=problem.num_devices)
        else:
            calls = stage_counts(problem, a, sol.stages)
        used = calls > 0
        cpu = machine_cpu(problem, a, calls=calls)
        least = machine_loads(problem, a, calls=calls)
    busy = mach.background(used)
    lines = []
    for m in range(mach.cores.size):
        hosts = sorted({str(host_of.get(problem.device_names[k]) or problem.device_names[k])
                        for k in np.flatnonzero(mach.of == m)})
        if not hosts:
            continue
        driver = " and the driving process" if mach.driver == m else ""
        slow = (f", its ops {mach.slowdown[m]:.2f}x as long with every core busy"
                if mach.slowdown[m] > 1 else "")
        line = (f"hosts {', '.join(hosts)}{driver} share one machine of {mach.cores[m]:g} "
                f"cores{slow}: ")
        if cpu is not None:
            ops, actors, daemons, drv = cpu[m]
            line += (f"{_fmt_s(cpu[m].sum())} of CPU per input there (ops {_fmt_s(ops)}, "
                     f"calls in their processes {_fmt_s(actors)}, in the cluster's daemons "
                     f"{_fmt_s(daemons)}, in the driving process {_fmt_s(drv)}) ")
        line += (f"on the {mach.cores[m] - busy[m]:.2f} cores its processes leave free between "
                 f"calls, ")
        what = "one input alone" if sol.objective == "latency" else "a time per input"
        line += f"so {what} of at least {_fmt_s(least[m])}"
        if sol.objective == "throughput" and 0 < least[m] < np.inf:
            line += f" ({1 / least[m]:.1f} inputs/s at most)"
        lines.append(line)
    return tuple(lines)


class _Named(NamedTuple):
    """A device's name and host: what :func:`device_label` and :func:`hosts_line` read."""

    name: str
    host: str | None


def _device_s(problem, sol, a) -> np.ndarray:
    """Compute seconds per input on each device: its nodes' costs, or for replicas the whole
    model's cost on each replica times the share of the inputs it takes."""
    if sol.replicas is None:
        return device_loads(problem, a)
    ks = np.asarray(sol.replicas)
    whole = problem.cost[:, ks].sum(axis=0)
    rate = 1.0 / replica_periods(problem, ks)
    out = np.zeros(problem.num_devices)
    out[ks] = whole * rate / rate.sum()
    return out


def _whole_model_reason(plan) -> str | None:
    """The one reason every node has when the plan runs the whole model as a unit: replicated,
    or on one device with more threads; None otherwise."""
    if plan.replicas:
        return f"replicated: the whole model runs on each of {', '.join(plan.replicas)}"
    if plan.threads is not None:
        return (f"the whole model on {plan.assignment[0]} with {plan.threads} threads (the "
                "all-threads baseline)")
    return None


def _guard_text(result) -> str:
    """Why ``result`` holds this plan, in words ("" when nothing was decided)."""
    decision, plan = getattr(result, "guard", None), result.plan
    replicas = ("replicas of the whole model are predicted faster than the best pipeline "
                "the solver found" if plan.replicas and "+replicas" in plan.solver else "")
    if decision is None:
        return replicas
    close = contenders_note(getattr(result, "contenders", ()))
    close = f"\n{close}" if close else ""
    if replicas and decision.kept:
        return f"{replicas}; {decision.describe()}{close}"
    return decision.describe() + close


def contenders_note(contenders) -> str:
    """One line naming the plans ``compile()`` (``pipeline()``, for throughput plans) times
    against the returned one (each with a ``name``, ``plan`` and ``predicted_s``); "" when
    there are none."""
    if not contenders:
        return ""
    stream = contenders[0].plan.objective == "throughput"
    unit = " an input" if stream else ""
    close = ", ".join(f"{c.name} (" + ("not predicted" if c.predicted_s is None
                                        else f"{c.predicted_s * 1e3:.4f} ms{unit}") + ")"
                      for c in contenders)
    return (f"{'pipeline()' if stream else 'compile()'} times it against {close} (predicted "
            "faster within the costs' uncertainty, or not predicted) and runs the fastest")


def _copy(problem, u: int, src: int, dst: int) -> Copy:
    return Copy(problem.node_names[u], problem.device_names[src], problem.device_names[dst],
                float(problem.out_bytes[u]), problem.transfer_time(u, src, dst))


def _torch_reason(node) -> str | None:
    """Why a PyTorch call runs in PyTorch (``"runs in PyTorch: the importer lacks
    aten.nonzero"``); None for any other node."""
    if not node.is_torch:
        return None
    return f"runs in PyTorch: {dict(node.attrs).get('why') or 'a PyTorch call'}"


def _reason(problem, sol, i, k, move, extra_copy_s, extra_bytes, why_not, base,
            group=None) -> str:
    """Why node ``i`` (with the nodes of its colocation ``group``, which move with it) is on
    device ``k``, in words (see :func:`explain`)."""
    group = [i] if group is None else list(group)
    names, cost = problem.device_names, problem.cost[group].sum(axis=0)
    with_group = "" if len(group) == 1 else f" with its group ({len(group)} ops)"
    what = "latency" if sol.objective == "latency" else "time per input"
    if problem.num_devices == 1:
        return "the only device"
    if problem.pins[i] >= 0:
        return f"pinned to {names[k]} by a rule"
    if np.isfinite(cost).sum() == 1:
        return "only device that can run it" + with_group
    if not extra_copy_s:
        return "no other device can take it: " + next(iter(why_not.values()))
    others = [j for j in range(problem.num_devices) if j != k and np.isfinite(cost[j])]
    nxt = min(others, key=lambda j: cost[j])
    if cost[k] < cost[nxt] * (1 - _SAME_COST):
        return (f"cheapest device{with_group} ({_fmt_s(cost[k])} here, {_fmt_s(cost[nxt])} on "
                f"{names[nxt]})")
    j = min(extra_copy_s, key=lambda j: move[names[j]])
    delta = move[names[j]]
    tol = 1e-9 * max(base, 1e-12)
    if delta < -tol:
        return (f"moving it {with_group.strip() or 'alone'} to {names[j]} would cut the {what} "
                f"by {_fmt_s(-delta)} (solver status {sol.status})")
    if delta <= tol:
        return f"a tie: on {names[j]} the predicted {what} is the same"
    speed = (f"as fast on {names[j]}" if cost[k] <= cost[j] * (1 + _SAME_COST)
             else f"{_fmt_s(cost[k] - cost[j])} slower than on {names[j]}") + with_group
    worse = f"the {what} would grow by {_fmt_s(delta)} on {names[j]}"
    if extra_copy_s[j] >= delta / 2:  # the copies it would add explain most of the loss
        copies = (f"copying {_fmt_bytes(extra_bytes[j])} ({_fmt_s(extra_copy_s[j])})"
                  if extra_bytes[j] > 0 else f"{_fmt_s(extra_copy_s[j])} more of copies")
        return f"{speed}; kept with its neighbours to avoid {copies}: {worse}"
    if sol.objective == "latency":
        return f"{speed}; {names[j]} is busy then: {worse}"
    if sol.stages is not None and len(set(sol.stages.tolist())) == 1:
        return (f"{speed}; the model is called directly on {names[k]}: moving it would start a "
                f"pipeline, whose hand-offs cost more than it gains: {worse}")
    return f"{speed}; balances the load: {worse}"


def _fmt_s(s: float) -> str:
    """Seconds with a unit: ``'812 µs'``, ``'14.8 ms'``, ``'inf'``."""
    if not math.isfinite(s):
        return "inf" if s > 0 else str(s)
    a = abs(s)
    if a >= 1:
        return f"{s:.3g} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} µs"


def _fmt_bytes(n: float) -> str:
    """Bytes with a decimal unit: ``'200 KB'`` (1 KB = 1000 B)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
