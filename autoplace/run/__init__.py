"""Build an annotated module for its devices and run it."""

from autoplace.run.compile import CompiledModel, build, compile, lowering_pipeline

__all__ = ["CompiledModel", "build", "compile", "lowering_pipeline"]
