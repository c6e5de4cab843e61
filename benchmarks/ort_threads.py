"""ONNX Runtime segments' thread count: the one pricing chose, against each one, on the build.

Where a plan runs on several threads, the ORT device's segments are priced at the plan's thread
count and at one (on a small graph, one thread can be the faster), and run at whichever ran the
largest segment faster (``autoplace.backend.ort_profiling.fastest_variant``). Per model, this
prices the ORT device at ``--threads`` (what it chose, and what each variant of the largest
segment took), then builds the plan that puts every op ORT can run on it (the others on TVM) at
each thread count, and times the builds in blocks, turn by turn, in this process. ``chosen /
fastest`` is the chosen build's time over the faster one's: 1.00 where the choice was right.

Run: .venv/bin/python -m benchmarks ort_threads [--models zoo:transformer zoo:resnet ...]
     [--threads 2] [--rounds 11]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import _models
from _timing import aligned

DEFAULT_MODELS = ("zoo:transformer", "zoo:resnet", "resnet18", "mobilenet_v3_small", "bert")


def _row(name: str, threads: int, rounds: int) -> list[str]:
    import autoplace
    from autoplace import Device
    from autoplace.backend.ort_profiling import thread_options
    from autoplace.graph import OpGraph
    from autoplace.plan import Plan
    from autoplace.profile.ort_timings import time_ort_device
    from autoplace.run.overhead import blocks_s

    mod, inputs = _models.relax_and_inputs(name)
    graph = OpGraph.from_relax(mod)
    cpu, ort = Device.cpu(0), Device.onnxruntime()
    timings = time_ort_device(mod, graph, ort, threads=threads)
    on = ["ort" if timings.ops[i] < float("inf") else "cpu0" for i in range(len(graph.nodes))]
    options = thread_options(threads)
    calls = []
    for t in options:
        plan = Plan.from_assignment(graph, [cpu, ort], on, ort_levels=(("ort", timings.level),),
                                    ort_threads=(("ort", t),))
        built = autoplace.compile(mod, plan)
        calls.append(lambda built=built: built(*inputs))
    for call in calls:
        call()
    ms = [s * 1e3 for s in blocks_s(calls, block_s=0.1, rounds=rounds)[0]]
    chosen = ms[options.index(timings.session_threads)]
    tried = ", ".join(f"{lv}/{t} {s * 1e3:.3g}" for (lv, t), s in timings.variants_s.items())
    return [name, f"{on.count('ort')}/{len(on)}", f"{timings.level}, {timings.session_threads}",
            tried, *(f"{m:.3g}" for m in ms), f"{chosen / min(ms):.2f}"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help=f"any of {', '.join(_models.NAMES)}")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="the plan's thread count (TVM's pool; default: this process's cores)")
    p.add_argument("--rounds", type=int, default=11, help="blocks of 0.1 s per build")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in _models.NAMES]
    if unknown:
        p.error(f"unknown model(s) {unknown}; choose from {', '.join(_models.NAMES)}")
    if args.threads < 2:
        p.error("--threads must be 2 or more: at one thread there is nothing to choose")
    if os.environ.get("TVM_NUM_THREADS") != str(args.threads):
        env = dict(os.environ, TVM_NUM_THREADS=str(args.threads))
        return subprocess.run([sys.executable, __file__, *argv], env=env).returncode
    import torch

    torch.set_num_threads(args.threads)
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {uptime}")
    head = ["model", "ops on ORT", "chosen", "largest segment, level/threads: ms",
            f"build at {args.threads} ms", "build at 1 ms", "chosen / fastest"]
    rows = [head]
    for name in args.models:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(_row(name, args.threads, args.rounds))
        except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end
            rows.append([name, f"failed: {type(e).__name__}: {e}"[:80], *[""] * 5])
    print(aligned(rows, f"Plans put every op ONNX Runtime runs on it, the rest on TVM's "
                        f"cpu0, at {args.threads} TVM thread(s); builds timed in blocks of "
                        f"0.1 s x {args.rounds} rounds, turn by turn, in one process."))
    return 0


if __name__ == "__main__":
    sys.exit(main())
