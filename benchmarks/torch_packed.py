"""The torch device's conv and matmul calls: plain (the weight reordered by oneDNN, or read by
MKL, on every call, as eager PyTorch runs them) against the weight packed once for oneDNN
(``autoplace.backend.torch_ops.packed_call``, result made contiguous), per distinct conv and
2-D-weight matmul workload of a model, and what the cost model charges (the faster of the two;
a build runs the faster where the weight is a constant, as every such weight of these models is).

Run: PYTHONPATH=. .venv/bin/python benchmarks/torch_packed.py [--models resnet18 bert ...]

Each call is timed as the cost model times it (``autoplace.profile.torch_runner``): one PyTorch
thread, no autograd, each call reading another copy of its inputs (as many as fill twice the
last-level cache), median of adaptive repeats. Packed timings include the copy back to a
contiguous result. Needs the ``bench`` extra for torchvision models.
"""

from __future__ import annotations

import argparse
import itertools
import platform

import numpy as np

import _models


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def bench(name: str) -> list[tuple]:
    """(workload, calls in the model, plain s, packed s) per distinct conv or 2-D-weight matmul
    workload of model ``name``."""
    import torch

    import autoplace
    from autoplace.backend.torch_ops import PACKABLE, one_thread, packed_call
    from autoplace.graph import OpGraph
    from autoplace.profile.measure import TimingPolicy
    from autoplace.profile.torch_runner import (cache_bytes, call_timing, random_torch_inputs,
                                                torch_op_for)

    model = _models.load(name)
    mod = autoplace.from_torch(model.module, [torch.from_numpy(x) for x in model.inputs])
    graph = OpGraph.from_relax(mod)
    policy, rows = TimingPolicy(), []
    for key, idx in graph.workloads().items():
        node = graph.nodes[idx[0]]
        op = torch_op_for(node) if node.op_type in PACKABLE else None
        if op is None or len(node.inputs) != 2:
            continue
        tensors = random_torch_inputs(node, np.random.default_rng(0))
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        copies = min(64, -(-2 * cache_bytes() // nbytes))
        sets = [tensors] + [[t.clone() for t in tensors] for _ in range(copies - 1)]
        calls = [packed_call(op, node.op_type, w, x.shape) for x, w in sets]
        if calls[0] is None:
            continue  # a batch of weights (attention's matmuls)
        with one_thread(), torch.no_grad():
            plain = call_timing(lambda c=itertools.cycle(sets): op.call(next(c)), policy)
            turns = itertools.cycle(list(zip(calls, sets)))
            packed = call_timing(lambda: (lambda c, s: c(s[0]))(*next(turns)), policy)
        shapes = " x ".join("x".join(map(str, t.shape)) for t in node.inputs)
        rows.append((f"{node.op_type} {shapes}", len(idx), plain.median_s, packed.median_s))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "bert"])
    args = ap.parse_args(argv)
    print(f"CPU: {_cpu()}; one PyTorch thread; times in us per call")
    for name in args.models:
        rows = bench(name)
        print(f"\n{name}: {len(rows)} distinct conv or 2-D-weight matmul workloads")
        width = max((len(r[0]) for r in rows), default=10)
        print(f"  {'workload'.ljust(width)}  calls    plain   packed  plain/packed")
        for text, n, plain, packed in rows:
            print(f"  {text.ljust(width)}  {n:5d}  {plain * 1e6:7.1f}  {packed * 1e6:7.1f}  "
                  f"{plain / packed:11.2f}x")
        total = [sum(n * r for _, n, *rs in rows for r in [rs[k]]) for k in (0, 1)]
        best = sum(n * min(p, q) for _, n, p, q in rows)
        print(f"  per inference: plain {total[0] * 1e3:.2f} ms, packed {total[1] * 1e3:.2f} ms, "
              f"the faster of each (charged and run) {best * 1e3:.2f} ms "
              f"({total[0] / best:.2f}x plain)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
