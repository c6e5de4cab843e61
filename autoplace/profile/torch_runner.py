"""Timing PyTorch's calls: the torch device (:meth:`autoplace.Device.torch`) as the profiler reaches it.

A node placed on a torch device runs as one PyTorch call from the Relax VM
(:mod:`autoplace.backend.torch_bridge`): the ATen op the model exported where the importer lacked
it, or the PyTorch equivalent of a Relax op. :class:`TorchRunner` times that call in eager
PyTorch, on random inputs of the workload's shapes on the device's CPU or GPU, and on the PyTorch
threads a build's calls run at (:func:`autoplace.backend.call_threads`: the plan's, or PyTorch's
own count), so that a campaign (:func:`autoplace.profile.run_campaign`) stores PyTorch's time of
each workload beside the TVM devices' rows. A workload PyTorch has no call for is
:class:`OpFailed` (stored as unsupported there), as a workload that does not build is on a TVM
device.
"""

from __future__ import annotations

import platform
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend.timing import walls_in_rounds
from autoplace.devices import Device
from autoplace.profile.measure import (OpFailed, Timing, TimingPolicy, _cpu_model,
                                       check_runs_probe, op_failed, time_adaptively)

if TYPE_CHECKING:
    import tvm

    from autoplace.backend.torch_bridge import TorchOp
    from autoplace.graph import OpNode


def torch_op_for(node: OpNode) -> TorchOp | None:
    """The PyTorch call that runs ``node``: a PyTorch call's own (registered at import), a
    Relax op's equivalent (:func:`autoplace.backend.torch_equivalents.equivalent`), or None."""
    from autoplace.backend.torch_bridge import registered
    from autoplace.backend.torch_equivalents import node_equivalent

    if not node.is_torch:
        return node_equivalent(node)
    sig = dict(node.attrs)["call"]
    for op in registered():
        if op.signature == sig and f"torch.{op.aten}" == node.op:
            return op
    return None


def random_torch_inputs(node: OpNode, rng: np.random.Generator, place: str = "cpu") -> list:
    """Tensors of ``node``'s input shapes on PyTorch device ``place``: floats uniform in
    [0, 1), integers zero (valid indices), bools random."""
    import torch

    out = []
    for t in node.inputs:
        dtype = getattr(torch, t.dtype)
        if dtype.is_floating_point:
            out.append(torch.from_numpy(rng.random(t.shape).astype(t.dtype)))
        elif dtype == torch.bool:
            out.append(torch.from_numpy(np.asarray(rng.random(t.shape) < 0.5)))  # 0-d too
        else:
            out.append(torch.zeros(t.shape, dtype=dtype))
    return [t.to(place) for t in out] if place != "cpu" else out


def synchronizer(place: str):
    """What waits for the work PyTorch queued on device ``place`` (``torch.cuda.synchronize``
    of its GPU), or None on the CPU, where an op is done when its call returns."""
    if place == "cpu":
        return None
    import torch

    return lambda: torch.cuda.synchronize(place)


def call_timing(fn, policy: TimingPolicy, place: str = "cpu") -> Timing:
    """One ``fn()`` timed as a workload is (:func:`~autoplace.profile.measure.time_adaptively`),
    after a few warm-up calls: a first call sets up PyTorch's kernels and threads. On a GPU
    (``place`` ``"cuda:N"``) each repeat waits for the work its calls queued
    (:func:`synchronizer`), as a kernel's timing on a TVM GPU device does."""
    sync = synchronizer(place) or (lambda: None)
    for _ in range(3):
        fn()
    sync()

    def timer(number, repeat):
        out = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            out.append((time.perf_counter() - t0) / number)
        return out

    return time_adaptively(timer, policy)


def cache_bytes(place: str = "cpu") -> int:
    """Bytes of the last-level cache of PyTorch device ``place``: a GPU's L2, or the share of
    this host's that a process gets (:func:`~autoplace.profile.host_cache.cpu_cache_bytes`:
    Linux's figure, checked by reading)."""
    if place != "cpu":
        import torch

        return int(getattr(torch.cuda.get_device_properties(place), "L2_cache_size", 0)) \
            or 64 << 20
    from autoplace.profile.host_cache import cpu_cache_bytes

    return cpu_cache_bytes()


def between_bytes(graph) -> int:
    """The bytes a runtime's call may have been pushed out of the caches by, in op graph
    ``graph``: what its ops read as weights and write in one inference, at most twice this
    host's last-level cache (:func:`cache_bytes`)."""
    touched = sum(n.param_bytes + n.bytes_written for n in graph.nodes)
    return int(min(touched, 2 * cache_bytes()))


def preceding_bytes(graph) -> np.ndarray:
    """Per node of op graph ``graph``, the bytes a runtime's call of it may find its code and
    state pushed out of the caches by: what the op before it in the model's order reads as
    weights and writes (the op a plan most often runs elsewhere right before the call), at
    most this host's last-level cache (:func:`cache_bytes`: past it, all is out); 0 for the
    first."""
    touched = [0] + [n.param_bytes + n.bytes_written for n in graph.nodes[:-1]]
    return np.minimum(touched[:len(graph.nodes)], cache_bytes()).astype(np.int64)


def _copies(nbytes: int, place: str) -> int:
    """How many copies of a call's ``nbytes`` of inputs fill twice the last-level cache of
    ``place`` (:func:`cache_bytes`), at most 64: each timed call then reads a copy the cache
    no longer holds."""
    return min(64, -(-2 * cache_bytes(place) // nbytes)) if nbytes else 1


def time_torch_call(node: OpNode, op: TorchOp, policy: TimingPolicy,
                    rng: np.random.Generator | None = None, place: str = "cpu") -> Timing:
    """``node``'s PyTorch call ``op`` on device ``place`` timed as :func:`time_plain_and_packed`
    times it, the faster
    of plain and packed where both were timed: a build runs the faster where the weight is a
    constant, as in a model for inference
    (:func:`~autoplace.backend.torch_calls.with_constant_weight`; a weight computed at run time
    runs plain, and may cost more than charged)."""
    plain, packed = time_plain_and_packed(node, op, policy, rng, place)
    return packed if packed is not None and packed.median_s < plain.median_s else plain


def time_plain_and_packed(node: OpNode, op: TorchOp, policy: TimingPolicy,
                          rng: np.random.Generator | None = None, place: str = "cpu"
                          ) -> tuple[Timing, Timing | None]:
    """``node``'s PyTorch call ``op`` timed in eager PyTorch on random inputs of its shapes
    (:func:`random_torch_inputs`) on device ``place``, on the PyTorch threads and without
    autograd the VM calls it with (:func:`~autoplace.backend.torch_bridge.at_call_threads`);
    and, for a conv or 2-D matmul on the CPU, the same with its weight packed once (each copy's
    own, :func:`~autoplace.backend.torch_calls.packed_call`), else None. Whatever the op raises
    on those inputs is raised.

    Each call reads another copy of the inputs, as many copies as fill twice the last-level
    cache (:func:`cache_bytes`; at most 64): in a model an op's weights were last read a whole
    inference ago, and one set read again and again stays in the cache, which makes an op with
    large weights look several times faster than it runs there. (An op in a built model also
    meets a colder cache than this; docs/results.md says by how much.)"""
    import itertools

    import torch

    from autoplace.backend.torch_bridge import at_call_threads
    from autoplace.backend.torch_calls import packed_call

    tensors = random_torch_inputs(node, rng or np.random.default_rng(0), place)
    copies = _copies(sum(t.numel() * t.element_size() for t in tensors), place)
    sets = [tensors] + [[t.clone() for t in tensors] for _ in range(copies - 1)]
    with at_call_threads(), torch.no_grad():
        plain = call_timing(lambda c=itertools.cycle(sets): op.call(next(c)), policy, place)
        first = packed_call(op, node.op_type, tensors[1], tensors[0].shape) \
            if len(tensors) == 2 else None
        if first is None:
            return plain, None
        turns = itertools.cycle([(first, tensors[0])] + [
            (packed_call(op, node.op_type, w, x.shape, trial=False), x) for x, w in sets[1:]])

        def packed_turn():
            call, x = next(turns)
            return call(x)

        return plain, call_timing(packed_turn, policy)


def time_fused_chain(nodes, policy: TimingPolicy, rng: np.random.Generator | None = None,
                     place: str = "cpu") -> Timing:
    """The call that runs chain ``nodes`` (op-graph nodes: a conv2d or 2-D matmul, its bias add
    or batch norm and its activation, if any: :func:`~autoplace.graph.chains.fused_chains`)
    as a build runs it (:func:`~autoplace.backend.torch_calls.with_fused_tail`: weight and bias
    held, the faster of oneDNN's fused call and the plain one, chosen on the first copy), timed
    on random data, weight and bias on device ``place``, on the threads a build's calls run at;
    each call reads another copy of them (:func:`_copies`), as :func:`time_plain_and_packed`
    does. Whatever the call raises is raised."""
    import itertools

    import torch

    from autoplace.backend.torch_bridge import at_call_threads
    from autoplace.backend.torch_calls import Fastest, fold_batch_norm, with_fused_tail
    from autoplace.graph.chains import chain_activation

    rng = rng or np.random.default_rng(0)
    anchor, tail = nodes[0], nodes[1]
    out = tuple(anchor.outputs[0].shape)
    norm = tail.op_type == "nn.batch_norm"
    # a bias add's bias: the input of another shape (or, of a 1x1 output, either)
    bias = tail.inputs[1] if norm or tuple(tail.inputs[0].shape) == out else tail.inputs[0]
    act = chain_activation(n.op_type for n in nodes[2:])
    last = [(out, anchor.outputs[0].dtype)]
    op = torch_op_for(anchor)
    calls, chosen = [], None
    x0, w0 = random_torch_inputs(anchor, rng)
    b0 = rng.random(bias.shape).astype(bias.dtype)
    w0 = w0.numpy()
    if norm:  # gamma, beta, mean, variance: folded as a build folds them
        w0, b0 = fold_batch_norm(w0, None, b0, b0, b0, b0 + 0.5, 1e-5)
    with at_call_threads(), torch.no_grad():
        for _ in range(_copies(sum(t.nbytes for t in (*anchor.inputs, bias)), place)):
            x, w, b = x0.clone(), w0.copy(), b0.copy()  # a copy of its own, in memory
            call = with_fused_tail(op, anchor.op_type, w, b, act, x.shape, last, place,
                                   trial=not calls)  # the first copy tried the shape
            x = x.to(place)
            fastest = call.target if isinstance(call.target, Fastest) else None
            if fastest is not None and chosen is not None:  # the first copy's choice
                fastest.chosen = chosen
            elif not calls:  # its first calls choose between oneDNN's call and the plain one
                for _ in range(8):
                    call.call([x])
                chosen = fastest.chosen if fastest is not None else None
            calls.append((call, [x]))
        turns = itertools.cycle(calls)

        def turn():
            call, xs = next(turns)
            return call.call(xs)

        return call_timing(turn, policy, place)


#: Most bytes of inputs :func:`time_in_sequence` makes for one model's calls.
SEQUENCE_MAX_BYTES = 1 << 30

#: How many rounds :func:`time_in_sequence` times (at least, at most), and for how long (none
#: begun after that).
SEQUENCE_ROUNDS = (3, 41)
SEQUENCE_BUDGET_S = 1.0


def time_in_sequence(nodes, rng: np.random.Generator | None = None, place: str = "cpu"
                     ) -> tuple[float, float, list[int]] | None:
    """``nodes``' PyTorch calls (op-graph nodes, in the model's order) run one after another on
    device ``place``, each on random inputs of its own shapes, as a build runs them where all
    are placed on PyTorch, holding their constants
    (:func:`~autoplace.backend.torch_calls.holding_constants`: a conv's weight packed or plain,
    whichever is faster): the median seconds of the sequence; the median over rounds of what a
    call costs in it beyond the same op called right after itself on a copy of its inputs and
    constants of its own (its code just run, its data as far out of the caches as in the
    sequence: a call as :func:`time_torch_call` times it alone), per call; and the indices of
    the nodes it ran (one that has no call or raises on its inputs is left out). Each round runs
    the sequence, then every op twice in a row, once on each copy, so that both meet the
    machine in the same moment: the excess is a difference of two close times, which timings
    made at another moment would swamp. None where no call runs, or the inputs would take more
    than :data:`SEQUENCE_MAX_BYTES`.

    Each call timed alone runs the same code again and again; in a model the next call is
    another op's, its code no longer in the caches."""
    import torch

    from autoplace.backend.torch_bridge import at_call_threads

    rng = rng or np.random.default_rng(0)
    calls, again, ran, nbytes = [], [], [], 0
    with at_call_threads(), torch.no_grad():
        for node in nodes:
            op = torch_op_for(node)
            if op is None:
                continue
            pair = []
            for _ in range(2):  # two copies of the inputs and held constants
                tensors = random_torch_inputs(node, rng, place)
                nbytes += sum(t.numel() * t.element_size() for t in tensors)
                if nbytes > SEQUENCE_MAX_BYTES:
                    return None
                pair.append(_held_call(op, node, tensors, place))
            if None in pair:
                continue
            calls.append(pair[0])
            again.append(pair[1])
            ran.append(node.index)
        if not calls:
            return None
        sync = synchronizer(place) or (lambda: None)

        def sequence():
            for op, tensors in calls:
                op.call(tensors)
            sync()

        def twice():
            for (op, tensors), (op2, tensors2) in zip(calls, again):
                op.call(tensors)
                op2.call(tensors2)
            sync()

        sequence(), twice()  # the first runs set up kernels and threads
        least, most = SEQUENCE_ROUNDS
        walls = walls_in_rounds([sequence, twice], least=least, most=most,
                                budget_s=SEQUENCE_BUDGET_S)
    seq, two = walls[:, 0], walls[:, 1]  # twice's second calls took two - seq
    return float(np.median(seq)), float(np.median((2 * seq - two) / len(calls))), ran


def _held_call(op, node, tensors, place: str):
    """``op`` (``node``'s call) holding its constants among ``tensors``
    (:func:`~autoplace.backend.torch_calls.holding_constants`), after the calls that choose
    packed or plain, and the tensors it then takes; None where it raises on them."""
    from autoplace.backend.torch_calls import holding_constants

    try:
        op, takes = holding_constants(op, node.op_type, len(tensors),
                                      lambda i: tensors[i].cpu().numpy(),
                                      tensors[0].shape if tensors else (), place)
        held, tensors = takes < len(tensors), tensors[:takes]
        for _ in range(8 if held else 1):  # a held weight's first calls choose
            op.call(tensors)               # packed or plain
    except Exception:  # noqa: BLE001 - random inputs may be invalid for the op
        return None
    return op, tensors


class TorchRunner:
    """A torch device of this process (``torch:cpu``, ``torch:cuda:N``): each workload's
    PyTorch call, timed.

    The same interface as :class:`~autoplace.profile.measure.LocalRunner` (``name``, ``spec``,
    ``info()``, ``check()``, ``measure(mod)``), so that campaigns, drift checks and passes treat it
    as any device. Its fingerprint's ``info`` has ``kind`` ``"torch"``, its place (``cpu`` or
    ``cuda``), the PyTorch version, the calls it makes
    (:data:`~autoplace.backend.torch_bridge.CALLS`), the CPU model or the GPU's name and the
    PyTorch threads its calls are timed at (:func:`autoplace.backend.call_threads`, else
    PyTorch's count); no TVM target or version (its timings involve neither).
    """

    def __init__(self, device: Device, spec: str | None = None):
        if device.runtime != "torch":
            raise ValueError(f"TorchRunner times a torch device (Device.torch()), not {device.name!r}")
        self.device = device
        self.spec = spec or device.spec

    @property
    def name(self) -> str:
        """The device's name (``torch``)."""
        return self.device.name

    def close(self) -> None:
        """Nothing to release (the same call as a remote runner's)."""

    def tvm_target(self):
        """Raises ``ValueError``: PyTorch's kernels have no TVM target (nothing to build or tune)."""
        return self.device.tvm_target()

    def info(self) -> dict[str, Any]:
        import torch

        from autoplace.backend.threads import call_threads
        from autoplace.backend.torch_bridge import CALLS

        hardware = (_cpu_model() if self.device.target == "cpu"
                    else torch.cuda.get_device_name(self.device.torch_place))
        return {"kind": "torch", "place": self.device.target, "target": None, "calls": CALLS,
                "hardware": hardware, "torch": torch.__version__,
                "threads": call_threads() or torch.get_num_threads(),
                "host": platform.node(), "remote": None}

    def check(self) -> None:
        """Raise :class:`DeviceUnavailable` unless PyTorch is installed
        (:func:`~autoplace.profile.measure.check_present`) and adds two vectors."""
        check_runs_probe(self)

    def measure(self, mod: tvm.IRModule, policy: TimingPolicy = TimingPolicy(),
                rng: np.random.Generator | None = None) -> Timing:
        """Time the PyTorch call of the one op of ``mod`` (a one-op module,
        :func:`~autoplace.profile.workload.single_op_modules`).

        Raises
        ------
        OpFailed
            PyTorch has no call for the op here (no equivalent of that Relax op, or of its
            attributes; a PyTorch call this process has not registered), or it raised on
            random inputs of its shapes.
        """
        from autoplace.graph import OpGraph

        try:
            graph = OpGraph.from_relax(mod)
        except Exception as e:  # noqa: BLE001 - a module the op graph cannot read runs nowhere here
            raise op_failed("not a one-op module of the op graph", e) from None
        if len(graph.nodes) != 1:
            raise OpFailed(f"expected a one-op module, got {len(graph.nodes)} ops")
        node = graph.nodes[0]
        if not self.device.can_run(node.op_type):
            raise OpFailed(f"{self.spec} runs no {node.op_type}: no PyTorch equivalent "
                           "(autoplace.backend.torch_equivalents.EQUIVALENTS)")
        op = torch_op_for(node)
        if op is None:
            raise OpFailed(f"no PyTorch call of {node.op_type} with these attributes and shapes "
                           "(another layout, asymmetric padding, another output dtype; or a "
                           "PyTorch call not registered in this process)")
        from autoplace.backend import settle

        settle(max_s=1.0, window_s=0.01)  # a TVM device timed just before leaves its pool spinning
        try:
            return time_torch_call(node, op, policy, rng, self.device.torch_place)
        except Exception as e:  # noqa: BLE001 - random inputs may be invalid for the op
            raise op_failed(f"{op.name} raised on random inputs", e) from None
