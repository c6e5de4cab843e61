"""``torch.compile(model, backend="autoplace")`` timed against eager, Inductor and numpy calls.

PyTorch's door, timed: ``torch.compile(model, backend="autoplace")`` against the same plan
called on numpy arrays, PyTorch eager and ``torch.compile`` with Inductor, at one thread count;
and the per-call cost of ``optimize_module``'s wrapper over the raw build on a tiny model.

Run: .venv/bin/python -m benchmarks torch_door [--rounds 7] [--models resnet bert]
     [--db PATH]

Models: zoo ``resnet`` (a small ResNet, 1x3x32x32; torchvision's resnet18 where torchvision is
installed: ``--models resnet18``) and a BERT-like encoder (``torch.nn.TransformerEncoder``,
4 layers, d_model 256, 4 heads, FFN 1024, GELU, batch 1, seq 128). Each is timed on the
backend's own build (``torch.compile`` with autoplace: torch tensors in and out through
DLPack), the same build called with numpy arrays (``CompiledModel.__call__``, the
``res.compile()`` path), eager, and Inductor; per call, the median over ``--rounds`` rounds, the
runners interleaved in each round (``settle()`` between runners: TVM's idle workers spin).
``torch.set_num_threads`` is TVM's thread count. "first call" is the wall time of the first call
of ``torch.compile``'d model: Dynamo's trace, export, import, optimize (costing, solving,
baselines, trial) and build.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

import autoplace
from autoplace.backend import settle, tvm_threads


def _per_call_s(fn, budget_s: float = 0.25, min_calls: int = 3) -> float:
    """Seconds per call of ``fn``, over about ``budget_s`` (after one warm-up call)."""
    fn()
    t0, n = time.perf_counter(), 0
    while n < min_calls or time.perf_counter() - t0 < budget_s:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def _interleaved(runners: dict, rounds: int, budget_s: float) -> dict[str, float]:
    """Median seconds per call of each runner over ``rounds`` rounds, interleaved."""
    times = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            settle()
            times[name].append(_per_call_s(fn, budget_s))
    return {name: statistics.median(v) for name, v in times.items()}


def resnet():
    model, shapes = autoplace.zoo.torch_models.resnet()
    return "zoo resnet 1x3x32x32", model, (torch.randn(*shapes[0]),)


def resnet18():
    import torchvision

    return "torchvision resnet18 1x3x224x224", torchvision.models.resnet18().eval(), \
        (torch.randn(1, 3, 224, 224),)


def bert():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, activation="gelu",
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    return "BERT-like encoder 4x256, seq 128", model, (torch.randn(1, 128, 256),)


MODELS = {"resnet": resnet, "resnet18": resnet18, "bert": bert}


def time_model(make, rounds: int, db) -> list[str]:
    torch._dynamo.reset()
    name, model, inputs = make()
    with torch.no_grad():
        want = model(*inputs)
        backend = autoplace.dynamo_backend(strict=True, **({} if db is None else {"db": db}))
        fast = torch.compile(model, backend=backend)
        t0 = time.perf_counter()
        got = fast(*inputs)
        first_s = time.perf_counter() - t0
        err = float((got - want).norm() / want.norm())
        [record] = backend.graphs
        build = record.module._build
        arrays = [x.numpy() for x in inputs]
        runners = {"autoplace backend (torch)": lambda: fast(*inputs),
                   "its module, called directly": lambda: record.module(*inputs),
                   "same build, numpy": lambda: build(*arrays),
                   "PyTorch eager": lambda: model(*inputs)}
        inductor_note = ""
        try:
            inductor = torch.compile(model)  # beside the autoplace entry: no reset
            t0 = time.perf_counter()
            inductor(*inputs)
            inductor_note = f"Inductor first call {time.perf_counter() - t0:.1f} s"
            runners["torch.compile (Inductor)"] = lambda: inductor(*inputs)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            inductor_note = f"Inductor failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        again = fast(*inputs)  # still the autoplace build, not Inductor's
        assert len(backend.graphs) == 1 and torch.allclose(again, got), "recompiled"
        medians = _interleaved(runners, rounds, budget_s=0.3)
    plan = record.module.plan
    lines = [f"{name}: first call (trace+export+optimize+build) {first_s:.1f} s; {inductor_note}; "
             f"plan: {', '.join(d.name for d in plan.used_devices())}"
             f"{f' ({plan.threads} threads)' if plan.threads else ''}; rel. error vs eager "
             f"{err:.1e}; kernels {record.module.result.kernels}"]
    base = medians["PyTorch eager"]
    for runner, s in medians.items():
        lines.append(f"  {runner:28s} {s * 1e3:9.3f} ms   {base / s:5.2f}x eager")
    return lines


def wrapper_overhead(rounds: int) -> list[str]:
    """Where the call is all overhead (Linear(16, 16) on 1x16), and where the tensors are large
    and the op cheap (ReLU on 1x64x56x56, 784 KB in and out: the numpy path copies both)."""
    import tvm

    torch.manual_seed(0)
    lines = []
    for label, model, x in (("Linear(16,16) on 1x16", torch.nn.Linear(16, 16), torch.randn(1, 16)),
                            ("ReLU on 1x64x56x56", torch.nn.ReLU(), torch.randn(1, 64, 56, 56))):
        m = autoplace.optimize_module(model.eval(), (x,), [autoplace.Device.cpu(0)],
                                      cost_model=autoplace.RooflineCostModel(), db=None,
                                      eager_fallback=False)
        build, arr, tx = m._build, x.numpy(), tvm.runtime.from_dlpack(x)
        runners = {"raw build (TVM tensors)": lambda: build.call_tensors(tx),
                   "numpy path (CompiledModel)": lambda: build(arr),
                   "numpy path, torch in/out": lambda: torch.from_numpy(build(x.numpy())[0]),
                   "module (torch, DLPack)": lambda: m(x)}
        med = _interleaved(runners, rounds, budget_s=0.1)
        raw = med["raw build (TVM tensors)"]
        lines.append(f"per call, {label} (target: module <= 10 us over the raw build):")
        for runner, s in med.items():
            lines.append(f"  {runner:28s} {s * 1e6:8.2f} us   +{(s - raw) * 1e6:6.2f} us over raw")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=["resnet", "bert"], choices=MODELS)
    parser.add_argument("--db", help="tuning records for the backend's builds (optimize's db=; "
                                     "default: optimize's own default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    threads = tvm_threads()
    torch.set_num_threads(threads)
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines()
        if l.startswith("Model name")), "?")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"CPU: {cpu}; TVM threads {threads}, torch threads {torch.get_num_threads()}; "
          f"torch {torch.__version__}, autoplace {autoplace.__version__}")
    print("\n".join(wrapper_overhead(args.rounds)))
    for name in args.models:
        try:
            print("\n".join(time_model(MODELS[name], args.rounds, args.db)))
        except ImportError as e:
            print(f"{name}: skipped ({e})")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
