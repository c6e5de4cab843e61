"""Build an annotated module for its devices and run it: one multi-device VM (latency plans) or
a pipeline of stages on threads (throughput plans)."""

from autoplace.run.compile import CompiledModel, build, compile, lowering_pipeline
from autoplace.run.pipeline import Pipeline, PipelineClosedError, PipelineError, split

__all__ = ["CompiledModel", "Pipeline", "PipelineClosedError", "PipelineError", "build",
           "compile", "lowering_pipeline", "split"]
