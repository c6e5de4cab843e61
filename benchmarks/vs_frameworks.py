"""autoplace's mixes of runtimes, and TVM, against PyTorch eager, torch.compile and ONNX Runtime.

Per model and thread count: autoplace's mixes (TVM's kernels with PyTorch's, and with ONNX
Runtime's, chosen per op by cost) and the module a user gets with the defaults, beside eager,
``torch.compile`` (default and frozen), ONNX Runtime and TVM alone: medians, speed-ups over the
fastest single framework (issue 52's targets), each one's time to the first output, relative
errors, and the kernels that hold the tuned TVM build back.

Run: .venv/bin/python -m benchmarks vs_frameworks [--models zoo:resnet resnet18 ...]
     [--threads 1,all] [--trials 64] [--minutes 20] [--db out/vs_frameworks.db]
     [--device cpu:0:native] [--repeats 20] [--json] [--work DIR]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: torchvision 0.28.0, onnxruntime,
transformers). Without onnxruntime its column says so; without transformers the BERT encoder is
written in torch; without torchvision its models' rows say so.

Each framework runs in its own process (TVM's idle worker threads spin, and PyTorch timed after
TVM in one process ran up to 100x slower), one model after another. Per model, tuning first,
then everything else at each ``--threads`` count in turn (``all``: this machine's cores; every
framework's threads, and TVM's pool):

0. Tuning (where ``--minutes`` > 0; before each count's rows, with that count's TVM threads:
   records are kept per device, and a device's thread count is part of it, so a count's tuned
   builds apply only the records tuned at that count) with
   ``autoplace.tune`` for this CPU (``-mcpu`` of the host), records kept beside ``--db``, to
   ``--trials`` per kernel with a time limit of ``--minutes``: the campaign times each kernel's
   default schedule, gives every kernel one round of 16 trials, the slowest first, then the rest
   of their trials, and starts nothing past the limit (the worker is killed if it runs on well
   past it; finished rounds are kept). A second run with the same ``--db`` and ``--trials``
   finds nothing pending and tunes nothing. The tuned builds below are made where the store
   holds records.
1. PyTorch eager (``torch.set_num_threads``): the reference outputs, the latency, the first
   call, and an ONNX export (``dynamo=False``), whose seconds count toward ORT's first output.
2. ONNX Runtime on that export (``ORT_ENABLE_ALL``, ``intra_op_num_threads`` = the count): its
   session and first call timed apart; then ``torch.compile`` (Inductor; its first call, which
   compiles, is its first output), by default and with Inductor's ``freezing`` (weights folded
   and packed once for oneDNN, as PyTorch advises for inference on a CPU).
3. TVM alone: ``autoplace.compile`` of the model on one CPU (``--device``), with default
   schedules and, where the store holds records, tuned: latencies, relative errors, the first
   output (the model's Relax module made, the build, the first call), and for the tuned build
   each kernel's share of the run (timed with the VM's instrument hook).
4. autoplace as a user calls it, each module in a process of its own: ``optimize_module(model,
   inputs)`` with the defaults (``module.runs``: the build, or the contender that measured faster;
   ``module.times``: what each measured), and the mixes: ``optimize_module`` over ``[--device,
   torch:cpu]`` and over ``[--device, torch:cpu, ort:cpu]``, without records and (where the store
   holds any) with them, Inductor not compiled (``torch_compile=False``: their builds are what is
   compared). Each: the module's latency (what it runs, called back to back as the frameworks are);
   the build's own latency and its measured/predicted, the build timed with the module, eager and
   ORT in blocks turn by turn in the same process (each called back to back for 0.1 s, in turn, 11
   rounds); the ops on each device; and the time to the first output: ``optimize_module`` and the
   first call, split where it went (the module's ``result.steps_s``).

Targets (issue 52; printed, not asserted), as speed-ups, the other's median over autoplace's:
with the defaults, the module runs >= 0.97x the fastest of eager, frozen ``torch.compile`` and
ORT; the untuned mix over TVM, PyTorch and ORT builds >= 1.05x the fastest single framework
(those and TVM alone) on half the models; tuned, >= 1.15x on ``bert`` and >= 1.0x on resnet18,
mobilenet_v3_small and efficientnet_b0; the mixes' measured/predicted within ±15 %.

Latencies are medians of ``--repeats`` calls after two warm-up calls (fewer when one model's
calls pass 30 s, never under 3); TVM's call is ``CompiledModel``'s, on numpy arrays, as a user
calls it. Relative error: ||out - torch|| / ||torch|| over all outputs.
Weights are random and re-initialised so that outputs are O(1) (``_models.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _models

WARMUP = 2
TIME_CAP_S = 30.0
ROUND = 16  # trials per MetaSchedule round: every kernel gets one before any gets more
TOP_KERNELS = 5
WORKER_TIMEOUT_S = 45 * 60
COMPARED = (*_models.ZOO, "resnet18", "mobilenet_v3_small", "bert")  # the default --models

#: The mixes: the runtime devices beside ``--device``.
MIXES = {"mix": ("torch:cpu",), "mix+ORT": ("torch:cpu", "ort:cpu")}
#: What a user has without autoplace (the defaults' target), and every single framework (the
#: mixes'): keys of a row, TVM alone being its tuned build where there is one.
USER = ("torch", "frozen", "ort")
SINGLE = (*USER, "tvm")
LABELS = {"torch": "eager", "compile": "torch.compile", "frozen": "frozen", "ort": "ORT",
          "tvm": "TVM alone"}
DEFAULTS_TARGET = 0.97  # the defaults' module over the fastest of USER
MIX_TARGET = 1.05  # the untuned mix+ORT's build over the fastest of SINGLE, on half the models
TUNED_TARGETS = {"bert": 1.15, "resnet18": 1.0, "mobilenet_v3_small": 1.0, "efficientnet_b0": 1.0}
MP_TOLERANCE = 0.15

# ---------------------------------------------------------------------------------------------
# Workers: each runs in its own process and writes one JSON result.


def _median_ms(fn, repeats: int) -> tuple[float, int]:
    """Median latency of ``fn()`` in ms, called back to back after two warm-up calls, and how
    many calls it is the median of: ``repeats``, fewer once the calls pass 30 s, never under 3.
    """
    for _ in range(WARMUP):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats and (len(times) < 3 or time.perf_counter() - start < TIME_CAP_S):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, len(times)


def _save_arrays(path: Path, arrays) -> None:
    import numpy as np

    np.savez(path, *arrays)


def _load_arrays(path: Path) -> list:
    import numpy as np

    with np.load(path) as f:
        return [f[f"arr_{k}"] for k in range(len(f.files))]


def _flat_numpy(outs) -> list:
    """A PyTorch model's outputs (a tensor, or a tuple or list of them) as numpy arrays."""
    import torch

    return [o.numpy() for o in ([outs] if isinstance(outs, torch.Tensor) else list(outs))]


def _worker_torch(cfg: dict) -> dict:
    """Eager PyTorch: the reference outputs and inputs every other worker reads, the first call
    and the latency, and the model exported to ONNX for ONNX Runtime (timed)."""
    import torch

    torch.set_num_threads(cfg["threads"])
    model = _models.load(cfg["model"], cfg["seed"])
    args = tuple(torch.from_numpy(x) for x in model.inputs)
    with torch.inference_mode():
        t0 = time.perf_counter()
        ref = model.module(*args)
        first_s = time.perf_counter() - t0
        ms, n = _median_ms(lambda: model.module(*args), cfg["repeats"])
    ref = _flat_numpy(ref)
    work = Path(cfg["work"])
    _save_arrays(work / "inputs.npz", model.inputs)
    _save_arrays(work / "torch.npz", ref)
    out = {"ms": ms, "n": n, "first_s": first_s, "description": model.description,
           "output_rms": float(sum((r.astype("float64") ** 2).sum() for r in ref)
                               / sum(r.size for r in ref)) ** 0.5}
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(model.module, args, str(work / "model.onnx"), dynamo=False,
                              opset_version=17)
        out["export_s"] = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's column reports it
        out["onnx_error"] = _summary(e)
    return out


def _worker_ort(cfg: dict) -> dict:
    """ONNX Runtime on the eager worker's export: session and first call, latency."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {"error": f"onnxruntime not installed: {_models.INSTALL_HINT}"}
    work = Path(cfg["work"])
    if not (work / "model.onnx").exists():
        return {"error": "no ONNX export (see PyTorch's error)"}
    inputs = _load_arrays(work / "inputs.npz")
    t0 = time.perf_counter()
    call = _ort_call(work, cfg["threads"], inputs)
    outs = call()
    first_s = time.perf_counter() - t0
    ms, n = _median_ms(call, cfg["repeats"])
    return {"ms": ms, "n": n, "first_s": first_s, "version": ort.__version__,
            "rel_error": _models.rel_error(outs, _load_arrays(work / "torch.npz"))}


def _ort_call(work: Path, threads: int, inputs):
    """A call of ONNX Runtime on the eager worker's export (``work/model.onnx``) with
    ``inputs``, as a user's session runs it: CPU execution provider, ``ORT_ENABLE_ALL``,
    ``threads`` intra-op threads and one inter-op thread, ORT's default wait."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(work / "model.onnx"), opts,
                                providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
    return functools.partial(sess.run, None, feed)


def _worker_compile(cfg: dict) -> dict:
    """``torch.compile`` (Inductor, its default; with ``cfg["freezing"]``, Inductor's
    ``freezing``, which PyTorch advises for inference on a CPU: weights folded as constants and
    packed once for oneDNN) of the model: first call (compiling) and steady latency."""
    import torch

    torch.set_num_threads(cfg["threads"])
    if cfg.get("freezing"):
        import torch._inductor.config as inductor

        inductor.freezing = True
    model = _models.load(cfg["model"], cfg["seed"])
    work = Path(cfg["work"])
    args = tuple(torch.from_numpy(x) for x in _load_arrays(work / "inputs.npz"))
    compiled = torch.compile(model.module)
    with torch.inference_mode():
        t0 = time.perf_counter()
        outs = compiled(*args)
        first_s = time.perf_counter() - t0
        ms, n = _median_ms(lambda: compiled(*args), cfg["repeats"])
    return {"ms": ms, "n": n, "first_s": first_s,
            "rel_error": _models.rel_error(_flat_numpy(outs), _load_arrays(work / "torch.npz"))}


def _worker_module(cfg: dict) -> dict:
    """``autoplace.optimize_module`` of the model as a user calls it: over ``cfg["devices"]``
    (device specs, with the store's tuning records where ``cfg["tuned"]``, else none), or with
    every default where that is None. What the module runs and its latency; the build's own
    latency (beside the module, eager and ORT, in blocks turn by turn: :func:`_here_ms`) and
    prediction; the ops on each device, and the time to the first output, split where
    it went (``module.result.steps_s``)."""
    import torch

    import autoplace

    torch.set_num_threads(cfg["threads"])
    model = _models.load(cfg["model"], cfg["seed"])
    work = Path(cfg["work"])
    args = tuple(torch.from_numpy(x) for x in _load_arrays(work / "inputs.npz"))
    ref = _load_arrays(work / "torch.npz")
    given = {} if cfg["devices"] is None else {  # a mix: its build is what is compared
        "devices": [autoplace.Device.from_spec(s) for s in cfg["devices"]],
        "db": cfg["db"] if cfg["tuned"] else None, "torch_compile": False}
    t0 = time.perf_counter()
    m = autoplace.optimize_module(model.module, args, **given)
    optimize_s = time.perf_counter() - t0
    with torch.inference_mode():
        t0 = time.perf_counter()
        outs = m(*args)
        first_call_s = time.perf_counter() - t0
        built = m.run_flat(args)
        # What the module runs, back to back as the frameworks' calls are; then its build,
        # the module, eager and ORT in blocks turn by turn.
        ms, n = _median_ms(lambda: m(*args), cfg["repeats"])
        here = _here_ms(m, model.module, args, work, cfg)
        build_ms = here.pop("build")
    plan = m.plan  # the build's: the result's, or a close call's
    return {"runs": m.runs, "runs_note": m.runs_note, "ort_variant": m.ort_variant,
            "here_ms": here,
            "times_ms": {k: v * 1e3 for k, v in m.times.items()},
            "ms": ms, "n": n, "build_ms": build_ms,
            "predicted_ms": None if plan.predicted_s is None else plan.predicted_s * 1e3,
            "devices": [d.name for d in plan.devices], "ops": dict(Counter(plan.assignment)),
            "bound_ms": m.result.solution.bound * 1e3,
            "plan_threads": plan.threads,
            "kernels": m.result.kernels, "optimize_s": optimize_s, "first_call_s": first_call_s,
            "first_s": optimize_s + first_call_s, "steps_s": dict(m.result.steps_s),
            "rel_error": _models.rel_error([t.numpy() for t in built], ref),
            "module_rel_error": _models.rel_error(_flat_numpy(outs), ref)}


def _here_ms(m, module, args, work: Path, cfg: dict) -> dict:
    """The calls of the module's build (``"build"``), of the module, eager's and ONNX
    Runtime's on the eager worker's export (:func:`_ort_call`, as :func:`_worker_ort` times
    it), in this one process, in blocks of 0.1 s in turn, 11 rounds
    (:func:`autoplace.run.overhead.blocks_s`; the module's own blocks are shorter, all its
    contenders' within a second): ratios that the machine's slower phases, which come and go
    between processes and within one (a 2-core VM's two-thread calls), change alike. Blocks,
    not single calls turn by turn: an ORT session called right after eager's calls runs slower
    than called back to back, even after an untimed call of its own. ORT's is left out where it
    cannot run here."""
    from autoplace.run.overhead import blocks_s

    fns = {"build": lambda: m.run_flat(args), "module": lambda: m(*args),
           "eager": lambda: module(*args)}
    try:
        fns["ort"] = _ort_call(work, cfg["threads"], _load_arrays(work / "inputs.npz"))
    except Exception:  # noqa: BLE001 - not installed, no export: the others still compare
        pass
    medians, _ = blocks_s(list(fns.values()), block_s=0.1, rounds=11, least=3)
    return {name: s * 1e3 for name, s in zip(fns, medians)}


def _device(cfg: dict):
    import autoplace

    return autoplace.Device.from_spec(cfg["device"])


def _worker_tune(cfg: dict) -> dict:
    """One campaign to ``--trials`` per kernel within ``--minutes``."""
    import autoplace

    model = _models.load(cfg["model"], cfg["seed"])
    mod = _models.relax_module(model, cfg["seed"])
    report = autoplace.tune(mod, [_device(cfg)], cfg["db"], trials=cfg["trials"],
                            trials_per_iter=ROUND, progress=False,
                            time_limit_s=cfg["minutes"] * 60)
    kernels = report.kernels
    shared = report.tuned_share()
    return {"kernels": len(kernels), "failed": sum(k.failed for k in kernels),
            "reached": sum(k.done(cfg["trials"]) for k in kernels),
            "with_records": sum(k.valid > 0 for k in kernels),
            "default_share_tuned": shared[0] if shared else None,
            "tuned_now": sum(k.tuned_now for k in kernels), "out_of_time": report.out_of_time,
            "campaign_s": report.wall_s}


def _worker_tvm(cfg: dict) -> dict:
    """TVM alone on ``--device``: default schedules, and the store's records where
    ``cfg["tuned"]``; first output (Relax module, build, first call) and latency of each."""
    import autoplace
    from autoplace.profile import LocalRunner, fingerprint
    from autoplace.tuning import open_records

    model = _models.load(cfg["model"], cfg["seed"])
    t0 = time.perf_counter()
    mod = _models.relax_module(model, cfg["seed"])
    import_s = time.perf_counter() - t0
    work = Path(cfg["work"])
    inputs = _load_arrays(work / "inputs.npz")
    ref = _load_arrays(work / "torch.npz")
    dev = _device(cfg)
    plan = autoplace.place(autoplace.OpGraph.from_relax(mod), [dev], [("*", dev.name)])
    out = {"target": str(dev.tvm_target()), "import_s": import_s}
    kinds = [("default", None)]
    if cfg["tuned"]:
        records, out["records"] = open_records(cfg["db"], [dev],
                                               [fingerprint(LocalRunner(dev).info())])
        kinds.append(("tuned", records))
    for kind, recs in kinds:
        t0 = time.perf_counter()
        run = autoplace.compile(mod, plan, records=recs)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        outs = run(*inputs)
        first_call_s = time.perf_counter() - t0
        ms, n = _median_ms(lambda: run(*inputs), cfg["repeats"])
        out[kind] = {"ms": ms, "n": n, "build_s": build_s,
                     "first_s": import_s + build_s + first_call_s, "kernels": run.kernels,
                     "rel_error": _models.rel_error(outs, ref)}
        if kind == "tuned":
            out["kernels"] = _kernel_records(run, recs, dev)
            out["breakdown"] = _kernel_times(run, inputs, dev.tvm_device())
    return out


def _kernel_records(run, records, dev) -> dict:
    """Per kernel of a build: its FLOPs and the trials its target's records hold for it
    (``trials``: all, ``valid``: measured successfully)."""
    import tvm
    import tvm_ffi
    from tvm.s_tir import analysis

    from autoplace.backend import fused_kernels
    from autoplace.backend.tuned import kernel_workload, target_key

    db = records.databases.get(target_key(dev.tvm_target()))
    every = db.get_all_tuning_records() if db is not None else []
    out = {}
    for gv, func in fused_kernels(run.mod).functions.items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        workload = kernel_workload(func)
        try:
            flops = float(analysis.estimate_tir_flops(workload))
        except Exception:  # noqa: BLE001 - a rate is only shown where FLOPs are known
            flops = 0.0
        trials = valid = 0
        if db is not None and db.has_workload(workload):
            entry = db.commit_workload(workload)  # present already: nothing is written
            valid = len(db.get_top_k(entry, 1 << 30))
            trials = sum(1 for r in every if r.workload.same_as(entry)
                         or tvm_ffi.structural_equal(r.workload.mod, workload))
        out[gv.name_hint] = {"flops": flops, "trials": trials, "valid": valid}
    return out


def _kernel_times(run, inputs, dev, rounds: int = 7) -> dict:
    """Per kernel of a built model: calls and median seconds per run, timed around each VM call
    with the VM's instrument hook (``"(vm builtins)"``: allocations, reshapes and the like). The
    hook costs about a microsecond a call, which shows mostly in the builtins' share."""
    import tvm
    from tvm import relax

    from autoplace.backend import to_tvm
    from autoplace.profile.whole_model import vm_spans

    vm = relax.VirtualMachine(run.executable, [dev])
    args = [to_tvm(x, dev) for x in inputs] + [tvm.runtime.tensor(v.numpy(), dev)
                                                for v, _ in run.lifted]
    vm[run.func_name](*args)  # warm-up
    per_round = []
    for spans in vm_spans(vm, run.func_name, args, dev, rounds):
        merged: dict[str, list] = {}  # name -> [calls, seconds]
        for name, times in spans.items():
            entry = merged.setdefault("(vm builtins)" if "." in name else name, [0, 0.0])
            entry[0] += len(times)
            entry[1] += sum(times)
        per_round.append(merged)
    return {name: {"calls": per_round[0][name][0],
                   "s": statistics.median(r.get(name, [0, 0.0])[1] for r in per_round)}
            for name in per_round[0]}



WORKERS = {"torch": _worker_torch, "ort": _worker_ort, "compile": _worker_compile,
           "frozen": lambda cfg: _worker_compile({**cfg, "freezing": True}),
           "tune": _worker_tune, "tvm": _worker_tvm, "module": _worker_module}


def _summary(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[-1][:300] if lines else ''}"


def _worker_main(role: str, cfg_json: str, out_path: str) -> int:
    cfg = json.loads(cfg_json)
    try:
        result = WORKERS[role](cfg)
    except Exception as e:  # noqa: BLE001 - reported in the model's row
        import traceback

        traceback.print_exc()
        result = {"error": _summary(e)}
    Path(out_path).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------------------------
# The driver: one model after another, each framework in its own process.



def _spawn(role: str, cfg: dict, log, *, timeout_s: float, tvm_threads: int | None = None,
           soft_deadline_s: float | None = None, tag: str | None = None) -> dict:
    """Run a worker (its result file named by ``tag``, else ``role``); past ``soft_deadline_s``
    it is killed (with its process group) and what it left is read back with
    ``"stopped": True``.

    Killed, not interrupted: SIGINT reaches ``autoplace.tune`` inside MetaSchedule's C++ loop as
    a bare ``RuntimeError``, which it takes for a failed kernel before going on to the next."""
    out = Path(cfg["work"]) / f"{tag or role}.json"
    out.unlink(missing_ok=True)
    env = dict(os.environ)
    if tvm_threads is not None:
        env["TVM_NUM_THREADS"] = str(tvm_threads)
    cmd = [sys.executable, __file__, "--worker", role, json.dumps(cfg), str(out)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
    stopped = False
    try:
        proc.wait(timeout=soft_deadline_s if soft_deadline_s is not None else timeout_s)
    except subprocess.TimeoutExpired:
        stopped = True
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # MetaSchedule's pool workers, if any left
            except ProcessLookupError:
                pass
    wall = time.perf_counter() - t0
    if out.exists():
        result = json.loads(out.read_text())
    elif stopped:
        result = {}
    else:
        result = {"error": f"worker died (exit {proc.returncode}); see {log.name}"}
    result.update(wall_s=wall, stopped=stopped)
    if stopped and soft_deadline_s is None:
        result["error"] = f"timed out after {timeout_s:.0f} s"
    return result



def bench_model(name: str, args, work: Path, say) -> list[dict]:
    """Every framework's numbers for one model, a row per thread count (errors in their place,
    never raised)."""
    work.mkdir(parents=True, exist_ok=True)
    base = {"model": name, "seed": 0, "repeats": args.repeats, "trials": args.trials,
            "minutes": args.minutes, "db": str(args.db), "device": args.device}
    rows = []
    with open(work / "log.txt", "w") as log:
        for threads in args.threads:
            (work / f"t{threads}").mkdir(exist_ok=True)
            tune = None
            if args.minutes > 0:
                say(f"{name}: tuning at {threads} thread(s) to {args.trials} trials per kernel, "
                    f"at most {args.minutes:g} min")
                before = _records(args.db)
                # The campaign stops itself; a kernel started just before the limit may take
                # the rest of its trials (a few minutes) before it does.
                tune = _spawn("tune", {**base, "threads": threads,
                                       "work": str(work / f"t{threads}")}, log,
                              timeout_s=WORKER_TIMEOUT_S, tvm_threads=threads,
                              soft_deadline_s=args.minutes * 60 * 1.25 + 180)
                tune["trials_run"] = _records(args.db) - before
            cfg = {**base, "threads": threads, "work": str(work / f"t{threads}"),
                   "tuned": _records(args.db) > 0}
            row = _at_threads(cfg, log, say)
            if tune is not None:
                row["tune"] = tune
            rows.append(row)
    return rows


def _at_threads(cfg: dict, log, say) -> dict:
    """One model's row at ``cfg["threads"]``: each framework, then each autoplace module."""
    name, threads = cfg["model"], cfg["threads"]
    row: dict = {"model": name, "threads": threads}

    def run(role, what, **kwargs):
        say(f"{name}, {threads} thread(s): {what} ...")
        return _spawn(role, kwargs.pop("cfg", cfg), log, timeout_s=WORKER_TIMEOUT_S, **kwargs)

    row["torch"] = run("torch", "PyTorch eager")
    if "error" in row["torch"]:
        return row  # nothing to compare with
    row["ort"] = run("ort", "ONNX Runtime")
    if row["torch"].get("onnx_error"):
        row["ort"]["error"] = f"ONNX export failed: {row['torch']['onnx_error']}"
    row["compile"] = run("compile", "torch.compile")
    row["frozen"] = run("frozen", "torch.compile with freezing")
    row["tvm"] = run("tvm", "TVM alone", tvm_threads=threads)
    row["modules"] = {
        key: run("module", f"optimize_module, {key}", tvm_threads=threads,
                 tag=f"module_{key.replace(' ', '_')}",
                 cfg={**cfg, "devices": devices, "tuned": tuned})
        for key, devices, tuned in _variants(cfg["device"], cfg["tuned"])}
    return row


def _variants(device: str, tuned: bool):
    """``(name, device specs, with records)`` of each module built: the defaults (specs None),
    then each of :data:`MIXES` beside ``device``, and with records where ``tuned``."""
    yield "defaults", None, False
    for records in (False, True) if tuned else (False,):
        for name, runtimes in MIXES.items():
            yield f"{name} tuned" if records else name, [device, *runtimes], records


def _records(db: Path) -> int:
    """Tuning records (trials) kept beside ``db``, over every device."""
    from autoplace.tuning import records_root

    files = records_root(db).glob("*/database_tuning_record.json")
    return sum(1 for f in files for line in f.read_text().splitlines() if line.strip())


# ---------------------------------------------------------------------------------------------
# The report.


def _ms(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if x < 100 else f"{x:.0f}"


def _get(row: dict, *path):
    for key in path:
        if not isinstance(row, dict) or key not in row:
            return None
        row = row[key]
    return row


def _tuning_note(row: dict, args) -> str:
    tune = row.get("tune")
    if tune is None:
        return "not tuned this run (--minutes 0): the records as they were"
    if tune.get("error"):
        return f"tuning failed: {tune['error']}"
    if tune["stopped"]:
        return (f"{tune['trials_run']} trials in {tune['wall_s']:.0f} s; killed well past the "
                f"{args.minutes:g}-min limit (finished rounds kept)")
    failed = f"; {tune['failed']} kernel(s) failed to tune" if tune["failed"] else ""
    if not tune["trials_run"]:
        return f"nothing to tune: every kernel had {args.trials} trials in {args.db}{failed}"
    share = tune.get("default_share_tuned")
    share = f", {share:.0%} of the default build's time" if share is not None else ""
    limit = f"; the {args.minutes:g}-min limit stopped it" if tune["out_of_time"] else ""
    return (f"{tune['trials_run']} trials in {tune['wall_s']:.0f} s: {tune['with_records']} of "
            f"{tune['kernels']} kernels tuned{share}, {tune['reached']} to {args.trials} "
            f"trials{limit}{failed}")


def _bottlenecks(row: dict) -> list[str]:
    breakdown = _get(row, "tvm", "breakdown")
    if not breakdown:
        return []
    kernels = _get(row, "tvm", "kernels") or {}
    total = sum(v["s"] for v in breakdown.values())
    lines = []
    ranked = sorted(breakdown.items(), key=lambda kv: -kv[1]["s"])
    for name, v in ranked[:TOP_KERNELS]:
        k = kernels.get(name, {})
        gflops = (f"{k['flops'] * v['calls'] / v['s'] / 1e9:6.1f} GFLOP/s"
                  if k.get("flops") and v["s"] else " " * 14)
        trials = (f"{k['trials']} trials" if k.get("valid") else
                  "default schedule" if name != "(vm builtins)" else "")
        lines.append(f"    {100 * v['s'] / total:5.1f} %  {v['s'] * 1e3:8.3f} ms  "
                     f"x{v['calls']:<3d} {gflops}  {trials:16s} {name}")
    return lines


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]



def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:.0e}"


def _fastest(ms: dict, among) -> tuple[str, float] | None:
    """The fastest of ``among`` (keys of ``ms``) that has a median, and its ms."""
    timed = [(k, ms[k]) for k in among if ms.get(k)]
    return min(timed, key=lambda kv: kv[1]) if timed else None


def summarize(row: dict) -> dict:
    """The row's figures as the tables show them (``None`` where a framework failed)."""
    ms = {k: _get(row, k, "ms") for k in ("torch", "compile", "frozen", "ort")}
    ms["tvm default"], ms["tvm tuned"] = (_get(row, "tvm", "default", "ms"),
                                          _get(row, "tvm", "tuned", "ms"))
    ms["tvm"] = ms["tvm tuned"] or ms["tvm default"]
    user, single = _fastest(ms, USER), _fastest(ms, SINGLE)
    export_s, ort_s = _get(row, "torch", "export_s"), _get(row, "ort", "first_s")
    trials = [k["trials"] for k in (_get(row, "tvm", "kernels") or {}).values()]
    return {
        "threads": row.get("threads"), "ms": ms, "fastest_user": user, "fastest_single": single,
        "first_s": {"torch": _get(row, "torch", "first_s"),
                    "compile": _get(row, "compile", "first_s"),
                    "frozen": _get(row, "frozen", "first_s"),
                    "ort": export_s + ort_s if export_s is not None and ort_s is not None
                    else None,
                    "tvm": _get(row, "tvm", "default", "first_s")},
        "modules": {key: _module(m, user, single) for key, m in (row.get("modules") or {}).items()},
        "kernels": _get(row, "tvm", "tuned", "kernels"),
        "trials_per_kernel": ((min(trials), statistics.median_low(trials), max(trials))
                              if trials else None),
        "rel_error": {k: _get(row, *path, "rel_error")
                      for k, path in (("compile", ("compile",)), ("frozen", ("frozen",)),
                                      ("ort", ("ort",)), ("tvm default", ("tvm", "default")),
                                      ("tvm tuned", ("tvm", "tuned")))},
    }


def _module(m: dict | None, user, single) -> dict:
    """One autoplace module's figures, and its speed-ups: the fastest of :data:`USER` over what
    the module runs, and the fastest single framework (:data:`SINGLE`) over its build."""
    if not m or "ms" not in m:
        return {"error": (m or {}).get("error", "no result")}
    return {"runs": m["runs"], "runs_note": m.get("runs_note", ""),
            "ort_variant": m.get("ort_variant"),
            "ms": m["ms"], "build_ms": m["build_ms"],
            "eager_here_ms": (m.get("here_ms") or {}).get("eager"), "times_ms": m["times_ms"],
            "m/p": m["build_ms"] / m["predicted_ms"] if m["predicted_ms"] else None,
            "room": single[1] / m["bound_ms"] if single and m.get("bound_ms") else None,
            "ops": m["ops"], "first_s": m["first_s"], "first_call_s": m["first_call_s"],
            "steps_s": m["steps_s"], "other_s": m["optimize_s"] - sum(m["steps_s"].values()),
            "rel_error": m["rel_error"],
            "vs_user": user[1] / m["ms"] if user else None,
            "vs_here": _vs_here(m.get("here_ms")),
            "vs_single": single[1] / m["build_ms"] if single else None}


def _vs_here(here: dict | None) -> float | None:
    """The faster of eager and ORT over the module, all three timed in blocks turn by turn in
    the module's process (:func:`_here_ms`)."""
    if not here or not here.get("module"):
        return None
    others = [here[k] for k in ("eager", "ort") if here.get(k)]
    return min(others) / here["module"] if others else None


def render(rows: list[dict], args) -> str:
    pairs = [(row, summarize(row)) for row in rows]
    all_cores = f"all: {_all_cores()}" if _all_cores() in args.threads else ""
    return "\n".join([
        f"Frameworks (ms, medians; device {args.device}; threads: of every framework and of "
        f"TVM's pool{'; ' + all_cores if all_cores else ''}):",
        *_frameworks_table(pairs), "",
        "autoplace (ms, medians; speed-ups: the other's median over autoplace's):",
        *_autoplace_table(pairs), "",
        "Time to the first output (s, from the model in memory):", *_first_output_table(pairs),
        "", "Targets (issue 52; speed-ups as above):", *_targets(pairs), "",
        *_notes(pairs, args), ""])


def _frameworks_table(pairs) -> list[str]:
    table = [["model", "threads", "eager", "torch.compile", "frozen", "ORT", "TVM default",
              "TVM tuned", "fastest", "kernels t/d", "trials/kernel",
              "rel.err compile/frozen/ORT/TVM def/tuned"]]
    for row, s in pairs:
        ms, k, tr = s["ms"], s["kernels"], s["trials_per_kernel"]
        table.append([
            row["model"], str(s["threads"] or "-"),
            *(_ms(ms[key]) for key in ("torch", "compile", "frozen", "ort", "tvm default",
                                       "tvm tuned")),
            LABELS[s["fastest_single"][0]] if s["fastest_single"] else "-",
            f"{k['tuned']}/{k['default']}" if k else "-",
            (f"{tr[1]} ({tr[0]}-{tr[2]})" if tr[0] != tr[2] else f"{tr[0]}") if tr else "-",
            " / ".join(_err(e) for e in s["rel_error"].values())])
    return _aligned(table) + [
        "frozen: torch.compile with Inductor's freezing (weights constant and packed once, as "
        "PyTorch advises for CPU inference). TVM: the model on --device alone, default "
        "schedules and, where the store holds records, tuned. fastest: of eager, frozen, ORT "
        "and TVM alone (the single frameworks of the targets). kernels t/d: the tuned build's "
        "kernels with a record / with the default schedule; trials/kernel: median (min-max) "
        "over them; rel.err: against eager."]


def _autoplace_table(pairs) -> list[str]:
    table = [["model", "threads", "autoplace", "runs", "module", "build", "eager here", "m/p",
              "room", "ops per device", "best/module", "here", "best+TVM/build", "rel.err"]]
    for row, s in pairs:
        for key, m in s["modules"].items():
            if "error" in m:
                table.append([row["model"], str(s["threads"]), key, "failed (notes)",
                              *["-"] * 10])
                continue
            table.append([
                row["model"], str(s["threads"]), key, m["runs"], _ms(m["ms"]),
                _ms(m["build_ms"]), _ms(m["eager_here_ms"]),
                f"{m['m/p']:.2f}" if m["m/p"] else "-",
                _x(m["room"]),
                " ".join(f"{d}:{n}" for d, n in m["ops"].items()),
                _x(m["vs_user"]), _x(m["vs_here"]), _x(m["vs_single"]),
                _err(m["rel_error"])])
    mixes = "; ".join(f"{name}: over [--device, {', '.join(r)}]" for name, r in MIXES.items())
    return _aligned(table) + [
        f"defaults: optimize_module(model, inputs) with every default. {mixes}; tuned: with "
        "the store's records. runs: what the module's calls run (the build, or the whole-model "
        "contender that measured faster: eager, onnxruntime, torch.compile); module: its "
        "median, called back to back; build: the build's own; eager here: eager in the same "
        "process, in blocks turn by turn with the build; m/p: the build's measured/predicted; "
        "room: the fastest single framework (measured) over the solver's proven lower bound "
        "(summary()'s bound: at least each op on its cheapest device, no copy charged): no plan "
        "over the plan's costs is predicted faster, so room bounds what mixing could gain; "
        "ops per device: the plan's. "
        f"best/module: the fastest of eager, frozen and ORT over the module (target, defaults: "
        f">= {DEFAULTS_TARGET}x); here: the faster of eager and ORT over the module, the "
        "three timed in blocks turn by turn in the module's process (the frameworks' own "
        "processes can meet the machine in another phase); best+TVM/build: the fastest "
        "single framework (those and TVM alone) over the build (target, mix+ORT: >= "
        f"{MIX_TARGET}x on half the models); rel.err: the build's, against eager."]


def _first_output_table(pairs) -> list[str]:
    keys = list(dict.fromkeys(k for _, s in pairs for k in s["modules"]))
    table = [["model", "threads", "eager", "torch.compile", "frozen", "ORT", "TVM default",
              *keys]]
    split = []
    for row, s in pairs:
        first, modules = s["first_s"], s["modules"]
        table.append([row["model"], str(s["threads"] or "-"),
                      *(_s(first[k]) for k in ("torch", "compile", "frozen", "ort", "tvm")),
                      *(_s(_get(modules, k, "first_s")) for k in keys)])
        for key, m in modules.items():
            if "error" not in m:
                spent = [*m["steps_s"].items(), ("other", m["other_s"])]
                split.append(f"  {row['model']}, {s['threads']} thread(s), {key}: "
                             f"{_s(m['first_s'])} = " + ", ".join(
                                 f"{label} {_s(v)}" for label, v in spent)
                             + f"; first call {m['first_call_s'] * 1e3:.3g} ms")
    return _aligned(table) + [
        "eager: its first call; torch.compile, frozen: their first call (Inductor compiles); "
        "ORT: the ONNX export, the session and its first call; TVM default: the Relax module, "
        "the build and its first call; autoplace: optimize_module and the first call, split "
        "below as the module's result says (steps_s: costs of the TVM devices, calibration "
        "included; costs of the runtime devices, their calls timed; contenders: the whole-model "
        "alternatives timed against the build; other: what no step holds):", *split]


def _targets(pairs) -> list[str]:
    lines = []
    for threads in dict.fromkeys(s["threads"] for _, s in pairs if s["threads"]):
        at = [(row["model"], s["modules"]) for row, s in pairs if s["threads"] == threads]

        def speedups(key, field):
            return [(model, mods[key][field]) for model, mods in at
                    if _get(mods, key, field) is not None]

        got = speedups("defaults", "vs_user")
        lines.append(_target_line(f"{threads} thread(s): defaults >= {DEFAULTS_TARGET}x the "
                                  "fastest of eager, frozen, ORT, every model",
                                  got, DEFAULTS_TARGET, len(got)))
        got = speedups("defaults", "vs_here")
        lines.append(_target_line(f"{threads} thread(s): the same, against eager and ORT timed "
                                  "in blocks turn by turn in the module's process",
                                  got, DEFAULTS_TARGET, len(got)))
        got = speedups("mix+ORT", "vs_single")
        lines.append(_target_line(f"{threads} thread(s): mix+ORT build >= {MIX_TARGET}x the "
                                  "fastest single framework, half the models",
                                  got, MIX_TARGET, math.ceil(len(got) / 2)))
        for model, speedup in speedups("mix+ORT tuned", "vs_single"):
            if model in TUNED_TARGETS:
                lines.append(_target_line(f"{threads} thread(s): mix+ORT tuned build on {model} "
                                          f">= {TUNED_TARGETS[model]}x the fastest single",
                                          [(model, speedup)], TUNED_TARGETS[model], 1))
        mp = [(f"{model} {key}", m["m/p"]) for model, mods in at for key, m in mods.items()
              if key != "defaults" and m.get("m/p")]
        ok = [name for name, r in mp if abs(r - 1) <= MP_TOLERANCE]
        lines.append(f"{threads} thread(s): mixes' measured/predicted within ±"
                     f"{MP_TOLERANCE:.0%}: {len(ok)}/{len(mp)} builds"
                     + (f" {'PASS' if len(ok) == len(mp) else 'FAIL'}" if mp else " (none)"))
    return lines


def _target_line(label: str, got: list[tuple[str, float]], target: float, need: int) -> str:
    """``label: k/n models (each's speed-up) PASS`` where at least ``need`` of ``got`` (model,
    speed-up) reach ``target``."""
    if not got:
        return f"{label}: no figures"
    ok = sum(r >= target for _, r in got)
    return (f"{label}: {ok}/{len(got)} ({', '.join(f'{m} {r:.2f}x' for m, r in got)}) "
            f"{'PASS' if ok >= need else 'FAIL'}")


def _notes(pairs, args) -> list[str]:
    notes, seen = [], set()
    for row, s in pairs:
        if row["model"] not in seen:
            seen.add(row["model"])
            description = _get(row, "torch", "description")
            notes.append(f"{row['model']}: {description}" if description else row["model"])
        at = f"  at {s['threads']} thread(s), " if s["threads"] else "  "
        if "tvm" in row:
            notes.append(f"{at}tuning: {_tuning_note(row, args)}")
        for label, msg in (("failed", row.get("error")), ("PyTorch", _get(row, "torch", "error")),
                           ("ONNX Runtime", _get(row, "ort", "error")),
                           ("torch.compile", _get(row, "compile", "error")),
                           ("torch.compile (freezing)", _get(row, "frozen", "error")),
                           ("TVM", _get(row, "tvm", "error")),
                           *((f"autoplace {key}", m.get("error"))
                             for key, m in s["modules"].items())):
            if msg:
                notes.append(f"{at}{label}: {msg}")
        for key, m in s["modules"].items():
            if m.get("times_ms"):
                level, threads = m.get("ort_variant") or (None, 0)
                how = f" ({level}, {threads} intra-op thread(s))" if level else ""
                notes.append(f"{at}{key} runs {m['runs']}{how}; "
                             "optimize_module timed, in blocks in turn: "
                             + ", ".join(f"{k} {_ms(v)} ms" for k, v in m["times_ms"].items()))
        lines = _bottlenecks(row)
        if lines:
            total = sum(v["s"] for v in row["tvm"]["breakdown"].values())
            notes.append(f"{at}slowest kernels of the tuned TVM build (instrumented run "
                         f"{total * 1e3:.3g} ms; share, time per run, calls, rate, tuning):")
            notes += lines
    return notes


def _all_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _thread_counts(text: str) -> list[int]:
    """``"1,all"`` -> ``[1, this machine's cores]``, each count once, in order."""
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            n = _all_cores() if part == "all" else int(part)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{part!r}: a thread count is a positive integer "
                                             "or 'all'")
        if n not in counts:
            counts.append(n)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[8:11]))
    ap.add_argument("--models", nargs="+", default=list(COMPARED), metavar="NAME",
                    help=f"any of {', '.join(_models.NAMES)} (default: {', '.join(COMPARED)})")
    ap.add_argument("--threads", type=_thread_counts, default=[1], metavar="N[,N...]",
                    help="thread counts, each a row: integers or 'all' (this machine's cores), "
                         "e.g. 1,all (default 1)")
    ap.add_argument("--trials", type=int, default=64,
                    help="trials per kernel to tune up to (default 64)")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="tuning budget per model and thread count; 0: tune nothing, use the "
                         "records as they are (none: no tuned builds)")
    ap.add_argument("--db", type=Path, default=Path("out/vs_frameworks.db"),
                    help="profile store whose tuning records (<db>.tuning/) are used and extended "
                         "(default out/vs_frameworks.db)")
    ap.add_argument("--device", default="cpu:0:native",
                    help="the CPU TVM builds and tunes for: cpu:N:native (LLVM for this host's "
                         "CPU, the default) or cpu:N (generic x86-64); records are per target")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per framework")
    ap.add_argument("--json", action="store_true", help="print a JSON report instead of the table")
    ap.add_argument("--work", type=Path, help="keep each model's files and logs here")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in _models.NAMES]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(_models.NAMES)}")
    if args.trials < 1 or args.repeats < 1:
        ap.error("--trials and --repeats must be at least 1")
    from autoplace import Device

    try:
        if Device.from_spec(args.device).is_gpu:
            ap.error(f"--device {args.device}: the benchmark compares CPU builds (cpu:N[:native])")
    except ValueError as e:
        ap.error(str(e))
    args.db = args.db.resolve()

    def say(msg):
        print(msg, file=sys.stderr if args.json else sys.stdout, flush=True)

    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    say(f"uptime: {uptime}")
    say(f"device {args.device}, threads {', '.join(map(str, args.threads))}, up to "
        f"{args.trials} trials per kernel, {args.minutes:g} min of tuning per model, records in "
        f"{args.db}.tuning")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs_frameworks-") as tmp:
        root = args.work.resolve() if args.work else Path(tmp)
        for name in args.models:
            t0 = time.perf_counter()
            try:
                got = bench_model(name, args, root / name.replace(":", "_"), say)
            except Exception as e:  # noqa: BLE001 - one model's failure must not end the table
                got = [{"model": name, "error": _summary(e)}]
            wall = time.perf_counter() - t0
            for row in got:
                row["model_wall_s"] = wall
            say(f"{name}: done in {wall:.0f} s")
            rows += got
    uptime_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    say(f"uptime: {uptime_after}")
    if args.json:
        print(json.dumps({"uptime": uptime, "uptime_after": uptime_after, "device": args.device,
                          "threads": args.threads, "trials": args.trials,
                          "minutes": args.minutes, "db": str(args.db),
                          "rows": [{**r, "summary": summarize(r)} for r in rows]}, indent=1))
    else:
        print()
        print(render(rows, args))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(*sys.argv[2:]))
    sys.exit(main())
