"""A PyTorch module that runs an autoplace build: torch tensors in and out through DLPack, the
plan it runs beside it, and a file that loads without tuning or building again."""

from __future__ import annotations

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
from autoplace.report.result import EAGER, ONNXRUNTIME, OptimizeResult
from autoplace.backend.tensors import ALIGN, InputSlot
from autoplace.backend.torch_bridge import called, missing
from autoplace.devices import Device, local_devices
from autoplace.plan import Plan
from autoplace.run import CompiledModel, compile
from autoplace.run.compile import call_vm, pytorch_call_threads
from autoplace.pytorch.contenders import (OrtModel, against, contend, reason_of, returned,
                                          serving, time_eager, tree_kind, variant_text)

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

    The whole-model alternatives a PyTorch user has are contenders
    (:func:`~autoplace.pytorch.contenders.contend`): the model's own eager call (timed before
    anything is built, and again beside the build), ONNX Runtime on the model exported to ONNX
    where onnxruntime is installed and the inputs are on the CPU (at the graph optimization
    level that measured faster here), and the model compiled by ``torch.compile`` with
    Inductor's freezing: with ``torch_compile=True``, or by default where ONNX Runtime on the
    whole model is not among them (not installed, inputs off the CPU, an export that fails),
    its compile taking about what Inductor's takes alone. They are timed with the build in
    blocks in turn, recorded among the baselines, and where one of a model in eval mode ran
    faster than the build by more than 3 % (ONNX Runtime: by its
    :func:`~autoplace.pytorch.contenders.margin`), the module runs the fastest instead
    (``module.runs`` is ``"eager"``, ``"onnxruntime"`` or ``"torch.compile"``; ``summary()``
    gives the times). A contender that fails to export, build or compile, or whose outputs
    differ from eager's, is left out with a warning saying why. ``eager_fallback=False`` keeps
    the build whatever it measured, and times no contender. The build's outputs are checked
    against eager's on the example inputs first: where they differ (relative error above
    :data:`~autoplace.pytorch.contenders.MISMATCH`), a warning says so, and the module runs the
    model eagerly unless ``eager_fallback=False`` or the model is in training mode.

    >>> m = autoplace.optimize_module(model.eval(), (x,))     # doctest: +SKIP
    >>> y = m(x)                                               # a torch tensor
    >>> print(m.summary())                                     # the plan, as optimize() says
    >>> m.save("model.apmod"); m2 = autoplace.load_module("model.apmod")
    """
    inputs = _tensors(example_inputs)
    t = time.perf_counter()
    eager_s, note = time_eager(model, inputs)  # first: TVM's pool would slow PyTorch down
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
        turn (:func:`~autoplace.pytorch.contenders.contend`); empty where none was timed.
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
        self._tree = tree_kind(out_spec)
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
        :class:`~autoplace.pytorch.contenders.OrtModel`) rather than the build; ``times``:
        seconds a call each contender measured (``"build"`` among them), or ``reason``, why, in
        words."""
        self._eager, self._runs, self.times = model, "eager" if name == EAGER else name, times
        why = reason or (f"it measured {against(times, name)}; "
                         f"{times['build'] / times[name]:.2f}x the build's speed")
        how = f" ({variant_text((model.level, model.threads))})" \
            if isinstance(model, OrtModel) else ""
        self._runs_note = f"runs {name}{how}: {why}; the build is kept for save()"

    def keep_build(self, times: dict[str, float]) -> None:
        """Say in :meth:`summary` that calls run the build, which measured ``times["build"]``
        seconds a call against the other contenders' ``times`` (by less than the margin, or
        faster)."""
        self.times = times
        self._runs_note = f"runs the build: it measured {against(times, 'build')}"

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
        return returned(self.run_flat(inputs), self._tree, self._out_spec)

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
        ort = serving(OrtModel(onnx, level, out_spec, 1 if threads == 1 else None))
    except Exception as e:  # noqa: BLE001 - another ORT version may refuse the graph
        log.warning("%s ran ONNX Runtime when saved, which fails on its graph here (%s): the "
                    "loaded module runs the build", path, reason_of(e))
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
