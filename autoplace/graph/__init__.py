"""The op graph of a Relax function: nodes are op calls, edges are tensors."""

from autoplace.graph.flops import count_flops
from autoplace.graph.fusion import anchor, fused_groups
from autoplace.graph.opgraph import (
    Edge,
    GraphInput,
    OpGraph,
    OpNode,
    TensorInfo,
    UnsupportedModelError,
)

__all__ = ["Edge", "GraphInput", "OpGraph", "OpNode", "TensorInfo", "UnsupportedModelError",
           "anchor", "count_flops", "fused_groups"]
