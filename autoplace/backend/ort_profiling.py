"""ONNX Runtime segments timed: each op's seconds in a segment as ORT's profiler reports the
nodes of its optimized graph (:func:`profile`), and which graph optimization level, thread count
and fusions run a segment fastest here (:func:`fastest_variant`), timed whole in turn
(:func:`profile_whole`). How a segment is exported, made a session and called from the VM is
:mod:`autoplace.backend.ort_segments`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoplace.backend.ort_segments import FUSIONS, OrtSegment, op_of, random_inputs, session
from autoplace.backend.timing import BEHIND, far_behind

#: How much faster a graph must run with a fusion disabled for :func:`fastest_variant` to keep
#: it disabled: ORT's own choice stands where the two are within the noise of their timing.
FUSION_MARGIN = 0.03



@dataclass(frozen=True)
class SegmentTimes:
    """A segment run by ORT alone: the median call (``whole_s``), and per op (by node name) the
    seconds its nodes of the optimized graph took, per call, with their share of the rest of
    the call (``ops``); ``added_s``: the nodes ORT added (layout reorders at the edges), per
    call; ``other_s``: the rest of the call (ORT's executor between the nodes), which ``ops``
    share by their nodes."""

    whole_s: float
    ops: Mapping[str, float]
    other_s: float
    level: str
    threads: int
    added_s: float = 0.0


@dataclass(frozen=True)
class ProfiledRun:
    """Calls of an ONNX model under ORT's profiler at ``level`` on ``threads``: the profile's
    ``events``, the seconds of each timed call (``walls``, after two warm-up calls), and of
    the nodes of ORT's optimized graph, each one's ``"domain:op_type"`` (``kind_of``) and the
    op it computes for where not named after one (``owners``, :func:`_owners`)."""

    level: str
    threads: int
    events: list = field(repr=False)
    walls: list[float]
    kind_of: Mapping[str, str]
    owners: Mapping[str, str]


def profiled_run(model: bytes, threads: int, level: str, runs: int,
                 feeds: Sequence[np.ndarray], ops: Sequence[str] = ()) -> ProfiledRun:
    """Up to ``runs`` calls (after two warm-up calls: :func:`_walls`) of ONNX ``model`` on
    ``feeds`` under ORT's profiler, in a session at ``level`` on ``threads``; ``ops``: the
    op-graph nodes the model computes, whose fused nodes :attr:`ProfiledRun.owners` names."""
    with tempfile.TemporaryDirectory() as tmp:
        optimized = os.path.join(tmp, "optimized.onnx")
        sess = session(model, threads, level, os.path.join(tmp, "ort"), optimized)
        owners = _owners(optimized, ops, model)
        kind_of = _node_kind_of(optimized)
        walls = _walls(sess, feeds, runs)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    return ProfiledRun(level, threads, events, walls, kind_of, owners)


def profile(segment: OrtSegment, threads: int = 1, level: str = "all", runs: int = 10,
            inputs: Sequence[np.ndarray] | None = None,
            weights: Mapping[str, float] | None = None, *, profiled: ProfiledRun | None = None,
            warm=None) -> SegmentTimes:
    """Run ``segment`` ``runs`` times (after two warm-up calls) under ORT's profiler
    (``SessionOptions.enable_profiling``) on ``inputs`` (random ones of its shapes by default)
    and split the time among its ops by the nodes of the optimized graph each became.

    ORT names a fused node after one of the ops it computes: a conv with its bias add, batch
    norm and activation after the activation, a MatMul+Add (``"fused ..."``) after the MatMul.
    Its time is shared among that op and the ops before it (after it, for ``"fused ..."``) in
    the segment that kept no node of their own, in proportion to ``weights`` (by op name, e.g.
    their FLOPs; equal shares without). A node ORT added inside the segment (a layout reorder)
    is charged to the op whose output it reads. What the call takes beyond its nodes (ORT's
    executor between them, which grows with their number) is shared among the ops by their
    nodes (``other_s`` says how much).

    ``profiled``: the segment's :func:`profiled_run` on ``inputs`` where one was made already
    (used where its level and threads are these); ``warm``: a session of it at this level and
    threads that has run already (:func:`fastest_variant` made both): neither is made again."""
    feeds = list(inputs) if inputs is not None else random_inputs(segment.inputs)
    if profiled is None or (profiled.level, profiled.threads) != (level, threads):
        profiled = profiled_run(segment.onnx, threads, level, runs, feeds, segment.ops)
    walls = profiled.walls
    per_op, other, forward, nodes = _split(profiled.events, segment.ops, len(walls) + 2, skip=2,
                                           owners=profiled.owners)
    # The profiler slows every node down a little: its split, scaled to a call without it.
    whole = profile_whole(segment, threads, level, runs, feeds, warm=warm)
    scale = min(1.0, whole / max(float(np.median(walls)), 1e-12))
    per_op = {k: v * scale for k, v in per_op.items()}
    other *= scale
    rest = max(0.0, whole - sum(per_op.values()) - other)
    counted = sum(nodes.values())
    if counted:
        per_op = {k: v + rest * nodes.get(k, 0) / counted for k, v in per_op.items()}
    per_op = _unfused(per_op, segment, weights or {}, forward)
    return SegmentTimes(whole, per_op, rest, level, threads, other)


def _owners(optimized: str, ops: Sequence[str], exported: bytes = b"") -> dict[str, str]:
    """Of the nodes of ORT's optimized graph (saved at path ``optimized``) not named after an op,
    by name -> the op they compute for: a node ORT fused under a name of its own (a
    ``SkipLayerNormalization``, a ``Gelu``) the op whose output it gives (its output keeps that
    tensor's name: in the graph as ``exported``, an op's node gave it), else the op whose
    output it reads (a layout reorder after a conv whose consumer takes another layout). A
    layout reorder that reads the segment's inputs or gives its outputs is at an edge and has
    no owner (the edges are charged apart). Empty where the graph cannot be read."""
    import onnx

    try:
        graph = onnx.load(optimized, load_external_data=False).graph
        gave = {o: op for n in onnx.load_from_string(exported).graph.node
                if (op := op_of(n.name, ops)) is not None for o in n.output} if exported else {}
    except Exception:  # noqa: BLE001 - the time then stays at the edges
        return {}
    produced = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    owner = {}
    for n in graph.node:  # in topological order: a reorder of a reorder finds its op
        if op_of(n.name, ops) is not None or not n.input:
            continue
        reorder = n.op_type.startswith("Reorder") or n.op_type == "Transpose"
        if reorder and (set(n.output) & outputs or n.input[0] not in produced):
            continue
        op = None if reorder else next(
            (found for t in n.output if (found := op_of(t, ops) or gave.get(t)) is not None),
            None)
        src = produced.get(n.input[0])
        if op is None and src is not None:
            op = op_of(src.name, ops) or owner.get(src.name)
        if op is None and not reorder:
            op = next((found for t in n.input if (found := op_of(t, ops)) is not None), None)
        if op is not None:
            owner[n.name] = op
    return owner


def _split(events, ops: Sequence[str], calls: int, skip: int,
           owners: Mapping[str, str] | None = None) -> tuple[dict, float, frozenset, dict]:
    """Per op, its nodes' mean seconds a call over the calls after the first ``skip`` of
    ``calls`` (with the nodes ``owners`` gives it), the same of the nodes no op owns, the
    ops that own a fusion named after them (``"fused ..."``), and per op its nodes a call."""
    runs = _model_runs(events)
    kept = runs[skip:] if len(runs) == calls else runs
    start = min((e["ts"] for e in kept), default=0)
    per_op, other, forward = dict.fromkeys(ops, 0.0), 0.0, set()
    nodes = dict.fromkeys(ops, 0.0)
    for node, dur in _kernel_times(events, start):
        seconds = dur * 1e-6 / max(1, len(kept))
        op = op_of(node, ops) or (owners or {}).get(node)
        if op is None:
            other += seconds
        else:
            per_op[op] += seconds
            nodes[op] += 1 / max(1, len(kept))
            if node.startswith("fused "):
                forward.add(op)
    return per_op, other, frozenset(forward), nodes


def _model_runs(events) -> list[dict]:
    """The events of ORT's profile (``events``, its JSON) that are whole calls of the session."""
    return [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]


def _kernel_times(events, start: float = 0):
    """``(node name, microseconds)`` of each node's kernel in ORT's profile ``events``, from
    time stamp ``start`` on."""
    for e in events:
        name = e.get("name", "")
        if e.get("cat") == "Node" and name.endswith("_kernel_time") and e.get("ts", 0) >= start:
            yield name[: -len("_kernel_time")], e.get("dur", 0)


def _unfused(per_op: dict, segment: OrtSegment, weights: Mapping[str, float],
             forward: frozenset = frozenset()) -> dict:
    """``per_op`` with each fused node's time shared back (:func:`profile`): an op of
    ``forward`` (its node a fusion named after its first op, ``"fused <node>"``) shares with the
    ops right after it that kept no node of their own, any other with those right before it."""
    out, ops = dict(per_op), list(segment.ops)
    claimed = set()
    timed = [k for k, op in enumerate(ops) if per_op[op] > 0]
    for k in sorted(timed, key=lambda k: ops[k] not in forward):  # fusions first
        op = ops[k]
        group = [op]
        for other in (ops[k + 1:] if op in forward else reversed(ops[:k])):
            if not segment.onnx_nodes.get(other):
                continue  # folded into a constant at export: no share
            if per_op[other] > 0 or other in claimed:
                break
            group.append(other)
        claimed.update(group)
        w = np.array([max(float(weights.get(o, 1.0 if not weights else 0.0)), 0.0)
                      for o in group]) + 1e-12
        for o, share in zip(group, w / w.sum()):
            out[o] = per_op[op] * float(share)
    return out


def thread_options(threads: int) -> tuple[int, ...]:
    """The intra-op thread counts a session given ``threads`` is timed at: ``threads``, and one
    where that is more. On a small graph, handing each node's work to other threads and waiting
    for them costs more than they give, so one thread can be the faster: which is, is measured."""
    return tuple(sorted({max(1, int(threads)), 1}, reverse=True))


def fastest_variant(segment: OrtSegment, threads: int = 1, runs: int = 10,
                    kept: dict | None = None) -> tuple[str, int, dict[tuple[str, int], float]]:
    """The graph optimization level and intra-op thread count (of :func:`thread_options`)
    under which ``segment`` ran fastest here, and each variant's median seconds, keyed
    ``(level, threads)``: ``ORT_ENABLE_ALL`` is not always the fastest, nor all the threads,
    nor every fusion ORT makes (:func:`slower_fusions`: the level returned names those it
    disables). The variants are called in turn, so that all meet the same phases of the
    machine, one far behind timed no more (:data:`~autoplace.backend.timing.BEHIND`); the
    fusions' variants in a round of their own, against the fastest level again, which decides
    (the times returned for them are from that round).

    ``kept``: where given and the level returned disables no fusion, it gets what
    :func:`profile` of the segment at that level and thread count would make again:
    ``profiled`` (a :class:`ProfiledRun`) and ``warm`` (a session that has run)."""
    variants = [(lv, t) for lv in ("all", "extended") for t in thread_options(threads)]
    feeds = random_inputs(segment.inputs)
    sessions = [segment.session(t, lv) for lv, t in variants]
    walls = _walls_in_turn(sessions, feeds, runs, drop_above=BEHIND)
    times = {v: float(np.median(w)) for v, w in zip(variants, walls)}
    level, best = min(times, key=times.get)
    base = sessions[variants.index((level, best))]
    del sessions  # the others' memory
    profiled = profiled_run(segment.onnx, best, level, runs, feeds, segment.ops)
    disabled, timed = slower_fusions(segment.onnx, level, best, feeds, runs, base=base,
                                     profiled=profiled)
    # the fusions' variants were timed in a round of their own, against the level again
    times.update({(lv, best): s for lv, s in timed.items() if lv != level})
    if kept is not None and not disabled:
        kept.update(profiled=profiled, warm=base)
    return "-".join((level, *disabled)), best, times


def slower_fusions(model: bytes, level: str, threads: int, feeds: Sequence[np.ndarray],
                   runs: int = 10, base=None, profiled: ProfiledRun | None = None
                   ) -> tuple[tuple[str, ...], dict[str, float]]:
    """The fusions of :data:`~autoplace.backend.ort_segments.FUSIONS` (by transformer name)
    that ONNX model ``model`` runs faster without, here, at graph optimization ``level`` on
    ``threads`` intra-op threads, on ``feeds``; and the median seconds of each variant timed,
    by level (``level`` itself, ``"<level>-<transformer>"`` per fusion tried, and their
    combination where several win).

    A fusion is tried where its fused nodes took at least :data:`FUSION_MARGIN` of a call of
    ORT's optimized graph under its profiler (without them, at most their time is saved) and
    disabling it changes that graph. Each is called once in turn with ``level`` first, and
    one more than :data:`EARLY_DROP` slower is dropped then; the rest are timed in turn with
    ``level``, and kept disabled where they run at least :data:`FUSION_MARGIN` faster.
    ``base``: a session of ``model`` at ``level`` and ``threads`` already made, timed as the
    level (one is made where None); ``profiled``: the model's :func:`profiled_run` at
    ``level`` and ``threads`` on ``feeds``, which gives the fused nodes' time (one call is
    profiled where None)."""
    if profiled is None:
        profiled = profiled_run(model, threads, level, 1, feeds)
    have = Counter(profiled.kind_of.values())
    share = _kind_shares(profiled.events, profiled.kind_of)
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {level: base if base is not None else session(model, threads, level)}
        for name, makes in FUSIONS.items():
            if sum(v for k, v in share.items() if _made_by(k, makes)) < FUSION_MARGIN:
                continue
            variant = f"{level}-{name}"
            path = os.path.join(tmp, f"{name}.onnx")
            sess = session(model, threads, variant, optimized=path)
            if _node_kinds(path) != have:  # an empty kinds (unreadable) differs too: timed
                sessions[variant] = sess
    if len(sessions) == 1:
        return (), {}
    first = dict(zip(sessions, _walls_in_turn(list(sessions.values()), feeds, 1, warm=1)))
    sessions = {lv: s for lv, s in sessions.items()
                if first[lv][0] <= (1 + EARLY_DROP) * first[level][0]}
    times = {lv: float(w[0]) for lv, w in first.items() if lv not in sessions}
    if len(sessions) > 1:
        walls = _walls_in_turn(list(sessions.values()), feeds, runs, warm=0)
        times.update({lv: float(np.median(w)) for lv, w in zip(sessions, walls)})
    bar = (1 - FUSION_MARGIN) * times[level] if level in sessions and len(sessions) > 1 else 0
    kept = sorted((lv for lv in sessions if lv != level and times[lv] < bar), key=times.get)
    disabled = tuple(lv.split("-", 1)[1] for lv in kept)
    if len(disabled) > 1:  # each wins alone: together too, or the best of them alone
        both = "-".join((level, *disabled))
        single = kept[0]
        walls = _walls_in_turn([session(model, threads, both), sessions[single]], feeds, runs)
        times[both], again = (float(np.median(w)) for w in walls)
        if times[both] >= again:
            disabled = (single.split("-", 1)[1],)
    return disabled, times


#: How much slower than the level's one call a fusion's variant's first call may be and still
#: be timed further (:func:`slower_fusions`).
EARLY_DROP = 0.15


def _made_by(kind: str, makes: Sequence[str]) -> bool:
    """Whether a node of ``kind`` (``"domain:op_type"``) is among a fusion's ``makes``."""
    return kind in makes or kind.split(":")[0] in makes


def _kind_shares(events: list, kind_of: Mapping[str, str]) -> dict[str, float]:
    """Per ``"domain:op_type"`` (``kind_of``: by node name), the share of the last call of
    ORT's profile ``events`` its nodes took (empty where they name no node)."""
    runs = _model_runs(events)
    spent: Counter = Counter()
    for node, dur in _kernel_times(events, runs[-1]["ts"] if runs else 0):
        spent[kind_of.get(node, "?")] += dur
    total = sum(spent.values())
    return {k: v / total for k, v in spent.items()} if total else {}


def _node_kind_of(path: str) -> dict[str, str]:
    """Per node name of the ONNX model saved at ``path``, its ``"domain:op_type"`` (empty where
    it cannot be read)."""
    import onnx

    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - then nothing is known of it
        return {}
    return {n.name: f"{n.domain or 'ai.onnx'}:{n.op_type}" for n in graph.node}


def _node_kinds(path: str) -> Counter:
    """``"domain:op_type"`` of each node of the ONNX model saved at ``path``, counted (empty
    where it cannot be read)."""
    return Counter(_node_kind_of(path).values())


def profile_whole(segment: OrtSegment, threads: int = 1, level: str = "all", runs: int = 10,
                  inputs: Sequence[np.ndarray] | None = None, warm=None) -> float:
    """Median seconds of one call of ``segment`` alone, without the profiler (on ``inputs``,
    random ones by default; after two warm-ups), in a new session at ``level`` on ``threads``
    or in ``warm``, one of those that has run already (after one warm-up then)."""
    feeds = list(inputs) if inputs is not None else random_inputs(segment.inputs)
    if warm is not None:
        return float(np.median(_walls_in_turn([warm], feeds, runs, warm=1)[0]))
    return float(np.median(_walls(segment.session(threads, level), feeds, runs)))


#: Seconds a segment's timing may take beyond its warm-up calls, once it has three calls:
#: a long segment's median settles in fewer calls than a short one's.
WALLS_BUDGET_S = 0.5


def _walls(sess, feeds: Sequence[np.ndarray], runs: int) -> list[float]:
    """Seconds of each of up to ``runs`` calls of ORT session ``sess`` on ``feeds``, after two
    warm-up calls: fewer (three at least) where they pass :data:`WALLS_BUDGET_S`."""
    return _walls_in_turn([sess], feeds, runs)[0]


def _walls_in_turn(sessions, feeds: Sequence[np.ndarray], runs: int, warm: int = 2,
                   drop_above: Mapping[int, float] | None = None) -> list[list[float]]:
    """Per ORT session of ``sessions`` (of one graph), the seconds of each of up to ``runs``
    calls on ``feeds``, one call of each in turn, after ``warm`` warm-up calls each: fewer
    rounds (three at least, where ``runs`` allows) where the calls pass
    :data:`WALLS_BUDGET_S` a session. ``drop_above``: rounds -> factor, after which a session
    that far behind the fastest is called no more
    (:func:`~autoplace.backend.timing.far_behind`); where one alone is left, the rounds end."""
    import time

    feed_of = [dict(zip([i.name for i in s.get_inputs()], feeds)) for s in sessions]
    for sess, feed in zip(sessions, feed_of):
        for _ in range(warm):
            sess.run(None, feed)
    walls: list[list[float]] = [[] for _ in sessions]
    out: set[int] = set()
    rounds = 0
    while rounds < runs and (rounds < 3 or sum(sum(w) for k, w in enumerate(walls) if k not in out)
                             < WALLS_BUDGET_S * (len(sessions) - len(out))):
        for k, (sess, feed, w) in enumerate(zip(sessions, feed_of, walls)):
            if k in out:
                continue
            t = time.perf_counter()
            sess.run(None, feed)
            w.append(time.perf_counter() - t)
        rounds += 1
        out |= far_behind(walls, rounds, drop_above)
        if out and len(out) >= len(sessions) - 1:
            break
    return walls
