"""TVM plumbing under everything else: the lowering pipeline and a one-device build, tuning
records applied in a build, numpy to and from TVM tensors, and TVM's CPU thread pool."""

from autoplace.backend.lowering import build_single, fused_kernels, lowering_pipeline
from autoplace.backend.tensors import to_numpy, to_tvm
from autoplace.backend.threads import (call_threads, calls_at, in_own_thread, limit_tvm_threads,
                                       own_pool, process_cpus, settle, tvm_threads)

__all__ = ["build_single", "call_threads", "calls_at", "fused_kernels", "in_own_thread",
           "limit_tvm_threads", "lowering_pipeline", "own_pool", "process_cpus", "settle",
           "to_numpy", "to_tvm", "tvm_threads"]
