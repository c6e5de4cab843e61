"""What one call from the Relax VM into a runtime (PyTorch, ONNX Runtime) costs when a model's
other ops ran just before it and took the runtime's code and state out of the caches.

:func:`cold_call_seconds` builds a VM function that, before each call, writes a buffer as large
as what the model's other ops touch, and reads a clock (a registered function the VM calls) right
before and right after the call, then twice more with nothing between. The call's cost is the
median of the differences of the two spans. Only the call lies between the clock reads: the
writes, which take far longer than a call once they pass the last-level cache, are not in the
figure and add none of their noise to it (a difference of two chains' whole times, writes
included, moved by more than the call itself). The clock read right before the call runs some
of the Python that a call into a Python-registered function runs too, so the figure may miss a
little of a cold call's cost.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np

_names = itertools.count()


def cold_call_seconds(emit_call: Callable, ty, data: np.ndarray, between_bytes: int, *,
                      samples: int = 8, rounds: int = 3, target: str = "llvm") -> float:
    """Median seconds the VM spends in one call that ``emit_call(bb, i, x)`` emits (the ``i``-th,
    on Relax variable ``x`` of tensor type ``ty``; it returns the call's result, of type ``ty``)
    after ``between_bytes`` were written, less two clock reads with nothing between them right
    after it; ``samples`` calls a run, ``rounds`` runs after a first (discarded) one. ``data``:
    the first call's input, on the CPU. Whatever building or running raises is raised."""
    import tvm
    from tvm import relax

    clock: list[float] = []
    name = f"autoplace.cold_calls.clock_{next(_names)}"
    tvm.register_global_func(name, lambda: clock.append(time.perf_counter()), override=True)
    size = max(1, int(between_bytes) // 4)
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", ty), relax.Var("w", relax.TensorType([size], "float32"))
    read = relax.Call(relax.ExternFunc(name), [], ty_args=[relax.ObjectType()])
    with bb.function("main", [x, w]):  # no dataflow block: the VM runs each binding in order
        v = x
        for i in range(samples):
            if between_bytes:
                w = bb.emit(relax.op.add(w, relax.const(0.5, "float32")))
            for with_call in (True, False):
                bb.emit(read)
                if with_call:
                    v = bb.emit(emit_call(bb, i, v))
                bb.emit(read)
        bb.emit_func_output(relax.Tuple([v, w]))
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target=target), tvm.cpu())
    args = [tvm.runtime.tensor(np.ascontiguousarray(data), tvm.cpu()),
            tvm.runtime.tensor(np.zeros(size, "float32"), tvm.cpu())]
    spans: list[float] = []
    for r in range(rounds + 1):
        clock.clear()
        vm["main"](*args)
        if r:  # the first run loads the code and makes the runtime's state
            reads = np.asarray(clock).reshape(samples, 2, 2)
            inside = reads[:, :, 1] - reads[:, :, 0]
            spans.extend(inside[:, 0] - inside[:, 1])
    return float(np.median(spans))

