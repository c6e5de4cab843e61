"""TVM's CPU thread pool: how many threads it has, which cores it and its caller run on.

TVM's kernel thread pool belongs to the calling thread. Starting a thread's default pool
(``runtime.NumThreads`` does) pins that thread to core 0, and every thread it starts inherits the
pin, so questions about threads and cores are asked in a throwaway thread (:func:`in_own_thread`).

:func:`limit_tvm_threads` runs a thread and its pool on given cores with
``runtime.config_threadpool(-3, n, <cores>)`` (mode "share all cores": ``n`` threads, free to move
among those cores). Two pools given every core slow each other down (their idle threads spin on
the cores the other needs), and ``config_threadpool(1, n)`` (mode "big cores") pins every pool to
core 0.

TVM's own default pool (mode "big cores") also costs each kernel with a parallel loop several
microseconds more than a pool in the mode above with the same thread count, even with one
thread. So every thread autoplace runs or times a build on has its pool set up in that mode:
workers by :func:`limit_tvm_threads`, and any other thread (the caller's, when a compiled model
is called or a profile is measured) by :func:`own_pool`, with TVM's default count or the count
a plan asks for (``plan.threads``).

TVM's idle pool workers spin after each parallel kernel (hundreds of thousands of yields) before
they sleep, on the cores a runtime device's call (PyTorch's, ONNX Runtime's) made from the same
VM then needs: a PyTorch call on two threads waited for them. Importing autoplace sets
``TVM_THREAD_POOL_SPIN_COUNT`` to 0 unless the environment sets it: an idle worker sleeps at
once, and each parallel kernel pays its waking (a few microseconds). TVM reads it once, when the
process's first pool starts; a pool started before autoplace was imported keeps spinning.

The PyTorch calls a build makes run at :func:`call_threads`: the count :func:`calls_at` sets
around a compiled model's call (the plan's, :func:`autoplace.devices.torch_threads`), one on a
thread :func:`limit_tvm_threads` gave a share of the cores, else PyTorch's own count.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

# Which threads' TVM pools autoplace has set up, and with how many threads; the PyTorch
# threads of the runtime calls made on them (``calls``).
_pool = threading.local()

os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")


def call_threads() -> int | None:
    """The PyTorch threads a runtime device's call made on the calling thread runs at: what
    :func:`calls_at` set, one on a thread :func:`limit_tvm_threads` set up (a share of the
    cores, beside other devices' threads), else None (PyTorch's own count)."""
    return getattr(_pool, "calls", None)


@contextlib.contextmanager
def calls_at(threads: int | None):
    """Within: :func:`call_threads` is ``threads`` on the calling thread (None: PyTorch's own
    count), restored after."""
    before = getattr(_pool, "calls", None)
    _pool.calls = None if threads is None else max(1, int(threads))
    try:
        yield
    finally:
        _pool.calls = before


def in_own_thread(fn: Callable[[], T]) -> T:
    """``fn()`` called in a throwaway thread, so that what it does to its thread (an affinity
    set; a TVM pool started, which pins its thread to core 0) is not done to the caller's."""
    box = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the caller
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def tvm_threads() -> int:
    """TVM's CPU thread count, read in its own thread: ``optimize``'s thread should not be
    pinned for a number."""
    import tvm

    return in_own_thread(lambda: int(tvm.get_global_func("runtime.NumThreads")()))


def limit_tvm_threads(n: int, cores: Sequence[int]) -> None:
    """Run the calling thread and its TVM pool of ``n`` threads on ``cores`` (the module doc
    says why this mode). A compiled model called on this thread later keeps that pool."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    _share_cores(n, cores)
    _pool.kept = True
    _pool.calls = 1


def own_pool(threads: int | None = None) -> int:
    """Set up the calling thread's TVM pool as autoplace runs builds: ``threads`` threads
    (default: TVM's default count, :func:`tvm_threads`) shared over every core this process may
    use, in the mode of :func:`limit_tvm_threads` (the module doc says why). The calling
    thread's own affinity is left as it is. Returns the pool's thread count.

    Nothing is done when the pool already has that count, nor, for the default count, when
    :func:`limit_tvm_threads` set this thread up (a worker keeps its share of the cores). A pool
    the caller set up with ``runtime.config_threadpool`` itself is replaced on the thread's
    first call."""
    have = getattr(_pool, "threads", None)
    if threads is None:
        if have is not None and (getattr(_pool, "kept", False) or have == _default_threads()):
            return have
        threads = _default_threads()
    elif have == threads:
        return have
    _share_cores(threads, process_cpus())
    _pool.kept = False
    return threads


def _default_threads() -> int:
    """TVM's default thread count (:func:`tvm_threads`), read once per process."""
    global _DEFAULT_THREADS
    if _DEFAULT_THREADS is None:
        _DEFAULT_THREADS = tvm_threads()
    return _DEFAULT_THREADS


_DEFAULT_THREADS: int | None = None


def _share_cores(n: int, cores: Sequence[int]) -> None:
    """The calling thread's TVM pool: ``n`` threads sharing ``cores`` (mode -3), noted as set
    up by autoplace."""
    import tvm

    tvm.get_global_func("runtime.config_threadpool")(-3, n, [str(c) for c in cores])
    _pool.threads = n


def process_cpus() -> list[int]:
    """Every CPU the system lets this process use, whatever the calling thread was pinned to
    (the kernel keeps those of ``range(os.cpu_count())`` that the process's cpuset allows; a
    narrower ``taskset`` affinity is not kept, since TVM's pin looks the same). Asked in a
    throwaway thread, so that the caller's own affinity is left as it is."""
    every = range(os.cpu_count() or 1)
    if not hasattr(os, "sched_setaffinity"):
        return list(every)

    def probe():
        os.sched_setaffinity(0, every)
        return sorted(os.sched_getaffinity(0))

    return in_own_thread(probe)


def settle(max_s: float = 3.0, window_s: float = 0.05, busy: float = 0.1) -> float:
    """Wait until this process is idle (under ``busy`` of a core over ``window_s``), at most
    ``max_s`` seconds; returns the seconds waited. Call it between two timings: a TVM pool's
    workers spin for up to about a second after its last kernel (also after the thread that
    owned it has ended), so what is timed right after another pool's work shares the cores
    with its spinning workers."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(window_s)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime < busy * window_s:
            break
    return time.perf_counter() - t0
