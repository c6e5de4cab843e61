"""A PyTorch module that runs an autoplace build: torch tensors in and out through DLPack, the
plan it runs beside it, and a file that loads without tuning or building again."""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree
import tvm
import tvm_ffi

from autoplace.frontends import export_torch, from_exported
from autoplace._version import __version__
from autoplace.annotate import vm_devices
from autoplace.api import optimize
from autoplace.report.result import (COMPILED, EAGER, ONNXRUNTIME, OptimizeResult,
                                     with_measured_baseline)
from autoplace.backend.ort_segments import (level_parts, level_text, onnx_export, own_run,
                                             session, thread_options)
from autoplace.backend.tensors import ALIGN, InputSlot
from autoplace.backend.timing import BEHIND
from autoplace.backend.torch_bridge import called, missing
from autoplace.devices import Device, local_devices
from autoplace.plan import Plan
from autoplace.run import CompiledModel, compile
from autoplace.run.compile import call_vm, pytorch_call_threads
from autoplace.run.overhead import blocks_s, turns_s

log = logging.getLogger(__name__)

#: The layout of a saved module's file; a file of another layout is refused.
FORMAT = 2  # 2: the ONNX graph of a module that runs ONNX Runtime ("runs", "model.onnx")


class ModuleFileError(ValueError):
    """A file :func:`load_module` cannot load: not a saved module, or saved by another version of
    autoplace or TVM (whose build this one cannot run)."""


@dataclass(frozen=True)
class TensorSpec:
    """What a build takes for one input: shape, dtype (a torch dtype's name, ``"float32"``) and
    the caller's device (``"cpu"``, ``"cuda:0"``)."""

    shape: tuple[int, ...]
    dtype: str
    device: str

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSpec:
        return cls(tuple(int(n) for n in t.shape), str(t.dtype).removeprefix("torch."),
                   str(t.device))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}] on {self.device}"


def default_devices(objective: str = "latency") -> list[Device]:
    """This machine's CPU, its first GPU where TVM sees one, and, for a latency plan, the
    runtime devices installed here (PyTorch's kernels; ONNX Runtime's where it is installed):
    :func:`autoplace.devices.local_devices`."""
    return local_devices(runtimes=objective == "latency")


#: The build is kept unless the model in PyTorch measured faster than this fraction of it.
EAGER_MARGIN = 0.97


def margin(contender: str, plan: Plan) -> float:
    """The fraction of the build's time ``contender`` must measure below to run instead of
    the build of ``plan``: :data:`EAGER_MARGIN`; for ONNX Runtime on the whole model, 1 where
    the plan runs ops on an ORT device, and ``1 / EAGER_MARGIN`` where it runs every op there
    (the build must beat ORT by the margin eager must beat the build by). Those segments run
    the same model's ops on the same runtime, fused no more than on the whole model, with the
    VM's calls between them: where ORT on the whole model measures as fast, it runs that work
    with less around it; where the build is that one runtime alone, it is the plainer one
    that a measured tie goes to."""
    if contender == ONNXRUNTIME:
        used = plan.used_devices()
        if all(d.runtime == "ort" for d in used):
            return 1 / EAGER_MARGIN
        if any(d.runtime == "ort" for d in used):
            return 1.0
    return EAGER_MARGIN


def optimize_module(model: torch.nn.Module, example_inputs, devices: Sequence[Device] | None = None,
                    *, eager_fallback: bool = True, torch_compile: bool | None = None,
                    **optimize_kwargs) -> AutoplaceModule:
    """Export ``model``, place and build it with :func:`autoplace.optimize`, and return a module
    that runs the build on torch tensors.

    The build is for the static shapes, dtypes and device of ``example_inputs`` (a tensor or a
    sequence of tensors); weights are copied into it as constants (later changes to the model's
    weights are not seen) and it computes no gradients. ``devices`` defaults to this machine's
    CPU, its GPU where TVM sees one, and the runtimes installed here (PyTorch's kernels, and
    ONNX Runtime's where onnxruntime is: :func:`default_devices`), so that the plan mixes them
    per op by cost; ``optimize_kwargs`` go to :func:`autoplace.optimize`
    (``objective``, ``cost_model``, ``db``, ...). The model's training mode is left as it was.

    The whole-model alternatives a PyTorch user has are contenders (:func:`contend`): the
    model's own eager call (timed before anything is built, and again beside the build), ONNX
    Runtime on the model exported to ONNX where onnxruntime is installed and the inputs are on
    the CPU (at the graph optimization level that measured faster here), and the model compiled
    by ``torch.compile`` with Inductor's freezing: with ``torch_compile=True``, or by default
    where ONNX Runtime on the whole model is not among them (not installed, inputs off the CPU,
    an export that fails), its compile taking about what Inductor's takes alone. They are timed
    with the build in blocks in turn, recorded among the baselines, and where one of a model in
    eval mode ran faster than the build by more than 3 % (ONNX Runtime: by its :func:`margin`),
    the module runs the fastest instead (``module.runs`` is ``"eager"``, ``"onnxruntime"`` or
    ``"torch.compile"``; ``summary()`` gives the times). A contender that fails to export, build
    or compile, or whose outputs differ from eager's, is left out with a warning saying why.
    ``eager_fallback=False`` keeps the build whatever it measured, and times no contender. The
    build's outputs are checked against eager's on the example inputs first: where they differ
    (relative error above :data:`MISMATCH`), a warning says so, and the module runs the model
    eagerly unless ``eager_fallback=False`` or the model is in training mode.

    >>> m = autoplace.optimize_module(model.eval(), (x,))     # doctest: +SKIP
    >>> y = m(x)                                               # a torch tensor
    >>> print(m.summary())                                     # the plan, as optimize() says
    >>> m.save("model.apmod"); m2 = autoplace.load_module("model.apmod")
    """
    inputs = _tensors(example_inputs)
    t = time.perf_counter()
    eager_s, note = _eager_s(model, inputs)  # first: TVM's pool would slow PyTorch down
    exported = export_torch(model, inputs)
    mod = from_exported(exported)
    took = {"eager timed, exported and imported": time.perf_counter() - t}
    res = optimize(mod, list(devices) if devices is not None else default_devices(
        optimize_kwargs.get("objective", "latency")), **optimize_kwargs)
    t = time.perf_counter()
    build = build_of(res)
    took["build"] = time.perf_counter() - t
    module = AutoplaceModule(build, [TensorSpec.of(t) for t in inputs],
                             exported.call_spec.out_spec, result=res)
    if eager_s is not None:
        t = time.perf_counter()
        contend(module, model, inputs, eager_s, note, eager_fallback=eager_fallback,
                torch_compile=torch_compile)
        took["contenders"] = time.perf_counter() - t
    first = "eager timed, exported and imported"
    module.result = replace(module.result, steps_s={
        first: took.pop(first), **module.result.steps_s, **took})
    return module


def contend(module: AutoplaceModule, model, inputs: Sequence[torch.Tensor], eager_s: float,
            note: str, *, eager_fallback: bool = True, torch_compile: bool | None = None,
            onnx_source=None) -> None:
    """Check ``module``'s build against ``model`` run eagerly on ``inputs`` and time it against
    the whole-model alternatives a PyTorch user has, making ``module`` run the fastest of
    those that beat the build by their :func:`margin` (:meth:`AutoplaceModule.run_eagerly`).

    ``eager_s``: eager's seconds a call, timed before the build (``note``: how), recorded among
    the baselines. A build whose outputs differ from eager's is replaced by eager (unless
    ``eager_fallback`` is False or the model is in training mode). The contenders, timed in
    blocks in turn with the build (:func:`_blocks`): eager; ONNX Runtime on the whole model where
    onnxruntime is installed (:func:`_onnxruntime`; ``onnx_source``, what computes the same
    as ``model``, is exported where given), at each graph optimization level and intra-op
    thread count (:func:`ort_threads`) in the same rounds, the fastest kept; and Inductor with
    freezing (:func:`_compiled`) where ``torch_compile`` is True, or None and ORT is not among
    them. Each is recorded among the result's baselines.
    ``eager_fallback=False`` keeps the build and times no contender."""
    module.result = with_measured_baseline(module.result, EAGER, eager_s, note)
    error = _output_error(module.run_flat, model, inputs)
    if error is not None and error > MISMATCH:
        fallback = eager_fallback and not model.training
        log.warning("the build's outputs differ from the model's eager outputs on the example "
                    "inputs (relative error %.2g)%s", error,
                    ": running the model eagerly" if fallback else "")
        if fallback:
            module.run_eagerly(model, {}, reason=f"the build's outputs differed from eager's "
                                                 f"(relative error {error:.2g})")
        return
    if not eager_fallback or model.training:
        return
    rivals, notes = {EAGER: model}, {}
    variants = _onnxruntime(model, inputs, onnx_source, disabled_fusions(module.result)) or {}
    # By default Inductor only where ORT is no contender: ORT on the whole model ran every model
    # measured so far faster than frozen Inductor (docs/results.md, "Frozen torch.compile among
    # the contenders"), and Inductor's compile can double the time to the first output.
    if torch_compile or (torch_compile is None and not variants):
        compiled = _compiled(model, inputs)
        if compiled is not None:
            rivals[COMPILED] = compiled
            notes[COMPILED] = "Inductor, frozen (freezing=True)"
    # ORT's levels and thread counts are timed in the same rounds, the fastest kept.
    times = _blocks({"build": module, **rivals,
                     **{_variant_name(k): s for k, s in variants.items()}}, inputs)
    ort_s = {k: times.pop(_variant_name(k)) for k in variants if _variant_name(k) in times}
    if ort_s:
        fastest = min(ort_s, key=ort_s.get)
        rivals[ONNXRUNTIME], times[ONNXRUNTIME] = variants[fastest], ort_s[fastest]
        others = ", ".join(f"{v * 1e3:.4g} ({_variant_text(k)})"
                           for k, v in ort_s.items() if k != fastest)
        notes[ONNXRUNTIME] = (f"the model exported to ONNX, CPU execution provider, "
                              f"{_variant_text(fastest)}: {ort_s[fastest] * 1e3:.4g} ms a call "
                              f"here against {others or 'no other variant'}")
    for name, how in notes.items():
        if name in times:
            module.result = with_measured_baseline(
                module.result, name, times[name],
                f"measured here, in blocks in turn with the build and eager, not predicted; "
                f"{how}")
    timed = [name for name in rivals if name in times]
    beat = [name for name in timed if times[name] < margin(name, module.plan) * times["build"]]
    if beat:
        best = min(beat, key=times.get)
        module.run_eagerly(_serving(rivals[best]), times, best)
    elif timed:
        module.keep_build(times)


def _serving(contender):
    """The contender as the module runs it: ONNX Runtime on several threads with its session's
    default wait (:class:`OrtModel`'s ``spin_after``). It was timed with its threads stopped
    after each call, so that they did not take the cores of the contender timed after it; run
    alone call after call, threads stopped cost each call their waking."""
    if not isinstance(contender, OrtModel) or contender.threads < 2 or contender.spin_after:
        return contender
    return contender.spinning_after()


#: Relative error of a build's floating outputs against eager PyTorch's above which the build
#: is taken as wrong (float32 builds differ by 1e-7 to 1e-5 on this project's models).
MISMATCH = 1e-2


def _output_error(run_flat, model: torch.nn.Module, inputs) -> float | None:
    """The largest relative L2 error of ``run_flat(inputs)`` (a list of tensors: a build's
    outputs, or a contender's flattened) against ``model`` run eagerly, over their floating
    outputs on ``inputs``; None where either raises or they do not pair up. (A model that draws
    random numbers differs too, and so runs eagerly.)"""
    training = model.training
    try:
        with torch.inference_mode():
            got = run_flat(inputs)
            want = pytree.tree_leaves(model.eval()(*inputs))  # as it was exported
    except Exception:  # noqa: BLE001 - a model the check cannot run is not checked
        return None
    finally:
        model.train(training)
    pairs = [(g, w) for g, w in zip(got, want) if isinstance(w, torch.Tensor)
             and w.dtype.is_floating_point and g.shape == w.shape]
    if len(got) != len(want) or not pairs:
        return None
    return max(float(torch.linalg.vector_norm((g - w).double())
                     / max(torch.linalg.vector_norm(w.double()), 1e-30)) for g, w in pairs)


def _compiled(model: torch.nn.Module, inputs):
    """``torch.compile(model)`` with Inductor's freezing (weights folded in as constants, as
    PyTorch advises for inference on a CPU) after its first call (which compiles it), or None
    where it fails or its outputs differ from eager's (a warning says why)."""
    from torch._inductor import config

    try:
        with config.patch(freezing=True):
            compiled = torch.compile(model)
            with torch.inference_mode():
                compiled(*inputs)
            _check_outputs(compiled, model, inputs)
    except Exception as e:  # noqa: BLE001 - Inductor fails in many ways (no C++ compiler...)
        log.warning("torch.compile of the model failed, so it is not among the baselines: %s",
                    _reason(e))
        return None
    return compiled


def _check_outputs(contender, model: torch.nn.Module, inputs) -> None:
    """Raise ValueError where ``contender``'s outputs on ``inputs`` differ from ``model``'s
    eager ones (:func:`_output_error` above :data:`MISMATCH`) or cannot be compared."""
    error = _output_error(lambda xs: pytree.tree_leaves(contender(*xs)), model, inputs)
    if error is None or error > MISMATCH:
        raise ValueError("its outputs could not be checked against eager's" if error is None
                         else f"its outputs differ from eager's (relative error {error:.2g})")


#: ONNX Runtime's graph optimization levels timed against each other on the whole model
#: (``ORT_ENABLE_ALL`` is not always the faster).
ORT_LEVELS = ("ORT_ENABLE_ALL", "ORT_ENABLE_EXTENDED")


def ort_threads() -> tuple[int, ...]:
    """The intra-op thread counts ONNX Runtime on the whole model is timed at: PyTorch's
    count (the threads the caller gives the model), and one where that is more
    (:func:`~autoplace.backend.ort_segments.thread_options`)."""
    return thread_options(torch.get_num_threads())


def _onnxruntime(model, inputs: Sequence[torch.Tensor], source=None,
                 disabled: Sequence[str] = ()) -> dict[tuple[str, int], OrtModel] | None:
    """ONNX Runtime on the whole ``model`` (exported from ``source`` where given), as a
    contender: per graph optimization level of :data:`ORT_LEVELS` and intra-op thread count
    of :func:`ort_threads`, a callable of torch tensors that returns what the model returns
    (:class:`OrtModel`); and where ``disabled`` names fusions of ORT's
    (:data:`~autoplace.backend.ort_segments.FUSIONS`), ``ORT_ENABLE_ALL`` without them too, at
    each thread count. None where onnxruntime is not installed or an input is not on the
    CPU, and None with one warning saying why where the export or a session fails or its
    outputs differ from eager's."""
    if any(x.device.type != "cpu" for x in inputs):
        return None
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    training = model.training
    try:
        with torch.inference_mode():
            spec = pytree.tree_structure(model.eval()(*inputs))
        onnx = onnx_bytes(model if source is None else source, inputs)
        levels = [*ORT_LEVELS, *(["-".join((ORT_LEVELS[0], *disabled))] if disabled else [])]
        sessions = {(level, t): OrtModel(onnx, level, spec, t)
                    for level in levels for t in ort_threads()}
        _check_outputs(next(iter(sessions.values())), model, inputs)
    except Exception as e:  # noqa: BLE001 - an exporter or a runtime that fails: no contender
        log.warning("ONNX Runtime on the whole model is not among the contenders: %s",
                    _reason(e))
        return None
    finally:
        model.train(training)
    return sessions


def disabled_fusions(result) -> tuple[str, ...]:
    """The fusions of ORT's that ``result``'s ONNX Runtime devices run without (measured slower
    on the model's largest segment, :func:`~autoplace.backend.ort_segments.fastest_variant`):
    ORT on the whole model is timed without them too."""
    from autoplace.predict.ort_costs import OrtCostModel

    models = getattr(result.predictor, "models", None) or {}
    off = [f for m in models.values() if isinstance(m, OrtCostModel)
           for f in level_parts(m.timings.level)[1]]
    return tuple(dict.fromkeys(off))


def _variant_name(variant: tuple[str, int]) -> str:
    """The name ORT at graph optimization level and thread count ``variant`` is timed under
    among the contenders."""
    return f"{ONNXRUNTIME} {_variant_text(variant)}"


def _variant_text(variant: tuple[str, int]) -> str:
    """``'ORT_ENABLE_ALL, 2 intra-op threads'``; ``'ORT_ENABLE_ALL without
    SkipLayerNormFusion, 1 intra-op thread'``."""
    level, threads = variant
    return f"{level_text(level)}, {threads} intra-op thread{'s' * (threads != 1)}"


def onnx_bytes(model, inputs: Sequence[torch.Tensor]) -> bytes:
    """``model`` exported to ONNX, its inputs named ``input0``, ``input1``, ... (quiet:
    :func:`autoplace.backend.ort_segments.onnx_export`)."""
    return onnx_export(model, inputs, input_names=[f"input{k}" for k in range(len(inputs))])


class OrtModel:
    """A model exported to ONNX (``onnx``, bytes) run by an ONNX Runtime session on this
    machine's CPU at graph optimization ``level`` (a name of ``GraphOptimizationLevel``),
    ``threads`` intra-op threads (default: PyTorch's count) and one inter-op thread: torch
    tensors in, the outputs as torch tensors sharing ORT's arrays, in ``out_spec``'s structure
    (a list where None). Its threads spin while a call runs and stop when it ends
    (:func:`~autoplace.backend.ort_segments.session`), or, with ``spin_after``, go on spinning
    for a while after it, as ORT's own sessions do by default: the next call starts sooner, and
    other work on those cores right after a call meets them. ``feeds``: per input the session
    reads (the exporter drops one the model does not), its name and the model input's index."""

    def __init__(self, onnx: bytes, level: str, out_spec=None, threads: int | None = None,
                 spin_after: bool = False):
        self.onnx, self.level, self._out_spec = onnx, level, out_spec
        self.threads = threads or torch.get_num_threads()
        self.spin_after = spin_after
        self._session = session(onnx, self.threads, level, spin_after=spin_after)
        # The exporter drops an input the model does not read: feed those it kept.
        self.feeds = [(i.name, int(i.name.removeprefix("input")))
                      for i in self._session.get_inputs()]
        self._names = [o.name for o in self._session.get_outputs()]
        self._run = own_run(self._session)  # a few us a call less than session.run
        self._tree = _tree_kind(out_spec)

    def spinning_after(self) -> OrtModel:
        """A new session of the same graph, level, outputs and threads, with ``spin_after``."""
        return OrtModel(self.onnx, self.level, self._out_spec, self.threads, spin_after=True)

    def __call__(self, *inputs: torch.Tensor):
        feeds = {}
        for name, k in self.feeds:
            t = inputs[k]
            if t.requires_grad or not t.is_contiguous():  # numpy() takes neither
                t = t.detach().contiguous()
            feeds[name] = t.numpy()
        outs = self._run(self._names, feeds, None)
        return _returned([torch.from_numpy(o) for o in outs], self._tree, self._out_spec)


def _against(times: dict[str, float], name: str) -> str:
    """``'1 ms a call here against build 2 ms, ... (timed in blocks in turn)'``: ``name``'s time in
    ``times`` (seconds) against the others'."""
    others = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in times.items() if k != name)
    return f"{times[name] * 1e3:.4g} ms a call here against {others} (timed in blocks in turn)"


def _reason(e: Exception) -> str:
    """An exception's last line, in at most 300 characters (its type where it says nothing)."""
    text = str(e).strip()
    return text.splitlines()[-1][:300] if text else type(e).__name__


def _blocks(contenders: dict, inputs, budget_s: float = 1.0, rounds: int = 5
            ) -> dict[str, float]:
    """Median seconds of a call of each of ``contenders`` (name -> callable) on ``inputs``,
    timed in blocks in turn (:func:`~autoplace.run.overhead.blocks_s`: ``rounds`` rounds of a
    block each, within about ``budget_s`` where calls are short, at least two timed calls a
    block where they are not), after a warm-up each: each timed as it runs called back to back,
    all through the same phases of the machine. One whose every block is as many times the
    fastest's slowest as :data:`~autoplace.backend.timing.BEHIND` says, after two rounds or
    three, is timed no more (it would not be chosen); where the fastest alone is left, the
    rounds end."""
    from autoplace.backend import settle

    fns = [functools.partial(fn, *inputs) for fn in contenders.values()]
    with torch.inference_mode():
        fns[0]()
        settle(max_s=1.0)  # TVM's idle workers spin for a while and slow PyTorch down
        for fn in fns[1:]:
            fn()
        medians, _ = blocks_s(fns, block_s=budget_s / (rounds * len(fns)), rounds=rounds,
                              drop_above=BEHIND)
    return dict(zip(contenders, medians))


def _eager_s(model: torch.nn.Module, inputs, budget_s: float = 0.5, most: int = 20):
    """Median seconds of ``model(*inputs)`` in eval and inference mode, at PyTorch's own
    thread count, over up to ``most`` calls or ``budget_s`` (after one warm-up), and how it
    was timed; (None, "") where the call raises or inputs are not on the CPU."""
    if any(x.device.type != "cpu" for x in inputs):
        return None, ""
    training = model.training
    try:
        with torch.inference_mode():
            model.eval()(*inputs)
            (median,), n = turns_s([functools.partial(model, *inputs)], most=most,
                                   budget_s=budget_s, least=3)
    except Exception:  # noqa: BLE001 - no baseline rather than no module
        return None, ""
    finally:
        model.train(training)
    return median, (f"measured here: median of {n} eager calls at {torch.get_num_threads()} "
                    "PyTorch threads, not predicted")


def build_of(res: OptimizeResult) -> CompiledModel:
    """``res.compile()`` on one VM (a plan of several devices whose delivery is concurrent is
    built on one VM instead: a module calls one build), close calls settled by running them."""
    run = res.compile(concurrent=False, trial=True)
    if not isinstance(run, CompiledModel):  # the trial kept a concurrent contender
        plan = run.plan
        run.close()
        run = compile(res.source_mod, plan, res.graph.func_name, records=res.records)
    return run


def _aligned_copy(t: torch.Tensor) -> tvm.runtime.Tensor:
    """A contiguous, 64-byte-aligned copy of ``t`` by PyTorch, as a TVM tensor: for what the
    buffer kept for an input cannot take (:func:`_into_slot`)."""
    return tvm.runtime.from_dlpack(t.clone(memory_format=torch.contiguous_format))


def _any_alignment(t: torch.Tensor) -> tvm.runtime.Tensor:
    """``t`` (contiguous) as a TVM tensor sharing its memory at whatever alignment it has: for
    an input that only other runtimes' calls read (a TVM kernel would assume 64 bytes)."""
    return tvm_ffi.from_dlpack(t, require_alignment=0, require_contiguous=True)


def _into_slot(slot: InputSlot, t: torch.Tensor) -> tvm.runtime.Tensor | None:
    """``t`` (on the CPU) copied into ``slot``'s buffer, by numpy on this thread (PyTorch's copy
    of a large tensor wakes PyTorch's threads, which then spin on the cores that the build's
    call after it needs), or None where numpy cannot read it (another device; a dtype numpy
    lacks, bfloat16)."""
    if t.device.type != "cpu":
        return None
    try:
        return slot.fill(t.numpy())
    except (TypeError, RuntimeError):
        return None


def _tensors(example_inputs) -> list[torch.Tensor]:
    if isinstance(example_inputs, (torch.Tensor, np.ndarray)):
        example_inputs = (example_inputs,)
    return [x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))
            for x in example_inputs]


class AutoplaceModule(torch.nn.Module):
    """A built plan as a ``torch.nn.Module``: ``forward`` takes torch tensors of the shapes,
    dtypes and device it was built for and returns what the model returned (a tensor, or the
    same tuple/list/dict structure), on the caller's device.

    Inputs reach the build without a copy (DLPack; a tensor that is not contiguous, or not
    64-byte aligned where a TVM kernel reads it, is copied first, and so is one whose device the
    plan runs elsewhere), and the outputs are the build's own tensors, shared with torch, not
    copied. Calls from several threads take turns (TVM's VM runs one call at a time). Inference
    only: no gradients flow through it.

    Attributes
    ----------
    plan : Plan
        The plan its build runs.
    result : OptimizeResult or None
        What :func:`autoplace.optimize` found (None for a module read by :func:`load_module`).
    inputs : tuple of TensorSpec
        What each input must be.
    times : dict of str to float
        Seconds a call of the build (``"build"``) and of each contender measured, timed turn by
        turn (:func:`contend`); empty where none was timed.
    """

    def __init__(self, build, inputs: Sequence[TensorSpec], out_spec=None, *,
                 result: OptimizeResult | None = None, _saved: dict | None = None):
        super().__init__()
        self._build = build
        self.plan: Plan = build.plan
        self.result = result
        self.inputs = tuple(inputs)
        self._out_spec = out_spec
        self._saved = _saved  # a loaded module's library bytes and constants, to save again
        # Per input: what it must be, and where the build wants it where that is not where
        # DLPack leaves the caller's tensor (a plan's first op on another device, or CPU
        # index): it is copied there.
        self._checks = [(torch.Size(s.shape), getattr(torch, s.dtype), torch.device(s.device),
                         None if _tvm_device(s.device) == d else d)
                        for s, d in zip(self.inputs, build.input_devices)]
        devs = {s.device for s in self.inputs}
        self._home = _tvm_device(devs.pop() if len(devs) == 1 else "cpu")
        self._tree = _tree_kind(out_spec)
        self._outs_home = False  # whether the outputs were all on the caller's device
        self._lock = threading.Lock()  # TVM's VM runs one call at a time
        self._slots = [InputSlot(tvm.cpu(0)) for _ in self.inputs]  # run_flat's copies
        # Per input: whether only other runtimes read it (unaligned memory is not copied).
        self._loose = build.runtime_inputs or (False,) * len(self.inputs)
        self._eager = None  # the contender calls run instead of the build (run_eagerly)
        self._runs, self._runs_note = "build", ""  # what calls run (runs), and why
        self.times: dict[str, float] = {}

    @property
    def runs_note(self) -> str:
        """What calls run and why, in words, as :meth:`summary` ends (ONNX Runtime's graph
        optimization level and threads where it runs); ``""`` before anything was timed."""
        return self._runs_note

    @property
    def ort_variant(self) -> tuple[str, int] | None:
        """Where calls run ONNX Runtime on the whole model, its graph optimization level and
        intra-op thread count (``("ORT_ENABLE_ALL", 1)``); None where they run anything else."""
        return (self._eager.level, self._eager.threads) if self._runs == ONNXRUNTIME else None

    @property
    def runs(self) -> str:
        """``"build"``: calls run the plan's build; ``"eager"``, ``"torch.compile"`` or
        ``"onnxruntime"``: they run the model in PyTorch, eagerly or compiled, or the model
        exported to ONNX in ONNX Runtime, which measured faster here (:func:`optimize_module`)."""
        return self._runs

    def run_eagerly(self, model, times: dict[str, float], name: str = EAGER,
                    reason: str = "") -> None:
        """From now on, calls run ``model`` (a contender, ``name``: the model eager or compiled,
        under ``torch.inference_mode`` as it was timed, its outputs inference tensors; or an
        :class:`OrtModel`) rather than the build; ``times``: seconds a call each contender
        measured (``"build"`` among them), or ``reason``, why, in words."""
        self._eager, self._runs, self.times = model, "eager" if name == EAGER else name, times
        why = reason or (f"it measured {_against(times, name)}; "
                         f"{times['build'] / times[name]:.2f}x the build's speed")
        how = f" ({_variant_text((model.level, model.threads))})" \
            if isinstance(model, OrtModel) else ""
        self._runs_note = f"runs {name}{how}: {why}; the build is kept for save()"

    def keep_build(self, times: dict[str, float]) -> None:
        """Say in :meth:`summary` that calls run the build, which measured ``times["build"]``
        seconds a call against the other contenders' ``times`` (by less than the margin, or
        faster)."""
        self.times = times
        self._runs_note = f"runs the build: it measured {_against(times, 'build')}"

    # ------------------------------------------------------------------------------ calling

    def forward(self, *inputs: torch.Tensor):
        if self._eager is not None:
            if type(self._eager) is OrtModel:  # one shape; no autograd to turn off
                if len(inputs) == len(self._eager.feeds) == len(self._checks):
                    try:  # ORT rejects what the build does not take; _check says why
                        return self._eager(*inputs)
                    except Exception:
                        self._check(inputs)
                        raise
                self._check(inputs)
                return self._eager(*inputs)
            if torch.is_inference_mode_enabled():  # entering it again costs a few us a call
                return self._eager(*inputs)
            with torch.inference_mode():
                return self._eager(*inputs)
        return _returned(self.run_flat(inputs), self._tree, self._out_spec)

    def run_flat(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The build's outputs, flat, as torch tensors on the caller's device (the DLPack
        capsule handed over directly: half the time of ``torch.from_dlpack`` on the tensor).
        A CPU input that is not contiguous, or not 64-byte aligned where a TVM kernel reads it
        (only ONNX Runtime segments and PyTorch calls do not care), is copied into a buffer kept
        for that input from call to call (a new buffer each call costs the next kernels its
        cache misses, and ORT's sessions more); an output that shares it is copied out."""
        if len(inputs) != len(self._checks):
            raise TypeError(f"expected {len(self._checks)} inputs "
                            f"({'; '.join(map(str, self.inputs))}), got {len(inputs)}")
        with self._lock:
            args, kept = [], []
            for t, (shape, dtype, device, move), slot, loose in zip(inputs, self._checks,
                                                                    self._slots, self._loose):
                if not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.shape != shape \
                        or t.device != device:
                    raise self._mismatch(len(args), t)
                if t.requires_grad:
                    t = t.detach()
                if t.data_ptr() % ALIGN == 0 and t.is_contiguous():
                    a = tvm.runtime.from_dlpack(t)
                elif loose and move is None and t.is_contiguous():  # only other runtimes read it
                    a = _any_alignment(t)
                elif (a := _into_slot(slot, t)) is not None:
                    kept.append(slot)
                else:
                    a = _aligned_copy(t)
                args.append(a if move is None else a.copyto(move))
            outs = self._build.call_tensors(*args)
            if self._outs_home:  # every output on the caller's device, as on the last call
                got = [torch.from_dlpack(o.__dlpack__()) for o in outs]
            else:
                home = self._home
                self._outs_home = all(o.device == home for o in outs)
                got = [torch.from_dlpack((o if o.device == home else o.copyto(home)).__dlpack__())
                       for o in outs]
            if kept:  # the next call overwrites the kept buffers
                got = [o.clone() if any(slot.holds(o.data_ptr()) for slot in kept) else o
                       for o in got]
        return got

    def call_flat(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The outputs of what calls run (:attr:`runs`), flat."""
        if self._eager is None:
            return self.run_flat(inputs)
        return pytree.tree_leaves(self(*inputs))

    def _check(self, inputs) -> None:
        """Raise where ``inputs`` are not what the build takes, as :meth:`run_flat` does."""
        if len(inputs) != len(self._checks):
            raise TypeError(f"expected {len(self._checks)} inputs "
                            f"({'; '.join(map(str, self.inputs))}), got {len(inputs)}")
        for k, (t, (shape, dtype, device, _)) in enumerate(zip(inputs, self._checks)):
            if not isinstance(t, torch.Tensor) or t.dtype is not dtype or t.shape != shape \
                    or t.device != device:
                raise self._mismatch(k, t)

    def _mismatch(self, k: int, t) -> Exception:
        spec = self.inputs[k]
        if not isinstance(t, torch.Tensor):
            return TypeError(f"input {k}: expected a torch.Tensor {spec}, got {type(t).__name__}")
        given = TensorSpec.of(t)
        error = TypeError if given.dtype != spec.dtype else ValueError
        return error(f"input {k}: this build takes {spec}, got {given} (build another for it: "
                     f"optimize_module with such an example input)")

    # ------------------------------------------------------------------------------ reading

    def summary(self) -> str:
        """What :meth:`OptimizeResult.summary` says; a loaded module: its plan and where it came
        from."""
        if self.result is not None:
            return self.result.summary() + (f"\n{self._runs_note}" if self._runs_note else "")
        meta = self._saved["meta"]
        return (f"loaded module (autoplace {meta['autoplace']}, TVM {meta['tvm']}), inputs "
                f"{'; '.join(map(str, self.inputs))}\n{self.plan}"
                + (f"\n{self._runs_note}" if self._runs_note else ""))

    def explain(self):
        """Per op: device, cost per device, copies, why (:meth:`OptimizeResult.explain`)."""
        if self.result is None:
            raise ValueError("a loaded module keeps its plan (str(module.plan)), not the costs "
                             "explain() reads: optimize_module the model again to explain it")
        return self.result.explain()

    def extra_repr(self) -> str:
        return f"inputs=[{'; '.join(map(str, self.inputs))}], devices=" \
               f"[{', '.join(d.name for d in self.plan.used_devices())}]"

    # ------------------------------------------------------------------------------ files

    def save(self, path: str | os.PathLike) -> None:
        """Write the build (its compiled library), its plan and what it takes into one file;
        :func:`load_module` reads it without tuning or building. A module that runs ONNX
        Runtime (:attr:`runs`) writes its ONNX graph beside the build, and the loaded module
        runs it; one that runs the model in PyTorch, eager or compiled, writes its build all
        the same, with a warning: the loaded module runs the build."""
        ort = self._eager if isinstance(self._eager, OrtModel) else None
        if self._eager is not None and ort is None:
            log.warning("this module %s: the file holds the build, which a loaded module runs",
                        self._runs_note)
        if self._saved is not None:
            lib, consts, positions = (self._saved["lib"], self._saved["consts"],
                                      self._saved["meta"]["input_devices"])
        else:
            with tempfile.TemporaryDirectory() as tmp:
                self._build.executable.export_library(os.path.join(tmp, "lib.so"))
                lib = Path(tmp, "lib.so").read_bytes()
            used = [d.tvm_device() for d in vm_devices(self.plan)[0]]
            consts = [(value.numpy(), k) for value, k in self._build.lifted]
            positions = [used.index(d) for d in self._build.input_devices]
        meta = {"format": FORMAT, "autoplace": __version__, "tvm": tvm.__version__,
                "torch": torch.__version__, "inputs": [vars(s) | {"shape": list(s.shape)}
                                                       for s in self.inputs],
                "input_devices": positions, "constant_devices": [k for _, k in consts],
                "func_name": getattr(self._build, "func_name", "main"),
                "torch_ops": (self._saved["meta"].get("torch_ops", []) if self._saved is not None
                              else called(self._build.mod)),
                "outputs": (None if self._out_spec is None
                            else pytree.treespec_dumps(self._out_spec)),
                "runtime_inputs": list(self._loose),
                "runs": "build" if ort is None else ONNXRUNTIME,
                "ort_level": None if ort is None else ort.level,
                "ort_threads": None if ort is None else ort.threads}
        segments = {}  # the ORT segments the build calls, registered again on load
        if self._saved is not None:
            segments = self._saved.get("segments", {})
        else:
            from autoplace.backend import ort_segments

            segments = {name: ort_segments.saved(name)
                        for name in ort_segments.called(self._build.mod)}
        meta["ort_segments"] = {name: spec for name, (_, spec) in segments.items()}
        buf = io.BytesIO()
        np.savez(buf, *[v for v, _ in consts])
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            z.writestr("meta.json", json.dumps(meta, indent=1))
            z.writestr("plan.json", self.plan.to_json())
            z.writestr("lib.so", lib)
            z.writestr("constants.npz", buf.getvalue())
            if ort is not None:
                z.writestr("model.onnx", ort.onnx)
            for name, (onnx, _) in segments.items():
                z.writestr(f"ort_segments/{name}.onnx", onnx)


def load_module(path: str | os.PathLike) -> AutoplaceModule:
    """A module written by :meth:`AutoplaceModule.save`, ready to call: its library is loaded,
    not built, and nothing is tuned.

    Raises
    ------
    ModuleFileError
        (a ``ValueError``) If the file is not a saved module, or was saved by another version of
        autoplace or TVM.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            plan_text = z.read("plan.json").decode()
            lib = z.read("lib.so")
            npz = np.load(io.BytesIO(z.read("constants.npz")))
            arrays = [npz[f"arr_{k}"] for k in range(len(npz.files))]
            onnx = z.read("model.onnx") if meta.get("runs") == ONNXRUNTIME else None
            segments = {name: (z.read(f"ort_segments/{name}.onnx"), spec)
                        for name, spec in meta.get("ort_segments", {}).items()}
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as e:
        raise ModuleFileError(f"{path} is not a module saved by autoplace ({e})") from e
    here = {"format": FORMAT, "autoplace": __version__, "tvm": tvm.__version__}
    saved = {key: meta.get(key) for key in here}
    if saved != here:
        raise ModuleFileError(
            f"{path} was saved by autoplace {saved['autoplace']} with TVM {saved['tvm']} (file "
            f"format {saved['format']}); this is autoplace {here['autoplace']} with TVM "
            f"{here['tvm']} (format {FORMAT}): optimize_module the model again and save it")
    lacking = missing(meta.get("torch_ops", []))
    if lacking:
        raise ModuleFileError(
            f"{path} calls {len(lacking)} PyTorch op(s) (ops TVM's importer lacks) that this "
            "process has not registered: a saved library finds them by name, so import the same "
            "model first (autoplace.from_torch or optimize_module) in this process, then load it")
    if segments:
        _register_segments(segments, path)
    plan = Plan.from_json(plan_text)
    consts = list(zip(arrays, meta["constant_devices"]))
    build = _LoadedBuild(plan, lib, meta["input_devices"], consts, meta["func_name"],
                         tuple(bool(b) for b in meta.get("runtime_inputs") or ()))
    inputs = [TensorSpec(tuple(s["shape"]), s["dtype"], s["device"]) for s in meta["inputs"]]
    out_spec = None if meta["outputs"] is None else pytree.treespec_loads(meta["outputs"])
    module = AutoplaceModule(build, inputs, out_spec, _saved={
        "lib": lib, "consts": consts, "meta": meta, "segments": segments})
    if onnx is not None:
        _run_saved_onnx(module, onnx, meta["ort_level"], meta.get("ort_threads"), out_spec,
                        path)
    return module


def _register_segments(segments: dict, path) -> None:
    """Register the ONNX Runtime segments a saved build calls (name -> (ONNX model, spec))."""
    try:
        from autoplace.backend import ort_segments

        ort_segments.require()
    except ImportError as e:
        raise ModuleFileError(f"{path}: its build runs {len(segments)} ONNX Runtime "
                              f"segment(s), and {e}") from None
    for name, (onnx, spec) in segments.items():
        if ort_segments.register_saved(onnx, spec) != name:
            raise ModuleFileError(f"{path}: ORT segment {name} does not match its saved model")


def _run_saved_onnx(module: AutoplaceModule, onnx: bytes, level: str, threads: int | None,
                    out_spec, path) -> None:
    """Make a loaded ``module`` run the ONNX graph it ran when saved, at the level it ran at,
    on one intra-op thread where it ran on one (``threads``), else on PyTorch's count here; or,
    where ONNX Runtime is not installed or fails on it here, its build, with a warning saying
    why."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        log.warning("%s ran ONNX Runtime when saved, which is not installed here (pip install "
                    "'autoplace[ort]'): the loaded module runs the build", path)
        return
    try:
        ort = _serving(OrtModel(onnx, level, out_spec, 1 if threads == 1 else None))
    except Exception as e:  # noqa: BLE001 - another ORT version may refuse the graph
        log.warning("%s ran ONNX Runtime when saved, which fails on its graph here (%s): the "
                    "loaded module runs the build", path, _reason(e))
        return
    module.run_eagerly(ort, {}, ONNXRUNTIME,
                       reason="it did when saved (the model exported to ONNX)")


class _LoadedBuild:
    """A saved build's library loaded for the plan's devices: what :class:`AutoplaceModule`
    calls, as it calls a :class:`~autoplace.run.CompiledModel`."""

    def __init__(self, plan: Plan, lib: bytes, positions: Sequence[int], consts, func_name: str,
                 runtime_inputs: tuple[bool, ...] = ()):
        from tvm import relax

        self.plan, self.func_name = plan, func_name
        vm = vm_devices(plan)[0]
        devices = [d.tvm_device() for d in vm]
        absent = [d.name for d, dev in zip(vm, devices) if not dev.exist]
        if absent:
            raise ValueError(f"the saved plan runs on {', '.join(absent)}, which this machine "
                             f"does not have")
        with tempfile.TemporaryDirectory() as tmp:  # the loaded library outlives its file
            Path(tmp, "lib.so").write_bytes(lib)
            library = tvm.runtime.load_module(os.path.join(tmp, "lib.so"))
        self._vm = relax.VirtualMachine(library, devices)
        self._fn = self._vm[func_name]
        self.input_devices = tuple(devices[k] for k in positions)
        self.runtime_inputs = runtime_inputs  # as the saved build's were (none: all aligned)
        self._consts = [tvm.runtime.tensor(value, devices[k]) for value, k in consts]
        self._calls = pytorch_call_threads(plan)  # as a CompiledModel calls PyTorch

    def call_tensors(self, *args) -> list:
        return call_vm(self._fn, args, self._consts, self.plan.threads, self._calls)


def _tvm_device(name: str) -> tvm.runtime.Device:
    d = torch.device(name)
    return tvm.cuda(d.index or 0) if d.type == "cuda" else tvm.cpu(0)


def _returned(flat: list, kind: str, spec):
    """``flat`` (outputs) as the model returned them: ``kind`` is :func:`_tree_kind` of
    ``spec``."""
    if kind == "one":
        return flat[0]
    if kind == "tuple":
        return tuple(flat)
    if kind == "flat":
        return flat
    return pytree.tree_unflatten(flat, spec)


def _tree_kind(spec) -> str:
    """How a flat list of outputs becomes what the model returned: ``"one"`` tensor, a
    ``"tuple"`` of tensors, ``"flat"`` (no structure known: the list), or ``"tree"``."""
    if spec is None:
        return "flat"
    if spec.is_leaf():
        return "one"
    if spec.type is tuple and all(c.is_leaf() for c in spec.children_specs):
        return "tuple"
    return "tree"
