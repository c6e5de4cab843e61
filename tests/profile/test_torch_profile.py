"""The torch device profiled like any device (issue 42): PyTorch's time of each workload in the
store, resumable; the VM's hand-off into PyTorch per device pair, exported with the profile;
optimize charging what was stored and timing only the rest; the learned model predicting
PyTorch calls it never timed."""

import json
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import autoplace  # noqa: E402
from autoplace import Device, RooflineCostModel, zoo  # noqa: E402
from autoplace.graph import OpGraph  # noqa: E402
from autoplace.profile import (DeviceProfile, LocalRunner, OverheadFit, ProfileStore,  # noqa: E402
                               TimingPolicy, fingerprint, run_campaign)
from autoplace.profile.torch_runner import TorchRunner  # noqa: E402
from fastest import fastest_call_s  # noqa: E402

FAST = TimingPolicy(min_repeat_ms=1, min_repeats=2, max_repeats=3, round_size=2, budget_s=0.2)


class Cdist(torch.nn.Module):
    """cdist, which the Relax importer lacks (a PyTorch call), then relu and add (Relax ops)."""

    def forward(self, a, b):
        return torch.cdist(a, b).relu() + 1.0


@pytest.fixture(scope="module")
def cdist():
    return autoplace.from_torch(Cdist(), [torch.randn(4, 8), torch.randn(3, 8)])


def _fp(spec):
    runner = TorchRunner(Device.torch()) if spec == "torch:cpu" else LocalRunner(Device.cpu(0))
    return fingerprint(runner.info())


def _cpu_overheads_stored(store):
    """cpu:0's own overhead figures, so that record_overheads measures only the hand-off."""
    info = LocalRunner(Device.cpu(0)).info()
    store.add_device(fingerprint(info), "cpu:0", info)
    for kind in ("stage", "kernel"):
        store.put_overhead(OverheadFit(fingerprint(info), "", kind, 1e-5))


def test_a_campaign_stores_pytorch_rows_and_resumes(tmp_path, cdist):
    from autoplace.profile.drift import measure_drift

    store = ProfileStore(tmp_path / "p.db")
    models = [("mlp", zoo.load("mlp").mod), ("cdist", cdist)]
    rep = run_campaign(models, [Device.torch(), "cpu:0"], store, policy=FAST, progress=False,
                       links=False)
    torch_rep, cpu_rep = rep.devices
    # mlp: matmul, add, relu; cdist: the PyTorch call, relu and add of its shapes
    assert (rep.workloads, torch_rep.spec, torch_rep.error) == (6, "torch:cpu", None)
    assert (torch_rep.measured, torch_rep.unsupported, torch_rep.fingerprint) == (
        6, 0, _fp("torch:cpu"))
    info = store.device(torch_rep.fingerprint).info
    assert info["kind"] == "torch" and info["torch"] == torch.__version__
    assert info["threads"] == torch.get_num_threads()  # as a build calls PyTorch
    rows = {m.workload: m for m in store.measurements(torch_rep.fingerprint)}
    assert all(m.ok and 0 < m.min_s <= m.median_s for m in rows.values())
    cdist_key = next(n.workload_key for n in OpGraph.from_relax(cdist).nodes if n.is_torch)
    assert cdist_key in rows
    # Seconds of one call: all the calls timed fit in the seconds the campaign spent timing
    # (a row in ms is 1000 times over), on any host at any load.
    assert sum(m.min_s * m.number * m.repeats for m in rows.values()) <= torch_rep.seconds
    # the PyTorch call runs on no TVM device: cpu:0 skips it, and stores the five others
    assert (cpu_rep.measured, cpu_rep.skipped) == (5, 1)
    assert cdist_key not in {m.workload for m in store.measurements(cpu_rep.fingerprint)}

    again = run_campaign(models, ["torch:cpu", "cpu:0"], store, policy=FAST, progress=False,
                         links=False)
    assert [(d.pending, d.measured) for d in again.devices] == [(0, 0), (0, 0)]
    # a second pass over the torch device keeps each workload's fastest occasion
    more = run_campaign(models, ["torch:cpu"], store, policy=FAST, progress=False, links=False,
                        passes=2)
    assert more.devices[0].measured == 6
    assert all(m.passes == 2 and m.min_s <= rows[m.workload].min_s
               for m in store.measurements(torch_rep.fingerprint))
    # the drift check times stored rows again as any runner does (Relax ops rebuilt from
    # their keys; a PyTorch call's key rebuilds no module, so it is no anchor)
    drift = measure_drift(TorchRunner(Device.torch()), "torch:cpu",
                          store.measurements(torch_rep.fingerprint), policy=FAST,
                          older_than_s=-1)
    assert drift is not None and len(drift.keys) == 5 and cdist_key not in drift.keys
    assert 0.1 < drift.ratio < 10


def _lopsided():
    """A conv2d padded on one side only (PyTorch's conv2d pads both), its relu, and a conv3d
    (no PyTorch equivalent in torch_equivalents.EQUIVALENTS)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x, w = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in
            (("x", (1, 2, 6, 6)), ("w", (2, 2, 3, 3))))
    v, k = (relax.Var(n, relax.TensorType(s, "float32")) for n, s in
            (("v", (1, 1, 4, 4, 4)), ("k", (1, 1, 3, 3, 3))))
    with bb.function("main", [x, w, v, k]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1, 0, 0)))))
            out = bb.emit_output(relax.Tuple([a, bb.emit(relax.op.nn.conv3d(v, k))]))
        bb.emit_func_output(out)
    return bb.get()


def test_a_workload_without_a_pytorch_call_is_unsupported_there(tmp_path):
    store = ProfileStore(tmp_path / "p.db")
    rep = run_campaign([("m", _lopsided())], ["torch:cpu"], store, policy=FAST, progress=False,
                       links=False)
    assert (rep.devices[0].measured, rep.devices[0].unsupported) == (1, 2)
    failed = {json.loads(m.workload)[0]: m.error
              for m in store.measurements(rep.devices[0].fingerprint) if not m.ok}
    assert "no PyTorch call of nn.conv2d with these attributes" in failed["relax.nn.conv2d"]
    assert "runs no nn.conv3d: no PyTorch equivalent" in failed["relax.nn.conv3d"]
    prof = DeviceProfile.from_store(store, "torch:cpu")
    assert len(prof.unsupported) == 2 and len(prof.latency_s) == 1
    # a failure is the device's answer: the next campaign does not try again
    again = run_campaign([("m", _lopsided())], ["torch:cpu"], store, policy=FAST,
                         progress=False, links=False)
    assert (again.devices[0].pending, again.devices[0].measured) == (0, 0)


def test_the_handoff_is_stored_per_device_pair_and_travels_with_the_profile(tmp_path):
    from autoplace.profile.overheads import record_overheads
    from autoplace.run.overhead import measure_overheads

    store = ProfileStore(tmp_path / "p.db")
    _cpu_overheads_stored(store)
    rep = record_overheads(["cpu:0", "torch:cpu"], store, measure_overheads)
    assert rep.error is None and [(d, p, k) for d, p, k, _, _ in rep.stored] == [
        ("torch:cpu", "cpu:0", "handoff")]
    (fit,) = [f for f in store.overheads() if f.kind == "handoff"]
    assert (fit.device, fit.peer) == (_fp("torch:cpu"), _fp("cpu:0"))
    # A call into Python and DLPack's wrapping: some eager calls of the probe's op, timed here
    # (a figure not divided by the probe's 32 calls, or in microseconds, is above it).
    x = torch.randn(64, 8, 8)
    assert 0 <= fit.seconds < 100 * fastest_call_s(lambda: torch.relu(x))
    again = record_overheads(["cpu:0", "torch:cpu"], store, measure_overheads)
    assert again.stored == [] and "not measured again" in again.notes[0]
    alone = record_overheads(["torch:cpu"], store, measure_overheads)
    assert alone.stored == [] and alone.notes == []  # the store has its hand-off

    path = tmp_path / "torch.json"
    path.write_text(json.dumps(store.export_profile("torch:cpu")))
    prof = DeviceProfile.load(path)
    assert prof.overhead("handoff", _fp("cpu:0")) == fit
    other = ProfileStore(tmp_path / "other.db")
    other.import_profile(json.loads(path.read_text()))
    assert DeviceProfile.from_store(other, "torch:cpu").overhead("handoff", _fp("cpu:0")) == fit
    assert other.device(_fp("cpu:0")).name == "cpu:0"  # the peer comes along


def test_a_handoff_that_cannot_be_measured_is_an_error_not_a_stored_default(tmp_path,
                                                                            monkeypatch):
    from autoplace.profile import torch_timings
    from autoplace.profile.overheads import record_overheads
    from autoplace.run.overhead import measure_overheads

    def broken(*a, **k):
        raise RuntimeError("no LLVM here")

    monkeypatch.setattr("autoplace.backend.torch_bridge.register", broken)  # the probe's op
    store = ProfileStore(tmp_path / "p.db")
    _cpu_overheads_stored(store)
    rep = record_overheads(["cpu:0", "torch:cpu"], store, measure_overheads)
    assert "no LLVM here" in rep.error and rep.stored == []
    assert not [f for f in store.overheads() if f.kind == "handoff"]
    # optimize's own use still gets a default, with a warning, rather than no plan
    assert torch_timings.measure_handoff() == torch_timings.DEFAULT_HANDOFF_S


def test_optimize_charges_the_stored_rows_and_times_only_the_rest(tmp_path, cdist, monkeypatch):
    from autoplace.predict.torch_costs import TorchCostModel
    from autoplace.profile import torch_timings
    from autoplace.profile.overheads import record_overheads
    from autoplace.run.overhead import measure_overheads

    db = tmp_path / "p.db"
    with ProfileStore(db) as store:
        run_campaign([("cdist", cdist)], ["torch:cpu"], store, policy=FAST, progress=False,
                     links=False)
        _cpu_overheads_stored(store)
        record_overheads(["cpu:0", "torch:cpu"], store, measure_overheads)
        prof = DeviceProfile.from_store(store, "torch:cpu")
    timed = []

    def time_node(node, op, policy=None, place="cpu"):
        timed.append(node.workload_key)
        return 1e-3

    monkeypatch.setattr(torch_timings, "time_torch_node", time_node)
    monkeypatch.setattr(torch_timings, "measure_handoff", lambda *a, **k: pytest.fail("measured"))
    g = OpGraph.from_relax(cdist)
    timings = torch_timings.time_torch_device(g, Device.torch(), profile=prof,
                                              callers=[_fp("cpu:0")])
    model = TorchCostModel(timings)
    cost = model.predict(g, Device.torch())
    handoff = prof.overhead("handoff", _fp("cpu:0")).seconds
    assert timed == [] and timings.handoff_s == handoff
    extra = timings.in_sequence_s  # the model's calls in sequence, measured here
    np.testing.assert_allclose(cost, [prof.latency_s[n.workload_key] + handoff + extra
                                      for n in g.nodes])
    assert model.sources(g, Device.torch()) == ["measured"] * len(g.nodes)
    # a model with one workload more: that one alone is timed here
    bigger = autoplace.from_torch(Cdist(), [torch.randn(5, 8), torch.randn(3, 8)])
    big = OpGraph.from_relax(bigger)
    with pytest.raises(ValueError, match="another model"):
        model.predict(big, Device.torch())  # the timings are of cdist's calls
    torch_timings.time_torch_device(big, Device.torch(), profile=prof, callers=[_fp("cpu:0")])
    assert len(timed) == len({n.workload_key for n in big.nodes} - set(prof.latency_s)) > 0

    # optimize finds the profile in its store (db=) and says so; the hand-off a call pays after
    # the op before it (the bytes that op touched) is a figure of this host, not of the
    # profile: measured once per power of two of bytes and host, kept, and charged where it
    # exceeds the profile's
    from autoplace.profile.torch_runner import preceding_bytes

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch_timings, "WARM_BYTES", 1)  # cdist's ops touch a few bytes
    cold = []
    monkeypatch.setattr(torch_timings, "measure_handoff",
                        lambda strict, place, between_bytes: cold.append(between_bytes)
                        or between_bytes * handoff)
    for _ in range(2):
        res = autoplace.optimize(cdist, [Device.cpu(0), Device.torch()], db=db,
                                 cost_model=RooflineCostModel(), calibrate=False)
    before = preceding_bytes(g)
    sizes = {1 << (int(b) - 1).bit_length() for b in before if b > 0}
    assert before[0] == 0 and sizes and sorted(cold) == sorted(sizes)  # once each: kept
    k = [d.name for d in res.plan.devices].index("torch")
    extra = res.predictor.torch.timings.in_sequence_s
    for node in (n for n in g.nodes if n.is_torch):
        assert res.plan.cost_sources[node.index] == "measured"
        b = int(before[node.index])
        paid = handoff if b == 0 else max(handoff, (1 << (b - 1).bit_length()) * handoff)
        assert res.problem.cost[node.index, k] == pytest.approx(
            prof.latency_s[node.workload_key] + paid + extra)
    assert "measured by profile torch:cpu" in res.summary()
    assert "more where the op before the call touched more bytes" in res.summary()
    assert "in the model's sequence" in res.summary()


def test_the_cli_profiles_the_torch_device(tmp_path, capsys, monkeypatch):
    from autoplace.cli import main

    db = tmp_path / "p.db"
    with ProfileStore(db) as store:
        _cpu_overheads_stored(store)
    assert main(["profile", "--model", "zoo:mlp", "--device", "cpu:0", "--device", "torch:cpu",
                 "--db", str(db), "--budget", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    torch_rep = next(d for d in out["devices"] if d["spec"] == "torch:cpu")
    assert (torch_rep["measured"], torch_rep["error"]) == (3, None)
    assert [(f["device"], f["peer"], f["kind"]) for f in out["overheads"]["stored"]] == [
        ("torch:cpu", "cpu:0", "handoff")]
    assert main(["profile-export", "--db", str(db), "--device", "torch:cpu",
                 "--out", str(tmp_path / "t.json")]) == 0
    assert DeviceProfile.load(tmp_path / "t.json").overhead("handoff", _fp("cpu:0")) is not None

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    capsys.readouterr()
    assert main(["profile", "--model", "zoo:mlp", "--device", "torch:cpu",
                 "--db", str(tmp_path / "q.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PyTorch is not installed: pip install" in err[0]


def test_the_learned_model_predicts_pytorch_calls_it_never_timed(tmp_path):
    """Rows of both devices in one store; a quarter of the torch device's held out. Fitted as
    ``autoplace train`` fits it (TVM's kernel features too: a torch device has no TVM target, so
    its rows have no code features and keep the roofline baseline), the model predicts them on
    the torch device far nearer what PyTorch took than a constant does, in the order measured;
    the same rows predicted on the CPU device (TVM's untuned kernels) are further off, so the
    model tells the devices apart. Every bound compares figures of this one run, so that no
    host's speed or load decides it."""
    from scipy.stats import spearmanr

    from autoplace.predict import XGBCostModel
    from autoplace.predict.features import workload_rows
    from autoplace.predict.rows import profile_rows
    from autoplace.profile.sweeps import from_specs

    store = ProfileStore(tmp_path / "p.db")
    mods = from_specs(["matmul:20:batch", "nn.conv2d:12:small", "nn.relu:6:small"])
    rep = run_campaign(mods, ["torch:cpu"], store, policy=FAST, progress=False, links=False)
    run_campaign(mods[::3], ["cpu:0"], store, policy=FAST, progress=False, links=False)
    tfp = rep.devices[0].fingerprint
    rows = profile_rows(store)
    held = [r for r in rows if r["device"] == tfp][::4]
    model = XGBCostModel(rounds=200).fit([r for r in rows if r not in held])
    assert set(model.devices_) == {tfp, _fp("cpu:0")}
    measured = np.array([r["latency_s"] for r in held])
    predicted = model.predict_workloads(held)
    error = np.abs(np.log(predicted / measured))
    as_cpu = np.abs(np.log(model.predict_workloads(held, _fp("cpu:0")) / measured))
    # The held-out calls span three decades (the sweeps' sizes) on any host, so a constant (the
    # median of the torch rows fitted on) is several-fold off; a model that reads the shapes is
    # off by under half as much (in log), and ranks the calls as they measured.
    constant = np.median([r["latency_s"] for r in rows if r["device"] == tfp and r not in held])
    as_constant = np.abs(np.log(constant / measured))
    assert np.median(error) < 0.5 * np.median(as_constant), (error, as_constant)
    assert spearmanr(predicted, measured).statistic > 0.6, (predicted, measured)
    assert np.median(error) < np.median(as_cpu)
    # a graph's nodes asked of Device.torch() are predicted on the fitted torch device
    g = OpGraph.from_relax(mods[0][1])
    assert model.predict(g, Device.torch()) == pytest.approx(
        model.predict_workloads(workload_rows(g), tfp))
