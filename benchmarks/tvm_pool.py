"""How TVM's CPU thread pool is set up changes what a one-device build costs: each zoo model's
build (with this machine's shipped tuning records, when it has them) timed under each setup, each
in a fresh process.

Run: PYTHONPATH=. .venv/bin/python benchmarks/tvm_pool.py [--models inception,mlp] [--rounds 3]
     [--db auto|none|PATH]

Setups (the model called on the process's main thread unless said):

- ``tvm default``: the build's VM called directly, ``TVM_NUM_THREADS`` unset: TVM's own default
  pool (mode "big cores");
- ``tvm env N``: the same with ``TVM_NUM_THREADS=N`` (N = TVM's default count, then every core);
- ``autoplace``: the compiled model called (it sets up the caller's pool as
  :func:`autoplace.backend.own_pool` says: TVM's default count, every core shared);
- ``explicit N``: on a thread whose pool is ``runtime.config_threadpool(-3, N, cores)`` (what
  autoplace's pipeline stages, concurrent segments and all-threads builds run with), called
  there in a loop.

Each figure is the median call time over ``--rounds`` rounds (a fresh process per setup per
round, the setups in turn), in ms; the ratio is tvm default / setup (> 1: the setup is faster).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from autoplace import zoo


def _child(name: str, setup: str, explicit: int, db: str, repeat: int) -> None:
    """Time ``name`` as its setup (``tvm``, ``autoplace`` or ``explicit``) says; print the
    median seconds per call."""
    import time

    import tvm
    from tvm import relax

    import autoplace
    from autoplace.backend import in_own_thread, limit_tvm_threads, process_cpus

    m = zoo.load(name)
    dev = autoplace.Device.cpu(0)
    res = autoplace.optimize(m.mod, [dev], db=None if db == "none" else db, time_limit=2)
    run = res.compile()
    if setup == "tvm":  # the VM alone: nothing of autoplace's between the call and TVM's pool
        fn = relax.VirtualMachine(run.executable, tvm.cpu(0))[run.func_name]
        args = [tvm.runtime.tensor(x) for x in m.inputs]
        args += [tvm.runtime.tensor(v.numpy()) for v, _ in run.lifted]

        def call():
            fn(*args)
    else:
        def call():
            run(*m.inputs)

    def loop() -> float:
        for _ in range(max(5, repeat // 10)):
            call()
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            call()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    def pooled() -> float:
        limit_tvm_threads(explicit, process_cpus())
        return loop()

    print(json.dumps(in_own_thread(pooled) if setup == "explicit" else loop()), flush=True)


def _time(name: str, env: dict, setup: str, explicit: int, db: str, repeat: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", name, setup, str(explicit), db,
                          str(repeat)], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet,inception,transformer,mobilenet,mlp,branchy_cnn")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--db", default="auto", help="tuning records: auto (shipped), none, or a store")
    args = ap.parse_args()

    from autoplace.backend import process_cpus, tvm_threads

    os.environ.pop("TVM_NUM_THREADS", None)  # "default" is TVM's own choice; children inherit
    default, cores = tvm_threads(), len(process_cpus())
    setups = {"tvm default": ({}, "tvm", 0),
              f"tvm env {default}": ({"TVM_NUM_THREADS": str(default)}, "tvm", 0)}
    if cores != default:
        setups[f"tvm env {cores}"] = ({"TVM_NUM_THREADS": str(cores)}, "tvm", 0)
    setups["autoplace"] = ({}, "autoplace", 0)
    setups[f"explicit {default}"] = ({}, "explicit", default)
    if cores != default:
        setups[f"explicit {cores}"] = ({}, "explicit", cores)
    print(f"uptime: {os.getloadavg()}; TVM's default threads {default}, cores {cores}; "
          f"db {args.db}", flush=True)
    for name in args.models.split(","):
        times = {k: [] for k in setups}
        for _ in range(args.rounds):
            for key, (env, setup, explicit) in setups.items():
                times[key].append(_time(name, env, setup, explicit, args.db, args.repeat))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name:12s} " + "  ".join(
            f"{k} {v * 1e3:.3f} ({med['tvm default'] / v:.2f}x)" for k, v in med.items()),
            flush=True)
    print("ms, median call over rounds; (x): tvm default / setup, > 1: faster than TVM's "
          "default pool")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
    else:
        main()
