"""The whole-model contenders in one process: eager, frozen ``torch.compile`` and ONNX Runtime.

``optimize_module`` times the build against what a PyTorch user would run instead; by default it
compiles Inductor (frozen) only where ONNX Runtime on the whole model is not among them. This
prints, per model and thread count, each in a process of its own, the contenders as
``optimize_module`` makes and times them (``autoplace.pytorch.module``: ``_onnxruntime`` at each
graph optimization level and thread count, the fastest kept; ``_compiled``; ``_blocks``, in
blocks in turn): their medians, the fastest, frozen Inductor over ORT (above 1: ORT is faster),
and the seconds Inductor's compile and ORT's export and sessions took. No build is made.

Run: .venv/bin/python -m benchmarks contenders [--models bert resnet18 ...] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _models

DEFAULT = ("bert", "resnet18", "mobilenet_v3_small", "regnet_x_400mf", "convnext_tiny", "gpt2")


def _child(name: str, threads: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from autoplace.pytorch import contenders as door

    m = _models.load(name)
    inputs = [torch.from_numpy(x) for x in m.inputs]
    model = m.module.eval()
    t = time.perf_counter()
    variants = door._onnxruntime(model, inputs) or {}
    ort_s = time.perf_counter() - t
    t = time.perf_counter()
    compiled = door._compiled(model, inputs)
    compile_s = time.perf_counter() - t
    fns = {"eager": model, **({"frozen": compiled} if compiled is not None else {}),
           **{door._variant_name(k): v for k, v in variants.items()}}
    times = door._blocks(fns, inputs)
    ort = [v for k, v in times.items() if k.startswith(door.ONNXRUNTIME)]
    return {"eager": times["eager"], "frozen": times.get("frozen"),
            "ort": min(ort) if ort else None, "compile_s": compile_s, "ort_s": ort_s}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT))
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]))))
        return
    print(f"load average at start: {os.getloadavg()}")
    print("| model | threads | eager ms | frozen ms | ORT ms | fastest | frozen / ORT "
          "| Inductor compile s | ORT export s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        for threads in (int(t) for t in args.threads.split(",")):
            out = subprocess.run([sys.executable, __file__, "--child", name, str(threads)],
                                 capture_output=True, text=True)
            if out.returncode:
                error = (out.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {name} | {threads} | failed: {error} |", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            ms = {k: r[k] * 1e3 for k in ("eager", "frozen", "ort") if r[k] is not None}
            fastest = min(ms, key=ms.get)
            ratio = f"{ms['frozen'] / ms['ort']:.2f}" if {"frozen", "ort"} <= set(ms) else "-"
            cells = [f"{ms[k]:.3g}" if k in ms else "-" for k in ("eager", "frozen", "ort")]
            print(f"| {name} | {threads} | {' | '.join(cells)} | {fastest} | {ratio} "
                  f"| {r['compile_s']:.1f} | {r['ort_s']:.1f} |", flush=True)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
