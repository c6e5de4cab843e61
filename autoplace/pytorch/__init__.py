"""PyTorch's door into autoplace: a ``torch.compile`` backend (:func:`dynamo_backend`, or
``backend="autoplace"``), and :func:`optimize_module`, a model placed, built and wrapped as a
``torch.nn.Module`` that can be saved and loaded (:func:`load_module`)."""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("autoplace.pytorch needs PyTorch: pip install 'autoplace[frontends]'") from e

from autoplace.pytorch.backend import AutoplaceBackend, GraphRecord, dynamo_backend
from autoplace.pytorch.module import (AutoplaceModule, ModuleFileError, TensorSpec, load_module,
                                      optimize_module)

__all__ = ["AutoplaceBackend", "AutoplaceModule", "GraphRecord", "ModuleFileError", "TensorSpec",
           "dynamo_backend", "load_module", "optimize_module"]
