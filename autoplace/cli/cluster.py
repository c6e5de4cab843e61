"""``autoplace cluster``: the hosts of a Ray cluster and their devices, and the links between
them and the call of an actor on each timed into a profile store."""

from __future__ import annotations

import argparse
import json
import sys


def run_cli(args) -> int:
    from autoplace.cluster import ClusterError

    try:
        return _run(args)
    except ClusterError as e:
        print(f"autoplace cluster: error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from autoplace.cluster import cluster_devices, hosts
    from autoplace.cluster._ray import ClusterError, import_ray

    ray = import_ray()
    ours = not ray.is_initialized()
    if ours:
        try:
            ray.init(address=args.address, include_dashboard=False, log_to_driver=False,
                     logging_level="WARNING")
        except ConnectionError as e:
            raise ClusterError(f"no Ray cluster at {args.address!r} ({e}); start one with "
                               "'ray start --head --labels autoplace-host=NAME'") from None
    try:
        found = hosts()
        devices = cluster_devices()
        fits, calls = [], []
        if args.measure_links:
            from autoplace.cluster.calls import HOW, measure_call_overheads
            from autoplace.cluster.links import host_fingerprint, measure_host_links
            from autoplace.profile import ProfileStore

            with ProfileStore(args.db) as store:
                measure_host_links(store, again=args.again)
                measure_call_overheads(store, again=args.again)
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
    finally:
        if ours:
            ray.shutdown()
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
               "  autoplace cluster --address 10.0.0.1:6379 --measure-links --db prof.db",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default="auto",
                   help="the cluster's address, as ray.init takes it (default auto)")
    p.add_argument("--measure-links", action="store_true",
                   help="time the link between every ordered pair of hosts, and the call "
                        "of an actor on each host, into --db")
    p.add_argument("--db", default="profile.db", help="profile store for --measure-links")
    p.add_argument("--again", action="store_true", help="time links and calls the store has")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_cli)
