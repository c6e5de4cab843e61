"""The whole-model alternatives a PyTorch user has (eager, ONNX Runtime on the exported model,
frozen torch.compile) as contenders of optimize_module and of the torch.compile backend: real
ONNX Runtime, real timing, behaviour asserted (never how fast)."""

import json
import logging
import math
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import autoplace  # noqa: E402
from autoplace import Device  # noqa: E402
from autoplace.pytorch import load_module, optimize_module  # noqa: E402
from autoplace.pytorch import contenders as door  # noqa: E402
from autoplace.pytorch.module import FORMAT  # noqa: E402
from autoplace.report.result import COMPILED, EAGER, ONNXRUNTIME  # noqa: E402

CPU = [Device.cpu(0)]
# Untuned: any of them may win. Inductor only where a test asks for it (it compiles for seconds).
FAST = dict(cost_model=autoplace.RooflineCostModel(), db=None, torch_compile=False)
RUNS = {"build": "build", EAGER: "eager", ONNXRUNTIME: "onnxruntime", COMPILED: "torch.compile"}


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16)).eval()


class Bucketed(torch.nn.Module):
    """A linear layer whose outputs are shifted by their bucket: ``searchsorted``, which TVM's
    importer lacks (a PyTorch call in the build) and PyTorch's ONNX exporter refuses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("edges", torch.linspace(-2, 2, 5))

    def forward(self, x):
        y = self.fc(x)
        return y + torch.searchsorted(self.edges, y.contiguous()).to(y.dtype)


def assert_runs_the_fastest(m):
    """``m`` runs the fastest of the contenders that beat the build by their margin, and the
    build where none did; ``summary()`` says which."""
    beat = {k: v for k, v in m.times.items()
            if k != "build" and v < door.margin(k, m.plan) * m.times["build"]}
    best = min(beat, key=beat.get) if beat else None
    assert m.runs == (RUNS[best] if best else "build")
    how = f" ({door.variant_text((m._eager.level, m._eager.threads))})" \
        if best == ONNXRUNTIME else ""
    assert f"runs {best or 'the build'}{how}: it measured" in m.summary()
    assert m.summary().endswith(m.runs_note)


@pytest.fixture(scope="module")
def cnn_module():
    model, x = cnn(), torch.randn(1, 3, 16, 16)
    return model, x, optimize_module(model, (x,), CPU, **FAST)


def test_onnxruntime_is_a_timed_contender_and_the_fastest_runs(cnn_module):
    model, x, m = cnn_module
    assert set(m.times) == {"build", EAGER, ONNXRUNTIME}
    assert all(math.isfinite(t) and t > 0 for t in m.times.values())
    assert m.result.baselines[ONNXRUNTIME] == m.times[ONNXRUNTIME]
    assert "baseline onnxruntime" in m.summary()
    # The graph optimization level was timed, not assumed: the note names both.
    note = m.result.baseline_notes[ONNXRUNTIME]
    assert "ORT_ENABLE_ALL" in note and "ORT_ENABLE_EXTENDED" in note and "against" in note
    assert_runs_the_fastest(m)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)


def test_an_mlp_gets_the_same_contenders_and_matches_eager():
    model, x = mlp(), torch.randn(4, 32)
    m = optimize_module(model, (x,), CPU, **FAST)
    assert ONNXRUNTIME in m.times and math.isfinite(m.times[ONNXRUNTIME])
    assert_runs_the_fastest(m)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)


def test_onnxruntime_on_the_whole_model_matches_eager_and_takes_one_shape(cnn_module):
    model, x, m = cnn_module
    ort = door.OrtModel(door.onnx_bytes(model, [x]), "ORT_ENABLE_ALL")
    with torch.no_grad():
        torch.testing.assert_close(ort(x)[0], model(x), atol=1e-4, rtol=1e-4)
    m.run_eagerly(ort, dict(m.times), ONNXRUNTIME)  # as contend() does where ORT is fastest
    assert m.runs == "onnxruntime" and m.ort_variant == ("ORT_ENABLE_ALL", ort.threads)
    assert f"runs onnxruntime (ORT_ENABLE_ALL, {ort.threads} intra-op thread" in m.runs_note
    assert not m(x)[0].is_inference()  # ORT's arrays, which a caller may write into
    with pytest.raises(ValueError, match=r"takes float32\[1, 3, 16, 16\] on cpu, got float32\[2"):
        m(torch.randn(2, 3, 16, 16))
    with pytest.raises(TypeError, match=r"takes float32\[1, 3, 16, 16\] on cpu, got float64"):
        m(x.double())
    with pytest.raises(TypeError, match="expected 1 inputs"):
        m(x, x)
    # What numpy cannot read as it is (a tensor that needs grad, a strided view) still runs.
    strided = torch.randn(1, 3, 16, 32)[..., ::2]
    for given in (x.clone().requires_grad_(), strided):
        with torch.no_grad():
            torch.testing.assert_close(m(given)[0], model(given), atol=1e-4, rtol=1e-4)


def test_a_module_running_onnxruntime_saves_its_graph_and_loads_running_it(tmp_path, caplog):
    model, x = mlp(), torch.randn(4, 32)
    m = optimize_module(model, (x,), CPU, **FAST, eager_fallback=False)
    m.run_eagerly(door.OrtModel(door.onnx_bytes(model, [x]), "ORT_ENABLE_EXTENDED"),
                  {"build": 2e-3, ONNXRUNTIME: 1e-3}, ONNXRUNTIME)
    with caplog.at_level("WARNING"):
        m.save(tmp_path / "m.apmod")
    assert "the file holds the build" not in caplog.text  # that warning is for PyTorch's runs
    with zipfile.ZipFile(tmp_path / "m.apmod") as z:
        meta = json.loads(z.read("meta.json"))
        assert "model.onnx" in z.namelist()
    assert meta["format"] == FORMAT == 2 and meta["runs"] == ONNXRUNTIME
    assert meta["ort_level"] == "ORT_ENABLE_EXTENDED"
    loaded = load_module(tmp_path / "m.apmod")
    assert loaded.runs == "onnxruntime" and "ORT_ENABLE_EXTENDED" in loaded.summary()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=1e-4, rtol=1e-4)
    loaded.save(tmp_path / "again.apmod")  # what it loaded, it saves again
    assert load_module(tmp_path / "again.apmod").runs == "onnxruntime"
    # Without onnxruntime, the file loads running its build, with a warning saying so.
    caplog.clear()
    with pytest.MonkeyPatch.context() as mp, caplog.at_level("WARNING"):
        mp.setitem(sys.modules, "onnxruntime", None)
        plain = load_module(tmp_path / "m.apmod")
    assert plain.runs == "build" and "ran ONNX Runtime when saved" in caplog.text
    assert plain.ort_variant is None
    with torch.no_grad():
        torch.testing.assert_close(plain(x), model(x), atol=1e-4, rtol=1e-4)


def test_without_onnxruntime_it_is_no_contender_and_nothing_complains(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime: ImportError
    model, x = mlp(), torch.randn(4, 32)
    with caplog.at_level("WARNING"):
        m = optimize_module(model, (x,), CPU, **FAST)
    assert set(m.times) == {"build", EAGER} and ONNXRUNTIME not in m.result.baselines
    assert "ONNX Runtime" not in caplog.text
    assert_runs_the_fastest(m)


def test_a_model_the_exporter_refuses_leaves_onnxruntime_out_with_one_warning(caplog):
    model, x = Bucketed().eval(), torch.randn(2, 8)
    torch._C._jit_set_onnx_log_enabled(False)  # as a process starts (another export may have
    with caplog.at_level("WARNING"):           # left it on)
        m = optimize_module(model, (x,), CPU, **FAST)
    said = [r.getMessage() for r in caplog.records if "ONNX Runtime" in r.getMessage()]
    assert len(said) == 1 and "searchsorted" in said[0] and "not among the contenders" in said[0]
    assert ONNXRUNTIME not in m.times and ONNXRUNTIME not in m.result.baselines
    assert "Torch IR graph" not in caplog.text
    assert not torch._C._jit_is_onnx_log_enabled()  # the exporter left its log on: turned off
    assert_runs_the_fastest(m)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)


def test_onnxruntime_whose_outputs_differ_from_eager_is_left_out(monkeypatch, caplog):
    from torch.utils._pytree import tree_map

    right = door.OrtModel.__call__
    monkeypatch.setattr(door.OrtModel, "__call__",  # a runtime 10 % off
                        lambda self, *xs: tree_map(lambda o: o * 1.1, right(self, *xs)))
    model, x = mlp(), torch.randn(4, 32)
    with caplog.at_level("WARNING"):
        m = optimize_module(model, (x,), CPU, **FAST)
    assert "outputs differ from eager's (relative error 0.1)" in caplog.text
    assert ONNXRUNTIME not in m.times and m.runs in ("build", "eager")


def test_inputs_off_the_cpu_get_no_onnxruntime():
    assert door._onnxruntime(mlp(), [torch.empty(4, 32, device="meta")]) is None


def test_torch_compile_is_frozen_for_its_compile_and_first_call(monkeypatch):
    from torch._inductor import config

    seen = []

    def compile(model, **kwargs):
        seen.append(("compile", config.freezing))
        return lambda *xs: seen.append(("call", config.freezing)) or model(*xs)

    monkeypatch.setattr(torch, "compile", compile)
    model, x = mlp(), torch.randn(4, 32)
    assert door._compiled(model, [x]) is not None
    # Compiled and first called (and checked against eager) frozen; the setting restored.
    assert seen[:2] == [("compile", True), ("call", True)] and all(f for _, f in seen)
    assert not config.freezing
    m = optimize_module(model, (x,), CPU, **dict(FAST, torch_compile=True))
    assert set(m.times) == {"build", EAGER, ONNXRUNTIME, COMPILED}
    assert "frozen" in m.result.baseline_notes[COMPILED]
    assert_runs_the_fastest(m)


def test_every_graph_of_the_backend_gets_the_contenders_and_runs_the_fastest():
    torch._dynamo.reset()
    model, x = mlp(), torch.randn(4, 32)
    be = autoplace.dynamo_backend(CPU, strict=True, **dict(FAST, torch_compile=True))
    fast = torch.compile(model, backend=be)
    with torch.no_grad():
        got, want = fast(x), model(x)
        again = fast(x + 1)
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(again, model(x + 1), atol=1e-4, rtol=1e-4)
    (record,) = be.graphs  # Inductor compiled the graph inside Dynamo's call of the backend
    assert set(record.module.times) == {"build", EAGER, ONNXRUNTIME, COMPILED}
    assert_runs_the_fastest(record.module)
    # Asked not to: nothing timed, the build runs.
    be = autoplace.dynamo_backend(CPU, strict=True, eager_fallback=False, **FAST)
    with torch.no_grad():
        torch.compile(model, backend=be)(x)
    torch._dynamo.reset()
    assert be.graphs[0].module.times == {} and be.graphs[0].module.runs == "build"


def test_contenders_that_all_run_warn_of_nothing(caplog):
    model, x = mlp(), torch.randn(2, 32)
    with caplog.at_level(logging.WARNING):
        optimize_module(model, (x,), CPU, **FAST)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and r.name.startswith("autoplace.pytorch")]


def _stops_threads(ort) -> bool:
    try:
        opts = ort._session.get_session_options()
        return opts.get_session_config_entry("session.force_spinning_stop") == "1"
    except RuntimeError:  # no such entry: ORT's default wait
        return False


def test_onnxruntime_chosen_on_several_threads_keeps_orts_default_wait(cnn_module, monkeypatch):
    # Timed with its threads stopped after each call (they would take the next contender's
    # cores); run call after call, it waits as ORT's own sessions do.
    model, x, _ = cnn_module
    monkeypatch.setattr(door, "_blocks", lambda contenders, inputs: {
        k: 1e-4 if k.startswith(ONNXRUNTIME) else 1e-3 for k in contenders})
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        m = optimize_module(model, (x,), CPU, **FAST)
    finally:
        torch.set_num_threads(threads)
    assert m.runs == "onnxruntime" and m._eager.threads == 2
    assert not _stops_threads(m._eager)
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)
    # on one thread there are no threads to wait: the timed session is kept
    one = door.OrtModel(door.onnx_bytes(model, [x]), "ORT_ENABLE_ALL", threads=1)
    assert door.serving(one) is one and _stops_threads(one)


def test_onnxruntime_is_timed_on_one_thread_too_and_runs_on_the_faster(cnn_module, monkeypatch,
                                                                        tmp_path):
    # A small graph's session can run faster on one thread than on the caller's several: both
    # are timed, at each level, and the module runs the fastest, never on more threads.
    model, x, _ = cnn_module
    timed = []

    def blocks(contenders, inputs):
        timed.append(list(contenders))
        return {k: 1e-5 if k.endswith(", 1 intra-op thread") and "ENABLE_ALL" in k
                else 1e-4 if k.startswith(ONNXRUNTIME) else 1e-3 for k in contenders}

    monkeypatch.setattr(door, "_blocks", blocks)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert door.ort_threads() == (2, 1)
        m = optimize_module(model, (x,), CPU, **FAST)
    finally:
        torch.set_num_threads(threads)
    ort = [k.removeprefix(ONNXRUNTIME + " ") for k in timed[0] if k.startswith(ONNXRUNTIME)]
    assert sorted(ort) == sorted(f"{level}, {n} intra-op thread{'s' * (n > 1)}"
                                 for level in door.ORT_LEVELS for n in (2, 1))
    assert m.runs == "onnxruntime" and m.ort_variant == ("ORT_ENABLE_ALL", 1)
    note = m.result.baseline_notes[ONNXRUNTIME]
    assert note.index("ORT_ENABLE_ALL, 1 intra-op thread: 0.01 ms") < note.index("against")
    assert "0.1 (ORT_ENABLE_ALL, 2 intra-op threads)" in note
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)
    # Saved and loaded in a process of two threads, it runs on the one thread it ran on.
    m.save(tmp_path / "one.apmod")
    torch.set_num_threads(2)
    try:
        loaded = load_module(tmp_path / "one.apmod")
        assert loaded.runs == "onnxruntime" and loaded.ort_variant == ("ORT_ENABLE_ALL", 1)
        assert "ORT_ENABLE_ALL, 1 intra-op thread" in loaded.summary()
    finally:
        torch.set_num_threads(threads)
    # On one thread there is no other count to time.
    torch.set_num_threads(1)
    try:
        assert door.ort_threads() == (1,)
    finally:
        torch.set_num_threads(threads)


def test_ort_on_the_whole_model_wins_a_tie_with_a_build_of_ort_segments(monkeypatch):
    # The build's ORT segments are cut from the model ORT runs whole: as fast, it is the same
    # work without the VM's calls between segments. Against eager, the build keeps a tie.
    from autoplace.backend import ort_profiling

    # ORT's fusions kept, whatever this machine measures: the contenders are the ones listed
    monkeypatch.setattr(ort_profiling, "slower_fusions", lambda *a, **k: ((), {}))
    model, x = cnn(), torch.randn(1, 3, 16, 16)
    ort = Device.onnxruntime()
    m = optimize_module(model, (x,), CPU + [ort], **FAST, pins=[("op:nn.conv2d", "ort")],
                        eager_fallback=False)
    assert "ort" in m.plan.assignment
    graph, devices = m.result.graph, m.plan.devices
    mixed = autoplace.Plan.from_assignment(graph, devices, [
        "ort" if n.op_type == "nn.conv2d" else "cpu0" for n in graph.nodes])
    every = autoplace.Plan.from_assignment(graph, devices, ["ort"] * len(graph.nodes))
    assert door.margin(ONNXRUNTIME, mixed) == 1.0
    # A build of ORT alone must beat ORT on the whole model by the margin: a tie goes to ORT.
    assert door.margin(ONNXRUNTIME, every) == pytest.approx(1 / door.EAGER_MARGIN)
    assert door.margin(EAGER, mixed) == door.margin(EAGER, every) == door.EAGER_MARGIN

    def contend_with(times, plan):
        monkeypatch.setattr(door, "_blocks", lambda fns, inputs: {k: times[k] for k in fns})
        m._eager, m._runs, m.times = None, "build", {}
        m.plan = plan  # the plan the margin reads; the build stays as it is
        door.contend(m, model, (x,), times[EAGER], "given", torch_compile=False)
        return m.runs

    build = 1e-3
    variants = [door._variant_name((level, n)) for level in door.ORT_LEVELS
                for n in door.ort_threads()]

    def timing(eager, ort):  # one ORT variant at ``ort``, the others slower
        return {"build": build, EAGER: eager, variants[0]: ort} | {v: 2e-3 for v in variants[1:]}

    tie = timing(2e-3, 1.01 * build)
    assert contend_with(tie, mixed) == "build" and contend_with(tie, every) == "onnxruntime"
    assert contend_with(timing(2e-3, 0.99 * build), mixed) == "onnxruntime"
    assert contend_with(timing(0.99 * build, 2e-3), every) == "build"
    # Without ORT in the plan, ORT keeps the margin eager has.
    plain = optimize_module(model, (x,), CPU, **FAST, eager_fallback=False)
    assert door.margin(ONNXRUNTIME, plain.plan) == door.EAGER_MARGIN


def test_ort_on_the_whole_model_is_timed_without_the_fusions_its_device_measured_slower(
        monkeypatch):
    from torch_models import skip_norm

    from autoplace.backend import ort_profiling

    model, x = skip_norm()
    # the ORT device's search found the fused node slower than the two it replaces
    monkeypatch.setattr(ort_profiling, "slower_fusions",
                        lambda *a, **k: (("SkipLayerNormFusion",), {}))
    timed = []

    def blocks(contenders, inputs):  # without the fusion, ORT on the whole model the fastest
        timed.append(list(contenders))
        return {k: 1e-5 if "without SkipLayerNormFusion" in k else 1e-3 for k in contenders}

    monkeypatch.setattr(door, "_blocks", blocks)
    m = optimize_module(model, (x,), [Device.cpu(0), Device.onnxruntime()], **FAST)
    assert door.disabled_fusions(m.result) == ("SkipLayerNormFusion",)
    ort = {k.removeprefix(ONNXRUNTIME + " ") for k in timed[0] if k.startswith(ONNXRUNTIME)}
    assert {f"ORT_ENABLE_ALL without SkipLayerNormFusion, {n} intra-op thread{'s' * (n > 1)}"
            for n in door.ort_threads()} <= ort
    assert m.runs == "onnxruntime"
    assert m.ort_variant[0] == "ORT_ENABLE_ALL-SkipLayerNormFusion"
    assert "ORT_ENABLE_ALL without SkipLayerNormFusion" in m.summary()
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-4, rtol=1e-4)
