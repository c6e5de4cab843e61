"""Timing one-op modules on a device: build through autoplace's lowering, warm up, repeat until stable.

A *runner* is a device as the profiler reaches it: in this process (:class:`LocalRunner`) or
through TVM's RPC tracker (:class:`autoplace.profile.remote.RPCRunner`). Every runner has the same
``measure(mod)`` and a fingerprint of the context that makes its numbers meaningful.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.backend import own_pool, process_cpus, tvm_threads
from autoplace.devices import Device
from autoplace.profile.workload import random_inputs

if TYPE_CHECKING:
    import tvm


class OpFailed(RuntimeError):
    """The workload could not be built or run on this device: record it as unsupported there."""


class DeviceUnavailable(RuntimeError):
    """The device itself cannot be reached or used; the message says why."""


_interrupted = threading.Event()


def check_present(device: Device, spec: str | None = None) -> None:
    """Raise :class:`DeviceUnavailable` unless this machine has ``device`` (named ``spec``,
    default ``"kind:index"``): a GPU that TVM finds, or a CPU device numbered below the count of
    cores this process may use (CPU devices share those cores by index, a share each), or for a
    torch device, PyTorch installed (and its GPU, for ``torch:cuda:N``); for an ORT device,
    ONNX Runtime and PyTorch installed. Nothing is built or run."""
    if device.runtime == "torch":
        spec = spec or device.spec
        try:
            import torch
        except ImportError:
            raise DeviceUnavailable(f"{spec}: PyTorch is not installed: pip install "
                                    "'autoplace[frontends]' (or pip install torch)") from None
        if device.target == "cuda" and not torch.cuda.device_count() > device.index:
            raise DeviceUnavailable(f"{spec}: PyTorch finds no CUDA GPU {device.index}")
        return
    if device.runtime == "ort":
        from autoplace.backend.ort_segments import require

        try:
            require()
        except ImportError as e:
            raise DeviceUnavailable(f"{spec or device.spec}: {e}") from None
        return
    spec = spec or f"{device.kind}:{device.index}"
    cores = len(process_cpus())
    if device.is_gpu:
        if device.index >= 0 and device.tvm_device().exist:
            return
        why = f"TVM finds no CUDA GPU {device.index}"
    else:
        if 0 <= device.index < cores:
            return
        why = f"this process may use {cores} cores"
    here = "cpu:0" + (f" to cpu:{cores - 1}" if cores > 1 else "")
    raise DeviceUnavailable(f"{spec}: no such device on this machine ({why}); use {here}")



@contextlib.contextmanager
def interrupts_kept():
    """Within: Ctrl-C raises KeyboardInterrupt as usual and is remembered, so that
    :func:`op_failed` does not take it for the op's failure.

    TVM turns a KeyboardInterrupt raised in one of its Python callbacks (a pass written in Python,
    as autoplace's lowering and TVM's GPU schedules are) into a RuntimeError with no message.
    Caught as a build error, it would mark the op unsupported and the campaign would go on.
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield  # not ours to change: another thread, or SIGINT ignored or handled elsewhere
        return

    def on_sigint(_signum, _frame):
        _interrupted.set()
        raise KeyboardInterrupt

    _interrupted.clear()
    signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _interrupted.clear()


def op_failed(what: str, exc: BaseException) -> OpFailed:
    """``OpFailed("<what>: <exc's summary>")``, or KeyboardInterrupt if Ctrl-C caused ``exc``."""
    if _interrupted.is_set():
        raise KeyboardInterrupt from exc
    return OpFailed(f"{what}: {error_summary(exc)}")


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to time one workload.

    Each repeat calls the op ``number`` times, with ``number`` chosen so a repeat lasts at least
    ``min_repeat_ms``. Repeats come in rounds of ``round_size`` until the coefficient of
    variation of the repeats is below ``cv_target`` (after ``min_repeats``), ``max_repeats`` is
    reached, or ``budget_s`` of timing is spent.
    """

    min_repeat_ms: float = 10.0
    min_repeats: int = 5
    max_repeats: int = 30
    round_size: int = 5
    cv_target: float = 0.03
    budget_s: float = 2.0


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    mean_s: float
    cv: float
    repeats: int
    number: int


#: One untimed-quality call: enough to learn whether a device runs anything at all.
PROBE_POLICY = TimingPolicy(min_repeat_ms=0, min_repeats=1, max_repeats=1, round_size=1)


def time_adaptively(timer, policy: TimingPolicy) -> Timing:
    """Time with ``timer(number, repeat) -> per-repeat mean seconds`` (the first call of a
    ``time_evaluator`` is a discarded warm-up, so each ``timer`` call warms up itself)."""
    t0 = time.perf_counter()
    once = float(np.median(timer(1, 3)))
    number = max(1, math.ceil(policy.min_repeat_ms / 1000 / max(once, 1e-9)))
    results: list[float] = []
    while True:
        results += list(timer(number, policy.round_size))
        arr = np.asarray(results)
        cv = float(arr.std() / arr.mean()) if arr.mean() > 0 else 0.0
        if len(results) >= policy.max_repeats or time.perf_counter() - t0 > policy.budget_s:
            break
        if len(results) >= policy.min_repeats and cv <= policy.cv_target:
            break
    return Timing(float(np.median(arr)), float(arr.min()), float(arr.mean()), cv, len(results),
                  number)


def kernel_timer(rt_mod, dev, args):
    """A ``timer(number, repeat)`` for :func:`time_adaptively` of a compiled kernel's ``main``
    (a runtime module, here or loaded on a remote) called on ``args``."""
    def timer(number, repeat):
        return rt_mod.time_evaluator("main", dev, number=number, repeat=repeat)(*args).results

    return timer


def fingerprint(info: dict[str, Any]) -> str:
    """A short hash of what makes a device's numbers comparable (hardware, target, TVM, threads;
    for a torch device, also the PyTorch version, where its tensors live and which calls it
    makes, :data:`autoplace.backend.torch_bridge.CALLS`; for an ORT device, ONNX Runtime's
    version and how its threads wait, :data:`autoplace.backend.ort_segments.THREADS_WAIT`)."""
    keys = ("kind", "target", "hardware", "tvm", "threads", "remote")
    fields = {k: info.get(k) for k in keys}
    fields.update({k: info[k] for k in ("torch", "place", "calls", "onnxruntime", "wait")
                   if k in info})  # TVM's unchanged
    blob = json.dumps(fields, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def error_summary(exc: BaseException, limit: int = 300) -> str:
    """The informative lines of a TVM error (its C++ traceback dropped)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    keep = [ln for ln in lines if not ln.startswith(("File ", "^", "Traceback"))
            and not ln.startswith(tuple("0123456789")) or "Check failed" in ln]
    text = " | ".join(dict.fromkeys(keep[-3:] or lines[-1:]))
    return f"{type(exc).__name__}: {text}"[:limit]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe_module() -> tvm.IRModule:
    """``add`` of two 16-float vectors: a device that cannot run this is broken, not limited."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x, y = (relax.Var(n, relax.TensorType((16,), "float32")) for n in "xy")
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(x, y)))
        bb.emit_func_output(out)
    return bb.get()


def timing_lock_name(device: Device) -> str:
    """Which of this machine's timing locks ``device`` takes: the CPU devices share one (they
    share the cores), each GPU has its own."""
    return "cpu" if not device.is_gpu else f"{device.kind}{device.index}"


@contextlib.contextmanager
def timing_lock(device: Device, lock_dir: str | Path | None = None) -> Iterator[int | None]:
    """Hold this machine's lock on timing ``device`` (:func:`timing_lock_name`) while the body
    runs, so that a second process timing it at once can tell. The lock is a file in
    ``lock_dir`` (default: the temporary folder) that the OS releases when the holder exits,
    however it ends. One process takes each lock once (a second hold would fail).

    Yields ``None`` when this process holds the lock, else the id of the process that does (or
    0 if unknown): the body runs either way, and its timings may then be contended.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock to take
        yield None
        return
    name = f"autoplace-timing-{timing_lock_name(device)}.lock"
    path = Path(lock_dir or tempfile.gettempdir()) / name
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield None  # cannot make the lock file (a read-only folder): time without one
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder = None
        except OSError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            holder = int(text) if text.isdigit() else 0
        if holder is None:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield holder
    finally:
        os.close(fd)  # releases the lock if this process held it


def check_runs_probe(runner) -> None:
    """Raise :class:`DeviceUnavailable` unless ``runner``'s device (a local one: ``device`` and
    ``spec``) exists (:func:`check_present`) and times a vector add (:func:`probe_module`)."""
    check_present(runner.device, runner.spec)
    try:
        runner.measure(probe_module(), PROBE_POLICY)
    except OpFailed as e:
        raise DeviceUnavailable(f"{runner.spec} cannot run a vector add: {e}") from None


class LocalRunner:
    """A device of this process (``cpu:N`` or ``cuda:N``)."""

    def __init__(self, device: Device, spec: str | None = None):
        self.device = device
        self.spec = spec or f"{device.kind}:{device.index}"

    @property
    def name(self) -> str:
        """The device's name (``cpu0``)."""
        return self.device.name

    def tvm_target(self) -> tvm.target.Target:
        return self.device.tvm_target()

    def close(self) -> None:
        """Nothing to release (the same call as a remote runner's)."""

    def info(self) -> dict[str, Any]:
        import tvm

        dev = self.device.tvm_device()
        if self.device.is_gpu:
            hardware = dev.device_name if dev.exist else "absent"
        else:
            hardware = _cpu_model()
        threads = tvm_threads()
        return {"kind": self.device.kind, "target": str(self.device.tvm_target()),
                "hardware": hardware, "tvm": tvm.__version__, "threads": threads,
                "host": platform.node(), "remote": None}

    def _own_pool(self) -> None:
        """A CPU is timed on a TVM pool set up as builds run on (:func:`own_pool`)."""
        if not self.device.is_gpu:
            own_pool()

    def check(self) -> None:
        """Raise :class:`DeviceUnavailable` unless the device exists (:func:`check_present`) and
        runs a trivial op."""
        check_runs_probe(self)

    def measure(self, mod: tvm.IRModule, policy: TimingPolicy = TimingPolicy(),
                rng: np.random.Generator | None = None) -> Timing:
        import tvm
        from tvm import relax

        from autoplace.backend import build_single

        self._own_pool()
        try:
            ex = build_single(mod, self.device.tvm_target(), gpu=self.device.is_gpu)
        except Exception as e:  # noqa: BLE001 - any build failure means "cannot run here"
            raise op_failed("build failed", e) from None
        dev = self.device.tvm_device()
        try:
            vm = relax.VirtualMachine(ex, dev)
            rng = rng or np.random.default_rng(0)
            args = [tvm.runtime.tensor(a, dev) for a in random_inputs(mod["main"], rng)]

            def timer(number, repeat):
                return vm.time_evaluator("main", dev, number=number, repeat=repeat)(*args).results

            return time_adaptively(timer, policy)
        except Exception as e:  # noqa: BLE001
            raise op_failed("run failed", e) from None

    def measure_kernel(self, mod: tvm.IRModule, target, policy: TimingPolicy = TimingPolicy(),
                       rng: np.random.Generator | None = None) -> Timing:
        """Median time of a kernel: ``mod["main"]`` a PrimFunc (scheduled or not), compiled for
        ``target``, on random inputs (:func:`~autoplace.profile.workload.random_inputs`).

        Raises
        ------
        OpFailed
            The kernel did not build or run.
        """
        import tvm

        self._own_pool()
        try:
            lib = tvm.compile(mod, target=target)
        except Exception as e:  # noqa: BLE001 - any build failure means "cannot run here"
            raise op_failed("build failed", e) from None
        dev = self.device.tvm_device()
        try:
            args = [tvm.runtime.tensor(a, dev)
                    for a in random_inputs(mod["main"], rng or np.random.default_rng(0))]
            return time_adaptively(kernel_timer(lib.mod, dev, args), policy)
        except Exception as e:  # noqa: BLE001
            raise op_failed("run failed", e) from None
