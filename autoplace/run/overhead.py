"""Measure what one pipeline stage costs per input beyond its ops: hand-off, queues, the call."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.plan import Plan
from autoplace.run.pipeline import Pipeline, compile_stage
from autoplace.run.split import split

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageOverhead:
    """Time per input of ``k = 1..len(seconds)`` trivial stages, and the fit
    ``seconds[k - 1] ~= fixed_s + per_stage_s * k`` (least squares over ``k >= 2``: one stage is
    called directly, with no hand-off)."""

    devices: tuple[str, ...]
    seconds: tuple[float, ...]
    fixed_s: float
    per_stage_s: float

    def __str__(self) -> str:
        per_k = " ".join(f"{s * 1e6:.0f}" for s in self.seconds)
        return (f"{'+'.join(self.devices)}: {self.fixed_s * 1e6:.1f} us + "
                f"{self.per_stage_s * 1e6:.1f} us * stages  (us per input, k=1..: {per_k})")


def _chain_module(k: int, size: int):
    """``main(x)``: ``k`` chained adds of a tiny float32 tensor."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((size,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for _ in range(k):
                v = bb.emit(relax.op.add(v, v))
            out = bb.emit_output(v)
        bb.emit_func_output(out)
    return tvm.IRModule({"main": bb.get()["main"]})


def measure_stage_overhead(devices: Sequence[Device], *, max_stages: int = 6,
                           inputs: int = 200, rounds: int = 3, size: int = 4) -> StageOverhead:
    """Measure what a stage costs the pipeline beyond its kernels.

    For ``k = 1..max_stages``, a chain of ``k`` one-add stages on ``size``-element tensors runs
    ``inputs`` inputs ``rounds`` times (the best round counts); stage ``j`` is on
    ``devices[j % len(devices)]``. Spread over two devices, as a plan's stages are,
    ``per_stage_s`` is the hand-off part of :data:`autoplace.solve.problem.STAGE_OVERHEAD_S`; on one device the
    hand-offs cost less (the stages take turns on one lock instead of waking each other across
    cores). ``k = 1`` is a direct call, timed for reference and left out of the fit.
    """
    devices = list(devices)
    if not devices or max_stages < 3:
        raise ValueError("measure_stage_overhead needs a device and max_stages >= 3 (the fit "
                         "is over pipelines of 2 or more stages)")
    # Every stage is main(a) -> (a + a,): one executable per device serves all of them.
    one = _chain_module(1, size)
    graph = OpGraph.from_relax(one)
    exes = {}
    for d in devices:
        plan = Plan.from_assignment(graph, [d], [d.name], stages=(0,), objective="throughput")
        exes[d.name] = compile_stage(split(one, plan).stages[0])
    xs = [[np.full(size, 1.0, dtype=np.float32)] for _ in range(inputs)]
    seconds = []
    for k in range(1, max_stages + 1):
        mod = _chain_module(k, size)
        graph = OpGraph.from_relax(mod)
        names = [devices[j % len(devices)].name for j in range(k)]
        plan = Plan.from_assignment(graph, devices, names, stages=tuple(range(k)),
                                    objective="throughput")
        staged = split(mod, plan)
        with Pipeline(staged, [exes[s.device.name] for s in staged.stages]) as pipe:
            pipe.run(xs[:8])  # warm-up
            best = min(_timed(pipe, xs) for _ in range(rounds))
        seconds.append(best / inputs)
        log.info("%d stages: %.1f us per input", k, seconds[-1] * 1e6)
    per_stage, fixed = np.polyfit(np.arange(2, max_stages + 1), seconds[1:], 1)
    return StageOverhead(tuple(d.name for d in devices), tuple(seconds), float(fixed),
                         float(per_stage))


def _timed(pipe: Pipeline, xs) -> float:
    pipe.run(xs)
    return pipe.stats.wall_s
