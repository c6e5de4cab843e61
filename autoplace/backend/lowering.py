"""The lowering every autoplace build uses (one device or several), and a one-device build."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tvm

    from autoplace.backend.tuned import KernelRecords


def lowering_pipeline(*, gpu: bool, multi_device: bool, records: KernelRecords | None = None,
                      counts: dict[str, int] | None = None) -> tvm.transform.Pass:
    """TVM's CPU default pipeline (with fusion), made safe for several devices.

    TVM 0.27's ``StaticPlanBlockMemory`` pools buffers by (scope, dtype) only and hands a device-0
    buffer to a device-1 kernel ("Mismatched ...device_id" at run time), so it is left out when
    more than one device is used. Each kernel of an annotated module is tagged with its device's
    target. With ``records``, each kernel gets the schedule of its best tuning record for that
    target (:mod:`autoplace.backend.tuned`); ``counts`` gets how many kernels were tuned and how
    many kept the default schedule. GPU kernels without a record get the dlight default
    schedules that TVM's own CUDA pipeline applies.
    """
    import tvm
    from tvm import relax

    t = relax.transform
    passes = [
        t.RealizeVDevice(),
        relax.backend.DispatchSampling(), relax.backend.DispatchSortScan(),
        _legalize_keeping_vdevices(), t.AnnotateTIROpPattern(), t.FoldConstant(),
    ]
    if multi_device:
        passes.append(_folded_constants_to_their_devices())
    passes += [t.FuseOps(), t.FuseTIR()]
    passes.append(_attach_targets())
    if records or counts is not None:
        from autoplace.backend.tuned import KernelRecords, apply_records

        passes.append(apply_records(records or KernelRecords({}),
                                    counts if counts is not None else {}))
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


def build_single(mod: tvm.IRModule, target, *, gpu: bool, records: KernelRecords | None = None,
                 counts: dict[str, int] | None = None):
    """Compile ``mod`` for one device with the lowering every autoplace build uses (tuned kernels
    from ``records`` where it has them)."""
    import tvm

    return tvm.compile(mod, target=target,
                       relax_pipeline=lowering_pipeline(gpu=gpu, multi_device=False,
                                                        records=records, counts=counts))


def fused_kernels(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """``mod`` lowered up to the point where a build schedules its kernels: legalized, fused
    (``FuseOps``/``FuseTIR``) and each kernel of an annotated module tagged with its target.
    The PrimFuncs of the result are the kernels the build compiles; ``target`` is the one a
    module without virtual devices is built for."""
    import tvm

    passes = list(lowering_pipeline(gpu=False, multi_device=True).passes)
    names = [p.info.name for p in passes]
    with tvm.target.Target(target) if target is not None else contextlib.nullcontext():
        return tvm.transform.Sequential(passes[:names.index("AttachTargets") + 1])(mod)


def count_kernels(mod: tvm.IRModule, records: KernelRecords | None) -> dict[str, int]:
    """How many kernels of ``mod``'s build ``records`` would give a tuned schedule
    (``"tuned"``) and how many would keep the default one (``"default"``)."""
    from autoplace.backend.tuned import KernelRecords, apply_records

    counts: dict[str, int] = {}
    apply_records(records or KernelRecords({}), counts)(fused_kernels(mod))
    return {"tuned": counts.get("tuned", 0), "default": counts.get("default", 0)}


def legalize(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """``mod``'s Relax ops lowered to TIR as an autoplace build lowers them for ``target`` (a
    target or its string; ``None``: as TVM's ``LegalizeOps`` does): :func:`legalize_map` on top
    of TVM's default legalization."""
    import tvm
    from tvm import relax

    with tvm.target.Target(target) if target is not None else contextlib.nullcontext():
        return relax.transform.LegalizeOps(legalize_map())(mod)


def legalize_map() -> dict:
    """Where an autoplace build lowers an op differently from TVM's ``LegalizeOps``: a map for
    its ``customize_legalize_map``.

    On a CPU (an ``llvm`` target), ``erf`` and GELU use ``topi.fast_erf``, the rational
    approximation TVM's ``FastMathTransform`` uses: plain arithmetic that LLVM vectorizes, where
    TVM's exact ``erf`` is a scalar libm call per element (about 30x faster on a GELU, and
    closer to a float64 GELU than PyTorch's float32 one: ``docs/results.md``, "GELU's erf"). An
    op's target is its output's virtual device, else the target being built for; any other
    target keeps TVM's lowering. On every target, an integer ``clip``'s bounds are first brought
    into its dtype's range (:func:`_integer_clip`).
    """
    return {"relax.nn.gelu": _on_cpu("relax.nn.gelu", _fast_gelu),
            "relax.erf": _on_cpu("relax.erf", _fast_erf), "relax.clip": _integer_clip}


def _integer_clip(bb, call):
    """TVM's ``clip``, an integer tensor's float bounds first brought into its dtype's range:
    PyTorch's ``clamp(min=0)`` imports with ``inf`` as the upper bound, which TVM's lowering
    casts to the integer dtype and fails on."""
    import math

    import tvm
    from tvm import relax

    dtype = str(getattr(call.ty, "dtype", ""))
    if dtype.startswith(("int", "uint")):
        low, high = tvm.tirx.min_value(dtype), tvm.tirx.max_value(dtype)
        bounds = []
        for arg in call.args[1:]:
            if isinstance(arg, tvm.tirx.FloatImm) and (
                    math.isinf(arg.value) or not low.value <= arg.value <= high.value):
                arg = low if arg.value < 0 else high
            bounds.append(arg)
        call = bb.normalize(relax.op.clip(call.args[0], *bounds))
    return tvm.ir.Op.get("relax.clip").get_attr("FLegalize")(bb, call)


def _on_cpu(op_name: str, cpu_legalize):
    """A legalization of ``op_name`` that is ``cpu_legalize`` for a float32 op on a CPU target,
    TVM's own otherwise."""
    import tvm

    def legalize(bb, call):
        ty = call.ty
        vdevice = getattr(ty, "vdevice", None)
        target = (vdevice.target if vdevice is not None
                  else tvm.target.Target.current(allow_none=True))
        if (target is not None and target.kind.name == "llvm"
                and getattr(ty, "dtype", None) == "float32"):
            return cpu_legalize(bb, call)
        return tvm.ir.Op.get(op_name).get_attr("FLegalize")(bb, call)

    return legalize


def _fast_gelu(bb, call):
    from tvm import topi

    def gelu(x):
        return x * (topi.fast_erf(x * 0.5 ** 0.5) * 0.5 + 0.5)

    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def _fast_erf(bb, call):
    from tvm import topi

    return bb.call_te(topi.fast_erf, call.args[0], primfunc_name_hint="erf")


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
        mod = relax.transform.LegalizeOps(legalize_map())(mod)
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            blocks = [type(b)([fix(x, before) for x in b.bindings]) for b in func.body.blocks]
            mod[gv] = relax.Function(func.params, relax.SeqExpr(blocks, func.body.body),
                                     func.ret_ty, func.is_pure, func.attrs)
        return relax.transform.Normalize()(mod)

    return _pass


def _folded_constants_to_their_devices():
    """Copy each constant that ``FoldConstant`` made to the device of the kernel that takes it.

    The VM loads every constant onto the first device; a build lifts the module's constants into
    parameters uploaded to their devices beforehand, but ops without tensor inputs (``arange``,
    ``zeros``, ``full``) and what they feed are folded into new constants during the build. A
    kernel on another device given one fails at run time ("Mismatched ...device_id"), so each
    such argument goes through a ``to_vdevice`` to the kernel's device.
    """
    import tvm
    import tvm_ffi
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    def vdevice_of(ty):
        if isinstance(ty, relax.TupleType):
            return vdevice_of(ty.fields[0]) if len(ty.fields) else None
        return ty.vdevice if isinstance(ty, relax.TensorType) else None

    @mutator
    class _Mover(PyExprMutator):
        def __init__(self, mod, first):
            super().__init__(mod)
            self.first = first

        def visit_call_(self, call):
            call = super().visit_call_(call)
            if not (isinstance(call.op, tvm.ir.Op) and call.op.name.startswith("relax.call_tir")
                    and isinstance(call.args[1], relax.Tuple)):
                return call
            dev = vdevice_of(call.ty_args[0]) if len(call.ty_args) == 1 else None
            fields = call.args[1].fields
            if dev is None or tvm_ffi.structural_equal(dev, self.first) or not any(
                    isinstance(f, tvm.ir.expr.Constant) for f in fields):
                return call
            moved = [self.builder_.emit(relax.op.to_vdevice(f, dev))
                     if isinstance(f, tvm.ir.expr.Constant) else f for f in fields]
            return relax.Call(call.op, [call.args[0], relax.Tuple(moved), *call.args[2:]],
                              call.attrs, call.ty_args)

    @tvm.transform.module_pass(opt_level=0, name="FoldedConstantsToTheirDevices")
    def _pass(mod, _ctx):
        vdevices = mod.global_infos.get("vdevice") if mod.global_infos else None
        if not vdevices or len(vdevices) < 2:
            return mod
        mover = _Mover(mod, vdevices[0])
        for gv, func in list(mod.functions.items()):
            if isinstance(func, relax.Function):
                mod[gv] = mover.visit_expr(func)
        return mod

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
