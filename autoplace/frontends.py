"""Bring models into Relax: PyTorch through ``torch.export``, and ONNX files."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    import tvm

_LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def from_torch(model: torch.nn.Module, example_inputs: Sequence) -> tvm.IRModule:
    """Export ``model`` (in eval mode) with static shapes and import it; weights become constants.
    ``example_inputs`` are numpy arrays or torch tensors."""
    return from_exported(export_torch(model, example_inputs))


def export_torch(model: torch.nn.Module, example_inputs: Sequence) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` in eval mode (its mode is restored after), without
    gradients, at the static shapes of ``example_inputs`` (numpy arrays or torch tensors)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("from_torch needs PyTorch: pip install 'autoplace[frontends]'") from e

    args = tuple(x.detach() if isinstance(x, torch.Tensor)
                 else torch.from_numpy(np.ascontiguousarray(x)) for x in example_inputs)
    training = model.training
    try:
        with warnings.catch_warnings():
            # A deprecation inside torch.export (its decompositions, which the importer runs),
            # not about anything the caller wrote: every model would print it.
            warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
            with torch.no_grad():
                return torch.export.export(model.eval(), args)
    finally:
        model.train(training)


def from_exported(exported: torch.export.ExportedProgram) -> tvm.IRModule:
    """Import a ``torch.export`` program into Relax; its parameters and buffers become
    constants, its user inputs the parameters of ``main`` in order."""
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
        with torch.no_grad():
            return from_exported_program(exported)


def from_onnx(path: str | Path) -> tvm.IRModule:
    """Import an ONNX file; its initializers become constants."""
    try:
        import onnx
    except ImportError as e:
        raise ImportError("from_onnx needs the onnx package: pip install 'autoplace[frontends]'") from e
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # onnx raises several unrelated types for a bad file
        raise ValueError(f"{path} is not a valid ONNX model: {e}") from e
    return _from_onnx(model)
