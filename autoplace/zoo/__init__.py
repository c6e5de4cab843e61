"""A small zoo of real architectures (random weights) for tests, benchmarks, demos and notebooks.

``load(name)`` returns the Relax module and example inputs. Models marked ``torch`` need the
``frontends`` extra; the Relax-native ones need only TVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from autoplace.zoo import relax_models, torch_models

_RELAX = {
    "mlp": (relax_models.mlp, "4-layer ReLU MLP, batch 8, width 64 (Relax-native)"),
    "branchy_cnn": (relax_models.branchy_cnn, "conv stem, two branches, concat, head (Relax-native)"),
    "weights_as_inputs": (relax_models.weights_as_inputs,
                          "two matmuls sharing a weight passed as input (Relax-native)"),
}
_TORCH = {
    "resnet": (torch_models.resnet, "ResNet-style, 4 basic blocks, 32x32 (torch.export)"),
    "mobilenet": (torch_models.mobilenet, "MobileNetV2-style, depthwise convs, 32x32 (torch.export)"),
    "inception": (torch_models.inception, "two Inception blocks, 4 branches each (torch.export)"),
    "transformer": (torch_models.transformer, "one encoder layer, seq 32, d 64 (torch.export)"),
}


@dataclass(frozen=True, eq=False)
class ZooModel:
    """A zoo model: its Relax module, example inputs (all function parameters) and a description."""

    name: str
    mod: Any
    inputs: list[np.ndarray]
    description: str


def names(*, include_torch: bool = True) -> list[str]:
    return list(_RELAX) + (list(_TORCH) if include_torch else [])


def describe(name: str) -> str:
    return {**_RELAX, **_TORCH}[name][1] if name in names() else ""


def load(name: str, seed: int = 0) -> ZooModel:
    """Build zoo model ``name`` with weights and inputs drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    if name in _RELAX:
        fn, desc = _RELAX[name]
        mod, inputs = fn(rng)
        return ZooModel(name, mod, inputs, desc)
    if name in _TORCH:
        from autoplace.frontends import from_torch

        fn, desc = _TORCH[name]
        model, shapes = fn(seed)
        inputs = torch_models.example_inputs(shapes, rng)
        return ZooModel(name, from_torch(model, inputs), inputs, desc)
    raise KeyError(f"no zoo model {name!r}; available: {', '.join(names())}")


def torch_model(name: str, seed: int = 0):
    """Zoo model ``name``, one written in PyTorch, as a ``torch.nn.Module`` in eval mode and its
    example inputs as torch tensors (the same weights and inputs :func:`load` gives); None for a
    model written in Relax."""
    if name not in _TORCH:
        return None
    import torch

    model, shapes = _TORCH[name][0](seed)
    inputs = torch_models.example_inputs(shapes, np.random.default_rng(seed))
    return model, [torch.from_numpy(x) for x in inputs]


def from_spec(spec: str, seed: int = 0) -> ZooModel:
    """``zoo:NAME`` or a path to an ``.onnx`` file (random inputs of the model's input shapes)."""
    if spec.startswith("zoo:"):
        return load(spec[4:], seed)
    if spec.endswith(".onnx"):
        from autoplace.frontends import from_onnx
        from autoplace.graph import OpGraph

        mod = from_onnx(spec)
        rng = np.random.default_rng(seed)
        graph = OpGraph.from_relax(mod)
        inputs = [rng.standard_normal(i.tensor.shape).astype(i.tensor.dtype) for i in graph.inputs]
        return ZooModel(spec, mod, inputs, f"ONNX file {spec}")
    raise ValueError(f"model {spec!r}: expected 'zoo:NAME' (one of {', '.join(names())}) "
                     "or a path ending in .onnx")
