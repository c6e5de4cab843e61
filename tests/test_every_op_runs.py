"""Every op runs somewhere (issue 52, item 2): models of other families than the zoo's -- a
decoder whose position ids are a running sum of its attention mask, an audio encoder whose stem
is two ``conv1d`` -- import, place over ``[cpu0, torch]`` and match eager; every op of them and
of the zoo's PyTorch models is built by TVM or has a PyTorch equivalent."""

import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import autoplace  # noqa: E402
from autoplace import Device, RooflineCostModel  # noqa: E402
from autoplace.backend.lowering import build_single  # noqa: E402
from autoplace.backend.torch_equivalents import equivalent, node_equivalent  # noqa: E402
from autoplace.graph import OpGraph  # noqa: E402
from autoplace.profile.workload import single_op_modules  # noqa: E402

SLOW_CPU = Device.cpu(0, peak_flops=4e8)  # as tests/test_torch_device.py: PyTorch's conv wins
D, HEADS, SEQ, VOCAB = 32, 2, 8, 50


class Decoder(torch.nn.Module):
    """A decoder layer as Hugging Face's GPT-2 and Llama build one: token and position
    embeddings, the position ids a running sum of the attention mask (``bool_mask``: of the
    bool mask itself, else of it as int64, less one, clamped at 0), causal attention under the
    mask."""

    def __init__(self, bool_mask: bool = False):
        super().__init__()
        self.bool_mask = bool_mask
        self.tok, self.pos = torch.nn.Embedding(VOCAB, D), torch.nn.Embedding(SEQ, D)
        self.ln = torch.nn.LayerNorm(D)
        self.qkv, self.out = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)

    def forward(self, ids, mask):
        if self.bool_mask:
            pos = torch.cumsum(mask, dim=-1).clamp(max=SEQ - 1)
        else:
            pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        x = self.tok(ids) + self.pos(pos)
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln(x)).reshape(b, s, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        att = q @ k.transpose(-2, -1) / (D // HEADS) ** 0.5
        allowed = torch.ones(s, s, dtype=torch.bool).tril()[None, None] \
            & mask[:, None, None, :].bool()
        att = att.masked_fill(~allowed, torch.finfo(att.dtype).min).softmax(-1)
        return x + self.out((att @ v).transpose(1, 2).reshape(b, s, D))


class AudioEncoder(torch.nn.Module):
    """A Whisper-style encoder stem: two ``conv1d`` with GELU (the second of stride 2), then a
    transformer encoder layer over the frames."""

    def __init__(self, mels: int = 8):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(mels, D, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(D, D, 3, stride=2, padding=1)
        self.layer = torch.nn.TransformerEncoderLayer(D, HEADS, 2 * D, dropout=0.0,
                                                      batch_first=True)

    def forward(self, x):
        x = torch.nn.functional.gelu(self.conv2(torch.nn.functional.gelu(self.conv1(x))))
        return self.layer(x.transpose(1, 2))


def _decoder_inputs(bool_mask: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[0, -3:] = 0  # right padding: every query still sees a key
    return torch.randint(0, VOCAB, (1, SEQ), generator=g), mask.bool() if bool_mask else mask


def _audio_inputs(seed: int = 0):
    return (torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(seed)),)


def _model(name: str):
    torch.manual_seed(0)
    if name == "audio":
        return AudioEncoder().eval(), _audio_inputs()
    bool_mask = name == "decoder_bool"
    return Decoder(bool_mask).eval(), _decoder_inputs(bool_mask)


MODELS = ["decoder", "decoder_bool", "audio"]


@pytest.fixture(scope="module")
def imported():
    out = {}
    for name in MODELS:
        model, inputs = _model(name)
        out[name] = model, inputs, autoplace.from_torch(model, list(inputs))
    return out


def _check_matches_eager(model, inputs, res):
    got = res.compile(trial=False)(*[x.numpy() for x in inputs])
    got = got[0] if isinstance(got, (list, tuple)) else got
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_a_running_sum_of_a_mask_imports_in_pytorchs_dtype(imported):
    # PyTorch sums a bool or integer tensor in int64; TVM's importer kept the input's dtype,
    # and TVM builds no running sum of bools
    for name in ("decoder", "decoder_bool"):
        g = OpGraph.from_relax(imported[name][2])
        sums = [n for n in g.nodes if n.op_type == "cumsum"]
        assert sums and all(n.outputs[0].dtype == "int64" for n in sums), name
        assert {n.inputs[0].dtype for n in sums} == ({"bool"} if name == "decoder_bool"
                                                      else {"int64"})


@pytest.mark.parametrize("name", ["decoder", "decoder_bool"])  # audio: the conv1d test below
def test_every_model_places_over_cpu_and_torch_and_matches_eager(imported, name):
    model, inputs, mod = imported[name]
    res = autoplace.optimize(mod, [Device.cpu(0), Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel())
    _check_matches_eager(model, inputs, res)


def test_a_cumsum_cpu0_cannot_run_goes_to_torch_and_matches_eager(imported):
    model, inputs, mod = imported["decoder_bool"]
    cpu = Device.cpu(0, unsupported_ops={"cumsum"})
    res = autoplace.optimize(mod, [cpu, Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel())
    placed = {d for n, d in zip(res.graph.nodes, res.plan.assignment) if n.op_type == "cumsum"}
    assert placed == {"torch"}
    _check_matches_eager(model, inputs, res)
    # without the torch device no device runs it, and the error says why
    with pytest.raises(autoplace.InfeasibleError, match="cumsum"):
        autoplace.optimize(mod, [cpu], calibrate=False, db=None, cost_model=RooflineCostModel())


def test_conv1d_lands_on_torch_where_it_is_cheaper_and_matches_eager(imported):
    model, inputs, mod = imported["audio"]
    res = autoplace.optimize(mod, [SLOW_CPU, Device.torch()], calibrate=False, db=None,
                             cost_model=RooflineCostModel())
    convs = [d for n, d in zip(res.graph.nodes, res.plan.assignment) if n.op_type == "nn.conv1d"]
    assert convs == ["torch", "torch"]
    _check_matches_eager(model, inputs, res)


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("axis,in_dtype,out_dtype", [
    (-1, "bool", "int64"), (1, "int32", "int64"), (0, "float32", "float32"),
    (None, "float32", "float64")])
def test_cumsum_equivalent_computes_relax_cumsum(axis, in_dtype, out_dtype, exclusive):
    x = (np.arange(12).reshape(3, 4) % 3 == 1).astype(in_dtype)
    flat = x.reshape(-1) if axis is None else x
    want = np.cumsum(flat, axis=0 if axis is None else axis, dtype=out_dtype)
    if exclusive:
        want = want - flat.astype(out_dtype)
    op = equivalent("cumsum", {"axis": axis, "dtype": out_dtype, "exclusive": exclusive},
                    [((3, 4), in_dtype)], [(want.shape, out_dtype)], "cs")
    got = op.target(torch.from_numpy(x), *op.args[1:])
    assert str(got.dtype) == f"torch.{out_dtype}"
    np.testing.assert_array_equal(got.numpy(), want)


def test_cumsum_kept_in_bool_has_no_equivalent():
    # Relax's cumsum of a bool tensor without a dtype sums in bool: PyTorch has no such sum
    assert equivalent("cumsum", {"axis": 0, "dtype": None, "exclusive": False},
                      [((4,), "bool")], [((4,), "bool")], "cs") is None


def test_conv1d_equivalent_takes_symmetric_ncw_only():
    attrs = {"data_layout": "NCW", "kernel_layout": "OIW", "out_layout": "NCW",
             "padding": [1, 1], "strides": [2], "dilation": [1], "groups": 1,
             "out_dtype": "float32"}
    io = [((1, 4, 9), "float32"), ((6, 4, 3), "float32")], [((1, 6, 5), "float32")]
    op = equivalent("nn.conv1d", attrs, *io, "c")
    x, w = torch.randn(1, 4, 9), torch.randn(6, 4, 3)
    got = op.target(x, w, *op.args[2:])
    np.testing.assert_allclose(got.numpy(), torch.nn.functional.conv1d(
        x, w, stride=2, padding=1).numpy(), rtol=1e-6)
    assert equivalent("nn.conv1d", {**attrs, "padding": [1, 0]}, *io, "c") is None
    assert equivalent("nn.conv1d", {**attrs, "data_layout": "NWC"}, *io, "c") is None


def _coverage_models(imported):
    from autoplace import zoo

    for name in sorted(set(zoo.names()) - set(zoo.names(include_torch=False))):
        yield name, zoo.load(name).mod
    for name in MODELS:
        yield name, imported[name][2]


def test_every_op_of_pytorch_models_has_a_device_that_runs_it(imported):
    # An op runs somewhere where the torch device has its PyTorch equivalent (with these
    # attributes), or else TVM builds it alone for this CPU; every op is one or the other
    import tvm

    devices = [Device.cpu(0), Device.torch()]
    target = tvm.target.Target("llvm")
    lacking = []
    for name, mod in _coverage_models(imported):
        graph = OpGraph.from_relax(mod)
        modules = single_op_modules(mod, graph)
        built: dict[str, bool] = {}
        for n in graph.nodes:
            assert any(d.can_run(n.op_type) for d in devices), (name, n.op_type)
            if node_equivalent(n) is not None:
                continue
            if n.workload_key not in built:
                try:
                    build_single(modules[n.workload_key], target, gpu=False)
                    built[n.workload_key] = True
                except Exception:  # noqa: BLE001 - a build error: no device runs it
                    built[n.workload_key] = False
            if not built[n.workload_key]:
                lacking.append((name, n.name, n.op_type))
    assert lacking == []


class Attention(torch.nn.Module):
    """``scaled_dot_product_attention`` as a model calls it: ``kind`` says with which mask."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, q, k, v, m):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if self.kind == "plain":
            return sdpa(q, k, v)
        if self.kind == "causal":
            return sdpa(q, k, v, is_causal=True, scale=0.3)
        if self.kind == "bool":
            return sdpa(q, k, v, attn_mask=m > 0)
        if self.kind == "float":  # a 3-D additive mask, as a model may pass one
            return sdpa(q, k, v, attn_mask=torch.where(m[0] > 0, 0.0, float("-inf")), scale=0.2)
        if self.kind == "per_query":  # a mask broadcast over the keys: decomposed
            return sdpa(q, k, v, attn_mask=m[..., :1] > 0)
        return sdpa(q, k[:, :1], v[:, :1], enable_gqa=True)  # grouped heads: decomposed


def _attention_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    m = torch.randn(2, 1, 5, 5, generator=g)
    m[0, 0, 2] = -1  # the third query of the first batch may see no key
    return q, k, v, m


@pytest.mark.parametrize("kind", ["plain", "causal", "bool", "float", "per_query", "gqa"])
def test_attention_imports_as_one_op_that_each_device_runs_as_eager(kind):
    # One op (nn.attention) where TVM's attention computes what PyTorch's does: TVM builds it,
    # the torch device runs PyTorch's attention, ORT its export; a row the mask hides whole gives
    # zeros as PyTorch's does, not NaN. Grouped heads, and a mask TVM's attention does not
    # take (one broadcast over the keys), are decomposed, as before.
    model, inputs = Attention(kind), _attention_inputs()
    mod = autoplace.from_torch(model, list(inputs))
    graph = OpGraph.from_relax(mod)
    whole = [n.op_type for n in graph.nodes if n.op_type.startswith("nn.attention")]
    assert whole == ([] if kind in ("gqa", "per_query") else
                     ["nn.attention_bias" if kind in ("bool", "float") else "nn.attention"])
    with torch.no_grad():
        want = model(*inputs).numpy()
    assert not np.isnan(want).any()
    devices = [Device.cpu(0), Device.torch()]
    if importlib.util.find_spec("onnxruntime") is not None:
        devices.append(Device.onnxruntime())
    for dev in devices:
        plan = autoplace.place(graph, devices, [("*", dev.name)]) if dev.name == "cpu0" else \
            autoplace.place(graph, devices, [(f"name:{n.name}", dev.name) for n in graph.nodes
                                             if dev.can_run(n.op_type)] + [("*", "cpu0")])
        assert {d for n, d in zip(graph.nodes, plan.assignment) if n.op_type in whole} <= \
            {dev.name}
        got = autoplace.compile(mod, plan)(*[x.numpy() for x in inputs])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=dev.name)


def test_attention_equivalent_takes_the_causal_mask_pytorch_has():
    bshd = ((1, 5, 3, 8), "float32")
    call = dict(inputs=[bshd] * 3, outputs=[bshd], node="lv0")
    assert equivalent("nn.attention", {"scale": 0.5, "causal_mask": "TopLeft"}, **call)
    assert equivalent("nn.attention", {"causal_mask": "BottomRight"}, **call) is None
