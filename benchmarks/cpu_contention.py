"""How much slower one core computes while another core computes too: each zoo model timed in a
process pinned to core 0 alone, then in two processes at once, pinned to cores 0 and 1.

Run: PYTHONPATH=. .venv/bin/python benchmarks/cpu_contention.py [--models mlp,mobilenet]
     [--rounds 3]

The per-op profile is measured one op at a time on an otherwise idle machine; a pipeline of CPU
stages runs kernels on every core at once. If shared caches or memory bandwidth slowed each core
then, the throughput model would have to charge it. Processes, not threads: two threads of one
process calling TVM's ``time_evaluator`` at once do not show two cores computing side by side
(they took twice as long each here, with seconds of system time). Every round times "alone"
then "together", so a drift of the machine hits both; the slowdown is together / alone of
``time_evaluator``'s median, per round. On the 2-core development machine it was 1.01 (median
over the zoo and 3 rounds; single rounds 0.86-1.51): no charge is needed there.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

from autoplace import zoo


def _child(name: str, core: int, seconds: float) -> None:
    """Time ``name`` on ``core`` for about ``seconds``; print the median seconds per call."""
    import tvm
    from tvm import relax

    from autoplace.backend import build_single

    os.sched_setaffinity(0, {core})
    m = zoo.load(name)
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(build_single(m.mod, tvm.target.Target("llvm"), gpu=False), dev)
    args = [tvm.runtime.tensor(x, dev) for x in m.inputs]
    once = float(np.median(vm.time_evaluator("main", dev, number=3, repeat=3)(*args).results))
    number = max(1, int(seconds / 10 / max(once, 1e-7)))
    print("ready", flush=True)
    input()  # the parent says go once every child is ready
    r = vm.time_evaluator("main", dev, number=number, repeat=10)(*args).results
    print(json.dumps(float(np.median(r))), flush=True)


def _time(name: str, cores: list[int], seconds: float) -> list[float]:
    procs = [subprocess.Popen([sys.executable, __file__, "--child", name, str(c), str(seconds)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL) for c in cores]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a timing process failed (exit {p.wait()})")
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return [json.loads(p.communicate()[0]) for p in procs]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return _child(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,branchy_cnn,mobilenet,inception,transformer,resnet")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="timing per process and round")
    args = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two cores")
    print(f"{'model':<14}{'alone us':>10}{'together us':>13}{'slowdown':>10}   per round")
    every = []
    for name in args.models.split(","):
        alone, together = [], []
        for _ in range(args.rounds):
            alone.append(_time(name, [0], args.seconds)[0])
            together.append(float(np.median(_time(name, [0, 1], args.seconds))))
        ratios = np.array(together) / np.array(alone)
        every += ratios.tolist()
        print(f"{name:<14}{np.median(alone) * 1e6:>10.1f}{np.median(together) * 1e6:>13.1f}"
              f"{np.median(ratios):>10.2f}   " + " ".join(f"{r:.2f}" for r in ratios), flush=True)
    print(f"median slowdown over models and rounds: {np.median(every):.2f} "
          f"(range {min(every):.2f}-{max(every):.2f})")


if __name__ == "__main__":
    main()
