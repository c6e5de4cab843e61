"""MetaSchedule's side of a tuning campaign: its runner and builder for a device, one round of
candidates of one kernel, and what its database holds of a kernel."""

from __future__ import annotations

#: Seconds a candidate may take to run (here, or on a remote session) before it counts as failed.
RUN_TIMEOUT_S = 60


def ms_runner(runner):
    """MetaSchedule's runner for candidates of ``runner``'s device: its RPC runner, through the
    same tracker and key, for a remote; else the local one."""
    from tvm.s_tir import meta_schedule as ms

    from autoplace.profile.remote import RPCRunner

    if isinstance(runner, RPCRunner):
        config = ms.runner.RPCConfig(tracker_host=runner.host, tracker_port=runner.port,
                                     tracker_key=runner.key, session_timeout_sec=RUN_TIMEOUT_S)
        return ms.runner.RPCRunner(rpc_config=config)
    return ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S)


def ms_builder():
    """MetaSchedule's local builder, building candidates with :func:`build_candidate`."""
    from tvm.s_tir import meta_schedule as ms

    return ms.builder.LocalBuilder(max_workers=search_threads(), timeout_sec=120,
                                   f_build=build_candidate)


def search_threads() -> int:
    """Threads for MetaSchedule's search, cost model and builds: every core this process may
    use (they run between measurements; candidates run with the device's own thread count,
    its target's ``num-cores``)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_candidate(mod, target, params):
    """MetaSchedule's default build of a candidate, without importing TVM's tensor intrinsics
    for a CPU target: that import takes tens of seconds (each of its hundreds of TVMScript
    functions walks the interpreter's stack), and MetaSchedule's local builder pays it in a new
    worker process every round. A candidate's TIR holds its tensorized blocks' bodies already,
    so building it needs no registered intrinsic."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    if target.kind.name != "llvm":
        return default_build(mod, target, params)
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return build(mod, target=target)


def import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (``tvm.s_tir.tensor_intrin``), which MetaSchedule's
    ``TuneContext`` imports, in seconds rather than minutes.

    Each of their hundreds of TVMScript functions takes ``inspect.stack()``, and for every
    frame of a file that is no module's (``<frozen importlib._bootstrap>`` and the like, many in
    an import) ``inspect.getmodule`` walks all of ``sys.modules`` before it finds none. During
    the import such frames are answered None at once: what that walk ends with."""
    import inspect
    import sys

    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    walk = inspect.getmodule

    def getmodule(obj, _filename=None):
        if inspect.isframe(obj) and obj.f_code.co_filename.startswith("<"):
            return None
        return walk(obj, _filename)

    inspect.getmodule = getmodule
    try:
        import tvm.s_tir.tensor_intrin  # noqa: F401
    finally:
        inspect.getmodule = walk


def tune_one(workload, target, database, folder, name, trials, runner, builder,
              cost_model) -> None:
    """One MetaSchedule round of ``trials`` candidates of ``workload``, into ``database``."""
    from tvm.s_tir import meta_schedule as ms

    import_tensor_intrinsics()

    work = folder / "work"
    work.mkdir(parents=True, exist_ok=True)
    if database.has_workload(workload):
        # The database's own copy: MetaSchedule matches kernels by structure, ignoring block
        # names, and files every record under the first copy it saw; a trace made on a twin
        # with other block names would not replay on it (and TVM would refuse the database).
        workload = database.commit_workload(workload).mod
    context = ms.TuneContext(workload, target=target, space_generator="post-order-apply",
                             search_strategy="evolutionary", task_name=name,
                             num_threads=search_threads())
    # A global budget of one trial: the scheduler stops once a round's candidates are counted,
    # so this is exactly one round of up to ``trials`` (it would otherwise search again, round
    # after round, for a kernel whose few schedules are all measured).
    ms.tune_tasks(tasks=[context], task_weights=[1.0], work_dir=str(work),
                  max_trials_global=1, max_trials_per_task=trials,
                  num_trials_per_iter=trials, database=database, builder=builder,
                  runner=runner, cost_model=cost_model, task_scheduler="round-robin")


def best_s(database, workload) -> float | None:
    """Mean run seconds of the fastest record of ``workload`` in ``database``, or None."""
    if database is None or not database.has_workload(workload):
        return None
    top = database.get_top_k(database.commit_workload(workload), 1)
    if not top or not top[0].run_secs:
        return None
    secs = [float(x) for x in top[0].run_secs]
    return sum(secs) / len(secs)


def recorded(database, workload) -> tuple[int, int]:
    """(records of ``workload``, of which measured successfully) in ``database``."""
    import tvm_ffi

    if database is None or not database.has_workload(workload):
        return 0, 0
    entry = database.commit_workload(workload)  # present already: nothing is written
    ok = len(database.get_top_k(entry, 1 << 30))
    every = sum(1 for r in database.get_all_tuning_records()
                if r.workload.same_as(entry) or tvm_ffi.structural_equal(r.workload.mod, workload))
    return every, ok


def flops(workload) -> float:
    from tvm.s_tir import analysis

    try:
        return float(analysis.estimate_tir_flops(workload))
    except Exception:  # noqa: BLE001 - an estimate only orders the kernels
        return 0.0
