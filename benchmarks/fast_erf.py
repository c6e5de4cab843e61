"""GELU with TVM's exact ``erf`` against autoplace's CPU lowering (``topi.fast_erf``), on one CPU
thread, default schedules.

Run: TVM_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/fast_erf.py [--shape 128 1024]
     [--repeat 5]

TVM lowers ``nn.gelu`` to ``T.erf``, which LLVM compiles to a scalar libm call per element;
autoplace's builds lower it on a CPU with ``topi.fast_erf`` (a rational approximation, clamped to
[-4, 4]: :func:`autoplace.backend.lowering.legalize_map`), plain arithmetic that vectorizes.
Prints the median time of each build, their ratio, and each one's error against a float64 GELU
(scipy's ``erf``), and PyTorch's (if installed).
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def gelu_module(shape):
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(tuple(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.gelu(x))
        bb.emit_func_output(out)
    return tvm.IRModule({"main": bb.get()["main"]})


def main(argv=None) -> int:
    import tvm
    from scipy.special import erf
    from tvm import relax

    from autoplace.backend.lowering import legalize

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    target = tvm.target.Target({"kind": "llvm",
                                "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    x = (np.random.default_rng(0).standard_normal(args.shape) * 3).astype("float32")
    want = 0.5 * x.astype("float64") * (1 + erf(x.astype("float64") / np.sqrt(2)))
    print(f"uptime: {os.getloadavg()}; gelu of {args.shape} float32, target {target}, "
          f"TVM_NUM_THREADS={os.environ.get('TVM_NUM_THREADS', 'default')}")
    times = {}
    for name, mod in (("exact erf", relax.transform.LegalizeOps()(gelu_module(args.shape))),
                      ("fast_erf", legalize(gelu_module(args.shape), target))):
        assert ("T.erf(" in mod.script()) == (name == "exact erf")
        vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
        a = tvm.runtime.tensor(x)
        err = np.abs(vm["main"](a).numpy() - want)
        big = np.abs(want) > 1e-3
        times[name] = vm.time_evaluator("main", tvm.cpu(), number=20,
                                        repeat=args.repeat)(a).median
        print(f"{name:>10}: {times[name] * 1e6:9.1f} us   max |error| {err.max():.2g}   "
              f"max |error| / |gelu| where |gelu| > 1e-3: "
              f"{(err[big] / np.abs(want[big])).max():.2g}")
    print(f"exact / fast: {times['exact erf'] / times['fast_erf']:.1f}x")
    try:
        import torch
    except ImportError:
        return 0
    torch.set_num_threads(1)
    err = np.abs(torch.nn.functional.gelu(torch.from_numpy(x)).numpy() - want)
    big = np.abs(want) > 1e-3
    print(f"PyTorch's float32 gelu: max |error| {err.max():.2g}   max |error| / |gelu| where "
          f"|gelu| > 1e-3: {(err[big] / np.abs(want[big])).max():.2g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
