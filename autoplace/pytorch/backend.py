"""A ``torch.compile`` backend: each graph Dynamo hands over is exported, placed with
:func:`autoplace.optimize`, built, and run on torch tensors through DLPack, or, where it measured
faster than the build, run as Dynamo gave it or by ONNX Runtime."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from autoplace.api import optimize
from autoplace.devices import Device
from autoplace.frontends import export_torch, from_exported
from autoplace.pytorch.contenders import contend, time_eager
from autoplace.pytorch.module import AutoplaceModule, TensorSpec, build_of, default_devices

log = logging.getLogger(__name__)


class NotImported(Exception):
    """Why a graph runs in PyTorch rather than through autoplace."""


@dataclass(frozen=True)
class GraphRecord:
    """What the backend did with one graph (one record per build of a graph built per shape):
    its module (the plan, ``.summary()``), or, for a graph left to PyTorch, why; neither for a
    graph that computes nothing (its outputs are its inputs)."""

    ops: int
    module: AutoplaceModule | None = None
    fallback: str | None = None


class AutoplaceBackend:
    """The backend :func:`dynamo_backend` returns: call it as Dynamo does, ``backend(gm,
    example_inputs)``. :attr:`graphs` records each graph it was given, in order."""

    def __init__(self, devices: Sequence[Device] | None = None, *, strict: bool = False,
                 eager_fallback: bool = True, torch_compile: bool | None = None,
                 **optimize_kwargs):
        self.devices = None if devices is None else list(devices)
        self.strict = strict
        self.eager_fallback = eager_fallback
        self.torch_compile = torch_compile
        self.optimize_kwargs = optimize_kwargs
        self.graphs: list[GraphRecord] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence):
        ops = sum(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)
        try:
            fn, record = self._compile(gm, list(example_inputs), ops)
        except Exception as e:
            if self.strict:
                raise
            why = _why(e)
            log.warning("autoplace: a graph of %d ops runs in PyTorch: %s", ops, why)
            self.graphs.append(GraphRecord(ops, fallback=why))
            return gm.forward
        if record is not None:  # a graph built per shape is recorded at each build
            self.graphs.append(record)
        return fn

    def _compile(self, gm, example_inputs, ops):
        """The function Dynamo calls for ``gm``, and its record (None for a graph built per
        shape, when first called with it)."""
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(example_inputs) or not all(
                isinstance(a, (torch.Tensor, int, torch.SymInt)) for a in example_inputs):
            raise NotImported("an input of the graph is neither a tensor nor an integer")
        if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in example_inputs):
            raise NotImported("gradients are on and the graph's inputs require them: autoplace "
                              "builds inference only (call the model under torch.no_grad() or "
                              "torch.inference_mode())")
        weights = [k for k, t in enumerate(example_inputs)
                   if isinstance(t, torch.Tensor) and _is_weight(t)]
        scalars = [k for k, a in enumerate(example_inputs) if not isinstance(a, torch.Tensor)]
        user = [k for k in range(len(example_inputs)) if k not in set(weights) | set(scalars)]
        outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        as_tuple = isinstance(outputs, (tuple, list))
        flat = list(outputs) if as_tuple else [outputs]
        index = {n: k for k, n in enumerate(placeholders)}
        storages = {_storage(n) for n in placeholders} - {None}
        picks, computed = [], []  # per output: ("input", k), ("call", j) or ("value", v)
        for node in flat:
            if node in index:
                picks.append(("input", index[node]))
            elif isinstance(node, torch.fx.Node):
                value = node.meta.get("example_value")  # Dynamo's; absent on other graphs
                if value is not None and not isinstance(value, torch.Tensor):
                    raise NotImported(f"output {node.name} is not a tensor")
                if _storage(node) in storages:
                    raise NotImported(f"output {node.name} is a view of an input: built, it would "
                                      f"be a copy")
                picks.append(("call", len(computed)))
                computed.append(flat.index(node))
            else:
                picks.append(("value", node))
        out_type = type(outputs) if as_tuple else None

        def assemble(made, args):
            out = [made[v] if how == "call" else args[v] if how == "input" else v
                   for how, v in picks]
            return out_type(out) if out_type is not None else out[0]

        def build(args) -> AutoplaceModule:
            wrapper = _Frozen(gm, args, weights, scalars, user, computed)
            eager = _Frozen(gm, args, weights, scalars, user, computed, as_dynamo=True)
            inputs = [args[k] for k in user]
            eager_s, note = time_eager(eager, inputs) if self.eager_fallback else (None, "")
            exported = export_torch(wrapper, inputs)
            sig = exported.graph_signature
            if sig.buffers_to_mutate or sig.user_inputs_to_mutate:
                raise NotImported("the graph writes into its inputs or buffers")
            res = optimize(from_exported(exported),
                           self.devices if self.devices is not None else default_devices(
                               self.optimize_kwargs.get("objective", "latency")),
                           **self.optimize_kwargs)
            module = AutoplaceModule(build_of(res), [TensorSpec.of(t) for t in inputs],
                                     result=res)
            if eager_s is not None:
                contend(module, eager, inputs, eager_s, note, onnx_source=wrapper,
                        torch_compile=self.torch_compile)
            return module

        if not computed:  # every output is an input or a constant
            return (lambda *args: assemble((), args)), GraphRecord(ops)
        if not scalars and not any(_symbolic(n) for n in placeholders):
            module = build(example_inputs)
            if module.runs == "eager":
                return gm.forward, GraphRecord(ops, module=module)
            run_flat = module.call_flat
            return ((lambda *args: assemble(run_flat([args[k] for k in user]), args)),
                    GraphRecord(ops, module=module))
        return self._per_shape(gm, ops, user, scalars, build, assemble), None

    def _per_shape(self, gm, ops, user, scalars, build, assemble):
        """Dynamo passes sizes as inputs (it does on a frame it compiles again, its automatic
        dynamic shapes): a build per set of sizes, made when first called with them, up to
        :data:`MAX_SHAPES`; others run in PyTorch."""
        builds = {}

        def compiled(*args):
            key = (tuple(tuple(args[k].shape) for k in user)
                   + tuple(int(args[k]) for k in scalars))
            run_flat = builds.get(key)
            if run_flat is None:
                run_flat = builds[key] = self._build_for(gm, ops, key, args, build,
                                                         len(builds) >= MAX_SHAPES)
            if run_flat is _IN_PYTORCH:
                return gm.forward(*args)
            return assemble(run_flat([args[k] for k in user]), args)

        return compiled

    def _build_for(self, gm, ops, key, args, build, full: bool):
        if full:
            log.warning("autoplace: a graph of %d ops runs in PyTorch for sizes %s: it was "
                        "built for %d others already", ops, key, MAX_SHAPES)
            return _IN_PYTORCH
        try:
            module = build(args)
        except Exception as e:
            if self.strict:
                raise
            why = _why(e)
            log.warning("autoplace: a graph of %d ops runs in PyTorch for sizes %s: %s",
                        ops, key, why)
            self.graphs.append(GraphRecord(ops, fallback=why))
            return _IN_PYTORCH
        self.graphs.append(GraphRecord(ops, module=module))
        return _IN_PYTORCH if module.runs == "eager" else module.call_flat


#: Builds of one graph Dynamo passes sizes to, one per set of sizes, before it runs in PyTorch.
MAX_SHAPES = 8
_IN_PYTORCH = object()  # a set of sizes whose graph runs in PyTorch


def _why(e: Exception) -> str:
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return first if isinstance(e, NotImported) else f"{type(e).__name__}: {first}"


def _symbolic(node) -> bool:
    value = node.meta.get("example_value")
    return isinstance(value, torch.Tensor) and not all(isinstance(n, int) for n in value.shape)


def _with_reference_ops(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or a copy of it where PyTorch's fused inference kernels that TVM's importer lacks
    are written out in plain ops (``nn.TransformerEncoderLayer``'s fast path)."""
    fused = [n for n in gm.graph.nodes if n.op == "call_function"
             and n.target in (torch._transformer_encoder_layer_fwd,
                              torch.ops.aten._transformer_encoder_layer_fwd.default)]
    if not fused:
        return gm
    graph = copy.deepcopy(gm.graph)
    for node in graph.nodes:
        if node.op == "call_function" and node.target in (
                torch._transformer_encoder_layer_fwd,
                torch.ops.aten._transformer_encoder_layer_fwd.default):
            node.target = _encoder_layer
    return torch.fx.GraphModule(gm, graph)


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                   use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2,
                   norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None,
                   mask_type=None):
    """What ``torch._transformer_encoder_layer_fwd`` computes (batch first, no mask), in ops
    TVM imports."""
    if mask is not None:
        raise NotImported("an nn.TransformerEncoderLayer with a mask took PyTorch's fused path")
    F = torch.nn.functional
    b, s, e = src.shape
    h = num_heads

    def attend(x):
        q, k, v = (F.linear(x, qkv_weight, qkv_bias).reshape(b, s, 3, h, e // h)
                   .permute(2, 0, 3, 1, 4))
        att = torch.softmax(q @ k.transpose(-2, -1) / (e // h) ** 0.5, dim=-1)
        return F.linear((att @ v).transpose(1, 2).reshape(b, s, e), proj_weight, proj_bias)

    def feed(x):
        act = F.gelu if use_gelu else F.relu
        return F.linear(act(F.linear(x, ffn_weight_1, ffn_bias_1)), ffn_weight_2, ffn_bias_2)

    def norm(x, w, bias):
        return F.layer_norm(x, (e,), w, bias, eps)

    if norm_first:
        x = src + attend(norm(src, norm_weight_1, norm_bias_1))
        return x + feed(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attend(src), norm_weight_1, norm_bias_1)
    return norm(x + feed(x), norm_weight_2, norm_bias_2)


class _Frozen(torch.nn.Module):
    """A Dynamo graph with its weights held as buffers (exported as constants), its sizes as
    the numbers of one call, and only the outputs it computes: what
    :func:`frontends.export_torch` exports, or, ``as_dynamo``, the graph as Dynamo gave it
    (PyTorch's fused kernels kept): the eager contender. In eval mode."""

    def __init__(self, gm, args, weights, scalars, user, outputs, *, as_dynamo: bool = False):
        super().__init__()
        self.gm = gm if as_dynamo else _with_reference_ops(gm)
        self.training = False  # as the graph was traced (the wrapper's own flag; gm's kept)
        self._user, self._outputs, self._n = user, outputs, len(args)
        self._scalars = {k: int(args[k]) for k in scalars}
        self._weights = weights
        for k in weights:
            self.register_buffer(f"w{k}", args[k].detach())

    def forward(self, *inputs):
        args = [None] * self._n
        for k in self._weights:
            args[k] = getattr(self, f"w{k}")
        for k, v in self._scalars.items():
            args[k] = v
        for k, x in zip(self._user, inputs):
            args[k] = x
        out = self.gm(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        return tuple(out[j] for j in self._outputs)


def _is_weight(t: torch.Tensor) -> bool:
    """Whether Dynamo passes ``t`` as a module's parameter or buffer (a static input)."""
    from torch._dynamo.utils import get_static_address_type

    return isinstance(t, torch.nn.Parameter) or get_static_address_type(t) is not None


def _storage(node):
    value = node.meta.get("example_value")
    if not isinstance(value, torch.Tensor):
        return None
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(value.untyped_storage())
    except Exception:  # noqa: BLE001 - a tensor without storage (sparse, nested): no view
        return None


def dynamo_backend(devices: Sequence[Device] | None = None, *, strict: bool = False,
                   eager_fallback: bool = True, torch_compile: bool | None = None,
                   **optimize_kwargs) -> AutoplaceBackend:
    """A ``torch.compile`` backend that places and builds every graph with autoplace.

    >>> fast = torch.compile(model.eval(), backend=autoplace.dynamo_backend())  # doctest: +SKIP
    >>> with torch.no_grad():                                                  # doctest: +SKIP
    ...     y = fast(x)

    ``backend="autoplace"`` is the same with every default. Each graph is built for the static
    shapes of the inputs it was first called with; other shapes make Dynamo compile again, as
    its guards decide. A module's weights are copied into the build as constants (as
    Inductor's ``freezing`` does): change them and call ``torch._dynamo.reset()``. Graphs run
    inference only (under ``torch.no_grad()`` or ``torch.inference_mode()``); graph breaks run
    in PyTorch, as Dynamo does.

    A graph autoplace cannot import or build (an op TVM's importer lacks, gradients on, a
    graph that writes into its inputs or returns a view of one) runs in PyTorch, with one
    logged warning saying why; ``strict=True`` raises instead. The backend's ``.graphs`` says
    what it did with each graph.

    Each graph's build is timed in blocks in turn against the graph run as Dynamo gave it, ONNX
    Runtime on the graph (where onnxruntime is installed) and the graph compiled by Inductor
    with freezing (``torch_compile``), and the fastest of those that beat the build by their
    margin runs (``optimize_module``'s contenders: ``record.module.runs`` and ``.summary()``
    say which).

    Parameters
    ----------
    devices : sequence of Device, optional
        Where ops may run. Default: this machine's CPU, its GPU where TVM sees one, and the
        runtimes installed here (PyTorch's kernels, ONNX Runtime's):
        :func:`~autoplace.pytorch.module.default_devices`.
    strict : bool
        Raise instead of running a graph in PyTorch.
    eager_fallback : bool
        Time the contenders and run the fastest; False: run every build, timing nothing.
    torch_compile : bool, optional
        Compile each graph with Inductor (frozen) as a contender: True always, False never;
        by default, where ONNX Runtime on the graph is not a contender
        (:func:`~autoplace.pytorch.module.optimize_module`).
    **optimize_kwargs
        Passed to :func:`autoplace.optimize` for every graph: ``objective``, ``cost_model``,
        ``db`` (tuned records), ``solver``, ...
    """
    return AutoplaceBackend(devices, strict=strict, eager_fallback=eager_fallback,
                            torch_compile=torch_compile, **optimize_kwargs)


def autoplace_backend(gm: torch.fx.GraphModule, example_inputs: Sequence, *, options=None,
                      mode=None):
    """``torch.compile(model, backend="autoplace")``: :func:`dynamo_backend` with its defaults
    (registered under the ``torch_dynamo_backends`` entry point), or with
    ``options={"devices": [...], "strict": True, "torch_compile": True, "db": ...}`` (its
    arguments). ``mode`` has no meaning here and is refused unless ``"default"``."""
    if mode not in (None, "default"):
        raise ValueError(f"torch.compile mode {mode!r}: the autoplace backend has no modes; "
                         "pass its settings as options={...} (devices, strict, objective, db, "
                         "...)")
    return AutoplaceBackend(**(options or {}))(gm, example_inputs)
