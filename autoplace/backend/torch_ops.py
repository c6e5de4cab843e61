"""PyTorch ops called from a Relax VM: the functions a module's ``autoplace.torch_op.<id>`` calls.

An op the Relax importer lacks becomes a call into PyTorch (:func:`autoplace.frontends.from_torch`),
and so does a Relax op placed on a torch device (:func:`equivalent`):
``R.call_pure_packed("autoplace.torch_op.<id>", args..., R.Tensor(shape, dtype))`` (:func:`relax_call`),
the output shape static, or only its rank where it depends on the data (``nonzero``, ``unique``).
The id names a :class:`TorchOp`, and a function registered under that name with
``tvm.register_global_func`` wraps its inputs with ``torch.from_dlpack`` (no copy), runs the ATen
op with its non-tensor arguments and hands its new result back through DLPack (no copy either:
writing into a destination the VM allocated, ``call_dps_packed``'s way, cost a copy of every
output, several times the op on a large one).

The functions live in this process only: a library built from such a module calls them by name,
so a build saved and loaded in another process needs the same ops registered again (importing the
same model with :func:`autoplace.frontends.from_torch` does; :func:`missing` says which are not).
The registry below is the one piece of module-level state in autoplace: the VM finds a packed
function by its global name, so the name must stay bound while any build may call it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: What the torch device's calls run, in its profiles' fingerprint: a new number where a call
#: runs another kernel for the same op (2: conv and matmul weights packed once, views copied).
CALLS = 2

#: Prefix of the global function names of PyTorch ops.
PREFIX = "autoplace.torch_op."

# id -> TorchOp. Kept for the life of the process: builds call the functions by name.
_REGISTRY: dict[str, TorchOp] = {}


@dataclass(frozen=True)
class Slot:
    """Where the ``index``-th tensor argument of the call goes among the op's arguments."""

    index: int


@dataclass(frozen=True)
class TorchOp:
    """One ATen call: ``target(*args, **kwargs)`` with :class:`Slot` s for the tensors.

    ``outputs`` are ``(shape, dtype)`` per output at the example input (where ``dynamic``, the
    shape of one example only: the op returns a tensor of the shape the data gives).
    ``node`` is the exported program's node name, for messages.
    """

    target: Any = field(compare=False)
    name: str  # "aten.nonzero.default"
    args: tuple
    kwargs: tuple  # ((name, value), ...)
    outputs: tuple  # ((shape, dtype), ...)
    dynamic: bool
    node: str
    tuple_output: bool = False  # the op returns several tensors (a Relax tuple)
    why: str = field(default="", compare=False)  # why it runs in PyTorch, in words

    @property
    def aten(self) -> str:
        """The op's ATen name without namespace and overload: ``"nonzero"``."""
        parts = self.name.split(".")
        return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]

    @property
    def signature(self) -> str:
        """What the call computes, values of tensors aside: the same for identical calls."""
        return f"{self.name}({_show(self.args)}, {_show(self.kwargs)})"

    @property
    def id(self) -> str:
        text = f"{self.node}|{self.signature}|{self.outputs}|{self.dynamic}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def global_name(self) -> str:
        return PREFIX + self.id

    @functools.cached_property
    def _bound(self) -> tuple | None:
        """Where the tensors go when every slot is a positional argument of its own (the common
        case): ``(positions, arguments, keyword arguments)``, positions being (argument, slot
        index) pairs; else None."""
        def nested(v):
            return isinstance(v, Slot) or (isinstance(v, (list, tuple)) and any(map(nested, v)))

        if any(nested(v) for _, v in self.kwargs) or any(
                isinstance(v, (list, tuple)) and nested(v) for v in self.args):
            return None
        positions = tuple((i, v.index) for i, v in enumerate(self.args) if isinstance(v, Slot))
        return positions, list(self.args), dict(self.kwargs)

    def call(self, tensors: list) -> Any:
        """Run the op on torch tensors (in the order of the slots)."""
        bound = self._bound
        if bound is not None:  # a call from the VM: no more Python than it needs
            positions, args, kwargs = bound
            args = args.copy()
            for i, k in positions:
                args[i] = tensors[k]
            return self.target(*args, **kwargs)

        def fill(v):
            if isinstance(v, Slot):
                return tensors[v.index]
            if isinstance(v, (list, tuple)):
                return type(v)(fill(x) for x in v)
            return v

        return self.target(*fill(self.args), **{k: fill(v) for k, v in self.kwargs})


class TorchOpError(RuntimeError):
    """A PyTorch op called from a built module raised; the message names the op and its node."""


def _show(value) -> str:
    if isinstance(value, Slot):
        return f"%{value.index}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value)


def register(op: TorchOp) -> str:
    """Register ``op``'s function under its global name (once per id) and return the name."""
    import tvm

    if op.id not in _REGISTRY:
        tvm.register_global_func(op.global_name, _function(op), override=True)
        _REGISTRY[op.id] = op
    return op.global_name


def relax_call(name: str, args, ty):
    """The Relax call of registered op ``name`` on tensors ``args`` giving ``ty`` (a tensor or
    tuple type): ``R.call_pure_packed``, which the VM runs as one call whose results it keeps."""
    from tvm import relax

    return relax.op.call_pure_packed(name, *args, ty_args=ty)


def lookup(name: str) -> TorchOp | None:
    """The op a global function name calls, or None where it is no registered PyTorch op."""
    if not name.startswith(PREFIX):
        return None
    return _REGISTRY.get(name[len(PREFIX):])


def called(mod) -> list[str]:
    """The global names of the PyTorch ops module ``mod`` calls, sorted."""
    import re

    return sorted(set(re.findall(re.escape(PREFIX) + r"[0-9a-f]{16}", str(mod))))


def missing(names) -> list[str]:
    """Those of ``names`` (global function names) that call PyTorch ops not registered here."""
    return [n for n in names if n.startswith(PREFIX) and lookup(n) is None]


@contextlib.contextmanager
def one_thread():
    """Within: PyTorch runs on one thread (its count restored after; 0.1 us each way). A call
    from the VM runs while TVM's pool workers still spin on the cores: a parallel PyTorch op
    then waited for a core, 8 ms for a searchsorted of 8x32 values that takes 17 us alone
    (benchmarks/torch_device.py, 2-core VM)."""
    import torch

    before = torch.get_num_threads()
    if before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before != 1:
            torch.set_num_threads(before)


def _function(op: TorchOp):
    """The packed function: it returns the op's results as new tensors, shared with PyTorch
    through DLPack (no copy; a non-contiguous result is made contiguous, and a view of an input
    copied, since the VM takes a call's results as new tensors and may write another tensor into
    an input's memory once the input is dead, under a view it does not know of). Where the
    output shape is static, a result of another shape or dtype is an error naming the op, never
    a tensor the build would misread. The op runs on one PyTorch thread (as :func:`one_thread`)
    without autograd, both set and restored inline: every microsecond here is paid on every
    call (the hand-off the cost model charges)."""
    import torch
    import tvm

    expected = None if op.dynamic else [(tuple(s), getattr(torch, d)) for s, d in op.outputs]
    threads_now, set_threads = torch.get_num_threads, torch.set_num_threads
    grad_now, set_grad = torch.is_grad_enabled, torch.set_grad_enabled
    from_dlpack, to_tvm = torch.from_dlpack, tvm.runtime.from_dlpack

    def call(*args):
        threads, grad = threads_now(), grad_now()
        if threads != 1:
            set_threads(1)
        if grad:
            set_grad(False)
        try:
            # the capsule itself: torch's protocol around a producer (device, stream) costs
            # more than the conversion, and TVM's tensors take no stream
            tensors = [from_dlpack(t.__dlpack__()) for t in args]
            result = op.call(tensors)
        except Exception as e:  # noqa: BLE001 - any error of the op, named for the caller
            raise TorchOpError(f"PyTorch op {op.name} (node {op.node!r}, {op.global_name}) "
                               f"raised {type(e).__name__}: {e}") from e
        finally:
            if threads != 1:
                set_threads(threads)
            if grad:
                set_grad(True)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if expected is not None and (len(results) != len(expected) or any(
                r.shape != s or r.dtype != d for r, (s, d) in zip(results, expected))):
            raise TorchOpError(
                f"PyTorch op {op.name} (node {op.node!r}) gave "
                f"{[(tuple(r.shape), str(r.dtype)) for r in results]}, the build expects "
                f"{[(s, str(d)) for s, d in expected]}")
        held = {t.untyped_storage().data_ptr() for t in tensors}  # a view of one: a copy
        out = [to_tvm((r.clone() if r.untyped_storage().data_ptr() in held else r).contiguous())
               for r in results]
        return out[0] if not op.tuple_output else tvm.runtime.convert(out)

    return call


# --------------------------------------------------------------------- Relax ops in PyTorch

#: Relax op types a torch device can run as their PyTorch equivalent (:func:`equivalent`).
EQUIVALENTS = frozenset({
    "nn.conv2d", "matmul", "add", "subtract", "multiply", "divide", "nn.relu", "sigmoid", "tanh",
    "exp", "sqrt", "rsqrt", "erf", "negative", "nn.silu", "nn.gelu", "nn.gelu_tanh", "clip",
    "nn.softmax", "nn.layer_norm", "nn.batch_norm", "mean", "sum", "max", "min", "permute_dims",
    "reshape", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d",
    # masks and shapes, as attention builds its mask
    "astype", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_not", "logical_and", "logical_or", "maximum", "minimum", "where", "full_like",
    "broadcast_to", "squeeze", "expand_dims"})


def _batch_norm(x, gamma, beta, mean, var, epsilon: float):
    """Relax's ``nn.batch_norm`` in inference: the normalized data, and the moving mean and
    variance as they were (its other two outputs)."""
    import torch.nn.functional as F

    return F.batch_norm(x, mean, var, gamma, beta, False, 0.0, epsilon), mean, var


def _full(like, fill, dtype: str):
    """Relax's ``full_like``: a tensor of ``like``'s shape and ``dtype``, every element ``fill``
    (a 0-d tensor)."""
    import torch

    return fill.to(getattr(torch, dtype)).expand(like.shape).contiguous()


# Ops whose PyTorch call gives a view, here with its elements copied: a call's result must not
# share an input's memory (:func:`_function`), and the copy is then part of what is timed.
def _reshaped(x, shape):
    return x.reshape(shape).clone()


def _expanded(x, shape):
    import torch

    return x.expand(shape).clone(memory_format=torch.contiguous_format)


def _permuted(x, axes):
    import torch

    return x.permute(axes).clone(memory_format=torch.contiguous_format)


def _scalar(text: str) -> float | None:
    """The value of a Relax scalar argument as the op graph writes it (``T.int64(6)``,
    ``T.float64("-inf")``), or None where it is none."""
    import re

    m = re.fullmatch(r"T\.\w+\((.+)\)", text.strip())
    try:
        return float(m.group(1).strip("\"'")) if m else None
    except ValueError:
        return None


def node_equivalent(node) -> TorchOp | None:
    """:func:`equivalent` of an op-graph node (:class:`autoplace.graph.OpNode`)."""
    return equivalent(node.op_type, dict(node.attrs), [(t.shape, t.dtype) for t in node.inputs],
                      [(t.shape, t.dtype) for t in node.outputs], node.name, node.extra_args)


def equivalent(op_type: str, attrs: dict, inputs: list, outputs: list, node: str,
               extra: tuple[str, ...] = ()) -> TorchOp | None:
    """The PyTorch call that computes Relax op ``op_type`` with ``attrs`` (and non-tensor
    arguments ``extra``, as the op graph writes them: a clip's bounds) on tensors of ``inputs``
    (``(shape, dtype)`` each, in the call's order) giving ``outputs``; None where PyTorch has
    no equivalent here (another layout, asymmetric padding, another out dtype, batch norm in
    training or over another axis, an op not in :data:`EQUIVALENTS`)."""
    import torch
    import torch.nn.functional as F

    if op_type not in EQUIVALENTS:
        return None
    if op_type == "nn.batch_norm":
        if attrs.get("training") or int(attrs["axis"]) != 1 or len(inputs[0][0]) < 2 \
                or not (attrs["center"] and attrs["scale"]) or len(outputs) != 3:
            return None
        return TorchOp(_batch_norm, "torch.batch_norm",
                       tuple(Slot(i) for i in range(5)) + (float(attrs["epsilon"]),), (),
                       tuple((tuple(s), d) for s, d in outputs), False, node, tuple_output=True,
                       why="placed on PyTorch: nn.batch_norm as torch.batch_norm")
    if len(outputs) != 1:
        return None
    out_shape, out_dtype = outputs[0]
    if str(attrs.get("out_dtype") or out_dtype) not in ("", "void", out_dtype):
        return None
    x = Slot(0)
    unary = {"nn.relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
             "exp": torch.exp, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "erf": torch.erf,
             "negative": torch.neg, "nn.silu": F.silu, "nn.gelu": F.gelu}
    reductions = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "min": torch.amin}
    binary = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul,
              "divide": torch.div, "matmul": torch.matmul, "equal": torch.eq,
              "not_equal": torch.ne, "greater": torch.gt, "greater_equal": torch.ge,
              "less": torch.lt, "less_equal": torch.le, "logical_and": torch.logical_and,
              "logical_or": torch.logical_or, "maximum": torch.maximum,
              "minimum": torch.minimum}

    def make(target, name, args):
        return TorchOp(target, name, tuple(args), (), ((tuple(out_shape), out_dtype),), False,
                       node, why=f"placed on PyTorch: {op_type} as {name}")

    def symmetric(pad):  # Relax: (top, left, bottom, right)
        pad = list(pad)
        return tuple(pad[:2]) if len(pad) == 4 and pad[:2] == pad[2:] else None

    if op_type in unary:
        return make(unary[op_type], f"torch.{op_type.split('.')[-1]}", [x])
    if op_type in binary:
        return make(binary[op_type], f"torch.{binary[op_type].__name__}", [x, Slot(1)])
    if op_type == "logical_not":
        return make(torch.logical_not, "torch.logical_not", [x])
    if op_type == "astype":
        return TorchOp(torch.Tensor.to, "torch.Tensor.to", (x, getattr(torch, out_dtype)),
                       (("copy", True),), ((tuple(out_shape), out_dtype),), False, node,
                       why=f"placed on PyTorch: {op_type} as torch.Tensor.to")
    if op_type == "where":
        return make(torch.where, "torch.where", [x, Slot(1), Slot(2)])
    if op_type == "full_like":
        return make(_full, "torch.full_like", [x, Slot(1), out_dtype])
    if op_type in ("broadcast_to", "squeeze", "expand_dims", "reshape"):
        name, target = (("torch.expand", _expanded) if op_type == "broadcast_to"
                        else ("torch.reshape", _reshaped))
        return make(target, name, [x, tuple(out_shape)])
    if op_type == "nn.gelu_tanh":
        return TorchOp(F.gelu, "torch.gelu", (x,), (("approximate", "tanh"),),
                       ((tuple(out_shape), out_dtype),), False, node,
                       why="placed on PyTorch: nn.gelu_tanh as torch.gelu")
    if op_type == "clip":
        bounds = [_scalar(e) for e in extra]
        if len(bounds) != 2 or None in bounds:
            return None
        lo, hi = (None if abs(b) == float("inf") else b for b in bounds)
        return make(torch.clamp, "torch.clamp", [x, lo, hi])
    if op_type in reductions:
        axes = attrs.get("axis")
        dims = tuple(range(len(inputs[0][0]))) if axes is None else tuple(int(a) for a in axes)
        return make(reductions[op_type], f"torch.{reductions[op_type].__name__}",
                    [x, dims, bool(attrs.get("keepdims", False))])
    if op_type == "nn.softmax":
        return make(torch.softmax, "torch.softmax", [x, int(attrs["axis"])])
    if op_type == "permute_dims":
        axes = attrs.get("axes")
        axes = tuple(range(len(inputs[0][0])))[::-1] if axes is None else tuple(axes)
        return make(_permuted, "torch.permute", [x, axes])
    if op_type == "nn.layer_norm":
        ndim, axes = len(inputs[0][0]), sorted(a % len(inputs[0][0]) for a in attrs["axes"])
        if axes != list(range(ndim - len(axes), ndim)) or not (attrs["center"] and attrs["scale"]):
            return None
        return make(F.layer_norm, "torch.layer_norm",
                    [x, tuple(inputs[0][0][-len(axes):]), Slot(1), Slot(2),
                     float(attrs["epsilon"])])
    layout = attrs.get("data_layout", attrs.get("layout", "NCHW"))
    if layout != "NCHW" or attrs.get("out_layout", layout) not in ("", layout):
        return None
    if op_type == "nn.conv2d":
        pad = symmetric(attrs["padding"])
        if attrs["kernel_layout"] != "OIHW" or pad is None:
            return None
        return make(F.conv2d, "torch.conv2d",
                    [x, Slot(1), None, tuple(attrs["strides"]), pad, tuple(attrs["dilation"]),
                     int(attrs["groups"])])
    if op_type in ("nn.max_pool2d", "nn.avg_pool2d"):
        pad = symmetric(attrs["padding"])
        if pad is None:
            return None
        if op_type == "nn.max_pool2d":
            return make(F.max_pool2d, "torch.max_pool2d",
                        [x, tuple(attrs["pool_size"]), tuple(attrs["strides"]), pad,
                         tuple(attrs["dilation"]), bool(attrs["ceil_mode"])])
        if list(attrs["dilation"]) != [1, 1]:
            return None
        return make(F.avg_pool2d, "torch.avg_pool2d",
                    [x, tuple(attrs["pool_size"]), tuple(attrs["strides"]), pad,
                     bool(attrs["ceil_mode"]), bool(attrs["count_include_pad"])])
    if op_type == "nn.adaptive_avg_pool2d":
        return make(F.adaptive_avg_pool2d, "torch.adaptive_avg_pool2d",
                    [x, tuple(out_shape[-2:])])
    return None


# ------------------------------------------------------------------- weights packed once

#: Relax op types whose second tensor, a constant weight, the torch device packs once for
#: oneDNN (:func:`with_constant_weight`).
PACKABLE = frozenset({"nn.conv2d", "matmul"})


def packed_call(op: TorchOp, op_type: str, weight, x_shape, bias=None, act: str | None = None):
    """Of ``op`` (the plain call of a Relax ``nn.conv2d`` or 2-D ``matmul``, :func:`equivalent`),
    the call on its first input alone (of ``x_shape``) with ``weight`` (a float32 torch tensor)
    packed now into oneDNN's blocked layout: a plain call reorders a weight on every call, which
    takes longer than the op itself for a large weight and a small activation. None where it
    does not apply (another op, another dtype, a weight not on the CPU, a batch of matmul
    weights, PyTorch without oneDNN, a shape oneDNN refuses: the call is tried once on zeros).
    The packed call computes in channels-last and gives its result back contiguous, a copy the
    plain call does not make: which of the two is faster depends on the shapes. With ``bias`` (a
    1-D float32 tensor) and ``act`` (a Relax op type of :data:`FUSED_ACTIVATIONS`, or None), the
    call also adds the bias and applies the activation, inside oneDNN's kernel
    (:func:`with_fused_tail`)."""
    import torch

    if op_type not in PACKABLE or weight.dtype != torch.float32 \
            or weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return None
    if op_type == "matmul" and (weight.dim() < 2 or any(d != 1 for d in weight.shape[:-2])):
        return None  # a batch of weights (one of ones is a weight broadcast)
    try:  # oneDNN may refuse a shape: then the plain call is the only one
        call = _packed(op, op_type, weight, x_shape, bias, act)
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
    :func:`chain_activation`): oneDNN's attribute and algorithm for it, and PyTorch's
    function."""
    import torch
    import torch.nn.functional as F

    return {"nn.relu": (("relu", ""), torch.relu), "nn.gelu": (("gelu", "none"), F.gelu),
            "nn.gelu_tanh": (("gelu", "tanh"), functools.partial(F.gelu, approximate="tanh")),
            "nn.silu": (("swish", ""), F.silu), "sigmoid": (("sigmoid", ""), torch.sigmoid),
            "tanh": (("tanh", ""), torch.tanh), "hardswish": (("hardswish", ""), F.hardswish),
            "hardsigmoid": (("hardsigmoid", ""), F.hardsigmoid)}[act]


def chain_activation(op_types) -> str | None:
    """The activation that the ops of a chain of :func:`fused_chains` after its bias add
    compute, given their op types in order (:func:`pointwise` applies it): None for none, the
    op itself for one of :data:`FUSED_ACTIVATIONS`, and for several, as ``torch.export``
    decomposes an activation: ``"nn.silu"`` (``x * sigmoid(x)``), ``"hardswish"``
    (``x * relu6(x + 3) / 6``) or ``"hardsigmoid"`` (``relu6(x + 3) / 6``)."""
    op_types = tuple(op_types)
    if len(op_types) <= 1:
        return op_types[0] if op_types else None
    if op_types == ("sigmoid", "multiply"):
        return "nn.silu"
    if op_types[0] == "add":
        return "hardswish" if "multiply" in op_types else "hardsigmoid"
    raise ValueError(f"no activation is written as {', '.join(op_types)}")


def fused_chains(graph) -> list[tuple[int, ...]]:
    """The chains of op graph ``graph`` that a torch device runs as one call
    (:func:`with_fused_tail`), each ``(anchor, bias add, *activation)`` node indices: a conv2d
    or a matmul by a 2-D weight, float32, whose weight is a constant (no tensor computed at run
    time reaches it but its data); the add of a constant bias of its output's channels (a conv)
    or last axis (a matmul), its only consumer; and the activation after it, if any: one op of
    :data:`FUSED_ACTIVATIONS`, the add's only consumer, or one that ``torch.export`` writes as
    several ops (:func:`chain_activation` names them), which alone read the add's output and
    each other's: SiLU's ``x * sigmoid(x)``, hardswish's ``x * relu6(x + 3) / 6`` and
    hardsigmoid's ``relu6(x + 3) / 6`` (relu6: clips to [0, 6]). For a conv, a batch norm in
    inference (its statistics constants, folded into the conv's weight and bias:
    :func:`fold_batch_norm`) may stand for the bias add. Only the last may be an output of the
    model. A PyTorch user gets the same from ``nn.Conv2d`` or ``nn.Linear`` and its
    activation, with or without ``nn.BatchNorm2d`` between."""
    around = _Around.of(graph)
    preds, fed = around.preds, around.fed
    constant = [not preds[i] and not fed[i] for i in range(len(graph.nodes))]  # folded

    def runtime_inputs(i):
        return len({p for p in preds[i] if not constant[p]}) + fed[i]

    chains = []
    for node in graph.nodes:
        i = node.index
        if node.op_type not in PACKABLE or len(node.inputs) != 2 or len(node.outputs) != 1 \
                or any(t.dtype != "float32" for t in (*node.inputs, *node.outputs)) \
                or runtime_inputs(i) != 1 or node_equivalent(node) is None:
            continue
        out = node.outputs[0].shape
        if len(out) < 2 or (node.op_type == "matmul" and len(node.inputs[1].shape) != 2):
            continue
        j = around.sole(i)
        conv = node.op_type == "nn.conv2d"
        if j is None or not (_is_bias_add(graph.nodes[j], out, 1 if conv else len(out) - 1)
                             or (conv and _is_batch_norm(graph.nodes[j], out))) \
                or {p for p in preds[j] if not constant[p]} != {i} or fed[j]:
            continue
        chain = (i, j)
        k = around.sole(j)
        if k is not None and graph.nodes[k].op_type in FUSED_ACTIVATIONS \
                and len(graph.nodes[k].inputs) == 1 and graph.nodes[k].outputs[0].shape == out:
            chain = (i, j, k)
        elif (composite := around.activation_after(j)) is not None:
            chain = (i, j, *composite)
        chains.append(chain)
    return chains


@dataclass(frozen=True)
class _Around:
    """What :func:`fused_chains` reads of an op graph's nodes: each node's producers and
    consumers (``preds``, ``succs``: node indices) and how many graph inputs it reads
    (``fed``)."""

    graph: Any
    preds: list
    succs: list
    fed: list

    @classmethod
    def of(cls, graph) -> _Around:
        n = len(graph.nodes)
        preds, succs, fed = [[] for _ in range(n)], [[] for _ in range(n)], [0] * n
        for e in graph.edges:
            preds[e.dst].append(e.src)
            succs[e.src].append(e.dst)
        for gin in graph.inputs:
            for c in set(gin.consumers):
                fed[c] += 1
        return cls(graph, preds, succs, fed)

    def sole(self, k: int) -> int | None:
        """Node ``k``'s only consumer, where it is not an output of the model."""
        out = set(self.succs[k])
        return out.pop() if len(out) == 1 and not self.graph.nodes[k].is_output else None

    def activation_after(self, j: int) -> tuple[int, ...] | None:
        """The nodes, in order, of an activation written as several ops after node ``j``
        (:func:`fused_chains`), or None where none is."""
        if self.graph.nodes[j].is_output:
            return None
        readers = set(self.succs[j])
        by_type = {self.graph.nodes[r].op_type: r for r in readers}
        if len(by_type) != len(readers):
            return None
        if readers == {by_type.get("sigmoid"), by_type.get("multiply")}:  # x * sigmoid(x)
            s, m = by_type["sigmoid"], by_type["multiply"]
            return (s, m) if self.reads(s, j, {j}) and self.reads(m, j, {j, s}) \
                and self.sole(s) == m else None
        a = by_type.get("add")
        if a is None or not self.reads(a, j, {j}, 3.0):
            return None
        clips, q, bounds = [], a, (-np.inf, np.inf)
        while (c := self.sole(q)) is not None and self.graph.nodes[c].op_type == "clip" \
                and self.reads(c, j, {q}) and (b := _clip_bounds(self.graph.nodes[c])) is not None:
            clips, q, bounds = clips + [c], c, (max(bounds[0], b[0]), min(bounds[1], b[1]))
        if not clips or bounds != (0.0, 6.0):
            return None
        relu6 = (a, *clips)
        nxt, others = self.sole(q), readers - {a}
        if not others:  # relu6(x + 3) / 6
            return (*relu6, nxt) if self.divides(nxt, j, q) else None
        m = others.pop() if len(others) == 1 else None
        if m is None or self.graph.nodes[m].op_type != "multiply":
            return None
        if nxt == m and self.reads(m, j, {j, q}) and self.divides(d := self.sole(m), j, m):
            return (*relu6, m, d)  # x * relu6(x + 3) / 6
        if self.divides(nxt, j, q) and self.reads(m, j, {j, nxt}):
            return (*relu6, nxt, m)  # x * (relu6(x + 3) / 6)
        return None

    def reads(self, k: int, j: int, sources: set, scalar: float | None = None) -> bool:
        """Whether node ``k`` reads the tensors of ``sources`` and no other but, with
        ``scalar``, one constant of that value; its output the shape and type of ``j``'s."""
        node = self.graph.nodes[k]
        if set(self.preds[k]) != sources or self.fed[k] \
                or node.outputs[0] != self.graph.nodes[j].outputs[0]:
            return False
        constants = [v for v in node.scalars if v is not None]
        tensors = len(node.inputs) - len(constants)
        return (constants == [scalar] and tensors == 1) if scalar is not None \
            else (not constants and tensors == len(node.inputs))

    def divides(self, k: int | None, j: int, src: int) -> bool:
        """Whether node ``k`` divides node ``src``'s output by 6 (and nothing else)."""
        return k is not None and self.graph.nodes[k].op_type == "divide" \
            and self.reads(k, j, {src}, 6.0) and self.graph.nodes[k].scalars[1:] == (6.0,)


def _clip_bounds(node) -> tuple[float, float] | None:
    """A clip's lower and upper bounds (its extra arguments, as ``T.int64(0)`` or
    ``T.float64("inf")``), or None where they cannot be read."""
    try:
        lo, hi = (float(re.sub(r'^T\.\w+\(\s*"?|"?\s*\)$', "", a)) for a in node.extra_args)
    except ValueError:
        return None
    return lo, hi


def _is_batch_norm(node, out_shape) -> bool:
    """Whether op-graph node ``node`` is a batch norm in inference over the channels of a
    tensor of ``out_shape`` (NCHW) that PyTorch computes (:func:`equivalent`)."""
    return node.op_type == "nn.batch_norm" and len(node.inputs) == 5 \
        and node.outputs[0].shape == out_shape and node_equivalent(node) is not None


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


def _is_bias_add(node, out_shape, axis: int) -> bool:
    """Whether op-graph node ``node`` adds to a tensor of ``out_shape`` a bias along ``axis``:
    one input of that shape, the other of shape ``(..., 1, out_shape[axis], 1, ...)``, the
    axes after ``axis`` of extent 1 (a conv's ``(1, C, 1, 1)``, a linear's ``(N,)``)."""
    if node.op_type != "add" or len(node.inputs) != 2 or node.outputs[0].shape != out_shape:
        return False
    shapes = [tuple(t.shape) for t in node.inputs]
    if tuple(out_shape) not in shapes:
        return False
    bias = list(shapes[1] if shapes[0] == tuple(out_shape) else shapes[0])
    while bias and bias[0] == 1:
        bias.pop(0)
    return out_shape[axis] > 1 and bias == [out_shape[axis]] + [1] * (len(out_shape) - axis - 1)


def with_fused_tail(op: TorchOp, op_type: str, weight: np.ndarray, bias: np.ndarray,
                    act: str | None, x_shape, outputs, place: str = "cpu") -> TorchOp:
    """``op`` (the plain call of a conv2d or 2-D matmul, :func:`equivalent`) with the bias add
    and activation after it (``act``: a Relax op type of :data:`FUSED_ACTIVATIONS`, or None) as
    one call on its data alone (of ``x_shape``), giving ``outputs`` (the chain's last), weight
    and ``bias`` held on PyTorch device ``place``: oneDNN's conv or linear with the bias and
    activation in its kernel, its weight packed once (:func:`packed_call`), or PyTorch's plain
    ``conv2d``/``linear`` with the bias and then the activation, whichever is faster on the
    first calls (:class:`Fastest`). One call rather than three saves two hand-offs and the
    passes over memory of the add and the activation (:func:`fused_chains` finds the chains)."""
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

    packed = packed_call(op, op_type, w, x_shape, b, act)
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
    digest = hashlib.sha1(b"".join(t.numpy().tobytes() for t in tensors)).hexdigest()[:12]
    return [t.to(place) for t in tensors], digest


def _at(place: str) -> str:
    """What a held constant's call adds to its name for its device: nothing on the CPU."""
    return "" if place == "cpu" else f"@{place}"


def with_constant_statistics(op: TorchOp, params, place: str = "cpu") -> TorchOp:
    """``op`` (a Relax ``nn.batch_norm``'s call, :func:`equivalent`) as a call on the data
    alone, giving the normalized data only: ``params`` (its scale, shift, mean and variance,
    constants as numpy arrays) are held by the call, on PyTorch device ``place``. The batch
    norm's other two outputs are the mean and variance as they were, which the module takes
    from its constants: handed back by the call, each would be a copy (a result must not share
    an input's memory) and a tensor more to hand over, on every call. The call's id names a
    digest of the constants."""
    import torch.nn.functional as F

    (gamma, beta, mean, var), digest = _held(params, place)
    epsilon = op.args[5]

    def normalized(x):
        return F.batch_norm(x, mean, var, gamma, beta, False, 0.0, epsilon)

    return TorchOp(normalized, f"{op.name}[constants {digest}]{_at(place)}", (Slot(0),), (),
                   op.outputs[:1], False, op.node, why=op.why)


def holding_constants(op: TorchOp, op_type: str, count: int, constant, x_shape,
                      place: str = "cpu") -> tuple[TorchOp, int]:
    """``op`` (the plain call of a Relax ``op_type`` on ``count`` tensors, :func:`equivalent`)
    as a build runs it on PyTorch device ``place``, holding the constants it holds
    (``constant(i)``: the value of its ``i``-th tensor as a numpy array where that is a
    constant, else None), on that device: a conv's or 2-D
    matmul's weight (:func:`with_constant_weight`), a batch norm's scale, shift, mean and
    variance (:func:`with_constant_statistics`); and how many of its leading tensors the call
    then takes (``count`` where it holds none)."""
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
