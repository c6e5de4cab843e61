"""The models ``vs_frameworks.py`` compares: PyTorch modules with random weights whose outputs
are O(1), their example inputs, and the Relax module TVM builds from each.

``load(name)`` is deterministic for a seed, so every process of the benchmark (PyTorch, ONNX
Runtime, tuning, TVM) builds the same weights; the benchmark checks that by comparing outputs.

- ``zoo:NAME``: a torch-backed model of ``autoplace.zoo`` (its Relax module is
  ``autoplace.zoo.load(NAME).mod``).
- torchvision models (``torchvision==0.28.0``), batch 1, 224x224: ``resnet18``,
  ``mobilenet_v3_small`` and the others of :data:`TORCHVISION`.
- ``bert``: a BERT encoder, 4 layers, hidden 256, 4 heads, sequence 128, batch 1, from
  ``transformers``' ``BertConfig``; without ``transformers``, an equivalent encoder in plain torch.
  ``bert_tiny`` and ``bert_wide`` are the same encoder at other sizes (:data:`BERTS`).

:data:`FAMILIES` groups the models by architecture family, for scoring cost models on families
they never saw (``unseen_models.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

INSTALL_HINT = "pip install -e '.[bench]'"

TORCHVISION = {name: f"torchvision {name}, 224x224" for name in (
    "resnet18", "resnet34", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
    "regnet_x_400mf", "regnet_y_400mf", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0",
    "efficientnet_b0", "convnext_tiny", "squeezenet1_1", "densenet121")}
ZOO = ("zoo:resnet", "zoo:transformer")

# BERT-style encoders: layers, hidden size, heads, feed-forward size, sequence length.
BERTS = {"bert": dict(layers=4, hidden=256, heads=4, ffn=1024, seq=128, vocab=30522),
         "bert_tiny": dict(layers=2, hidden=128, heads=2, ffn=512, seq=64, vocab=30522),
         "bert_wide": dict(layers=2, hidden=512, heads=8, ffn=2048, seq=128, vocab=30522)}
# Families no other model here belongs to, from ``transformers`` at small configs (random weights):
# decoders with an attention mask (left padding) whose position ids and causal mask the model
# computes itself, audio encoders opening on conv1d, and token mixing by Fourier transform.
OTHERS = {"gpt2": "transformers GPT2Model, 2 layers, hidden 128, 32 tokens, masked",
          "llama": "transformers LlamaModel, 2 layers, hidden 128, 4 heads on 2 KV heads, 32 "
                   "tokens, masked",
          "whisper_encoder": "transformers Whisper encoder, 2 layers, d 128, 80 mels x 200 frames",
          "wav2vec2": "transformers Wav2Vec2Model, 3 conv1d, 2 layers, hidden 128, 4000 samples",
          "fnet": "transformers FNetModel, 2 layers, hidden 128, 32 tokens (FFT token mixing)"}
NAMES = (*ZOO, *TORCHVISION, *BERTS, *OTHERS)

# Architecture families of the models above (a zoo model belongs to none).
FAMILIES = {"resnet": ("resnet18", "resnet34"),
            "mobilenet": ("mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large"),
            "regnet": ("regnet_x_400mf", "regnet_y_400mf"),
            "shufflenet": ("shufflenet_v2_x0_5", "shufflenet_v2_x1_0"),
            "efficientnet": ("efficientnet_b0",), "convnext": ("convnext_tiny",),
            "squeezenet": ("squeezenet1_1",), "bert": tuple(BERTS)}


@dataclass(frozen=True, eq=False)
class BenchModel:
    """A model as every framework gets it: ``module`` (eval mode) called with ``inputs``."""

    name: str
    module: Any
    inputs: list[np.ndarray]
    description: str


def load(name: str, seed: int = 0, *, transformers: bool = True) -> BenchModel:
    """Build model ``name`` (one of :data:`NAMES`) with weights and inputs drawn from ``seed``;
    a BERT encoder is ``transformers``' where that is installed, unless ``transformers`` is
    False (then the one written in torch, the same on every machine).

    Raises ``ImportError`` (with the install command) when the package it needs is missing.
    """
    import torch

    if name in ZOO:
        from autoplace import zoo
        from autoplace.zoo import torch_models

        short = name.removeprefix("zoo:")
        module, shapes = getattr(torch_models, short)(seed)
        inputs = torch_models.example_inputs(shapes, np.random.default_rng(seed))
        return BenchModel(name, module.eval(), inputs, f"autoplace zoo: {zoo.describe(short)}")
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    if name in TORCHVISION:
        models = import_torchvision().models
        module = getattr(models, name)(weights=None)
        x = rng.standard_normal((1, 3, 224, 224)).astype("float32")
        calibration = torch.from_numpy(rng.standard_normal((2, 3, 224, 224)).astype("float32"))
        return BenchModel(name, _reinit(module, seed, calibration), [x], TORCHVISION[name])
    if name in BERTS:
        config = BERTS[name]
        module, description = _bert(config, transformers)
        ids = rng.integers(0, config["vocab"], (1, config["seq"])).astype("int64")
        return BenchModel(name, _reinit(module, seed), [ids], description)
    if name in OTHERS:
        module, inputs = _other(name, rng)
        return BenchModel(name, _reinit(module, seed), inputs, OTHERS[name])
    raise KeyError(f"no benchmark model {name!r}; available: {', '.join(NAMES)}")


def _other(name: str, rng):
    """(module returning the last hidden state, numpy inputs) of a model of :data:`OTHERS`."""
    import torch

    hf = import_transformers()
    if hf is None:
        raise ImportError(f"{name} needs transformers: {INSTALL_HINT}")
    tokens, vocab = 32, 1000
    ids = rng.integers(0, vocab, (1, tokens)).astype("int64")
    mask = np.ones((1, tokens), dtype="int64")
    mask[0, :4] = 0  # left padding: the model derives its positions and causal mask from it
    if name == "gpt2":
        inner = hf.GPT2Model(hf.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=vocab,
                                           n_positions=64, bos_token_id=0, eos_token_id=0))
        call, inputs = (lambda m, i, a: m(input_ids=i, attention_mask=a)), [ids, mask]
    elif name == "llama":
        inner = hf.LlamaModel(hf.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=64))
        call = lambda m, i, a: m(input_ids=i, attention_mask=a, use_cache=False)  # noqa: E731
        inputs = [ids, mask]
    elif name == "whisper_encoder":
        inner = hf.WhisperModel(hf.WhisperConfig(
            d_model=128, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
            num_mel_bins=80, max_source_positions=100)).encoder
        call = lambda m, x: m(x)  # noqa: E731
        inputs = [rng.standard_normal((1, 80, 200)).astype("float32")]
    elif name == "wav2vec2":
        inner = hf.Wav2Vec2Model(hf.Wav2Vec2Config(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
            conv_dim=(64, 64, 64), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))
        call = lambda m, x: m(x)  # noqa: E731
        inputs = [rng.standard_normal((1, 4000)).astype("float32")]
    else:
        inner = hf.FNetModel(hf.FNetConfig(
            hidden_size=128, num_hidden_layers=2, intermediate_size=256, vocab_size=vocab,
            max_position_embeddings=64, use_tpu_fourier_optimizations=False))
        call, inputs = (lambda m, i: m(input_ids=i)), [ids]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return call(self.inner, *args).last_hidden_state

    return Model(), inputs


def relax_module(model: BenchModel, seed: int = 0):
    """The Relax module TVM builds for ``model`` (weights as constants)."""
    if model.name in ZOO:
        from autoplace import zoo

        return zoo.load(model.name.removeprefix("zoo:"), seed).mod
    from autoplace.frontends import from_torch

    return from_torch(model.module, model.inputs)


def relax_and_inputs(name: str):
    """``(relax module, inputs)`` of any ``zoo:NAME`` model (autoplace's zoo, its own example
    inputs) or of a model of :data:`NAMES`."""
    from autoplace import zoo

    if name.startswith("zoo:") and name.removeprefix("zoo:") in zoo.names():
        m = zoo.load(name.removeprefix("zoo:"))
        return m.mod, m.inputs
    model = load(name)
    return relax_module(model), model.inputs


def rel_error(outs, ref) -> float:
    """||outs - ref|| / ||ref|| over all of a model's outputs (arrays), in float64."""
    a = np.concatenate([np.asarray(o, dtype="float64").ravel() for o in outs])
    b = np.concatenate([np.asarray(r, dtype="float64").ravel() for r in ref])
    if a.shape != b.shape:
        raise ValueError(f"outputs have {a.size} values, the reference's {b.size}")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def import_torchvision():
    """``import torchvision`` on a CPU-only torch.

    torchvision 0.28's compiled operators link the CUDA build of torch, so its import fails with
    "operator torchvision::nms does not exist"; defining the two operator schemas it looks up
    first lets the Python model definitions load (docs/tvm_notes.md). Detection ops stay unusable.
    Raises ``ImportError`` with the install command when torchvision is not installed.
    """
    import importlib.util
    import sys

    import torch

    if importlib.util.find_spec("torchvision") is None:
        raise ImportError(f"torchvision is not installed: {INSTALL_HINT}")
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
        del sys.modules[name]  # the failed import's half-initialised modules
    global _SHIM
    _SHIM = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        _SHIM.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision
    return torchvision


_SHIM = None  # the operator schemas live as long as this library object


def import_transformers():
    """``import transformers`` (after torchvision, which it imports where installed, on a
    CPU-only torch: :func:`import_torchvision`), or None where it is not installed."""
    try:
        import_torchvision()
    except ImportError:
        pass
    try:
        import transformers
    except ImportError:
        return None
    return transformers


def _bert(size: dict, transformers: bool = True):
    """(module taking token ids, returning the last hidden state; description) of the encoder
    of ``size`` (a value of :data:`BERTS`): ``transformers``' BertModel where it is installed
    and ``transformers``, else :func:`_TorchEncoder`."""
    import torch

    if not transformers:
        return _TorchEncoder(size), "BERT-style encoder written in torch"
    hf = import_transformers()
    if hf is None:
        return (_TorchEncoder(size),
                f"BERT-style encoder written in torch (transformers not installed: {INSTALL_HINT})")
    BertConfig, BertModel = hf.BertConfig, hf.BertModel
    config = BertConfig(vocab_size=size["vocab"], hidden_size=size["hidden"],
                        num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                        intermediate_size=size["ffn"], max_position_embeddings=512)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, ids):
            return self.bert(input_ids=ids).last_hidden_state

    return Encoder(), (f"transformers BertModel, {size['layers']} layers, hidden {size['hidden']}, "
                       f"sequence {size['seq']}")


def _TorchEncoder(size: dict):
    """BERT's encoder in plain torch: word + position embeddings, LayerNorm, and post-norm layers
    of 4-head self-attention and a GELU feed-forward."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    d, heads = size["hidden"], size["heads"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
            ffn = size["ffn"]
            self.ffn = nn.Sequential(nn.Linear(d, ffn), nn.GELU(), nn.Linear(ffn, d))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).reshape(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
            x = self.ln1(x + self.out(att))
            return self.ln2(x + self.ffn(x))

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(size["vocab"], d)
            self.positions = nn.Embedding(512, d)
            self.ln = nn.LayerNorm(d, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(size["layers"]))

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            x = self.ln(self.words(ids) + self.positions(pos))
            for layer in self.layers:
                x = layer(x)
            return x

    return Encoder()


def _reinit(module, seed: int, calibration=None):
    """Weights that keep activations O(1), so relative errors mean something (torchvision's and
    BERT's defaults give near-zero outputs or near-uniform attention): fan-in normal convs and
    linears, small random biases and norm affines, unit-normal embeddings. With ``calibration``
    (a batch of inputs), BatchNorms get random scales and shifts and the statistics of that batch
    (one forward pass in training mode)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(seed)

    def normal(t, std):
        t.copy_(torch.randn(t.shape, generator=g) * std)

    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear)):
                normal(m.weight, m.weight[0].numel() ** -0.5)
                if m.bias is not None:
                    normal(m.bias, 0.1)
            elif isinstance(m, nn.Embedding):
                normal(m.weight, 1.0)
            elif isinstance(m, nn.LayerNorm):
                m.weight.copy_(1 + torch.randn(m.weight.shape, generator=g) * 0.1)
                normal(m.bias, 0.1)
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                normal(m.bias, 0.1)
        if calibration is not None:
            norms = [m for m in module.modules() if isinstance(m, nn.BatchNorm2d)]
            for m in norms:
                m.reset_running_stats()
                m.momentum = None  # a cumulative average: one batch gives its own statistics
            module.train()
            module(calibration)
    return module.eval()
