"""TVM and autoplace's mixed plans against PyTorch eager, ``torch.compile`` and ONNX Runtime.

TVM (default and tuned kernels) and autoplace's mixed plans (TVM's kernels and PyTorch's, per
op) against PyTorch eager, ``torch.compile`` and ONNX Runtime, per model, at one thread count:
medians, ratios, relative errors, and the kernels that hold the tuned build back.

Run: .venv/bin/python -m benchmarks vs_frameworks [--models zoo:resnet resnet18 ...]
     [--trials 64] [--minutes 20] [--db out/vs_frameworks.db] [--device cpu:0:native]
     [--threads 1] [--repeats 20] [--json] [--work DIR]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: torchvision 0.28.0, onnxruntime,
transformers). Without onnxruntime its column says so; without transformers the BERT encoder is
written in torch; without torchvision its models' rows say so.

Each framework runs in its own process (TVM's idle worker threads spin, and PyTorch timed after
TVM in one process ran up to 100x slower), one model after another, in this order:

1. PyTorch eager: the reference outputs, the latency, and an ONNX export (``dynamo=False``).
2. ONNX Runtime on that export (``ORT_ENABLE_ALL``, ``intra_op_num_threads`` = ``--threads``),
   then ``torch.compile`` (Inductor; its first call, which compiles, is reported apart), by
   default and with Inductor's ``freezing`` (weights folded and packed once for oneDNN, as
   PyTorch advises for inference on a CPU, and as the mixed plans' PyTorch calls hold them).
3. Tuning with ``autoplace.tune`` for this CPU (``-mcpu`` of the host, ``num-cores`` =
   ``--threads``), records kept beside ``--db``, to ``--trials`` per kernel with a time limit of
   ``--minutes``: the campaign times each kernel's default schedule, gives every kernel one
   round of 16 trials, the slowest first, then the rest of their trials, and starts nothing past
   the limit (the worker is killed if it runs on well past it; finished rounds are kept). A
   second run with the same ``--db`` and ``--trials`` finds nothing pending and tunes nothing.
4. TVM: ``autoplace.compile`` of the model on one CPU (``--device``), without records (default
   schedules) and with them (tuned); latencies, relative errors against PyTorch, and, for the
   tuned build, each kernel's share of the run (timed with the VM's instrument hook).
5. The mixed plans: ``autoplace.optimize_module`` of the PyTorch model over ``[--device,
   torch:cpu]``, without the records and with them; the module as a user gets it (it runs the
   model eagerly where that measured faster than its build, and the table says so), the build's
   own latency and its measured/predicted, and eager PyTorch in the same process, timed turn
   by turn (each call following every other as often); with the records, the module and TVM
   alone as a module, in turns of their own. The targets are judged against these. PyTorch
   calls from the build run on one thread. Beside them, the most any placement could gain over
   TVM alone by the plan's own costs (the solver's lower bound).

Latencies are medians of ``--repeats`` calls after two warm-up calls (fewer when one model's
calls pass 30 s, never under 3); TVM's call is ``CompiledModel``'s, on numpy arrays, as a user
calls it. Relative error: ||out - torch|| / ||torch|| over all outputs.
Weights are random and re-initialised so that outputs are O(1) (``_models.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _models

WARMUP = 2
TIME_CAP_S = 30.0
ROUND = 16  # trials per MetaSchedule round: every kernel gets one before any gets more
TOP_KERNELS = 5
WORKER_TIMEOUT_S = 45 * 60
COMPARED = (*_models.ZOO, "resnet18", "mobilenet_v3_small", "bert")  # the default --models


# ---------------------------------------------------------------------------------------------
# Workers: each runs in its own process and writes one JSON result.


def _median_ms(fn, repeats: int) -> tuple[float, int]:
    """Median latency of ``fn()`` in ms, and how many calls it is the median of."""
    (ms,), n = _turns_ms([fn], repeats)
    return ms, n


def _turns_ms(fns, repeats: int) -> tuple[list[float], int]:
    """Median latency in ms of each of ``fns``, called turn by turn so that all see the machine
    alike, and how many calls each is the median of: up to ``repeats`` (or the few more a pass
    needs), fewer once the calls pass 30 s, never under 3; after two warm-up calls each. The calls
    follow an Eulerian circuit of the complete directed graph on them, pass after pass, so that
    each follows every other exactly as often (one that runs after another meets the cache that
    one left). autoplace.run.overhead.turns_s's rule, written here again: the PyTorch and ONNX
    Runtime workers import neither autoplace nor TVM."""
    import networkx as nx

    for fn in fns:
        for _ in range(WARMUP):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    order = (list(range(n)) if n < 2 else
             [u for u, _ in nx.eulerian_circuit(nx.complete_graph(n, create_using=nx.DiGraph),
                                                source=0)])
    start = time.perf_counter()
    while len(times[0]) < repeats and (len(times[0]) < 3
                                       or time.perf_counter() - start < TIME_CAP_S):
        for i in order:
            t = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) * 1e3 for t in times], len(times[0])


def _save_arrays(path: Path, arrays) -> None:
    import numpy as np

    np.savez(path, *arrays)


def _load_arrays(path: Path) -> list:
    import numpy as np

    with np.load(path) as f:
        return [f[f"arr_{k}"] for k in range(len(f.files))]


def _worker_torch(cfg: dict) -> dict:
    import torch

    torch.set_num_threads(cfg["threads"])
    model = _models.load(cfg["model"], cfg["seed"])
    args = tuple(torch.from_numpy(x) for x in model.inputs)
    with torch.inference_mode():
        ref = model.module(*args)
        ms, n = _median_ms(lambda: model.module(*args), cfg["repeats"])
    ref = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    ref = [r.numpy() for r in ref]
    work = Path(cfg["work"])
    _save_arrays(work / "inputs.npz", model.inputs)
    _save_arrays(work / "torch.npz", ref)
    out = {"ms": ms, "n": n, "description": model.description,
           "output_rms": float(sum((r.astype("float64") ** 2).sum() for r in ref)
                               / sum(r.size for r in ref)) ** 0.5}
    try:
        with torch.no_grad():
            torch.onnx.export(model.module, args, str(work / "model.onnx"), dynamo=False,
                              opset_version=17)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime's column reports it
        out["onnx_error"] = _summary(e)
    return out


def _worker_ort(cfg: dict) -> dict:
    try:
        import onnxruntime as ort
    except ImportError:
        return {"error": f"onnxruntime not installed: {_models.INSTALL_HINT}"}
    work = Path(cfg["work"])
    if not (work / "model.onnx").exists():
        return {"error": "no ONNX export (see PyTorch's error)"}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cfg["threads"]
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(work / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    inputs = _load_arrays(work / "inputs.npz")
    feed = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
    outs = sess.run(None, feed)
    ms, n = _median_ms(lambda: sess.run(None, feed), cfg["repeats"])
    return {"ms": ms, "n": n, "rel_error": _models.rel_error(outs, _load_arrays(work / "torch.npz")),
            "version": ort.__version__}


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
    outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
    return {"ms": ms, "n": n, "first_s": first_s,
            "rel_error": _models.rel_error([o.numpy() for o in outs], _load_arrays(work / "torch.npz"))}


def _worker_mixed(cfg: dict) -> dict:
    """``autoplace.optimize_module`` over ``[--device, torch:cpu]``: TVM's kernels and PyTorch's
    chosen per op, without tuning records and with them; what the module runs (the build, or
    the model eagerly where that measured faster), and the build's own latency and prediction."""
    import torch

    import autoplace

    torch.set_num_threads(cfg["threads"])
    model = _models.load(cfg["model"], cfg["seed"])
    work = Path(cfg["work"])
    args = tuple(torch.from_numpy(x) for x in _load_arrays(work / "inputs.npz"))
    ref = _load_arrays(work / "torch.npz")
    devices = [_device(cfg), autoplace.Device.torch()]
    out = {}
    for kind, db in (("default", None), ("tuned", cfg["db"])):
        t0 = time.perf_counter()
        m = autoplace.optimize_module(model.module, args, devices, db=db)
        build_s = time.perf_counter() - t0
        # Beside it, turn by turn: its build and eager; then (tuned) it and TVM alone as a
        # module. Apart, as a model of 10 ms run between two calls of one of 0.5 ms leaves the
        # caches to it, and no user runs the two turn by turn.
        with torch.inference_mode():
            outs = m(*args)
            (ms, built_ms, eager_ms), _ = _turns_ms(
                [lambda: m(*args), lambda: m.run_flat(args), lambda: model.module(*args)],
                cfg["repeats"])
            tvm_ms = beside_tvm_ms = None
            if kind == "tuned":
                alone = autoplace.optimize_module(model.module, args, devices[:1], db=db,
                                                  eager_fallback=False)
                (beside_tvm_ms, tvm_ms), _ = _turns_ms([lambda: m(*args), lambda: alone(*args)],
                                                       cfg["repeats"])
        outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
        res, plan = m.result, m.plan  # the plan built: the result's, or a close call's
        alone_s = res.baselines.get(f"only {devices[0].name}")
        out[kind] = {"ms": ms, "runs": m.runs, "build_ms": built_ms, "eager_here_ms": eager_ms,
                     "tvm_here_ms": tvm_ms, "beside_tvm_ms": beside_tvm_ms,
                     "predicted_ms": None if plan.predicted_s is None else plan.predicted_s * 1e3,
                     # the most any plan gains over TVM alone, by the costs: the solver's bound
                     "bound_gain": alone_s / res.solution.bound
                     if alone_s and res.solution.bound > 0 else None,
                     "optimize_s": build_s,
                     "on_torch": sum(d == "torch" for d in plan.assignment),
                     "nodes": len(plan.nodes), "kernels": res.kernels,
                     "rel_error": _models.rel_error([o.numpy() for o in outs], ref)}
    return out


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
    import autoplace
    from autoplace.profile import LocalRunner, fingerprint
    from autoplace.tuning import open_records

    model = _models.load(cfg["model"], cfg["seed"])
    mod = _models.relax_module(model, cfg["seed"])
    work = Path(cfg["work"])
    inputs = _load_arrays(work / "inputs.npz")
    ref = _load_arrays(work / "torch.npz")
    dev = _device(cfg)
    plan = autoplace.place(autoplace.OpGraph.from_relax(mod), [dev], [("*", dev.name)])
    records, notes = open_records(cfg["db"], [dev], [fingerprint(LocalRunner(dev).info())])
    out = {"target": str(dev.tvm_target()), "records": notes}
    for kind, recs in (("default", None), ("tuned", records)):
        t0 = time.perf_counter()
        run = autoplace.compile(mod, plan, records=recs)
        build_s = time.perf_counter() - t0
        outs = run(*inputs)
        ms, n = _median_ms(lambda: run(*inputs), cfg["repeats"])
        out[kind] = {"ms": ms, "n": n, "build_s": build_s, "kernels": run.kernels,
                     "rel_error": _models.rel_error(outs, ref)}
        if kind == "tuned":
            out["kernels"] = _kernel_records(run, records, dev)
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
           "tune": _worker_tune, "tvm": _worker_tvm, "mixed": _worker_mixed}


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
           soft_deadline_s: float | None = None) -> dict:
    """Run a worker; past ``soft_deadline_s`` it is killed (with its process group) and what it
    left is read back with ``"stopped": True``.

    Killed, not interrupted: SIGINT reaches ``autoplace.tune`` inside MetaSchedule's C++ loop as
    a bare ``RuntimeError``, which it takes for a failed kernel before going on to the next."""
    out = Path(cfg["work"]) / f"{role}.json"
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


def bench_model(name: str, args, work: Path, say) -> dict:
    """Every framework's numbers for one model (errors in their place, never raised)."""
    work.mkdir(parents=True, exist_ok=True)
    cfg = {"model": name, "seed": 0, "threads": args.threads, "repeats": args.repeats,
           "trials": args.trials, "minutes": args.minutes, "db": str(args.db),
           "device": args.device, "work": str(work)}
    row: dict = {"model": name}
    with open(work / "log.txt", "w") as log:
        say(f"{name}: PyTorch eager ...")
        row["torch"] = _spawn("torch", cfg, log, timeout_s=WORKER_TIMEOUT_S)
        if "error" in row["torch"]:
            return row  # nothing to compare with
        say(f"{name}: ONNX Runtime ...")
        row["ort"] = _spawn("ort", cfg, log, timeout_s=WORKER_TIMEOUT_S)
        if row["torch"].get("onnx_error"):
            row["ort"]["error"] = f"ONNX export failed: {row['torch']['onnx_error']}"
        say(f"{name}: torch.compile ...")
        row["compile"] = _spawn("compile", cfg, log, timeout_s=WORKER_TIMEOUT_S)
        say(f"{name}: torch.compile with freezing ...")
        row["frozen"] = _spawn("frozen", cfg, log, timeout_s=WORKER_TIMEOUT_S)
        if args.minutes > 0:
            say(f"{name}: tuning to {args.trials} trials per kernel, at most {args.minutes:g} min")
            before = _records(args.db)
            # The campaign stops itself; a kernel started just before the limit may take the
            # rest of its trials (a few minutes) before it does.
            row["tune"] = _spawn("tune", cfg, log, timeout_s=WORKER_TIMEOUT_S,
                                 tvm_threads=args.threads,
                                 soft_deadline_s=args.minutes * 60 * 1.25 + 180)
            row["tune"]["trials_run"] = _records(args.db) - before
        say(f"{name}: TVM default and tuned builds ...")
        row["tvm"] = _spawn("tvm", cfg, log, timeout_s=WORKER_TIMEOUT_S, tvm_threads=args.threads)
        say(f"{name}: mixed plans (TVM + PyTorch) ...")
        row["mixed"] = _spawn("mixed", cfg, log, timeout_s=WORKER_TIMEOUT_S,
                              tvm_threads=args.threads)
    return row


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
    return f"{x:.3g} ms" if x < 100 else f"{x:.0f} ms"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _get(row: dict, *path):
    for key in path:
        if not isinstance(row, dict) or key not in row:
            return None
        row = row[key]
    return row


def summarize(row: dict) -> dict:
    """The row's figures as the table shows them (``None`` where a framework failed)."""
    eager, ort = _get(row, "torch", "ms"), _get(row, "ort", "ms")
    default, tuned = _get(row, "tvm", "default", "ms"), _get(row, "tvm", "tuned", "ms")
    trials = [k["trials"] for k in (_get(row, "tvm", "kernels") or {}).values()]
    return {
        "eager_ms": eager, "ort_ms": ort, "default_ms": default, "tuned_ms": tuned,
        "tuned/eager": tuned / eager if tuned and eager else None,
        "tuned/ort": tuned / ort if tuned and ort else None,
        "default/tuned": default / tuned if default and tuned else None,
        "kernels": _get(row, "tvm", "tuned", "kernels"),
        "trials_per_kernel": ((min(trials), statistics.median_low(trials), max(trials))
                              if trials else None),
        "tune_s": _get(row, "tune", "wall_s"),
        "trials_run": _get(row, "tune", "trials_run"),
        "rel_error": {k: _get(row, *p) for k, p in (("default", ("tvm", "default", "rel_error")),
                                                     ("tuned", ("tvm", "tuned", "rel_error")),
                                                     ("ort", ("ort", "rel_error")),
                                                     ("compile", ("compile", "rel_error")),
                                                     ("frozen", ("frozen", "rel_error")),
                                                     ("mixed", ("mixed", "default", "rel_error")),
                                                     ("mixed tuned",
                                                      ("mixed", "tuned", "rel_error")))},
        "compile_ms": _get(row, "compile", "ms"), "frozen_ms": _get(row, "frozen", "ms"),
        **{f"mixed_{k}": _mixed(row, k) for k in ("default", "tuned")},
    }


def _mixed(row: dict, kind: str) -> dict | None:
    """One mixed module's figures: what it runs and its latency, the build's latency and its
    measured/predicted, and the speed-ups the issue sets targets for (eager's time over the
    module's; the faster of eager and TVM alone over the module's)."""
    m = _get(row, "mixed", kind)
    if not m or "ms" not in m:
        return None
    eager = m["eager_here_ms"]  # timed beside the module, turn by turn
    tvm_alone = m.get("tvm_here_ms")  # timed beside the module too, in turns of their own
    speedups = [eager / m["ms"]] + ([tvm_alone / m["beside_tvm_ms"]] if tvm_alone else [])
    return {"ms": m["ms"], "runs": m["runs"], "build_ms": m["build_ms"], "eager_ms": eager,
            "tvm_ms": tvm_alone,
            "m/p": m["build_ms"] / m["predicted_ms"] if m["predicted_ms"] else None,
            "on_torch": f"{m['on_torch']}/{m['nodes']}", "bound_gain": m.get("bound_gain"),
            "eager_speedup": eager / m["ms"], "best_speedup": min(speedups)}


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


def render(rows: list[dict], args) -> str:
    head = ["model", "TVM default", "TVM tuned", "PyTorch", "ORT", "tuned/eager", "tuned/ORT",
            "default/tuned", "kernels t/d", "trials/kernel", "tuning (this run)",
            "rel.err def/tuned/ORT"]
    table = [head]
    notes = []
    for row in rows:
        s = summarize(row)
        k, tr, err = s["kernels"], s["trials_per_kernel"], s["rel_error"]
        table.append([
            row["model"], _ms(s["default_ms"]), _ms(s["tuned_ms"]), _ms(s["eager_ms"]),
            _ms(s["ort_ms"]), _ratio(s["tuned_ms"], s["eager_ms"]),
            _ratio(s["tuned_ms"], s["ort_ms"]), _ratio(s["default_ms"], s["tuned_ms"]),
            f"{k['tuned']}/{k['default']}" if k else "-",
            (f"{tr[1]} ({tr[0]}-{tr[2]})" if tr[0] != tr[2] else f"{tr[0]}") if tr else "-",
            (f"{s['tune_s']:.0f} s, {s['trials_run']} trials" if s["tune_s"] is not None
             else "-"),
            " / ".join(f"{err[k]:.0e}" if err[k] is not None else "-"
                       for k in ("default", "tuned", "ort")),
        ])
        description = _get(row, "torch", "description")
        notes.append(f"{row['model']}: {description}" if description else row["model"])
        for label, msg in (("failed", row.get("error")), ("PyTorch", _get(row, "torch", "error")),
                           ("ONNX Runtime", _get(row, "ort", "error")),
                           ("TVM", _get(row, "tvm", "error"))):
            if msg:
                notes.append(f"  {label}: {msg}")
        if "tvm" in row:
            notes.append(f"  tuning: {_tuning_note(row, args)}")
        lines = _bottlenecks(row)
        if lines:
            total = sum(v["s"] for v in row["tvm"]["breakdown"].values())
            notes.append(f"  slowest kernels of the tuned build (instrumented run "
                         f"{total * 1e3:.3g} ms; share, time per run, calls, rate, tuning):")
            notes += lines
        for label, msg in (("torch.compile", _get(row, "compile", "error")),
                           ("torch.compile (freezing)", _get(row, "frozen", "error")),
                           ("mixed", _get(row, "mixed", "error"))):
            if msg:
                notes.append(f"  {label}: {msg}")
    legend = (f"{args.threads} thread(s), device {args.device}; medians; a/b > 1: a is slower. "
              "kernels t/d: the tuned build's kernels with a record / with the default schedule; "
              "trials/kernel: median (min-max) over them; rel.err: against PyTorch.")
    return "\n".join(_aligned(table) + [legend, "", *_mixed_table(rows), ""] + notes)


def _aligned(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]


def _mixed_table(rows: list[dict]) -> list[str]:
    """The mixed plans (TVM + PyTorch per op) beside every framework, and the issue's targets."""
    head = ["model", "PyTorch", "torch.compile", "frozen", "ORT", "TVM default", "TVM tuned",
            "mixed default", "build", "eager here", "mixed tuned", "build", "eager here",
            "TVM tuned here",
            "eager/mixed", "best/mixed tuned", "most by costs", "m/p def/tuned",
            "on PyTorch def/tuned",
            "rel.err compile/frozen/mixed def/tuned"]
    table = [head]
    for row in rows:
        s = summarize(row)
        d, t = s["mixed_default"], s["mixed_tuned"]

        def cell(m):
            return "-" if m is None else f"{_ms(m['ms'])}{' (eager)' if m['runs'] == 'eager' else ''}"

        def ratio(m, key):
            return f"{m[key]:.2f}x" if m and m[key] else "-"

        table.append([row["model"], _ms(s["eager_ms"]), _ms(s["compile_ms"]),
                      _ms(s["frozen_ms"]), _ms(s["ort_ms"]),
                      _ms(s["default_ms"]), _ms(s["tuned_ms"]),
                      cell(d), _ms(d and d["build_ms"]), _ms(d and d["eager_ms"]),
                      cell(t), _ms(t and t["build_ms"]), _ms(t and t["eager_ms"]),
                      _ms(t and t["tvm_ms"]),
                      ratio(d, "eager_speedup"), ratio(t, "best_speedup"),
                      ratio(t, "bound_gain"),
                      " / ".join(f"{m['m/p']:.2f}" if m and m["m/p"] else "-" for m in (d, t)),
                      " / ".join(m["on_torch"] if m else "-" for m in (d, t)),
                      " / ".join(f"{s['rel_error'][k]:.0e}" if s["rel_error"][k] is not None
                                 else "-" for k in ("compile", "frozen", "mixed",
                                                    "mixed tuned"))])
    legend = ("frozen: torch.compile with Inductor's freezing (weights constant and packed "
              "once, as PyTorch advises for CPU inference). "
              "mixed: autoplace.optimize_module over [device, torch:cpu], per op TVM's kernel or "
              "PyTorch's, without tuning records (default) and with them (tuned); '(eager)': the "
              "module runs the model eagerly, which measured faster than its build; build: the "
              "build's own latency; eager here: the model in eager PyTorch in the same process, "
              "timed turn by turn with the module and its build. eager/mixed: eager here over the "
              "default mixed module (target >= 0.97x); best/mixed tuned: the faster of eager here "
              "and TVM tuned here (TVM alone with the records, as a module, timed turn by turn "
              "with the tuned mixed module, apart from eager) over the tuned mixed module "
              "(target >= 1.1x); most by costs: the most any placement could gain over TVM "
              "alone by the plan's costs (TVM alone's predicted latency over the solver's lower "
              "bound). m/p: the build's "
              "measured over predicted latency. on PyTorch: nodes placed there.")
    return _aligned(table) + [legend]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[3:6]))
    ap.add_argument("--models", nargs="+", default=list(COMPARED), metavar="NAME",
                    help=f"any of {', '.join(_models.NAMES)} (default: {', '.join(COMPARED)})")
    ap.add_argument("--trials", type=int, default=64,
                    help="trials per kernel to tune up to (default 64)")
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="tuning budget per model; 0: tune nothing, use the records as they are")
    ap.add_argument("--db", type=Path, default=Path("out/vs_frameworks.db"),
                    help="profile store whose tuning records (<db>.tuning/) are used and extended "
                         "(default out/vs_frameworks.db)")
    ap.add_argument("--device", default="cpu:0:native",
                    help="the CPU TVM builds and tunes for: cpu:N:native (LLVM for this host's "
                         "CPU, the default) or cpu:N (generic x86-64); records are per target")
    ap.add_argument("--threads", type=int, default=1, help="threads of every framework (default 1)")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls per framework")
    ap.add_argument("--json", action="store_true", help="print a JSON report instead of the table")
    ap.add_argument("--work", type=Path, help="keep each model's files and logs here")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in _models.NAMES]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(_models.NAMES)}")
    if args.trials < 1 or args.threads < 1 or args.repeats < 1:
        ap.error("--trials, --threads and --repeats must be at least 1")
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
    say(f"device {args.device}, threads {args.threads}, up to {args.trials} trials per kernel, "
        f"{args.minutes:g} min of tuning per model, records in {args.db}.tuning")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs_frameworks-") as tmp:
        root = args.work.resolve() if args.work else Path(tmp)
        for name in args.models:
            t0 = time.perf_counter()
            try:
                row = bench_model(name, args, root / name.replace(":", "_"), say)
            except Exception as e:  # noqa: BLE001 - one model's failure must not end the table
                row = {"model": name, "error": _summary(e)}
            row["wall_s"] = time.perf_counter() - t0
            say(f"{name}: done in {row['wall_s']:.0f} s")
            rows.append(row)
    if args.json:
        print(json.dumps({"uptime": uptime, "device": args.device, "threads": args.threads,
                          "trials": args.trials, "minutes": args.minutes, "db": str(args.db),
                          "rows": [{**r, "summary": summarize(r)} for r in rows]}, indent=1))
    else:
        print()
        print(render(rows, args))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(*sys.argv[2:]))
    sys.exit(main())
