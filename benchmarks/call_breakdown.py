"""Where a small model's call goes on one device: numpy in and out, the VM, its kernels.

Run: PYTHONPATH=. .venv/bin/python benchmarks/call_breakdown.py [--device cuda:0]
     [--models zoo:mlp zoo:transformer ...] [--profile FILE ...] [--repeat 200] [--json FILE]

Per model, built for the one device as ``autoplace.compile`` builds a plan of it:

- ``call``: a call as a user makes it (numpy inputs uploaded, outputs downloaded; median of
  ``--repeat`` calls, the best of three rounds);
- ``vm``: the VM's function called on inputs already on the device, then a sync (the same
  median; nothing converted or downloaded);
- ``kernels``: the kernels the VM launched in one call and their host-side time
  (``vm.set_instrument``; on a GPU a launch returns before its kernel ends), and the VM's
  built-in calls (allocations, shape checks) beside them;
- ``pred``: what ``optimize`` charges the model alone on this device: its kernels (fused, with
  the kernel floor) and the call overhead of the device's profile.

The gap between ``call`` and ``vm`` is the inputs' and outputs' conversion and copies; between
``vm`` and the predicted kernels, what the VM does around them.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

import autoplace
from autoplace.profile.whole_model import vm_spans
from autoplace.run.overhead import median_call_s
from _timing import aligned


def _best(fn, args, repeat: int) -> float:
    return min(median_call_s(fn, args, repeat) for _ in range(3))


def _instrumented(vm, args, dev) -> tuple[int, float, int, float]:
    """(kernels launched, their host seconds, builtin calls, their seconds) of one call."""
    spans = vm_spans(vm, "main", args, dev)[0]
    kern = [s for k, v in spans.items() if not k.startswith("vm.builtin.") for s in v]
    built = [s for k, v in spans.items() if k.startswith("vm.builtin.") for s in v]
    return len(kern), sum(kern), len(built), sum(built)


def bench(name: str, device, cost_model, repeat: int) -> dict:
    import tvm

    import _models

    mod, inputs = _models.relax_and_inputs(name)
    res = autoplace.optimize(mod, [device], cost_model=cost_model, db=None, time_limit=2)
    run = res.compile(concurrent=False)
    dev = device.tvm_device()
    vm = run._vm  # the built model's own VM: its inputs, already on the device
    args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs] + list(run._consts)

    def synced():
        vm["main"](*args)
        dev.sync()

    call_s = _best(run, inputs, repeat)
    vm_s = _best(synced, [], repeat)
    launched, kernel_s, builtins, builtin_s = _instrumented(vm, args, dev)
    pred_call = res.delivery.call_s if res.delivery else 0.0
    pred_kernels = float(res.problem.cost[:, 0].sum())
    return {"model": name, "device": device.name, "kernels": launched,
            "charged_kernels": int((res.problem.cost[:, 0] > 0).sum()),
            "call_ms": call_s * 1e3, "vm_ms": vm_s * 1e3, "kernel_host_ms": kernel_s * 1e3,
            "builtins": builtins, "builtin_ms": builtin_s * 1e3,
            "pred_kernels_ms": pred_kernels * 1e3, "pred_call_ms": pred_call * 1e3,
            "pred_ms": (pred_kernels + pred_call) * 1e3, "overheads": list(res.overheads_note)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--models", nargs="+", default=["zoo:mlp", "zoo:transformer",
                                                    "zoo:inception", "zoo:mobilenet",
                                                    "zoo:resnet"])
    ap.add_argument("--profile", action="append", default=[])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    device = autoplace.Device.from_spec(args.device)
    cost_model = "auto"
    if args.profile:
        from autoplace.predict import MeasuredCostModel
        from autoplace.profile import DeviceProfile

        cost_model = MeasuredCostModel([DeviceProfile.load(p) for p in args.profile])
    rows = [bench(name, device, cost_model, args.repeat) for name in args.models]
    table = [["model", "kernels", "charged", "call", "vm", "kernels (host)", "builtins",
              "pred kernels", "pred call", "pred", "call/pred"]]
    for r in rows:
        table.append([r["model"], str(r["kernels"]), str(r["charged_kernels"]),
                      f"{r['call_ms']:.3f}", f"{r['vm_ms']:.3f}", f"{r['kernel_host_ms']:.3f}",
                      f"{r['builtins']} {r['builtin_ms']:.3f}", f"{r['pred_kernels_ms']:.3f}",
                      f"{r['pred_call_ms']:.3f}", f"{r['pred_ms']:.3f}",
                      f"{r['call_ms'] / r['pred_ms']:.2f}"])
    print(aligned(table, f"ms on {device.name}; medians. kernels: launched in one call "
                         "(charged: ops optimize charges); builtins: the VM's own calls"))
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
