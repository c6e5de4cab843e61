"""Tuned plans: predicted against measured whole-model latency, and tuned against default builds.

Run: .venv/bin/python -m benchmarks tuned_plans --db STORE [--models resnet,mlp] [--repeat 20]
     [--device cpu:0 --device cpu:1] [--rounds 3]

Per model, on the first device alone and on all the given devices: the plan optimize makes with
the tuned kernels of STORE (``autoplace tune ... --db STORE`` made them) in its costs and its
build (kernels tuned/default, the share of ops whose cost is a tuned kernel's, predicted and
measured latency), and the plan it makes without them (TVM's default kernels, per-op costs of the
shipped profile where this machine has one), each measured as a median of --repeat calls, best
of --rounds rounds; default/tuned compares the two builds. ``--db auto`` uses the records shipped
for this machine.
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
    head = (f"{'model':<12}{'devs':>5}{'kernels t/d':>13}{'tuned ops':>10} | {'pred ms':>9}"
            f"{'meas ms':>9}{'meas/pred':>10} | {'pred ms':>9}{'meas ms':>9}{'meas/pred':>10} |"
            f"{'default/tuned':>14}")
    print(f"{'':<40} | {'tuned kernels (per kernel)':^28} | {'default kernels (per op)':^28} |")
    print(head)
    ratios = {"tuned": [], "default": []}
    for name in args.models.split(","):
        model = zoo.load(name)
        for used in ([devs[0]], devs) if len(devs) > 1 else ([devs[0]],):
            res = autoplace.optimize(model.mod, used, db=args.db, time_limit=10)
            plain = autoplace.optimize(model.mod, used, db=None, time_limit=10)
            tuned, default = res.compile(), plain.compile()
            ref = default(*model.inputs)
            err = max(float(np.max(np.abs(a - b))) for a, b in zip(tuned(*model.inputs), ref))
            assert err < 1e-3, f"{name}: tuned build differs from the default one by {err}"
            t_tuned = _measure(tuned, model.inputs, args.repeat, args.rounds)
            t_default = _measure(default, model.inputs, args.repeat, args.rounds)
            share = np.mean(["tuned" in s for s in res.plan.cost_sources])
            p_tuned, p_default = res.predicted_latency_s, plain.predicted_latency_s
            ratios["tuned"].append(t_tuned / p_tuned)
            ratios["default"].append(t_default / p_default)
            k = tuned.kernels
            print(f"{name:<12}{len(used):>5}{k['tuned']:>7}/{k['default']:<5}{share:>10.0%} | "
                  f"{p_tuned * 1e3:>9.3f}{t_tuned * 1e3:>9.3f}{t_tuned / p_tuned:>10.2f} | "
                  f"{p_default * 1e3:>9.3f}{t_default * 1e3:>9.3f}{t_default / p_default:>10.2f} |"
                  f"{t_default / t_tuned:>14.2f}")
    for kind, r in ratios.items():
        print(f"{kind} measured/predicted: median {np.median(r):.2f}, "
              f"{np.mean([abs(x - 1) <= 0.10 for x in r]):.0%} of plans within 10 %")


if __name__ == "__main__":
    main()
