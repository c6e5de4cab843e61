"""Options and argument parsing that several ``autoplace`` commands share."""

from __future__ import annotations

import argparse


def devices(specs):
    """The devices of ``--device`` specs, each of this machine checked to be there (a
    cluster host's, ``HOST/cpu:0``, is checked by the cluster)."""
    from autoplace import Device
    from autoplace.profile import check_present

    devs = [Device.from_spec(s) for s in specs]
    if len({d.name for d in devs}) != len(devs):
        raise ValueError(f"devices must differ, got {specs}")
    for spec, dev in zip(specs, devs):
        if dev.host is None:  # a cluster's host's device: the cluster checks it when it runs
            check_present(dev, spec)
    return devs


def add_rpc_options(p) -> None:
    """``--rpc-target`` and ``--rpc-timeout``: how ``rpc:KEY@HOST:PORT`` devices are reached."""
    p.add_argument("--rpc-target", default="llvm", help="TVM target of rpc: devices (default llvm)")
    p.add_argument("--rpc-timeout", type=float, default=30.0,
                   help="seconds to wait for an rpc: device (default 30)")


def rpc_options(args) -> dict:
    """The keyword arguments of :func:`autoplace.profile.runner_from_spec` the options give."""
    return {"rpc_target": args.rpc_target, "rpc_timeout_s": args.rpc_timeout}


def rules(specs):
    rules = []
    for s in specs:
        if "=" not in s:
            raise ValueError(f"rule {s!r}: expected PATTERN=DEVICE, e.g. 'op:nn.conv2d=cpu0'")
        pattern, dev = s.rsplit("=", 1)
        rules.append((pattern, dev))
    return rules


def default_model() -> str:
    try:
        import torch  # noqa: F401
    except ImportError:
        return "zoo:branchy_cnn"
    return "zoo:resnet"


def model_help(repeatable: bool = False) -> str:
    """The help of a ``--model`` option, naming every zoo model."""
    from autoplace import zoo

    return (f"zoo:NAME or a path to an .onnx file (zoo: {', '.join(zoo.names())})"
            + (" (repeatable)" if repeatable else ""))


def cost_model(args):
    """Profiles given with --profile (the --cost-model files for what they lack), the
    --cost-model files alone, roofline with --no-profile, else optimize's "auto"."""
    from autoplace.predict import MeasuredCostModel, RooflineCostModel, load_cost_model
    from autoplace.profile import DeviceProfile

    learned = [load_cost_model(p) for p in getattr(args, "cost_model", None) or []]
    if args.profile or learned:
        return MeasuredCostModel([DeviceProfile.load(p) for p in args.profile],
                                 fallback=learned or None)
    return RooflineCostModel() if args.no_profile else "auto"


def add_run_options(p):
    p.add_argument("--model", help=model_help())
    p.add_argument("--device", action="append",
                   help="cpu:N (built for this host's CPU), cpu:N:generic (generic x86-64), "
                        "cuda:N, torch:cpu (PyTorch's kernels), ort:cpu (ONNX Runtime); repeat "
                        "for each device (default: cpu:0 and the runtimes installed here; "
                        "cpu:0 and cpu:1 for --objective throughput)")
    p.add_argument("--objective", choices=("latency", "throughput"), default="latency")
    p.add_argument("--contiguous", action=argparse.BooleanOptionalAction, default=True,
                   help="throughput: one stage per device, the devices a chain (the default; "
                        "--no-contiguous lets a device hold several stages)")
    p.add_argument("--solver", default="auto", help="solver name (default: auto)")
    p.add_argument("--time-limit", type=float, default=10.0, help="solver seconds (default 10)")
    p.add_argument("--rule", action="append", default=[],
                   help="pin ops: PATTERN=DEVICE, e.g. 'op:nn.softmax=cpu1' (repeatable)")
    p.add_argument("--profile", action="append", default=[],
                   help="measured profile JSON (autoplace profile-export); each applies to the "
                        "devices of its kind (repeatable). Default: the profiles shipped with "
                        "autoplace, each for the devices of this machine it was measured on")
    p.add_argument("--cost-model", action="append", default=[],
                   help="a saved cost model (autoplace train, or profile --quick's adapted "
                        "model) for the ops the profiles lack; each applies to the devices it "
                        "was fitted on (repeatable)")
    p.add_argument("--no-guard", action="store_true",
                   help="return the solver's plan even where a baseline (one device, all "
                        "threads, replicas) is predicted as fast or faster")
    p.add_argument("--no-profile", action="store_true",
                   help="ignore profiles and the tuning records shipped with them: roofline "
                        "estimates from device peaks, nothing timed")
    p.add_argument("--no-calibrate", action="store_true",
                   help="time nothing here: a CPU no shipped profile describes gets roofline "
                        "estimates, and a shipped profile is trusted without checking it "
                        "against this host (by default a few of the model's workloads are "
                        "timed on first use, cached per host)")
