"""Every op has a place to run: models of many families placed with the defaults, against eager.

Per model (``_models.py``: the benchmark's torchvision CNNs and BERT encoders, and families no
other benchmark here holds: decoders whose position ids and causal mask come from an attention
mask, audio encoders opening on conv1d, token mixing by FFT), as a new user calls autoplace:

1. Import (``autoplace.from_torch``): the ops, the PyTorch calls and why each runs there (the
   importer lacks the op, fails on it, or it computes complex numbers), and the ops no runtime
   device takes (TVM must build them).
2. ``optimize_module(model, inputs)`` with every default (this machine's CPU, ``torch:cpu`` and
   ``ort:cpu`` where installed): the ops on each device, what the module runs, the build's and
   the contenders' latency, the build's measured/predicted, its relative error against eager,
   and the seconds to the first output. A model whose import or plan fails says where and why.

Run: .venv/bin/python -m benchmarks coverage [--models gpt2 llama ...] [--threads 1]
     [--import-only]

Needs the ``bench`` extra (torchvision, transformers, onnxruntime): a model whose package is
missing says so. Each model runs in this process, one after another (a model's calibration is
cached per host: the first run of a model times more than a second).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter

import numpy as np

import _models

DEFAULT = ("resnet18", "mobilenet_v3_small", "densenet121", "bert", *_models.OTHERS)


def imported(model) -> dict:
    """The import of ``model``: seconds, ops, PyTorch calls by reason, and the op types only a
    TVM device may run."""
    from autoplace import devices
    from autoplace.frontends import from_torch
    from autoplace.graph import OpGraph

    t = time.perf_counter()
    mod = from_torch(model.module, model.inputs)
    graph = OpGraph.from_relax(mod)
    runtimes = [d for d in devices.local_devices() if d.runtime != "tvm"]
    calls = Counter(dict(n.attrs).get("why", "") for n in graph.nodes if n.is_torch)
    tvm_only = Counter(n.op_type for n in graph.nodes
                       if not n.is_torch and not any(d.can_run(n.op_type) for d in runtimes))
    return {"s": time.perf_counter() - t, "ops": len(graph.nodes), "calls": dict(calls),
            "tvm_only": dict(tvm_only)}


def placed(model, threads: int) -> dict:
    """``optimize_module`` of ``model`` with the defaults: devices, what runs, times, error."""
    import torch

    from autoplace.pytorch.module import optimize_module

    torch.set_num_threads(threads)
    t = time.perf_counter()
    module = optimize_module(model.module, model.inputs)
    first = time.perf_counter() - t
    res = module.result
    with torch.no_grad():
        want = model.module(*[torch.from_numpy(x) for x in model.inputs])
    got = module(*[torch.from_numpy(x) for x in model.inputs])
    build_s = module.times.get("build")
    return {"first_s": first, "devices": dict(Counter(res.plan.assignment)), "runs": module.runs,
            "times": dict(module.times), "predicted": res.predicted_latency_s,
            "mp": build_s / res.predicted_latency_s if build_s else None,
            "error": _models.rel_error(_flat(got), _flat(want))}


def _flat(v) -> list:
    return [np.asarray(x) for x in (v if isinstance(v, (tuple, list)) else [v])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(DEFAULT), metavar="NAME",
                    help=f"models of _models.py (default: {' '.join(DEFAULT)})")
    ap.add_argument("--threads", type=int, default=1, help="PyTorch's and the module's threads")
    ap.add_argument("--import-only", action="store_true", help="import and list; place nothing")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        print(f"== {name}", flush=True)
        row = {"name": name}
        try:
            model = _models.load(name)
            row["import"] = imported(model)
            if not args.import_only:
                row["placed"] = placed(model, args.threads)
        except Exception as e:  # noqa: BLE001 - a model that fails is a row saying why
            traceback.print_exc()
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(row)
        _print_row(row)
    print()
    print(render(rows))
    return 0 if all("error" not in r for r in rows) else 1


def _ms(s) -> str:
    return "-" if s is None else f"{s * 1e3:.3g}"


def _print_row(row: dict) -> None:
    imp = row.get("import")
    if imp:
        for why, n in imp["calls"].items():
            print(f"   PyTorch call x{n}: {why}")
        print(f"   only TVM runs: {imp['tvm_only'] or 'none'}")


def render(rows) -> str:
    head = ["model", "ops", "PyTorch calls", "ops per device", "runs", "build ms", "eager ms",
            "ORT ms", "m/p", "rel. error", "first output s"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        if "error" in r and "import" not in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * (len(head) - 2))
            continue
        imp, p = r["import"], r.get("placed")
        calls = sum(imp["calls"].values())
        cells = [r["name"], str(imp["ops"]), str(calls)]
        if p is None:
            cells += [r.get("error", "not placed")] + ["-"] * (len(head) - 4)
        else:
            t = p["times"]
            cells += [", ".join(f"{d} {n}" for d, n in sorted(p["devices"].items())), p["runs"],
                      _ms(t.get("build")), _ms(t.get("pytorch eager")), _ms(t.get("onnxruntime")),
                      "-" if p["mp"] is None else f"{p['mp']:.2f}", f"{p['error']:.1e}",
                      f"{p['first_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
