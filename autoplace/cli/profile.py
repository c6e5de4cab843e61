"""``autoplace profile``, ``profile-export`` and ``profile-import``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoplace.cli import options

EPILOG = """examples:
  autoplace profile --model zoo:resnet --model zoo:mobilenet --device cpu:0 --db prof.db
  autoplace profile --model model.onnx --device cpu:0 --device rpc:pi4@127.0.0.1:9190 --db prof.db
  autoplace profile --sweep nn.conv2d:64 --device cpu:0 --db prof.db --dry-run --json
  autoplace profile --sweep nn.conv2d:64:small --sweep matmul:48:small --db prof.db
  autoplace profile --refine 3 --device cpu:0 --db prof.db
  autoplace profile --only-overheads --device cpu:0 --device cuda:0 --db prof.db
  autoplace profile --model zoo:mlp --device cpu:0 --device torch:cpu --db prof.db
  autoplace profile --model zoo:mlp --device node2/cpu:0 --address auto --db prof.db
  autoplace profile-export --db prof.db --device cpu:0 --out mycpu.json
  autoplace profile --quick --model zoo:resnet --device cpu:0:native --db new.db

--quick, on a machine with no profile: time a few of the model's workloads (the ones that take
most of its predicted time, every kind of op among them; --quick-count, default 40: a few
minutes) and adapt the learned model shipped for the device's kind to them, written to
DB.adapted.json. Use it with the measured ones:
  autoplace profile-export --db new.db --device cpu:0:native --out new.json
  autoplace optimize --model zoo:resnet --device cpu:0:native --profile new.json \
      --cost-model new.db.adapted.json

HOST/cpu:N, a device of a Ray cluster's host (autoplace cluster lists them), is timed on that
host by an actor there (as autoplace cluster --profile does), under a fingerprint naming the host.

torch:cpu (torch:cuda:N on a GPU) times each workload's PyTorch call (one PyTorch thread, as
the Relax VM calls it);
a workload PyTorch has no call for is stored as unsupported there.

After the ops, the overheads of running a plan on each local device are measured (a pipeline
stage's hand-off, a concurrent latency run's segment, a direct call; see docs/profiling.md),
unless --no-overheads. A campaign stopped at any point (Ctrl-C, kill) resumes where it was when
run again: what the store already holds is not measured again.
"""


def _models(args):
    from autoplace import zoo

    if args.only_overheads:
        if args.no_overheads:
            raise ValueError("--only-overheads and --no-overheads exclude each other: pass one")
        if args.model or args.sweep or args.refine:
            raise ValueError("--only-overheads measures no ops: drop --model, --sweep and "
                             "--refine, or drop --only-overheads")
        return []
    out = []
    for spec in args.model:
        out.append((spec, zoo.from_spec(spec).mod))
    if args.sweep:
        from autoplace.profile.sweeps import from_specs

        out += from_specs(args.sweep)
    if not out and not args.refine:
        raise ValueError("nothing to profile: pass --model zoo:NAME / FILE.onnx, "
                         "--sweep OP[:N[:FAMILY]] or --refine ROUNDS")
    return out


def _cmd_quick(args) -> int:
    from autoplace import zoo
    from autoplace.pricing.calibrate import quick_profile
    from autoplace.profile.measure import TimingPolicy
    from autoplace.profile.store import ProfileStore

    if not args.model or args.sweep or args.refine or args.dry_run or args.only_overheads:
        raise ValueError("--quick times some workloads of --model (one or more) and adapts the "
                         "shipped learned model: pass --model, and no --sweep, --refine, "
                         "--dry-run or --only-overheads")
    if len(args.device or ["cpu:0"]) != 1:
        raise ValueError("--quick adapts to one device: pass one --device")
    models = [(spec, zoo.from_spec(spec).mod) for spec in args.model]
    out = args.adapted_out or f"{args.db}.adapted.json"
    with ProfileStore(args.db) as store:
        try:
            report = quick_profile(store, (args.device or ["cpu:0"])[0], models,
                                   count=args.quick_count, out=out, progress=not args.json,
                                   policy=TimingPolicy(cv_target=args.cv, budget_s=args.budget),
                                   runner_kwargs=options.rpc_options(args))
        except KeyboardInterrupt:
            print(f"interrupted; what was timed is in {args.db}: run the same command again to "
                  "go on", file=sys.stderr)
            return 130
    if args.json:
        c = report.model.calibration
        print(json.dumps({"device": report.device, "chosen": report.chosen,
                          "measured": report.measured, "seconds": report.seconds,
                          "adapted": report.path, "calibration": c}, indent=1))
    else:
        print("\n".join(report.lines()))
    return 0


def _cmd_profile(args) -> int:
    from autoplace.profile.campaign import run_campaign
    from autoplace.profile.drift import DRIFT_TOLERANCE
    from autoplace.profile.measure import TimingPolicy
    from autoplace.profile.store import ProfileStore

    hosted = [s for s in args.device or [] if "/" in s and not s.startswith("rpc:")]
    if hosted:
        return _cmd_hosts(args, hosted)
    if args.quick:
        return _cmd_quick(args)
    _check_torch(args.device or [])
    models = _models(args)
    policy = TimingPolicy(cv_target=args.cv, budget_s=args.budget)
    tolerance = None if args.allow_drift else DRIFT_TOLERANCE
    # A dry run writes nothing: it reads an existing store, or counts against an empty one.
    if args.dry_run and Path(args.db).exists():
        store = ProfileStore(args.db, readonly=True)
    else:
        store = ProfileStore(":memory:" if args.dry_run else args.db)
    specs = args.device or ["cpu:0"]
    with store:
        try:
            report = None if args.only_overheads else run_campaign(
                models, specs, store, policy=policy, dry_run=args.dry_run,
                links=not args.no_links, progress=not args.json, passes=args.passes,
                drift_tolerance=tolerance,
                runner_kwargs=options.rpc_options(args))
            rounds = (_refine(args, store, policy, tolerance) if args.refine and not args.dry_run
                      else [])
            overheads = None if args.no_overheads else _overheads(args, specs, store)
        except KeyboardInterrupt:
            print(f"interrupted; everything measured so far is in {args.db}: run the same "
                  "command again to resume", file=sys.stderr)
            return 130
        counts = store.counts()
    if args.json:
        print(json.dumps({**(report.to_dict() if report else {}), "store": counts,
                          "refine": [r.to_dict() for r in rounds],
                          "overheads": overheads.to_dict() if overheads else None}, indent=1))
    else:
        if report is not None:
            print(report.table())
        for line in overheads.lines() if overheads else []:
            print(line)
        for r in rounds:
            print(f"refine round {r.round}: trained on {r.trained_on}, measured the {r.measured} "
                  f"least sure (mean P90/P10 {r.mean_band:.2f}); error on them before learning "
                  f"them: MAPE {r.mape:.1%}, {r.within_25:.0%} within 25%")
        print(f"store {args.db}: {counts['measurements']} measurements "
              f"({counts['unsupported']} unsupported), {counts['links']} links, "
              f"{counts['overheads']} overheads")
    failed = [d for d in report.devices if d.error] if report else []
    return 1 if (failed or (overheads and overheads.error)) and not args.dry_run else 0


def _cmd_hosts(args, hosted) -> int:
    """Devices of a Ray cluster's hosts (``HOST/cpu:N``): their ops timed on their hosts."""
    from autoplace.cli.cluster import profile_hosts

    if len(hosted) != len(args.device):
        raise ValueError(f"{hosted[0]} is a device of a cluster's host: profile it and this "
                         "machine's devices in two commands")
    if args.quick or args.refine or args.dry_run or args.only_overheads:
        raise ValueError(f"{hosted[0]} is a device of a cluster's host: it takes --model, "
                         "--sweep, --passes, --cv and --budget, not --quick, --refine, --dry-run "
                         "or --only-overheads (its actor calls: autoplace cluster --measure-links)")
    return profile_hosts(args, _models(args), hosted)


def _check_torch(specs) -> None:
    """Raise :class:`DeviceUnavailable` (one line with the install command) where a torch device
    is asked for and PyTorch is not installed: nothing of the campaign could use it."""
    from autoplace import Device
    from autoplace.profile import check_present

    for spec in specs:
        if spec.strip().startswith("torch"):
            check_present(Device.from_spec(spec), spec)


def _overheads(args, specs, store):
    """Measure (or with --dry-run, count) the overheads ``store`` lacks of the local devices."""
    from autoplace.profile.overheads import record_overheads

    measure = None
    if not args.dry_run:
        from autoplace.run.overhead import measure_overheads as measure
    return record_overheads(specs, store, measure, dry_run=args.dry_run,
                            runner_kwargs=options.rpc_options(args),
                            announce=None if args.json else
                            lambda line: print(line, file=sys.stderr, flush=True))


def _refine(args, store, policy, tolerance):
    from autoplace.pricing.refine import refine

    spec = (args.device or ["cpu:0"])[0]
    return refine(store, spec, rounds=args.refine, size=args.refine_size, policy=policy,
                  progress=not args.json, drift_tolerance=tolerance)


def _cmd_export(args) -> int:
    from autoplace.profile.store import ProfileStore

    with ProfileStore(args.db, readonly=True) as store:
        data = store.export_profile(args.device)
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}: {len(data['measurements'])} measurements of "
          f"{data['device']['name']} ({data['device']['info'].get('hardware')})")
    return 0


def _cmd_import(args) -> int:
    from autoplace.profile.store import ProfileStore
    from autoplace.profile.profiles import load_profile_json

    data = load_profile_json(args.file)
    with ProfileStore(args.db) as store:
        added = store.import_profile(data)
    print(f"imported {added} new measurements of {data['device']['name']} into {args.db}")
    return 0


def _cmd_recover(args) -> int:
    from autoplace.profile.recover import recover

    copied = recover(args.db, args.out)
    print(f"copied into {args.out} the rows of {args.db} still readable: "
          + ", ".join(f"{n} {table.replace('_', ' ')}" for table, n in copied.items())
          + f". {args.db} was not changed. Go on with --db {args.out}: a campaign run on it "
          "measures again whatever was lost")
    return 0


def register_cli(sub) -> None:
    from autoplace.profile.sweeps import FAMILY_HELP

    p = sub.add_parser("profile", help="measure ops and copies of models on devices into a store",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=[], help=options.model_help(True))
    p.add_argument("--sweep", action="append", default=[],
                   help="OP[:N[:FAMILY]]: N shapes of one op type around real models' shapes; "
                        "FAMILY (default full): " + "; ".join(
                            f"{f} ({what})" for f, what in FAMILY_HELP.items()) + " (repeatable)")
    p.add_argument("--device", action="append",
                   help="cpu:N, cuda:N, torch:cpu or torch:cuda:N (PyTorch's calls) or "
                        "rpc:KEY@HOST:PORT or HOST/cpu:N (a Ray cluster's host) "
                        "(repeatable; default cpu:0)")
    p.add_argument("--db", required=True, help="SQLite profile store (created if missing)")
    p.add_argument("--address", default="auto",
                   help="the Ray cluster of --device HOST/cpu:N devices, as ray.init takes it "
                        "(default auto)")
    p.add_argument("--dry-run", action="store_true", help="only count what is still to measure")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("--no-links", action="store_true", help="do not time copies between devices")
    p.add_argument("--no-overheads", action="store_true",
                   help="do not measure what a pipeline stage, a segment of a latency plan and a "
                        "call cost on each local device (measured after the ops, once per store)")
    p.add_argument("--only-overheads", action="store_true",
                   help="measure only those overheads (no ops: no --model, --sweep or --refine)")
    p.add_argument("--cv", type=float, default=0.03,
                   help="repeat until the spread (std/mean) is below this (default 0.03)")
    p.add_argument("--budget", type=float, default=2.0,
                   help="seconds of timing per workload at most (default 2)")
    p.add_argument("--passes", type=int, default=1,
                   help="time every workload on this many occasions, one sweep after another, "
                        "and keep each one's fastest: robust to load that comes and goes; on a "
                        "store measured before, adds the missing passes (default 1)")
    p.add_argument("--refine", type=int, default=0, metavar="ROUNDS",
                   help="then, for ROUNDS rounds, measure the sweep workloads the learned model "
                        "is least sure about on the first --device, and print its error per round")
    p.add_argument("--refine-size", type=int, default=16, help="workloads per refine round")
    p.add_argument("--quick", action="store_true",
                   help="a device with no profile: time a few workloads of --model and adapt the "
                        "shipped learned model to them (see below; no overheads, no links)")
    p.add_argument("--quick-count", type=int, default=40,
                   help="--quick: workloads to time at most (default 40)")
    p.add_argument("--adapted-out", help="--quick: where to write the adapted model "
                                         "(default DB.adapted.json)")
    p.add_argument("--allow-drift", action="store_true",
                   help="add new workloads to a store measured on an earlier occasion even if the "
                        "device now runs a few of its workloads (timed again first) a median "
                        "more than 15%% slower or faster")
    options.add_rpc_options(p)
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("profile-export", help="write one device's profile as a JSON file",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""example:
  autoplace profile-export --db prof.db --device cuda:0 --out my-gpu.json

The file format and how optimize uses it: docs/devices.md.""")
    p.add_argument("--db", required=True)
    p.add_argument("--device", required=True, help="the spec it was profiled as, or its fingerprint")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("profile-import", help="merge a profile JSON file into a store",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""example:
  autoplace profile-import autoplace/profile/shipped/nvidia-h100-sm90a.json --db prof.db

Measurements already in the store are kept, never overwritten.""")
    p.add_argument("file")
    p.add_argument("--db", required=True)
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("profile-recover",
                       help="copy what a damaged store still holds into a new store",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""example:
  autoplace profile-recover --db prof.db --out recovered.db
  autoplace profile --model zoo:resnet --device cpu:0 --db recovered.db   # measure what was lost

The damaged store is only read. Rows on its damaged pages are lost; every other row is copied.""")
    p.add_argument("--db", required=True, help="the damaged store (only read)")
    p.add_argument("--out", required=True,
                   help="the store to copy into (created if missing; its rows are kept)")
    p.set_defaults(func=_cmd_recover)
