"""Which op-graph nodes each kernel of the built model computes.

The real build fuses ops (``FuseOps``/``FuseTIR``), so what runs is one kernel per *fused group*,
not one per op. :func:`fused_groups` maps each kernel back to its op-graph nodes; :func:`anchor`
picks the node that stands for a group's cost.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autoplace.backend import lowering_pipeline
from autoplace.graph.opgraph import OpGraph, is_op_call

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)


_TAG = "__ap_node_"  # prefix given to op-binding variables so that they can be found after lowering


def fused_groups(mod: tvm.IRModule, func_name: str = "main", *,
                 gpu: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """Which op-graph nodes each kernel of the built model computes, in call order.

    Runs the lowering pipeline's passes from the start to ``RewriteDataflowReshape`` on a copy of
    ``mod`` whose op bindings are tagged, and matches every ``call_tir`` inside each fused function to the legalized op it came from by dataflow (the same kernel applied to the
    same producers), so functions that ``FuseOps`` shares between identical groups are resolved.

    Returns
    -------
    list of (str, tuple of int)
        One entry per kernel call: the kernel's name (as the VM instrument reports it; a name
        repeats when a fused function is shared) and the node indices it computes. Nodes with
        no kernel of their own appear in no entry: ops folded into constants (``FoldConstant``,
        e.g. the transpose of a weight) and reshapes that ``RewriteDataflowReshape`` turns into
        views. Extra kernels that legalization emits for one op count as that op's.
    """
    import tvm
    from tvm import ir

    graph = OpGraph.from_relax(mod, func_name)
    passes = list(lowering_pipeline(gpu=gpu, multi_device=False).passes)
    names = [p.info.name for p in passes]
    fuse, reshape = names.index("FuseOps"), names.index("RewriteDataflowReshape")
    tagged = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs,
                          global_infos=mod.global_infos)
    tagged[func_name] = _tag_op_bindings(mod[func_name])
    with tvm.target.Target("cuda" if gpu else "llvm"):
        legal = tvm.transform.Sequential(passes[:fuse])(tagged)
        fused = passes[fuse](legal)
        final = tvm.transform.Sequential(passes[fuse + 1:reshape + 1])(fused)

    ids = _Interner()
    owners: dict[int, list[int]] = {}  # call_tir id in the legalized main -> op-graph node
    pending: list[int] = []
    env: dict[Any, int] = {p: ids(("param", k)) for k, p in enumerate(legal[func_name].params)}
    for b in _bindings(legal[func_name]):
        env[b.var] = vid = _value_id(b.value, env, ids, legal)
        if is_call_tir(b.value):
            pending.append(vid)
        if b.var.name.startswith(_TAG):
            node = int(b.var.name[len(_TAG):])
            for k in pending:
                owners.setdefault(k, []).append(node)
            pending = []

    # FuseTIR keeps each fused function's name for its kernel and drops aliases, and
    # RewriteDataflowReshape turns reshape kernels into views: count the kernels that remain.
    remaining = Counter(b.value.args[0].name_hint for b in _bindings(final[func_name])
                        if is_call_tir(b.value))
    groups: list[tuple[str, tuple[int, ...]]] = []
    env = {p: ids(("param", k)) for k, p in enumerate(fused[func_name].params)}
    for b in _bindings(fused[func_name]):
        inner: list[int] = []
        env[b.var] = _value_id(b.value, env, ids, fused, inner)
        if not inner:
            continue
        name = (b.value.op if isinstance(b.value.op, ir.GlobalVar) else b.value.args[0]).name_hint
        if remaining[name] > 0:  # else it became a view: no kernel
            remaining[name] -= 1
            nodes = sorted({owners[k].pop(0) for k in inner if owners.get(k)})
            groups.append((name, tuple(nodes)))
    covered = [i for _, nodes in groups for i in nodes]
    log.debug("fused_groups: %d kernels cover %d of %d nodes", len(groups), len(covered),
              len(graph))
    return groups


class _Interner:
    """Hash-conses dataflow signatures into small ints."""

    def __init__(self):
        self._ids: dict[tuple, int] = {}

    def __call__(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))


def _tag_op_bindings(func):
    """``func`` with the variable of its i-th op-call binding renamed ``_TAG + str(i)``."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Tagger(PyExprMutator):
        def __init__(self):
            super().__init__()
            self.count = 0

        def visit_var_binding_(self, binding):
            if not is_op_call(binding.value):
                return super().visit_var_binding_(binding)
            value = self.visit_expr(binding.value)
            cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            var = cls(f"{_TAG}{self.count}", binding.var.ty)
            self.count += 1
            self.builder_.emit_normalized(relax.VarBinding(var, value))
            self.set_var_remap(binding.var, var)

    return _Tagger().visit_expr(func)


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def is_call_tir(value) -> bool:
    """Whether ``value`` is a Relax ``call_tir`` (of any flavour: ``call_tir_inplace`` ...)."""
    from tvm import ir, relax

    return (isinstance(value, relax.Call) and isinstance(value.op, ir.Op)
            and value.op.name.startswith("relax.call_tir"))


def _value_id(expr, env, ids, mod, inner: list[int] | None = None) -> int:
    """Dataflow identity of ``expr``; calls of fused functions are evaluated through their body,
    appending the ids of the ``call_tir`` they contain to ``inner``."""
    import tvm_ffi
    from tvm import ir, relax

    def arg(e):
        return _value_id(e, env, ids, mod, inner)

    if isinstance(expr, relax.Var):
        return env[expr]
    if isinstance(expr, ir.expr.Constant):
        return ids(("const", tvm_ffi.structural_hash(expr)))
    if isinstance(expr, relax.Tuple):
        return ids(("tuple",) + tuple(arg(f) for f in expr.fields))
    if isinstance(expr, relax.TupleGetItem):
        return ids(("item", arg(expr.tuple_value), expr.index))
    if isinstance(expr, relax.Call) and isinstance(expr.op, ir.GlobalVar):
        callee = mod[expr.op]
        sub = dict(zip(callee.params, (arg(a) for a in expr.args)))
        for b in _bindings(callee):
            sub[b.var] = _value_id(b.value, sub, ids, mod, inner)
        return _value_id(callee.body.body, sub, ids, mod, inner)
    if isinstance(expr, relax.Call):
        if is_call_tir(expr):
            key = ("tir", expr.args[0].name_hint, arg(expr.args[1]),
                   tuple(str(a) for a in expr.args[2:]))
            vid = ids(key)
            if inner is not None:
                inner.append(vid)
            return vid
        head = expr.op.name if isinstance(expr.op, ir.Op) else str(expr.op)
        return ids(("call", head) + tuple(arg(a) for a in expr.args))
    return ids(("expr", str(expr)))


def anchor(nodes: Sequence[int], graph: OpGraph, seconds: Sequence[float]) -> int:
    """The anchor of a fused kernel's ``nodes``: the one with the most FLOPs, the slowest (by
    ``seconds``, per node of ``graph``) on ties."""
    return max(nodes, key=lambda i: (graph.nodes[i].flops, seconds[i]))
