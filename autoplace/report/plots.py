"""Plots of a plan: its schedule, its op graph, its pipeline loads, and cost-model accuracy.

Each function draws into ``ax`` when given, else into a new figure made without ``pyplot`` (so
nothing global changes and any backend, Agg included, can save it), and returns the figure.
Times come from the simulator (:mod:`autoplace.solve.simulate`), never recomputed here. A
device of a cluster's host is labelled with its host where its name does not begin with it
(``"gpu@node2"``), as ``str(plan)`` shows it; the process that hands the inputs on is then the
driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from autoplace.report.explain import _fmt_bytes, _fmt_s
from autoplace.report.placement import device_label, device_labels
from autoplace.solve.simulate import (device_loads, hand_offs, link_loads, replica_host_s,
                                      replica_periods, stage_counts, stage_overhead)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from autoplace.report.placement import PlacementResult

_COPY_COLOUR = "0.25"
_OVERHEAD_COLOUR = "0.7"


def plot_gantt(result: PlacementResult, ax: Axes | None = None) -> Figure:
    """The simulated one-input schedule: a row per device and per link that carries a copy.

    Node bars are coloured by op type; copies are hatched bars on their link's row, each also
    marked by a tick so that copies far shorter than the ops stay visible. Every bar's ``gid`` is
    ``"node:<name>"`` or ``"copy:<name>:<src>-><dst>"``.
    """
    ax = _axes(ax, (11, 3.2))
    sched = result.schedule()
    problem, graph = result.problem, result.graph
    a = np.asarray(result.solution.assignment)
    devs = problem.device_names
    links = sorted({(t.src, t.dst) for t in sched.transfers})
    row = {("dev", k): r for r, k in enumerate(range(problem.num_devices))}
    row.update({("link", lk): problem.num_devices + r for r, lk in enumerate(links)})
    unit, scale = _time_unit(sched.makespan)

    ops = [n.op_type for n in graph.nodes]
    time_per_op: dict[str, float] = {}
    for op, s, f in zip(ops, sched.start, sched.finish):
        time_per_op[op] = time_per_op.get(op, 0.0) + f - s
    colour = _colours(sorted(time_per_op, key=time_per_op.get, reverse=True))
    for i, node in enumerate(graph.nodes):
        ax.barh(row[("dev", int(a[i]))], (sched.finish[i] - sched.start[i]) * scale,
                left=sched.start[i] * scale, height=0.7, color=colour[ops[i]], edgecolor="white",
                linewidth=0.4, gid=f"node:{node.name}")
    for t in sched.transfers:
        r = row[("link", (t.src, t.dst))]
        ax.barh(r, (t.finish - t.start) * scale, left=t.start * scale, height=0.5,
                color=_COPY_COLOUR, hatch="///", edgecolor=_COPY_COLOUR,
                gid=f"copy:{problem.node_names[t.node]}:{devs[t.src]}->{devs[t.dst]}")
        ax.plot([t.start * scale] * 2, [r - 0.35, r + 0.35], color=_COPY_COLOUR, lw=1)
    ax.axvline(sched.makespan * scale, color="k", ls="--", lw=1)

    shown = device_labels(result)
    labels = [shown[k] for k in range(problem.num_devices)]
    labels += [f"copy {shown[s]} → {shown[t]}" for s, t in links]
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set_xlim(0, sched.makespan * scale * 1.01 or 1)
    ax.set_xlabel(f"time ({unit})")
    nbytes = sum(problem.out_bytes[t.node] for t in sched.transfers)
    ax.set_title(f"Simulated schedule of one input: {_fmt_s(sched.makespan)} (dashed), "
                 f"{len(sched.transfers)} copies, {_fmt_bytes(nbytes)} moved")
    from matplotlib.patches import Patch

    handles = [Patch(color=colour[op], label=op) for op in colour]
    handles.append(Patch(facecolor=_COPY_COLOUR, hatch="///", label="copy"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1), fontsize=8,
              frameon=False, title="op type", title_fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return ax.figure


def plot_graph(result: PlacementResult, ax: Axes | None = None) -> Figure:
    """The op graph, one column per topological generation, nodes coloured by device.

    Edges whose tensor crosses devices are drawn thick and red. Node labels (the op type without
    its namespace) are shown for graphs of at most 80 nodes.
    """
    import networkx as nx
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    graph, plan = result.graph, result.plan
    g = _layered(graph.to_networkx())
    layers = 1 + max((d["layer"] for _, d in g.nodes(data=True)), default=0)
    ax = _axes(ax, (max(6.0, min(20.0, 0.55 * layers)), 4.5))
    pos = nx.multipartite_layout(g, subset_key="layer")
    dev_of = plan.device_indices()
    colour = _colours([d.name for d in plan.devices], cmap="tab10")
    cross = [(u, v) for u, v in g.edges if dev_of[u] != dev_of[v]]
    local = [(u, v) for u, v in g.edges if dev_of[u] == dev_of[v]]
    nx.draw_networkx_edges(g, pos, edgelist=local, ax=ax, edge_color="0.6", arrowsize=6,
                           width=0.8, node_size=140)
    nx.draw_networkx_edges(g, pos, edgelist=cross, ax=ax, edge_color="tab:red", arrowsize=8,
                           width=2.0, node_size=140)
    nodes = nx.draw_networkx_nodes(g, pos, nodelist=sorted(g), ax=ax, node_size=140,
                                   node_color=[colour[plan.assignment[i]] for i in sorted(g)],
                                   edgecolors="k", linewidths=0.5)
    nodes.set_gid("nodes")
    if len(g) <= 80:
        for n in graph.nodes:  # above the node in even layers, below in odd ones
            up = g.nodes[n.index]["layer"] % 2 == 0
            ax.annotate(n.op_type.split(".")[-1], pos[n.index], xytext=(0, 6 if up else -6),
                        textcoords="offset points", ha="center", va="bottom" if up else "top",
                        fontsize=6)
    label = {d.name: device_label(d) for d in plan.devices}
    handles = [Patch(color=c, label=label[d]) for d, c in colour.items()]
    handles.append(Line2D([], [], color="tab:red", lw=2, label="tensor crosses devices"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), fontsize=8,
              frameon=False)
    ax.set_title(f"Op graph by device: {len(g)} ops, {len(cross)} of {g.number_of_edges()} "
                 "edges cross devices (left to right: topological order)")
    ax.set_axis_off()
    return ax.figure


def plot_stage_loads(result: PlacementResult, ax: Axes | None = None) -> Figure:
    """Seconds per input on each device (stacked by pipeline stage, then the stages' hand-off
    cost), each copying link, and the host that hands every input on (``stage_overhead_s``).

    The pipeline runs at the pace of its busiest bar, the bottleneck (outlined in red); the
    dashed line is the plan's predicted time per input. Each stage segment's ``gid`` is
    ``"load:<device>:<stage>"`` (stage ``-`` for a plan without stages), the hand-offs'
    ``"load:<device>:overhead"`` and ``"load:host"``, each link's ``"load:<src>-><dst>"``.
    A replicated plan shows each replica's share of the work per input instead (``gid``
    ``"load:<device>:replica"``): the replicas split the inputs so that they all keep pace.
    """
    ax = _axes(ax, (7, 4))
    problem, sol = result.problem, result.solution
    shown = device_labels(result)
    driver = "driver" if any(d.host is not None for d in result.plan.devices) else "host"
    if sol.replicas is not None:
        return _plot_replica_loads(problem, sol, ax, shown, driver)
    a = np.asarray(sol.assignment)
    devs = problem.device_names
    stages = sol.stages if sol.stages is not None else result.plan.stages
    stages = np.asarray(stages) if stages is not None else np.full(a.size, -1)
    counts = (stage_counts(problem, a, stages) if stages.min(initial=0) >= 0
              else np.zeros(len(devs)))
    overhead, host = stage_overhead(problem, counts), hand_offs(problem, counts).sum()
    dev_load, link_load = device_loads(problem, a) + overhead, link_loads(problem, a)
    value = max(dev_load.max(initial=0.0), link_load.max(initial=0.0), host)
    unit, scale = _time_unit(value)
    stage_colour = _colours(sorted(set(stages.tolist())))
    node_s = problem.cost[np.arange(a.size), a]

    names, heights = [], []
    for k, dev in enumerate(devs):
        bottom = 0.0
        for s in sorted(set(stages[a == k].tolist())):
            h = node_s[(a == k) & (stages == s)].sum() * scale
            ax.bar(len(names), h, bottom=bottom, color=stage_colour[s], edgecolor="white",
                   linewidth=0.5, gid=f"load:{dev}:{'-' if s < 0 else s}")
            bottom += h
        if overhead[k] > 0:
            ax.bar(len(names), overhead[k] * scale, bottom=bottom, color=_OVERHEAD_COLOUR,
                   edgecolor="white", linewidth=0.5, gid=f"load:{dev}:overhead")
        names.append(shown[k])
        heights.append(dev_load[k] * scale)
    for (s, t), x in np.ndenumerate(link_load):
        if x > 0:
            ax.bar(len(names), x * scale, color=_COPY_COLOUR, hatch="///", edgecolor="white",
                   gid=f"load:{devs[s]}->{devs[t]}")
            names.append(f"copy\n{shown[s]} → {shown[t]}")
            heights.append(x * scale)
    if host > 0:
        ax.bar(len(names), host * scale, color=_OVERHEAD_COLOUR, gid="load:host")
        names.append(f"{driver}\n(hand-offs)")
        heights.append(host * scale)
    top = int(np.argmax(heights))
    ax.bar(top, heights[top], fill=False, edgecolor="tab:red", linewidth=2.5,
           gid="bottleneck")
    ax.annotate("bottleneck", (top, heights[top]), xytext=(0, 4), textcoords="offset points",
                ha="center", color="tab:red", fontsize=9)
    ax.axhline(result.solution.value * scale, color="k", ls="--", lw=1)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"{unit} per input")
    ax.set_ylim(0, max(heights) * 1.15 if heights else 1)
    ax.set_title("Load per input: compute per device (stages stacked), copies per link")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], color="k", ls="--", lw=1,
                      label=f"predicted {_fmt_s(result.solution.value)} per input")]
    handles += [Patch(color=c, label=f"stage {s}") for s, c in stage_colour.items() if s >= 0]
    if overhead.sum() > 0:
        handles.append(Patch(color=_OVERHEAD_COLOUR, label="stage calls and hand-offs"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), fontsize=8,
              frameon=False)
    return ax.figure


def _plot_replica_loads(problem, sol, ax, shown, driver) -> Figure:
    """Each replica's compute and hand-off seconds per input of the stream (its share of the
    inputs times its time per input), and the host's (``driver``: what its bar is called);
    ``shown``: each device's label."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ks = np.asarray(sol.replicas)
    whole, period = problem.cost[:, ks].sum(axis=0), replica_periods(problem, ks)
    over = period - whole  # each replica's call and hand-off
    rate = 1.0 / period
    share = rate / rate.sum()
    unit, scale = _time_unit(sol.value)
    names = []
    for k, w, o, f in zip(ks, whole, over, share):
        ax.bar(len(names), w * f * scale, color=_colours([0])[0], edgecolor="white",
               gid=f"load:{problem.device_names[k]}:replica")
        if o > 0:
            ax.bar(len(names), o * f * scale, bottom=w * f * scale, color=_OVERHEAD_COLOUR,
                   edgecolor="white", gid=f"load:{problem.device_names[k]}:overhead")
        names.append(f"{shown[k]}\n({f:.0%} of inputs)")
    host = replica_host_s(problem, ks)
    if host > 0:
        ax.bar(len(names), host * scale, color=_OVERHEAD_COLOUR, gid="load:host")
        names.append(f"{driver}\n(hand-offs, calls)")
    ax.axhline(sol.value * scale, color="k", ls="--", lw=1)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(f"{unit} per input")
    ax.set_ylim(0, sol.value * scale * 1.15 or 1)
    ax.set_title("Load per input: replicas of the whole model share the inputs")
    handles = [Line2D([], [], color="k", ls="--", lw=1,
                      label=f"predicted {_fmt_s(sol.value)} per input"),
               Patch(color=_colours([0])[0], label="whole model")]
    if over.any():
        handles.append(Patch(color=_OVERHEAD_COLOUR, label="calls and hand-offs"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1), fontsize=8,
              frameon=False)
    return ax.figure


def plot_accuracy(predicted, measured, ax: Axes | None = None, label: str = "ops") -> Figure:
    """Predicted against measured seconds on log-log axes, with ±10 % and ±25 % bands.

    Parameters
    ----------
    predicted, measured : array-like of positive seconds, the same length
    label : str
        What the points are, for the legend.
    """
    p = np.asarray(predicted, dtype=float).ravel()
    m = np.asarray(measured, dtype=float).ravel()
    if p.size != m.size or p.size == 0:
        raise ValueError(f"predicted and measured must be non-empty and of one length; "
                         f"got {p.size} and {m.size}")
    bad = ~(np.isfinite(p) & np.isfinite(m) & (p > 0) & (m > 0))
    if bad.any():
        raise ValueError(f"times must be positive and finite (seconds); {int(bad.sum())} are "
                         f"not, first at index {int(np.flatnonzero(bad)[0])}")
    ax = _axes(ax, (5.5, 5))
    unit, scale = _time_unit(float(np.median(m)))
    lo, hi = min(p.min(), m.min()) * scale / 1.5, max(p.max(), m.max()) * scale * 1.5
    xs = np.geomspace(lo, hi, 50)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="tab:blue", alpha=0.1, lw=0, label="±25 %")
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="tab:blue", alpha=0.2, lw=0, label="±10 %")
    ax.plot(xs, xs, "k--", lw=1, label="predicted = measured")
    ax.plot(m * scale, p * scale, "o", ms=4, alpha=0.7, color="tab:orange", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured ({unit})")
    ax.set_ylabel(f"predicted ({unit})")
    ape = np.abs(p - m) / m
    ax.set_title(f"{p.size} {label}: mean error {ape.mean():.1%}, within 10 %: "
                 f"{np.mean(ape <= 0.1):.0%}, within 25 %: {np.mean(ape <= 0.25):.0%}", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return ax.figure


def _layered(g):
    """``g`` with a ``layer`` (topological generation) per node, nodes re-inserted so that each
    layer lists them by the mean position of their predecessors (fewer crossing edges)."""
    import networkx as nx

    out, rank = nx.DiGraph(), {}
    for layer, members in enumerate(nx.topological_generations(g)):
        def key(v):
            preds = [rank[u] for u in g.predecessors(v)]
            return (sum(preds) / len(preds) if preds else -1.0, v)

        for r, v in enumerate(sorted(members, key=key)):
            rank[v] = r
            out.add_node(v, **g.nodes[v], layer=layer)
    out.add_edges_from(g.edges(data=True))
    return out


def _axes(ax, figsize) -> Axes:
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=figsize, layout="constrained").add_subplot()


def _time_unit(seconds: float) -> tuple[str, float]:
    """The unit (and factor from seconds) in which ``seconds`` reads best."""
    if seconds >= 1:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e3
    return "µs", 1e6


def _colours(keys, cmap: str = "tab20") -> dict:
    """A distinct colour per key, in order (cycling after the colormap's colours)."""
    from matplotlib import colormaps

    colours = colormaps[cmap].colors
    if cmap == "tab20":  # the dark shades first: neighbouring keys differ in hue
        colours = colours[0::2] + colours[1::2]
    return {k: colours[i % len(colours)] for i, k in enumerate(keys)}
