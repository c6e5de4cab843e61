"""PyTorch as a runtime device for ops TVM cannot import, against eager and TVM alone.

PyTorch as a runtime device (issue 42): models with ops TVM's importer lacks, run as a mixed
plan (TVM's kernels, and PyTorch's for those ops, called from the Relax VM), against PyTorch eager
and, where the model imports without PyTorch calls, TVM alone.

Run: .venv/bin/python -m benchmarks torch_device [--repeats 50] [--threads N]

Per model: eager PyTorch at its default threads and at one (timed first, before TVM has started
its thread pool), then TVM alone (``tvm.relax.frontend.torch.from_exported_program`` as it is:
"not importable" with the ops it lacks), the mixed plan ``autoplace.optimize(from_torch(model),
[cpu:0])`` (PyTorch runs only what TVM cannot import) and ``[cpu:0, torch:cpu]`` ("+ops": the
solver may put ordinary ops on PyTorch where they cost less) built and timed, each with m/p, its
measured over its predicted latency, and how many nodes it runs in PyTorch. Costs: this machine's (calibrated on first use),
TVM's default kernels; PyTorch calls timed here with the hand-off into PyTorch measured here.
Medians of ``--repeats`` calls after two warm-up calls, on numpy inputs. The outputs are checked
against eager (max abs error).
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
import torch

import autoplace
from autoplace import Device
from autoplace.run.overhead import median_call_s


class PoolHead(torch.nn.Module):
    """conv -> relu -> adaptive_max_pool2d (the importer lacks it) -> linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 16, 3)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.nn.functional.adaptive_max_pool2d(self.conv(x).relu(), 4).flatten(1))


class Prototypes(torch.nn.Module):
    """linear embedding -> cdist to 20 prototypes (importer lacks it: with more than 25 rows
    PyTorch computes it with matmuls, which import) -> softmin."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(64, 32)
        self.protos = torch.nn.Parameter(torch.randn(20, 32))

    def forward(self, x):
        return torch.softmax(-torch.cdist(self.embed(x), self.protos), dim=-1)


class Buckets(torch.nn.Module):
    """linear -> searchsorted into 15 boundaries (importer lacks it) -> one-hot sum."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.register_buffer("bounds", torch.linspace(-2, 2, 15))

    def forward(self, x):
        idx = torch.searchsorted(self.bounds, self.fc(x).contiguous())
        return torch.nn.functional.one_hot(idx, 16).float().sum(1)


class Active(torch.nn.Module):
    """conv -> nonzero (a shape the data gives) -> count per channel."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x):
        y = self.conv(x)
        return y.tanh(), torch.nonzero(y > 0.5)[:, 1].float().mean()


class SmallCNN(torch.nn.Module):
    """Everything importable: conv, relu, pool, conv, relu, global pool, linear."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))

    def forward(self, x):
        return self.body(x)


MODELS = {
    "adaptive_max_pool2d": (PoolHead, [(1, 3, 32, 32)]),
    "cdist": (Prototypes, [(16, 64)]),
    "searchsorted": (Buckets, [(8, 32)]),
    "nonzero": (Active, [(1, 3, 32, 32)]),
    "small CNN": (SmallCNN, [(1, 3, 32, 32)]),
}


def _median_s(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls, after two warm-up calls."""
    return median_call_s(fn, (), repeats, 2)


def _flat(out):
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,))]


def _mixed(mod, devices, ins, want, repeats):
    """(measured s, predicted s, PyTorch calls / nodes, max abs error) of ``optimize(mod,
    devices)``'s build."""
    res = autoplace.optimize(mod, devices)
    run = res.compile(trial=False)
    got = run(*ins)
    err = max(float(np.abs(np.asarray(g, dtype="float64") - w).max()) if w.size else 0.0
              for g, w in zip(got, want))
    on_torch = sum(d.startswith("torch") for d in res.plan.assignment)
    return (_median_s(lambda: run(*ins), repeats), res.predicted_latency_s,
            f"{on_torch}/{len(res.graph.nodes)}", err)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    threads = torch.get_num_threads()
    cases = {}
    for name, (cls, shapes) in MODELS.items():  # eager first: no TVM pool running yet
        model = cls().eval()
        xs = [torch.from_numpy(rng.standard_normal(s).astype("float32")) for s in shapes]
        with torch.no_grad():
            eager = _median_s(lambda: model(*xs), args.repeats)
            torch.set_num_threads(1)
            eager1 = _median_s(lambda: model(*xs), args.repeats)
            torch.set_num_threads(threads)
            want = [t.numpy() for t in _flat(model(*xs))]
        cases[name] = (model, xs, eager, eager1, want)
    print(f"torch {torch.__version__}; eager at {threads} threads and at 1; TVM at its default "
          f"threads; PyTorch calls from the VM on 1 thread; repeats {args.repeats}; ms\n")
    header = ("model", "eager", "eager 1T", "TVM alone", "mixed", "m/p", "on torch",
              "+ops mixed", "m/p", "on torch", "max err")
    rows = [header]
    for name, (model, xs, eager, eager1, want) in cases.items():
        ins = [x.numpy() for x in xs]
        exported = autoplace.frontends.export_torch(model, xs)
        try:
            from tvm.relax.frontend.torch import from_exported_program

            plain = from_exported_program(exported)
            alone_run = autoplace.optimize(plain, [Device.cpu(0)]).compile(trial=False)
            alone = f"{_median_s(lambda: alone_run(*ins), args.repeats) * 1e3:.3f}"
        except AssertionError as e:
            alone = "not importable" if "Unsupported" in str(e) else f"error: {e}"
        mod = autoplace.from_torch(model, xs)
        m1, p1, n1, e1 = _mixed(mod, [Device.cpu(0)], ins, want, args.repeats)
        m2, p2, n2, e2 = _mixed(mod, [Device.cpu(0), Device.torch()], ins, want, args.repeats)
        rows.append((name, f"{eager * 1e3:.3f}", f"{eager1 * 1e3:.3f}", alone,
                     f"{m1 * 1e3:.3f}", f"{m1 / p1:.2f}", n1, f"{m2 * 1e3:.3f}",
                     f"{m2 / p2:.2f}", n2, f"{max(e1, e2):.1e}"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


if __name__ == "__main__":
    main()
