"""Whether this machine's speed holds still: ONNX Runtime alone on a model, second by second.

Ratios between frameworks each timed in a process of its own (``vs_frameworks``) hold only while
the machine runs every process alike. On a shared VM it need not: the host may run its virtual
cores at another speed for seconds at a time, which no load inside the VM shows. This runs
one ONNX Runtime session on the model (its default options, ``--threads`` intra-op threads,
no autoplace imported) in ``--processes`` processes one after another, each calling it back to
back for ``--seconds`` seconds, and prints each second's median call. Where a process's seconds
differ by more than a few percent, or processes differ from one another, the machine has
phases: compare frameworks in one process, turn by turn (``vs_frameworks``'s ``here`` column),
and repeat.

Run: .venv/bin/python -m benchmarks machine_phases [--model mobilenet_v3_small] [--threads 2]
     [--seconds 15] [--processes 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import _models


def _child(model: str, threads: int, seconds: int) -> list[float]:
    """Each second's median ms a call of ORT's session on ``model``, in this process."""
    import io

    import onnxruntime as ort
    import torch

    torch.set_num_threads(threads)
    m = _models.load(model, 0)
    buf = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(m.module, tuple(torch.from_numpy(x) for x in m.inputs), buf,
                          dynamo=False, opset_version=17)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(sess.get_inputs(), m.inputs)}
    sess.run(None, feed)
    medians = []
    for _ in range(seconds):
        times, end = [], time.perf_counter() + 1.0
        while time.perf_counter() < end:
            t = time.perf_counter()
            sess.run(None, feed)
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times) * 1e3)
    return medians


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenet_v3_small",
                   help=f"one of {', '.join(_models.NAMES)}")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seconds", type=int, default=15)
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.model not in _models.NAMES:
        p.error(f"unknown model {args.model}; choose from {', '.join(_models.NAMES)}")
    if args.child:
        print(json.dumps(_child(args.model, args.threads, args.seconds)))
        return 0
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime: {uptime}")
    print(f"{args.model}, ONNX Runtime at {args.threads} thread(s): each second's median ms a "
          "call, one line per process")
    lows, highs = [], []
    for k in range(args.processes):
        out = subprocess.run([sys.executable, __file__, "--child", "--model", args.model,
                              "--threads", str(args.threads), "--seconds", str(args.seconds)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"process {k + 1}: failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        ms = json.loads(out.stdout.strip().splitlines()[-1])
        lows.append(min(ms))
        highs.append(max(ms))
        print(f"process {k + 1}: " + " ".join(f"{x:.3g}" for x in ms)
              + f"   (slowest/fastest {max(ms) / min(ms):.2f})")
    if lows:
        print(f"over all: slowest second {max(highs) / min(lows):.2f}x the fastest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
