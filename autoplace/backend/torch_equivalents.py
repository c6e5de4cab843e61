"""Relax ops in PyTorch: the PyTorch call that computes a Relax op, where a torch device runs it.

:func:`equivalent` looks the op type up in a table of small builders, one per op or family of
ops (elementwise, reductions, pools...), each giving the
:class:`~autoplace.backend.torch_bridge.TorchOp` that computes the op on tensors of the same
shapes, or None where PyTorch has no equivalent for that call here (another layout, asymmetric
padding...).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from autoplace.backend.torch_bridge import Slot, TorchOp

_X = Slot(0)  # the op's first tensor


@dataclass(frozen=True)
class _Call:
    """The Relax call a builder reads: its op type, attributes, tensors (``(shape, dtype)``
    each, in the call's order), outputs, node name and non-tensor arguments (``extra``, as the
    op graph writes them)."""

    op_type: str
    attrs: dict
    inputs: list
    outputs: list
    node: str
    extra: tuple

    @property
    def shape(self) -> tuple:
        """The shape of the (one) output."""
        return tuple(self.outputs[0][0])

    @property
    def dtype(self) -> str:
        """The dtype of the (one) output."""
        return self.outputs[0][1]

    @property
    def rank(self) -> int:
        """The rank of the first tensor."""
        return len(self.inputs[0][0])

    def op(self, target, name: str, args, kwargs=()) -> TorchOp:
        """The call ``name`` of ``target(*args, **kwargs)`` giving the one output."""
        return TorchOp(target, name, tuple(args), tuple(kwargs), ((self.shape, self.dtype),),
                       False, self.node, why=f"placed on PyTorch: {self.op_type} as {name}")


def _function(path: str):
    """The PyTorch function of dotted ``path`` (``"torch.nn.functional.silu"``)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# Relax op -> PyTorch function of one tensor (its call named torch.<Relax name>).
_UNARY = {"nn.relu": "torch.relu", "sigmoid": "torch.sigmoid", "tanh": "torch.tanh",
          "exp": "torch.exp", "sqrt": "torch.sqrt", "rsqrt": "torch.rsqrt", "erf": "torch.erf",
          "negative": "torch.neg", "nn.silu": "torch.nn.functional.silu",
          "nn.gelu": "torch.nn.functional.gelu", "logical_not": "torch.logical_not",
          "cos": "torch.cos", "sin": "torch.sin", "abs": "torch.abs"}
# Relax op -> PyTorch function of two tensors, broadcast as in Relax.
_BINARY = {"add": "torch.add", "subtract": "torch.sub", "multiply": "torch.mul",
           "divide": "torch.div", "matmul": "torch.matmul", "equal": "torch.eq",
           "not_equal": "torch.ne", "greater": "torch.gt", "greater_equal": "torch.ge",
           "less": "torch.lt", "less_equal": "torch.le", "logical_and": "torch.logical_and",
           "logical_or": "torch.logical_or", "maximum": "torch.maximum",
           "minimum": "torch.minimum", "power": "torch.pow",
           "bitwise_and": "torch.bitwise_and", "bitwise_or": "torch.bitwise_or"}
# Relax reduction -> PyTorch reduction over the same axes.
_REDUCTIONS = {"mean": "torch.mean", "sum": "torch.sum", "max": "torch.amax",
               "min": "torch.amin"}


def _unary(c: _Call) -> TorchOp:
    return c.op(_function(_UNARY[c.op_type]), f"torch.{c.op_type.split('.')[-1]}", [_X])


def _binary(c: _Call) -> TorchOp:
    path = _BINARY[c.op_type]
    return c.op(_function(path), path, [_X, Slot(1)])


def _reduction(c: _Call) -> TorchOp:
    path, axes = _REDUCTIONS[c.op_type], c.attrs.get("axis")
    dims = tuple(range(c.rank)) if axes is None else tuple(int(a) for a in axes)
    return c.op(_function(path), path, [_X, dims, bool(c.attrs.get("keepdims", False))])


def _astype(c: _Call) -> TorchOp:
    import torch

    return c.op(torch.Tensor.to, "torch.Tensor.to", [_X, getattr(torch, c.dtype)],
                (("copy", True),))


def _where(c: _Call) -> TorchOp:
    import torch

    return c.op(torch.where, "torch.where", [_X, Slot(1), Slot(2)])


def _full_like(c: _Call) -> TorchOp:
    return c.op(_full, "torch.full_like", [_X, Slot(1), c.dtype])


def _zeros_like(c: _Call) -> TorchOp:
    import torch

    fill = torch.zeros_like if c.op_type == "zeros_like" else torch.ones_like
    return c.op(fill, f"torch.{c.op_type}", [_X], (("dtype", getattr(torch, c.dtype)),))


def _broadcast_to(c: _Call) -> TorchOp:
    return c.op(_expanded, "torch.expand", [_X, c.shape])


def _reshape(c: _Call) -> TorchOp:  # also squeeze and expand_dims: the output's shape says all
    return c.op(_reshaped, "torch.reshape", [_X, c.shape])


def _permute_dims(c: _Call) -> TorchOp:
    axes = c.attrs.get("axes")
    axes = tuple(range(c.rank))[::-1] if axes is None else tuple(axes)
    return c.op(_permuted, "torch.permute", [_X, axes])


def _gelu_tanh(c: _Call) -> TorchOp:
    import torch.nn.functional as F

    return c.op(F.gelu, "torch.gelu", [_X], (("approximate", "tanh"),))


def _take(c: _Call) -> TorchOp | None:
    if c.attrs.get("mode", "fast") != "fast":  # indices wrapped or clipped: not PyTorch's
        return None
    return c.op(_taken, "torch.index_select", [_X, Slot(1), int(c.attrs.get("axis") or 0),
                                               c.shape])


def _strided_slice(c: _Call) -> TorchOp | None:
    """``x[...]`` by the axes, begins, ends and strides the op graph writes (``"(3,)"`` each);
    None where they are not numbers or a stride is not positive."""
    import ast

    try:
        axes, begin, end, *strides = (tuple(int(v) for v in ast.literal_eval(e))
                                      for e in c.extra)
    except (ValueError, SyntaxError, TypeError):
        return None
    strides = strides[0] if strides else (1,) * len(axes)
    if not (len(axes) == len(begin) == len(end) == len(strides)) or min(strides, default=1) < 1:
        return None
    index = [slice(None)] * c.rank
    for a, b, e, s in zip(axes, begin, end, strides):
        index[a % c.rank] = slice(b, e, s)  # Python's slice clips as Relax's does, not assumed
    return c.op(_sliced, "torch.slice", [_X, tuple(index)])


def _arange(c: _Call) -> TorchOp | None:
    import torch

    bounds = [_scalar(e) for e in c.extra]
    if len(bounds) != 3 or None in bounds:
        return None
    start, end, step = (int(b) if float(b).is_integer() else b for b in bounds)
    return c.op(torch.arange, "torch.arange", [start, end, step],
                (("dtype", getattr(torch, c.dtype)),))


def _clip(c: _Call) -> TorchOp | None:
    import torch

    bounds = clip_bounds(c.extra)
    if bounds is None:
        return None
    lo, hi = (None if abs(b) == float("inf") else b for b in bounds)
    return c.op(torch.clamp, "torch.clamp", [_X, lo, hi])


def _softmax(c: _Call) -> TorchOp:
    import torch

    return c.op(torch.softmax, "torch.softmax", [_X, int(c.attrs["axis"])])


def _layer_norm(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    axes = sorted(a % c.rank for a in c.attrs["axes"])
    if axes != list(range(c.rank - len(axes), c.rank)) \
            or not (c.attrs["center"] and c.attrs["scale"]):
        return None
    return c.op(F.layer_norm, "torch.layer_norm",
                [_X, tuple(c.inputs[0][0][-len(axes):]), Slot(1), Slot(2),
                 float(c.attrs["epsilon"])])


def bshd_attention(query, key, value, bias=None, scale=None, is_causal=False):
    """PyTorch's ``scaled_dot_product_attention`` on Relax's layout (batch, sequence, heads,
    features) in and out, ``bias`` added to the scores."""
    import torch.nn.functional as F

    def heads_second(x):
        return x.transpose(1, 2)

    out = F.scaled_dot_product_attention(heads_second(query), heads_second(key),
                                         heads_second(value), attn_mask=bias,
                                         is_causal=is_causal, scale=scale)
    return heads_second(out).contiguous()


def _attention(c: _Call) -> TorchOp | None:
    if c.attrs.get("window_size") is not None or c.attrs.get("causal_mask") not in (None,
                                                                                  "TopLeft"):
        return None
    bias = Slot(3) if len(c.inputs) > 3 else None
    scale = c.attrs.get("scale")
    return c.op(bshd_attention, "torch.scaled_dot_product_attention",
                [_X, Slot(1), Slot(2), bias, None if scale is None else float(scale),
                 c.attrs.get("causal_mask") == "TopLeft"])


def _batch_norm_call(c: _Call) -> TorchOp | None:
    a = c.attrs
    if a.get("training") or int(a["axis"]) != 1 or c.rank < 2 \
            or not (a["center"] and a["scale"]) or len(c.outputs) != 3:
        return None
    return TorchOp(_batch_norm, "torch.batch_norm",
                   tuple(Slot(i) for i in range(5)) + (float(a["epsilon"]),), (),
                   tuple((tuple(s), d) for s, d in c.outputs), False, c.node, tuple_output=True,
                   why="placed on PyTorch: nn.batch_norm as torch.batch_norm")


def _nchw(attrs: dict) -> bool:
    """Whether an op of images reads and writes them NCHW."""
    layout = attrs.get("data_layout", attrs.get("layout", "NCHW"))
    return layout == "NCHW" and attrs.get("out_layout", layout) in ("", layout)


def _symmetric(pad) -> tuple | None:
    """Relax's padding ``(top, left, bottom, right)`` as PyTorch's ``(top, left)``, or None
    where it is not symmetric."""
    pad = list(pad)
    return tuple(pad[:2]) if len(pad) == 4 and pad[:2] == pad[2:] else None


def _conv2d(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    a = c.attrs
    if not _nchw(a) or a["kernel_layout"] != "OIHW" or (pad := _symmetric(a["padding"])) is None:
        return None
    return c.op(F.conv2d, "torch.conv2d", [_X, Slot(1), None, tuple(a["strides"]), pad,
                                           tuple(a["dilation"]), int(a["groups"])])


def _conv1d(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    a = c.attrs
    pad = list(a["padding"])
    if a["data_layout"] != "NCW" or a.get("out_layout", "NCW") not in ("", "NCW") \
            or a["kernel_layout"] != "OIW" or len(pad) != 2 or pad[0] != pad[1]:
        return None
    return c.op(F.conv1d, "torch.conv1d", [_X, Slot(1), None, tuple(a["strides"]), (pad[0],),
                                           tuple(a["dilation"]), int(a["groups"])])


def _cumsum_call(c: _Call) -> TorchOp | None:
    if c.dtype == "bool":  # a running sum kept in bool: PyTorch sums no bools
        return None
    axis = c.attrs.get("axis")
    return c.op(_cumsum, "torch.cumsum", [_X, None if axis is None else int(axis), c.dtype,
                                          bool(c.attrs.get("exclusive"))])


def _max_pool2d(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    a = c.attrs
    if not _nchw(a) or (pad := _symmetric(a["padding"])) is None:
        return None
    return c.op(F.max_pool2d, "torch.max_pool2d",
                [_X, tuple(a["pool_size"]), tuple(a["strides"]), pad, tuple(a["dilation"]),
                 bool(a["ceil_mode"])])


def _avg_pool2d(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    a = c.attrs
    if not _nchw(a) or (pad := _symmetric(a["padding"])) is None or list(a["dilation"]) != [1, 1]:
        return None
    return c.op(F.avg_pool2d, "torch.avg_pool2d",
                [_X, tuple(a["pool_size"]), tuple(a["strides"]), pad, bool(a["ceil_mode"]),
                 bool(a["count_include_pad"])])


def _adaptive_avg_pool2d(c: _Call) -> TorchOp | None:
    import torch.nn.functional as F

    if not _nchw(c.attrs):
        return None
    return c.op(F.adaptive_avg_pool2d, "torch.adaptive_avg_pool2d", [_X, c.shape[-2:]])


_BUILDERS = {
    **dict.fromkeys(_UNARY, _unary), **dict.fromkeys(_BINARY, _binary),
    **dict.fromkeys(_REDUCTIONS, _reduction),
    "nn.gelu_tanh": _gelu_tanh, "clip": _clip, "nn.softmax": _softmax,
    "nn.layer_norm": _layer_norm, "nn.batch_norm": _batch_norm_call, "permute_dims": _permute_dims,
    "reshape": _reshape, "nn.conv2d": _conv2d, "nn.max_pool2d": _max_pool2d,
    "nn.avg_pool2d": _avg_pool2d, "nn.adaptive_avg_pool2d": _adaptive_avg_pool2d,
    "nn.conv1d": _conv1d, "cumsum": _cumsum_call,
    "nn.attention": _attention, "nn.attention_bias": _attention,
    # masks and shapes, as attention builds its mask
    "astype": _astype, "where": _where, "full_like": _full_like, "broadcast_to": _broadcast_to,
    "zeros_like": _zeros_like, "ones_like": _zeros_like, "take": _take,
    "strided_slice": _strided_slice,
    "squeeze": _reshape, "expand_dims": _reshape,
}

#: Relax op types a torch device can run as their PyTorch equivalent (:func:`equivalent`).
EQUIVALENTS = frozenset(_BUILDERS)


def _concat(c: _Call) -> TorchOp:
    import torch

    return c.op(torch.cat, "torch.cat", [_X, int(c.attrs["axis"])])


def _split(c: _Call) -> TorchOp:
    """``torch.split`` by the parts' sizes along the axis (from the outputs' shapes): ONNX's
    exporter writes it as one ``Split``, where ``torch.tensor_split`` became a loop over a
    sequence of tensors."""
    import torch

    axis = int(c.attrs["axis"])
    try:
        fn, name, at = torch.split, "torch.split", [int(s[axis]) for s, _ in c.outputs]
    except (TypeError, ValueError):  # parts of sizes known at run time only
        parts = c.attrs["indices_or_sections"]
        fn, name, at = torch.tensor_split, "torch.tensor_split", (
            int(parts) if isinstance(parts, (int, float)) else tuple(int(i) for i in parts))
    return TorchOp(fn, name, (_X, at, axis), (), tuple((tuple(s), d) for s, d in c.outputs),
                   False, c.node, tuple_output=True, why=f"placed on ONNX Runtime: split as {name}")


# Ops that take or give a tuple of tensors (``concat((a, b), axis)``, ``split``), or no tensor
# at all (``arange``): a segment traced in PyTorch computes them (a tuple in a slot, a tuple
# out), a torch device's call, which takes and gives tensors one by one, does not.
_TUPLE_BUILDERS = {"concat": _concat, "split": _split, "arange": _arange}
#: Relax op types an ONNX Runtime segment can compute besides :data:`EQUIVALENTS`
#: (``equivalent(..., tuples=True)``).
SEGMENT_EQUIVALENTS = frozenset(_TUPLE_BUILDERS)


def equivalent(op_type: str, attrs: dict, inputs: list, outputs: list, node: str,
               extra: tuple[str, ...] = (), tuples: bool = False) -> TorchOp | None:
    """The PyTorch call that computes Relax op ``op_type`` with ``attrs`` (and non-tensor
    arguments ``extra``, as the op graph writes them: a clip's bounds) on tensors of ``inputs``
    (``(shape, dtype)`` each, in the call's order) giving ``outputs``; None where PyTorch has
    no equivalent here (another layout, asymmetric padding, another out dtype, batch norm in
    training or over another axis, an op not in :data:`EQUIVALENTS`). ``tuples``: also the ops
    of :data:`SEGMENT_EQUIVALENTS`, whose first slot takes a tuple of tensors."""
    builder = _BUILDERS.get(op_type) or (_TUPLE_BUILDERS.get(op_type) if tuples else None)
    if builder is None:
        return None
    call = _Call(op_type, attrs, inputs, outputs, node, tuple(extra))
    if op_type not in ("nn.batch_norm", "split") and (  # one output, of the op's own dtype
            len(outputs) != 1 or str(attrs.get("out_dtype") or call.dtype) not in
            ("", "void", call.dtype)):
        return None
    return builder(call)


def node_equivalent(node, tuples: bool = False) -> TorchOp | None:
    """:func:`equivalent` of an op-graph node (:class:`autoplace.graph.OpNode`)."""
    return equivalent(node.op_type, dict(node.attrs), [(t.shape, t.dtype) for t in node.inputs],
                      [(t.shape, t.dtype) for t in node.outputs], node.name, node.extra_args,
                      tuples)


def clip_bounds(extra) -> tuple[float, float] | None:
    """A clip's lower and upper bounds from its non-tensor arguments as the op graph writes them
    (``T.int64(0)``, ``T.float64("inf")``), or None where they are not two numbers."""
    bounds = [_scalar(e) for e in extra]
    return None if len(bounds) != 2 or None in bounds else (bounds[0], bounds[1])


def _scalar(text: str) -> float | None:
    """The value of a Relax scalar argument as the op graph writes it (``T.int64(6)``,
    ``T.float64("-inf")``), or None where it is none."""
    m = re.fullmatch(r"T\.\w+\((.+)\)", text.strip())
    try:
        return float(m.group(1).strip("\"'")) if m else None
    except ValueError:
        return None


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


def _taken(x, indices, axis: int, shape):
    """Relax's ``take`` (indices in range): the slices of ``x`` along ``axis`` at ``indices``
    (a tensor of any shape), giving ``shape``."""
    import torch

    return torch.index_select(x, axis, indices.reshape(-1).long()).reshape(shape)


def _cumsum(x, axis: int | None, dtype: str, exclusive: bool):
    """Relax's ``cumsum``: the running sum along ``axis`` (of the flattened tensor where None),
    in ``dtype``; ``exclusive``: each element's sum leaves the element out."""
    import torch

    x = x.reshape(-1) if axis is None else x
    out = torch.cumsum(x, 0 if axis is None else axis, dtype=getattr(torch, dtype))
    return out - x.to(out.dtype) if exclusive else out


# Ops whose PyTorch call gives a view, here with its elements copied: a call's result must not
# share an input's memory (torch_bridge's packed function), and the copy is then part of what
# is timed.
def _reshaped(x, shape):
    return x.reshape(shape).clone()


def _sliced(x, index):
    import torch

    return x[index].clone(memory_format=torch.contiguous_format)


def _expanded(x, shape):
    import torch

    return x.expand(shape).clone(memory_format=torch.contiguous_format)


def _permuted(x, axes):
    import torch

    return x.permute(axes).clone(memory_format=torch.contiguous_format)
