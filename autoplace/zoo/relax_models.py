"""Models written directly in Relax, so that the core runs and is tested without PyTorch."""

from __future__ import annotations

import numpy as np


def _const(rng: np.random.Generator, *shape: int):
    from tvm import relax

    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return relax.const(rng.normal(0, 1 / np.sqrt(fan_in), shape).astype("float32"))


def mlp(rng: np.random.Generator, batch: int = 8, width: int = 64, depth: int = 4):
    """A ReLU MLP with constant weights: ``depth`` x (matmul, add, relu)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for i in range(depth):
                h = bb.emit(relax.op.matmul(h, _const(rng, width, width)), name_hint=f"mm{i}")
                h = bb.emit(relax.op.add(h, _const(rng, width)), name_hint=f"bias{i}")
                h = bb.emit(relax.op.nn.relu(h), name_hint=f"relu{i}")
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get(), [rng.standard_normal((batch, width)).astype("float32")]


def branchy_cnn(rng: np.random.Generator, size: int = 16, channels: int = 8):
    """Conv stem, two branches (3x3 conv / pool + 1x1 conv), concat, global pool, dense head."""
    from tvm import relax

    bb = relax.BlockBuilder()
    c = channels
    x = relax.Var("x", relax.TensorType((1, 3, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            stem = bb.emit(relax.op.nn.conv2d(x, _const(rng, c, 3, 3, 3), padding=1), "stem")
            stem = bb.emit(relax.op.nn.relu(stem), "stem_relu")
            a = bb.emit(relax.op.nn.conv2d(stem, _const(rng, c, c, 3, 3), padding=1), "branch_a")
            a = bb.emit(relax.op.nn.relu(a), "branch_a_relu")
            b = bb.emit(relax.op.nn.max_pool2d(stem, (3, 3), (1, 1), (1, 1)), "branch_b_pool")
            b = bb.emit(relax.op.nn.conv2d(b, _const(rng, c, c, 1, 1)), "branch_b")
            cat = bb.emit(relax.op.concat([a, b], axis=1), "concat")
            pooled = bb.emit(relax.op.mean(cat, axis=[2, 3]), "gap")
            logits = bb.emit(relax.op.matmul(pooled, _const(rng, 2 * c, 10)), "head")
            out = bb.emit_output(relax.op.nn.softmax(logits, axis=-1))
        bb.emit_func_output(out)
    return bb.get(), [rng.standard_normal((1, 3, size, size)).astype("float32")]


def weights_as_inputs(rng: np.random.Generator, batch: int = 4, width: int = 32):
    """Two matmuls whose shared weight is a function parameter (``num_input`` = 1)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, width), "float32"))
    w = relax.Var("w", relax.TensorType((width, width), "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w), "first")
            h = bb.emit(relax.op.nn.relu(h), "act")
            out = bb.emit_output(relax.op.matmul(h, w))
        bb.emit_func_output(out)
    inputs = [rng.standard_normal((batch, width)).astype("float32"),
              (rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32")]
    return bb.get(), inputs
