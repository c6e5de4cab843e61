"""A pipeline plan over the two hosts of a Ray cluster on this machine: per-hop overhead of Ray's
paths beside the in-process pipeline's, the host links, and a plan's measured against predicted
throughput beside the best one-host plan.

Run: .venv/bin/python -m benchmarks cluster_pipeline [--inputs 64] [--width 256] [--layers 4]

Starts a ``ray.cluster_utils.Cluster`` of two nodes, hosts ``alpha`` and ``beta``, one CPU and a
200 MB object store each, and prints:

1. Per-hop overhead, a 4 KiB array through two pass-through actors (one per host): plain actor
   calls (``.remote``, each actor's result handed to the next as an object ref) against Ray's
   compiled graph (``ray.dag``, ``experimental_compile``), one input at a time (round trip) and
   eight in flight (streaming), microseconds per input (median of 3 runs).
2. A tiny model (relu then exp of a 16x64 array; no compute to speak of) as one stage and as two,
   per input: ``RayPipeline`` (stages on alpha, then beta) and the in-process ``Pipeline`` (two
   CPU devices, one thread each), micro-batches of 1 and of 8.
3. The host links, timed and fitted (``measure_host_links``).
4. An MLP (``--layers`` matmul+tanh of ``--width``, batch 64): ``autoplace.optimize`` over
   ``alpha/cpu:0`` and ``beta/cpu:1`` (objective throughput, the host links, the Ray pipeline's
   per-stage cost from 2. as ``stage_overhead_s``, no replicas: a cluster does not run them
   yet), run by ``RayPipeline`` over ``--inputs`` inputs: measured and predicted inputs/s, and
   the same for the best one-host plan (every op on alpha, one stage, one actor).

Both nodes share this machine's cores: with two cores, the driver, two actors and Ray's own
processes contend, as they would not on two machines.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

STORE = 200 * 2**20


def start():
    import ray
    from ray.cluster_utils import Cluster

    from autoplace.cluster import HOST_LABEL

    c = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, object_store_memory=STORE, include_dashboard=False,
        labels={HOST_LABEL: "alpha"}))
    c.add_node(num_cpus=1, object_store_memory=STORE, labels={HOST_LABEL: "beta"})
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    c.wait_for_nodes()
    return c


def hop_overhead(n: int = 300) -> dict:
    """Microseconds per input through two pass-through actors, alpha then beta."""
    import ray
    from ray.dag import InputNode
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from autoplace.cluster import hosts
    from autoplace.cluster.links import _Endpoint

    remote = ray.remote(_Endpoint)
    a, b = (remote.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        h.node_id, soft=False)).remote() for h in hosts())
    x = np.zeros(1024, dtype="float32")

    def plain(inflight):
        t0, pending = time.perf_counter(), []
        for _ in range(n):
            pending.append(b.echo.remote(a.echo.remote(x)))
            if len(pending) >= inflight:
                ray.get(pending.pop(0))
        ray.get(pending)
        return (time.perf_counter() - t0) / n * 1e6

    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    compiled = dag.experimental_compile()

    def graph(inflight):
        t0, pending = time.perf_counter(), []
        for _ in range(n):
            pending.append(compiled.execute(x))
            if len(pending) >= inflight:
                ray.get(pending.pop(0))
        for p in pending:
            ray.get(p)
        return (time.perf_counter() - t0) / n * 1e6

    out = {}
    try:
        for name, fn in (("plain", plain), ("compiled", graph)):
            fn(1)  # warm up
            for inflight in (1, 8):
                out[(name, inflight)] = statistics.median(fn(inflight) for _ in range(3))
    finally:
        compiled.teardown()
        for actor in (a, b):
            ray.kill(actor)
    return out


def tiny_model():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.relu(x))
            out = bb.emit_output(relax.op.exp(a))
        bb.emit_func_output(out)
    return bb.get()


def mlp(width: int, layers: int):
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32")
                h = bb.emit(relax.op.tanh(relax.op.matmul(h, relax.const(w))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def plan_of(mod, devices, stages):
    import autoplace

    g = autoplace.OpGraph.from_relax(mod)
    return autoplace.Plan.from_assignment(g, devices, [devices[s].name for s in stages],
                                          stages=tuple(stages), objective="throughput")


def per_input(pipe, xs, rounds: int = 3) -> float:
    """Median seconds per input of ``pipe.run`` over ``xs`` (after a warm-up run)."""
    pipe.run([x] for x in xs[:8])
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        pipe.run([x] for x in xs)
        times.append((time.perf_counter() - t0) / len(xs))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    import ray

    import autoplace
    from autoplace.cluster import RayPipeline, host_links, measure_host_links
    from autoplace.devices import Device
    from autoplace.run import Pipeline
    from autoplace.solve import simulate_throughput

    cluster = start()
    try:
        print("1. per input through two actors (alpha, beta), 4 KiB, us (median of 3 runs)")
        hops = hop_overhead()
        for (name, inflight), us in hops.items():
            print(f"   {name:<9} {inflight} in flight: {us:8.0f}")

        print("2. tiny model (relu, exp of 16x64), us per input")
        mod = tiny_model()
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((16, 64)).astype("float32") for _ in range(200)]
        alpha, beta = Device.cpu(0, host="alpha"), Device.cpu(1, host="beta")
        ray_s = {}
        for k, stages in ((1, [0, 0]), (2, [0, 1])):
            with RayPipeline.from_plan(mod, plan_of(mod, [alpha, beta], stages)) as pipe:
                ray_s[k] = per_input(pipe, xs)
        local = [Device.cpu(0), Device.cpu(1)]
        local_s = {}
        for k, stages in ((1, [0, 0]), (2, [0, 1])):
            for mb in (1, 8):
                with Pipeline.from_plan(mod, plan_of(mod, local, stages), num_threads=1,
                                        micro_batch=mb) as pipe:
                    local_s[(k, mb)] = per_input(pipe, xs)
        print(f"   RayPipeline      1 stage {ray_s[1] * 1e6:8.0f}   2 stages {ray_s[2] * 1e6:8.0f}")
        for mb in (1, 8):
            print(f"   Pipeline (mb {mb})  1 stage {local_s[(1, mb)] * 1e6:8.0f}   "
                  f"2 stages {local_s[(2, mb)] * 1e6:8.0f}")

        print("3. host links (Ray object transfer)")
        fits = measure_host_links()
        names = {autoplace.cluster.host_fingerprint(h): h for h in ("alpha", "beta")}
        for f in fits:
            print(f"   {names[f.src]} -> {names[f.dst]}: alpha {f.alpha_s * 1e6:.0f} us, "
                  f"beta {f.beta_bps / 1e9:.3g} GB/s, r2 {f.r2:.3f}")

        print(f"4. MLP {args.layers} x (matmul {args.width}, tanh), batch 64; "
              f"{args.inputs} inputs")
        mod = mlp(args.width, args.layers)
        devs = [alpha, beta]
        res = autoplace.optimize(mod, devs, objective="throughput", links=host_links(devs, fits),
                                 stage_overhead_s=ray_s[2], replicate=False,
                                 baseline_guard=False)
        plan = res.plan
        print("   " + str(plan).replace("\n", "\n   "))
        xs = [rng.standard_normal((64, args.width)).astype("float32")
              for _ in range(args.inputs)]
        one = plan_of(mod, devs, [0] * len(plan.nodes))
        one_pred = simulate_throughput(res.problem, [0] * len(plan.nodes), [0] * len(plan.nodes))
        rows = [("plan", plan, plan.predicted_s), ("one host", one, one_pred)]
        print(f"   {'':<10}{'measured/s':>11}{'predicted/s':>12}{'m/p':>6}")
        measured = {}
        for name, p, pred in rows:
            with RayPipeline.from_plan(mod, p) as pipe:
                measured[name] = per_input(pipe, xs)
                busy = pipe.stats
            print(f"   {name:<10}{1 / measured[name]:>11.2f}{1 / pred:>12.2f}"
                  f"{pred / measured[name]:>6.2f}   ({busy})")
        print(f"   plan over one host: {measured['one host'] / measured['plan']:.2f}x measured, "
              f"{one_pred / plan.predicted_s:.2f}x predicted")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
