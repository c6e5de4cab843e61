"""measure_overheads: which fits make each device's figures (stubbed fits, worked out by hand),
and the robust line they rest on."""

import json

import pytest

import autoplace.run.overhead as overhead
from autoplace import Device
from autoplace.run.overhead import (KernelFloor, OverheadFigure, SegmentOverhead, StageOverhead,
                                    measure_overheads, robust_line)

US = 1e-6


def test_robust_line_ignores_one_point_thrown_off_by_load():
    # y = 5 + 2x, but the point at x = 4 was slowed by 30: pairwise slopes
    # 2, 17, 2, 32, 2, -28 -> median 2; y - 2x = 5, 5, 35, 5 -> median 5.
    assert robust_line([2, 3, 4, 5], [9.0, 11.0, 43.0, 15.0]) == (2.0, 5.0)


def _stubbed(monkeypatch, stage_slope, segment_slope, present):
    """Fits that return the given slopes per device-name tuple, and a machine that has
    ``present`` devices (kind, index)."""
    import autoplace.profile.measure as measure

    taken = []

    def stage(devices, **_):
        key = tuple(d.name for d in devices)
        taken.append(("stage", key))
        return StageOverhead(key, (5 * US, 0, 0), 1 * US, stage_slope[key])

    def segment(devices, **_):
        key = tuple(d.name for d in devices)
        taken.append(("segment", key))
        return SegmentOverhead(key, (0, 0), 2 * US, segment_slope[key])

    def kernel(device, **_):  # a kernel costs 3 us on a GPU, 0.5 us on a CPU
        taken.append(("kernel", device.name))
        return KernelFloor(device.name, (1, 2, 3), (0, 0, 0), 9 * US,
                           (3 if device.is_gpu else 0.5) * US)

    def check_present(device, spec=None):
        if (device.kind, device.index) not in present:
            raise measure.DeviceUnavailable(f"{device.kind}:{device.index}: absent")

    monkeypatch.setattr(overhead, "measure_stage_overhead", stage)
    monkeypatch.setattr(overhead, "measure_segment_overhead", segment)
    monkeypatch.setattr(overhead, "measure_kernel_floor", kernel)
    monkeypatch.setattr(measure, "check_present", check_present)
    return taken


def test_a_gpu_is_measured_against_the_cpu_and_its_figure_is_what_the_pair_leaves(monkeypatch):
    cpu, gpu = Device.cpu(0, name="c"), Device.cuda(0, name="g")
    taken = _stubbed(
        monkeypatch,
        # alone: c 10 us, g 20 us; c with this machine's cpu:1 40 us; c and g alternating 60 us.
        {("c",): 10 * US, ("g",): 20 * US, ("c", "cpu1"): 40 * US, ("g", "c"): 60 * US,
         ("c", "g"): 62 * US},
        {("c", "cpu1"): 30 * US, ("g", "c"): 50 * US, ("c", "g"): 51 * US},
        present={("cpu", 0), ("cpu", 1), ("cuda", 0)})
    figures = {(f.device, f.kind, f.peer): f for f in measure_overheads([cpu, gpu])}
    # c: its partner is the machine's cpu:1, same kind: the pair's slopes are its figures.
    assert figures["c", "stage", None].seconds == pytest.approx(40 * US)
    assert figures["c", "segment", None].seconds == pytest.approx(30 * US)
    assert figures["c", "call", None].seconds == 5 * US  # one stage called directly
    # g: alternating with c; the pair costs 60 us a stage on average, so g's stage is
    # 2 * 60 - 40 = 80 us, and its segment 2 * 50 - 30 = 70 us.
    assert figures["g", "stage", None].seconds == pytest.approx(80 * US)
    assert figures["g", "segment", None].seconds == pytest.approx(70 * US)
    assert "twice the pair's slope less c's own figure" in figures["g", "stage", None].detail[
        "method"]
    # The pairs, in both orders: their own slopes.
    assert figures["c", "stage", "g"].seconds == pytest.approx(62 * US)
    assert figures["g", "segment", "c"].seconds == pytest.approx(50 * US)
    assert figures["g", "kernel", None].seconds == pytest.approx(3 * US)
    assert figures["c", "kernel", None].seconds == pytest.approx(0.5 * US)
    assert len(figures) == 4 + 4 + 4
    # Each fit is taken once, however many figures rest on it.
    assert len(taken) == len(set(taken))
    json.dumps([f.detail for f in figures.values()])  # stored as JSON


def test_figures_never_fall_below_the_alone_slope_or_zero(monkeypatch):
    cpu, gpu = Device.cpu(0, name="c"), Device.cuda(0, name="g")
    # One core: c has no partner, so its stage is its alone slope and it has no segment figure;
    # g's pair with c leaves 2 * 25 - 10 = 40 us... below g's alone slope of 45: 45 us. Its
    # segment is the pair's slope (c has none of its own), and a negative slope counts as 0.
    _stubbed(monkeypatch, {("c",): 10 * US, ("g",): 45 * US, ("g", "c"): 25 * US},
             {("g", "c"): -3 * US}, present={("cpu", 0), ("cuda", 0)})
    figures = {(f.device, f.kind): f for f in measure_overheads([cpu, gpu], pairs=())}
    assert figures["c", "stage"].seconds == pytest.approx(10 * US)
    assert "alone" in figures["c", "stage"].detail["method"]
    assert ("c", "segment") not in figures
    assert figures["g", "stage"].seconds == pytest.approx(45 * US)
    assert figures["g", "segment"].seconds == 0.0
    assert "c has no figure of its own" in figures["g", "segment"].detail["method"]


def test_what_to_measure_is_checked():
    a, b = Device.cpu(0, name="a"), Device.cpu(1, name="b")
    with pytest.raises(ValueError, match="distinct names"):
        measure_overheads([a, Device.cpu(1, name="a")])
    with pytest.raises(ValueError, match=r"pair \('a', 'c'\)"):
        measure_overheads([a, b], pairs=[("a", "c")])
    with pytest.raises(ValueError, match="not one of"):
        OverheadFigure("a", "warp", 1e-6)
    with pytest.raises(ValueError, match=r"kernels names \['c'\]"):
        measure_overheads([a, b], kernels=["c"])


def test_a_device_with_its_other_figures_stored_gets_its_kernel_figure_alone(monkeypatch):
    cpu, gpu = Device.cpu(0, name="c"), Device.cuda(0, name="g")
    taken = _stubbed(monkeypatch, {}, {}, present={("cpu", 0), ("cuda", 0)})
    figures = measure_overheads([cpu, gpu], own=(), pairs=(), kernels=["g"])
    assert [(f.device, f.kind, f.seconds) for f in figures] == [("g", "kernel", 3 * US)]
    assert taken == [("kernel", "g")]
    # g's own figures take c's (its partner) too, but c's kernel is not measured.
    taken = _stubbed(monkeypatch, {("c",): 10 * US, ("g",): 20 * US, ("g", "c"): 60 * US},
                     {("g", "c"): 50 * US}, present={("cpu", 0), ("cuda", 0)})
    figures = measure_overheads([cpu, gpu], own=["g"], pairs=())
    assert {(f.device, f.kind) for f in figures if f.kind == "kernel"} == {("g", "kernel")}
    assert [t for t in taken if t[0] == "kernel"] == [("kernel", "g")]


def test_the_kernel_floor_of_this_cpu_is_a_slope_over_real_builds():
    from autoplace.run.overhead import measure_kernel_floor

    fit = measure_kernel_floor(Device.cpu(0), kernels=(1, 4, 8), repeat=20, rounds=1)
    assert fit.kernels == (1, 4, 8) and all(s > 0 for s in fit.seconds)
    assert fit.fixed_s > 0 and fit.per_kernel_s == robust_line(fit.kernels, fit.seconds)[0]
    with pytest.raises(ValueError, match="three or more chain lengths"):
        measure_kernel_floor(Device.cpu(0), kernels=(1, 2))


def test_turns_have_each_function_follow_each_other_as_often():
    from collections import Counter

    order = []
    fns = [lambda k=k: order.append(k) for k in range(3)]
    medians, calls = overhead.turns_s(fns, most=4, budget_s=60.0, least=1, warm=0)
    assert calls == 4 and len(medians) == 3 and all(m >= 0 for m in medians)  # two passes
    assert Counter(order) == {0: 4, 1: 4, 2: 4}
    follows = Counter(zip(order, order[1:] + order[:1]))  # the passes repeat: order is cyclic
    assert len(follows) == 6 and set(follows.values()) == {2}
    order.clear()  # warm: each timed call comes right after an untimed one of its own
    assert overhead.turns_s(fns, most=4, budget_s=60.0, least=1)[1] == 4
    assert Counter(order) == {0: 8, 1: 8, 2: 8} and order[0::2] == order[1::2]
    order.clear()
    overhead.turns_s(fns[:1], most=3, budget_s=60.0, least=1)  # one function: back to back
    assert order == [0, 0, 0]
    assert overhead.call_order(1) == [0] and overhead.call_order(2) == [0, 1]
    # the budget spent: the least
    assert overhead.turns_s(fns, most=10, budget_s=0.0, least=2)[1] == 2


def test_blocks_call_each_function_back_to_back_in_turn():
    order = []
    fns = [lambda k=k: order.append(k) for k in range(3)]
    medians, calls = overhead.blocks_s(fns, block_s=0.0, rounds=3, least=2, warm=1)
    assert calls == 6 and len(medians) == 3 and all(m >= 0 for m in medians)
    # Each round, a block of three calls (one untimed, two timed) each, begun one further on.
    assert order == [0] * 3 + [1] * 3 + [2] * 3 + [1] * 3 + [2] * 3 + [0] * 3 \
        + [2] * 3 + [0] * 3 + [1] * 3
    order.clear()
    medians, calls = overhead.blocks_s(fns[:1], block_s=0.05, rounds=2, least=1, warm=0)
    assert calls == len(order) > 2  # a block goes on until block_s has passed


def test_blocks_stop_timing_a_function_behind_after_two_or_three_rounds(monkeypatch):
    # A clock that moves only when a function runs: each call takes its function's cost.
    clock = [0.0]
    monkeypatch.setattr(overhead.time, "perf_counter", lambda: clock[0])
    order = []

    def fn(k, cost):
        def call():
            order.append(k)
            clock[0] += cost
        return call

    fns = [fn(0, 1.0), fn(1, 1.9), fn(2, 2.5)]
    medians, calls = overhead.blocks_s(fns, block_s=0.0, rounds=5, least=2, warm=0,
                                       drop_above={2: 2.0})
    assert medians == pytest.approx([1.0, 1.9, 2.5])
    # Two rounds of all three; then the one at 2.5x the fastest is out, the 1.9x one is not.
    assert order.count(0) == order.count(1) == 10 and order.count(2) == 4 and calls == 4
    order.clear()
    overhead.blocks_s(fns, block_s=0.0, rounds=5, least=2, warm=0)  # no dropping asked
    assert order.count(2) == 10
    # A tighter factor from the third round on: the 1.9x one is out after three rounds too,
    # and with the fastest alone left, the rounds end.
    order.clear()
    medians, calls = overhead.blocks_s(fns, block_s=0.0, rounds=5, least=2, warm=0,
                                       drop_above={2: 2.0, 3: 1.05})
    assert medians == pytest.approx([1.0, 1.9, 2.5])
    assert order.count(0) == order.count(1) == 6 and order.count(2) == 4 and calls == 4
    # Within the factor (a noisy second function, its blocks overlapping the first's): kept.
    order.clear()
    costs = iter([1.0, 1.0, 1.04, 1.04, 1.2, 1.2] * 5)
    noisy = [fn(0, 1.0), lambda: (order.append(1), clock.__setitem__(0, clock[0] + next(costs)))]
    overhead.blocks_s(noisy, block_s=0.0, rounds=5, least=2, warm=0, drop_above={3: 1.05})
    assert order.count(1) == 10


def test_blocks_take_the_median_of_the_blocks_medians():
    import itertools
    import time

    # Each block's third call takes 50 ms, its first two none: a block's median is the quick
    # calls', where a mean would be 17 ms.
    sleeps = itertools.cycle([0.0, 0.0, 0.05])
    slow = lambda: time.sleep(next(sleeps))  # noqa: E731
    (median,), calls = overhead.blocks_s([slow], block_s=0.0, rounds=3, least=3, warm=0)
    assert calls == 9 and median < 0.01


def test_walls_in_rounds_time_each_callable_per_round_within_their_bounds():
    from autoplace.backend.timing import walls_in_rounds

    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    walls = walls_in_rounds(fns, least=3, most=5, budget_s=0.0)  # past the budget at once
    assert walls.shape == (3, 2) and (walls >= 0).all() and order == ["a", "b"] * 3
    order.clear()
    assert walls_in_rounds(fns, least=1, most=4, budget_s=60.0).shape == (4, 2)  # most
    assert order == ["a", "b"] * 4
