"""Why a pipeline's stages run slower than their profile: each stage timed four ways.

Why a pipeline's stages run slower than their profile: each stage of a throughput plan timed
alone, side by side with the other stage on reused inputs, side by side on fresh inputs, and in
the pipeline.

Run: .venv/bin/python -m benchmarks stage_slowdown [--models mobilenet,inception]
     [--seconds 2] [--rounds 3]

The four are timed one after another, ``--seconds`` each, in ``--rounds`` rounds (this machine's
speed drifts by minutes); each figure is the median over the rounds of the rounds' medians.

Per stage, the median microseconds of one call of its function:
- ``alone``: on the main thread (its TVM pool set up as a profile's is:
  :func:`autoplace.backend.own_pool`), the stages one after another, each on inputs it was given
  before (the profile's conditions);
- ``together``: each stage in its own thread on its own cores (as the pipeline places them),
  all at once, each calling its function on the same inputs over and over;
- ``fresh``: as ``together``, but every call on a new copy of its inputs, made in its thread;
- ``pipeline``: in :class:`autoplace.run.Pipeline`, wall and CPU time (``thread_time``) of the
  call, so waiting (for the GIL, for a core) shows as wall above CPU.
"""

import argparse
import statistics
import threading
import time

import numpy as np

import autoplace
import autoplace.run.pipeline as pipeline
from autoplace.backend import limit_tvm_threads, own_pool, to_tvm
from autoplace.run.baseline import random_inputs_like
from autoplace.run.cores import stage_threads
from autoplace.run.pipeline import compile_stage
from autoplace.run.split import split
from autoplace import zoo


def _stage_inputs(staged, fns, xs):
    """Per stage, the TVM arguments of its call on each input (run through the stages once)."""
    import tvm

    args = [[] for _ in fns]
    for x in xs:
        values = {n: to_tvm(a, tvm.cpu(0)) for n, a in zip(staged.inputs, x)}
        for k, (stage, fn) in enumerate(zip(staged.stages, fns)):
            args[k].append([values[n] for n in stage.inputs])
            values.update(zip(stage.outputs, fn(*args[k][-1])))
    return args


def _loops(exes, staged, args, seconds, fresh):
    """Median seconds per call of each stage, all stages at once, each on the cores and TVM
    threads a pipeline gives it (:func:`autoplace.run.cores.stage_threads`)."""
    import tvm

    out = {}
    threads = stage_threads([s.device for s in staged.stages])

    def copied(call):  # a copy made now, in this thread, as a pipeline's stage 0 does
        return [to_tvm(v.numpy(), tvm.cpu(0)) for v in call]

    def loop(k):
        if threads[k] is not None:
            limit_tvm_threads(*threads[k])
        fn = pipeline._load_vm(exes[k], staged.stages[k].device)[0]
        out[k] = _median_call(fn, args[k], seconds, copied if fresh else None)

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(len(exes))]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return [out[k] for k in range(len(exes))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet,inception")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    devs = [autoplace.Device.cpu(0), autoplace.Device.cpu(1)]
    own_pool()
    print(f"{'model':<12}{'stage':>6}{'alone':>8}{'together':>10}{'fresh':>8}{'pipeline':>10}"
          f"{'(cpu)':>8}   us per call, medians")
    for name in args.models.split(","):
        m = zoo.load(name)
        # A pipeline, to time its stages: charged no hand-off, the solver splits the model.
        res = autoplace.optimize(m.mod, devs, objective="throughput", replicate=False,
                                 baseline_guard=False, stage_overhead_s=0.0)
        staged = split(m.mod, res.plan, res.graph.func_name)
        exes = [compile_stage(s, res.records) for s in staged.stages]  # as the pipeline builds
        xs = random_inputs_like(m.inputs, 64, np.random.default_rng(0))
        fns = [pipeline._load_vm(e, s.device)[0] for e, s in zip(exes, staged.stages)]
        inputs = _stage_inputs(staged, fns, xs)
        rounds = []
        for _ in range(args.rounds):
            alone = [_median_call(fn, a, args.seconds / len(fns)) for fn, a in zip(fns, inputs)]
            together = _loops(exes, staged, inputs, args.seconds, fresh=False)
            fresh = _loops(exes, staged, inputs, args.seconds, fresh=True)
            wall, cpu = zip(*_in_pipeline(m.mod, res, xs, args.seconds))
            rounds.append((alone, together, fresh, wall, cpu))
        for k in range(len(exes)):
            cols = [statistics.median(r[j][k] for r in rounds) * 1e6 for j in range(5)]
            print(f"{name:<12}{k:>6}" + "".join(f"{v:>{w}.0f}" for v, w in
                                                 zip(cols, (8, 10, 8, 10, 8))), flush=True)


def _median_call(fn, calls, seconds, prepare=None):
    """Median seconds of ``fn(*call)`` over ``calls``, repeated for ``seconds``; ``prepare``
    (untimed) makes each call's arguments from ``call``."""
    times, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for call in calls:
            if prepare is not None:
                call = prepare(call)
            t = time.perf_counter()
            fn(*call)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _in_pipeline(mod, res, xs, seconds):
    """Median (wall, CPU) seconds of each stage's call while the plan runs as a pipeline."""
    calls: dict[str, list] = {}
    load = pipeline._load_vm

    def timed_load(exe, device):
        fn, dev = load(exe, device)
        mine = calls.setdefault(threading.current_thread().name, [])

        def timed(*a):
            w, c = time.perf_counter(), time.thread_time()
            out = fn(*a)
            mine.append((time.perf_counter() - w, time.thread_time() - c))
            return out

        return timed, dev

    pipeline._load_vm = timed_load
    try:
        with res.pipeline() as pipe:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                pipe.run(xs)
            names = [t.name for t in pipe._threads]
    finally:
        pipeline._load_vm = load
    return [tuple(statistics.median(c[i] for c in calls[n][len(xs):]) for i in (0, 1))
            for n in names]


if __name__ == "__main__":
    main()
