"""PyTorch calls that hold their constants: a conv's or linear's weight packed once for oneDNN,
its bias and activation in the same call, a batch norm's statistics held or folded.

Each builder takes a Relax op's plain call (its PyTorch equivalent,
:func:`autoplace.backend.torch_equivalents.equivalent`) and gives the call a build runs on a
torch device; where two variants compute the same (oneDNN's packed call and PyTorch's plain
one), :class:`Fastest` runs the faster.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from autoplace.backend.torch_bridge import Slot, TorchOp

# ------------------------------------------------------------------- weights packed once

#: Relax op types whose second tensor, a constant weight, the torch device packs once for
#: oneDNN (:func:`with_constant_weight`).
PACKABLE = frozenset({"nn.conv2d", "matmul"})


def packed_call(op: TorchOp, op_type: str, weight, x_shape, bias=None, act: str | None = None,
                trial: bool = True):
    """Of ``op`` (the plain call of a Relax ``nn.conv2d`` or 2-D ``matmul``), the call on its first
    input alone (of ``x_shape``) with ``weight`` (a float32 torch tensor) packed now into oneDNN's
    blocked layout: a plain call reorders a weight on every call, which takes longer than the op
    itself for a large weight and a small activation. None where it does not apply (another op,
    another dtype, a weight not on the CPU, a batch of matmul weights, PyTorch without oneDNN, a
    shape oneDNN refuses: the call is tried once on zeros). The packed call computes in
    channels-last and gives its result back contiguous, a copy the plain call does not make: which
    of the two is faster depends on the shapes. With ``bias`` (a 1-D float32 tensor) and ``act`` (a
    Relax op type of :data:`FUSED_ACTIVATIONS`, or None), the call also adds the bias and applies
    the activation, inside oneDNN's kernel (:func:`with_fused_tail`). ``trial=False`` where the
    same call with another weight of this shape was packed already: not tried again (a trial
    runs the whole op, which costs more than packing when a timing packs many copies)."""
    import torch

    if op_type not in PACKABLE or weight.dtype != torch.float32 \
            or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    if op_type == "matmul" and (weight.dim() < 2 or any(d != 1 for d in weight.shape[:-2])):
        return None  # a batch of weights (one of ones is a weight broadcast)
    try:  # oneDNN may refuse a shape: then the plain call is the only one
        call = _packed(op, op_type, weight, x_shape, bias, act)
        if not trial:
            return call
        with torch.no_grad():
            out = call(torch.zeros(tuple(x_shape), dtype=torch.float32))
    except Exception:  # noqa: BLE001 - whatever oneDNN raises, the plain call stands
        return None
    return call if tuple(out.shape) == tuple(op.outputs[0][0]) else None


def _packed(op: TorchOp, op_type: str, weight, x_shape, bias=None, act: str | None = None):
    """:func:`packed_call`'s call, unchecked."""
    import torch

    mkldnn = torch.ops.mkldnn
    attr, algorithm = pointwise(act)[0] if act else ("none", "")
    if op_type == "nn.conv2d":
        stride, pad, dilation, groups = op.args[3:7]
        packed = mkldnn._reorder_convolution_weight(weight, list(pad), list(stride),
                                                    list(dilation), groups, list(x_shape))
        return lambda x: mkldnn._convolution_pointwise(
            x, packed, bias, list(pad), list(stride), list(dilation), groups, attr, [],
            algorithm).contiguous()
    rows, out_shape = int(np.prod(x_shape[:-1])), op.outputs[0][0]
    packed = mkldnn._reorder_linear_weight(weight.reshape(weight.shape[-2:]).t().contiguous(),
                                           rows)
    return lambda x: mkldnn._linear_pointwise(x, packed, bias, attr, [], algorithm
                                              ).reshape(out_shape)


# ------------------------------------------------------- a conv's or linear's tail in its call

#: Activations a conv's or linear's call applies in the same call (:func:`with_fused_tail`).
FUSED_ACTIVATIONS = frozenset({"nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "sigmoid",
                               "tanh"})


def pointwise(act: str) -> tuple[tuple[str, str], Any]:
    """Of activation ``act`` (a Relax op type of :data:`FUSED_ACTIVATIONS`, or a name of
    :func:`autoplace.graph.chains.chain_activation`): oneDNN's attribute and algorithm for it,
    and PyTorch's function."""
    import torch
    import torch.nn.functional as F

    return {"nn.relu": (("relu", ""), torch.relu), "nn.gelu": (("gelu", "none"), F.gelu),
            "nn.gelu_tanh": (("gelu", "tanh"), functools.partial(F.gelu, approximate="tanh")),
            "nn.silu": (("swish", ""), F.silu), "sigmoid": (("sigmoid", ""), torch.sigmoid),
            "tanh": (("tanh", ""), torch.tanh), "hardswish": (("hardswish", ""), F.hardswish),
            "hardsigmoid": (("hardsigmoid", ""), F.hardsigmoid)}[act]


def with_fused_tail(op: TorchOp, op_type: str, weight: np.ndarray, bias: np.ndarray,
                    act: str | None, x_shape, outputs, place: str = "cpu",
                    trial: bool = True) -> TorchOp:
    """``op`` (the plain call of a conv2d or 2-D matmul) with the bias add and activation after it
    (``act``: a Relax op type of :data:`FUSED_ACTIVATIONS`, or None) as one call on its data alone
    (of ``x_shape``), giving ``outputs`` (the chain's last), weight and ``bias`` held on PyTorch
    device ``place``: oneDNN's conv or linear with the bias and activation in its kernel, its weight
    packed once (:func:`packed_call`), or PyTorch's plain ``conv2d``/``linear`` with the bias and
    then the activation, whichever is faster on the first calls (:class:`Fastest`). One call rather
    than three saves two hand-offs and the passes over memory of the add and the activation
    (:func:`autoplace.graph.chains.fused_chains` finds the chains). ``trial``: as
    :func:`packed_call` takes it."""
    import torch.nn.functional as F

    (w, b), digest = _held([weight, np.reshape(bias, -1)], place)
    activation = pointwise(act)[1] if act else None
    if op_type == "nn.conv2d":
        stride, pad, dilation, groups = op.args[3:7]
        base = functools.partial(F.conv2d, weight=w, bias=b, stride=stride, padding=pad,
                                 dilation=dilation, groups=groups)
    else:
        base = functools.partial(F.linear, weight=w.reshape(w.shape[-2:]).t().contiguous(),
                                 bias=b)

    def plain(x):
        y = base(x)
        return y if activation is None else activation(y)

    packed = packed_call(op, op_type, w, x_shape, b, act, trial=trial)
    variants = [plain] + ([packed] if packed is not None else [])
    tail = "+bias" + (f"+{act}" if act else "")
    return TorchOp(Fastest(variants), f"{op.name}{tail}[weight {digest}]{_at(place)}",
                   (Slot(0),), (), tuple((tuple(s), d) for s, d in outputs), False, op.node,
                   why=op.why + tail)


def with_constant_weight(op: TorchOp, op_type: str, weight: np.ndarray, x_shape,
                         place: str = "cpu") -> TorchOp:
    """``op`` (a Relax op's plain PyTorch call, its weight the second tensor) as a call on its
    first tensor alone (of ``x_shape``), ``weight`` held by the call on PyTorch device ``place``:
    packed once for oneDNN where that applies (:func:`packed_call`), the faster of packed and
    plain chosen by timing both on the first calls (:class:`Fastest`), as the cost model charges
    the faster of the two (:func:`autoplace.profile.torch_runner.time_torch_call`). The call's id
    names a digest of the weight and the place: the same op with other weights, or on another
    device, is another call."""
    (w,), digest = _held([weight], place)

    def fill(v):
        if isinstance(v, Slot):
            return w if v.index == 1 else v
        return type(v)(fill(x) for x in v) if isinstance(v, (list, tuple)) else v

    args, kwargs = fill(op.args), tuple((k, fill(v)) for k, v in op.kwargs)
    plain = TorchOp(op.target, op.name, args, kwargs, op.outputs, op.dynamic, op.node)
    packed = packed_call(op, op_type, w, x_shape)
    variants = [lambda x: plain.call([x])] + ([packed] if packed is not None else [])
    return TorchOp(Fastest(variants), f"{op.name}[weight {digest}]{_at(place)}", (Slot(0),), (),
                   op.outputs, op.dynamic, op.node, why=op.why)


def _held(arrays, place: str) -> tuple[list, str]:
    """``arrays`` (numpy constants a call holds) as torch tensors on PyTorch device ``place``,
    and a digest of their values for the call's name (its id: other values, another call)."""
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    digest = hashlib.sha1()
    for t in tensors:  # their bytes one after another, read in place
        digest.update(memoryview(t.numpy()).cast("B"))
    return [t.to(place) for t in tensors], digest.hexdigest()[:12]


def _at(place: str) -> str:
    """What a held constant's call adds to its name for its device: nothing on the CPU."""
    return "" if place == "cpu" else f"@{place}"


def with_constant_statistics(op: TorchOp, params, place: str = "cpu") -> TorchOp:
    """``op`` (a Relax ``nn.batch_norm``'s plain call) as a call on the data alone, giving the
    normalized data only: ``params`` (its scale, shift, mean and variance, constants as numpy
    arrays) are held by the call, on PyTorch device ``place``. The batch norm's other two outputs
    are the mean and variance as they were, which the module takes from its constants: handed back
    by the call, each would be a copy (a result must not share an input's memory) and a tensor more
    to hand over, on every call. The call's id names a digest of the constants."""
    import torch.nn.functional as F

    (gamma, beta, mean, var), digest = _held(params, place)
    epsilon = op.args[5]

    def normalized(x):
        return F.batch_norm(x, mean, var, gamma, beta, False, 0.0, epsilon)

    return TorchOp(normalized, f"{op.name}[constants {digest}]{_at(place)}", (Slot(0),), (),
                   op.outputs[:1], False, op.node, why=op.why)


def holding_constants(op: TorchOp, op_type: str, count: int, constant, x_shape,
                      place: str = "cpu") -> tuple[TorchOp, int]:
    """``op`` (the plain call of a Relax ``op_type`` on ``count`` tensors) as a build runs it on
    PyTorch device ``place``, holding the constants it holds (``constant(i)``: the value of its
    ``i``-th tensor as a numpy array where that is a constant, else None), on that device: a conv's
    or 2-D matmul's weight (:func:`with_constant_weight`), a batch norm's scale, shift, mean and
    variance (:func:`with_constant_statistics`); and how many of its leading tensors the call then
    takes (``count`` where it holds none)."""
    if op_type in PACKABLE and count == 2 and (weight := constant(1)) is not None:
        return with_constant_weight(op, op_type, weight, x_shape, place), 1
    if op_type == "nn.batch_norm" and count == 5:
        statistics = [constant(i) for i in range(1, 5)]
        if all(s is not None for s in statistics):
            return with_constant_statistics(op, statistics, place), 1
    return op, count


class Fastest:
    """A call that runs the fastest of several equivalent ``variants`` (each a function of the
    same tensors): the first calls run each in turn (one warm-up, then ``trials`` timed calls
    each), later calls the one of least time, as ``torch.backends.cudnn.benchmark`` picks a
    convolution algorithm (packed and plain are CPU calls: on a GPU there is one variant)."""

    def __init__(self, variants, trials: int = 3):
        self.variants, self.trials = list(variants), trials
        self.best_s = [float("inf")] * len(self.variants)
        self.calls, self.chosen = 0, (0 if len(self.variants) == 1 else None)

    def __call__(self, *tensors):
        import time

        if self.chosen is not None:
            return self.variants[self.chosen](*tensors)
        k = self.calls % len(self.variants)
        t0 = time.perf_counter()
        out = self.variants[k](*tensors)
        if self.calls >= len(self.variants):  # each one's first call is its warm-up
            self.best_s[k] = min(self.best_s[k], time.perf_counter() - t0)
        self.calls += 1
        if self.calls == len(self.variants) * (self.trials + 1):
            self.chosen = int(np.argmin(self.best_s))
        return out


def fold_batch_norm(weight: np.ndarray, bias: np.ndarray | None, gamma, beta, mean, var,
                    epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """A conv's ``weight`` (O, I, kh, kw) and ``bias`` (O,; None: zeros) with the batch norm
    after it folded in, as inference computes it: ``weight * s`` per output channel and
    ``(bias - mean) * s + beta``, ``s = gamma / sqrt(var + epsilon)``."""
    scale = (np.asarray(gamma, "float64") / np.sqrt(np.asarray(var, "float64") + epsilon))
    folded = (np.asarray(weight, "float64") * scale.reshape(-1, *([1] * (weight.ndim - 1))))
    b = np.zeros(weight.shape[0]) if bias is None else np.asarray(bias, "float64").reshape(-1)
    shift = (b - np.asarray(mean, "float64").reshape(-1)) * scale + np.asarray(beta, "float64")
    return folded.astype(weight.dtype), shift.astype(weight.dtype)
