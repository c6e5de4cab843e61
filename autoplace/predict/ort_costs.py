"""Costs of an ONNX Runtime device (:meth:`autoplace.Device.onnxruntime`), from its ops' timings
in context (:func:`autoplace.profile.ort_timings.time_ort_device`).

A node the device runs costs what its nodes took in its segment's optimized graph; entering and
leaving a segment is charged on the links between the device and TVM's (:meth:`edge_s`), not
per node: a longer segment pays it fewer times (the model's own inputs and outputs, which cross
no link, in the cost of the nodes that read or give them). TVM devices cannot run a PyTorch call, and the
device runs nothing it could not export (``inf``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from autoplace.devices import Device
    from autoplace.graph import OpGraph
    from autoplace.profile.ort_timings import OrtTimings


class OrtCostModel:
    """Seconds per node on one ORT device, as its segments' profiles split them."""

    source = "ort-profiled"
    #: Relative spread of an op's cost in context: what the op costs depends on which of its
    #: neighbours the plan puts in the same segment, which the profile of the longest runs
    #: does not see.
    spread = 0.3

    def __init__(self, timings: OrtTimings):
        self.timings = timings

    @property
    def edge_s(self) -> float:
        """Seconds one tensor entering or leaving a segment costs, beyond its bytes."""
        return self.timings.edge_s

    @property
    def edge_byte_s(self) -> float:
        """Seconds a byte of a tensor entering or leaving a segment costs (ORT's reorders)."""
        return self.timings.edge_byte_s

    def edge(self, nbytes: float) -> float:
        """Seconds a tensor of ``nbytes`` entering or leaving a segment costs."""
        return self.edge_s + nbytes * self.edge_byte_s

    def predict(self, graph: OpGraph, device: Device) -> np.ndarray:
        if device.runtime != "ort":
            return np.full(len(graph.nodes), np.inf)
        if len(self.timings.ops) != len(graph.nodes):
            raise ValueError("these ORT timings are of another model: "
                             "time_ort_device(mod, graph, device) first")
        cost = np.array([self.timings.ops[i] for i in range(len(graph.nodes))], dtype=float)
        # the model's own inputs and outputs enter and leave a segment too (no link charges
        # them): at each input's first consumer, and at each output
        for gin in graph.inputs:
            if gin.consumers and not gin.is_weight:
                cost[gin.consumers[0]] += self.edge(gin.tensor.nbytes)
        for n in graph.nodes:
            if n.is_output:
                cost[n.index] += self.edge(n.out_bytes)
        return cost

    def fused_cost(self, graph: OpGraph, device: Device, chain) -> float:
        """ORT fuses in its own graph: no chain is charged as one call."""
        return np.inf

    def sources(self, graph: OpGraph, device: Device) -> list[str]:
        cost = self.predict(graph, device)
        return [self.source if np.isfinite(c) else "unsupported" for c in cost]

    def describe(self, graph: OpGraph) -> str:
        from autoplace.backend.ort_segments import level_text

        t = self.timings
        tried = ", ".join(f"{level_text(lv)} on {n} thread(s) {v * 1e6:.0f} us"
                          for (lv, n), v in t.variants_s.items())
        runs = sum(np.isfinite(v) for v in t.ops.values())
        return (f"{runs} op(s) priced in {t.segments} ONNX Runtime segment(s) by its profiler "
                f"at {t.session_threads} intra-op thread(s), graph optimization "
                f"'{level_text(t.level)}' "
                f"(measured fastest on the largest segment: {tried}); + {t.edge_s * 1e6:.1f} us "
                "per tensor entering or leaving a segment (half a call from the VM: "
                f"{t.call_s * 1e6:.1f} us, with {t.between_bytes / 2**20:.1f} MB written "
                f"between two calls) and {t.edge_byte_s * 1e12:.0f} us per MB of it "
                "(ORT's reorders at the edges)"
                + ("; timed by an earlier run of the same graph on this host" if t.kept else ""))
