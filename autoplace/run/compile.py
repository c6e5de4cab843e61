"""Multi-device build of an annotated module, and a callable that runs it on numpy arrays."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import tvm

from autoplace.annotate import annotate_lifted, vm_devices
from autoplace.backend import call_threads, calls_at, lowering_pipeline, own_pool, to_numpy
from autoplace.backend.tensors import InputSlot
from autoplace.devices import torch_threads
from autoplace.plan import Plan

if TYPE_CHECKING:
    from autoplace.backend.tuned import KernelRecords


def build(annotated: tvm.IRModule, plan: Plan, records: KernelRecords | None = None,
          counts: dict[str, int] | None = None):
    """Compile an annotated module for every device the plan uses; returns a VM executable.
    Kernels that ``records`` has get their tuned schedules; ``counts`` gets how many did."""
    used = vm_devices(plan)[0]
    pipeline = lowering_pipeline(gpu=any(d.is_gpu for d in used), multi_device=len(used) > 1,
                                 records=records, counts=counts)
    return tvm.compile(annotated, target=None, relax_pipeline=pipeline)


@dataclass(frozen=True, eq=False)
class CompiledModel:
    """A built plan: call it with numpy arrays (the function's parameters, in order).

    ``mod`` is the built module: the annotated one with constants lifted to trailing parameters,
    which are uploaded once to their devices and passed on every call. ``kernels`` says how many
    of its kernels were built from tuning records (``"tuned"``) and how many kept TVM's default
    schedule (``"default"``).
    """

    plan: Plan
    mod: Any
    executable: Any
    lifted: tuple = ()
    func_name: str = "main"
    kernels: dict = field(default_factory=dict)
    #: What ``OptimizeResult.compile()`` timed before it chose this build
    #: (:class:`autoplace.run.trial.Trial`), or None.
    trial: ClassVar[Any] = None

    def __post_init__(self):
        from tvm import relax

        devices = [d.tvm_device() for d in vm_devices(self.plan)[0]]
        vdevs = list(self.mod.global_infos["vdevice"])
        params = self.mod[self.func_name].params[: len(self.mod[self.func_name].params)
                                                  - len(self.lifted)]
        input_devices = [devices[_vdevice_position(p.ty.vdevice, vdevs)] for p in params]
        consts = [tvm.runtime.tensor(value.numpy(), devices[k]) for value, k in self.lifted]
        vm = relax.VirtualMachine(self.executable, devices)
        object.__setattr__(self, "_vm", vm)
        object.__setattr__(self, "_fn", vm[self.func_name])  # looked up once, not on every call
        object.__setattr__(self, "_input_devices", input_devices)
        object.__setattr__(self, "_slots", [InputSlot(d) for d in input_devices])
        object.__setattr__(self, "_consts", consts)
        object.__setattr__(self, "_calls", pytorch_call_threads(self.plan))

    @property
    def num_inputs(self) -> int:
        return len(self._input_devices)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """The outputs of one call, on the calling thread; its TVM pool is set up as the plan's
        costs were measured (:func:`autoplace.backend.own_pool`: TVM's default count, or the
        plan's ``threads``; nothing is done when it already is), and its PyTorch calls run at
        :func:`autoplace.devices.torch_threads` of the devices the plan uses (when the model was
        built): as they were priced, or on more threads where the plan was priced with an ONNX
        Runtime device it then put nothing on. Each input is copied into a
        tensor the model keeps for it, so calls from several threads at once are not allowed
        (nor does TVM's VM allow them)."""
        if len(inputs) != self.num_inputs:
            names = [p.name for p in self.mod[self.func_name].params[: self.num_inputs]]
            raise TypeError(f"expected {self.num_inputs} inputs ({', '.join(names)}), "
                            f"got {len(inputs)}")
        args = [slot.fill(x) for slot, x in zip(self._slots, inputs)]
        return [to_numpy(t) for t in self.call_tensors(*args)]

    @property
    def input_devices(self) -> tuple:
        """The TVM device each input is expected on (:meth:`call_tensors`)."""
        return tuple(self._input_devices)

    def call_tensors(self, *args: tvm.runtime.Tensor) -> list[tvm.runtime.Tensor]:
        """One call on TVM tensors already on their :attr:`input_devices`: nothing is copied in
        or out; the outputs are the VM's own tensors, on the devices the plan left them."""
        return call_vm(self._fn, args, self._consts, self.plan.threads, self._calls)

    @functools.cached_property
    def runtime_inputs(self) -> tuple[bool, ...]:
        """Per input: whether only other runtimes' calls read it (ONNX Runtime segments,
        PyTorch calls), which take a tensor at any alignment; False where a TVM kernel or the
        VM itself does (TVM's kernels assume 64-byte aligned inputs). Read from the annotated
        function the first time it is asked for (a module asks; a build called on numpy
        arrays copies every input)."""
        return runtime_only(self.mod[self.func_name], self.num_inputs)

    def close(self) -> None:
        """Nothing to stop (a :class:`~autoplace.run.ConcurrentModel` has workers): here so
        that whatever ``res.compile()`` returns can be closed, or used in a ``with``."""

    def __enter__(self) -> CompiledModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _vdevice_position(vdev, vdevs) -> int:
    # VDevice.same_as recurses forever in TVM 0.27: compare (target kind, id) instead.
    if vdev is None:
        return 0
    key = (vdev.target.kind.name, int(vdev.vdevice_id))
    for k, v in enumerate(vdevs):
        if (v.target.kind.name, int(v.vdevice_id)) == key:
            return k
    raise ValueError(f"input on vdevice {key} that the module does not list")


def flat_tensors(result) -> list:
    """The tensors of a VM result (a tensor, or nested tuples of them), in order."""
    if not isinstance(result, _NESTED):
        return [result]
    out = []
    for item in result:  # a tuple of tensors, the most common, without a call per tensor
        if isinstance(item, _NESTED):
            out.extend(flat_tensors(item))
        else:
            out.append(item)
    return out


#: What a VM result nests its tensors in.
_NESTED = (tvm.ir.Array, tuple, list)


def call_vm(fn, args, consts, threads: int | None, calls: int | None) -> list:
    """The flat outputs of one call of VM function ``fn`` on ``args`` and ``consts``, its TVM
    pool set up for ``threads`` (:func:`~autoplace.backend.own_pool`), its PyTorch calls at
    ``calls`` threads (:func:`~autoplace.backend.calls_at`; None: it makes none,
    :func:`pytorch_call_threads`; nothing to set where they already are: a call of a small
    model pays for each step it takes)."""
    own_pool(threads)
    if calls is None or call_threads() == calls:
        return flat_tensors(fn(*args, *consts))
    with calls_at(calls):
        return flat_tensors(fn(*args, *consts))


def pytorch_call_threads(plan: Plan) -> int | None:
    """The PyTorch threads a build of ``plan`` makes its PyTorch calls at
    (:func:`~autoplace.devices.torch_threads`), or None where it makes none (only a torch
    device runs them): then a call sets nothing for them."""
    used = plan.used_devices()
    return torch_threads(used) if any(d.runtime == "torch" for d in used) else None


def runtime_only(fn, inputs: int) -> tuple[bool, ...]:
    """Per one of the first ``inputs`` parameters of Relax function ``fn``: whether its every
    use is as an argument of a call into a function another runtime registered (an ONNX Runtime
    segment's, a PyTorch call's: ``R.call_pure_packed`` of a name under their prefixes)."""
    from tvm import relax

    from autoplace.backend import ort_segments, torch_bridge

    params = list(fn.params[:inputs])
    other = set()  # the parameters something else reads
    packed = tvm.ir.Op.get("relax.call_pure_packed")
    runtimes = (ort_segments.PREFIX, torch_bridge.PREFIX)

    def read(expr) -> None:
        other.update(k for k, p in enumerate(params)
                     if any(v.same_as(p) for v in relax.analysis.free_vars(expr)))

    body = fn.body
    for block in body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and value.op.same_as(packed) \
                    and isinstance(value.args[0], relax.ExternFunc) \
                    and str(value.args[0].global_symbol).startswith(runtimes):
                for arg in value.args[1:]:
                    if not isinstance(arg, relax.Var):
                        read(arg)
            else:
                read(value)
    read(body.body)
    return tuple(k not in other for k in range(len(params)))


def compile(mod: tvm.IRModule, plan: Plan, func_name: str = "main", *,
            records: KernelRecords | None = None) -> CompiledModel:
    """Annotate ``mod`` with ``plan``, build it for the plan's devices, and return a callable.
    Kernels that ``records`` has (:func:`autoplace.tuning.open_records`) are built tuned. A plan
    with ``threads`` runs on the calling thread with that many TVM threads over every core.

    >>> run = autoplace.compile(mod, plan)     # doctest: +SKIP
    >>> outs = run(x)                           # doctest: +SKIP
    >>> run.kernels                             # doctest: +SKIP
    {'tuned': 0, 'default': 7}
    """
    # TVM's VM loads constants onto its first device: one CPU device keeps them in the build
    # (passing them on every call costs each call), others get them lifted to parameters.
    used = vm_devices(plan)[0]
    one_cpu = len(used) == 1 and not used[0].is_gpu
    annotated, lifted = annotate_lifted(mod, plan, func_name, lift_constants=not one_cpu)
    counts: dict[str, int] = {}
    executable = build(annotated, plan, records, counts)
    return CompiledModel(plan, annotated, executable, tuple(lifted), func_name,
                         {"tuned": counts.get("tuned", 0), "default": counts.get("default", 0)})
