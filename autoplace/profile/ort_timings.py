"""What an ONNX Runtime device's ops of one model take, as ORT runs them: in context.

ORT's speed is in what it does across ops (a layout kept from conv to conv, batch norms folded,
activations fused), so a sum of single ops timed alone would misprice it. :func:`time_ort_device`
exports every run of ops the device can take as one segment
(:func:`autoplace.graph.segments.cut`, :func:`~autoplace.graph.segments.export`), measures which
graph optimization level and intra-op thread count run the largest fastest here, and profiles
each segment with ORT's profiler at them: each op costs what its nodes of the optimized graph took
(:func:`autoplace.backend.ort_profiling.profile`). What entering and leaving a segment costs (the
call from the VM, the layout reorders ORT adds at its edges) is charged per tensor that crosses
(:attr:`OrtTimings.edge_s`, and per byte, :attr:`OrtTimings.edge_byte_s`: the reorders grow with
the tensor), on the links between the device and TVM's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autoplace.profile.torch_runner import between_bytes

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph

log = logging.getLogger(__name__)

#: Until measured: what one call of a segment from the VM costs beyond its nodes.
DEFAULT_CALL_S = 20e-6


@dataclass(frozen=True)
class OrtTimings:
    """Seconds of one model's ops on one ORT device.

    ``ops``: by node index, the op's nodes in its segment's optimized graph (``inf``: the
    device cannot run it, ``why`` says so); ``edge_s``: one tensor entering or leaving a
    segment (half a call from the VM), plus ``edge_byte_s`` a byte of it (the layout reorders
    ORT adds at a segment's edges, per byte that crosses);
    ``threads``: the threads the caller gave (what the timings are kept under);
    ``level`` and ``run_threads``: the graph optimization level and intra-op thread count the
    segments run at (None: ``threads``), ``variants_s`` what the largest segment took at each
    ``(level, threads)`` timed; ``segments``: how many were profiled; ``call_s``: one call from the
    VM beyond its nodes, with ``between_bytes`` written by other ops between two calls
    (:func:`measure_call`); ``stored``: read from a profile store, not timed here; ``kept``:
    what this host timed of the same graph before (:func:`kept_dir`), not timed again."""

    ops: Mapping[int, float]
    edge_s: float
    level: str
    threads: int = 1
    variants_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    segments: int = 0
    why: Mapping[int, str] = field(default_factory=dict)
    call_s: float = DEFAULT_CALL_S
    stored: bool = False
    edge_byte_s: float = 0.0
    between_bytes: int = 0
    run_threads: int | None = None
    kept: bool = False

    @property
    def session_threads(self) -> int:
        """The intra-op threads the segments run at."""
        return self.threads if self.run_threads is None else self.run_threads


def runnable(graph: OpGraph, device: Device) -> list[bool]:
    """Per node, whether ``device`` (an ORT device) can take it: an op it runs with a PyTorch
    equivalent for its attributes."""
    from autoplace.backend.torch_equivalents import node_equivalent

    return [device.can_run(n.op_type) and node_equivalent(n, tuples=True) is not None
            for n in graph.nodes]


def time_ort_device(mod, graph: OpGraph, device: Device, *, func_name: str = "main",
                    threads: int = 1, runs: int = 10, db=None) -> OrtTimings:
    """The :class:`OrtTimings` of ``graph`` (of ``mod[func_name]``) on ORT device ``device``,
    given ``threads`` (its segments run at those or, where the largest runs faster so, at
    one). A run that cannot be exported is tried op by op; an op that still fails is left to
    the other devices, with one warning naming it.

    With ``db`` (a profile store's path): where the store holds every op of ``graph`` for this
    device (its fingerprint: this CPU, ONNX Runtime's version, ``threads``), they are read from
    it and nothing is timed; otherwise what is timed here is written to it (each workload's
    seconds in context, schedule ``"ort:<level>"``, and the edge as overhead ``"ort_edge"``).
    Without ``db``, what this host timed of the same graph before is read (:func:`kept_dir`),
    else what is timed is kept there.
    """
    from autoplace.backend.ort_segments import require

    require()
    if db is not None:
        from autoplace.profile.store import ProfileStore

        with ProfileStore(db) as store:
            found = stored(store, graph, device, threads)
            if found is None:
                found = _timed(mod, graph, device, func_name, threads, runs)
                store_timings(store, graph, device, found)
        return found
    path = _kept_path(graph, device, threads, runs)
    found = _read_kept(path)
    if found is None:
        found = _timed(mod, graph, device, func_name, threads, runs)
        _keep(path, found)
    return found


#: What :func:`kept_dir` keeps of a graph's timings, in which form (part of the folder's name).
KEPT_FORMAT = 1


def kept_dir():
    """Where this host keeps what its ORT devices timed of each graph, so that the same graph
    again (the same model, its weights changed or not) times nothing: a folder of the
    calibration cache entry of this host's CPU
    (:func:`~autoplace.profile.calibration_cache.cache_entry`) per ONNX Runtime and PyTorch
    version (its exporter) and how sessions wait (``THREADS_WAIT``)."""
    import onnxruntime
    import torch

    from autoplace.backend.ort_segments import THREADS_WAIT
    from autoplace.devices import Device
    from autoplace.profile.calibration_cache import cache_entry

    _, entry = cache_entry(Device.cpu(0))
    return entry / (f"ort_device-{onnxruntime.__version__}-torch{torch.__version__}-"
                    f"{THREADS_WAIT}-f{KEPT_FORMAT}")


def _kept_path(graph: OpGraph, device: Device, threads: int, runs: int):
    """The file of ``graph``'s timings on ``device``: named by what decides them (each op's
    workload, the edges between them, which ops the device takes, the threads and runs
    given)."""
    import hashlib
    import json

    what = [threads, runs, runnable(graph, device),
            [(n.workload_key, n.is_output) for n in graph.nodes],
            sorted((e.src, e.dst) for e in graph.edges)]
    digest = hashlib.sha1(json.dumps(what).encode()).hexdigest()[:24]
    return kept_dir() / f"{digest}.json"


def _read_kept(path) -> OrtTimings | None:
    """The timings kept at ``path``, or None (nothing kept, or a file that cannot be read:
    timed again)."""
    import json

    try:
        d = json.loads(path.read_text())
        return OrtTimings(
            {int(i): np.inf if s is None else float(s) for i, s in d["ops"]},
            float(d["edge_s"]), str(d["level"]), int(d["threads"]),
            {(str(lv), int(t)): float(s) for lv, t, s in d["variants_s"]},
            int(d["segments"]), {int(i): str(w) for i, w in d["why"]}, float(d["call_s"]),
            edge_byte_s=float(d["edge_byte_s"]), between_bytes=int(d["between_bytes"]),
            run_threads=None if d["run_threads"] is None else int(d["run_threads"]),
            kept=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _keep(path, t: OrtTimings) -> None:
    from autoplace.profile.calibration_cache import write_whole

    try:
        write_whole(path, {
            "ops": [[i, s if np.isfinite(s) else None] for i, s in t.ops.items()],
            "edge_s": t.edge_s, "level": t.level, "threads": t.threads,
            "variants_s": [[lv, n, s] for (lv, n), s in t.variants_s.items()],
            "segments": t.segments, "why": [[i, w] for i, w in t.why.items()],
            "call_s": t.call_s, "edge_byte_s": t.edge_byte_s,
            "between_bytes": t.between_bytes, "run_threads": t.run_threads})
    except OSError as e:
        log.warning("could not keep the ORT device's timings in %s: %s", path.parent, e)


def ort_info(device: Device, threads: int = 1) -> dict:
    """What makes an ORT device's figures comparable: the CPU, ONNX Runtime's and PyTorch's
    (its exporter's) versions, the thread count, the variants timed to choose the session's
    (:func:`~autoplace.backend.ort_profiling.fastest_variant`) (fingerprinted by
    :func:`~autoplace.profile.measure.fingerprint`)."""
    import platform

    import onnxruntime
    import torch

    from autoplace.backend.ort_segments import THREADS_WAIT
    from autoplace.profile.torch_runner import _cpu_model

    return {"kind": "ort", "place": device.target, "target": None, "hardware": _cpu_model(),
            "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
            "threads": threads, "wait": THREADS_WAIT, "host": platform.node(), "remote": None,
            "variants": "levels, threads, fusions"}


def stored(store, graph: OpGraph, device: Device, threads: int = 1) -> OrtTimings | None:
    """The :class:`OrtTimings` of ``graph`` that ``store`` holds for ``device`` at ``threads``,
    or None where it lacks any of its ops or the edge, or where its call was measured beside
    a working set (:func:`between_bytes`) of more than twice or under half ``graph``'s."""
    from autoplace.profile.measure import fingerprint

    fp = fingerprint(ort_info(device, threads))
    edges = [f for f in store.overheads(fp) if f.kind == "ort_edge"]
    if not edges:
        return None
    edge = edges[0]
    touched, here = edge.detail.get("between_bytes"), between_bytes(graph)
    if touched is None or not 0.5 <= (touched + 1) / (here + 1) <= 2.0:
        return None  # its call was measured with another working set beside it: timed again
    level = edge.detail.get("level", "all")
    rows = {m.workload: m for m in store.measurements(fp, schedule=f"ort:{level}")}
    ops, why = {}, {}
    for n in graph.nodes:
        m = rows.get(n.workload_key)
        if m is None:
            return None
        ops[n.index] = m.latency_s if m.ok else np.inf
        if not m.ok:
            why[n.index] = m.error or "ONNX Runtime did not run it"
    # stores written before the thread count was measured hold the levels at ``threads``
    variants = {(str(lv), int(t)): float(v) for lv, t, v in edge.detail.get("variants_s", [])}
    variants.update({(k, threads): float(v) for k, v in edge.detail.get("levels_s", {}).items()})
    return OrtTimings(ops, edge.seconds, level, threads, variants,
                      int(edge.detail.get("segments", 0)), why,
                      float(edge.detail.get("call_s", DEFAULT_CALL_S)), stored=True,
                      edge_byte_s=float(edge.detail.get("byte_s", 0.0)),
                      between_bytes=int(touched),
                      run_threads=int(edge.detail.get("run_threads", threads)))


def store_timings(store, graph: OpGraph, device: Device, timings: OrtTimings) -> None:
    """Write ``timings`` (of ``graph`` on ``device``) to ``store``: per workload, the mean of
    its ops' seconds in context (``unsupported`` with the reason where the device cannot run
    it), and the edge with the level it was measured at."""
    from autoplace.profile.measure import fingerprint
    from autoplace.profile.measurements import Measurement, OverheadFit, timestamp

    info = ort_info(device, timings.threads)
    fp = fingerprint(info)
    store.add_device(fp, device.name, info)
    store.add_workloads(graph.nodes)
    now = timestamp()
    for key, idx in graph.workloads().items():
        secs = [timings.ops[i] for i in idx]
        if all(np.isfinite(secs)):
            s = float(np.mean(secs))
            m = Measurement(key, fp, "ok", median_s=s, min_s=s, mean_s=s, repeats=len(idx),
                            number=1, schedule=f"ort:{timings.level}", measured_at=now)
        else:
            m = Measurement(key, fp, "unsupported", schedule=f"ort:{timings.level}",
                            error=timings.why.get(idx[0], "ONNX Runtime did not run it"),
                            measured_at=now)
        store.put(m)
    store.put_overhead(OverheadFit(fp, "", "ort_edge", timings.edge_s, {
        "level": timings.level, "run_threads": timings.session_threads,
        "variants_s": [[lv, t, s] for (lv, t), s in timings.variants_s.items()],
        "segments": timings.segments, "call_s": timings.call_s,
        "byte_s": timings.edge_byte_s, "between_bytes": timings.between_bytes,
        "how": "half a call from the VM per tensor crossing, plus byte_s a byte of it for the "
               "reorders ORT adds at a segment's edges"},
        now))


def _timed(mod, graph: OpGraph, device: Device, func_name: str, threads: int,
           runs: int) -> OrtTimings:
    from autoplace.backend.ort_profiling import fastest_variant, profile
    from autoplace.backend.ort_segments import OrtSegmentError
    from autoplace.graph.segments import cut, export

    on = runnable(graph, device)
    why = {i: "ONNX Runtime takes no such op here (no PyTorch equivalent to export)"
           for i, ok in enumerate(on) if not ok}
    segments = []
    for span in cut(mod[func_name], on):
        try:
            segments.append(export(mod, span, func_name))
        except OrtSegmentError:
            for i in span.nodes:
                try:
                    one = cut(mod[func_name], [k == i for k in range(len(graph.nodes))])
                    segments.extend(export(mod, s, func_name) for s in one)
                except OrtSegmentError as e:
                    why[i] = str(e)
                    log.warning("%s: %s; it runs on the other devices", device.name, e)
    ops = dict.fromkeys(range(len(graph.nodes)), np.inf)
    if not segments:
        return OrtTimings(ops, DEFAULT_CALL_S / 2, "all", threads, why=why)
    largest = max(segments, key=lambda s: len(s.ops))
    kept: dict = {}  # the largest's profile at the level chosen, where made there already
    level, run_threads, variants_s = fastest_variant(largest, threads, runs, kept=kept)
    flops = {n.name: n.flops for n in graph.nodes}
    added = []
    for seg in segments:
        times = profile(seg, run_threads, level, runs, weights=flops,
                        **(kept if seg is largest else {}))
        for name, s in times.ops.items():
            ops[graph.index(name)] = s
        crossing = sum(_nbytes(s, d) for s, d in (*seg.inputs, *seg.outputs))
        if times.added_s > 0 and crossing:
            added.append(times.added_s / crossing)
    touched = between_bytes(graph)
    call_s = host_call(run_threads, touched)
    edge_s = call_s / 2
    for i in why:
        ops[i] = np.inf
    return OrtTimings(ops, edge_s, level, threads, variants_s, len(segments), why, call_s,
                      edge_byte_s=float(np.median(added)) if added else 0.0,
                      between_bytes=touched, run_threads=run_threads)


def _nbytes(shape, dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def host_call(threads: int, between: int) -> float:
    """:func:`measure_call` of this host at ``threads``, ``between`` bytes written between
    calls, kept for the host (:func:`~autoplace.profile.calibration_cache.kept_figure`) per
    ONNX Runtime version and thread count, for working sets within 2x of each other: another
    model measures nothing."""
    import onnxruntime

    from autoplace.backend.ort_segments import THREADS_WAIT
    from autoplace.profile.calibration_cache import kept_figure

    def measure():
        seconds = measure_call(threads, between_bytes=between)
        return seconds, seconds != DEFAULT_CALL_S  # not the fallback

    return kept_figure(f"ort_call-{onnxruntime.__version__}-{THREADS_WAIT}-spans-t{threads}-"
                       f"b{int(between).bit_length()}.json", measure)


def _one_node(op_type: str, shape):
    """A segment of one ONNX node (``op_type``, on a float32 tensor of ``shape``, giving one of
    the same), its node named as an export names an op's (an export through PyTorch takes
    about a second)."""
    from onnx import TensorProto, helper

    from autoplace.backend.ort_segments import OrtSegment, scope

    op, sig = op_type.lower(), ((tuple(shape), "float32"),)
    node = helper.make_node(op_type, ["in0"], ["out0"], name=f"/{scope(op)}/{op_type}")
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("in0", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("out0", TensorProto.FLOAT, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # opset 17's
    return OrtSegment(model.SerializeToString(), sig, sig, (op,), {op: (node.name,)})


def measure_call(threads: int = 1, calls: int = 8, shape=(64, 8, 8),
                 between_bytes: int = 0, rounds: int = 3) -> float:
    """Seconds one call of an ORT segment from the Relax VM costs beyond its nodes: the median
    time from the VM of ``calls`` one-op segments (a relu, a sigmoid, ...) called in turn, each
    after a TVM kernel wrote ``between_bytes`` (what the model's other ops touch between two
    calls, which takes ORT's code and state out of the caches), over ``rounds`` runs
    (:func:`~autoplace.profile.cold_calls.cold_call_seconds`), less ORT's own time for their
    nodes. Where it cannot be measured, or measures no more than the nodes alone (noise):
    :data:`DEFAULT_CALL_S`, with a warning."""
    from tvm import relax

    from autoplace.backend.ort_profiling import profile
    from autoplace.backend.ort_segments import register, relax_call
    from autoplace.profile.cold_calls import cold_call_seconds

    ty = relax.TensorType(list(shape), "float32")
    try:
        segs = [_one_node(op, shape) for op in ("Relu", "Sigmoid", "Tanh", "Exp")]
        names = [register(seg, threads) for seg in segs]
        data = np.random.default_rng(0).standard_normal(shape).astype("float32")
        one = cold_call_seconds(lambda bb, i, x: relax_call(names[i % len(names)], [x], [ty]),
                                ty, data, between_bytes, samples=calls, rounds=rounds)
        node_s = float(np.mean([sum(profile(seg, threads, "all", runs=10).ops.values())
                                for seg in segs]))
        if one <= node_s:  # the call measured no slower than its nodes: noise, not a figure
            raise RuntimeError(f"a call took {one * 1e6:.2f} us, its nodes {node_s * 1e6:.2f}")
        return one - node_s
    except Exception as e:  # noqa: BLE001 - a default rather than no plan
        log.warning("could not measure an ONNX Runtime call from the VM (%s): charged %.1f us",
                    e, DEFAULT_CALL_S * 1e6)
        return DEFAULT_CALL_S
