"""Floating-point operation counts of Relax ops, from shapes and attributes alone.

Counts are the usual analytical ones (a multiply-add is 2 FLOPs). Ops that only move data
(reshape, transpose, concat, slicing, copies) count 0: their cost is in the bytes they move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

# FLOPs per output element for elementwise ops that are more than one instruction.
_PER_ELEMENT = {
    "sigmoid": 4, "tanh": 6, "exp": 4, "log": 4, "sqrt": 2, "rsqrt": 3, "erf": 8,
    "gelu": 10, "gelu_tanh": 12, "silu": 5, "softplus": 6, "power": 4, "divide": 1,
}
# FLOPs per input element: softmax = max, subtract, exp, sum, divide.
_NORMALIZE = {"softmax": 5, "log_softmax": 6, "layer_norm": 7, "rms_norm": 5, "group_norm": 7,
              "batch_norm": 2, "instance_norm": 7}
_REDUCE = {"sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin"}
_POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d"}
_DATA_MOVEMENT = {
    "reshape", "permute_dims", "transpose", "concat", "split", "strided_slice", "take", "flatten",
    "squeeze", "expand_dims", "broadcast_to", "astype", "layout_transform", "to_vdevice",
    "hint_on_device", "tile", "repeat", "gather_elements", "gather_nd", "scatter_elements",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "dynamic_strided_slice",
}


def _prod(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def count_flops(
    op: str,
    in_shapes: Sequence[Sequence[int]],
    out_shapes: Sequence[Sequence[int]],
    attrs: Mapping[str, object],
) -> float:
    """FLOPs of one call of Relax op ``op`` (``"relax.nn.conv2d"`` or ``"nn.conv2d"``).

    >>> count_flops("relax.matmul", [(4, 8), (8, 16)], [(4, 16)], {})
    1024.0
    """
    short = op.removeprefix("relax.")
    base = short.rsplit(".", 1)[-1]
    out = sum(_prod(s) for s in out_shapes)
    first_in = _prod(in_shapes[0]) if in_shapes else 0

    if base == "matmul":
        return 2.0 * out * in_shapes[0][-1]
    if base in ("attention", "attention_bias"):  # (B, S, H, D) query, (B, S_kv, H, D) key
        (b, s, h, d), s_kv = in_shapes[0], in_shapes[1][1]
        scores = b * h * s * s_kv
        return 2.0 * scores * d + 2.0 * out * s_kv + _NORMALIZE["softmax"] * scores
    if base in ("conv1d", "conv2d", "conv3d"):
        weight = in_shapes[1]
        layout = str(attrs.get("kernel_layout") or "OIHW")
        o_axis = layout.index("O") if "O" in layout and len(layout) == len(weight) else 0
        return 2.0 * out * _prod(weight) / weight[o_axis]
    if base in ("conv1d_transpose", "conv2d_transpose"):
        weight = in_shapes[1]  # (I, O/groups, k...): each input element scatters into O/g * k outputs
        return 2.0 * first_in * _prod(weight) / weight[0]
    if base in _POOL:
        window = attrs.get("pool_size") or (1,)
        return float(out * _prod(window))
    if base.startswith("adaptive_avg_pool") or base in _REDUCE:
        return float(first_in)
    if base in _NORMALIZE:
        return float(_NORMALIZE[base] * first_in)
    if base in _DATA_MOVEMENT:
        return 0.0
    return float(_PER_ELEMENT.get(base, 1) * out)
