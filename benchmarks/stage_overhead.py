"""What one pipeline stage costs beyond its kernels: time per input of k trivial stages, a + b*k.

Run: .venv/bin/python -m benchmarks stage_overhead [--device cpu:0 --device cpu:1]
     [--max-stages 6] [--inputs 200] [--rounds 3]

One fit per device (every stage on it), then one with the stages alternating over all devices,
as a plan's stages do: its ``b`` is the hand-off part of
``autoplace.solve.problem.STAGE_OVERHEAD_S``. One stage is called directly, without a pipeline:
its time is printed (k=1) and left out of the fit. If the devices handed inputs on in
parallel, that time would grow with the stages per device (every second k); it grows with every
stage, so the model charges the host too.
"""

import argparse

import autoplace
from autoplace.run.overhead import measure_stage_overhead


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", action="append", help="cpu:N or cuda:N (default cpu:0 cpu:1)")
    ap.add_argument("--max-stages", type=int, default=6)
    ap.add_argument("--inputs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    devs = [autoplace.Device.from_spec(s) for s in args.device or ["cpu:0", "cpu:1"]]
    groups = [[d] for d in devs] + ([devs] if len(devs) > 1 else [])
    for group in groups:
        fit = measure_stage_overhead(group, max_stages=args.max_stages, inputs=args.inputs,
                                     rounds=args.rounds)
        print(fit, flush=True)


if __name__ == "__main__":
    main()
