"""Copy latency and bandwidth between two devices: timed preallocated copies, a least-squares fit."""

from __future__ import annotations

import time

import numpy as np

from autoplace.devices import Device

DEFAULT_SIZES = tuple(4096 * 4**k for k in range(9))  # 4 KiB .. 256 MiB


def copy_times(src: Device, dst: Device, sizes=DEFAULT_SIZES, *, repeats: int = 7,
               budget_s: float = 10.0) -> list[tuple[int, float]]:
    """Median seconds of ``dst_buffer.copyfrom(src_buffer)`` per size (bytes); sizes that do not
    fit a quarter of either device's memory, or beyond the time budget, are skipped."""
    import tvm

    cap = min(src.memory_bytes, dst.memory_bytes) / 4
    sdev, ddev = src.tvm_device(), dst.tvm_device()
    points, t_start = [], time.perf_counter()
    for size in sizes:
        if size > cap or time.perf_counter() - t_start > budget_s:
            break
        a = tvm.runtime.empty((size,), "uint8", sdev)
        b = tvm.runtime.empty((size,), "uint8", ddev)
        a.copyfrom(np.ones(size, dtype="uint8"))
        times = []
        for _ in range(repeats + 1):  # the first copy warms up (page faults, driver set-up)
            t0 = time.perf_counter()
            b.copyfrom(a)
            ddev.sync()
            times.append(time.perf_counter() - t0)
        points.append((int(size), float(np.median(times[1:]))))
    return points


def fit_link(points) -> tuple[float, float, float]:
    """Least-squares ``t = alpha + bytes / beta`` over ``(bytes, seconds)`` points, weighted by
    ``1/t`` so small and large copies count alike. Returns ``(alpha_s, beta_bytes_per_s, r2)``
    (``r2`` of the unweighted times)."""
    x, t = (np.asarray(v, dtype=float) for v in zip(*points))
    if len(x) < 2:
        raise ValueError(f"need copies of at least two sizes to fit a link, got {len(x)}")
    w = 1.0 / t
    a = np.column_stack([np.ones_like(x), x]) * w[:, None]
    (alpha, slope), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    if alpha < 0:  # latency cannot be negative: refit the bandwidth alone through the origin
        alpha, slope = 0.0, float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    pred = alpha + slope * x
    ss_res, ss_tot = float(np.sum((t - pred) ** 2)), float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return float(alpha), float(1.0 / slope) if slope > 0 else float("inf"), r2
