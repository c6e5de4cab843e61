"""Per zoo model: import and build times, numerics under placements, predicted vs measured latency.

Run: .venv/bin/python benchmarks/zoo_placements.py [--repeat N] [--models a,b] [--device cpu:0 ...]
By default the two "devices" are tvm.cpu(0) and tvm.cpu(1): the same cores, so a multi-device plan
cannot be faster for real; the measured columns show what the cross-device copies cost. With
``--device cpu:0 --device cuda:0`` it checks CPU+GPU builds. "single ms" is the first device alone,
"alt"/"rand" are plans alternating / drawn at random over the devices (their error is against the
single-device build), "plan" is what optimize chose with the default cost model.
"""

import argparse
import time

import numpy as np
from _timing import median_call_s as _time

import autoplace
from autoplace import zoo


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--device", action="append", help="cpu:N or cuda:N (default cpu:0 cpu:1)")
    args = ap.parse_args()
    devs = [autoplace.Device.from_spec(s) for s in args.device or ["cpu:0", "cpu:1"]]
    rng = np.random.default_rng(0)
    print(f"{'model':<18}{'ops':>5}{'import s':>10}{'build1 s':>10}{'buildN s':>10}"
          f"{'err alt':>10}{'err rand':>10}{'pred ms':>10}{'single ms':>11}{'plan ms':>9}{'copies':>8}")
    for name in args.models.split(","):
        t0 = time.perf_counter()
        m = zoo.load(name)
        t_import = time.perf_counter() - t0
        g = autoplace.OpGraph.from_relax(m.mod)
        n = len(g.nodes)
        t0 = time.perf_counter()
        single = autoplace.compile(m.mod, autoplace.place(g, devs, [("*", devs[0].name)]))
        t_build1 = time.perf_counter() - t0
        ref = single(*m.inputs)
        t0 = time.perf_counter()
        alt = autoplace.compile(m.mod, autoplace.Plan.from_assignment(
            g, devs, [devs[i % len(devs)].name for i in range(n)]))
        t_buildn = time.perf_counter() - t0
        rand = autoplace.compile(m.mod, autoplace.Plan.from_assignment(
            g, devs, [devs[j].name for j in rng.integers(0, len(devs), n)]))
        err = [max(float(np.max(np.abs(a - b))) for a, b in zip(r(*m.inputs), ref))
               for r in (alt, rand)]
        res = autoplace.optimize(m.mod, devs, time_limit=10)
        planned = res.compile()
        err_plan = max(float(np.max(np.abs(a - b))) for a, b in zip(planned(*m.inputs), ref))
        assert err_plan < 1e-2, f"{name}: optimized plan differs from the single-device build"
        print(f"{name:<18}{n:>5}{t_import:>10.2f}{t_build1:>10.2f}{t_buildn:>10.2f}"
              f"{err[0]:>10.2g}{err[1]:>10.2g}{res.predicted_latency_s * 1e3:>10.3f}"
              f"{_time(single, m.inputs, args.repeat) * 1e3:>11.3f}"
              f"{_time(planned, m.inputs, args.repeat) * 1e3:>9.3f}{res.copies:>8}")


if __name__ == "__main__":
    main()
