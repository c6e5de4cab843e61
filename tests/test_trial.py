"""A close call settled by running it: ``run_fastest`` builds each candidate, times them here,
interleaved, and keeps the fastest; ``res.compile()`` does so where the guard returned a plan
over others predicted faster within their costs' uncertainty."""

import sys
import time

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict import MeasuredCostModel
from autoplace.run.trial import Candidate, run_fastest
from test_baselines import _profile


class Sleeper:
    """A callable that takes ``seconds`` a call; counts its calls and whether it was closed."""

    def __init__(self, seconds):
        self.seconds, self.calls, self.closed = seconds, 0, False

    def __call__(self, *xs):
        self.calls += 1
        time.sleep(self.seconds)
        return list(xs)

    def close(self):
        self.closed = True


class Clock:
    """Seconds that pass only as the Sleepers and Streams sleep."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    """A :class:`Clock` read by the trial as ``time.perf_counter`` and slept on by this file's
    Sleepers and Streams: what the trial measures is their seconds exactly, whatever the host's
    speed and load, so that its counts and choices can be worked out here."""
    from autoplace.run import trial

    fake = Clock()
    for module in (trial, sys.modules[trial.median_call_s.__module__], sys.modules[__name__]):
        monkeypatch.setattr(module, "time", fake)
    return fake


class Failing(Sleeper):
    def __init__(self):
        super().__init__(0.0)

    def __call__(self, *xs):
        raise ValueError("bad input")


def test_the_fastest_candidate_is_kept_and_the_others_closed(clock):
    slow, fast = Sleeper(3e-3), Sleeper(2e-4)
    run, trial = run_fastest([Candidate("returned", 1e-4, lambda: slow),
                              Candidate("contender", 2e-4, lambda: fast)], [np.ones(2)], rounds=3)
    assert run is fast and trial.chosen == "contender" and trial.rounds == 3
    assert slow.closed and not fast.closed
    got = {e.name: e.measured_s for e in trial.entries}
    assert got == pytest.approx({"returned": 3e-3, "contender": 2e-4})
    # Two calls each before the rounds; in each round, a warm-up and the calls that fill 20 ms:
    # 6 of 3 ms; of 0.2 ms, 100, cut to max_calls (30).
    assert (slow.calls, fast.calls) == (2 + 3 * (1 + 6), 2 + 3 * (1 + 30))
    assert "runs contender" in str(trial) and "predicted 0.1 ms" in str(trial)


def test_a_contender_that_fails_is_left_out_and_the_first_one_raises():
    def broken():
        raise RuntimeError("cannot build")

    only = Sleeper(1e-4)
    run, trial = run_fastest([Candidate("returned", 1e-4, lambda: only),
                              Candidate("broken", 1e-5, broken)], [np.ones(2)])
    assert run is only and trial.chosen == "returned" and trial.rounds == 0
    (_, failed), = [(e.name, e) for e in trial.entries if e.name == "broken"]
    assert failed.measured_s is None and failed.error == "RuntimeError: cannot build"
    with pytest.raises(RuntimeError, match="cannot build"):
        run_fastest([Candidate("returned", 1e-4, broken), Candidate("other", 1e-4, lambda: only)],
                    [np.ones(2)])
    # A contender built but failing on the inputs is closed; the returned one failing on the
    # trial's random inputs is returned untimed (the caller's inputs may suit it), nothing else
    # built.
    fails, other = Failing(), Sleeper(1e-5)
    run, trial = run_fastest([Candidate("returned", 1e-4, lambda: only),
                              Candidate("fails", 1e-5, lambda: fails)], [np.ones(2)])
    assert run is only and fails.closed and "ValueError: bad input" in str(trial)
    fails = Failing()
    run, trial = run_fastest([Candidate("returned", 1e-4, lambda: fails),
                              Candidate("other", 1e-5, lambda: other)], [np.ones(2)])
    assert run is fails and not fails.closed and other.calls == 0
    assert trial.chosen == "returned" and trial.rounds == 0 and len(trial.entries) == 1
    with pytest.raises(ValueError, match="at least one"):
        run_fastest([], [])


def test_a_trial_skips_what_its_budget_cannot_time():
    # Calls of seconds (a large untuned model): nothing else is built, the plan runs untimed.
    own, other = Sleeper(0.0), Sleeper(0.0)
    built = []
    run, trial = run_fastest([Candidate("returned", 2.0, lambda: own),
                              Candidate("contender", 1.5, lambda: built.append(1) or other)],
                             [np.ones(2)], budget_s=3.0)
    assert run is own and trial.chosen == "returned" and trial.rounds == 0
    assert not built and own.calls == 0
    skipped = trial.entries[1]
    assert skipped.measured_s is None and "would not fit the trial's budget (3 s)" in skipped.skipped
    assert "contender skipped (" in str(trial)
    # An unpredicted contender is judged by the returned plan's measured call: at 40 ms a call
    # and a 0.1 s budget, the first two calls leave no room for two more of it.
    slow, unknown = Sleeper(0.04), Sleeper(0.0)
    run, trial = run_fastest([Candidate("returned", None, lambda: slow),
                              Candidate("all threads", None, lambda: unknown)], [np.ones(2)],
                             budget_s=0.1, build_share=0.0)
    assert run is slow and unknown.calls == 0 and trial.entries[1].skipped
    # A budget that fits them times both.
    run, trial = run_fastest([Candidate("returned", 1e-4, lambda: Sleeper(1e-4)),
                              Candidate("contender", 1e-4, lambda: Sleeper(1e-4))], [np.ones(2)])
    assert all(e.measured_s is not None and not e.skipped for e in trial.entries)


def test_compile_times_the_plans_the_guard_passed_over_within_its_margin(devs, rng):
    # branchy_cnn's branches side by side on a and b, with every op's cost ±50 %: the guard
    # returns one device over the solver's plan, predicted faster within two sigma; the
    # profile, at one thread, cannot predict one device with both threads. compile() builds
    # and times all three and runs the fastest; with trial=False, the one device.
    from autoplace.run.cores import all_threads

    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    noisy = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 0.5)),
                               time_limit=5, db=None)
    assert noisy.plan.used_devices() == (devs[0],) and not noisy.guard.kept
    solver, threads = noisy.contenders
    assert solver.name == "the solver's plan" and len(solver.plan.used_devices()) == 2
    assert solver.predicted_s == noisy.guard.plan_s < noisy.predicted_latency_s
    assert threads.name == "all threads" and threads.predicted_s is None
    assert threads.plan.threads == all_threads(devs)[0] and "all threads" not in noisy.baselines
    assert ("compile() times it against the solver's plan (" in noisy.summary()
            and "all threads (not predicted)" in noisy.summary())
    run = noisy.compile()
    t = run.trial
    assert [e.name for e in t.entries] == ["only a", "the solver's plan", "all threads"]
    measured = {e.name: e.measured_s for e in t.entries}
    assert t.rounds >= 1 and t.chosen == min(measured, key=measured.get)
    assert run.plan == {"only a": noisy.plan, "the solver's plan": solver.plan,
                        "all threads": threads.plan}[t.chosen]
    x = [rng.standard_normal(a.shape).astype(a.dtype) for a in m.inputs]
    single = autoplace.compile(m.mod, autoplace.place(g, devs, [("*", "a")]))
    for got, want in zip(run(*x), single(*x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    getattr(run, "close", lambda: None)()
    alone = noisy.compile(trial=False)
    assert alone.plan == noisy.plan and alone.trial is None
    # Costs sure to 0.1 %: the solver's plan is kept, and nothing is predicted faster; all
    # threads still has no prediction.
    sure = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 1e-3)),
                              time_limit=5, db=None)
    assert sure.guard.kept and [c.name for c in sure.contenders] == ["all threads"]
    assert "compile() times it against all threads (not predicted)" in sure.summary()
    # With a profile at that count, all threads is predicted: nothing is left to time.
    more = _profile(g, 1e-3, threads=all_threads(devs)[0], scale=0.99)
    model = MeasuredCostModel({"a": _profile(g, 1e-3), "b": _profile(g, 1e-3),
                               "all threads": more})
    known = autoplace.optimize(m.mod, devs, cost_model=model, time_limit=5, db=None)
    assert known.guard.kept and known.contenders == ()
    assert "compile() times" not in known.summary()


def test_no_contender_breaks_a_pin(devs):
    # The solver's plan pinned to b: "only a" and all threads on a break the pin, so nothing is
    # timed against it, predicted or not.
    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    res = autoplace.optimize(m.mod, devs, cost_model=MeasuredCostModel(_profile(g, 0.5)),
                             time_limit=5, db=None, pins=[("index:0", "b")])
    assert res.plan.assignment[0] == "b" and "all threads" not in res.baselines
    assert all(c.plan.assignment[0] == "b" for c in res.contenders)
    assert not any(c.plan.threads for c in res.contenders)


class Stream:
    """A stream runner whose ``run`` takes ``seconds`` per input; records the batches' sizes."""

    def __init__(self, seconds):
        self.seconds, self.sizes, self.closed = seconds, [], False

    def run(self, batch):
        self.sizes.append(len(batch))
        time.sleep(self.seconds * len(batch))
        return [list(x) for x in batch]

    def close(self):
        self.closed = True


def test_a_stream_trial_times_batches_and_reports_seconds_per_input(clock):
    from autoplace.run.trial import run_stream_fastest, stream_items

    slow, fast = Stream(2e-4), Stream(5e-5)
    run, trial = run_stream_fastest([Candidate("returned", 1e-4, lambda: slow),
                                     Candidate("contender", None, lambda: fast)], [np.ones(2)],
                                    items=20)
    assert run is fast and slow.closed and not fast.closed
    assert trial.chosen == "contender" and trial.inputs == 20 and trial.rounds >= 1
    assert set(slow.sizes) == {20} and set(fast.sizes) == {20}
    got = {e.name: e for e in trial.entries}
    assert got["returned"].predicted_s == 1e-4 and got["contender"].predicted_s is None
    # per input, not per batch of 20
    assert (got["returned"].measured_s, got["contender"].measured_s) == pytest.approx((2e-4, 5e-5))
    assert "rounds of 20 inputs" in str(trial) and "(predicted 0.1 ms an input)" in str(trial)
    # Inputs per call: about 50 ms at the fastest prediction, within [16, 256].
    assert stream_items([1e-3, 2e-3]) == 50 and stream_items([None]) == 16
    assert stream_items([1e-6]) == 256 and stream_items([1.0]) == 16


def test_pipeline_times_the_throughput_plans_the_guard_passed_over(devs, rng):
    # branchy_cnn for throughput from a profile at one thread: replicas on a and b, and one
    # device with both threads, which nothing here predicts. pipeline() runs both on a stream
    # and keeps the faster; trial=False, and compile() of a throughput plan, time nothing.
    m = zoo.load("branchy_cnn")
    g = autoplace.OpGraph.from_relax(m.mod)
    res = autoplace.optimize(m.mod, devs, objective="throughput", time_limit=5, db=None,
                             cost_model=MeasuredCostModel(_profile(g, 0.5)))
    (threads,) = res.contenders
    assert threads.name == "all threads" and threads.predicted_s is None
    assert threads.plan.threads and threads.plan.stages == (0,) * len(g.nodes)
    assert "pipeline() times it against all threads (not predicted)" in res.summary()
    x = [rng.standard_normal(a.shape).astype(a.dtype) for a in m.inputs]
    want = autoplace.compile(m.mod, autoplace.place(g, devs, [("*", "a")]))(*x)
    with res.pipeline() as pipe:
        t = pipe.trial
        assert [e.name for e in t.entries] == ["the solver's plan", "all threads"]
        measured = {e.name: e.measured_s for e in t.entries}
        assert t.rounds >= 1 and t.inputs >= 16 and t.chosen == min(measured, key=measured.get)
        assert pipe.plan == {"the solver's plan": res.plan, "all threads": threads.plan}[t.chosen]
        for got, w in zip(pipe.run([x, x])[1], want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)
    with res.pipeline(trial=False) as pipe:
        assert pipe.plan == res.plan and pipe.trial is None
    assert res.compile().trial is None
