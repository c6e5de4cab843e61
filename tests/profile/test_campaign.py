"""Profiling campaigns on this machine's CPU: dedup, resume after a kill, concurrent writers,
unsupported ops discovered, and measured costs flowing into ``optimize``."""

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict import MeasuredCostModel
from autoplace.profile import (DeviceProfile, ProfileStore, ProfileStoreError, TimingPolicy,
                               run_campaign)

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.3)


def _cumsum_of_bool():
    """``cumsum`` of a bool tensor, which TVM 0.27's LLVM codegen cannot build (it is what
    GPT-2's importer emits), next to an ``add`` that builds fine."""
    from tvm import relax

    bb = relax.BlockBuilder()
    m = relax.Var("mask", relax.TensorType((8,), "bool"))
    x = relax.Var("x", relax.TensorType((8,), "float32"))
    with bb.function("main", [m, x]):
        with bb.dataflow():
            c = bb.emit(relax.op.cumsum(m, axis=0))
            y = bb.emit(relax.op.add(x, x))
            out = bb.emit_output(relax.Tuple([c, y]))
        bb.emit_func_output(out)
    return bb.get()


def _cli(*args, drained=False):
    """``python -m autoplace *args``. ``drained``: its output read as it comes (a pipe left
    unread stops a process that fills it), its last lines kept for ``p.tail()``."""
    p = subprocess.Popen([sys.executable, "-m", "autoplace", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT if drained else subprocess.PIPE, text=True)
    if not drained:
        return p
    lines = collections.deque(maxlen=20)
    threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True).start()
    p.tail = lambda: "".join(lines)[-2000:] or "(nothing)"
    return p


def _rows(db):
    """The store's measurements, read only (a reader that created tables or switched the
    journal while a campaign writes would be part of what the tests check)."""
    if not db.exists():
        return {}
    try:
        store = ProfileStore(db, readonly=True)
    except ProfileStoreError:  # the campaign has made the file, not yet its tables
        return {}
    with store:
        return {(m.workload, m.device): (m.median_s, m.measured_at) for m in store.measurements()}


def test_campaign_measures_each_workload_once(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    models = [(n, zoo.load(n).mod) for n in ("mlp", "branchy_cnn")]
    rep = run_campaign(models, ["cpu:0", "cpu:1"], store, policy=FAST, progress=False)
    # mlp has 12 nodes but 3 workloads; branchy_cnn 10 nodes, 9 workloads; none shared.
    assert (rep.nodes, rep.workloads) == (22, 12)
    cpu0, cpu1 = rep.devices
    assert cpu0.fingerprint == cpu1.fingerprint  # the same cores: measured once, not twice
    assert (cpu0.measured, cpu1.pending, cpu0.error, cpu1.error) == (12, 0, None, None)
    ms = store.measurements(cpu0.fingerprint)
    assert len(ms) == 12 and all(m.ok and 0 < m.min_s <= m.median_s for m in ms)
    assert all(m.repeats >= 2 and m.number >= 1 for m in ms)
    # Seconds of one call: all the calls timed fit in the seconds the campaign spent timing
    # (a row in ms is 1000 times over), on any host at any load.
    assert sum(m.min_s * m.number * m.repeats for m in ms) <= cpu0.seconds
    [link] = store.links()
    # Bytes per second, within what the link's own copies moved (a line through them: not
    # steeper than the slowest copy, not much flatter than the fastest).
    assert link.alpha_s >= 0 and len(link.points) >= 2
    moved = [size / seconds for size, seconds in link.points]
    assert min(moved) / 2 < link.beta_bps < 10 * max(moved), link
    again = run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False)
    assert again.pending == 0 and again.devices[0].measured == 0
    assert store.workload_models()[ms[0].workload] == {"mlp": 4}


def test_passes_time_every_workload_again_and_resume(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    models = [("m", _cumsum_of_bool()), ("mlp", zoo.load("mlp").mod)]
    first = run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False, links=False)
    before = {m.workload: m for m in store.measurements() if m.ok}
    rep = run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False, links=False,
                       passes=3)
    # 4 workloads build (3 of mlp, the add), one does not: 2 more passes of the 4, none of it.
    assert (first.devices[0].measured, rep.devices[0].pending, rep.devices[0].measured,
            rep.devices[0].unsupported) == (4, 4, 8, 0)
    after = {m.workload: m for m in store.measurements() if m.ok}
    assert {m.passes for m in after.values()} == {3} and after.keys() == before.keys()
    assert all(after[k].min_s <= before[k].min_s for k in after)  # the fastest occasion is kept
    again = run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False, links=False,
                         passes=3)
    assert again.pending == 0 and again.devices[0].measured == 0
    with pytest.raises(ValueError, match="passes must be at least 1"):
        run_campaign(models, ["cpu:0"], store, passes=0)


def test_unsupported_ops_are_discovered_and_avoided(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    rep = run_campaign([("m", _cumsum_of_bool())], ["cpu:0"], store, policy=FAST,
                       progress=False, links=False)
    assert (rep.devices[0].measured, rep.devices[0].unsupported) == (1, 1)
    [bad] = [m for m in store.measurements() if not m.ok]
    assert json.loads(bad.workload)[0] == "relax.cumsum" and "build failed" in bad.error
    prof = DeviceProfile.from_store(store, "cpu:0")
    graph = autoplace.OpGraph.from_relax(_cumsum_of_bool())
    model = MeasuredCostModel({"a": prof})
    a, b = autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")
    cost = model.predict(graph, a)
    assert np.isinf(cost[0]) and cost[1] == prof.latency_s[graph.nodes[1].workload_key]
    assert model.sources(graph, a) == ["unsupported", "measured"]
    assert model.sources(graph, b) == ["roofline", "roofline"]  # b has no profile
    res = autoplace.optimize(_cumsum_of_bool(), [a, b], cost_model=model)
    assert res.plan.assignment[0] == "b"  # the solver keeps cumsum off the device that failed
    assert res.plan.cost_sources == ("unsupported+roofline", "measured+roofline")
    with pytest.raises(autoplace.InfeasibleError, match="cumsum"):
        autoplace.optimize(_cumsum_of_bool(), [a], cost_model=model)


def test_measured_profile_drives_costs_and_links(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    mod = zoo.load("branchy_cnn").mod
    run_campaign([("b", mod)], ["cpu:0", "cpu:1"], store, policy=FAST, progress=False)
    prof = DeviceProfile.from_store(store, "cpu:0")
    devs = [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]
    # No segment overhead: the copies' alpha is then the link's alone (build_problem adds it).
    res = autoplace.optimize(mod, devs, cost_model=MeasuredCostModel(prof), segment_overhead_s=0,
                             db=None)  # the store's default-kernel costs, not shipped tuned ones
    graph = res.graph
    assert np.allclose(res.problem.cost[:, 0], [prof.latency_s[n.workload_key] for n in graph.nodes])
    assert set(res.plan.cost_sources) == {"measured"}
    fit = prof.link()
    assert res.problem.alpha[0, 1] == fit.alpha_s and res.problem.beta[1, 0] == fit.beta_bps


def test_unavailable_device_is_reported_and_others_go_on(tmp_path):
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU: cuda:0 is available")
    store = ProfileStore(tmp_path / "p.db")
    rep = run_campaign([("mlp", zoo.load("mlp").mod)], ["cuda:0", "cpu:0"], store, policy=FAST,
                       progress=False)
    gpu, cpu = rep.devices
    assert "cuda:0" in gpu.error and gpu.measured == 0
    assert cpu.error is None and cpu.measured == 3


def test_a_cpu_device_past_this_process_cores_is_reported_absent(tmp_path):
    from autoplace.backend import process_cpus

    cores = len(process_cpus())
    store = ProfileStore(tmp_path / "p.db")
    rep = run_campaign([("mlp", zoo.load("mlp").mod)], [f"cpu:{cores}"], store, policy=FAST,
                       progress=False)
    (absent,) = rep.devices
    assert absent.error.startswith(f"cpu:{cores}: no such device on this machine")
    assert absent.measured == 0 and store.devices() == []  # not recorded as a device


def test_dry_run_json_counts_pending_and_writes_nothing(tmp_path):
    db = tmp_path / "p.db"
    p = _cli("profile", "--model", "zoo:mlp", "--model", "zoo:branchy_cnn", "--device", "cpu:0",
             "--db", str(db), "--dry-run", "--json")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    report = json.loads(out)
    assert report["pending"] == 12 and report["workloads"] == 12 and report["nodes"] == 22
    assert not db.exists()


def test_killed_campaign_resumes_without_remeasuring(tmp_path):
    db = tmp_path / "p.db"
    # --cv 0 makes every workload use its whole budget, so the kill lands mid-campaign.
    args = ("profile", "--model", "zoo:branchy_cnn", "--device", "cpu:0", "--db", str(db),
            "--cv", "0", "--budget", "0.4", "--no-links", "--no-overheads")
    p = _cli(*args, drained=True)
    deadline, seen = time.time() + 120, {}
    while time.time() < deadline and len(seen) < 2 and p.poll() is None:
        time.sleep(0.05)
        seen = _rows(db)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    first = _rows(db)
    assert 2 <= len(first) < 9, (
        f"the campaign was not killed mid-way: {len(seen)} rows seen before the kill, "
        f"{len(first)} after it; exit {p.returncode}; its output ended: {p.tail()}")

    dry = _cli("profile", "--model", "zoo:branchy_cnn", "--device", "cpu:0", "--db", str(db),
               "--dry-run", "--json")
    out, err = dry.communicate(timeout=120)
    assert json.loads(out)["pending"] == 9 - len(first), err

    p = _cli(*args)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    final = _rows(db)
    assert len(final) == 9
    assert all(final[k] == v for k, v in first.items())  # kept as measured, not measured again


def test_interrupted_campaign_says_how_to_resume(tmp_path):
    db = tmp_path / "p.db"
    p = _cli("profile", "--model", "zoo:branchy_cnn", "--device", "cpu:0", "--db", str(db),
             "--cv", "0", "--budget", "0.4", "--no-links", "--no-overheads")
    while not db.exists() or len(_rows(db)) < 1:
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "run the same command again to resume" in err
    assert len(_rows(db)) >= 1


def test_ctrl_c_during_a_build_stops_the_campaign_and_marks_no_op_unsupported(tmp_path,
                                                                              monkeypatch,
                                                                              ctrl_c_raises):
    """TVM hands a KeyboardInterrupt raised in one of its Python callbacks (the lowering's
    passes) back as a RuntimeError with no message: it must stop the campaign, not fail the op."""
    import tvm

    compile_mod = sys.modules["autoplace.backend"]
    real, calls = compile_mod.build_single, []

    @tvm.transform.module_pass(opt_level=0)
    def ctrl_c(mod, _ctx):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the handler runs here, inside TVM's call of this pass
        return mod

    def build(mod, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the probe, one op, then Ctrl-C in the second op's build
            tvm.transform.Sequential([ctrl_c])(mod)
        return real(mod, *args, **kwargs)

    monkeypatch.setattr(compile_mod, "build_single", build)
    store = ProfileStore(tmp_path / "p.db")
    models = [("mlp", zoo.load("mlp").mod)]
    with pytest.raises(KeyboardInterrupt):
        run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False, links=False)
    assert [m.ok for m in store.measurements()] == [True]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    monkeypatch.setattr(compile_mod, "build_single", real)
    rep = run_campaign(models, ["cpu:0"], store, policy=FAST, progress=False, links=False)
    assert (rep.devices[0].measured, rep.devices[0].unsupported) == (2, 0)


def test_concurrent_campaigns_share_one_store(tmp_path):
    db = tmp_path / "p.db"
    args = ("profile", "--model", "zoo:branchy_cnn", "--model", "zoo:mlp", "--device", "cpu:0",
            "--db", str(db), "--budget", "0.2", "--no-links", "--no-overheads", "--json")
    procs = [_cli(*args) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    reports = [json.loads(o)["devices"][0] for o, _ in outs]
    # Every workload is in the store once; between them the two processes measured them all.
    assert len(_rows(db)) == 12
    assert sum(r["measured"] for r in reports) >= 12
    assert all(r["measured"] + r["skipped"] == r["pending"] for r in reports)


def test_optimize_cli_uses_a_given_profile(tmp_path):
    db, out = tmp_path / "p.db", tmp_path / "prof.json"
    store = ProfileStore(db)
    run_campaign([("mlp", zoo.load("mlp").mod)], ["cpu:0"], store, policy=FAST, progress=False,
                 links=False)
    store.close()
    for args in (("profile-export", "--db", str(db), "--device", "cpu:0", "--out", str(out)),
                 ("profile-import", str(out), "--db", str(tmp_path / "copy.db"))):
        p = _cli(*args)
        assert p.wait(timeout=120) == 0, p.communicate()
    p = _cli("optimize", "--model", "zoo:mlp", "--device", "cpu:0", "--profile", str(out),
             "--json")
    report = json.loads(p.communicate(timeout=300)[0])
    assert report["cost_model"] == "MeasuredCostModel"
    # measured, or the tuned kernel's time where this machine's shipped records have zoo:mlp's
    assert set(report["cost_sources"]) <= {"measured", "tuned"}
    p = _cli("optimize", "--model", "zoo:mlp", "--device", "cpu:0", "--no-profile", "--json")
    assert json.loads(p.communicate(timeout=300)[0])["cost_sources"] == ["roofline"]



@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or os.cpu_count() < 2,
                    reason="needs two cores or more")
def test_fingerprinting_a_cpu_leaves_the_callers_cores_alone():
    # TVM pins a thread to core 0 when it starts that thread's pool (runtime.NumThreads does);
    # optimize fingerprints the CPU on the user's thread, which must keep all its cores. A fresh
    # process: in this one the main thread's pool may have started (and pinned it) already.
    code = ("import os, autoplace; from autoplace.profile import LocalRunner; "
            "os.sched_setaffinity(0, range(os.cpu_count())); before = os.sched_getaffinity(0); "
            "LocalRunner(autoplace.Device.cpu(0)).info(); "
            "print(len(before), os.sched_getaffinity(0) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert int(out[0]) >= 2 and out[1] == "True"


def test_a_campaign_timing_a_device_another_process_times_warns(tmp_path, caplog):
    # Another process holds this machine's CPU timing lock: the campaign measures anyway, and
    # its report and a warning say that the timings may be contended.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from autoplace import Device\n"
        "from autoplace.profile.measure import timing_lock\n"
        "with timing_lock(Device.cpu(0)) as h:\n"
        "    print('held' if h is None else 'busy', flush=True)\n"
        "    time.sleep(600)\n")], stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "held":
            pytest.skip("another campaign on this machine is timing its CPU right now")
        rep = run_campaign([("mlp", zoo.load("mlp").mod)], ["cpu:0", "cpu:1"],
                           ProfileStore(tmp_path / "p.db"), policy=FAST, progress=False,
                           links=False)
    finally:
        holder.kill()
        holder.wait()
    first, second = rep.devices
    assert first.measured == 3 and first.contended.startswith(
        f"cpu:0: process {holder.pid} was timing this machine's CPU at the same time")
    assert second.contended is None  # its workloads were all measured already, by cpu:0
    assert any(r.levelname == "WARNING" and "process" in r.getMessage() for r in caplog.records)
    assert "these timings may be slowed" in rep.table()


def test_the_cli_measures_the_overheads_of_local_devices_once(tmp_path):
    from autoplace.backend import process_cpus

    db, out = tmp_path / "p.db", tmp_path / "cpu.json"
    p = _cli("profile", "--only-overheads", "--device", "cpu:0", "--device", "rpc:x@127.0.0.1:9",
             "--db", str(db), "--json")
    stdout, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    report = json.loads(stdout)["overheads"]
    assert "rpc:x@127.0.0.1:9: overheads are measured only for local devices" in report["notes"][0]
    with ProfileStore(db) as store:
        assert store.counts()["measurements"] == 0  # no ops
        figures = {f.kind: f for f in store.overheads()}
    # One core share: no second device to alternate with, so no segment figure (one device runs
    # any chain as one segment); two or more: cpu:0 alternates with cpu:1.
    kinds = {"call", "stage", "kernel"} | ({"segment"} if len(process_cpus()) > 1 else set())
    assert set(figures) == kinds and all(f.seconds > 0 for k, f in figures.items()
                                         if k != "kernel")
    assert figures["kernel"].seconds >= 0 and figures["kernel"].detail["fit"]["kernels"]
    assert {f.peer for f in figures.values()} == {""} and figures["stage"].detail["method"]
    # Run again with a model: its ops are measured, the overheads the store holds are not.
    p = _cli("profile", "--model", "zoo:mlp", "--device", "cpu:0", "--db", str(db), "--budget",
             "0.02", "--no-links", "--json")
    stdout, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    again = json.loads(stdout)
    assert again["devices"][0]["measured"] == 3 and again["overheads"]["stored"] == []
    assert "already stored for cpu:0" in again["overheads"]["notes"][0]
    p = _cli("profile-export", "--db", str(db), "--device", "cpu:0", "--out", str(out))
    assert p.wait(timeout=120) == 0, p.communicate()
    prof = DeviceProfile.load(out)
    assert prof.overhead("stage").seconds == figures["stage"].seconds
    p = _cli("profile", "--only-overheads", "--model", "zoo:mlp", "--db", str(db))
    assert p.wait(timeout=120) == 2 and "--only-overheads measures no ops" in p.communicate()[1]


def test_a_store_that_lacks_only_a_devices_kernel_figure_measures_that_alone(tmp_path):
    from autoplace.profile import LocalRunner, fingerprint
    from autoplace.profile.overheads import record_overheads
    from autoplace.profile.measurements import OverheadFit
    from autoplace.run.overhead import measure_overheads

    info = LocalRunner(autoplace.Device.cpu(0)).info()
    fp = fingerprint(info)
    with ProfileStore(tmp_path / "p.db") as store:
        store.add_device(fp, "cpu:0", info)
        store.put_overhead(OverheadFit(fp, "", "stage", 4e-5, {}))
        store.put_overhead(OverheadFit(fp, "", "call", 2e-5, {}))
        assert record_overheads(["cpu:0"], store, None, dry_run=True).pending == [
            ("cpu:0", None)]
        rep = record_overheads(["cpu:0"], store, measure_overheads)
        assert rep.error is None and [k for _, _, k, _, _ in rep.stored] == ["kernel"]
        assert {f.kind: f.seconds for f in store.overheads()}["stage"] == 4e-5  # kept
        again = record_overheads(["cpu:0"], store, measure_overheads)
        assert again.stored == [] and "already stored" in again.notes[0]
