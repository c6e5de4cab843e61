"""What a torch device's calls of one model take: read from its profile, the rest timed here.

:func:`time_torch_device` gathers, for one model and one torch device
(:meth:`autoplace.Device.torch`), every distinct call's seconds (a profile's where it measured
them, else timed here on random inputs of the call's shapes), each chain a build would run as
one call (:func:`autoplace.graph.chains.fused_chains`), the hand-off of a call from the Relax
VM into PyTorch (:func:`measure_handoff`) and what a call costs in the model's sequence beyond
its time alone. :class:`autoplace.predict.torch_costs.TorchCostModel` predicts from the result
and times nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autoplace.backend.timing import walls_in_rounds
from autoplace.profile.measure import TimingPolicy
from autoplace.profile.torch_runner import (call_timing, time_fused_chain, time_in_sequence,
                                            time_torch_call, torch_op_for)

if TYPE_CHECKING:
    from autoplace.backend.torch_bridge import TorchOp
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile.profiles import DeviceProfile

log = logging.getLogger(__name__)

#: A short policy: a torch op is timed while optimize waits.
TORCH_POLICY = TimingPolicy(min_repeat_ms=2.0, min_repeats=5, max_repeats=15, round_size=5,
                            cv_target=0.05, budget_s=0.3)
#: Where timing the hand-off fails: 4.7-7.4 us per call were measured (docs/tvm_notes.md).
DEFAULT_HANDOFF_S = 6e-6


@dataclass(frozen=True)
class TorchTimings:
    """Seconds of one model's calls on one torch device.

    ``calls``: by workload key, one call alone (``inf``: it cannot be timed); ``stored``: the
    keys whose seconds a profile measured (``profile``); ``chains``: by the workload keys of a
    chain's nodes, the chain run as one call; ``handoff_s``: one VM -> PyTorch call with its
    caches warm, and ``handoff_from`` where it came from (``"from the profile"``, ``"measured
    here"``, ``"given"``); ``handoffs``: per node of the model (by index), the hand-off its call
    is charged after what the op before it touched (empty: ``handoff_s`` for every node);
    ``in_sequence_s``: what each call costs beyond its time alone where the model's calls run
    one after another (0 where it could not be measured); ``kept``: the keys read from this
    host's cache (:func:`kept_dir`), timed here by an earlier model; ``unscreened``: how many
    chains were not timed as one call, their anchor alone costing more than another device
    takes for the whole chain."""

    place: str
    calls: Mapping[str, float]
    handoff_s: float
    handoff_from: str = "given"
    in_sequence_s: float = 0.0
    chains: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    stored: frozenset[str] = frozenset()
    profile: DeviceProfile | None = None
    kept: frozenset[str] = frozenset()
    unscreened: int = 0
    handoffs: tuple[float, ...] = ()

    def handoff(self, node: int) -> float:
        """Seconds of the hand-off charged to node ``node``'s call."""
        return self.handoffs[node] if self.handoffs else self.handoff_s

    def chain_s(self, graph: OpGraph, chain: Sequence[int]) -> float:
        """Seconds of ``chain`` (node indices of ``graph``) as one call; ``inf`` where it was
        not timed as one."""
        return self.chains.get(chain_key(graph, chain), np.inf)


def chain_key(graph: OpGraph, chain: Sequence[int]) -> tuple[str, ...]:
    """The key of a chain of nodes: their workloads, in order."""
    return tuple(graph.nodes[i].workload_key for i in chain)


#: A chain is timed as one call unless its anchor's call alone already costs this many times
#: what another device is charged for the whole chain (``others`` of :func:`time_torch_device`):
#: the chain's call runs the anchor's work and more, so it would lose there too.
CHAIN_SCREEN = 1.2


def time_torch_device(graph: OpGraph, device: Device, *, profile: DeviceProfile | None = None,
                      callers: Sequence[str] = (), chains: Sequence[Sequence[int]] = (),
                      handoff_s: float | None = None, others: Sequence[float] | None = None,
                      between: Sequence[int] | None = None,
                      policy: TimingPolicy = TORCH_POLICY) -> TorchTimings:
    """The :class:`TorchTimings` of ``graph``'s calls on torch ``device``: the calls and the
    hand-off ``profile`` measured (its hand-off from the VM of the first of ``callers``, TVM
    device fingerprints, it was measured with, else from any), those this host timed for an
    earlier model (:func:`kept_dir`), the rest timed here (and kept); each of ``chains`` (node
    indices) that the device runs whole, timed as one call, but where ``others`` (per node, the
    least another device is charged for it) says it would lose (:data:`CHAIN_SCREEN`); the
    excess of the calls in sequence. ``handoff_s`` given: that hand-off, nothing measured for
    it; else the profile's, or measured here; and with ``between`` (per node, the bytes another
    op touches before its call, :func:`~autoplace.profile.torch_runner.preceding_bytes`), each
    node's hand-off after that many bytes (:func:`host_handoff`, once per power of two) where
    it exceeds that.

    Timing waits once for TVM's idle workers to stop spinning (they slow PyTorch down).
    """
    from autoplace.backend import settle

    place = device.torch_place
    known = dict(profile.latency_s) if profile is not None else {}
    folder = kept_dir(place)
    runs = {key: idx for key, idx in graph.workloads().items()
            if device.can_run(graph.nodes[idx[0]].op_type)}
    whole = [tuple(c) for c in chains if all(device.can_run(graph.nodes[i].op_type) for i in c)]
    calls, kept = {}, set()
    for key in runs:
        if key in known:
            calls[key] = known[key]
        elif (found := _read_kept(folder, key)) is not None:
            calls[key] = found
            kept.add(key)
    if any(key not in calls for key in runs) or whole:
        settle(max_s=1.0)
    for key, idx in runs.items():
        if key not in calls:
            node = graph.nodes[idx[0]]
            op = torch_op_for(node)
            calls[key] = np.inf if op is None else time_torch_node(node, op, policy, place)
            if np.isfinite(calls[key]) and calls[key] != DEFAULT_HANDOFF_S:
                _keep(folder, key, calls[key])
    handoff_from, handoffs = "given", ()
    if handoff_s is None:
        handoff_s, handoff_from = _stored_handoff(profile, callers), "from the profile"
        if handoff_s is None:
            handoff_s, handoff_from = measure_handoff(place=place), "measured here"
        if between is not None:
            handoffs = _handoffs(graph, device, between, handoff_s)
    timed_chains, unscreened = {}, set()
    for chain in whole:
        key = chain_key(graph, chain)
        if key in timed_chains:
            continue
        name = "chain:" + "|".join(key)
        if (found := _read_kept(folder, name)) is not None:
            timed_chains[key] = found
            kept.add(name)
        elif others is not None and calls.get(key[0], 0.0) > CHAIN_SCREEN * sum(
                others[i] for i in chain):
            unscreened.add(key)
        else:
            timed_chains[key] = _chain_seconds(graph, chain, device, policy)
            if np.isfinite(timed_chains[key]):
                _keep(folder, name, timed_chains[key])
    return TorchTimings(place, calls, handoff_s, handoff_from,
                        _in_sequence(graph, device, calls, folder), timed_chains,
                        frozenset(known) & frozenset(runs), profile, frozenset(kept),
                        len(unscreened), handoffs)


#: Bytes touched before a call under which its hand-off is taken as the warm one.
WARM_BYTES = 1 << 16


def _handoffs(graph: OpGraph, device: Device, between: Sequence[int], warm_s: float
              ) -> tuple[float, ...]:
    """Per node of ``graph``, the hand-off of its call on ``device`` after ``between[i]`` bytes
    touched (rounded up to a power of two, each power measured once: :func:`host_handoff`),
    at least ``warm_s``; ``warm_s`` where the device runs no such op.

    A call after more bytes cannot cost less, and another process's work only adds to a
    measurement: a power's figure above a larger power's (of those the model needs) is taken
    as that one's."""
    sizes, measured = [], {}
    for node, nbytes in zip(graph.nodes, between):
        nbytes = int(nbytes)
        if nbytes < max(1, WARM_BYTES) or not device.can_run(node.op_type):
            sizes.append(None)
            continue
        sizes.append(1 << (nbytes - 1).bit_length())
        if sizes[-1] not in measured:
            measured[sizes[-1]] = host_handoff(device.torch_place, sizes[-1])
    least, floor = {}, np.inf  # per power, the least figure of it and every larger one
    for size in sorted(measured, reverse=True):
        least[size] = floor = min(floor, measured[size])
    return tuple(warm_s if size is None else max(warm_s, least[size]) for size in sizes)


def kept_dir(place: str = "cpu"):
    """Where this host keeps the PyTorch calls and chains it timed (seconds by workload key),
    so that another model with the same workloads times none of them: a folder of the
    calibration cache entry of this host's CPU
    (:func:`~autoplace.profile.calibration_cache.cache_entry`), per PyTorch version,
    :data:`~autoplace.backend.torch_bridge.CALLS` and the threads the calls run at
    (:func:`autoplace.backend.call_threads`, else PyTorch's count); None for a GPU's calls (not
    kept)."""
    if place != "cpu":
        return None
    import torch

    from autoplace.backend.threads import call_threads
    from autoplace.backend.torch_bridge import CALLS
    from autoplace.devices import Device
    from autoplace.profile.calibration_cache import cache_entry

    _, entry = cache_entry(Device.cpu(0))
    threads = call_threads() or torch.get_num_threads()
    return entry / f"torch_calls-{torch.__version__}-c{CALLS}-t{threads}"


def _kept_path(folder, key: str):
    import hashlib

    return folder / (hashlib.sha1(key.encode()).hexdigest() + ".json")


def _read_kept(folder, key: str, zero: bool = False) -> float | None:
    """The seconds kept for ``key`` in ``folder`` (``zero``: 0 is a figure too), or None
    (nothing kept, or a file that cannot be read or is not this key's: timed again)."""
    import json

    if folder is None:
        return None
    try:
        data = json.loads(_kept_path(folder, key).read_text())
        seconds = data["seconds"] if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(seconds, float) or not seconds < np.inf:
        return None
    return seconds if seconds > 0 or (zero and seconds == 0) else None


def _keep(folder, key: str, seconds: float) -> None:
    from autoplace.profile.calibration_cache import write_whole

    if folder is None:
        return
    try:
        write_whole(_kept_path(folder, key), {"key": key, "seconds": float(seconds)})
    except OSError as e:
        log.warning("could not keep a PyTorch call's timing in %s: %s", folder, e)


def _stored_handoff(profile: DeviceProfile | None, callers: Sequence[str]) -> float | None:
    if profile is None:
        return None
    handoffs = {f.peer: f.seconds for f in profile.overheads if f.kind == "handoff"}
    return next((handoffs[fp] for fp in callers if fp in handoffs),
                next(iter(handoffs.values()), None))


def _chain_seconds(graph: OpGraph, chain: Sequence[int], device: Device,
                   policy: TimingPolicy) -> float:
    nodes = [graph.nodes[i] for i in chain]
    try:
        return time_fused_chain(nodes, policy, place=device.torch_place).median_s
    except Exception as e:  # noqa: BLE001 - its ops are then charged as their calls
        log.warning("could not time the chain %s on %s as one PyTorch call (%r): its ops are "
                    "charged as calls of their own",
                    "+".join(f"{n.op_type}{list(n.inputs[0].shape)}" for n in nodes),
                    device.name, e)
        return np.inf


def _in_sequence(graph: OpGraph, device: Device, calls: Mapping[str, float],
                 folder=None) -> float:
    """Seconds a PyTorch call of ``graph`` (of those ``calls`` timed) costs beyond its time
    alone, where the model's calls on ``device`` run one after another: what
    :func:`~autoplace.profile.torch_runner.time_in_sequence` measures, at least 0, and 0 where
    it cannot be measured. Kept in ``folder`` (:func:`kept_dir`) for the same calls in the same
    order.

    A call timed alone runs the same code again and again; in a model the next call is another
    op's, and each pays for code the last one evicted (docs/results.md says how much on models
    of many small ops)."""
    nodes = [n for n in graph.nodes if device.can_run(n.op_type)
             and np.isfinite(calls.get(n.workload_key, np.inf))]
    if not nodes:
        return 0.0
    # named as a chain is; "paired": against the calls made again in the same rounds (a figure
    # of the sequence against times alone made at another moment is not read)
    name = "sequence-paired:" + "|".join(n.workload_key for n in nodes)
    if (kept := _read_kept(folder, name, zero=True)) is not None:
        return kept
    try:
        found = time_in_sequence(nodes, place=device.torch_place)
    except Exception as e:  # noqa: BLE001 - a plan charged without it rather than none
        log.warning("could not time the model's PyTorch calls in sequence (%r)", e)
        found = None
    if found is None:
        return 0.0
    extra = max(0.0, found[1])
    _keep(folder, name, extra)
    return extra


def torch_profile(device: Device, *, db=None, cost_model=None) -> DeviceProfile | None:
    """The profile of torch device ``device`` (measured with its fingerprint, from
    :class:`~autoplace.profile.torch_runner.TorchRunner`): one given to ``cost_model`` (a
    :class:`~autoplace.predict.MeasuredCostModel`'s), else the one in profile store ``db`` (a
    path), else a shipped one; None where there is none."""
    from pathlib import Path

    from autoplace.profile import DeviceProfile, ProfileStore, fingerprint
    from autoplace.profile.profiles import shipped_profile
    from autoplace.profile.torch_runner import TorchRunner

    try:
        fp = fingerprint(TorchRunner(device).info())
    except (ImportError, ValueError):  # no PyTorch, or a device no profile is made of
        return None
    given = getattr(cost_model, "given", None)
    for prof in given() if callable(given) else ():
        if prof.fingerprint == fp:
            return prof
    if isinstance(db, (str, Path)) and Path(db).is_file():
        with ProfileStore(db, readonly=True) as store:
            if any(d.fingerprint == fp for d in store.devices()):
                return DeviceProfile.from_store(store, fp)
    found = shipped_profile(fp)
    return found[0] if found is not None else None


def time_torch_node(node, op: TorchOp, policy: TimingPolicy = TORCH_POLICY,
                    place: str = "cpu") -> float:
    """Median seconds of ``node``'s PyTorch call ``op`` in eager PyTorch on random inputs of
    its shapes on device ``place``, on the PyTorch threads the VM runs it at (a few microseconds
    where it fails on them: logged)."""
    try:
        return time_torch_call(node, op, policy, place=place).median_s
    except Exception as e:  # noqa: BLE001 - random inputs may be invalid for the op
        log.warning("could not time %s on random inputs (%r): charged %.1f us", op.name, e,
                    DEFAULT_HANDOFF_S * 1e6)
        return DEFAULT_HANDOFF_S


def host_handoff(place: str, between: int) -> float:
    """:func:`measure_handoff` on PyTorch device ``place`` with ``between`` bytes written between
    calls; on the CPU kept for the host
    (:func:`~autoplace.profile.calibration_cache.kept_figure`) per PyTorch version, for working
    sets within 2x of each other."""
    import torch

    from autoplace.profile.calibration_cache import kept_figure

    def measure():
        try:
            return measure_handoff(strict=True, place=place, between_bytes=between), True
        except Exception as e:  # noqa: BLE001 - a default rather than no plan
            log.warning("could not measure the PyTorch hand-off in a model's context (%s): "
                        "charged %.1f us", e, DEFAULT_HANDOFF_S * 1e6)
            return DEFAULT_HANDOFF_S, False

    if place != "cpu":
        return measure()[0]
    return kept_figure(f"torch_handoff-{torch.__version__}-spans-b{int(between).bit_length()}"
                       ".json", measure)


def measure_handoff(calls: int = 32, shape: Sequence[int] = (64, 8, 8), *,
                    strict: bool = False, place: str = "cpu", between_bytes: int = 0) -> float:
    """Seconds one VM -> PyTorch call costs beyond the op itself: a built chain of ``calls``
    calls into ``torch.relu`` against the same ops called from Python, per
    call (at least 0), on tensors of PyTorch device ``place`` (``"cpu"``, ``"cuda:N"``: the
    VM's tensors on that GPU). With ``between_bytes`` (what a model's other ops touch between
    two of its calls, which takes PyTorch's code and state out of the caches), on the CPU: a
    call's time from the VM after a TVM kernel wrote that many bytes
    (:func:`~autoplace.profile.cold_calls.cold_call_seconds`), less the op called from Python;
    on a GPU, each call is followed in the chain by a kernel that writes them, against the same
    chain without the calls, per call, less the op called from Python. Where it cannot be
    measured:
    :data:`DEFAULT_HANDOFF_S` with a warning, or, ``strict`` (a figure to be stored as
    measured), the error raised."""
    import torch
    import tvm
    from tvm import relax

    from autoplace.backend.torch_bridge import (Slot, TorchOp, at_call_threads, register,
                                               relax_call)

    if between_bytes:
        calls = min(calls, 8)  # each writes the bytes: a few do
    try:
        op = TorchOp(torch.ops.aten.relu.default, "aten.relu.default", (Slot(0),), (),
                     ((tuple(shape), "float32"),), False, "handoff_probe")
        name = register(op)
        gpu = place != "cpu"
        dev = tvm.cuda(int(place.split(":")[1])) if gpu else tvm.cpu()
        ty = relax.TensorType(list(shape), "float32")
        big = relax.TensorType([max(1, between_bytes // 4)], "float32")

        def built(with_calls: bool):
            bb = relax.BlockBuilder()
            x, w = relax.Var("x", ty), relax.Var("w", big)
            with bb.function("main", [x, w] if between_bytes else [x]):
                with bb.dataflow():
                    v = x
                    for _ in range(calls):
                        if with_calls:
                            v = bb.emit(relax_call(name, [v], ty))
                        if between_bytes:
                            w = bb.emit(relax.op.add(w, relax.const(0.5, "float32")))
                    out = bb.emit_output(relax.Tuple([v, w]) if between_bytes else v)
                bb.emit_func_output(out)
            target = tvm.target.Target("cuda", host="llvm") if gpu else "llvm"
            vm = relax.VirtualMachine(tvm.compile(bb.get(), target=target),
                                      [dev, tvm.cpu()] if gpu else dev)
            return vm["main"]

        data = [tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape)
                                   .astype("float32"), dev)]
        if between_bytes and gpu:
            data.append(tvm.runtime.tensor(np.zeros(big.shape.values[0].value, "float32"), dev))
        t = torch.from_numpy(data[0].numpy()).to(place)
        policy = TimingPolicy(min_repeat_ms=5.0, min_repeats=5, max_repeats=10, budget_s=0.5)

        def eager():
            v = t
            for _ in range(calls):
                v = torch.relu(v)

        with at_call_threads(), torch.no_grad():  # as the VM calls PyTorch
            eager_s = call_timing(eager, policy, place).median_s
            if between_bytes and not gpu:
                from autoplace.profile.cold_calls import cold_call_seconds

                one = cold_call_seconds(lambda bb, i, v: relax_call(name, [v], ty), ty,
                                        data[0].numpy(), between_bytes)
                return max(0.0, one - eager_s / calls)
            with_calls = built(True)
            if not between_bytes:
                vm_s = call_timing(lambda: with_calls(*data), policy, place).median_s
            else:  # less the kernels between the calls, timed turn by turn with them
                without = built(False)
                for run in (with_calls, without):
                    run(*data)
                walls = walls_in_rounds([lambda: with_calls(*data), lambda: without(*data)],
                                        least=25, most=25, budget_s=0.0)
                vm_s = float(np.median(walls[:, 0] - walls[:, 1]))
        return max(0.0, (vm_s - eager_s) / calls)
    except Exception as e:  # noqa: BLE001 - a default rather than no plan
        if strict:
            raise
        log.warning("could not measure the PyTorch hand-off (%s): charged %.1f us", e,
                    DEFAULT_HANDOFF_S * 1e6)
        return DEFAULT_HANDOFF_S
