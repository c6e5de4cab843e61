"""Profile the zoo on this machine's CPU: the campaign's speed, spread, copy fits, whole models.

The campaign's throughput (workloads per minute), dedup, spread, copy fits, and how well the
per-op profile predicts each whole model.

Run: .venv/bin/python -m benchmarks profile_campaign [--db prof.db] [--models a,b]
     [--sweep OP[:N[:FAMILY]]] [--passes K] [--export NAME.json]
With an existing --db, only what is missing is measured (the campaign resumes).
"""

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from autoplace import zoo
from autoplace.devices import Device
from autoplace.profile import DeviceProfile, ProfileStore, run_campaign
from autoplace.profile.links import fit_link
from autoplace.profile.sweeps import from_specs, sweep_families


def _campaign(args, store):
    models = [(f"zoo:{n}", zoo.load(n).mod) for n in args.models.split(",")]
    if args.sweep:
        models += from_specs(args.sweep)
    t0 = time.perf_counter()
    rep = run_campaign(models, args.device, store, progress=True, passes=args.passes)
    wall = time.perf_counter() - t0
    d = rep.devices[0]
    print(f"\n== campaign on {', '.join(args.device)} ({d.fingerprint})")
    print(f"{len(rep.models)} models, {rep.nodes} op nodes, {rep.workloads} distinct workloads: "
          f"dedup ratio {rep.nodes / rep.workloads:.2f} nodes per workload")
    zoo_nodes = sum(v for k, v in rep.models.items() if k.startswith("zoo:"))
    print(f"zoo alone: {zoo_nodes} op nodes")
    if d.measured:
        print(f"took {d.measured} timings ({args.passes} pass(es); {d.unsupported} workloads "
              f"unsupported) in {d.seconds:.1f} s: {60 * d.measured / d.seconds:.0f} timings/min "
              f"(campaign wall {wall:.1f} s, incl. import and links)")
    else:
        print("nothing new to measure (the store already holds everything)")
    return d.fingerprint


def _spread(store, fp):
    ms = [m for m in store.measurements(fp) if m.ok]
    cv = np.array([m.cv for m in ms])
    rep = np.array([m.repeats for m in ms])
    med = np.array([m.latency_s for m in ms])
    print(f"\n== spread of {len(ms)} workloads (CV = std/mean of the repeats)")
    print("CV p50 {:.3f}  p90 {:.3f}  p99 {:.3f}  max {:.3f};  share CV<=0.03: {:.0%}, "
          "<=0.10: {:.0%}".format(*np.percentile(cv, [50, 90, 99]), cv.max(),
                                 np.mean(cv <= 0.03), np.mean(cv <= 0.10)))
    print(f"repeats p50 {np.median(rep):.0f}, max {rep.max()};  latency "
          f"p50 {np.median(med) * 1e6:.1f} us, max {med.max() * 1e3:.2f} ms")
    for lo, hi in ((0, 1e-5), (1e-5, 1e-4), (1e-4, 1e-3), (1e-3, np.inf)):
        sel = (med >= lo) & (med < hi)
        if sel.any():
            print(f"  latency {lo * 1e6:>7.0f}-{hi * 1e6:<7.0f} us: {sel.sum():4d} workloads, "
                  f"CV p50 {np.median(cv[sel]):.3f}, p90 {np.percentile(cv[sel], 90):.3f}")


def _links(store):
    print("\n== copy fits (t = alpha + bytes / beta, weighted least squares)")
    for f in store.links():
        sizes = np.array([p[0] for p in f.points], dtype=float)
        t = np.array([p[1] for p in f.points])
        rel = np.abs(f.alpha_s + sizes / f.beta_bps - t) / t
        print(f"{f.src} -> {f.dst}: alpha {f.alpha_s * 1e6:.2f} us, beta {f.beta_bps / 1e9:.2f} GB/s, "
              f"R2 {f.r2:.4f}, max relative error {rel.max():.0%} over {len(sizes)} sizes "
              f"({sizes.min() / 1024:.0f} KiB .. {sizes.max() / 2**20:.0f} MiB)")
        a, b, r2 = fit_link(f.points)
        assert np.isclose(a, f.alpha_s) and np.isclose(b, f.beta_bps)  # stored fit = refit


def _whole_models(args, prof):
    from autoplace.profile.whole_model import check

    print("\n== whole model vs the per-op profile (fastest of 20 repeats; errors = "
          "(pred - measured) / measured)")
    print(f"{'model':<18}{'ops':>4}{'kernels':>8}{'measured ms':>12}{'cv':>6}{'op sum ms':>10}"
          f"{'err':>7}{'kernel sum':>11}{'err':>7}{'group max':>10}{'err':>7}")
    dev = Device.from_spec(args.device[0])
    for name in args.models.split(","):
        m = zoo.load(name)
        c = check(m.mod, dev, prof.latency_s, inputs=m.inputs)
        g = c.estimate("max")
        print(f"{name:<18}{c.nodes:>4}{c.kernels:>8}{c.measured * 1e3:>12.3f}{c.timing.cv:>6.2f}"
              f"{c.op_sum * 1e3:>10.3f}{c.op_sum_error:>+7.0%}{c.kernel_sum * 1e3:>11.3f}"
              f"{c.kernel_sum_error:>+7.0%}{g.seconds * 1e3:>10.3f}{g.error:>+7.0%}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", help="profile store (default: a temporary file)")
    ap.add_argument("--models", default=",".join(zoo.names()))
    ap.add_argument("--sweep", action="append", default=[],
                    help=f"OP[:N[:FAMILY]] shape sweep, FAMILY one of "
                         f"{', '.join(sweep_families())} (repeatable)")
    ap.add_argument("--device", action="append", help="default: cpu:0 and cpu:1 (the same cores: "
                    "measured once, and the copy between them fitted)")
    ap.add_argument("--passes", type=int, default=1,
                    help="occasions to time each workload on (the fastest is kept)")
    ap.add_argument("--export", help="write the device's profile JSON here")
    args = ap.parse_args()
    args.device = args.device or ["cpu:0", "cpu:1"]
    db = args.db or str(Path(tempfile.mkdtemp()) / "profile.db")
    with ProfileStore(db) as store:
        fp = _campaign(args, store)
        _spread(store, fp)
        _links(store)
        _whole_models(args, DeviceProfile.from_store(store, fp))
        if args.export:
            import json

            Path(args.export).write_text(json.dumps(store.export_profile(fp), indent=1) + "\n")
            print(f"\nwrote {args.export}")


if __name__ == "__main__":
    main()
