"""Multi-device build of an annotated module, and a callable that runs it on numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.annotate import annotate_lifted
from autoplace.plan import Plan

if TYPE_CHECKING:
    import tvm


def lowering_pipeline(*, gpu: bool, multi_device: bool) -> tvm.transform.Pass:
    """TVM's CPU default pipeline (with fusion), made safe for several devices.

    TVM 0.27's ``StaticPlanBlockMemory`` pools buffers by (scope, dtype) only and hands a device-0
    buffer to a device-1 kernel ("Mismatched ...device_id" at run time), so it is left out when
    more than one device is used. Each kernel of an annotated module is tagged with its device's
    target; GPU kernels get the dlight default schedules that TVM's own CUDA pipeline applies.
    """
    import tvm
    from tvm import relax

    t = relax.transform
    passes = [
        t.RealizeVDevice(),
        relax.backend.DispatchSampling(), relax.backend.DispatchSortScan(),
        _legalize_keeping_vdevices(), t.AnnotateTIROpPattern(), t.FoldConstant(), t.FuseOps(), t.FuseTIR(),
    ]
    passes.append(_attach_targets())
    if gpu:
        from tvm.s_tir import dlight as dl

        passes.append(dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                              dl.gpu.GeneralReduction(), dl.gpu.Fallback()))
    passes += [t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(),
               t.CallTIRRewrite()]
    if not multi_device:
        passes.append(t.StaticPlanBlockMemory())
    passes += [t.LowerAllocTensor(), t.KillAfterLastUse(), t.LowerRuntimeBuiltin(),
               t.ComputePrimValue(), t.VMShapeLower(), t.AttachGlobalSymbol()]
    return tvm.transform.Sequential(passes, name="autoplace_lowering")


def build_single(mod: tvm.IRModule, target, *, gpu: bool):
    """Compile ``mod`` for one device with the lowering every autoplace build uses."""
    import tvm

    return tvm.compile(mod, target=target,
                       relax_pipeline=lowering_pipeline(gpu=gpu, multi_device=False))


def _legalize_keeping_vdevices():
    """``LegalizeOps``, then give every new ``call_tir`` the vdevice its binding had before.

    TVM 0.27's legalization of some ops (conv2d among them) emits a ``call_tir`` whose output
    type, and so its bound variable, has no vdevice: its output buffer is then allocated on the
    first device whatever the plan said ("Mismatched conv2d_nchw.device_id" at run time).
    Bindings are matched by variable name; ambiguous names are left alone (and fail loudly).
    """
    import tvm
    from tvm import relax

    def bindings(mod):
        for func in mod.functions.values():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                for block in func.body.blocks:
                    yield from block.bindings

    def has_vdevice(ty):
        if isinstance(ty, relax.TupleType):
            return len(ty.fields) > 0 and all(has_vdevice(f) for f in ty.fields)
        return isinstance(ty, relax.TensorType) and ty.vdevice is not None

    def fix(binding, before):
        value, ty = binding.value, before.get(binding.var.name)
        if (ty is not None and isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name.startswith("relax.call_tir") and len(value.ty_args) == 1
                and not has_vdevice(value.ty_args[0])):
            return relax.VarBinding(binding.var,
                                    relax.Call(value.op, value.args, value.attrs, [ty]))
        return binding

    @tvm.transform.module_pass(opt_level=0, name="LegalizeOpsKeepingVDevices")
    def _pass(mod, _ctx):
        before, seen = {}, set()
        for b in bindings(mod):
            name = b.var.name
            before[name] = None if name in seen else b.var.ty
            seen.add(name)
        before = {k: v for k, v in before.items() if v is not None and has_vdevice(v)}
        mod = relax.transform.LegalizeOps()(mod)
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            blocks = [type(b)([fix(x, before) for x in b.bindings]) for b in func.body.blocks]
            mod[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                     func.ret_ty, func.is_pure, func.attrs)
        return relax.transform.Normalize()(mod)

    return _pass


def _attach_targets():
    """Give every kernel the target of the device its ``call_tir`` output lives on.

    After fusion most kernels of an annotated module carry no ``target`` attribute, and a build
    with ``target=None`` binds those to the host (llvm), so a kernel placed on a GPU would be
    compiled for the CPU. A kernel called from several device targets gets one copy per target.
    Modules without virtual devices are left as they are.
    """
    import tvm
    from tvm import relax

    def out_vdevice(ty):
        if isinstance(ty, relax.TupleType):
            return out_vdevice(ty.fields[0]) if len(ty.fields) else None
        return ty.vdevice if isinstance(ty, relax.TensorType) else None

    @tvm.transform.module_pass(opt_level=0, name="AttachTargets")
    def _pass(mod, _ctx):
        original = dict(mod.functions.items())
        bb = relax.BlockBuilder(mod)
        kernels: dict[tuple[str, str], tvm.ir.GlobalVar] = {}
        tagged: set[str] = set()

        def kernel_for(gv, target):
            key = (gv.name_hint, str(target))
            if key not in kernels:
                func = original[gv].with_attr("target", target)
                if gv.name_hint in tagged:
                    kernels[key] = bb.add_func(func, f"{gv.name_hint}_{target.kind.name}")
                else:
                    bb.update_func(gv, func)
                    tagged.add(gv.name_hint)
                    kernels[key] = gv
            return kernels[key]

        def rewrite(b):
            v = b.value
            if (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
                    and v.op.name.startswith("relax.call_tir")
                    and isinstance(v.args[0], tvm.ir.GlobalVar)
                    and (vdev := out_vdevice(v.ty_args[0])) is not None):
                call = relax.Call(v.op, [kernel_for(v.args[0], vdev.target), *v.args[1:]],
                                  v.attrs, v.ty_args)
                return relax.VarBinding(b.var, bb.normalize(call))
            return b

        for gv, func in original.items():
            if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
                blocks = [type(b)([rewrite(x) for x in b.bindings]) for b in func.body.blocks]
                bb.update_func(gv, relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                                  func.ret_ty, func.is_pure, func.attrs))
        return bb.get()

    return _pass


def build(annotated: tvm.IRModule, plan: Plan):
    """Compile an annotated module for every device the plan uses; returns a VM executable."""
    import tvm

    used = plan.used_devices()
    pipeline = lowering_pipeline(gpu=any(d.is_gpu for d in used), multi_device=len(used) > 1)
    return tvm.compile(annotated, target=None, relax_pipeline=pipeline)


@dataclass(frozen=True, eq=False)
class CompiledModel:
    """A built plan: call it with numpy arrays (the function's parameters, in order).

    ``mod`` is the built module: the annotated one with constants lifted to trailing parameters,
    which are uploaded once to their devices and passed on every call.
    """

    plan: Plan
    mod: Any
    executable: Any
    lifted: tuple = ()
    func_name: str = "main"

    def __post_init__(self):
        import tvm
        from tvm import relax

        devices = [d.tvm_device() for d in self.plan.used_devices()]
        vdevs = list(self.mod.global_infos["vdevice"])
        params = self.mod[self.func_name].params[: len(self.mod[self.func_name].params)
                                                  - len(self.lifted)]
        input_devices = [devices[_vdevice_position(p.ty.vdevice, vdevs)] for p in params]
        consts = [tvm.runtime.tensor(value.numpy(), devices[k]) for value, k in self.lifted]
        object.__setattr__(self, "_vm", relax.VirtualMachine(self.executable, devices))
        object.__setattr__(self, "_input_devices", input_devices)
        object.__setattr__(self, "_consts", consts)

    @property
    def num_inputs(self) -> int:
        return len(self._input_devices)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        import tvm

        if len(inputs) != self.num_inputs:
            names = [p.name for p in self.mod[self.func_name].params[: self.num_inputs]]
            raise TypeError(f"expected {self.num_inputs} inputs ({', '.join(names)}), "
                            f"got {len(inputs)}")
        args = [to_tvm(x, dev) for x, dev in zip(inputs, self._input_devices)]
        return _flatten(self._vm[self.func_name](*args, *self._consts))


def _vdevice_position(vdev, vdevs) -> int:
    # VDevice.same_as recurses forever in TVM 0.27: compare (target kind, id) instead.
    if vdev is None:
        return 0
    key = (vdev.target.kind.name, int(vdev.vdevice_id))
    for k, v in enumerate(vdevs):
        if (v.target.kind.name, int(v.vdevice_id)) == key:
            return k
    raise ValueError(f"input on vdevice {key} that the module does not list")


def _flatten(result) -> list[np.ndarray]:
    if hasattr(result, "numpy"):
        return [to_numpy(result)]
    return [a for item in result for a in _flatten(item)]


def to_tvm(x, dev: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """A copy of the array ``x`` as a TVM tensor on ``dev``.

    On ``cpu(0)`` numpy copies ``x`` into a 64-byte-aligned buffer (the alignment TVM's kernels
    assume) that TVM adopts through DLPack: about 5 us for a small array where
    ``tvm.runtime.tensor`` takes about 40 us (measured on the 2-core development machine).
    """
    import tvm

    x = np.asarray(x)
    if dev != tvm.cpu(0) or x.size == 0:  # numpy gives an empty array no aligned pointer
        return tvm.runtime.tensor(np.ascontiguousarray(x), dev)
    buf = np.empty(x.nbytes + _ALIGN, dtype=np.uint8)
    start = -buf.ctypes.data % _ALIGN
    out = buf[start:start + x.nbytes].view(x.dtype).reshape(x.shape)
    np.copyto(out, x)
    return tvm.runtime.from_dlpack(out)


def to_numpy(t: tvm.runtime.Tensor) -> np.ndarray:
    """A numpy copy of the TVM tensor ``t`` (from a CPU tensor through DLPack, about 15 us
    less than ``t.numpy()``)."""
    import tvm

    if t.device.dlpack_device_type() != tvm.cpu().dlpack_device_type():
        return t.numpy()
    return np.from_dlpack(t).copy()


_ALIGN = 64  # bytes; tvm.runtime.from_dlpack refuses less


def compile(mod: tvm.IRModule, plan: Plan, func_name: str = "main") -> CompiledModel:
    """Annotate ``mod`` with ``plan``, build it for the plan's devices, and return a callable.

    >>> run = autoplace.compile(mod, plan)     # doctest: +SKIP
    >>> outs = run(x)                           # list of numpy arrays
    """
    annotated, lifted = annotate_lifted(mod, plan, func_name)
    return CompiledModel(plan, annotated, build(annotated, plan), tuple(lifted), func_name)
