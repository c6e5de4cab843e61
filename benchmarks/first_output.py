"""Time to the first output: ``optimize_module`` against ``torch.compile``, from cold caches.

What a user of ``torch.compile`` waits for is the first call. Per model, each in a process of its
own, from the model in memory to its first output, at ``--threads`` threads:

- Inductor, by default and frozen (``torch._inductor.config.freezing``), each with an empty
  ``TORCHINDUCTOR_CACHE_DIR``;
- ``optimize_module(model, inputs)`` with the defaults, on an empty ``AUTOPLACE_CACHE_DIR``
  (``new host``: the host's overheads measured and its CPU calibrated, as on a machine that
  never ran autoplace), and on a cache a first model (``--warm-with``, another model) filled
  (``known host``: what the host and that model left: overheads, calibration entry, code
  counts, PyTorch calls, the ORT call; Inductor's cache emptied again), with the defaults and
  with ``torch_compile=True``; where its seconds went (``result.steps_s``) and what it runs.

The rounds alternate the contenders, so that each sees the machine alike; the medians over
``--rounds`` are printed, with the ratios to each Inductor (issue 52's target: within 1.5x of
Inductor's compile time, on a ResNet-50-class model).

Run: .venv/bin/python -m benchmarks first_output [--models resnet50] [--warm-with resnet18]
     [--rounds 1] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _models


def _child(kind: str, model: str, threads: int) -> dict:
    """One contender's first output, in this (child) process."""
    import torch

    torch.set_num_threads(threads)
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    m = _models.load(model)
    inputs = [torch.from_numpy(x) for x in m.inputs]
    if kind.startswith("inductor"):
        if kind == "inductor-frozen":
            import torch._inductor.config as inductor

            inductor.freezing = True
        compiled = torch.compile(m.module)
        with torch.no_grad():
            t = time.perf_counter()
            compiled(*inputs)
            return {"s": time.perf_counter() - t}
    from autoplace.pytorch.module import optimize_module

    t = time.perf_counter()
    forced = kind == "autoplace-inductor"
    mod = optimize_module(m.module, inputs, torch_compile=True if forced else None)
    mod(*inputs)
    return {"s": time.perf_counter() - t, "runs": mod.runs,
            "steps": {k: round(v, 1) for k, v in mod.result.steps_s.items()}}


def _run(kind: str, model: str, threads: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", kind, model, str(threads)],
                         env={**os.environ, **env}, capture_output=True, text=True)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50"])
    p.add_argument("--warm-with", default="resnet18")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, model, threads = args.child
        print(json.dumps(_child(kind, model, int(threads))))
        return
    print(f"load average at start: {os.getloadavg()}, threads {args.threads}")
    for model in args.models:
        got: dict[str, list] = {}
        known = f"host known (after {args.warm_with})"
        contenders = [("inductor", "inductor"), ("inductor frozen", "inductor-frozen"),
                      ("autoplace, new host", "autoplace"), (f"autoplace, {known}", "autoplace"),
                      (f"autoplace, {known}, torch_compile=True", "autoplace-inductor")]
        for r in range(args.rounds):
            for key, kind in contenders:
                env = {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="inductor-"),
                       "AUTOPLACE_CACHE_DIR": tempfile.mkdtemp(prefix="autoplace-")}
                if known in key:
                    warm = _run(kind, args.warm_with, args.threads, env)
                    if "error" in warm:
                        print(f"  {args.warm_with} (to fill the cache) failed: {warm['error']}")
                    # Inductor's cache as empty as the Inductor rows': autoplace's alone is known
                    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")
                res = _run(kind, model, args.threads, env)
                got.setdefault(key, []).append(res)
                print(f"  round {r + 1} {model} {key}: "
                      + (res["error"] if "error" in res else f"{res['s']:.1f} s"
                         + (f", runs {res['runs']}, steps {res['steps']}" if "runs" in res
                            else "")), flush=True)
        med = {k: statistics.median(x["s"] for x in v) if all("s" in x for x in v) else None
               for k, v in got.items()}
        print(f"\n{model}: median seconds to the first output over {args.rounds} round(s), "
              f"load average now {os.getloadavg()[0]:.1f}")
        print("| contender | s | / Inductor default | / Inductor frozen |")
        print("| --- | --- | --- | --- |")
        ind, frozen = med.get("inductor"), med.get("inductor frozen")
        for k, s in med.items():
            ratio = (lambda b: f"{s / b:.2f}x" if s and b else "-")
            print(f"| {k} | {'-' if s is None else f'{s:.1f}'} | {ratio(ind)} | {ratio(frozen)} |")


if __name__ == "__main__":
    main()
