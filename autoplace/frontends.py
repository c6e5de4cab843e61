"""Bring models into Relax: PyTorch through ``torch.export``, and ONNX files."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    import tvm

_LEAFSPEC_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def from_torch(model: torch.nn.Module, example_inputs: Sequence) -> tvm.IRModule:
    """Export ``model`` (in eval mode) with static shapes and import it; weights become constants.
    ``example_inputs`` are numpy arrays or torch tensors."""
    return from_exported(export_torch(model, example_inputs))


def export_torch(model: torch.nn.Module, example_inputs: Sequence) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` in eval mode (its mode is restored after), without
    gradients, at the static shapes of ``example_inputs`` (numpy arrays or torch tensors)."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("from_torch needs PyTorch: pip install 'autoplace[frontends]'") from e

    args = tuple(x.detach() if isinstance(x, torch.Tensor)
                 else torch.from_numpy(np.ascontiguousarray(x)) for x in example_inputs)
    training = model.training
    try:
        with warnings.catch_warnings():
            # A deprecation inside torch.export (its decompositions, which the importer runs),
            # not about anything the caller wrote: every model would print it.
            warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
            with torch.no_grad():
                return torch.export.export(model.eval(), args)
    finally:
        model.train(training)


def from_exported(exported: torch.export.ExportedProgram) -> tvm.IRModule:
    """Import a ``torch.export`` program into Relax; its parameters and buffers become
    constants, its user inputs the parameters of ``main`` in order.

    Ops the importer lacks (``adaptive_max_pool2d``, ``_cdist_forward``, ``searchsorted``,
    ``nonzero``, ``_unique2``...: those of the decomposed program that its converter map does
    not name), and ops its converter fails on, become calls into PyTorch
    (:mod:`autoplace.backend.torch_bridge`), which a :meth:`Device.torch <autoplace.Device.torch>`
    device runs. Where an op's output shape depends on the data (``nonzero``, ``unique``), it
    returns a new tensor on every call, and every op that reads such a tensor runs in PyTorch
    too: no TVM kernel ever sees a shape known only at run time. The ops that give or read
    complex tensors (``torch.fft``), which TVM's tensors cannot hold, run as one PyTorch call
    per connected group, whose outputs are real. The calls are registered in this process (a
    saved build that calls PyTorch needs the model imported again in the process that loads it).
    """
    import torch
    from tvm.relax.frontend.torch import from_exported_program
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LEAFSPEC_WARNING, category=FutureWarning)
        with torch.no_grad():
            # Decomposed once here, as the importer would, to see the ops it will convert;
            # attention kept whole where it imports as one op (:func:`_attention`).
            table = None
            if _attention_whole(exported):
                table = torch.export.default_decompositions()
                table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
            program = exported.run_decompositions(table)
            _fuse_complex(program)
            known = set(ExportedProgramImporter().convert_map)
            custom = {**_AS_PYTORCH, **_torch_fallbacks(program, known)}
            return from_exported_program(program, custom_convert_map=custom or None,
                                         run_ep_decomposition=False)


def _torch_fallbacks(program, known: set[str]) -> dict:
    """``custom_convert_map`` entries that turn each node of ``program`` the importer cannot
    take into a PyTorch call: ops it lacks, and ops that give or read a tensor whose shape
    depends on the data (the importer's own ``masked_select`` gives TVM a shape it cannot
    place). Assertions on such a shape are dropped from ``program``'s graph (the op checks
    its own output). Empty where the importer takes every node."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    graph = program.graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    lacking = {n for n in calls if n.target.__name__ not in known}
    names = {n.target.__name__ for n in calls}
    dynamic = set()  # nodes whose output shape depends on the data
    for n in calls:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else (val,)
        if any(free_unbacked_symbols(v) for v in vals if v is not None):
            dynamic.add(n)
    if not lacking and not dynamic:
        return dict.fromkeys(names, _importer_or_torch({}))
    # Runtime checks of an unbacked size (sym_size, comparisons, _assert_scalar): dropped.
    for n in reversed(calls):
        if "assert_scalar" in n.target.__name__ or (
                not n.users and n.target.__name__ in ("sym_size", "sym_size.int")):
            graph.erase_node(n)
    for n in reversed(list(graph.nodes)):
        if n.op == "call_function" and not n.users and not _has_effect(n):
            graph.erase_node(n)
    calls = [n for n in graph.nodes if n.op == "call_function"]
    torch_nodes = set()
    for n in calls:
        if n in lacking or n in dynamic or any(a in dynamic for a in n.all_input_nodes):
            if n.target.__name__ == "getitem":
                continue  # picks a field of a PyTorch call's tuple: the importer's own
            if n.meta.get("val") is None and not n.users:
                graph.erase_node(n)  # a check of a dynamic tensor's metadata
                continue
            torch_nodes.add(n)
    examples = _example_values(program) if dynamic & torch_nodes else {}

    def why(node) -> str:
        if isinstance(node.target, _Group):
            return node.target.why
        if node in lacking:
            return f"the importer lacks aten.{node.target.__name__.split('.')[0]}"
        if node in dynamic and not any(a in dynamic for a in node.all_input_nodes):
            return "its output's shape depends on the data"
        return "it reads a tensor whose shape depends on the data"

    return dict.fromkeys(names, _importer_or_torch(
        {n: (n in dynamic, examples.get(n.name), why(n)) for n in torch_nodes}))


def _importer_or_torch(torch_nodes: dict):
    """The converter of every op: a PyTorch call for the nodes of ``torch_nodes`` (node ->
    ``(dynamic, example value, why)``), else the importer's own converter, and a PyTorch call
    where that one fails (the reason kept in the call's ``why``)."""
    originals: dict = {}

    def convert(node, importer):
        if node in torch_nodes:
            dynamic, example, why = torch_nodes[node]
            return _torch_call(node, importer, dynamic, example, why)
        if not originals:
            originals.update(type(importer).create_convert_map(importer))
            originals.update({k: partial(f, importer=importer) for k, f in _AS_PYTORCH.items()})
        try:
            return originals[node.target.__name__](node)
        except Exception as e:  # noqa: BLE001 - the importer's errors have no common type
            why = f"the importer failed on aten.{node.target.__name__.split('.')[0]}: " + \
                str(e).strip().splitlines()[-1][:200]
            try:
                return _torch_call(node, importer, False, None, why)
            except Exception:  # noqa: BLE001 - nor can PyTorch take it: the importer's error
                raise e from None

    return convert


class _Group:
    """A connected group of an exported program's ops that give or read complex tensors, run
    as one call of its own graph (``module``); its outputs are real."""

    def __init__(self, module, ops: Sequence[str], index: int):
        import hashlib

        self.module, self.ops = module, tuple(ops)
        self.__name__ = f"autoplace_complex_{index}"
        self.why = (f"aten.{', aten.'.join(self.ops)} compute complex numbers, which TVM's "
                    "tensors cannot hold")
        # what it computes, for the call's signature: its ops and its graph's code
        self._text = f"complex:{'+'.join(self.ops)}:" + hashlib.sha1(
            module.code.encode()).hexdigest()[:8]

    def __call__(self, *args):
        return self.module(*args)

    def __str__(self) -> str:
        return self._text


def _fuse_complex(program) -> int:
    """Replace, in ``program``'s graph, each connected group of nodes that give or read a
    complex tensor (with whatever lies on a path between two of them) by one call of a
    :class:`_Group`; the number of groups."""
    import torch
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    def is_complex(v) -> bool:
        vals = v if isinstance(v, (tuple, list)) else (v,)
        return any(isinstance(t, torch.Tensor) and t.dtype.is_complex for t in vals)

    graph = program.graph
    calls = [n for n in graph.nodes if n.op == "call_function"]
    inside = {n for n in calls if is_complex(n.meta.get("val"))}
    inside |= {u for n in inside for u in n.users if u.op == "call_function"}
    if not inside:
        return 0
    groups = _components(inside)
    while True:  # whatever lies on a path between two nodes of a group joins it
        for group in groups:
            below = _reach(group, lambda n: n.users)
            above = _reach(group, lambda n: n.all_input_nodes)
            group |= below & above
        merged = _merged(groups)  # groups grown into one another are one group
        if len(merged) == len(groups):
            break
        groups = merged
    order = {n: i for i, n in enumerate(graph.nodes)}
    ops = [[n.target.__name__.split(".")[0] for n in sorted(g, key=order.get)] for g in groups]
    gm = program.graph_module
    fuse_by_partitions(gm, [dict.fromkeys(g) for g in groups], prefix="autoplace_complex_",
                       always_return_tuple=True)
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target.startswith("autoplace_complex_"):
            index = int(node.target.rsplit("_", 1)[1])
            node.op, node.target = "call_function", _Group(
                getattr(gm, node.target), ops[index], index)
    gm.recompile()
    return len(groups)


def _components(nodes: set) -> list[set]:
    """The groups of ``nodes`` connected through edges among themselves."""
    left, groups = set(nodes), []
    while left:
        stack, group = [left.pop()], set()
        while stack:
            n = stack.pop()
            group.add(n)
            for m in (*n.users, *n.all_input_nodes):
                if m in left:
                    left.discard(m)
                    stack.append(m)
        groups.append(group)
    return groups


def _merged(groups: list[set]) -> list[set]:
    """``groups`` with those that share a node made one."""
    out: list[set] = []
    for g in groups:
        for other in [o for o in out if o & g]:
            out.remove(other)
            g = g | other
        out.append(g)
    return out


def _reach(nodes: set, step) -> set:
    """The nodes reached from ``nodes`` by ``step`` (not counting themselves unless reached)."""
    seen, stack = set(), [m for n in nodes for m in step(n)]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(step(n))
    return seen


def _cumsum(node, importer):
    """``aten.cumsum`` in the dtype PyTorch gives: a bool or integer tensor sums in int64,
    where the importer keeps the input's dtype (and TVM builds no running sum of bools)."""
    from tvm import relax

    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    dtype = str(node.meta["val"].dtype).removeprefix("torch.")
    return importer.block_builder.emit(relax.op.cumsum(importer.env[node.args[0]], dim, dtype))


def _attention_args(node) -> tuple | None:
    """``(query, key, value, mask, scale, causal)`` of a ``scaled_dot_product_attention`` node
    that :func:`_attention` imports as one op: query, key and value 4-D of one float dtype with
    the same batch and heads, a mask (or None) of rank 1 to 4 that is bool or of their dtype and
    ends with the keys' length, no dropout and no grouped heads; else None."""
    import torch

    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    defaults = (None, None, None, None, 0.0, False, None, False)
    given = dict(zip(names, node.args)) | dict(node.kwargs)
    q, k, v, mask, dropout, causal, scale, gqa = (given.get(n, d) for n, d in zip(names, defaults))
    vals = [getattr(x, "meta", {}).get("val") for x in (q, k, v)]
    if any(not isinstance(t, torch.Tensor) for t in vals) or dropout or gqa:
        return None
    if any(t.dim() != 4 or t.dtype != vals[0].dtype for t in vals) \
            or not vals[0].dtype.is_floating_point \
            or len({t.shape[0] for t in vals}) != 1 or len({t.shape[1] for t in vals}) != 1:
        return None
    if mask is not None:
        m = getattr(mask, "meta", {}).get("val")
        if not isinstance(m, torch.Tensor) or not 1 <= m.dim() <= 4 \
                or m.dtype not in (torch.bool, vals[0].dtype) or m.shape[-1] != vals[1].shape[2]:
            return None
    if not isinstance(causal, bool) or (causal and mask is not None) \
            or not (scale is None or isinstance(scale, (int, float))):
        return None
    return q, k, v, mask, scale, causal


def _attention_whole(exported) -> bool:
    """Whether ``exported`` has attention and :func:`_attention` imports all of it."""
    import torch

    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    nodes = [n for n in exported.graph.nodes if n.op == "call_function" and n.target is sdpa]
    return bool(nodes) and all(_attention_args(n) is not None for n in nodes)


def _attention(node, importer):
    """``aten.scaled_dot_product_attention`` as one Relax ``nn.attention`` (which TVM builds,
    and the torch and ONNX Runtime devices run as PyTorch's own attention), with the call's
    scale, causal mask and mask: a bool mask becomes 0 where it keeps a key and -inf where it
    hides one. A query row whose mask hides every key gives zeros, as PyTorch's attention does
    (its softmax is "safe"), not the NaN a softmax over no key gives."""
    from tvm import relax

    args = _attention_args(node)
    if args is None:
        raise ValueError("this attention is not imported as one op")
    q, k, v, mask, scale, causal = args
    bb, env = importer.block_builder, importer.env
    dtype = str(q.meta["val"].dtype).removeprefix("torch.")

    def heads_second(x):  # BHSD <-> BSHD
        return bb.emit(relax.op.permute_dims(x, [0, 2, 1, 3]))

    bias = keeps = None
    if mask is not None:
        bias = env[mask]
        if str(bias.ty.dtype) == "bool":
            keeps = bias
            bias = bb.emit(relax.op.where(bias, relax.const(0.0, dtype),
                                          relax.const(float("-inf"), dtype)))
        else:
            keeps = bb.emit(relax.op.not_equal(bias, relax.const(float("-inf"), dtype)))
        rank = len(mask.meta["val"].shape)
        if rank < 4:
            bias = bb.emit(relax.op.reshape(
                bias, (1,) * (4 - rank) + tuple(mask.meta["val"].shape)))
    out = bb.emit(relax.op.nn.attention(
        heads_second(env[q]), heads_second(env[k]), heads_second(env[v]), bias,
        None if scale is None else float(scale), "TopLeft" if causal else None))
    out = heads_second(out)
    if keeps is not None:
        # per row, whether any key is kept (a max over -inf alone is TVM's lowest finite value)
        kept = bb.emit(relax.op.max(bb.emit(relax.op.astype(keeps, "int8")), axis=-1,
                                    keepdims=True))
        hidden = bb.emit(relax.op.equal(kept, relax.const(0, "int8")))
        out = bb.emit(relax.op.where(hidden, relax.const(0.0, dtype), out))
    return out


# Converters of the aten ops whose import by TVM's own converter differs from PyTorch.
_AS_PYTORCH = {"cumsum.default": _cumsum,
               "scaled_dot_product_attention.default": _attention}


def _has_effect(node) -> bool:
    return bool(getattr(node.target, "_schema", None) and node.target._schema.is_mutable) or \
        "assert" in node.target.__name__


def _example_values(program) -> dict:
    """Each node's value at the program's example inputs (name -> value); empty where the
    program has none or does not run."""
    import torch
    from torch.export.graph_signature import InputKind

    example = getattr(program, "example_inputs", None)
    if not example:
        return {}
    user = iter(torch.utils._pytree.tree_leaves(example[0]))
    args = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.target in program.state_dict:
            args.append(program.state_dict[spec.target])
        else:
            args.append(program.constants[spec.target])
    values: dict = {}

    class _Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            values[n.name] = out = super().run_node(n)
            return out

    try:
        with torch.no_grad():
            _Recorder(program.graph_module).run(*args)
    except Exception:  # noqa: BLE001 - without examples, sizes are estimated
        return {}
    return values


def _torch_call(node, importer, dynamic: bool, example, why: str = ""):
    """Emit ``node`` as a call of a registered PyTorch op (:mod:`autoplace.backend.torch_bridge`)."""
    import torch
    from torch import fx
    from tvm import relax

    from autoplace.backend.torch_bridge import Slot, TorchOp, register, relax_call

    tensors = []

    def template(v):
        if isinstance(v, fx.Node):
            expr = importer.env[v]
            if not isinstance(expr.ty, relax.TensorType):
                raise NotImplementedError(
                    f"node {node.name!r} ({node.target}): argument {v.name!r} is not a tensor "
                    f"({expr.ty}); autoplace cannot pass it to PyTorch")
            tensors.append(expr)
            return Slot(len(tensors) - 1)
        if isinstance(v, (list, tuple)):
            return type(v)(template(x) for x in v)
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise NotImplementedError(f"node {node.name!r} ({node.target}) takes a symbolic "
                                      f"size {v}: only static shapes are supported")
        return v

    args = template(tuple(node.args))
    kwargs = tuple((k, template(v)) for k, v in sorted(node.kwargs.items()))
    val = node.meta["val"]
    several = isinstance(val, (tuple, list))
    vals = list(val) if several else [val]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        from autoplace.graph import UnsupportedModelError

        raise UnsupportedModelError(
            f"node {node.name!r} ({node.target}) gives {val!r}, not a tensor, from a tensor "
            "whose shape depends on the data: only tensors pass between TVM and PyTorch")
    shown = list(example) if several and example is not None else [example] * len(vals)
    outputs = []
    for v, ex in zip(vals, shown):
        shape = tuple(ex.shape) if isinstance(ex, torch.Tensor) else tuple(
            int(d) if not isinstance(d, torch.SymInt) else 1 for d in v.shape)
        dtype = str(v.dtype).removeprefix("torch.")
        if v.dtype.is_complex:
            from autoplace.graph import UnsupportedModelError

            raise UnsupportedModelError(
                f"node {node.name!r} ({node.target}) gives a {dtype} tensor: TVM's tensors "
                "hold no complex numbers, so not even a PyTorch call can pass it on")
        outputs.append((shape, dtype))
    op = TorchOp(node.target, str(node.target), args, kwargs, tuple(outputs), dynamic,
                 node.name, several, why)
    name = register(op)
    bb = importer.block_builder
    tys = [relax.TensorType(ndim=len(s), dtype=d) if dynamic
           else relax.TensorType(relax.ShapeExpr(list(s)), d) for s, d in outputs]
    return bb.emit(relax_call(name, tensors, relax.TupleType(tys) if several else tys[0]))


def from_onnx(path: str | Path) -> tvm.IRModule:
    """Import an ONNX file; its initializers become constants."""
    try:
        import onnx
    except ImportError as e:
        raise ImportError("from_onnx needs the onnx package: pip install 'autoplace[frontends]'") from e
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    try:
        model = onnx.load(str(path))
        onnx.checker.check_model(model)
    except Exception as e:  # onnx raises several unrelated types for a bad file
        raise ValueError(f"{path} is not a valid ONNX model: {e}") from e
    return _from_onnx(model)
