"""The torch device's conv and matmul calls per workload: plain against weights packed once.

The torch device's conv and matmul calls: plain (the weight reordered by oneDNN, or read by
MKL, on every call, as eager PyTorch runs them) against the weight packed once for oneDNN
(``autoplace.backend.torch_calls.packed_call``, result made contiguous), per distinct conv and
2-D-weight matmul workload of a model, and what the cost model charges (the faster of the two;
a build runs the faster where the weight is a constant, as every such weight of these models is).

Run: .venv/bin/python -m benchmarks torch_packed [--models resnet18 bert ...]

Each call is timed as the cost model times it (``torch_runner.time_plain_and_packed``): one PyTorch
thread, no autograd, each call reading another copy of its inputs (as many as fill twice the
last-level cache), median of adaptive repeats. Packed timings include the copy back to a
contiguous result. Needs the ``bench`` extra for torchvision models.
"""

from __future__ import annotations

import argparse

import _models


def bench(name: str) -> list[tuple]:
    """(workload, calls in the model, plain s, packed s) per distinct conv or 2-D-weight matmul
    workload of model ``name``."""
    import torch

    import autoplace
    from autoplace.backend.torch_calls import PACKABLE
    from autoplace.graph import OpGraph
    from autoplace.profile.measure import TimingPolicy
    from autoplace.profile.torch_runner import time_plain_and_packed, torch_op_for

    model = _models.load(name)
    mod = autoplace.from_torch(model.module, [torch.from_numpy(x) for x in model.inputs])
    graph = OpGraph.from_relax(mod)
    rows = []
    for idx in graph.workloads().values():
        node = graph.nodes[idx[0]]
        op = torch_op_for(node) if node.op_type in PACKABLE else None
        if op is None:
            continue
        plain, packed = time_plain_and_packed(node, op, TimingPolicy())
        if packed is None:
            continue  # a batch of weights (attention's matmuls)
        shapes = " x ".join("x".join(map(str, t.shape)) for t in node.inputs)
        rows.append((f"{node.op_type} {shapes}", len(idx), plain.median_s, packed.median_s))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "bert"])
    args = ap.parse_args(argv)
    from autoplace.profile.measure import _cpu_model

    print(f"CPU: {_cpu_model()}; one PyTorch thread; times in us per call")
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
