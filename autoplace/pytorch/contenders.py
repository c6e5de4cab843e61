"""The whole-model alternatives a PyTorch user has, as contenders of a build: the model run
eagerly, compiled by ``torch.compile`` with Inductor's freezing, and exported to ONNX and run by
ONNX Runtime (:class:`OrtModel`). :func:`contend` checks a build's outputs against eager's, times
it against them in blocks in turn, and makes the module run the fastest where it beats the build
by its :func:`margin`."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree

from autoplace.backend.ort_profiling import thread_options
from autoplace.backend.ort_segments import level_parts, level_text, onnx_export, own_run, session
from autoplace.backend.timing import BEHIND
from autoplace.plan import Plan
from autoplace.report.result import COMPILED, EAGER, ONNXRUNTIME, with_measured_baseline
from autoplace.run.overhead import blocks_s, turns_s

log = logging.getLogger(__name__)

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


def contend(module, model, inputs: Sequence[torch.Tensor], eager_s: float, note: str, *,
            eager_fallback: bool = True, torch_compile: bool | None = None,
            onnx_source=None) -> None:
    """Check ``module``'s build (an :class:`~autoplace.pytorch.module.AutoplaceModule`) against
    ``model`` run eagerly on ``inputs`` and time it against the whole-model alternatives a
    PyTorch user has, making ``module`` run the fastest of those that beat the build by their
    :func:`margin` (:meth:`~autoplace.pytorch.module.AutoplaceModule.run_eagerly`).

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
        others = ", ".join(f"{v * 1e3:.4g} ({variant_text(k)})"
                           for k, v in ort_s.items() if k != fastest)
        notes[ONNXRUNTIME] = (f"the model exported to ONNX, CPU execution provider, "
                              f"{variant_text(fastest)}: {ort_s[fastest] * 1e3:.4g} ms a call "
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
        module.run_eagerly(serving(rivals[best]), times, best)
    elif timed:
        module.keep_build(times)


def serving(contender):
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
                    reason_of(e))
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
    (:func:`~autoplace.backend.ort_profiling.thread_options`)."""
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
                    reason_of(e))
        return None
    finally:
        model.train(training)
    return sessions


def disabled_fusions(result) -> tuple[str, ...]:
    """The fusions of ORT's that ``result``'s ONNX Runtime devices run without (measured slower
    on the model's largest segment, :func:`~autoplace.backend.ort_profiling.fastest_variant`):
    ORT on the whole model is timed without them too."""
    from autoplace.predict.ort_costs import OrtCostModel

    models = getattr(result.predictor, "models", None) or {}
    off = [f for m in models.values() if isinstance(m, OrtCostModel)
           for f in level_parts(m.timings.level)[1]]
    return tuple(dict.fromkeys(off))


def _variant_name(variant: tuple[str, int]) -> str:
    """The name ORT at graph optimization level and thread count ``variant`` is timed under
    among the contenders."""
    return f"{ONNXRUNTIME} {variant_text(variant)}"


def variant_text(variant: tuple[str, int]) -> str:
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
        self._tree = tree_kind(out_spec)

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
        return returned([torch.from_numpy(o) for o in outs], self._tree, self._out_spec)


def against(times: dict[str, float], name: str) -> str:
    """``'1 ms a call here against build 2 ms, ... (timed in blocks in turn)'``: ``name``'s time in
    ``times`` (seconds) against the others'."""
    others = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in times.items() if k != name)
    return f"{times[name] * 1e3:.4g} ms a call here against {others} (timed in blocks in turn)"


def reason_of(e: Exception) -> str:
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


def time_eager(model: torch.nn.Module, inputs, budget_s: float = 0.5, most: int = 20):
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


def returned(flat: list, kind: str, spec):
    """``flat`` (outputs) as the model returned them: ``kind`` is :func:`tree_kind` of
    ``spec``."""
    if kind == "one":
        return flat[0]
    if kind == "tuple":
        return tuple(flat)
    if kind == "flat":
        return flat
    return pytree.tree_unflatten(flat, spec)


def tree_kind(spec) -> str:
    """How a flat list of outputs becomes what the model returned: ``"one"`` tensor, a
    ``"tuple"`` of tensors, ``"flat"`` (no structure known: the list), or ``"tree"``."""
    if spec is None:
        return "flat"
    if spec.is_leaf():
        return "one"
    if spec.type is tuple and all(c.is_leaf() for c in spec.children_specs):
        return "tuple"
    return "tree"
