"""One MetaSchedule round on one kernel, with MetaSchedule's default candidate build against
autoplace's (:func:`autoplace.tuning.campaign.build_candidate`), side by side.

Run: PYTHONPATH=. .venv/bin/python benchmarks/tuning_round.py [--model zoo:resnet]
     [--trials 16] [--rounds 2] [--device cpu:0]

MetaSchedule's local builder builds each round's candidates in a new worker process; its
default build imports TVM's tensor intrinsics there, which autoplace's build skips for CPU
targets. Each round here starts from an empty database (the same search each time, a fresh
XGBoost cost model), on the model's kernel with the most FLOPs, with the device's thread count;
the two builds alternate, ``--rounds`` times each. Prints each round's wall time and the median
of each build, and the ratio. The first round of a process also pays the intrinsics import in
the process itself (MetaSchedule's tuning context needs it): an extra round is run first and
not counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    from tvm.s_tir import meta_schedule as ms

    from autoplace import Device, zoo
    from autoplace.profile import LocalRunner
    from autoplace.tuning.campaign import (_ms_runner, _search_threads, _tune_one,
                                           build_candidate, device_kernels, tuning_target)
    from autoplace.tuning.records import open_database

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:resnet")
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    device = Device.from_spec(args.device)
    runner = LocalRunner(device)
    target = tuning_target(device, runner.info()["threads"])
    kernel = device_kernels([zoo.load(args.model.removeprefix("zoo:")).mod], target)[0]
    print(f"uptime: {os.getloadavg()}; {args.model} kernel {kernel.name} "
          f"({kernel.flops / 1e6:.0f} MFLOP), {args.trials} trials a round, target {target}")
    builds = {"MetaSchedule's default": None, "autoplace's": build_candidate}

    def one_round(f_build) -> float:
        builder = ms.builder.LocalBuilder(max_workers=_search_threads(), timeout_sec=120,
                                          **({} if f_build is None else {"f_build": f_build}))
        model = ms.CostModel.create("xgb", num_tuning_cores=_search_threads(),
                                    tree_method="auto")
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            t = time.perf_counter()
            _tune_one(kernel.workload, target, open_database(folder, create=True), folder,
                      kernel.name, args.trials, _ms_runner(runner), builder, model)
            return time.perf_counter() - t

    print(f"warm-up round (not counted): {one_round(build_candidate):.1f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in builds}
    for r in range(args.rounds):
        for name, f_build in builds.items():
            times[name].append(one_round(f_build))
            print(f"round {r + 1}, {name} build: {times[name][-1]:.1f} s", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, m in med.items():
        print(f"{name:>24} build: median {m:.1f} s a round")
    print(f"default / autoplace: {med[list(builds)[0]] / med[list(builds)[1]]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
