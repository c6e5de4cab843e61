"""Each host's ops timed on that host (two-node Ray cluster): its profile against a stage's compute.

On the cluster of ``cluster_pipeline`` (hosts alpha and beta on this machine, one CPU each), for
each ``--widths`` MLP (``--layers`` x (matmul, tanh), batch 64):

1. ``autoplace.cluster.profile_on_hosts`` times its workloads on each host (an actor on the
   host's node), into a new store; the time it took, and the time of a second run, which times
   nothing.
2. The MLP as one stage on each host (``RayPipeline``, 64 inputs, median of 3 runs): the seconds
   its calls were busy per input against the ops' costs as ``optimize`` charges them, from the
   default cost model (this process's) and from the host's own profile
   (``host_cost_model``).

Printed, not asserted. The hosts share this machine's cores: both profiles describe one CPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from cluster_pipeline import mlp, per_input, plan_of, start


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--widths", type=int, nargs="+", default=[256, 64])
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    import ray

    import autoplace
    from autoplace.cluster import RayPipeline, host_cost_model, profile_on_hosts
    from autoplace.devices import Device
    from autoplace.profile import ProfileStore

    print(f"load average at the start: {', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    cluster = start()
    try:
        devs = [Device.cpu(0, host="alpha"), Device.cpu(1, host="beta")]
        rng = np.random.default_rng(1)
        for width in args.widths:
            mod = mlp(width, args.layers)
            n = len(autoplace.OpGraph.from_relax(mod).nodes)
            with tempfile.TemporaryDirectory() as tmp, \
                    ProfileStore(Path(tmp) / "prof.db") as store:
                t0 = time.perf_counter()
                report = profile_on_hosts(mod, store, devs, progress=False)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                again = profile_on_hosts(mod, store, devs, progress=False)
                second = time.perf_counter() - t0
                models = {d.name: host_cost_model([d], store) for d in devs}
            print(f"MLP {args.layers} x (matmul {width}, tanh), batch 64")
            print("   " + report.table().replace("\n", "\n   "))
            print(f"   profiled on both hosts in {first:.1f} s; again in {second:.1f} s, timing "
                  f"{sum(d.measured for d in again.devices)}")
            xs = [rng.standard_normal((64, width)).astype("float32") for _ in range(args.inputs)]
            print(f"   {'host':<8}{'busy ms':>9}{'wall ms':>9}{'default':>9}{'host prof':>11}"
                  f"{'busy/default':>14}{'busy/host':>11}")
            for d in devs:
                default = autoplace.optimize(mod, [d], objective="throughput", db=None)
                own = autoplace.optimize(mod, [d], objective="throughput", db=None,
                                         cost_model=models[d.name])
                assert set(own.plan.cost_sources) == {"measured"}, own.plan.cost_sources
                costs = default.problem.cost[:, 0].sum(), own.problem.cost[:, 0].sum()
                with RayPipeline.from_plan(mod, plan_of(mod, [d], [0] * n)) as pipe:
                    wall = per_input(pipe, xs)
                    stats = pipe.stats
                busy = sum(stats.busy_s) / stats.inputs
                print(f"   {d.host:<8}{busy * 1e3:>9.3f}{wall * 1e3:>9.3f}{costs[0] * 1e3:>9.3f}"
                      f"{costs[1] * 1e3:>11.3f}{busy / costs[0]:>14.2f}{busy / costs[1]:>11.2f}")
            print(f"   default cost model: {default.cost_model}")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
