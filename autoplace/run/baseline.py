"""What a pipeline is compared with: the whole model on one device, called on each input in turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.devices import Device
from autoplace.graph.opgraph import OpGraph
from autoplace.manual import place
from autoplace.run.compile import compile

if TYPE_CHECKING:
    import tvm


def time_sequential(fn: Callable[..., Any], inputs: Iterable[Sequence[np.ndarray]]):
    """Call ``fn(*x)`` for each input in turn; returns ``(outputs, seconds)``."""
    inputs = list(inputs)
    t0 = time.perf_counter()
    outs = [fn(*x) for x in inputs]
    return outs, time.perf_counter() - t0


def random_inputs_like(examples: Sequence[np.ndarray], n: int, rng: np.random.Generator):
    """``n`` inputs shaped like ``examples`` (one array per parameter): floating arrays drawn
    from a standard normal, the others (indices, masks) kept as given."""
    return [[rng.standard_normal(a.shape).astype(a.dtype) if np.issubdtype(a.dtype, np.floating)
             else a for a in examples] for _ in range(n)]


def fastest_single_device(mod: tvm.IRModule, graph: OpGraph, devices: Sequence[Device],
                          inputs: Sequence[Sequence[np.ndarray]]):
    """The whole model built for each device alone and run on ``inputs`` after one warm-up call:
    ``(run, outputs, seconds)`` of the fastest, a pipeline's sequential baseline."""
    best = None
    for d in devices:
        run = compile(mod, place(graph, devices, [("*", d.name)]))
        run(*inputs[0])
        outs, sec = time_sequential(run, inputs)
        if best is None or sec < best[2]:
            best = (run, outs, sec)
    return best
