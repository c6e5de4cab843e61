"""PyTorch's GPU kernels as a device beside TVM's on one GPU, against eager and Inductor.

PyTorch's GPU kernels (cuDNN, cuBLAS) as a placement target beside TVM's on the same GPU
(issue 42): the mixed plan over ``[cuda:0, torch:cuda:0]`` against PyTorch eager, ``torch.compile``
and TVM alone, on that GPU.

Run: .venv/bin/python -m benchmarks torch_cuda [--models resnet18 bert] [--repeats 50]
     [--db gpu.db] [--no-compile] [--place cuda]

Per model (``_models.py``; ``bert`` is the encoder written in torch, whatever is installed):

1. PyTorch eager on the GPU and ``torch.compile`` (Inductor, default mode; its first call, which
   compiles, reported apart), each called on numpy arrays, its inputs copied to the GPU and its
   outputs back, as autoplace's builds are called.
2. The model's TVM workloads profiled on ``cuda:0`` with TVM's default GPU schedules (dlight; the
   store ``--db`` keeps them, and a second run times nothing again): the costs the solver sees
   for TVM. PyTorch's calls are timed by ``optimize`` itself, as for any user.
3. ``autoplace.optimize`` over ``[cuda0, torch-cuda0]`` with those costs, and its build as
   ``res.compile()`` returns it (where the plan is a close call it has timed the contenders and
   keeps the fastest; the table names the plan it runs). TVM alone: every op on ``cuda0``.
4. All four timed turn by turn (:func:`autoplace.run.overhead.turns_s`), medians of
   ``--repeats`` calls after two warm-ups; m/p is the mixed build's measured over its predicted
   latency (the prediction leaves out the inputs' copy to the GPU and the outputs' back).
   Relative error: ||out - eager|| / ||eager|| over all outputs, against eager on the CPU.

``--place cpu`` runs the same on the CPU (``[cpu0, torch]``), to try the script where no GPU is.
"""

from __future__ import annotations

import argparse
import logging
import time

import _models
import torch

import autoplace
from autoplace import Device
from autoplace.run.overhead import turns_s

WARMUP = 2


def _torch_call(module, device):
    """A call of ``module`` on numpy arrays, as a build is called: inputs to ``device``, outputs
    back as numpy."""
    def call(*xs):
        with torch.no_grad():
            out = module(*[torch.from_numpy(x).to(device) for x in xs])
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [o.cpu().numpy() for o in outs]

    return call


def _profiled_costs(name, mod, tvm_dev: Device, db: str):
    """The costs of ``mod``'s workloads on ``tvm_dev`` as a campaign measures them (kept in
    store ``db``), roofline for what it could not time."""
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import (DeviceProfile, LocalRunner, ProfileStore, fingerprint,
                                   run_campaign)

    with ProfileStore(db) as store:
        run_campaign([(name, mod)], [tvm_dev], store, links=False, progress=False)
        profile = DeviceProfile.from_store(store, fingerprint(LocalRunner(tvm_dev).info()))
    return MeasuredCostModel({tvm_dev.name: profile})


def bench(name: str, place: str, repeats: int, db: str, compile_torch: bool) -> dict:
    model = _models.load(name, transformers=False)
    xs = model.inputs
    gpu = place == "cuda"
    tvm_dev = Device.cuda(0) if gpu else Device.cpu(0)
    torch_dev = Device.torch(place, 0)
    row: dict = {"model": name}

    with torch.no_grad():
        reference = _torch_call(model.module, "cpu")(*xs)
    mod = _models.relax_module(model)  # exported on the CPU, before the module moves
    module = model.module.to(torch_dev.torch_place)
    fns = {"eager": _torch_call(module, torch_dev.torch_place)}
    if compile_torch:
        t0 = time.perf_counter()
        try:
            compiled = _torch_call(torch.compile(module), torch_dev.torch_place)
            compiled(*xs)
            fns["torch.compile"] = compiled
            row["compile_first_s"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported, the rest still runs
            row["torch.compile"] = f"failed: {type(e).__name__}: {str(e)[:120]}"

    t0 = time.perf_counter()
    costs = _profiled_costs(name, mod, tvm_dev, db)
    row["profile_s"] = time.perf_counter() - t0
    g = autoplace.OpGraph.from_relax(mod)
    fns["TVM alone"] = autoplace.compile(mod, autoplace.place(g, [tvm_dev], [("*", tvm_dev.name)]))
    t0 = time.perf_counter()
    res = autoplace.optimize(mod, [tvm_dev, torch_dev], cost_model=costs, db=None)
    row["optimize_s"] = time.perf_counter() - t0
    mixed = res.compile()
    row["optimize_compile_s"] = time.perf_counter() - t0
    fns["mixed"] = mixed
    plan = mixed.plan
    row["on_torch"] = sum(d == torch_dev.name for d in plan.assignment)
    row["nodes"] = len(plan.assignment)
    row["predicted_s"] = plan.predicted_s
    row["chosen"] = getattr(getattr(mixed, "trial", None), "chosen", None) or "the plan"
    row["summary"] = res.summary()

    for label, fn in fns.items():
        for _ in range(WARMUP):
            out = fn(*xs)
        row[f"err {label}"] = _models.rel_error(out, reference)
    names = list(fns)
    medians, calls = turns_s([lambda f=fns[k]: f(*xs) for k in names], most=repeats,
                             budget_s=60.0, least=5)
    row.update({f"{k} ms": s * 1e3 for k, s in zip(names, medians)})
    row["calls"] = calls
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["resnet18", "bert"])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--db", default="torch_cuda.db", help="profile store of the TVM workloads")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--place", choices=["cuda", "cpu"], default="cuda")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.place == "cuda":
        print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    rows = []
    for name in args.models:
        row = bench(name, args.place, args.repeats, args.db, not args.no_compile)
        rows.append(row)
        print(f"\n== {name}: {row['on_torch']}/{row['nodes']} nodes on PyTorch; build runs "
              f"{row['chosen']}; profile {row['profile_s']:.0f} s, optimize + compile "
              f"{row['optimize_compile_s']:.0f} s" + (f", torch.compile first call "
                                                      f"{row['compile_first_s']:.0f} s"
                                                      if "compile_first_s" in row else ""))
        print(row["summary"])
        print({k: v for k, v in row.items() if k != "summary"})
    cols = ["eager", "torch.compile", "TVM alone", "mixed"]
    print("\nmodel | " + " | ".join(f"{c} ms" for c in cols)
          + " | best/mixed | m/p | rel err mixed | calls")
    for r in rows:
        ms = {c: r.get(f"{c} ms") for c in cols}
        best = min(v for c, v in ms.items() if c != "mixed" and v is not None)
        print(f"{r['model']} | " + " | ".join("-" if v is None else f"{v:.3f}"
                                             for v in ms.values())
              + f" | {best / ms['mixed']:.2f}x | {ms['mixed'] / 1e3 / r['predicted_s']:.2f}"
              + f" | {r['err mixed']:.1e} | {r['calls']}")
        if "torch.compile" in r:
            print(f"  torch.compile {r['torch.compile']}")


if __name__ == "__main__":
    main()
