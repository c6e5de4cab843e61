"""Tuned plans: predicted against measured whole-model latency, and tuned against default builds.

Run: .venv/bin/python benchmarks/tuned_plans.py --db STORE [--models resnet,mlp] [--repeat 20]
     [--device cpu:0 --device cpu:1] [--rounds 3]

Per model, the plan optimize makes on one device and on all the given devices with the tuned
kernels of STORE (``autoplace tune ... --db STORE`` made them) in its costs and its build:
kernels tuned/default, the share of ops whose cost is a tuned kernel's, the predicted latency,
the measured build (median of --repeat calls, best of --rounds rounds), measured/predicted, and
the same plan built with TVM's default kernels, with default/tuned. ``--db auto`` uses the
records shipped for this machine.
"""

import argparse
import subprocess

import numpy as np
from _timing import median_call_s

import autoplace
from autoplace import zoo


def _measure(run, inputs, repeat, rounds):
    return min(median_call_s(run, inputs, repeat) for _ in range(rounds))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="profile store with tuned kernels, or 'auto'")
    ap.add_argument("--models", default="resnet", help="zoo models, comma-separated")
    ap.add_argument("--device", action="append", help="cpu:N (default cpu:0 cpu:1)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    devs = [autoplace.Device.from_spec(s) for s in args.device or ["cpu:0", "cpu:1"]]
    head = (f"{'model':<12}{'devices':>9}{'kernels t/d':>13}{'tuned ops':>11}{'pred ms':>10}"
            f"{'meas ms':>10}{'meas/pred':>11}{'default ms':>12}{'default/tuned':>15}")
    print(head)
    ratios = []
    for name in args.models.split(","):
        model = zoo.load(name)
        for used in ([devs[0]], devs) if len(devs) > 1 else ([devs[0]],):
            res = autoplace.optimize(model.mod, used, db=args.db, time_limit=10)
            tuned = res.compile()
            default = autoplace.compile(model.mod, res.plan)
            ref = default(*model.inputs)
            err = max(float(np.max(np.abs(a - b))) for a, b in zip(tuned(*model.inputs), ref))
            assert err < 1e-3, f"{name}: tuned build differs from the default one by {err}"
            t_tuned = _measure(tuned, model.inputs, args.repeat, args.rounds)
            t_default = _measure(default, model.inputs, args.repeat, args.rounds)
            share = np.mean(["tuned" in s for s in res.plan.cost_sources])
            pred = res.predicted_latency_s
            ratios.append(t_tuned / pred)
            k = tuned.kernels
            print(f"{name:<12}{len(used):>9}{k['tuned']:>7}/{k['default']:<5}{share:>11.0%}"
                  f"{pred * 1e3:>10.3f}{t_tuned * 1e3:>10.3f}{t_tuned / pred:>11.2f}"
                  f"{t_default * 1e3:>12.3f}{t_default / t_tuned:>15.2f}")
    print(f"measured/predicted: median {np.median(ratios):.2f}, "
          f"{np.mean([abs(r - 1) <= 0.10 for r in ratios]):.0%} within 10 %")


if __name__ == "__main__":
    main()
