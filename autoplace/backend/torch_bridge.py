"""PyTorch ops called from a Relax VM: the functions a module's ``autoplace.torch_op.<id>`` calls.

An op the Relax importer lacks becomes a call into PyTorch (:func:`autoplace.frontends.from_torch`),
and so does a Relax op placed on a torch device
(:func:`autoplace.backend.torch_equivalents.equivalent`):
``R.call_pure_packed("autoplace.torch_op.<id>", args..., R.Tensor(shape, dtype))`` (:func:`relax_call`),
the output shape static, or only its rank where it depends on the data (``nonzero``, ``unique``).
The id names a :class:`TorchOp`, and a function registered under that name with
``tvm.register_global_func`` wraps its inputs with ``torch.from_dlpack`` (no copy), runs the ATen
op with its non-tensor arguments and hands its new result back through DLPack (no copy either:
writing into a destination the VM allocated, ``call_dps_packed``'s way, cost a copy of every
output, several times the op on a large one).

The functions live in this process only: a library built from such a module calls them by name,
so a build saved and loaded in another process needs the same ops registered again (importing the
same model with :func:`autoplace.frontends.from_torch` does; :func:`missing` says which are not).
The registry below is the one piece of module-level state in autoplace: the VM finds a packed
function by its global name, so the name must stay bound while any build may call it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

#: What the torch device's calls run, in its profiles' fingerprint: a new number where a call
#: runs another kernel for the same op (2: conv and matmul weights packed once, views copied).
CALLS = 2

#: Prefix of the global function names of PyTorch ops.
PREFIX = "autoplace.torch_op."

# id -> TorchOp. Kept for the life of the process: builds call the functions by name.
_REGISTRY: dict[str, TorchOp] = {}


@dataclass(frozen=True)
class Slot:
    """Where the ``index``-th tensor argument of the call goes among the op's arguments."""

    index: int


@dataclass(frozen=True)
class TorchOp:
    """One ATen call: ``target(*args, **kwargs)`` with :class:`Slot` s for the tensors.

    ``outputs`` are ``(shape, dtype)`` per output at the example input (where ``dynamic``, the
    shape of one example only: the op returns a tensor of the shape the data gives).
    ``node`` is the exported program's node name, for messages.
    """

    target: Any = field(compare=False)
    name: str  # "aten.nonzero.default"
    args: tuple
    kwargs: tuple  # ((name, value), ...)
    outputs: tuple  # ((shape, dtype), ...)
    dynamic: bool
    node: str
    tuple_output: bool = False  # the op returns several tensors (a Relax tuple)
    why: str = field(default="", compare=False)  # why it runs in PyTorch, in words

    @property
    def aten(self) -> str:
        """The op's ATen name without namespace and overload: ``"nonzero"``."""
        parts = self.name.split(".")
        return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]

    @property
    def signature(self) -> str:
        """What the call computes, values of tensors aside: the same for identical calls."""
        return f"{self.name}({_show(self.args)}, {_show(self.kwargs)})"

    @property
    def id(self) -> str:
        text = f"{self.node}|{self.signature}|{self.outputs}|{self.dynamic}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    @property
    def global_name(self) -> str:
        return PREFIX + self.id

    @functools.cached_property
    def _bound(self) -> tuple | None:
        """Where the tensors go when every slot is a positional argument of its own (the common
        case): ``(positions, arguments, keyword arguments)``, positions being (argument, slot
        index) pairs; else None."""
        def nested(v):
            return isinstance(v, Slot) or (isinstance(v, (list, tuple)) and any(map(nested, v)))

        if any(nested(v) for _, v in self.kwargs) or any(
                isinstance(v, (list, tuple)) and nested(v) for v in self.args):
            return None
        positions = tuple((i, v.index) for i, v in enumerate(self.args) if isinstance(v, Slot))
        return positions, list(self.args), dict(self.kwargs)

    def call(self, tensors: list) -> Any:
        """Run the op on torch tensors (in the order of the slots)."""
        bound = self._bound
        if bound is not None:  # a call from the VM: no more Python than it needs
            positions, args, kwargs = bound
            args = args.copy()
            for i, k in positions:
                args[i] = tensors[k]
            return self.target(*args, **kwargs)

        def fill(v):
            if isinstance(v, Slot):
                return tensors[v.index]
            if isinstance(v, (list, tuple)):
                return type(v)(fill(x) for x in v)
            return v

        return self.target(*fill(self.args), **{k: fill(v) for k, v in self.kwargs})


class TorchOpError(RuntimeError):
    """A PyTorch op called from a built module raised; the message names the op and its node."""


def _show(value) -> str:
    if isinstance(value, Slot):
        return f"%{value.index}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value)


def register(op: TorchOp) -> str:
    """Register ``op``'s function under its global name (once per id) and return the name."""
    import tvm

    if op.id not in _REGISTRY:
        tvm.register_global_func(op.global_name, _function(op), override=True)
        _REGISTRY[op.id] = op
    return op.global_name


def relax_call(name: str, args, ty):
    """The Relax call of registered op ``name`` on tensors ``args`` giving ``ty`` (a tensor or
    tuple type): ``R.call_pure_packed``, which the VM runs as one call whose results it keeps."""
    from tvm import relax

    return relax.op.call_pure_packed(name, *args, ty_args=ty)


def lookup(name: str) -> TorchOp | None:
    """The op a global function name calls, or None where it is no registered PyTorch op."""
    if not name.startswith(PREFIX):
        return None
    return _REGISTRY.get(name[len(PREFIX):])


def called(mod) -> list[str]:
    """The global names of the PyTorch ops module ``mod`` calls, sorted."""
    return sorted(set(re.findall(re.escape(PREFIX) + r"[0-9a-f]{16}", str(mod))))


def registered() -> list[TorchOp]:
    """The ops registered in this process, in the order of their registration."""
    return list(_REGISTRY.values())


def missing(names) -> list[str]:
    """Those of ``names`` (global function names) that call PyTorch ops not registered here."""
    return [n for n in names if n.startswith(PREFIX) and lookup(n) is None]


@contextlib.contextmanager
def at_call_threads():
    """Within: PyTorch runs on the threads a build's calls on the calling thread run at
    (:func:`autoplace.backend.call_threads`: the plan's, one on a share of the cores, else
    PyTorch's own count), its count restored after (0.1 us each way where it changes)."""
    import torch

    from autoplace.backend.threads import call_threads

    want, before = call_threads(), torch.get_num_threads()
    change = want is not None and want != before
    if change:
        torch.set_num_threads(want)
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(before)


def _function(op: TorchOp):
    """The packed function: it returns the op's results as new tensors, shared with PyTorch
    through DLPack (no copy; a non-contiguous result is made contiguous, and a view of an input
    copied, since the VM takes a call's results as new tensors and may write another tensor into
    an input's memory once the input is dead, under a view it does not know of). Where the
    output shape is static, a result of another shape or dtype is an error naming the op, never
    a tensor the build would misread. The op runs on the PyTorch threads of
    :func:`at_call_threads` without autograd, both set and restored inline: every microsecond
    here is paid on every call (the hand-off the cost model charges)."""
    import torch
    import tvm

    from autoplace.backend.threads import call_threads

    expected = None if op.dynamic else [(tuple(s), getattr(torch, d)) for s, d in op.outputs]
    threads_now, set_threads = torch.get_num_threads, torch.set_num_threads
    grad_now, set_grad = torch.is_grad_enabled, torch.set_grad_enabled
    from_dlpack, to_tvm = torch.from_dlpack, tvm.runtime.from_dlpack

    def call(*args):
        threads, want, grad = threads_now(), call_threads(), grad_now()
        change = want is not None and want != threads
        if change:
            set_threads(want)
        if grad:
            set_grad(False)
        try:
            # the capsule itself: torch's protocol around a producer (device, stream) costs
            # more than the conversion, and TVM's tensors take no stream
            tensors = [from_dlpack(t.__dlpack__()) for t in args]
            result = op.call(tensors)
        except Exception as e:  # noqa: BLE001 - any error of the op, named for the caller
            raise TorchOpError(f"PyTorch op {op.name} (node {op.node!r}, {op.global_name}) "
                               f"raised {type(e).__name__}: {e}") from e
        finally:
            if change:
                set_threads(threads)
            if grad:
                set_grad(True)
        results = result if isinstance(result, (tuple, list)) else (result,)
        if expected is not None and (len(results) != len(expected) or any(
                r.shape != s or r.dtype != d for r, (s, d) in zip(results, expected))):
            raise TorchOpError(
                f"PyTorch op {op.name} (node {op.node!r}) gave "
                f"{[(tuple(r.shape), str(r.dtype)) for r in results]}, the build expects "
                f"{[(s, str(d)) for s, d in expected]}")
        held = {t.untyped_storage().data_ptr() for t in tensors}  # a view of one: a copy
        out = [to_tvm((r.clone() if r.untyped_storage().data_ptr() in held else r).contiguous())
               for r in results]
        return out[0] if not op.tuple_output else tvm.runtime.convert(out)

    return call
