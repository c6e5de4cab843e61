"""Arrays in and out of TVM: numpy to a TVM tensor on a device and back, with the fewest copies."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import tvm


def to_tvm(x, dev: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """A copy of the array ``x`` as a TVM tensor on ``dev``.

    On ``cpu(0)`` numpy copies ``x`` into a 64-byte-aligned buffer (the alignment TVM's kernels
    assume) that TVM adopts through DLPack: about 5 us for a small array where
    ``tvm.runtime.tensor`` takes about 40 us.
    """
    import tvm

    x = np.asarray(x)
    if dev != tvm.cpu(0) or x.size == 0:  # numpy gives an empty array no aligned pointer
        return tvm.runtime.tensor(np.ascontiguousarray(x), dev)
    out = aligned_empty(x.shape, x.dtype)
    np.copyto(out, x)
    return tvm.runtime.from_dlpack(out)


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized contiguous numpy array whose data starts on an :data:`ALIGN`-byte
    boundary, as TVM's kernels assume and ``tvm.runtime.from_dlpack`` requires."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buf = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -buf.ctypes.data % ALIGN
    return buf[start:start + nbytes].view(dtype).reshape(shape)


class InputSlot:
    """One input of a compiled function, kept as a TVM tensor on ``dev`` that each call's array
    is copied into (:meth:`fill`): no allocation per call, and on a CPU device one numpy copy
    into memory TVM shares (``Tensor.copyfrom`` costs about 5 us more an input). A tensor
    filled for one call must not be used after the next fill."""

    def __init__(self, dev: tvm.runtime.Device):
        self.dev = dev
        self._tensor = self._view = self._span = None
        self._kind = None  # (shape, dtype) of the tensor held

    def fill(self, x) -> tvm.runtime.Tensor:
        """The tensor holding a copy of the array ``x`` (a new one when its shape or dtype
        changed)."""
        x = np.asarray(x)
        if self._kind != (x.shape, x.dtype):
            import tvm

            self._tensor = to_tvm(x, self.dev)
            self._view = np.from_dlpack(self._tensor) if _on_cpu(self.dev) and x.size else None
            self._kind = (x.shape, x.dtype)
            start = None if self._view is None else self._view.ctypes.data
            self._span = None if start is None else (start, start + max(self._view.nbytes, 1))
        elif self._view is not None:
            np.copyto(self._view, x)
        else:
            self._tensor.copyfrom(np.ascontiguousarray(x))
        return self._tensor

    def holds(self, address: int) -> bool:
        """Whether byte ``address`` of this process lies in the held tensor's memory (False on
        a device numpy cannot read, or before the first fill)."""
        return self._span is not None and self._span[0] <= address < self._span[1]


def to_numpy(t: tvm.runtime.Tensor) -> np.ndarray:
    """A numpy copy of the TVM tensor ``t`` (from a CPU tensor through DLPack, about 15 us
    less than ``t.numpy()``)."""
    import tvm

    if not _on_cpu(t.device):
        return t.numpy()
    return np.from_dlpack(t).copy()


def _on_cpu(dev: tvm.runtime.Device) -> bool:
    """Whether ``dev`` is a CPU device (any id: its memory is the host's, which numpy shares)."""
    import tvm

    return dev.dlpack_device_type() == tvm.cpu().dlpack_device_type()


#: Bytes a tensor's data is aligned to (``tvm.runtime.from_dlpack`` refuses less).
ALIGN = 64
