"""A call from the VM timed between clock reads, after writes as large as a model's other ops
touch (autoplace.profile.cold_calls): the call's time, without the writes' time or their noise."""

import time

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402

from autoplace.profile.cold_calls import cold_call_seconds  # noqa: E402

SHAPE = (16,)


def _registered(name, seconds):
    """A global function that takes ``seconds`` (sleeping) and gives its input back, copied."""
    def f(x):
        time.sleep(seconds)
        return tvm.runtime.tensor(x.numpy(), tvm.cpu())

    tvm.register_global_func(name, f, override=True)
    return name


def _call(name):
    ty = relax.TensorType(list(SHAPE), "float32")
    return ty, (lambda bb, i, x: relax.op.call_pure_packed(name, x, ty_args=ty))


def test_a_call_is_timed_and_the_writes_before_it_are_not():
    ty, call = _call(_registered("test_cold_calls.sleep_2ms", 0.002))
    data = np.ones(SHAPE, "float32")
    between = 256 << 20  # each write takes ten times the call itself or more
    write = np.zeros(between // 4, "float32")
    t = time.perf_counter()
    write += 0.5
    one_write = time.perf_counter() - t
    got = cold_call_seconds(call, ty, data, between, samples=4, rounds=2)
    assert got >= 0.0019  # the sleep is in it
    assert got < 0.002 + one_write / 2  # the write before it is not


def test_a_call_that_costs_nothing_measures_little_against_one_that_sleeps():
    ty, quick = _call(_registered("test_cold_calls.quick", 0.0))
    _, slow = _call(_registered("test_cold_calls.sleep_5ms", 0.005))
    data = np.ones(SHAPE, "float32")
    fast_s = cold_call_seconds(quick, ty, data, 1 << 20, samples=4, rounds=2)
    slow_s = cold_call_seconds(slow, ty, data, 1 << 20, samples=4, rounds=2)
    assert 0 <= fast_s < slow_s and slow_s >= 0.0049


def test_what_the_call_raises_is_raised():
    def broken(x):
        raise ValueError("no such op here")

    tvm.register_global_func("test_cold_calls.broken", broken, override=True)
    ty, call = _call("test_cold_calls.broken")
    with pytest.raises(Exception, match="no such op here"):
        cold_call_seconds(call, ty, np.ones(SHAPE, "float32"), 0, samples=2, rounds=1)
