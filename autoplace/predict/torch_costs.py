"""Costs of a torch device (:meth:`autoplace.Device.torch`): each PyTorch call timed here.

A node that calls PyTorch (``torch.*``, an op the Relax importer lacks) costs what its ATen call
takes on random inputs of its example shapes (timed as :func:`autoplace.profile.measure` times
a kernel, with a short :class:`~autoplace.profile.measure.TimingPolicy`), plus the hand-off of a
call from the Relax VM into PyTorch (:func:`measure_handoff`: a chain of such calls against the
same ops called from Python), plus what a call costs in the model's sequence beyond its time
alone (:meth:`TorchCostModel.in_sequence`). TVM devices cannot run these nodes (``inf``), a torch
device runs nothing else (``inf``). Timings are kept on the model object: keep it to reuse them
(``optimize(cost_model=...)`` keeps the TVM side's model; this one is rebuilt per call).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend.torch_bridge import TorchOp
from autoplace.profile.measure import TimingPolicy
from autoplace.profile.torch_runner import (call_timing, time_fused_chain, time_in_sequence,
                                            time_torch_call, torch_op_for)

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile import DeviceProfile

log = logging.getLogger(__name__)

#: A short policy: a torch op is timed while optimize waits.
TORCH_POLICY = TimingPolicy(min_repeat_ms=2.0, min_repeats=5, max_repeats=15, round_size=5,
                            cv_target=0.05, budget_s=0.3)
#: Where timing the hand-off fails: 4.7-7.4 us per call were measured (docs/tvm_notes.md).
DEFAULT_HANDOFF_S = 6e-6


class TorchCostModel:
    """Seconds per node on one torch device: timed PyTorch calls plus the VM's hand-off.

    Parameters
    ----------
    policy : TimingPolicy
        How long to time each distinct call.
    handoff_s : float, optional
        The hand-off of one VM -> PyTorch call; measured on first use when not given.
    place : str
        The PyTorch device its calls run on (``"cpu"``, ``"cuda:0"``:
        :attr:`~autoplace.devices.Device.torch_place`); :meth:`predict` costs torch devices
        of that place only.

    :meth:`from_profile` makes one that charges what a profile of the torch device measured
    (``autoplace profile --device torch:cpu``) and times only the calls it lacks.
    """

    source = "torch-timed"
    #: Relative spread of a PyTorch call's cost in a build, for the guard against losing plans
    #: (a close call is then settled by running it). A call is timed alone on copies of its
    #: inputs; inside a mixed build the calls of models of many small ops ran up to 1.7x that,
    #: and others 1.05-1.2x (docs/results.md): their timing's own noise is far less.
    spread = 0.3

    def __init__(self, policy: TimingPolicy = TORCH_POLICY, handoff_s: float | None = None,
                 place: str = "cpu"):
        self.policy = policy
        self.handoff_s = handoff_s
        self.place = place
        self.timed_: dict[str, float] = {}  # workload key -> seconds of the ATen call
        self.stored_: frozenset[str] = frozenset()  # the keys of timed_ a profile measured
        self.profile_: DeviceProfile | None = None
        self.handoff_stored_ = False  # handoff_s is the profile's
        self.sequence_: dict[tuple, float] = {}  # a model's calls -> seconds more a call
        self.last_sequence_: float | None = None  # what the last predict charged so

    @classmethod
    def from_profile(cls, profile: DeviceProfile, callers: Sequence[str] = (),
                     policy: TimingPolicy = TORCH_POLICY, place: str = "cpu") -> TorchCostModel:
        """A model charging what torch device ``profile`` measured: its workloads' times (the
        fastest repeat, as every profile's) and its hand-off from the VM of the first of
        ``callers`` (TVM device fingerprints) it was measured with, else from any; what the
        profile lacks is timed here as by a new model (the hand-off too, where it has none)."""
        handoffs = {f.peer: f.seconds for f in profile.overheads if f.kind == "handoff"}
        handoff = next((handoffs[fp] for fp in callers if fp in handoffs),
                       next(iter(handoffs.values()), None))
        model = cls(policy, handoff, place)
        model.timed_.update(profile.latency_s)
        model.stored_ = frozenset(profile.latency_s)
        model.profile_, model.handoff_stored_ = profile, handoff is not None
        return model

    def describe(self, graph: OpGraph) -> str:
        """Where ``graph``'s PyTorch costs came from, in words (after :meth:`predict`)."""
        keys = set(graph.workloads())
        stored, here = len(keys & self.stored_), len(keys & (set(self.timed_) - self.stored_))
        prof = self.profile_
        handoff = ("from the profile" if self.handoff_stored_ else
                   "measured here" if self.handoff_s is not None else "not measured")
        extra = self.last_sequence_
        extra = ("" if extra is None else
                 f" + {extra * 1e6:.1f} us in the model's sequence (its calls timed one after "
                 "another, against alone)")
        return (f"{stored} PyTorch call(s) measured by profile {prof.name} ({prof.fingerprint}), "
                if prof is not None else "") + (
            f"{here} timed here, each + {(self.handoff_s or 0.0) * 1e6:.1f} us hand-off from "
            f"the VM ({handoff}){extra}")

    def handoff(self) -> float:
        if self.handoff_s is None:
            self.handoff_s = measure_handoff(place=self.place)
        return self.handoff_s

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        out = np.full(len(graph.nodes), np.inf)
        if device.runtime != "torch":
            return out
        if device.torch_place != self.place:
            raise ValueError(f"this model times PyTorch on {self.place}, not {device.name!r} "
                             f"({device.torch_place}): one TorchCostModel per torch device")
        if any(device.can_run(graph.nodes[i[0]].op_type) and k not in self.timed_
               for k, i in graph.workloads().items()) \
                or _calls(self._sequenced(graph, device)) not in self.sequence_:
            from autoplace.backend import settle

            settle(max_s=1.0)  # TVM's idle workers spin for a while and slow PyTorch down
        runs = {}
        for key, idx in graph.workloads().items():
            node = graph.nodes[idx[0]]
            if not device.can_run(node.op_type):
                continue
            if key not in self.timed_:
                op = torch_op_for(node)
                self.timed_[key] = (np.inf if op is None
                                    else time_torch_node(node, op, self.policy, self.place))
            runs[key] = idx
        extra = self.last_sequence_ = self.in_sequence(graph, device)
        for key, idx in runs.items():
            out[idx] = self.timed_[key] + self.handoff() + extra
        return out

    def fused_cost(self, graph: OpGraph, device: Device, chain: Sequence[int]) -> float:
        """Seconds of ``chain`` (node indices of ``graph``: a conv or linear, its bias add and
        its activation, :func:`~autoplace.graph.chains.fused_chains`) run as one call on
        ``device`` (:func:`~autoplace.profile.torch_runner.time_fused_chain`, timed once per
        chain of workloads), plus one call's hand-off and its excess in the model's sequence as
        :meth:`predict` charges them (:meth:`in_sequence`, kept per model); ``inf`` where it
        cannot be timed."""
        nodes = [graph.nodes[i] for i in chain]
        key = "chain:" + "|".join(n.workload_key for n in nodes)
        if key not in self.timed_:
            try:
                self.timed_[key] = time_fused_chain(nodes, self.policy,
                                                    place=self.place).median_s
            except Exception as e:  # noqa: BLE001 - its ops are then charged as their calls
                log.warning("could not time the chain %s on %s as one PyTorch call (%r): its "
                            "ops are charged as calls of their own",
                            "+".join(f"{n.op_type}{list(n.inputs[0].shape)}" for n in nodes),
                            device.name, e)
                self.timed_[key] = np.inf
        return self.timed_[key] + self.handoff() + self.in_sequence(graph, device)

    def _sequenced(self, graph: OpGraph, device: Device) -> list:
        """``graph``'s nodes that torch device ``device`` runs (a call timed), in the model's
        order: the sequence :meth:`in_sequence` times."""
        return [n for n in graph.nodes if device.can_run(n.op_type)
                and np.isfinite(self.timed_.get(n.workload_key, np.inf))]

    def in_sequence(self, graph: OpGraph, device: Device) -> float:
        """Seconds a PyTorch call of ``graph`` costs beyond its time alone, where the model's
        calls on ``device`` run one after another
        (:func:`~autoplace.profile.torch_runner.time_in_sequence`): their time in sequence
        less their times alone, over their number; at least 0, and 0 where it cannot be
        measured. Measured once per model (kept on this object), after :meth:`predict` has
        waited for TVM's pool to settle.

        A call timed alone runs the same code on the same shapes again and again; in a model
        the next call is another op's, and each pays for code and data the last one evicted
        (docs/results.md says how much on models of many small ops)."""
        nodes = self._sequenced(graph, device)
        calls = _calls(nodes)
        if calls in self.sequence_:
            return self.sequence_[calls]
        extra = 0.0
        if nodes:
            try:
                found = time_in_sequence(nodes, place=self.place)
            except Exception as e:  # noqa: BLE001 - a plan charged without it rather than none
                log.warning("could not time the model's PyTorch calls in sequence (%r)", e)
                found = None
            if found is not None:
                seconds, ran = found
                alone = sum(self.timed_[graph.nodes[i].workload_key] for i in ran)
                extra = max(0.0, (seconds - alone) / len(ran))
        self.sequence_[calls] = extra
        return extra

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        """``"measured"`` where a profile timed the node's call, ``"torch-timed"`` where it was
        timed here, ``"unsupported"`` where the device runs no such op."""
        return [("measured" if n.workload_key in self.stored_ else self.source)
                if device.runtime == "torch" and device.can_run(n.op_type)
                else "unsupported" for n in graph.nodes]


def _calls(nodes) -> tuple:
    """The key of a sequence of nodes' calls: their workloads, in order."""
    return tuple(n.workload_key for n in nodes)


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
    its shapes on device ``place``, on one PyTorch thread as the VM runs it (a few microseconds
    where it fails on them: logged)."""
    try:
        return time_torch_call(node, op, policy, place=place).median_s
    except Exception as e:  # noqa: BLE001 - random inputs may be invalid for the op
        log.warning("could not time %s on random inputs (%r): charged %.1f us", op.name, e,
                    DEFAULT_HANDOFF_S * 1e6)
        return DEFAULT_HANDOFF_S


def measure_handoff(calls: int = 32, shape: Sequence[int] = (64, 8, 8), *,
                    strict: bool = False, place: str = "cpu") -> float:
    """Seconds one VM -> PyTorch call costs beyond the op itself: a built chain of ``calls``
    calls into ``torch.relu`` against the same ops called from Python, per
    call (at least 0), on tensors of PyTorch device ``place`` (``"cpu"``, ``"cuda:N"``: the
    VM's tensors on that GPU). Where it cannot be measured: :data:`DEFAULT_HANDOFF_S` with a
    warning, or, ``strict`` (a figure to be stored as measured), the error raised."""
    import torch
    import tvm
    from tvm import relax

    from autoplace.backend.torch_bridge import Slot, one_thread, register, relax_call

    try:
        op = TorchOp(torch.ops.aten.relu.default, "aten.relu.default", (Slot(0),), (),
                     ((tuple(shape), "float32"),), False, "handoff_probe")
        name = register(op)
        gpu = place != "cpu"
        dev = tvm.cuda(int(place.split(":")[1])) if gpu else tvm.cpu()
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(list(shape), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                v = x
                for _ in range(calls):
                    v = bb.emit(relax_call(name, [v], relax.TensorType(list(shape), "float32")))
                out = bb.emit_output(v)
            bb.emit_func_output(out)
        target = tvm.target.Target("cuda", host="llvm") if gpu else "llvm"
        vm = relax.VirtualMachine(tvm.compile(bb.get(), target=target),
                                  [dev, tvm.cpu()] if gpu else dev)
        data = tvm.runtime.tensor(np.random.default_rng(0).standard_normal(shape)
                                  .astype("float32"), dev)
        t = torch.from_numpy(data.numpy()).to(place)
        policy = TimingPolicy(min_repeat_ms=5.0, min_repeats=5, max_repeats=10, budget_s=0.5)

        def eager():
            v = t
            for _ in range(calls):
                v = torch.relu(v)

        with one_thread(), torch.no_grad():  # the VM's calls run on one PyTorch thread too
            vm_s = call_timing(lambda: vm["main"](data), policy, place).median_s
            eager_s = call_timing(eager, policy, place).median_s
        return max(0.0, (vm_s - eager_s) / calls)
    except Exception as e:  # noqa: BLE001 - a default rather than no plan
        if strict:
            raise
        log.warning("could not measure the PyTorch hand-off (%s): charged %.1f us", e,
                    DEFAULT_HANDOFF_S * 1e6)
        return DEFAULT_HANDOFF_S


class WithTorch:
    """A TVM cost model (``base``) with torch devices beside it: TVM devices get ``base``'s
    costs, ``inf`` for PyTorch calls; each torch device gets its own model's (``models``, by
    device name). Everything else (profiles, overheads) is ``base``'s, for the TVM devices;
    links too, a torch device's being those of the TVM device whose memory it shares
    (:meth:`links`)."""

    def __init__(self, base, models: Mapping[str, TorchCostModel]):
        self.base = base
        self.models = dict(models)

    @property
    def torch(self) -> TorchCostModel:
        """The first torch device's model."""
        return next(iter(self.models.values()))

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        if device.runtime == "torch":
            return self.models[device.name].predict(graph, device)
        cost = np.asarray(self.base.predict(graph, device), dtype=float).copy()
        cost[[n.index for n in graph.nodes if n.is_torch]] = np.inf
        return cost

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        if device.runtime == "torch":
            return self.models[device.name].sources(graph, device)
        from autoplace.predict.protocol import sources

        return sources(self.base, graph, device)

    def links(self, devices: Sequence[Device]) -> dict:
        """``base``'s links between the TVM devices, and a torch device's: the copies the VM
        makes from and to the TVM device that holds its tensors (the first of ``devices`` of
        its memory, :attr:`~autoplace.devices.Device.memory`), under the torch device's name.
        Between a torch device and that device there is none (a hand-off, charged in each call's
        cost)."""
        links = getattr(self.base, "links", None)
        tvm = [d for d in devices if d.runtime == "tvm"]
        found = dict(links(tvm)) if callable(links) else {}
        for t in devices:
            mate = next((d for d in tvm if d.memory == t.memory), None)
            if t.runtime != "torch" or mate is None:
                continue
            for (a, b), link in list(found.items()):
                if mate.name in (a, b) and t.name not in (a, b):
                    src, dst = (t.name, b) if a == mate.name else (a, t.name)
                    found[(src, dst)] = replace(link, src=src, dst=dst)
        return found

    def overheads(self, devices: Sequence[Device]) -> dict:
        over = getattr(self.base, "overheads", None)
        return over([d for d in devices if d.runtime == "tvm"]) if callable(over) else {}

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "models"):
            raise AttributeError(name)
        return getattr(self.base, name)
