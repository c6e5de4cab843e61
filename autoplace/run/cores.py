"""Which TVM threads and cores each CPU stage of a plan runs with."""

from __future__ import annotations

from collections.abc import Sequence

from autoplace.backend import process_cpus, threads
from autoplace.devices import Device


def stage_threads(devices: Sequence[Device], num_threads: int | None = None,
                  cpus: Sequence[int] | None = None) -> list[tuple[int, tuple[int, ...]] | None]:
    """TVM threads and cores for stages on ``devices``: ``(threads, cores)`` per CPU stage, None
    per GPU stage (its thread only launches kernels; TVM's pool is left alone).

    The distinct CPU devices, in order of index, split ``cpus`` (default: every core this process
    may use) into contiguous shares (one core each, round robin, if there are more devices).
    Each gets ``num_threads`` threads, or (``None``) TVM's default count (``TVM_NUM_THREADS``,
    what a profile of this CPU was measured with) divided among the CPU devices, at least one,
    at most its cores.
    """
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    cpu_devs = sorted({d.index for d in devices if not d.is_gpu})
    if not cpu_devs:
        return [None] * len(devices)
    if cpus is None:
        cpus = process_cpus()
    if num_threads is None:
        num_threads = max(1, threads.tvm_threads() // len(cpu_devs))
    m, share = len(cpu_devs), {}
    for j, index in enumerate(cpu_devs):
        own = (tuple(cpus[j * len(cpus) // m:(j + 1) * len(cpus) // m]) if m <= len(cpus)
               else (cpus[j % len(cpus)],))  # more devices than cores: they take turns
        share[index] = (min(num_threads, len(own)), own)
    return [None if d.is_gpu else share[d.index] for d in devices]


def all_threads(devices: Sequence[Device], num_threads: int | None = None,
                cpus: Sequence[int] | None = None) -> tuple[int, tuple[int, ...]] | None:
    """The TVM threads and cores the CPU devices of ``devices`` have together when a plan runs
    them (:func:`stage_threads`): what one CPU device running the whole model gets in the
    "all threads" baseline. None with fewer than two CPU devices (then a single device already
    has them all)."""
    cpu_devs = {d.index for d in devices if not d.is_gpu}
    if len(cpu_devs) < 2:
        return None
    shares = {d.index: share
              for d, share in zip(devices, stage_threads(devices, num_threads, cpus))
              if share is not None}
    threads = sum(n for n, _ in shares.values())
    cores = tuple(sorted({c for _, own in shares.values() for c in own}))
    return threads, cores
