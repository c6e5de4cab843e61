"""A pipeline plan over the two hosts of a Ray cluster on this machine: per-hop overhead of Ray's
paths beside the in-process pipeline's, the host links, and a plan's measured against predicted
throughput beside the best one-host plan, and a latency plan over the hosts.

Run: .venv/bin/python -m benchmarks cluster_pipeline [--inputs 64] [--widths 256 64] [--layers 4]
     [--rounds 3] [--models zoo:resnet mobilenet_v3_small ...]

Starts a ``ray.cluster_utils.Cluster`` of two nodes, hosts ``alpha`` and ``beta``, one CPU and a
200 MB object store each, and prints:

1. Per-hop overhead, a 4 KiB array through two pass-through actors (one per host): plain actor
   calls (``.remote``, each actor's result handed to the next as an object ref) against Ray's
   compiled graph (``ray.dag``, ``experimental_compile``), one input at a time (round trip) and
   eight in flight (streaming), microseconds per input (median of 3 runs).
2. A tiny model (relu then exp of a 16x64 array; no compute to speak of) as one stage and as two,
   per input: ``RayPipeline`` (stages on alpha, then beta) and the in-process ``Pipeline`` (two
   CPU devices, one thread each), micro-batches of 1 and of 8.
3. The host links, timed and fitted (``measure_host_links``), and the call of a stage on each
   host (``measure_call_overheads``: CPU seconds per call in the actor, in this driver and in
   the cluster's daemons on the host's machine, eight in flight and one at a time; the
   machine's address, cores and compute slowdown with every core busy), and what a tensor
   costs in CPU through the object store between each pair of ends, this driver and the hosts
   (``measure_object_costs``: beyond one passed inline, per side, ``alpha + beta * bytes``).
4. Per ``--widths`` entry, an MLP (``--layers`` matmul+tanh of that width, batch 64):
   ``autoplace.optimize`` over ``alpha/cpu:0`` and ``beta/cpu:1`` (objective throughput, the
   host links and the hosts' calls of 3., ``host_overheads``; replicas and the guard off, to
   see the solver's pipeline), run by ``RayPipeline`` over ``--inputs`` inputs: measured and
   predicted inputs/s, and the prediction as if each host had a machine of its own (``apart``:
   the problem without its ``machines``); the same for the one-host plan (every op on alpha,
   one stage, one actor) and for replicas of the whole model on both hosts; the plan's line on
   the machine the hosts share, as ``explain()`` gives it. The same for each model of
   ``--models`` (``benchmarks/_models.py``: a zoo model, a torchvision CNN, ...), on its
   example input. Where the solver's plan without the object store's figures (3.) is priced
   otherwise, it is run too (``old plan``), priced with them. Beside each: the actors' busy
   seconds (their calls' compute) against the ops' predicted seconds, the share of the
   machine's cores used while it ran by this process and the cluster it started (the driver,
   the actors, Ray's own: ``ours``) and by every other process (``others``), and the CPU
   milliseconds per input of each process of the cluster; and each round's inputs/s (``--rounds``,
   3 by default; the row gives their median) with the share of the cores others held while it
   ran.
5. Latency: two branches of ``--layers`` matmul+tanh of the first width from one input, summed:
   ``autoplace.optimize`` (objective latency, the host links, the hosts' calls one at a time as
   ``segment_overhead_s``, the shared machine), run one input at a time by ``res.compile()``
   (a ``RayModel``), and the one-host plan likewise: the median of 30 calls against the
   prediction, the shares of the cores as in 4., and the CPU milliseconds per call of each
   process of the cluster (the driver, each stage's actor, Ray's daemons).

Both nodes share this machine's cores: with two cores, the driver, two actors and Ray's own
processes contend, as they would not on two machines. The prediction bounds each plan by the
machine's cores over the CPU seconds per input spent there; the ``ours`` and ``others`` columns
show how much of the machine the benchmark had.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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


def process_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of this process and each of its children, by pid: what it is (the
    driver, an actor, a raylet, ...) and its seconds; empty without psutil."""
    try:
        import psutil
    except ImportError:
        return {}
    me, out = psutil.Process(), {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            name = "driver" if proc.pid == me.pid else proc.name().removeprefix("ray::")
            out[proc.pid] = (name, t.user + t.system)
        except psutil.Error:
            pass
    return out


def branches(width: int, layers: int):
    """Two MLP branches of ``layers`` matmul+tanh from one input, summed: a model whose latency
    two hosts can halve."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, width), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            ends = []
            for _ in range(2):
                h = x
                for _ in range(layers):
                    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32")
                    h = bb.emit(relax.op.tanh(relax.op.matmul(h, relax.const(w))))
                ends.append(h)
            out = bb.emit_output(relax.op.add(*ends))
        bb.emit_func_output(out)
    return bb.get()


def latency_rows(width: int, layers: int, devs, fits, calls, rng, calls_n: int = 30) -> None:
    """Step 5: a latency plan of :func:`branches` over the hosts and the one-host plan, each run
    one input at a time by ``res.compile()`` / ``RayModel``: measured (median of ``calls_n``
    calls) against predicted."""
    import autoplace
    from autoplace.cluster import RayModel, host_links, host_overheads

    print(f"5. latency: two branches of {layers} x (matmul {width}, tanh), summed; "
          f"median of {calls_n} calls")
    mod = branches(width, layers)
    res = autoplace.optimize(mod, devs, links=host_links(devs, fits),
                             **host_overheads(devs, calls, "latency"))
    print("   " + str(res.plan).replace("\n", "\n   "))
    print(f"   runs as: {res.delivery}")
    _machine_notes(res)
    x = rng.standard_normal((64, width)).astype("float32")
    one = res.baseline_plans.get(f"only {devs[0].name}")
    n = len(res.plan.nodes)
    rows = [("plan", lambda: res.compile(), res.predicted_latency_s)]
    if one is not None:
        one = dataclasses.replace(one, stages=(0,) * n)
        rows.append(("one host", lambda: RayModel.from_plan(mod, one),
                     res.baselines[f"only {devs[0].name}"]))
    print(f"   {'':<10}{'measured ms':>12}{'predicted ms':>13}{'p/m':>6}{'ours':>6}{'others':>8}")
    for name, build, pred in rows:
        with build() as model:
            for _ in range(3):
                model(x)
            times = []
            cpu0, procs0, t_start = cpu_s(), process_cpu_s(), time.perf_counter()
            for _ in range(calls_n):
                t0 = time.perf_counter()
                model(x)
                times.append(time.perf_counter() - t0)
            wall = (time.perf_counter() - t_start) * os.cpu_count()
            cpu, procs = [(b - a) / wall for a, b in zip(cpu0, cpu_s())], process_cpu_s()
        m = statistics.median(times)
        print(f"   {name:<10}{m * 1e3:>12.2f}{pred * 1e3:>13.2f}{pred / m:>6.2f}{cpu[1]:>6.2f}"
              f"{cpu[0] - cpu[1]:>8.2f}")
        spent = sorted(((t - procs0.get(pid, (kind, 0.0))[1]) / calls_n, kind)
                       for pid, (kind, t) in procs.items())
        print("      CPU ms per call: " + ", ".join(
            f"{kind} {s * 1e3:.1f}" for s, kind in reversed(spent) if s >= 2e-4))


def plan_of(mod, devices, stages):
    import autoplace

    g = autoplace.OpGraph.from_relax(mod)
    return autoplace.Plan.from_assignment(g, devices, [devices[s].name for s in stages],
                                          stages=tuple(stages), objective="throughput")


def per_input(pipe, xs, rounds: int = 3, others: list | None = None) -> float:
    """Median seconds per input of ``pipe.run`` over ``xs`` (an array per input, or a list of
    them: its arguments), after a warm-up run; ``others``, where given, gets each round's
    inputs/s and the share of the cores other processes held while it ran."""
    xs = [x if isinstance(x, list) else [x] for x in xs]
    pipe.run(xs[:8])
    times = []
    for _ in range(rounds):
        cpu0, t0 = cpu_s(), time.perf_counter()
        pipe.run(xs)
        wall = time.perf_counter() - t0
        times.append(wall / len(xs))
        if others is not None:
            cpu = [b - a for a, b in zip(cpu0, cpu_s())]
            others.append((len(xs) / wall, (cpu[0] - cpu[1]) / (wall * os.cpu_count())))
    return statistics.median(times)


def cpu_s() -> tuple[float, float]:
    """CPU seconds spent by every process of this machine (user + system, from /proc/stat) and
    by this one and its children (the driver, and the Ray cluster it started: raylets, GCS,
    actors; ``nan`` without psutil), so far."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system = (int(v) for v in fields[:3])
    irq, softirq = (int(v) for v in fields[5:7])
    machine = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    ours = process_cpu_s()  # this process among them: empty only without psutil
    return machine, sum(s for _, s in ours.values()) if ours else float("nan")


def mlp_rows(width: int, layers: int, inputs: int, devs, fits, calls, rng,
             rounds: int = 3) -> None:
    """Step 4 for one MLP: the solver's plan, one host and replicas, measured and predicted."""
    print(f"4. MLP {layers} x (matmul {width}, tanh), batch 64; {inputs} inputs")
    plan_rows(mlp(width, layers),
              [rng.standard_normal((64, width)).astype("float32") for _ in range(inputs)],
              devs, fits, calls, rounds)


def model_rows(name: str, inputs: int, devs, fits, calls, rounds: int = 3) -> None:
    """Step 4 for a model of ``_models`` (``--models``): a family the MLPs are not."""
    import _models

    mod, example = _models.relax_and_inputs(name)
    print(f"4. {name}; {inputs} inputs")
    plan_rows(mod, [[np.asarray(x) for x in example]] * inputs, devs, fits, calls, rounds)


def plan_rows(mod, xs, devs, fits, calls, rounds: int = 3) -> None:
    """The solver's throughput plan of ``mod`` over ``devs``, one host and replicas, each run
    on inputs ``xs`` (a list of arguments per input), measured and predicted."""
    import autoplace
    from autoplace.cluster import RayPipeline, host_links, host_overheads
    from autoplace.solve import simulate_replicas, simulate_throughput

    res = autoplace.optimize(mod, devs, objective="throughput", links=host_links(devs, fits),
                             replicate=False, baseline_guard=False,
                             **host_overheads(devs, calls))
    plan, p = res.plan, res.problem
    print("   " + str(plan).replace("\n", "\n   "))
    _machine_notes(res)
    n = len(plan.nodes)
    one = plan_of(mod, devs, [0] * n)
    reps = autoplace.Plan.from_assignment(
        autoplace.OpGraph.from_relax(mod), devs, [devs[0].name] * n, stages=(0,) * n,
        objective="throughput", replicas=tuple(d.name for d in devs))
    apart = dataclasses.replace(p, machines=None)  # as if each host had its own machine
    stages = np.asarray(res.solution.stages)
    rows = [("plan", plan, plan.predicted_s,
             simulate_throughput(apart, res.solution.assignment, stages)),
            ("one host", one, simulate_throughput(p, [0] * n, [0] * n),
             simulate_throughput(apart, [0] * n, [0] * n)),
            ("replicas", reps, simulate_replicas(p, [0, 1]), simulate_replicas(apart, [0, 1]))]
    # The plan the solver makes without the object store's figures, where it differs: priced
    # with them (what the prediction now says of it) and run.
    from autoplace.cluster.objects import HOW as OBJECTS

    bare = [f for f in calls if f.detail.get("how") != OBJECTS]
    if len(bare) < len(calls):
        old = autoplace.optimize(mod, devs, objective="throughput",
                                 links=host_links(devs, fits), replicate=False,
                                 baseline_guard=False, **host_overheads(devs, bare))
        a0, s0 = old.solution.assignment, np.asarray(old.solution.stages)
        if abs(simulate_throughput(p, a0, s0) - plan.predicted_s) > 1e-3 * plan.predicted_s:
            print("   without the object store's figures the solver's plan is (\"old plan\"):")
            print("   " + str(old.plan).replace("\n", "\n   "))
            from autoplace.report.explain import machine_lines

            for line in machine_lines(p, old.solution, {d.name: d.host for d in devs}):
                print(f"   {line}")
            rows.append(("old plan", old.plan, simulate_throughput(p, a0, s0),
                         simulate_throughput(apart, a0, s0)))
    print(f"   {'':<10}{'measured/s':>11}{'predicted/s':>12}{'m/p':>6}{'apart/s':>9}"
          f"{'m/p':>6}{'busy/ops':>10}{'ours':>6}{'others':>8}")
    measured = {}
    for name, pl, pred, pred_apart in rows:
        with RayPipeline.from_plan(mod, pl) as pipe:
            cpu0, procs0, t0 = cpu_s(), process_cpu_s(), time.perf_counter()
            each: list = []
            measured[name] = per_input(pipe, xs, rounds, others=each)
            wall = (time.perf_counter() - t0) * os.cpu_count()
            cpu, procs = [(b - a) / wall for a, b in zip(cpu0, cpu_s())], process_cpu_s()
            stats = pipe.stats
        # The ops' predicted seconds per input on each worker, against the seconds its calls
        # were busy (the last run's): how much slower the compute ran than its costs.
        ops = (p.cost[np.arange(n), _devices(pl, devs)].sum() if not pl.replicas
               else p.cost[:, [0, 1]].sum(axis=0).mean())
        busy = sum(stats.busy_s) / stats.inputs
        print(f"   {name:<10}{1 / measured[name]:>11.2f}{1 / pred:>12.2f}"
              f"{pred / measured[name]:>6.2f}{1 / pred_apart:>9.2f}"
              f"{pred_apart / measured[name]:>6.2f}{busy / ops:>10.2f}{cpu[1]:>6.2f}"
              f"{cpu[0] - cpu[1]:>8.2f}"
              f"   ({stats})")
        n_in = 8 + rounds * len(xs)  # per_input's warm-up and rounds
        spent = sorted(((t - procs0.get(pid, (kind, 0.0))[1]) / n_in, kind)
                       for pid, (kind, t) in procs.items())
        print("      rounds: " + ", ".join(f"{r:.2f}/s (others {o:.2f})" for r, o in each))
        print("      CPU ms per input: " + ", ".join(
            f"{kind} {s * 1e3:.2f}" for s, kind in reversed(spent) if s >= 2e-5))
    print(f"   plan over one host: {measured['one host'] / measured['plan']:.2f}x measured, "
          f"{rows[1][2] / plan.predicted_s:.2f}x predicted")


def _machine_notes(res) -> None:
    """The lines ``res.explain()`` gives on the machines its hosts share."""
    from autoplace.report.explain import machine_lines

    for line in machine_lines(res.problem, res.solution,
                              {d.name: d.host for d in res.plan.devices}):
        print(f"   {line}")


def _devices(plan, devs) -> list[int]:
    """Each node's device index in ``devs``."""
    names = [d.name for d in devs]
    return [names.index(a) for a in plan.assignment]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", type=int, default=64)
    ap.add_argument("--widths", type=int, nargs="+", default=[256, 64])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3,
                    help="step 4: rounds of --inputs inputs per row (its figure: their median)")
    ap.add_argument("--models", nargs="*", default=[],
                    help="step 4 also on these models of benchmarks/_models.py (zoo:NAME, "
                         "torchvision's, transformers')")
    ap.add_argument("--steps", default="1,2,3,4,5",
                    help="which steps to run (3, the links and calls, always runs)")
    args = ap.parse_args()

    import ray

    import autoplace
    from autoplace.cluster import (measure_call_overheads, measure_host_links,
                                   measure_object_costs)
    from autoplace.devices import Device

    cluster = start()
    try:
        steps = {int(k) for k in args.steps.split(",")}
        rng = np.random.default_rng(1)
        alpha, beta = Device.cpu(0, host="alpha"), Device.cpu(1, host="beta")
        if 1 in steps:
            hop_rows()
        if 2 in steps:
            tiny_rows(alpha, beta)

        print("3. host links (Ray object transfer) and the call of an actor on each host")
        fits = measure_host_links()
        names = {autoplace.cluster.host_fingerprint(h): h for h in ("alpha", "beta")}
        for f in fits:
            print(f"   {names[f.src]} -> {names[f.dst]}: alpha {f.alpha_s * 1e6:.0f} us, "
                  f"beta {f.beta_bps / 1e9:.3g} GB/s, r2 {f.r2:.3f}")
        calls = measure_call_overheads()
        for f in calls:
            what = ("wall from submission to result, one at a time" if f.kind == "segment" else
                    f"CPU in the {f.detail['side']}")
            print(f"   call on {f.detail['host']}: {f.seconds * 1e6:.0f} us {what}")
            if f.kind == "call":
                print(f"   call on {f.detail['host']}: "
                      f"{f.detail.get('daemons_cpu_s', float('nan')) * 1e6:.0f} us CPU in the "
                      f"cluster's daemons on its machine ({f.detail['machine']}, "
                      f"{f.detail['machine_cores']} cores, compute "
                      f"{f.detail['machine_slowdown']:.3f}x as long with every core busy; "
                      f"driver at {f.detail['driver_machine']})")
            if f.kind == "call":
                sh, sp, by = f.detail["shares"], f.detail["spaced"], f.detail["beyond"]
                print(f"   call on {f.detail['host']}, inputs {sp['wall'] * 1e3:.1f} ms apart: "
                      f"CPU per call actor {sp['actor'] * 1e6:.0f} us, driver "
                      f"{sp['driver'] * 1e6:.0f} us, daemons {sp['daemons'] * 1e6:.0f} us; "
                      f"so while a plan runs they keep {sh['actor']:.3f}, {sh['driver']:.3f}, "
                      f"{sh['daemons']:.3f} of a core busy, and a call costs beyond that "
                      f"{by['actor'] * 1e6:.0f}, {by['driver'] * 1e6:.0f}, "
                      f"{by['daemons'] * 1e6:.0f} us")
            if f.kind == "segment":
                print(f"   call on {f.detail['host']} one at a time, CPU beyond the shares: actor "
                      f"{f.detail['actor_cpu_s'] * 1e6:.0f} us, driver "
                      f"{f.detail['driver_cpu_s'] * 1e6:.0f} us, daemons "
                      f"{f.detail['daemons_cpu_s'] * 1e6:.0f} us")

        objects = measure_object_costs()
        for f in objects:
            ends = " -> ".join(f.detail[k] or "driver" for k in ("from", "to"))
            print(f"   a tensor {ends} through the object store, CPU beyond an inline one: " +
                  ", ".join(f"{side} {a * 1e6:.0f} us + {b * 1e9:.2f} ns/B"
                            for side, (a, b) in f.detail["fit"].items() if a or b))
        calls = calls + objects
        devs = [alpha, beta]
        if 4 in steps:
            for width in args.widths:
                mlp_rows(width, args.layers, args.inputs, devs, fits, calls, rng, args.rounds)
            for name in args.models:
                model_rows(name, args.inputs, devs, fits, calls, args.rounds)
        if 5 in steps:
            latency_rows(args.widths[0], args.layers, devs, fits, calls, rng)
    finally:
        ray.shutdown()
        cluster.shutdown()


def hop_rows() -> None:
    """Step 1."""
    print("1. per input through two actors (alpha, beta), 4 KiB, us (median of 3 runs)")
    hops = hop_overhead()
    for (name, inflight), us in hops.items():
        print(f"   {name:<9} {inflight} in flight: {us:8.0f}")


def tiny_rows(alpha, beta) -> None:
    """Step 2."""
    from autoplace.cluster import RayPipeline
    from autoplace.devices import Device
    from autoplace.run import Pipeline

    print("2. tiny model (relu, exp of 16x64), us per input")
    mod = tiny_model()
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((16, 64)).astype("float32") for _ in range(200)]
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


if __name__ == "__main__":
    main()
