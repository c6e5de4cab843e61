"""Write a plan back into a Relax module as virtual-device annotations.

The result is in *realized* form: every parameter and binding carries its plan device in its type
(``R.Tensor(..., vdevice="llvm:1")``) and a ``R.to_vdevice`` copy sits exactly where a tensor
crosses devices, once per tensor and destination device. ``relax.transform.RealizeVDevice`` leaves
such a module unchanged. Hints alone (``R.hint_on_device``) are not enough: RealizeVDevice
propagates a parameter's device backwards through its first consumer and can move an op off the
device its hint named (seen with a weight shared by ops on two devices).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplace.devices import Device, runtime_threads
from autoplace.graph.opgraph import OpGraph, is_op_call, iter_bindings
from autoplace.plan import Plan

if TYPE_CHECKING:
    import tvm


def vm_devices(plan: Plan) -> tuple[list[Device], dict[str, int]]:
    """The devices the Relax VM runs on, in ``plan.devices`` order, and each used plan device's
    position among them. A TVM device is its own; a torch device (PyTorch's kernels, called from
    the VM) has none: its ops run on the host, their tensors on the plan's TVM device of the same
    memory (:attr:`~autoplace.devices.Device.memory`), so PyTorch and TVM share them without a
    copy: its first CPU device for ``Device.torch("cpu")`` (``cpu0`` when the plan uses none),
    its CUDA device of the same index for ``Device.torch("cuda", N)`` (``cudaN``, default
    target, when it uses none)."""
    used = plan.used_devices()
    vm = [d for d in used if d.runtime == "tvm"]
    pos = {d.name: k for k, d in enumerate(vm)}
    for d in used:
        if d.runtime == "tvm":
            continue
        host = next((k for k, t in enumerate(vm) if t.memory == d.memory), None)
        if host is None:
            base = "host" if d.memory[0] == 1 else f"cuda{d.index}"
            name = base if base not in pos else f"{base}-{d.name}"
            vm.append(Device.cpu(0, name=name) if d.memory[0] == 1
                      else Device.cuda(d.index, name=name))
            host = len(vm) - 1
            pos[name] = host
        pos[d.name] = host
    return vm, pos


def vdevices(plan: Plan) -> list:
    """One ``relax.VDevice`` per device the VM runs on (:func:`vm_devices`), in
    ``plan.devices`` order."""
    from tvm import relax

    used = vm_devices(plan)[0]
    seen = {}
    for d in used:
        key = (d.kind, d.index)
        if key in seen:
            raise ValueError(f"devices {seen[key]!r} and {d.name!r} are both {d.kind}:{d.index}; "
                             "give each placed device its own runtime index")
        seen[key] = d.name
    return [relax.VDevice(_target(d), d.index, "global") for d in used]


def _target(device):
    import tvm

    if device.is_gpu:
        return tvm.target.Target(device.target, host="llvm")
    return device.tvm_target()


def annotate(mod: tvm.IRModule, plan: Plan, func_name: str = "main") -> tvm.IRModule:
    """Return a new module with ``plan`` written into ``mod[func_name]`` (``mod`` is unchanged).

    Parameters and weights live on the device of their first consumer and are copied to the
    others; constants are placed, not copied, on the device of each consumer.
    """
    return annotate_lifted(mod, plan, func_name, lift_constants=False)[0]


def annotate_lifted(mod, plan: Plan, func_name: str = "main", *, lift_constants: bool = True):
    """Like :func:`annotate`, optionally turning each tensor constant into a trailing parameter.

    TVM 0.27's VM loads every constant onto the first device whatever its vdevice, so a build
    lifts constants to parameters that the caller uploads once to the right device. Returns
    ``(module, lifted)`` with ``lifted`` a list of ``(tvm tensor value, device position)``.
    """
    import tvm
    from tvm import ir, relax

    from autoplace.backend.torch_bridge import relax_call

    graph = OpGraph.from_relax(mod, func_name)
    plan.validate(graph)
    vdevs = vdevices(plan)
    vm, position = vm_devices(plan)
    used = [d.name for d in vm]
    dev_of_node = [position[a] for a in plan.assignment]
    runtime_of = {d.name: d.runtime for d in plan.devices}
    placed_on = [plan.device(a).torch_place if runtime_of[a] == "torch" else None
                 for a in plan.assignment]
    func = mod[func_name]
    calls = [(b.var, b.value) for b in iter_bindings(func) if is_op_call(b.value)]
    chains = _torch_chains(graph, plan, calls)  # anchor -> its chain, run as one call
    absorbed = {}  # a chain member run in its anchor's call -> the anchor's old var

    def with_vdevice(ty, k):
        if isinstance(ty, relax.TensorType):
            if ty.shape is None:  # a shape the data gives (a PyTorch call's): keep its rank
                return relax.TensorType(None, ty.dtype, vdevs[k], ndim=ty.ndim)
            return relax.TensorType(ty.shape, ty.dtype, vdevs[k])
        if isinstance(ty, relax.TupleType):
            return relax.TupleType([with_vdevice(f, k) for f in ty.fields])
        return ty

    # Parameters: on the device of their first consumer.
    new_of = {}  # old var -> new var
    loc = {}  # new var -> device position, for tensors with one device
    params = []
    for p, gin in zip(func.params, graph.inputs):
        k = dev_of_node[gin.consumers[0]] if gin.consumers else 0
        v = relax.Var(p.name, with_vdevice(p.ty, k))
        new_of[p], loc[v] = v, k
        params.append(v)

    lifted, lifted_vars = [], {}  # constants turned into parameters, when lift_constants
    copies = {}  # (new var, device) -> copied var
    consts = {}  # old var bound to a constant -> the constant
    tuples = {}  # old var bound to a tuple literal -> the tuple (its fields may differ in device)
    aliases = {}  # old var bound to another var -> that var
    blocks = []
    node_index = 0
    in_dataflow = False

    def placed(expr, k, bindings):
        """``expr`` as seen by an op on device ``k``: copied or re-placed when needed."""
        if isinstance(expr, relax.Var) and expr in consts:
            expr = consts[expr]
        while isinstance(expr, relax.Var) and expr in aliases:  # copy the tensor, not a name
            expr = aliases[expr]
        if isinstance(expr, relax.Var) and expr in tuples:  # placed field by field
            expr = tuples[expr]
        if _is_tensor_const(expr):
            if not lift_constants:
                return ir.expr.GenericConst(expr.value, with_vdevice(expr.ty, k))
            if (expr, k) not in lifted_vars:
                v = relax.Var(f"const{len(lifted)}_{used[k]}", with_vdevice(expr.ty, k))
                lifted_vars[(expr, k)] = v
                lifted.append((expr.value, k))
            return lifted_vars[(expr, k)]
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([placed(f, k, bindings) for f in expr.fields])
        if not isinstance(expr, relax.Var):
            return expr
        v = new_of[expr]
        src = loc.get(v)
        if src is None or src == k:
            return v
        if (v, k) not in copies:
            var_cls = relax.DataflowVar if in_dataflow else relax.Var
            c = var_cls(f"{v.name}_to_{used[k]}", with_vdevice(v.ty, k))
            bindings.append(relax.VarBinding(c, relax.op.to_vdevice(v, vdevs[k])))
            copies[(v, k)], loc[c] = c, k
        return copies[(v, k)]

    def fresh(var, ty):
        cls = relax.DataflowVar if isinstance(var, relax.DataflowVar) else relax.Var
        return cls(var.name, ty)

    span_at = _ort_spans(func, plan)  # binding position -> its ORT segment
    ort_threads = plan.threads or runtime_threads(plan.devices)
    position_now = -1
    binding_iter = iter_bindings(func)
    for block in func.body.blocks:
        out = []
        in_dataflow = isinstance(block, relax.DataflowBlock)
        for _ in block.bindings:
            b = next(binding_iter)
            var, value = b.var, b.value
            position_now += 1
            if position_now in span_at:  # computed by its ORT segment's call
                span = span_at[position_now]
                if is_op_call(value):
                    node_index += 1
                elif _is_tensor_const(value):
                    consts[var] = value
                elif isinstance(value, relax.Var) and value in consts:
                    consts[var] = consts[value]
                if position_now == span.first:
                    k = dev_of_node[span.nodes[0]]
                    args = [placed(v, k, out) for v in span.inputs]
                    types = [with_vdevice(v.ty, k) for v in span.outputs]
                    ort = plan.assignment[span.nodes[0]]
                    call = _ort_call(mod, span, func_name, args, types,
                                     dict(plan.ort_threads).get(ort, ort_threads),
                                     dict(plan.ort_levels).get(ort),
                                     fixed=ort in dict(plan.ort_threads))
                    if len(types) == 1:
                        nv = fresh(span.outputs[0], types[0])
                        out.append(relax.VarBinding(nv, call))
                        new_of[span.outputs[0]], loc[nv] = nv, k
                    else:
                        tv = (relax.DataflowVar if in_dataflow else relax.Var)(
                            f"ort{span.first}", relax.TupleType(types))
                        out.append(relax.VarBinding(tv, call))
                        for i, (ov, ty) in enumerate(zip(span.outputs, types)):
                            nv = fresh(ov, ty)
                            out.append(relax.VarBinding(nv, relax.TupleGetItem(tv, i)))
                            new_of[ov], loc[nv] = nv, k
                continue
            if is_op_call(value) and (folded := _folded(value, consts)) is not None:
                # An op of constants only (a weight's transpose): computed now, as the build's
                # FoldConstant would, not run on every call (a torch call can then hold it).
                node_index += 1
                consts[var] = folded
                continue
            if is_op_call(value):
                k = dev_of_node[node_index]
                node = graph.nodes[node_index]
                node_index += 1
                if node.index in absorbed:  # computed by its chain's call: the same tensor
                    if node.op_type == "nn.batch_norm":  # (data, mean, variance), as read
                        tuples[var] = relax.Tuple([absorbed[node.index], *value.args[3:5]])
                    else:
                        new_of[var] = new_of[absorbed[node.index]]
                    continue
                if runtime_of[plan.assignment[node.index]] == "torch" and not node.is_torch:
                    tensors = [consts.get(a, a) for a in value.args if _is_tensor(a)]
                    fused = (_fused_torch_op(node, tensors, chains[node.index], calls, consts,
                                             placed_on[node.index])
                             if node.index in chains else None)
                    if fused is not None:  # the chain's call, giving its last member's tensor
                        absorbed.update((m, var) for m in chains[node.index][1:])
                        call = relax_call(fused, [placed(tensors[0], k, out)],
                                          with_vdevice(var.ty, k))
                        nv = fresh(var, with_vdevice(var.ty, k))
                        loc[nv] = k
                        out.append(relax.VarBinding(nv, call))
                        new_of[var] = nv
                        continue
                    name, takes = _torch_op(node, tensors, placed_on[node.index])
                    # a constant the call holds is not placed (nor lifted) for TVM
                    args = [placed(a, k, out) for a in tensors[:takes]]
                    ty = with_vdevice(var.ty, k)
                    if node.op_type == "nn.batch_norm" and takes == 1:
                        # the call gives the data; the mean and variance are the constants
                        data = (relax.DataflowVar if in_dataflow else relax.Var)(
                            f"{var.name}_data", ty.fields[0])
                        out.append(relax.VarBinding(data, relax_call(name, args, ty.fields[0])))
                        call = relax.Tuple([data, placed(tensors[3], k, out),
                                            placed(tensors[4], k, out)])
                    else:
                        call = relax_call(name, args, ty)
                else:
                    args = [placed(a, k, out) for a in value.args]
                    ty_args = value.ty_args
                    if value.op.name in ("relax.call_tir", "relax.call_pure_packed"):
                        # its output type is given, not inferred
                        ty_args = [with_vdevice(t, k) for t in ty_args]
                    call = relax.Call(value.op, args, value.attrs, ty_args)
                nv = fresh(var, with_vdevice(var.ty, k))
                loc[nv] = k
            elif _is_tensor_const(value):
                consts[var] = value
                continue
            elif isinstance(value, relax.Var) and value in consts:
                consts[var] = consts[value]
                continue
            else:  # alias, tuple-get-item, tuple: stay with their source
                if isinstance(value, relax.Tuple):
                    tuples[var] = value
                if isinstance(value, relax.TupleGetItem) and value.tuple_value in tuples:
                    value = tuples[value.tuple_value].fields[value.index]  # the field itself
                if isinstance(value, relax.Var):
                    aliases[var] = value
                call = _remap(value, new_of)
                src = _source_device(value, new_of, loc)
                if isinstance(call, relax.Tuple):  # each field keeps its own device
                    nv = fresh(var, _type_of(call))
                else:
                    nv = fresh(var, var.ty if src is None else with_vdevice(var.ty, src))
                if src is not None:
                    loc[nv] = src
            out.append(relax.VarBinding(nv, call))
            new_of[var] = nv
        blocks.append(relax.DataflowBlock(out) if in_dataflow else relax.BindingBlock(out))

    ret = func.body.body
    ret = consts.get(ret, ret) if isinstance(ret, relax.Var) else ret
    ret = _remap(ret, new_of)
    params += list(lifted_vars.values())
    new_func = relax.Function(params, relax.SeqExpr(blocks, ret), _type_of(ret), func.is_pure,
                              func.attrs)
    new_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items()}, attrs=mod.attrs)
    new_mod[func_name] = new_func
    new_mod.update_global_info("vdevice", vdevs)
    return relax.transform.Normalize()(new_mod), lifted


def _ort_spans(func, plan: Plan) -> dict:
    """Binding position -> the segment (:class:`autoplace.graph.segments.Span`) holding it, for
    the runs of ops ``plan`` puts on ONNX Runtime devices."""
    on = [plan.device(a).runtime == "ort" for a in plan.assignment]
    if not any(on):
        return {}
    from autoplace.graph.segments import cut

    return {p: span for span in cut(func, on) for p in range(span.first, span.stop)}


def _ort_call(mod, span, func_name: str, args, types, threads: int = 1,
              level: str | None = None, fixed: bool = False):
    """The call of ``span`` as a registered ORT session on ``threads`` intra-op threads, at
    graph optimization ``level``; with no level, the level, and unless ``fixed`` the thread
    count (``threads`` or one), that run it fastest here."""
    from autoplace.backend.ort_profiling import fastest_variant
    from autoplace.backend.ort_segments import register, relax_call
    from autoplace.graph.segments import export

    segment = export(mod, span, func_name)
    if level is None:
        level, best, times = fastest_variant(segment, threads, runs=5)
        if fixed:  # the fastest level at the plan's threads
            level = min((lv for lv, t in times if t == threads), key=lambda lv: times[lv, threads])
        threads = threads if fixed else best
    return relax_call(register(segment, threads, level), args, types)


def _is_tensor(expr) -> bool:
    from tvm import relax

    return isinstance(getattr(expr, "ty", None), relax.TensorType)


def _torch_op(node, tensors, place: str) -> tuple[str, int]:
    """Op-graph node ``node`` (a Relax op, on ``tensors``, constants resolved) as a registered
    call of its PyTorch equivalent (:func:`autoplace.backend.torch_equivalents.equivalent`) on
    PyTorch device ``place`` (``"cpu"``, ``"cuda:0"``), holding the constants the torch device
    holds (:func:`~autoplace.backend.torch_calls.holding_constants`): its global name, and how
    many of the leading ``tensors`` it takes."""
    from autoplace.backend.torch_bridge import register
    from autoplace.backend.torch_calls import holding_constants
    from autoplace.backend.torch_equivalents import node_equivalent

    op = node_equivalent(node)
    if op is None or len(tensors) != len(node.inputs):
        raise ValueError(f"node {node.name!r} ({node.op_type}) is placed on PyTorch, which has "
                         "no equivalent for it here (its layout, padding or dtype): place it on "
                         "a TVM device")
    op, takes = holding_constants(
        op, node.op_type, len(tensors),
        lambda i: tensors[i].value.numpy() if _is_tensor_const(tensors[i]) else None,
        node.inputs[0].shape, place)
    return register(op), takes


def _torch_chains(graph, plan: Plan, calls) -> dict[int, tuple[int, ...]]:
    """The groups of ``plan`` (:attr:`~autoplace.plan.Plan.groups`: chains of a conv or
    linear, :func:`autoplace.graph.chains.fused_chains`) that it puts whole on one torch
    device, by anchor (``calls``: the function's op-call bindings, ``(var, call)`` in node
    order)."""
    out = {}
    for chain in plan.groups:
        where = {plan.assignment[i] for i in chain}
        if len(where) == 1 and plan.device(where.pop()).runtime == "torch" and all(
                calls[i][1].op.name.removeprefix("relax.") == graph.nodes[i].op_type
                for i in chain):
            out[chain[0]] = tuple(chain)
    return out


def _fused_torch_op(node, tensors, chain, calls, consts, place: str):
    """Chain ``chain`` (anchor ``node`` on ``tensors``, constants resolved; its bias add or
    batch norm, and activation, in ``calls``) as one registered PyTorch call
    (:func:`autoplace.backend.torch_calls.with_fused_tail`; a batch norm folded into the weight
    and bias, :func:`~autoplace.backend.torch_calls.fold_batch_norm`): its global name; None
    where its weight, bias or statistics are not constants here. The call gives a tensor of
    the anchor's shape and type, as every member does."""
    from tvm import relax

    from autoplace.backend.torch_bridge import register
    from autoplace.backend.torch_calls import fold_batch_norm, with_fused_tail
    from autoplace.backend.torch_equivalents import node_equivalent
    from autoplace.graph.chains import chain_activation

    anchor_var = calls[chain[0]][0]
    bound = {v: c for v, c in calls}

    def constant(expr, depth=3):  # a later binding's constant argument, folded ahead of it
        expr = consts.get(expr, expr) if isinstance(expr, relax.Var) else expr
        if isinstance(expr, relax.Var) and expr in bound and depth:
            c = bound[expr]
            folded = _folded(relax.Call(c.op, [constant(a, depth - 1) for a in c.args],
                                        c.attrs, c.ty_args), consts)
            return expr if folded is None else folded
        return expr

    tail = calls[chain[1]][1]
    others = [constant(a) for a in tail.args
              if not (isinstance(a, relax.Var) and a.same_as(anchor_var))]
    op = node_equivalent(node)
    if op is None or len(tensors) != 2 or not _is_tensor_const(tensors[1]) \
            or len(others) != (4 if tail.op.name == "relax.nn.batch_norm" else 1) \
            or not all(map(_is_tensor_const, others)):
        return None
    weight, values = tensors[1].value.numpy(), [c.value.numpy() for c in others]
    if len(values) == 4:  # gamma, beta, mean, variance
        weight, bias = fold_batch_norm(weight, None, *values, float(tail.attrs.epsilon))
    else:
        bias = values[0]
    act = chain_activation(calls[i][1].op.name.removeprefix("relax.") for i in chain[2:])
    out = (tuple(int(d) for d in anchor_var.ty.shape), str(anchor_var.ty.dtype))
    fused = with_fused_tail(op, node.op_type, weight, bias, act, node.inputs[0].shape, [out],
                            place)
    return register(fused)


def _folded(call, consts):
    """The value of op ``call`` when its every argument is a tensor constant (or no tensor at
    all, e.g. a shape), computed now on the CPU as ``FoldConstant`` computes it; None when any
    argument is not a constant, none is a tensor, or the op does not fold."""
    import tvm
    from tvm import relax

    args = [consts.get(a, a) if isinstance(a, relax.Var) else a for a in call.args]
    if call.op.name.startswith("relax.call") or not any(_is_tensor_const(a) for a in args) \
            or any(isinstance(a, (relax.Var, relax.Tuple)) for a in args):
        return None
    bb = relax.BlockBuilder()
    with bb.function("main", []):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(call.op, args, call.attrs, call.ty_args))
        bb.emit_func_output(out)
    try:
        with tvm.target.Target("llvm"):
            mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                            relax.transform.FoldConstant()])(bb.get())
    except Exception:  # noqa: BLE001 - an op that does not fold stays an op
        return None
    body = mod["main"].body
    result = body.body
    for block in body.blocks:
        for b in block.bindings:
            if isinstance(result, relax.Var) and b.var.same_as(result):
                result = b.value
    if not _is_tensor_const(result):
        return None
    return relax.const(result.value, result.ty.dtype)


def _type_of(expr):
    from tvm import relax

    if isinstance(expr, relax.Tuple):
        return relax.TupleType([_type_of(f) for f in expr.fields])
    return expr.ty


def _is_tensor_const(expr) -> bool:
    from tvm import ir, relax

    return isinstance(expr, ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType)


def _remap(expr, new_of):
    from tvm import relax

    if isinstance(expr, relax.Var):
        return new_of[expr]
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_remap(f, new_of) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_remap(expr.tuple_value, new_of), expr.index)
    return expr


def _source_device(expr, new_of, loc):
    """The device of an alias or tuple-get-item's source; None for a tuple of several devices."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        return loc.get(new_of[expr])
    if isinstance(expr, relax.TupleGetItem):
        return _source_device(expr.tuple_value, new_of, loc)
    if isinstance(expr, relax.Tuple):
        devs = {_source_device(f, new_of, loc) for f in expr.fields}
        return devs.pop() if len(devs) == 1 else None
    return None
