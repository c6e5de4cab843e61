"""A full-size ResNet stage block tuned with defaults, against PyTorch eager at the same threads.

The block of ``first_run.py`` (two 3x3 convs, 64 channels, 56x56, batch norms, residual) on one
CPU device built for this host's CPU (``cpu:0``, the default target), tuned with
``autoplace.tune`` at ``--trials`` per kernel into ``--db`` (a second run with the same ``--db``
tunes nothing), then ``optimize(db=...)``'s build timed against TVM's default kernels and
PyTorch eager, all at TVM's default thread count (PyTorch set to the same). PyTorch is timed
first, in a process no TVM pool has started in yet.

Target of the issue (printed, not asserted): tuned <= 1.5x PyTorch eager (1.0x the stretch).

    PYTHONPATH=. .venv/bin/python benchmarks/res_stage_tuned.py --db out/res_stage.db
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import median_call_s  # noqa: E402
from first_run import held_out  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=Path("out/res_stage.db"))
    ap.add_argument("--trials", type=int, default=48, help="tuning trials per kernel")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    args.db.parent.mkdir(parents=True, exist_ok=True)
    import torch

    import autoplace
    from autoplace import Device
    from autoplace.backend.threads import tvm_threads

    threads = tvm_threads()
    torch.set_num_threads(threads)
    module, inputs = held_out()["res_stage"]
    module.eval()
    xs = [torch.from_numpy(x) for x in inputs]
    with torch.no_grad():
        eager = statistics.median(median_call_s(module, xs, 5, 1) for _ in range(args.rounds))
    mod = autoplace.frontends.from_torch(module, inputs)
    t = time.perf_counter()
    report = autoplace.tune(mod, [Device.cpu(0)], args.db, trials=args.trials)
    tuned_s = time.perf_counter() - t
    default = autoplace.optimize(mod, [Device.cpu(0)], db=None).compile(trial=False)
    res = autoplace.optimize(mod, [Device.cpu(0)], db=args.db)
    tuned = res.compile(trial=False)
    times = {"default": [], "tuned": []}
    for _ in range(args.rounds):  # interleaved
        times["default"].append(median_call_s(default, inputs, 3, 1))
        times["tuned"].append(median_call_s(tuned, inputs, 5, 1))
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                 if ln.startswith("Model name")), "?")
    import tvm

    print(f"host: {name} ({tvm.target.codegen.llvm_get_system_cpu()}); threads {threads}; "
          f"load {os.getloadavg()}")
    print(f"tuning: {args.trials} trials per kernel, {len(report.kernels)} kernels, "
          f"{tuned_s:.0f} s this run; kernels of the build {res.kernels}")
    print(f"PyTorch eager     {eager * 1e3:8.2f} ms")
    for k, v in times.items():
        m = statistics.median(v)
        print(f"TVM {k:<13} {m * 1e3:8.2f} ms  {m / eager:5.2f}x eager")
    print(f"tuned build predicted {res.predicted_latency_s * 1e3:.2f} ms "
          f"(m/p {statistics.median(times['tuned']) / res.predicted_latency_s:.2f})")


if __name__ == "__main__":
    main()
