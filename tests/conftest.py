from pathlib import Path

import numpy as np
import pytest

import autoplace


@pytest.fixture
def bench() -> Path:
    """The public placement benchmark's inputs, as the repository carries them."""
    return Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "dnn-partitioning"


@pytest.fixture(scope="session", autouse=True)
def _calibration_cache(tmp_path_factory):
    """Calibrations (optimize on a CPU no shipped profile describes, or one checked against its
    profile) go to one folder of this session, not the user's cache; CLI tests' subprocesses
    inherit it."""
    import os

    before = os.environ.get("AUTOPLACE_CACHE_DIR")
    os.environ["AUTOPLACE_CACHE_DIR"] = str(tmp_path_factory.mktemp("autoplace-cache"))
    yield
    if before is None:
        os.environ.pop("AUTOPLACE_CACHE_DIR", None)
    else:
        os.environ["AUTOPLACE_CACHE_DIR"] = before


@pytest.fixture
def devs():
    return [autoplace.Device.cpu(0, name="a"), autoplace.Device.cpu(1, name="b")]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """An RPC tracker with one server, key ``main``, on loopback (:mod:`rpc_cluster`), for the
    tests of one module."""
    pytest.importorskip("cloudpickle", reason="tvm.exec.rpc_tracker/rpc_server need cloudpickle")
    from rpc_cluster import Cluster

    c = Cluster(tmp_path_factory.mktemp("rpc"))
    try:
        c.start_servers("main")
        yield c
    finally:
        for name in list(c.procs):
            c.kill(name)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this test, as in an interactive Python, even when the
    test runner was started with SIGINT ignored (a background job of a non-interactive shell)."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
