"""The op graph: one node per op-call binding of a Relax function, in topological order.

Nodes are what autoplace places. Bindings that only rename or regroup tensors (aliases, tuples,
tuple-get-item) are not nodes: they are resolved to the op that produced the tensor, and an
annotated module puts them where their source is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autoplace.graph.flops import count_flops

if TYPE_CHECKING:
    import networkx as nx
    import tvm


class UnsupportedModelError(ValueError):
    """The module uses something the op graph cannot represent; the message says what."""


@dataclass(frozen=True)
class TensorInfo:
    """Static shape and dtype of one tensor."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        bits = dtype_bits(self.dtype)
        return math.prod(self.shape) * bits // 8


@dataclass(frozen=True)
class GraphInput:
    """A parameter of the Relax function: a model input, or a weight passed as input."""

    name: str
    tensor: TensorInfo
    is_weight: bool
    consumers: tuple[int, ...]


@dataclass(frozen=True)
class Edge:
    """A tensor flowing from node ``src`` to node ``dst``."""

    src: int
    dst: int
    nbytes: int


@dataclass(frozen=True)
class OpNode:
    """One op call: what it computes, on which tensors, and what it costs to move and compute."""

    index: int
    name: str
    op: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    attrs: tuple[tuple[str, Any], ...]
    extra_args: tuple[str, ...]
    flops: float
    param_bytes: int
    is_output: bool = False
    #: Per input, its value where it is a constant of one element (``add(x, 3.0)``'s 3.0), else
    #: None: what tells ``x + 3`` from ``x + 1`` where the shapes cannot. Not in the workload.
    scalars: tuple[float | None, ...] = ()

    @property
    def op_type(self) -> str:
        """The op without its namespace prefix: ``"nn.conv2d"`` for ``"relax.nn.conv2d"``; a
        call into PyTorch keeps its ``"torch."`` (``"torch.nonzero"``)."""
        return self.op.removeprefix("relax.")

    @property
    def is_torch(self) -> bool:
        """A call into PyTorch (an op the importer lacks): only a torch device runs it."""
        return self.op.startswith("torch.")

    @property
    def bytes_read(self) -> int:
        return sum(t.nbytes for t in self.inputs)

    @property
    def bytes_written(self) -> int:
        return sum(t.nbytes for t in self.outputs)

    @property
    def out_bytes(self) -> int:
        return self.bytes_written

    @property
    def mem_bytes(self) -> int:
        """Bytes the node holds on its device (against ``Device.memory_bytes``): its parameters
        and its outputs."""
        return self.param_bytes + self.out_bytes

    @property
    def workload_key(self) -> str:
        """Identical for ops that compute the same thing on the same shapes (values aside)."""
        return json.dumps(
            [self.op, [[list(t.shape), t.dtype] for t in self.inputs], dict(self.attrs),
             list(self.extra_args)],
            separators=(",", ":"), sort_keys=True, default=str)


@dataclass(frozen=True, eq=False)
class OpGraph:
    """An immutable DAG of op calls in topological order.

    >>> g = OpGraph.from_relax(mod)            # doctest: +SKIP
    >>> [n.op_type for n in g.nodes][:2]       # doctest: +SKIP
    ['matmul', 'add']
    """

    nodes: tuple[OpNode, ...]
    edges: tuple[Edge, ...]
    inputs: tuple[GraphInput, ...]
    func_name: str = "main"
    _by_name: Mapping[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def from_relax(cls, mod: tvm.IRModule, func_name: str = "main") -> OpGraph:
        """Walk ``mod[func_name]``'s bindings into an op graph.

        Raises
        ------
        UnsupportedModelError
            For dynamic shapes, control flow, calls to other functions or already-lowered calls;
            the message names the binding.
        """
        return _build(mod, func_name)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, name: str) -> OpNode:
        try:
            return self.nodes[self._by_name[name]]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph "
                           f"(nodes: {', '.join(n.name for n in self.nodes[:8])}, ...)") from None

    def index(self, name: str) -> int:
        return self.node(name).index

    def predecessors(self, index: int) -> tuple[int, ...]:
        return tuple(sorted({e.src for e in self.edges if e.dst == index}))

    def successors(self, index: int) -> tuple[int, ...]:
        return tuple(sorted({e.dst for e in self.edges if e.src == index}))

    @property
    def outputs(self) -> tuple[int, ...]:
        """Indices of the nodes whose tensors the function returns."""
        return tuple(n.index for n in self.nodes if n.is_output)

    def workloads(self) -> dict[str, list[int]]:
        """Distinct workload keys, each with the indices of the nodes that share it."""
        groups: dict[str, list[int]] = {}
        for n in self.nodes:
            groups.setdefault(n.workload_key, []).append(n.index)
        return groups

    def to_networkx(self) -> nx.DiGraph:
        """A ``networkx.DiGraph`` with node attributes ``name``, ``op``, ``flops``, edge ``nbytes``."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.index, name=n.name, op=n.op_type, flops=n.flops)
        for e in self.edges:
            g.add_edge(e.src, e.dst, nbytes=e.nbytes)
        return g

    def summary(self) -> str:
        """One line: node, edge, op-type and workload counts, GFLOPs and parameter MB."""
        ops = {n.op_type for n in self.nodes}
        gflop = sum(n.flops for n in self.nodes) / 1e9
        mb = sum(n.param_bytes for n in self.nodes) / 1e6
        return (f"{len(self.nodes)} ops ({len(ops)} types, {len(self.workloads())} distinct "
                f"workloads), {len(self.edges)} edges, {gflop:.3f} GFLOP, {mb:.2f} MB parameters")


# ----------------------------------------------------------------------------- building

def iter_bindings(func) -> Iterator:
    """Every binding of a Relax function body, in order; rejects what the op graph cannot hold."""
    from tvm import relax

    body = func.body
    if not isinstance(body, relax.SeqExpr):
        raise UnsupportedModelError("the function body is not a sequence of bindings")
    for block in body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.MatchCast):
                raise UnsupportedModelError(
                    f"binding {binding.var.name!r} is a match_cast: dynamic shapes are not "
                    "supported; export the model with static input shapes")
            yield binding


def is_op_call(value) -> bool:
    """True for a call of a Relax operator (a node); False for aliases, tuples and constants."""
    from tvm import ir, relax

    return isinstance(value, relax.Call) and isinstance(value.op, ir.Op)


def torch_op_of(call):
    """The PyTorch op (:class:`autoplace.backend.torch_bridge.TorchOp`) a call of
    ``autoplace.torch_op.<id>`` runs, or None for any other call."""
    from tvm import relax

    from autoplace.backend.torch_bridge import PREFIX, lookup

    if call.op.name != "relax.call_pure_packed" or not call.args \
            or not isinstance(call.args[0], relax.ExternFunc) \
            or not call.args[0].global_symbol.startswith(PREFIX):
        return None
    op = lookup(call.args[0].global_symbol)
    if op is None:
        raise UnsupportedModelError(
            f"{call.args[0].global_symbol} calls a PyTorch op that this process has not "
            "registered: import the model with autoplace.from_torch in this process first")
    return op


def dtype_bits(dtype: str) -> int:
    """Bits of one element of ``dtype`` (``bool``: a byte)."""
    if dtype == "bool":
        return 8
    digits = "".join(ch for ch in dtype if ch.isdigit())
    if not digits:
        raise UnsupportedModelError(f"cannot size dtype {dtype!r}")
    return int(digits)


def _tensor_infos(ty, where: str) -> tuple[TensorInfo, ...]:
    """Flatten a tensor or tuple type into static TensorInfos."""
    from tvm import relax

    if isinstance(ty, relax.TupleType):
        return tuple(t for field_ty in ty.fields for t in _tensor_infos(field_ty, where))
    if not isinstance(ty, relax.TensorType):
        return ()
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        raise UnsupportedModelError(f"{where} has no static shape ({ty}): export the model with "
                                    "static shapes (torch.export without dynamic_shapes)")
    dims = []
    for d in ty.shape.values:
        if not hasattr(d, "value"):
            raise UnsupportedModelError(
                f"{where} has a symbolic dimension {d} ({ty}): only static shapes are supported")
        dims.append(int(d.value))
    return (TensorInfo(tuple(dims), str(ty.dtype)),)


def _py(value) -> Any:
    """Attribute values as plain JSON-able Python."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "value") and not hasattr(value, "shape"):
        return _py(value.value)
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [_py(v) for v in value]
    if type(value).__name__ == "Map" or isinstance(value, dict):
        return {str(k): _py(v) for k, v in value.items()}
    return str(value)


def _attrs(call) -> tuple[tuple[str, Any], ...]:
    if call.attrs is None:
        return ()
    fields = type(call.attrs).__tvm_ffi_type_info__.fields
    return tuple(sorted((f.name, _py(getattr(call.attrs, f.name))) for f in fields))


def _build(mod, func_name: str) -> OpGraph:
    from tvm import ir, relax

    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        names = [gv.name_hint for gv in mod.get_global_vars()]
        raise UnsupportedModelError(f"the module has no function {func_name!r} (it has {names})")
    func = mod[func_name]
    if not isinstance(func, relax.Function):
        raise UnsupportedModelError(f"{func_name!r} is not a Relax function")

    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    num_input = len(func.params) if num_input is None else int(num_input)
    # Where each variable's tensors come from: ("node", i) or ("input", k), per flattened tensor.
    sources: dict[Any, list[tuple[str, int, TensorInfo]]] = {}
    for k, p in enumerate(func.params):
        infos = _tensor_infos(p.ty, f"input {p.name!r}")
        sources[p] = [("input", k, t) for t in infos]

    nodes: list[dict] = []
    edges: dict[tuple[int, int], int] = {}
    consumers: dict[int, set[int]] = {k: set() for k in range(len(func.params))}
    names_seen: dict[str, int] = {}

    def arg_sources(expr, where):
        if isinstance(expr, relax.Var):
            if expr not in sources:
                raise UnsupportedModelError(f"{where} reads {expr.name!r}, which is not bound")
            return list(sources[expr])
        if isinstance(expr, relax.Tuple):
            return [s for f in expr.fields for s in arg_sources(f, where)]
        if isinstance(expr, ir.expr.Constant):
            return [("const", -1, t) for t in _tensor_infos(expr.ty, where)]
        return []

    for binding in iter_bindings(func):
        var, value = binding.var, binding.value
        where = f"binding {var.name!r}"
        if is_op_call(value):
            torch_op = torch_op_of(value)
            if torch_op is None and value.op.name in ("relax.call_dps_packed",
                                                      "relax.call_tir_inplace",
                                                      "relax.call_pure_packed"):
                raise UnsupportedModelError(
                    f"{where} is a {value.op.name}, which cannot be placed: pass the module "
                    "before it is lowered (as the torch and ONNX frontends produce it)")
            ins, scalars, extra, param_bytes, preds = [], [], [], 0, {}
            for a in (value.args if torch_op is None else value.args[1:]):
                srcs = arg_sources(a, where)
                if not srcs and not isinstance(a, relax.Var):  # a tuple of numbers too
                    extra.append(a.name_hint if isinstance(a, ir.GlobalVar) else str(a))
                for kind, idx, t in srcs:
                    ins.append(t)
                    scalars.append(_scalar(a))
                    if kind == "node":
                        preds[idx] = preds.get(idx, 0) + t.nbytes
                    elif kind == "const" or idx >= num_input:
                        param_bytes += t.nbytes
                    if kind == "input":
                        consumers[idx].add(len(nodes))
            if torch_op is None:
                outs, op_name, attrs = _tensor_infos(var.ty, where), value.op.name, _attrs(value)
            else:  # its example shapes, where they depend on the data
                outs = tuple(TensorInfo(tuple(s), d) for s, d in torch_op.outputs)
                op_name = f"torch.{torch_op.aten}"
                attrs = (("call", torch_op.signature), ("why", torch_op.why))
            i = len(nodes)
            name = var.name
            if name in names_seen:  # Relax allows repeated name hints; node names must be unique
                names_seen[name] += 1
                name = f"{name}_{names_seen[var.name]}"
            names_seen.setdefault(name, 0)
            in_shapes = [t.shape for t in ins]
            nodes.append(dict(
                index=i, name=name, op=op_name, inputs=tuple(ins), outputs=outs, attrs=attrs,
                extra_args=tuple(extra), param_bytes=param_bytes, scalars=tuple(scalars),
                flops=count_flops(op_name, in_shapes, [t.shape for t in outs], dict(attrs))))
            for src, nbytes in preds.items():
                edges[(src, i)] = nbytes
            sources[var] = [("node", i, t) for t in outs]
        elif isinstance(value, relax.Call):
            raise UnsupportedModelError(
                f"{where} calls {value.op}: calls to other functions are not supported; "
                "inline them (relax.transform.InlinePrivateFunctions) or pass a single-function module")
        elif isinstance(value, relax.If):
            raise UnsupportedModelError(f"{where} is an if/else: control flow is not supported")
        elif isinstance(value, relax.TupleGetItem):
            srcs = arg_sources(value.tuple_value, where)
            sources[var] = srcs[value.index:value.index + 1] if len(srcs) > 1 else srcs
        else:  # aliases, tuples, constants
            sources[var] = arg_sources(value, where)

    outputs = {idx for kind, idx, _ in arg_sources(func.body.body, "the return value") if kind == "node"}
    op_nodes = tuple(OpNode(**n, is_output=n["index"] in outputs) for n in nodes)
    graph_inputs = tuple(
        GraphInput(p.name, sources[p][0][2] if sources[p] else TensorInfo((), "float32"),
                   k >= num_input, tuple(sorted(consumers[k])))
        for k, p in enumerate(func.params))
    edge_list = tuple(Edge(s, d, b) for (s, d), b in sorted(edges.items()))
    return OpGraph(op_nodes, edge_list, graph_inputs, func_name, {n.name: n.index for n in op_nodes})


def _scalar(expr) -> float | None:
    """The value of ``expr`` where it is a constant of one element, else None."""
    from tvm import ir

    if not isinstance(expr, ir.expr.Constant):
        return None
    value = expr.value.numpy()
    return float(value.reshape(-1)[0]) if value.size == 1 else None
