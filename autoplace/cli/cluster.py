"""``autoplace cluster``: the hosts of a Ray cluster and their devices, the links between them
and the call of an actor on each timed into a profile store, and each host's ops timed on that
host (also ``autoplace profile --device HOST/cpu:0``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys


def run_cli(args) -> int:
    from autoplace.cluster import ClusterError

    try:
        return _run(args)
    except ClusterError as e:
        print(f"autoplace cluster: error: {e}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _connected(address: str):
    """Within: connected to the Ray cluster at ``address`` (unless already), disconnected
    after if this made the connection."""
    from autoplace.cluster._ray import ClusterError, import_ray

    ray = import_ray()
    ours = not ray.is_initialized()
    if ours:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING")
        except ConnectionError as e:
            raise ClusterError(f"no Ray cluster at {address!r} ({e}); start one with "
                               "'ray start --head --labels autoplace-host=NAME'") from None
    try:
        yield
    finally:
        if ours:
            ray.shutdown()


def profile_hosts(args, models, specs=None) -> int:
    """Time ``models``' workloads on each host device of ``specs`` (default: every host's) on
    its host, into ``args.db`` (:func:`autoplace.cluster.profile_on_hosts`), and print the
    report as ``autoplace profile`` does. Returns the exit status."""
    from autoplace.cluster import ClusterError, profile_on_hosts
    from autoplace.profile import ProfileStore, TimingPolicy

    if not models:
        raise ValueError("nothing to profile on the hosts: pass --model zoo:NAME / FILE.onnx")
    policy = TimingPolicy(cv_target=getattr(args, "cv", 0.03),
                          budget_s=getattr(args, "budget", 2.0))
    try:
        with _connected(args.address), ProfileStore(args.db) as store:
            try:
                report = profile_on_hosts(models, store, specs, policy=policy,
                                          passes=getattr(args, "passes", 1),
                                          progress=not args.json)
            except KeyboardInterrupt:
                print(f"interrupted; everything measured so far is in {args.db}: run the same "
                      "command again to resume", file=sys.stderr)
                return 130
            counts = store.counts()
    except ClusterError as e:
        print(f"autoplace {args.command}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**report.to_dict(), "store": counts}, indent=1))
    else:
        print(report.table())
        print(f"store {args.db}: {counts['measurements']} measurements "
              f"({counts['unsupported']} unsupported); the hosts' links and actor calls: "
              f"autoplace cluster --measure-links --db {args.db}")
    return 1 if any(d.error for d in report.devices) else 0


def _run(args) -> int:
    from autoplace.cluster import cluster_devices, hosts

    if args.profile:
        from autoplace import zoo

        if args.measure_links and args.json:
            raise ValueError("--profile and --measure-links print a JSON report each: run them "
                             "as two commands, or drop --json")
        status = profile_hosts(args, [(spec, zoo.from_spec(spec).mod) for spec in args.model],
                               args.device or None)
        if status or not args.measure_links:
            return status
    elif args.model or args.device:
        raise ValueError("--model and --device name what --profile times: add --profile")
    with _connected(args.address):
        found = hosts()
        devices = cluster_devices()
        fits, calls = [], []
        if args.measure_links:
            from autoplace.cluster.calls import HOW, measure_call_overheads
            from autoplace.cluster.links import host_fingerprint, measure_host_links
            from autoplace.cluster.objects import measure_object_costs
            from autoplace.profile import ProfileStore

            with ProfileStore(args.db) as store:
                measure_host_links(store, again=args.again)
                measure_call_overheads(store, again=args.again)
                measure_object_costs(store, again=args.again)
                names = {host_fingerprint(h.name): h.name for h in found}
                fits = [f for f in store.links() if f.src in names and f.dst in names]
                fits = [{"src": names[f.src], "dst": names[f.dst], "alpha_s": f.alpha_s,
                         "beta_bps": f.beta_bps, "r2": f.r2} for f in fits]
                got = {(f.device, f.kind): f.seconds for f in store.overheads()
                       if f.detail.get("how") == HOW}
                calls = [{"host": h.name, "actor_s": got[(fp, "call")],
                          "driver_s": got[(fp, "stage")], "one_s": got[(fp, "segment")]}
                         for h in found for fp in [host_fingerprint(h.name)]
                         if all((fp, k) in got for k in ("call", "stage", "segment"))]
    if args.json:
        print(json.dumps({"hosts": [{"name": h.name, "node_id": h.node_id, "address": h.address,
                                     "cpus": h.cpus,
                                     "devices": [d.spec for d in h.devices()]} for h in found],
                          "devices": [d.to_dict() for d in devices], "links": fits,
                          "calls": calls}, indent=1))
        return 0
    print(f"{'host':<16} {'address':<16} {'cpus':>4}  {'node':<12}  devices")
    for h in found:
        print(f"{h.name:<16} {h.address:<16} {h.cpus:>4}  {h.node_id[:12]:<12}  "
              f"{' '.join(d.spec for d in h.devices())}")
    for f in fits:
        print(f"link {f['src']} -> {f['dst']}: {f['alpha_s'] * 1e6:.0f} us + bytes / "
              f"{f['beta_bps'] / 1e9:.3g} GB/s (r2 {f['r2']:.3f})")
    for c in calls:
        print(f"call of an actor on {c['host']}: {c['actor_s'] * 1e6:.0f} us CPU in the actor, "
              f"{c['driver_s'] * 1e6:.0f} us in this driver; {c['one_s'] * 1e6:.0f} us from "
              "submission to result, one at a time")
    return 0


def register_cli(sub) -> None:
    """Add the ``cluster`` subcommand to an argparse subparsers object."""
    p = sub.add_parser(
        "cluster", help="list a Ray cluster's hosts and devices; time links and calls",
        description="List the hosts of a running Ray cluster and their devices (use them as "
                    "--device HOST/cpu:0). A host is named by its node's autoplace-host label "
                    "('ray start --labels autoplace-host=NAME'), else its hostname. "
                    "Needs Ray: pip install 'autoplace[cluster]'.",
        epilog="examples:\n  autoplace cluster --address auto\n"
               "  autoplace cluster --address 10.0.0.1:6379 --measure-links --db prof.db\n"
               "  autoplace cluster --profile --model zoo:mlp --db prof.db\n"
               "  autoplace cluster --profile --model zoo:mlp --device node2/cpu:0 --db prof.db\n"
               "\n--profile times every distinct workload of each --model on each host's "
               "devices (or\nthe --device HOST/cpu:N given), on that host, as 'autoplace "
               "profile' does here;\nresumable: what the store holds is not timed again. "
               "autoplace.cluster.host_cost_model\ncharges a host's device its measured costs.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="auto",
                   help="the cluster's address, as ray.init takes it (default auto)")
    p.add_argument("--measure-links", action="store_true",
                   help="time the link between every ordered pair of hosts, the call "
                        "of an actor on each host and a tensor through the object store "
                        "between each pair of ends, into --db")
    p.add_argument("--profile", action="store_true",
                   help="time the ops of each --model on each host's devices, on that host, "
                        "into --db")
    p.add_argument("--model", action="append", default=[],
                   help="--profile: a model whose ops to time (zoo:NAME or FILE.onnx; repeatable)")
    p.add_argument("--device", action="append", default=[],
                   help="--profile: a host's device, HOST/cpu:N (repeatable; default: every "
                        "host's)")
    p.add_argument("--db", default="profile.db",
                   help="profile store for --measure-links and --profile")
    p.add_argument("--again", action="store_true", help="time links and calls the store has")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_cli)
