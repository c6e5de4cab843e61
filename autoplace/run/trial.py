"""Settle a close call by running it: build each plan whose predicted time is within the costs'
uncertainty of the others, time them all on this machine, interleaved, and keep the fastest."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from autoplace.backend import settle
from autoplace.run.overhead import median_call_s

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One plan of a trial: its name, its predicted seconds a call, the median measured one
    (None where it could not be built or run; ``error`` says why)."""

    name: str
    predicted_s: float | None  # None: not predicted
    measured_s: float | None
    error: str = ""
    skipped: str = ""  # why it was not built: its calls would not fit the trial's budget


@dataclass(frozen=True)
class Trial:
    """What :func:`run_fastest` timed, and which plan it kept (``chosen``)."""

    entries: tuple[Entry, ...]
    chosen: str
    rounds: int
    #: Inputs a timed call ran (:func:`run_stream_fastest`): the times are then per input.
    inputs: int = 1

    @property
    def kept(self) -> Entry:
        """The entry of the plan it kept (``chosen``)."""
        return next(e for e in self.entries if e.name == self.chosen)

    def __str__(self) -> str:
        unit = " an input" if self.inputs > 1 else ""
        parts = []
        for e in self.entries:
            got = (f"skipped ({e.skipped})" if e.skipped else
                   f"failed ({e.error})" if e.measured_s is None
                   else f"{e.measured_s * 1e3:.4g} ms{unit}")
            pred = ("not predicted" if e.predicted_s is None
                    else f"predicted {e.predicted_s * 1e3:.4g} ms{unit}")
            parts.append(f"{e.name} {got} ({pred})")
        rounds = (f"{self.rounds} interleaved rounds" if self.inputs == 1 else
                  f"{self.rounds} interleaved rounds of {self.inputs} inputs")
        return (f"timed here, medians of {rounds}: " + "; ".join(parts)
                + f"; runs {self.chosen}")


@dataclass(frozen=True)
class Candidate:
    """A plan to try: ``build()`` returns a callable on numpy arrays (closed with ``close()``,
    where it has one, when it is not kept)."""

    name: str
    predicted_s: float | None
    build: Callable[[], Any]


def run_fastest(candidates: Sequence[Candidate], inputs: Sequence[np.ndarray], *,
                rounds: int = 5, block_s: float = 0.02, max_calls: int = 30,
                budget_s: float = 3.0, build_share: float = 0.5):
    """Build every candidate, time each on ``inputs`` in up to ``rounds`` rounds (each round
    runs them all, in an order that starts one later each round, after the process has settled:
    a TVM pool spins on after its last kernel) and return ``(the fastest, Trial)``.

    A candidate's round is a warm-up call (left out where one call takes ``block_s`` or more),
    then as many calls as fill ``block_s`` (1 to ``max_calls``), of which it keeps the median;
    its score is the median of its rounds. Rounds are fewer where they would take more than
    ``budget_s`` in all, never fewer than one. Ties go to the first.

    The trial's calls have a budget: ``budget_s``, or ``build_share`` of the seconds the first
    candidate took to build, whichever is more. Each candidate is first called twice (a check,
    then one timed call); another candidate whose two calls (its prediction, else the first's)
    would not fit what is left of the budget is not built, and its entry says so
    (``skipped``): a model whose one call takes seconds is run as returned.

    The first candidate is the one that is run without a trial: if it cannot be built, the
    error is raised; if it cannot run on ``inputs`` (which the caller's own may not share), it
    is returned untimed, and no other is built. Another that fails is left out (closed), and its
    entry says why.
    """
    if not candidates:
        raise ValueError("run_fastest needs at least one candidate")
    built: list[tuple[Candidate, Any, float]] = []  # with one call's seconds
    failed: dict[str, str] = {}
    skipped: dict[str, str] = {}
    t = time.perf_counter()
    first = candidates[0].build()
    budget = max(budget_s, build_share * (time.perf_counter() - t))
    own_s = candidates[0].predicted_s
    if own_s is not None and len(candidates) > 1:  # the returned plan's own two calls first
        ahead = {c.name: _no_room(own_s if c.predicted_s is None else c.predicted_s, 2 * own_s,
                                  budget) for c in candidates[1:]}
        if all(ahead.values()):
            entries = tuple(Entry(c.name, c.predicted_s, None, "", ahead.get(c.name, ""))
                            for c in candidates)
            log.info("no trial: %s", "; ".join(f"{n}: {w}" for n, w in ahead.items()))
            return first, Trial(entries, candidates[0].name, 0)
    spent = 0.0
    for k, c in enumerate(tqdm(candidates, desc="trial", unit="plan", disable=None,
                               leave=False)):
        run = first if k == 0 else None
        if k > 0:
            one_s = c.predicted_s if c.predicted_s is not None else (
                built[0][2] if built else own_s)
            skipped[c.name] = _no_room(one_s, spent, budget)
            if skipped[c.name]:
                log.info("trial: %s skipped: %s", c.name, skipped[c.name])
                continue
        try:
            if run is None:
                run = c.build()
            t = time.perf_counter()
            run(*inputs)  # the first call loads and checks it
            t1 = time.perf_counter()
            run(*inputs)
            built.append((c, run, time.perf_counter() - t1))
            spent += time.perf_counter() - t
        except Exception as e:  # noqa: BLE001 - reported in the trial
            failed[c.name] = f"{type(e).__name__}: {e}"
            if k == 0:
                log.warning("no trial: %s failed on random inputs: %s", c.name, failed[c.name])
                return run, Trial((Entry(c.name, c.predicted_s, None, failed[c.name]),),
                                  c.name, 0)
            log.warning("trial: %s left out: %s", c.name, failed[c.name])
            _close([run] if run is not None else [])
    plan = {c.name: _calls(t, block_s, max_calls) for c, _, t in built}
    per_round = sum(sum(plan[c.name]) * t for c, _, t in built)
    rounds = max(1, min(rounds, int(budget_s // max(per_round, 1e-9)))) if len(built) > 1 else 0
    times: dict[str, list[float]] = {c.name: [] for c, _, _ in built}
    try:
        for r in range(rounds):
            for c, run, _ in built[r % len(built):] + built[:r % len(built)]:
                settle(max_s=1.0)
                warm, calls = plan[c.name]
                times[c.name].append(median_call_s(run, inputs, calls, warm))
    except Exception:
        _close(run for _, run, _ in built)
        raise
    scores = {name: statistics.median(ts) if ts else None for name, ts in times.items()}
    best = 0
    for k, (c, _, _) in enumerate(built):
        if scores[c.name] is not None and scores[c.name] < scores[built[best][0].name]:
            best = k
    _close(run for k, (_, run, _) in enumerate(built) if k != best)
    entries = tuple(Entry(c.name, c.predicted_s, scores.get(c.name), failed.get(c.name, ""),
                          skipped.get(c.name, "")) for c in candidates)
    trial = Trial(entries, built[best][0].name, rounds)
    log.info("%s", trial)
    return built[best][1], trial


def _no_room(one_s: float | None, spent: float, budget: float) -> str:
    """Why two calls of ``one_s`` seconds (a check and a timed one) do not fit a trial's
    ``budget`` after ``spent`` seconds of calls, or ``""`` where they do (or nothing says how
    long a call takes)."""
    if one_s is None or spent + 2 * one_s <= budget:
        return ""
    return (f"two calls of about {one_s:.3g} s would not fit the trial's budget "
            f"({budget:.3g} s) after {spent:.3g} s of calls before them")


def _calls(one_s: float, block_s: float, max_calls: int) -> tuple[int, int]:
    """``(warm-up calls, timed calls)`` of a round, for a call of ``one_s`` seconds."""
    if one_s >= block_s:
        return 0, 1
    return 1, int(min(max_calls, max(1, block_s // max(one_s, 1e-9))))


def _close(runs) -> None:
    for run in runs:
        close = getattr(run, "close", None)
        if close is not None:
            close()


def run_stream_fastest(candidates: Sequence[Candidate], inputs: Sequence[np.ndarray], *,
                       items: int | None = None, budget_s: float = 3.0):
    """:func:`run_fastest` for runners of a stream of inputs (``build()`` returns an object with
    ``run(list of input lists)`` and ``close()``: a :class:`~autoplace.run.Pipeline`): each
    timed call runs ``items`` copies of ``inputs`` through one, and ``predicted_s`` and the
    trial's times are seconds per input. ``items`` (default: :func:`stream_items` of the
    predictions) should give each call at least a few of its hand-offs. Returns ``(the fastest
    runner, Trial)``."""
    items = stream_items([c.predicted_s for c in candidates]) if items is None else items
    batch = [list(inputs)] * items
    wrapped = [Candidate(c.name, None if c.predicted_s is None else c.predicted_s * items,
                         lambda c=c: _Stream(c.build(), batch))
               for c in candidates]
    stream, trial = run_fastest(wrapped, (), budget_s=budget_s)
    predicted = {c.name: c.predicted_s for c in candidates}
    entries = tuple(replace(e, predicted_s=predicted[e.name],
                            measured_s=None if e.measured_s is None else e.measured_s / items)
                    for e in trial.entries)
    return stream.runner, replace(trial, entries=entries, inputs=items)


def stream_items(predicted_s: Sequence[float | None], *, target_s: float = 0.05,
                 least: int = 16, most: int = 256) -> int:
    """Inputs per timed call of a stream trial: about ``target_s`` at the fastest prediction,
    within ``[least, most]`` (``least`` without a prediction)."""
    known = [p for p in predicted_s if p is not None and p > 0]
    if not known:
        return least
    return int(min(most, max(least, target_s // min(known))))


class _Stream:
    """A stream runner called as :func:`run_fastest` calls a candidate: each call runs the same
    ``batch`` through it."""

    def __init__(self, runner, batch):
        self.runner, self.batch = runner, batch

    def __call__(self, *_):
        return self.runner.run(self.batch)

    def close(self) -> None:
        self.runner.close()
