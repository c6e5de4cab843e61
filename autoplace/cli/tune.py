"""``autoplace tune``: tune the kernels of models for devices with MetaSchedule, resumably."""

from __future__ import annotations

import argparse
import json

from autoplace.cli import options

EPILOG = """examples:
  autoplace tune --model zoo:resnet --device cpu:0 --db prof.db --trials 64
  autoplace tune --model resnet18.onnx --device cpu:0 --db prof.db --minutes 20
  autoplace tune --model zoo:resnet --model zoo:mobilenet --device cpu:0 --db prof.db --dry-run --json
  autoplace tune --model zoo:resnet --device rpc:board@10.0.0.5:9190 --db prof.db --trials 64
  autoplace optimize --model zoo:resnet --device cpu:0 --device cpu:1 --db prof.db

Records go beside the store (prof.db.tuning/<device fingerprint>/). After tuning, every kernel
of a CPU device is also timed with the TVM threads one device gets from several (--also-threads):
what optimize predicts the "all threads" baseline from. A campaign stopped at any
point (Ctrl-C, kill) resumes where it was when run again; a kernel shared by several models, or
tuned by an earlier campaign, is tuned once. Each kernel's default schedule is timed once
(a few calls), and the kernels that take the most time are tuned first, in two passes: one
round each, then the rest of their trials. A campaign stopped early (--minutes, Ctrl-C) has
spent its time where the model spends it.
An rpc: device is reached through a TVM RPC tracker, as `autoplace profile` reaches it:
candidates are compiled here and run there by MetaSchedule's RPC runner.
"""


def _cmd_tune(args) -> int:
    from autoplace import Device, zoo
    from autoplace.profile import runner_from_spec
    from autoplace.tuning import describe, tune

    if not args.model:
        raise ValueError("nothing to tune: pass --model zoo:NAME or FILE.onnx (repeatable)")
    mods = [zoo.from_spec(spec).mod for spec in args.model]
    specs = args.device or ["cpu:0"]
    rpc = options.rpc_options(args)
    local = iter(options.devices([s for s in specs if not s.startswith("rpc:")]))
    devices = [runner_from_spec(s, **rpc) if s.startswith("rpc:") else next(local)
               for s in specs]
    if any(d.is_gpu if isinstance(d, Device) else d.kind != "cpu" for d in devices) \
            and not args.dry_run:
        raise ValueError("tuning GPU kernels is not supported yet: GPU builds use dlight's "
                         "default schedules")
    also = args.also_threads
    if also is None:
        also = [n for n in [_all_threads_count([d for d in devices if isinstance(d, Device)])]
                if n is not None]
    try:
        report = tune(mods, devices, args.db, trials=args.trials, dry_run=args.dry_run,
                      trials_per_iter=args.round, progress=not args.json,
                      time_limit_s=None if args.minutes is None else args.minutes * 60,
                      also_threads=[n for n in also if n > 0], retime=args.retime,
                      passes=args.passes)
    except KeyboardInterrupt:
        print(f"autoplace tune: interrupted; every finished round is kept in {args.db}.tuning. "
              "Run the same command again to resume.")
        return 130
    if args.json:
        out = report.to_dict()
        if not args.verbose_json:
            out.pop("kernels")
        print(json.dumps(out, indent=1))
    else:
        print(describe(report))
    return 0


def _all_threads_count(devices) -> int | None:
    """The TVM threads one CPU device gets in the "all threads" baseline of a plan over the CPU
    devices among ``devices`` (over ``cpu:0`` and ``cpu:1`` when fewer than two are given)."""
    from autoplace import Device
    from autoplace.run.cores import all_threads

    cpus = [d for d in devices if not d.is_gpu]
    if len({d.index for d in cpus}) < 2:
        cpus = [Device.cpu(0), Device.cpu(1)]
    share = all_threads(cpus)
    return None if share is None else share[0]


def register_cli(sub) -> None:
    """Add the ``tune`` subcommand to an argparse subparsers object."""
    p = sub.add_parser("tune", help="tune the kernels of models for devices (MetaSchedule)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], help=options.model_help(True))
    p.add_argument("--device", action="append",
                   help="cpu:N or rpc:KEY@HOST:PORT (repeatable; default cpu:0)")
    p.add_argument("--db", required=True,
                   help="the profile store the records live beside (need not exist)")
    p.add_argument("--trials", type=int, default=64,
                   help="candidates measured per kernel (default 64; about 1.5 s each on 2 cores)")
    p.add_argument("--round", type=int, default=16, metavar="N",
                   help="candidates measured per round; records are saved after each (default 16)")
    p.add_argument("--minutes", type=float, metavar="M",
                   help="start no kernel after M minutes (the one tuning finishes; the rest stay "
                        "pending for the next run)")
    p.add_argument("--also-threads", type=int, action="append", metavar="N",
                   help="also time every kernel of each CPU device with N TVM threads, what a "
                        "plan's 'all threads' baseline costs (repeatable; default: the threads "
                        "one device gets from two or more CPU devices of this machine; 0: none)")
    p.add_argument("--retime", action="store_true",
                   help="time every tuned kernel again, replacing the store's times (a machine "
                        "whose speed changed)")
    p.add_argument("--passes", type=int, default=1, metavar="N",
                   help="time the tuned kernels and builds on N occasions, keeping the fastest "
                        "and the slowest's time: the spread the baseline guard charges "
                        "(default 1)")
    p.add_argument("--dry-run", action="store_true",
                   help="only count the kernels still to tune and estimate the time")
    p.add_argument("--json", action="store_true",
                   help='print a JSON report ({"pending": kernels still to tune, ...})')
    p.add_argument("--kernels", dest="verbose_json", action="store_true",
                   help="with --json: list every kernel")
    options.add_rpc_options(p)
    p.set_defaults(func=_cmd_tune)
