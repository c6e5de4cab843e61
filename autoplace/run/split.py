"""Cut a placed module into one Relax module per pipeline stage.

:func:`split` gives each stage explicit inputs (model inputs and tensors of earlier stages, also
ones that skip stages) and outputs (its tensors that later stages or the model's result read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.devices import Device
from autoplace.graph.opgraph import OpGraph, is_op_call, iter_bindings
from autoplace.plan import Plan, PlanError

if TYPE_CHECKING:
    import tvm


@dataclass(frozen=True, eq=False)
class Stage:
    """One stage: its nodes, the tensors it reads and writes (by name), and its Relax module.

    ``mod["main"]`` takes ``inputs`` in order and returns a tuple of ``outputs``.
    """

    index: int
    device: Device
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    mod: Any

    def __str__(self) -> str:
        return (f"stage {self.index} on {self.device.name}: {len(self.nodes)} nodes, "
                f"in ({', '.join(self.inputs)}) -> out ({', '.join(self.outputs)})")


@dataclass(frozen=True, eq=False)
class StagedModule:
    """A module cut into stages: the model's inputs and outputs are named like stage tensors."""

    stages: tuple[Stage, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    constants: tuple[tuple[str, np.ndarray], ...] = ()  # outputs that are constants


def split(mod: tvm.IRModule, plan: Plan, func_name: str = "main") -> StagedModule:
    """Cut ``mod[func_name]`` into one module per stage of ``plan`` (``mod`` is unchanged).

    Aliases, tuples and tuple-get-items are rebuilt in each stage that reads them, constants are
    inlined where used, and only real tensors cross stages (tuples are flattened: a tuple-valued
    node ``n`` sends ``n[0]``, ``n[1]``...).

    Raises
    ------
    PlanError
        If the plan has no stages, a stage spans several devices, or a node's stage comes before
        the stage of a node it reads.
    """
    from tvm import relax

    graph = OpGraph.from_relax(mod, func_name)
    plan.validate(graph)
    if plan.stages is None:
        raise PlanError("the plan has no stages: optimize with objective='throughput', or "
                        "dataclasses.replace(plan, stages=...) with a stage per node")
    func = mod[func_name]
    stage_of = dict(zip(plan.nodes, plan.stages))

    # A value is a tree: ("leaf", name, type) for a tensor, ("expr", e) for anything embedded
    # as is (constants, shapes), or a list of trees for a tuple.
    names = [p.name for p in func.params]
    param_keys = [n if names.count(n) == 1 else f"{n}#{k}" for k, n in enumerate(names)]
    trees: dict[Any, Any] = {p: _tree_of_type(p.ty, key) for p, key in zip(func.params, param_keys)}
    producer: dict[str, str | None] = {}  # tensor -> its node (None: a model input)
    types: dict[str, Any] = {}  # tensor -> its type
    for p in func.params:
        for key, ty in _leaf_types(trees[p]):
            producer[key], types[key] = None, ty
    calls = []  # (node name, var, call, arg trees)

    def tree(expr):
        if isinstance(expr, relax.Var):
            return trees[expr]
        if isinstance(expr, relax.Tuple):
            return [tree(f) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            t = tree(expr.tuple_value)
            return t[expr.index] if isinstance(t, list) else t
        return ("expr", expr)

    node_names = iter(plan.nodes)
    for b in iter_bindings(func):
        if is_op_call(b.value):
            name = next(node_names)
            calls.append((name, b.var, b.value, [tree(a) for a in b.value.args]))
            trees[b.var] = _tree_of_type(b.var.ty, name)
            for key, ty in _leaf_types(trees[b.var]):
                producer[key], types[key] = name, ty
        else:
            trees[b.var] = tree(b.value)
    out_tree = tree(func.body.body)

    # Checks: a stage is on one device, and never reads a later stage.
    order = sorted(set(plan.stages))
    device_of_stage: dict[int, str] = {}
    for node, dev in zip(plan.nodes, plan.assignment):
        s = stage_of[node]
        if device_of_stage.setdefault(s, dev) != dev:
            raise PlanError(f"stage {s} spans devices {device_of_stage[s]!r} and {dev!r} "
                            f"(node {node!r}): a stage runs on one device")
    reads: dict[str, set[str]] = {}  # node -> tensors it reads
    for name, _, _, args in calls:
        reads[name] = {k for a in args for k in _leaves(a)}
        for key in reads[name]:
            src = producer[key]
            if src is not None and stage_of[src] > stage_of[name]:
                raise PlanError(
                    f"node {name!r} is in stage {stage_of[name]} but reads {key!r} from node "
                    f"{src!r} in the later stage {stage_of[src]}: every node's stage must be at "
                    "least the stages of the nodes it reads")

    model_outputs = _flatten_tree(out_tree)
    out_keys, constants = [], []
    for k, t in enumerate(model_outputs):
        if t[0] == "leaf":
            out_keys.append(t[1])
        else:
            key = f"const#{k}"
            out_keys.append(key)
            constants.append((key, _const_numpy(t[1])))

    node_pos = {n: k for k, n in enumerate(plan.nodes)}

    def tensor_order(key):  # model inputs first, then by producing node
        src = producer[key]
        return (-1, param_keys.index(key.split("[")[0]), key) if src is None else (node_pos[src], 0, key)

    stages = []
    for s in order:
        members = [c for c in calls if stage_of[c[0]] == s]
        mine = {key for _, var, *_ in members for key in _leaves(trees[var])}
        inputs = sorted({k for name, *_ in members for k in reads[name]} - mine, key=tensor_order)
        later = {k for name, *_ in calls if stage_of[name] > s for k in reads[name]}
        outputs = [k for k in sorted(mine, key=tensor_order) if k in later or k in out_keys]
        stage_mod = _stage_module(mod, func_name, members, inputs, outputs, types)
        stages.append(Stage(s, plan.device(device_of_stage[s]),
                            tuple(c[0] for c in members), tuple(inputs), tuple(outputs), stage_mod))
    return StagedModule(tuple(stages), tuple(param_keys), tuple(out_keys), tuple(constants))


def _tree_of_type(ty, key):
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return [_tree_of_type(f, f"{key}[{j}]") for j, f in enumerate(ty.fields)]
    return ("leaf", key, ty)


def _leaves(t) -> list[str]:
    return [x[1] for x in _flatten_tree(t) if x[0] == "leaf"]


def _leaf_types(t) -> list[tuple[str, Any]]:
    return [(x[1], x[2]) for x in _flatten_tree(t) if x[0] == "leaf"]


def _flatten_tree(t) -> list:
    if isinstance(t, list):
        return [x for f in t for x in _flatten_tree(f)]
    return [t]


def _const_numpy(expr) -> np.ndarray:
    value = getattr(expr, "value", None) or getattr(expr, "data", None)
    if value is None or not hasattr(value, "numpy"):
        raise PlanError(f"the model returns {type(expr).__name__}, which is not a tensor")
    return value.numpy()


def _plain(ty):
    """A tensor type without its virtual device."""
    from tvm import relax

    return relax.TensorType(ty.shape, ty.dtype) if isinstance(ty, relax.TensorType) else ty


def _stage_module(mod, func_name, members, inputs, outputs, types):
    """``main(*inputs) -> tuple(outputs)`` running ``members`` (node, var, call, arg trees)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    params = [relax.Var(_var_name(k), _plain(types[k])) for k in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            env: dict[str, Any] = dict(zip(inputs, params))
            tuple_vars: dict[str, Any] = {}  # node name -> its tuple-valued var in this stage

            def lookup(key):
                if key not in env:  # a field of a tuple-valued node of this stage
                    base, _, rest = key.partition("[")
                    expr = tuple_vars[base]
                    for idx in rest.rstrip("]").split("]["):
                        expr = relax.TupleGetItem(expr, int(idx))
                    env[key] = bb.emit(expr, name_hint=_var_name(key))
                return env[key]

            def rebuild(t):
                if isinstance(t, list):
                    return relax.Tuple([rebuild(f) for f in t])
                return lookup(t[1]) if t[0] == "leaf" else t[1]

            for name, var, call, arg_trees in members:
                new = relax.Call(call.op, [rebuild(a) for a in arg_trees], call.attrs,
                                 call.ty_args)
                v = bb.emit(new, name_hint=var.name)
                if isinstance(var.ty, relax.TupleType):
                    tuple_vars[name] = v
                else:
                    env[name] = v
            result = bb.emit_output(relax.Tuple([lookup(k) for k in outputs]))
        bb.emit_func_output(result)
    return with_main(mod, bb.get()["main"], func_name)


def with_main(mod, main, func_name: str = "main"):
    """A new module: ``mod``'s functions that are not Relax (its kernels), and ``main`` as
    ``main`` in place of ``mod[func_name]``, normalized (``mod`` is unchanged)."""
    import tvm
    from tvm import relax

    others = {gv: f for gv, f in mod.functions.items()
              if gv.name_hint != func_name and not isinstance(f, relax.Function)}
    new_mod = tvm.IRModule(others, attrs=mod.attrs)
    new_mod["main"] = main
    return relax.transform.Normalize()(new_mod)


def _var_name(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in key)
