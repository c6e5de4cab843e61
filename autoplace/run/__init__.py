"""Build a plan for its devices and run it: one multi-device VM, a latency plan's devices side
by side for one input (:class:`ConcurrentModel`), or a pipeline of stages on threads
(throughput plans)."""

from autoplace.backend import lowering_pipeline
from autoplace.run.compile import CompiledModel, build, compile
from autoplace.run.concurrent import ConcurrentModel
from autoplace.run.pipeline import Pipeline, PipelineClosedError, PipelineError
from autoplace.run.split import split

__all__ = ["CompiledModel", "ConcurrentModel", "Pipeline", "PipelineClosedError", "PipelineError", "build",
           "compile", "lowering_pipeline", "split"]
