"""One-op modules: each distinct workload of a model, alone in a Relax function, ready to time."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import numpy as np

from autoplace.graph import OpGraph
from autoplace.graph.opgraph import iter_bindings, is_op_call

if TYPE_CHECKING:
    import tvm


def single_op_modules(mod: tvm.IRModule, graph: OpGraph | None = None) -> dict[str, tvm.IRModule]:
    """One module per distinct workload key of ``mod``'s op graph, in first-seen order.

    Every tensor the op reads becomes a parameter of the new ``main``, constants included, so
    that ``FoldConstant`` cannot compute the op at build time; ``call_tir`` keeps its PrimFunc.
    """
    graph = graph if graph is not None else OpGraph.from_relax(mod)
    func = mod[graph.func_name]
    calls = [b for b in iter_bindings(func) if is_op_call(b.value)]
    if len(calls) != len(graph.nodes):
        raise ValueError(f"the graph has {len(graph.nodes)} nodes but {graph.func_name!r} has "
                         f"{len(calls)} op calls: was the graph built from this module?")
    out: dict[str, tvm.IRModule] = {}
    for node, binding in zip(graph.nodes, calls):
        if node.workload_key not in out:
            out[node.workload_key] = _one_op(mod, binding.value)
    return out


def module_from_key(key: str) -> tvm.IRModule:
    """A Relax module whose ``main`` applies a workload key's op to parameters of its shapes.

    Raises ``ValueError`` (or TVM's error) where the key does not carry what the op needs: an
    argument other than a shape or a scalar, a ``call_tir`` PrimFunc.
    """
    from tvm import relax

    op, inputs, attrs, extra = json.loads(key)
    params = [relax.Var(f"x{i}", relax.TensorType(s, d)) for i, (s, d) in enumerate(inputs)]
    fn = relax.op
    for part in op.removeprefix("relax.").split("."):
        fn = getattr(fn, part)
    args: list = [params] if op == "relax.concat" else list(params)
    for e in extra:  # printed Relax values: R.shape([1, 32]) or a scalar like T.float64(6.0)
        if m := re.fullmatch(r"R\.shape\(\[(.*)\]\)", e):
            args.append([int(v) for v in m.group(1).split(",") if v.strip()])
        elif m := re.fullmatch(r"T\.\w+\((.*)\)", e):
            args.append(float(m.group(1)))
        else:
            raise ValueError(f"cannot rebuild the argument {e!r} of {op}")
    call = fn(*args, **{k: v for k, v in attrs.items() if v is not None})
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    return bb.get()


def random_inputs(func, rng: np.random.Generator) -> list[np.ndarray]:
    """Arrays for the parameters of ``func`` (a Relax function, or a PrimFunc's buffers): floats
    in [0.5, 1.5) (valid variances, logs and divisors, no NaN to time), zero integers (valid
    indices)."""
    arrays = []
    for p in func.params:
        shape = p.ty.shape  # a Relax tensor's shape expression, or a PrimFunc buffer's dims
        shape = [int(d) for d in getattr(shape, "values", shape)]
        dtype = str(p.ty.dtype)
        if dtype.startswith(("float", "bfloat")):
            arrays.append(rng.uniform(0.5, 1.5, shape).astype(dtype))
        else:
            arrays.append(np.zeros(shape, dtype=dtype))
    return arrays


def _one_op(mod, call) -> tvm.IRModule:
    import tvm
    from tvm import ir, relax

    params: list = []

    def as_param(expr):
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([as_param(f) for f in expr.fields])
        if isinstance(expr, (relax.Var, ir.expr.Constant)) and isinstance(expr.ty, relax.TensorType):
            ty = relax.TensorType(expr.ty.shape, expr.ty.dtype)  # drop any vdevice
            params.append(relax.Var(f"x{len(params)}", ty))
            return params[-1]
        return expr

    args = [as_param(a) for a in call.args]
    new_call = relax.BlockBuilder().normalize(relax.Call(call.op, args, call.attrs, call.ty_args))
    out = relax.Var("out", new_call.ty)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(out, new_call)])], out)
    funcs = {"main": relax.Function(params, body, out.ty, True).with_attr("global_symbol", "main")}
    for a in call.args:  # call_tir: bring the PrimFunc along under its own name
        if isinstance(a, ir.GlobalVar):
            funcs[a.name_hint] = mod[a]
    new = tvm.IRModule({ir.GlobalVar(k) if k == "main" else _gv(call, k): f
                        for k, f in funcs.items()})
    return relax.transform.Normalize()(new)


def _gv(call, name):
    from tvm import ir

    return next(a for a in call.args if isinstance(a, ir.GlobalVar) and a.name_hint == name)
