"""optimize(): the whole path on real modules, its result, and the errors a user can make."""

import dataclasses

import numpy as np
import pytest

import autoplace
from autoplace import Device, InfeasibleError, zoo


def test_surface_from_the_issue(devs):
    model = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(model.mod)
    plan = autoplace.Plan.from_assignment(g, devs, {n.name: devs[i % 2].name
                                                    for i, n in enumerate(g.nodes)})
    outs = autoplace.compile(model.mod, plan)(*model.inputs)
    res = autoplace.optimize(model.mod, devs)
    assert autoplace.Plan.from_json(res.plan.to_json()) == res.plan
    assert res.predicted_latency_s > 0
    assert "vdevice" in res.mod.script() and "vdevice" not in model.mod.script()
    np.testing.assert_allclose(res.compile()(*model.inputs)[0], outs[0], rtol=1e-5)


def test_plan_predicts_no_worse_than_any_baseline(devs):
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, devs, time_limit=5,
                             cost_model=autoplace.RooflineCostModel(), db=None)
    assert set(res.baselines) == {"only a", "only b", "priority", "greedy"}
    for value in res.baselines.values():
        assert res.predicted_latency_s <= value * (1 + 1e-9)
    assert res.plan.cost_sources == ("roofline",) * len(res.graph)
    assert "predicted latency" in res.summary()


def test_devices_that_cannot_run_an_op_never_get_it():
    devs = [Device.cpu(0, name="a", unsupported_ops={"nn.conv2d"}), Device.cpu(1, name="b")]
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, devs, time_limit=5)
    for node, dev in zip(res.graph.nodes, res.plan.assignment):
        if node.op_type == "nn.conv2d":
            assert dev == "b"


def test_pins_are_respected(devs):
    res = autoplace.optimize(zoo.load("mlp").mod, devs, pins=[("op:nn.relu", "b"), ("name:mm0", "a")])
    for node, dev in zip(res.graph.nodes, res.plan.assignment):
        if node.op_type == "nn.relu":
            assert dev == "b"
    assert res.plan.device_of("mm0").name == "a"


def test_memory_too_small_everywhere_is_infeasible():
    tiny = [Device.cpu(0, name="a", memory_bytes=1000), Device.cpu(1, name="b", memory_bytes=1000)]
    with pytest.raises(InfeasibleError):
        autoplace.optimize(zoo.load("mlp").mod, tiny)


def test_op_no_device_can_run_names_it():
    devs = [Device.cpu(0, name="a", unsupported_ops={"nn.softmax"}),
            Device.cpu(1, name="b", unsupported_ops={"nn.softmax"})]
    with pytest.raises(InfeasibleError, match="gv|softmax|no device"):
        autoplace.optimize(zoo.load("branchy_cnn").mod, devs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(devices=[]), ValueError, "at least one device"),
    (dict(devices=["cpu:0"]), TypeError, "autoplace.Device"),
    (dict(objective="energy"), ValueError, "objective 'energy'"),
    (dict(solver="magic"), ValueError, "unknown solver 'magic'"),
    (dict(time_limit=0), ValueError, "time_limit must be positive"),
    (dict(time_limit=float("nan")), ValueError, "time_limit must be positive"),
    (dict(time_limit=-5), ValueError, "time_limit must be positive"),
    (dict(pins=[("op:nn.relu", "gpu")]), autoplace.PlanError, "names device 'gpu'"),
    (dict(cost_model=object()), TypeError, "predict"),
])
def test_bad_arguments(devs, kwargs, error, message):
    kwargs = {"devices": devs, **kwargs}
    with pytest.raises(error, match=message):
        autoplace.optimize(zoo.load("mlp").mod, kwargs.pop("devices"), **kwargs)


def test_devices_this_machine_lacks_are_refused_before_any_work(devs, monkeypatch):
    # No machine has GPU 99, and CPU devices are numbered below this process's cores.
    from autoplace.backend import process_cpus
    from autoplace.profile import DeviceUnavailable

    def no_work(*args, **kwargs):
        raise AssertionError("optimize read the model before checking its devices")

    monkeypatch.setattr(autoplace.OpGraph, "from_relax", no_work)
    cores = len(process_cpus())
    for absent, spec in ((Device.cuda(99), "cuda:99"), (Device.cpu(cores), f"cpu:{cores}")):
        with pytest.raises(DeviceUnavailable, match=f"^{spec}: no such device on this machine"):
            autoplace.optimize(zoo.load("mlp").mod, [devs[0], absent])


def test_planning_for_devices_elsewhere_needs_check_devices_false(devs):
    res = autoplace.optimize(zoo.load("mlp").mod, [devs[0], Device.cuda(99)], time_limit=2,
                             cost_model=autoplace.RooflineCostModel(), check_devices=False)
    assert {d.name for d in res.plan.devices} == {devs[0].name, "cuda99"}


def _profile(info, latency_s=None):
    from autoplace.profile import DeviceProfile, fingerprint

    return DeviceProfile(f"{info['kind']}:0", fingerprint(info), info, latency_s or {}, {}, {})


def test_measured_overheads_replace_the_constants_where_a_profile_has_them(devs):
    from autoplace.devices import Link
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import LocalRunner, OverheadFit
    from autoplace.solve.problem import SEGMENT_OVERHEAD_S, STAGE_OVERHEAD_S, STAGE_SLOWDOWN_S

    mod = zoo.load("mlp").mod
    plain = _profile(LocalRunner(devs[0]).info())
    fp = plain.fingerprint
    measured = dataclasses.replace(plain, overheads=(
        OverheadFit(fp, "", "stage", 30e-6), OverheadFit(fp, "", "segment", 60e-6),
        OverheadFit(fp, fp, "stage", 99e-6)))  # a pair's figure: not the device's own
    model = MeasuredCostModel({"a": measured, "b": plain})  # b's profile measured none
    assert model.overheads(devs) == {"a": {"stage": 30e-6, "segment": 60e-6}}

    res = autoplace.optimize(mod, devs, objective="throughput", cost_model=model, time_limit=2)
    # a: its measured hand-off and the slowdown no profile measures; b: the constant.
    assert res.problem.stage_overhead_s.tolist() == [30e-6 + STAGE_SLOWDOWN_S["cpu"],
                                                     STAGE_OVERHEAD_S["cpu"]]
    assert res.overhead_sources == {"a": "measured", "b": "default"}
    assert "hand-off 30.0 us measured by its profile" in res.summary()
    assert "STAGE_OVERHEAD_S: its profile measured none" in res.overheads_note[1]

    res = autoplace.optimize(mod, devs, cost_model=model, time_limit=2, baseline_guard=False)
    # Every copy pays the segment figures of both its devices (build_problem).
    link = Link.default(devs[0], devs[1])
    assert res.problem.alpha[0, 1] == pytest.approx(link.alpha + 60e-6 + SEGMENT_OVERHEAD_S["cpu"])
    assert res.overhead_sources == {"a": "measured", "b": "default"}
    assert any("segment overhead: a 60.0 us (measured" in line
               for line in res.explain().overheads)
    # What the caller passes wins; without a profile, the constants.
    given = autoplace.optimize(mod, devs, objective="throughput", cost_model=model,
                               stage_overhead_s=0.0, time_limit=2)
    assert not given.problem.stage_overhead_s.any()
    assert given.overhead_sources == {"a": "given", "b": "given"}
    bare = autoplace.optimize(mod, devs, objective="throughput", time_limit=2,
                              cost_model=autoplace.RooflineCostModel())
    assert bare.problem.stage_overhead_s.tolist() == [STAGE_OVERHEAD_S["cpu"]] * 2
    assert bare.overhead_sources == {"a": "default", "b": "default"}


def test_which_profile_applies_to_which_device_is_said_and_mismatches_warned(devs, caplog):
    from autoplace.predict import MeasuredCostModel
    from autoplace.profile import LocalRunner

    mod = zoo.load("mlp").mod
    here = LocalRunner(devs[0]).info()
    mine, other_cpu = _profile(here), _profile({**here, "hardware": "Other CPU", "threads": 64})
    gpu = _profile({**here, "kind": "cuda", "hardware": "Some GPU"})

    def notes(profiles, **kwargs):
        caplog.clear()
        res = autoplace.optimize(mod, devs, time_limit=2, **kwargs,
                                 cost_model=MeasuredCostModel(profiles))
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert [f"warning: {w}" for w in warned] == [n for n in res.profiles_note
                                                     if n.startswith("warning:")]
        assert all(n in res.summary() for n in res.profiles_note)
        return res.profiles_note

    # This machine's own profile: said, no warning.
    assert notes([mine]) == tuple(f"profile: {d.name} <- {here['hardware']} (cpu:0, "
                                  f"{mine.fingerprint})" for d in devs)
    # A GPU's profile on CPU devices gives nothing: said, not silently dropped.
    gpu_notes = notes([gpu])
    assert gpu_notes[:2] == ("profile: a has none (fallback costs)",
                             "profile: b has none (fallback costs)")
    assert "gives no device its costs (no device is of kind cuda)" in gpu_notes[2]
    # Another CPU's profile is used, with a warning naming what differs.
    other = notes([other_cpu])
    assert len(other) == 4 and "'Other CPU' there" in other[2] and "threads 64 there" in other[2]
    # Planning for devices elsewhere: nothing here to compare with.
    assert len(notes([other_cpu], check_devices=False)) == 2


def test_roofline_is_the_slower_of_compute_and_memory():
    g = autoplace.OpGraph.from_relax(zoo.load("mlp").mod)
    dev = Device.cpu(0, peak_flops=1e9, mem_bandwidth=1e9)
    t = autoplace.RooflineCostModel(launch_s=0.0).predict(g, dev)
    mm = g.nodes[0]  # 8x64 @ 64x64: 65536 FLOPs, (2048 + 16384 + 2048) bytes
    assert t[0] == pytest.approx(max(mm.flops, mm.bytes_read + mm.bytes_written) / 1e9)


def test_copies_count_tensors_per_destination_not_edges(devs):
    # branchy_cnn: stem_relu feeds branch_a (conv) and branch_b_pool; both on b while the stem
    # is on a -> two crossing edges, one copy.
    model = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(model.mod)
    res = autoplace.optimize(model.mod, devs, pins=[("index:0-1", "a"), ("*", "b")])
    crossing = sum(res.plan.assignment[e.src] != res.plan.assignment[e.dst] for e in g.edges)
    assert crossing == 2 and res.copies == 1
    assert res.mod.script().count("R.to_vdevice(") == res.copies


def test_auto_costs_use_this_machines_shipped_profile_or_say_roofline(devs):
    from autoplace.pricing import auto_cost_model
    from autoplace.profile import LocalRunner, fingerprint
    from autoplace.profile.profiles import shipped_profile

    # Devices build for this host's CPU by default, which no shipped profile (measured for
    # generic x86-64) describes: their costs are calibrated here.
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, devs, time_limit=2)
    assert res.cost_model.startswith("a: calibrated on this machine") and res.cost_model in \
        res.summary()
    assert set(res.plan.cost_sources) <= {"measured", "learned"}
    assert "no tuning records of this machine are shipped" in res.summary()
    # Generic devices, unchecked: the shipped profile where this host's fingerprint has one.
    generic = [Device.cpu(0, name="a", target="llvm"), Device.cpu(1, name="b", target="llvm")]
    res = autoplace.optimize(zoo.load("branchy_cnn").mod, generic, time_limit=2,
                             calibrate=False)
    assert res.cost_model == auto_cost_model(generic)[1] and res.cost_model in res.summary()
    if shipped_profile(fingerprint(LocalRunner(generic[0]).info())) is None:
        assert res.cost_model.startswith("roofline") and set(res.plan.cost_sources) == {"roofline"}
    else:  # the zoo is in the shipped profile, its kernels in the shipped tuning records
        assert res.cost_model.startswith("measured")
        assert res.kernels["default"] == 0 and set(res.plan.cost_sources) == {"tuned"}
        plain = autoplace.optimize(zoo.load("branchy_cnn").mod, generic, time_limit=2, db=None,
                                   calibrate=False)
        assert set(plain.plan.cost_sources) == {"measured"}
    # A GPU is never costed by a model trained on a CPU: it gets the roofline.
    gpu = Device.cuda(0, name="g")
    mixed = autoplace.optimize(zoo.load("mlp").mod, [devs[0], gpu], time_limit=2,
                               check_devices=False, db=None)
    assert all(s.endswith("roofline") for s in mixed.plan.cost_sources)


def test_roofline_costs_have_one_name_whether_asked_for_or_fallen_back_on(devs, monkeypatch):
    from autoplace.pricing import ROOFLINE, auto_cost_model

    mod = zoo.load("mlp").mod
    asked = autoplace.optimize(mod, devs, cost_model=autoplace.RooflineCostModel(), time_limit=2)
    assert asked.cost_model == ROOFLINE
    monkeypatch.setattr("autoplace.profile.profiles.shipped_profile", lambda fingerprint: None)
    model, described = auto_cost_model(devs)  # a machine no shipped profile matches
    assert isinstance(model, autoplace.RooflineCostModel)
    assert described == f"{ROOFLINE} (no profile of this machine)"


def test_a_throughput_summary_says_time_per_input_and_inputs_per_second(devs):
    res = autoplace.optimize(zoo.load("mlp").mod, devs, objective="throughput", time_limit=2)
    [line] = [l for l in res.summary().splitlines() if l.startswith("predicted")]
    per_input = res.predicted_latency_s
    assert line.startswith(f"predicted time per input: {per_input * 1e3:.4f} ms per input, "
                           f"{1 / per_input:.1f} inputs/s  (solver "), line
    baselines = [l for l in res.summary().splitlines() if l.startswith("  baseline")]
    assert baselines and all("ms per input" in l and "inputs/s" in l for l in baselines)
    latency = autoplace.optimize(zoo.load("mlp").mod, devs, time_limit=2).summary()
    assert "predicted latency: " in latency and "inputs/s" not in latency


def test_pipeline_needs_a_throughput_plan(devs):
    res = autoplace.optimize(zoo.load("mlp").mod, devs, time_limit=2)
    with pytest.raises(ValueError, match="objective='throughput'"):
        res.pipeline()
