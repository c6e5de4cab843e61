"""Tiny Relax models the cluster tests place on hosts."""


def chain(shape=(16, 16), ops=("relu", "exp")):
    """A Relax module applying ``ops`` (names of unary Relax ops: ``"relu"`` is ``nn.relu``) one
    after another to one float32 input of ``shape``; each op is a workload of its own."""
    from tvm import relax

    fns = {"relu": relax.op.nn.relu, "exp": relax.op.exp, "tanh": relax.op.tanh}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            v = x
            for op in ops[:-1]:
                v = bb.emit(fns[op](v))
            out = bb.emit_output(fns[ops[-1]](v))
        bb.emit_func_output(out)
    return bb.get()
