"""PyTorch's door: the torch.compile backend, optimize_module (DLPack in and out, save/load), and
pipelines on torch tensors."""

import json
import logging
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import autoplace  # noqa: E402
from autoplace import Device  # noqa: E402
from autoplace.pytorch import ModuleFileError, load_module, optimize_module  # noqa: E402

CPU = [Device.cpu(0)]
# Where the costs do not matter; Inductor only where a test asks for it.
FAST = dict(cost_model=autoplace.RooflineCostModel(), db=None, torch_compile=False)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    # Dynamo compiles a frame it saw before again with sizes as inputs (automatic dynamic
    # shapes); each test starts from none seen, as a user's process does.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def small_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10)).eval()


def encoder_layer():
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()


def backend(**kwargs):
    return autoplace.dynamo_backend(CPU, strict=True, **FAST, **kwargs)


# ----------------------------------------------------------------------------- torch.compile


def test_torch_compile_of_a_cnn_matches_eager():
    model, be = small_cnn(), backend()
    fast = torch.compile(model, backend=be)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        got, want = fast(x), model(x)
        again = fast(x + 1)  # a second call runs the build Dynamo kept, not a new one
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(again, model(x + 1), atol=1e-4, rtol=1e-4)
    [record] = be.graphs  # one graph, built (strict: nothing fell back to PyTorch)
    assert record.module is not None and record.fallback is None
    assert "cpu0" in str(record.module.plan)


def test_torch_compile_of_a_transformer_encoder_layer_matches_eager():
    # Under no_grad in eval mode the layer takes PyTorch's fused fast path
    # (torch._transformer_encoder_layer_fwd); the backend writes it out in plain ops.
    model, be = encoder_layer(), backend()
    x = torch.randn(1, 10, 32)
    with torch.no_grad():
        got, want = torch.compile(model, backend=be)(x), model(x)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert [r.fallback for r in be.graphs] == [None]


class TwoHalves(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        torch._dynamo.graph_break()  # Dynamo runs this in Python, between two graphs
        return self.b(y) * 2


def test_a_graph_break_gives_two_built_graphs_and_the_result_matches():
    model, be = TwoHalves().eval(), backend()
    x = torch.randn(2, 8)
    with torch.no_grad():
        got, want = torch.compile(model, backend=be)(x), model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(be.graphs) == 2 and all(r.module is not None for r in be.graphs)


class Outputs(torch.nn.Module):
    """Returns an input as it is, a view of it, and something computed."""

    def forward(self, x):
        return x, x.view(-1), torch.exp(x) * 2


class Unsupported(torch.nn.Module):
    def forward(self, x):
        # a complex output, which TVM cannot hold (complex numbers inside a graph, and an op
        # the importer lacks, import as PyTorch calls: tests/test_torch_device.py)
        return torch.fft.fft(x) * 2


@pytest.mark.parametrize("model", [Outputs(), Unsupported()], ids=["views", "unsupported"])
def test_a_graph_autoplace_cannot_import_runs_in_pytorch_with_one_warning(model, caplog):
    be = autoplace.dynamo_backend(CPU, **FAST)
    x = torch.randn(2, 3)
    with caplog.at_level(logging.WARNING, logger="autoplace"), torch.no_grad():
        got = torch.compile(model, backend=be)(x)
        got2 = torch.compile(model, backend=be)(x)  # Dynamo's cache: no second warning
    want = model(x)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(g, w)
    assert got2 is not None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "runs in PyTorch" in warnings[0].getMessage()
    [record] = be.graphs
    assert record.module is None and record.fallback in warnings[0].getMessage()
    with pytest.raises(Exception, match="view of an input|complex"):  # strict: raised
        torch._dynamo.reset()
        with torch.no_grad():
            torch.compile(model, backend=autoplace.dynamo_backend(CPU, strict=True, **FAST))(x)


def test_gradients_on_run_in_pytorch_and_a_users_own_error_is_pytorchs(caplog):
    model = small_cnn()
    be = autoplace.dynamo_backend(CPU, **FAST)
    fast = torch.compile(model, backend=be)
    x = torch.randn(1, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="autoplace"):
        y = fast(x)  # grad mode on, weights require grad: inference-only builds step aside
    y.sum().backward()  # and the graph still trains
    assert model[0].weight.grad is not None
    assert "inference only" in be.graphs[0].fallback
    with pytest.raises(Exception, match="channels|shape|size"):  # the user's bug, PyTorch's words
        with torch.no_grad():
            fast(torch.randn(1, 4, 8, 8))


def test_a_frame_compiled_again_gets_sizes_as_inputs_and_a_build_per_shape():
    # Two modules through one frame: Dynamo compiles the second with its sizes as inputs
    # (automatic dynamic shapes); each new shape gets its own build.
    be = backend()
    first, second = small_cnn(), torch.nn.Sequential(torch.nn.Linear(6, 3)).eval()
    with torch.no_grad():
        torch.compile(first, backend=be)(torch.randn(1, 3, 8, 8))
        fast = torch.compile(second, backend=be)
        for batch in (2, 5, 2):
            x = torch.randn(batch, 6)
            torch.testing.assert_close(fast(x), second(x), atol=1e-5, rtol=1e-5)
    shapes = [r.module.inputs[0].shape for r in be.graphs if r.module is not None]
    assert (2, 6) in shapes and (5, 6) in shapes and len(shapes) <= 4  # batch 2 built once


def test_a_graph_with_no_tensor_to_compute_returns_its_inputs_and_constants_unbuilt():
    # Called as Dynamo calls it, on FX graphs: outputs that are inputs (or constants) need no
    # build; one op beside them is built, and the inputs come back as the very same tensors.
    be = backend()
    passthrough = torch.fx.symbolic_trace(lambda x, y: (y, x, 3))
    x, y = torch.randn(2), torch.randn(3)
    fn = be(passthrough, [x, y])
    out = fn(x, y)
    assert out[0] is y and out[1] is x and out[2] == 3
    assert be.graphs[-1].module is None and be.graphs[-1].fallback is None
    mixed = torch.fx.symbolic_trace(lambda x: (x, torch.sin(x)))
    out = be(mixed, [x])(x)
    assert out[0] is x and be.graphs[-1].module is not None
    torch.testing.assert_close(out[1], torch.sin(x))


def test_the_string_backend_takes_its_settings_as_options():
    model, x = small_cnn(), torch.randn(1, 3, 8, 8)
    options = {"devices": CPU, "strict": True, **FAST}
    with torch.no_grad():
        got = torch.compile(model, backend="autoplace", options=options)(x)
        torch.testing.assert_close(got, model(x), atol=1e-4, rtol=1e-4)
        torch._dynamo.reset()
        with pytest.raises(Exception, match="no modes"):
            torch.compile(model, backend="autoplace", mode="max-autotune")(x)


def test_a_shape_that_cannot_be_built_runs_in_pytorch_and_the_next_call_too(caplog):
    # A second shape makes Dynamo compile the frame again with sizes as inputs, so its build is
    # made on its first call; where that fails, that call and the next with those sizes run in
    # PyTorch, with one warning.
    be = autoplace.dynamo_backend(CPU, **FAST)
    fast = torch.compile(Unsupported(), backend=be)
    x = torch.randn(4, 3)
    with caplog.at_level(logging.WARNING, logger="autoplace"), torch.no_grad():
        fast(torch.randn(2, 3))  # static sizes: refused when compiled (warning 1)
        got, again = fast(x), fast(x)
    torch.testing.assert_close(got, Unsupported()(x))
    torch.testing.assert_close(again, got)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "for sizes ((4, 3)" in warnings[1], warnings
    assert len(be.graphs) == 2 and all(r.fallback for r in be.graphs)


@pytest.mark.slow
def test_the_string_backend_needs_no_import_of_autoplace_and_runs_with_the_defaults():
    code = (
        "import sys, torch\n"
        "torch.manual_seed(0)\n"
        "m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),"
        " torch.nn.Linear(4 * 6 * 6, 5)).eval()\n"
        "x = torch.randn(1, 3, 8, 8)\n"
        "with torch.no_grad():\n"
        "    got, want = torch.compile(m, backend='autoplace')(x), m(x)\n"
        "assert 'autoplace.pytorch' in sys.modules\n"  # torch found it by its entry point
        "torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")
    assert "runs in PyTorch" not in out.stderr  # built by autoplace, not fallen back


# ----------------------------------------------------------------------------- optimize_module


def _timed(**ms):
    """A stand-in for optimize_module's turn-by-turn timing: these milliseconds per contender
    (``build``, ``eager``, ``compiled``) of those it was given."""
    names = {"build": "build", "eager": "pytorch eager", "compiled": "torch.compile"}
    return lambda contenders, *a, **k: {names[n]: v * 1e-3 for n, v in ms.items()
                                        if names[n] in contenders}


def test_a_module_runs_the_model_eagerly_where_eager_measured_faster(monkeypatch, tmp_path, caplog):
    from autoplace.pytorch import contenders

    model, x = small_cnn(), torch.randn(1, 3, 8, 8)
    monkeypatch.setattr(contenders, "_blocks", _timed(build=2.0, eager=1.0))
    m = optimize_module(model, (x,), CPU, **FAST)
    assert m.runs == "eager"
    assert "runs pytorch eager: it measured 1 ms a call here against build 2 ms" in m.summary()
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x))
    with caplog.at_level("WARNING"):
        m.save(tmp_path / "m.apmod")
    assert "the file holds the build" in caplog.text
    loaded = autoplace.load_module(tmp_path / "m.apmod")
    assert loaded.runs == "build"
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), atol=1e-5, rtol=1e-5)
    # Within the margin, or asked not to, or a model in training mode: the build runs.
    monkeypatch.setattr(contenders, "_blocks", _timed(build=1.0, eager=0.99))
    assert optimize_module(model, (x,), CPU, **FAST).runs == "build"
    monkeypatch.setattr(contenders, "_blocks", _timed(build=2.0, eager=1.0))
    assert optimize_module(model, (x,), CPU, **FAST, eager_fallback=False).runs == "build"
    assert optimize_module(model.train(), (x,), CPU, **FAST).runs == "build"
    model.eval()


def test_a_build_whose_outputs_differ_from_eager_is_not_run(monkeypatch, caplog):
    from autoplace.pytorch import contenders, module as module_mod

    model, x = small_cnn(), torch.randn(1, 3, 8, 8)
    monkeypatch.setattr(contenders, "_blocks", _timed(build=1.0, eager=2.0))
    right = module_mod.AutoplaceModule.run_flat
    monkeypatch.setattr(module_mod.AutoplaceModule, "run_flat",  # a build that is 10 % off
                        lambda self, inputs: [o * 1.1 for o in right(self, inputs)])
    with caplog.at_level("WARNING"):
        m = optimize_module(model, (x,), CPU, **FAST)
    assert "outputs differ from the model's eager outputs" in caplog.text
    assert m.runs == "eager" and "outputs differed from eager's (relative error 0.1)" in m.summary()
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x))
    caplog.clear()
    with caplog.at_level("WARNING"):  # kept where asked, with the warning
        assert optimize_module(model, (x,), CPU, **FAST, eager_fallback=False).runs == "build"
    assert "relative error 0.1" in caplog.text
    monkeypatch.setattr(module_mod.AutoplaceModule, "run_flat", right)
    assert optimize_module(model, (x,), CPU, **FAST).runs == "build"  # right: it runs


def test_torch_compile_is_a_measured_baseline_the_module_may_run(monkeypatch, caplog):
    from autoplace.pytorch import contenders

    model, x = small_cnn(), torch.randn(1, 3, 8, 8)
    compiled = []
    monkeypatch.setattr(contenders, "_compiled",
                        lambda m, inputs: compiled.append(m) or (lambda *a: m(*a)))
    monkeypatch.setattr(contenders, "_blocks", _timed(build=2.0, eager=1.5, compiled=1.0))
    m = optimize_module(model, (x,), CPU, **dict(FAST, torch_compile=True))
    assert compiled == [model] and m.runs == "torch.compile"
    assert m.result.baselines["torch.compile"] == pytest.approx(1e-3)
    assert "baseline torch.compile" in m.summary() and "runs torch.compile" in m.summary()
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x))
    # Asked not to: not compiled, not among the baselines.
    compiled.clear()
    m = optimize_module(model, (x,), CPU, **FAST)
    assert compiled == [] and "torch.compile" not in m.result.baselines and m.runs == "eager"
    # By default: not where ONNX Runtime on the whole model is a contender; where it is not
    # (not installed, an export that fails), Inductor is the user's best framework: compiled.
    by_default = {k: v for k, v in FAST.items() if k != "torch_compile"}
    m = optimize_module(model, (x,), CPU, **by_default)
    assert compiled == []
    monkeypatch.setattr(contenders, "_onnxruntime", lambda *a, **k: None)
    m = optimize_module(model, (x,), CPU, **by_default)
    assert compiled == [model] and m.runs == "torch.compile"
    # Where Inductor fails, a warning says why and the module runs what measured fastest.
    monkeypatch.undo()
    monkeypatch.setattr(contenders, "_blocks", _timed(build=1.0, eager=2.0, compiled=0.1))
    monkeypatch.setattr(torch, "compile", lambda *a, **k: (_ for _ in ()).throw(
        RuntimeError("no C++ compiler")))
    with caplog.at_level("WARNING"):
        m = optimize_module(model, (x,), CPU, **dict(FAST, torch_compile=True))
    assert "torch.compile of the model failed" in caplog.text and "no C++ compiler" in caplog.text
    assert m.runs == "build" and "torch.compile" not in m.result.baselines


@pytest.mark.slow
def test_torch_compile_really_compiles_the_model():
    from autoplace.pytorch.contenders import _compiled

    model, x = small_cnn(), torch.randn(1, 3, 8, 8)
    compiled = _compiled(model, (x,))
    assert compiled is not None
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def cnn_module():
    model = small_cnn()
    return model, optimize_module(model, (torch.randn(1, 3, 8, 8),), CPU, **FAST,
                                  eager_fallback=False)


def test_optimize_module_matches_eager_and_carries_its_plan(cnn_module):
    model, m = cnn_module
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        want = model(x)
    got = m(x)
    assert isinstance(m, torch.nn.Module) and isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert m.plan == m.result.plan and m.plan.used_devices() == tuple(CPU)
    assert "cpu0" in m.summary() and "cpu0" in str(m.explain())
    assert model.training is False  # left as it was


def test_inputs_and_outputs_cross_by_dlpack_without_copies(cnn_module, monkeypatch):
    _, m = cnn_module
    seen, build = {}, m._build

    class Spy:  # the build, recording the TVM tensors of each call
        def call_tensors(self, *args):
            seen["in"], seen["out"] = args, build.call_tensors(*args)
            return seen["out"]

    monkeypatch.setattr(m, "_build", Spy())
    x = torch.randn(1, 3, 8, 8)
    y = m(x)
    # The build read the caller's tensor's memory, and the caller reads the build's output's.
    assert seen["in"][0].data_ptr() == x.data_ptr()
    assert y.data_ptr() == seen["out"][0].data_ptr()
    y2 = m(x * 2)  # a new output each call: the first is not overwritten
    assert y2.data_ptr() != y.data_ptr()
    torch.testing.assert_close(y2, m(x * 2))
    assert not torch.equal(y, y2)


def test_calls_from_several_threads_take_turns_and_each_gets_its_own_result(cnn_module):
    _, m = cnn_module
    xs = [torch.randn(1, 3, 8, 8) for _ in range(4)]
    want = [m(x) for x in xs]
    errors = []

    def work(k):
        for _ in range(30):
            if not torch.equal(m(xs[k]), want[k]):
                errors.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)


def test_an_input_that_is_not_contiguous_or_aligned_is_copied_first(cnn_module, monkeypatch):
    _, m = cnn_module
    base = torch.randn(2, 3, 8, 8)
    x = base[1:]  # offset by one image: still 64-byte aligned? copy only when not
    odd = torch.randn(1 * 3 * 8 * 8 + 1)[1:].view(1, 3, 8, 8)  # 4 bytes off alignment
    wide = torch.randn(1, 3, 8, 16)[..., ::2]  # not contiguous
    want = [m(t.contiguous().clone()) for t in (x, odd, wide)]
    # copied by numpy on the caller's thread: PyTorch's copy would wake its thread pool
    monkeypatch.setattr(torch.Tensor, "clone", lambda *a, **k: pytest.fail("PyTorch copied"))
    for t, w in zip((x, odd, wide), want):
        torch.testing.assert_close(m(t), w)


class _ReshapeAndDouble(torch.nn.Module):
    def forward(self, x):
        return x.reshape(4, 8), x * 2  # the first may be a view of the input in the build


def test_an_output_sharing_an_unaligned_inputs_kept_copy_is_not_overwritten_by_the_next_call():
    m = autoplace.optimize_module(_ReshapeAndDouble(), (torch.randn(32),), CPU,
                                  eager_fallback=False, **FAST)

    def odd(seed):  # 4 bytes off alignment: copied into the buffer kept for the input
        return torch.randn(33, generator=torch.Generator().manual_seed(seed))[1:]

    first, second = odd(1), odd(2)
    y1 = m(first)
    y2 = m(second)
    torch.testing.assert_close(y1[0], first.reshape(4, 8))
    torch.testing.assert_close(y1[1], first * 2)
    torch.testing.assert_close(y2[0], second.reshape(4, 8))
    assert y1[0].data_ptr() != y2[0].data_ptr()


def test_a_wrong_input_names_what_the_build_takes_and_what_it_got(cnn_module):
    _, m = cnn_module
    with pytest.raises(TypeError, match=r"takes float32\[1, 3, 8, 8\] on cpu, got float64"):
        m(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"takes float32\[1, 3, 8, 8\] on cpu, got float32\[2, 3, 8, 8\]"):
        m(torch.randn(2, 3, 8, 8))
    with pytest.raises(TypeError, match="expected 1 inputs"):
        m(torch.randn(1, 3, 8, 8), torch.randn(1))
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        m(np.zeros((1, 3, 8, 8), "float32"))


def test_save_and_load_run_the_same_build_without_building(cnn_module, tmp_path, monkeypatch):
    import tvm

    _, m = cnn_module
    path = tmp_path / "cnn.apmod"
    m.save(path)

    def no(*args, **kwargs):
        raise AssertionError("load_module built or optimized")

    monkeypatch.setattr(tvm, "compile", no)
    import autoplace.pytorch.module as door

    monkeypatch.setattr(sys.modules["autoplace.run.compile"], "build", no)
    for name in ("optimize", "compile", "build_of"):
        monkeypatch.setattr(door, name, no)
    loaded = load_module(path)
    x = torch.randn(1, 3, 8, 8)
    torch.testing.assert_close(loaded(x), m(x), atol=0, rtol=0)
    assert loaded.plan == m.plan and loaded.inputs == m.inputs and loaded.result is None
    assert "cpu0" in loaded.summary()
    with pytest.raises(ValueError, match="explain"):
        loaded.explain()
    loaded.save(tmp_path / "again.apmod")  # a loaded module saves what it loaded
    torch.testing.assert_close(load_module(tmp_path / "again.apmod")(x), m(x), atol=0, rtol=0)


def test_a_plan_over_two_devices_round_trips_with_its_constants_on_each(tmp_path):
    # Pinned apart: the first matmul on a, the rest on b; a build over two devices lifts its
    # weights into parameters uploaded to their device, which the file carries.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(2, 8)
    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="b")]
    m = optimize_module(model, (x,), devs, **FAST, eager_fallback=False,
                        pins=[("index:0-1", "a"), ("*", "b")], baseline_guard=False)
    assert {d.name for d in m.plan.used_devices()} == {"a", "b"} and m._build.lifted
    with torch.no_grad():
        torch.testing.assert_close(m(x), model(x), atol=1e-5, rtol=1e-5)
    m.save(tmp_path / "two.apmod")
    torch.testing.assert_close(load_module(tmp_path / "two.apmod")(x), m(x), atol=0, rtol=0)


def test_load_of_a_file_from_another_version_says_so_in_one_line(cnn_module, tmp_path):
    _, m = cnn_module
    path, other = tmp_path / "cnn.apmod", tmp_path / "old.apmod"
    m.save(path)
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(other, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "meta.json":
                data = json.dumps(json.loads(data) | {"tvm": "0.20.0"}).encode()
            dst.writestr(name, data)
    with pytest.raises(ModuleFileError, match="TVM 0.20.0.*optimize_module the model again") as e:
        load_module(other)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    (tmp_path / "junk").write_text("not a zip")
    with pytest.raises(ModuleFileError, match="not a module saved by autoplace"):
        load_module(tmp_path / "junk")


class TwoOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return {"sum": self.fc(x) + y, "parts": (x * 2, torch.relu(y))}


def test_a_model_of_two_inputs_returns_its_own_structure_and_round_trips(tmp_path):
    model = TwoOut().eval()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    m = optimize_module(model, (x, y), CPU, **FAST, eager_fallback=False)
    got = m(x, y)
    with torch.no_grad():
        want = model(x, y)
    assert set(got) == {"sum", "parts"} and isinstance(got["parts"], tuple)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    m.save(tmp_path / "two.apmod")
    torch.testing.assert_close(load_module(tmp_path / "two.apmod")(x, y), want, atol=1e-5, rtol=1e-5)


def test_autoplace_imports_without_torch_and_its_door_says_how_to_get_it():
    code = ("import sys\n"
            "sys.modules['torch'] = None\n"  # as if torch were not installed
            "import autoplace\n"
            "try:\n"
            "    autoplace.optimize_module(None, ())\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pip install 'autoplace[frontends]'" in out.stdout
    assert len(out.stdout.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- pipelines


@pytest.fixture(scope="module")
def two_stage_pipe():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Chain:
        @R.function
        def main(x: R.Tensor((4, 8), "float32")):
            with R.dataflow():
                a = R.nn.relu(x)
                b = R.exp(a)
                R.output(b)
            return b

    devs = [Device.cpu(0, name="a"), Device.cpu(1, name="b")]
    g = autoplace.OpGraph.from_relax(Chain)
    plan = autoplace.Plan.from_assignment(g, devs, ["a", "b"], stages=(0, 1), objective="throughput")
    with autoplace.run.Pipeline.from_plan(Chain, plan, queue_size=1, micro_batch=1) as pipe:
        one = autoplace.Plan.from_assignment(g, devs, ["a", "a"], stages=(0, 0),
                                             objective="throughput")
        with autoplace.run.Pipeline.from_plan(Chain, one) as direct:  # on the caller's thread
            pipe.direct = direct
            yield pipe


@pytest.mark.parametrize("which", ["stages", "one stage"])
def test_a_pipeline_gives_torch_for_torch_and_numpy_for_numpy(two_stage_pipe, which):
    pipe = two_stage_pipe if which == "stages" else two_stage_pipe.direct
    xs = [torch.randn(4, 8) for _ in range(5)]
    outs = pipe.run([x] for x in xs)
    assert all(isinstance(o[0], torch.Tensor) for o in outs)
    for x, [o] in zip(xs, outs):
        torch.testing.assert_close(o, torch.exp(torch.relu(x)))
    arrays = pipe.run([x.numpy()] for x in xs)
    assert all(isinstance(o[0], np.ndarray) for o in arrays)
    np.testing.assert_allclose(arrays[0][0], outs[0][0].numpy())


def test_a_fast_producer_is_held_back_by_the_bounded_queues(two_stage_pipe, monkeypatch):
    # Stage 1 holds its first input until the generator is two inputs ahead of it (as a slow
    # stage would, however fast the host runs stage 0), then takes 2 ms an input; a generator
    # makes inputs at once. Pulled but not done stays within (queue_size + 2) * micro_batch (+1
    # being pulled) = 4: the pipeline reads the generator only as stage 0 is free, and stage 0
    # waits on the full queue to stage 1. (A pipeline that let no input ahead would leave stage
    # 1 waiting a minute, and fail.)
    done, lead, ahead = [0], [], threading.Event()
    Pipeline = autoplace.run.Pipeline
    original = Pipeline._processor

    def processor(self, w, fn, dev):
        process = original(self, w, fn, dev)
        if self._stage_of[w] != len(self.staged.stages) - 1:
            return process

        def counted(item):
            ahead.wait(60)
            time.sleep(0.002)
            process(item)
            done[0] += 1

        return counted

    def producer():
        for n in range(60):
            lead.append(n - done[0])
            if lead[-1] >= 2:
                ahead.set()
            yield [torch.ones(4, 8)]

    # The workers make their processors as a pipeline starts: a fresh one on the same builds.
    monkeypatch.setattr(Pipeline, "_processor", processor)
    staged, executables = two_stage_pipe.staged, two_stage_pipe._executables
    with Pipeline(staged, executables, queue_size=1, micro_batch=1) as pipe:
        outs = pipe.run(producer())
    assert len(outs) == 60 and 2 <= max(lead) <= 4, max(lead)
