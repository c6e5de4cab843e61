"""Cache and TLB miss estimates of real legalized TVM kernels: streaming, a matmul's column walk
through few cache sets or many, pages against the TLB, and the footprint extrapolation against
exact enumeration."""

import json

import pytest

from autoplace.predict import misses as cache
from autoplace.predict.kernels import KernelAnalysis


def _funcs(op, *shapes, attrs=None):
    key = json.dumps([f"relax.{op}", [[list(s), "float32"] for s in shapes], attrs or {}, []])
    return list(KernelAnalysis().prim_funcs(key).values())


def _matmul(m, k, n):
    return _funcs("matmul", (m, k), (k, n), attrs={"out_dtype": "float32"})


def test_a_stream_larger_than_every_cache_misses_each_line_and_a_small_one_none():
    big = cache.misses(_funcs("nn.relu", (1, 64, 512, 512)))
    lines = 2 * 64 * 512 * 512 * 4 // cache.LINE  # read and write
    for level in ("l1", "l2", "l3"):
        assert big[f"{level}_misses"] == pytest.approx(lines, rel=0.01)
    assert big["l1_tlb_misses"] == pytest.approx(lines / 64, rel=0.01)
    small = cache.misses(_funcs("nn.relu", (1, 8, 16, 16)))  # 16 KiB: stays in L1 between runs
    assert all(v == 0 for v in small.values())


def test_a_column_walk_of_a_power_of_two_stride_misses_l1_on_every_access():
    m, k = 4, 64
    # rows of 4096 bytes: the column's 64 lines share one in-page offset, 8 ways of L1 hold them
    aliased = cache.misses(_matmul(m, k, 1024))
    assert 1.0 <= aliased["l1_misses"] / (m * k * 1024) <= 1.1
    # rows of 4160 bytes: the column spreads over all 64 sets; B comes back once per row of A
    spread = cache.misses(_matmul(m, k, 1040))
    assert spread["l1_misses"] == pytest.approx(m * k * 1040 * 4 / cache.LINE, rel=0.1)
    # B (256 KiB) mostly stays in the 512 KiB L2: only sets that random page colours overfill lose
    assert aliased["l2_misses"] < 0.1 * aliased["l1_misses"]


def test_a_column_over_more_pages_than_the_tlb_holds_misses_it_on_every_access():
    m, n = 4, 1024
    many = cache.misses(_matmul(m, 128, n))  # 128 pages per column, 64 TLB entries
    assert 1.0 <= many["l1_tlb_misses"] / (m * 128 * n) <= 1.1
    few = cache.misses(_matmul(m, 32, n))  # all of B is 32 pages
    assert few["l1_tlb_misses"] == 0
    assert many["l2_tlb_misses"] == 0


def test_a_loop_of_symbolic_extent_is_a_clear_error():
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def copy(a: T.handle, b: T.handle):
        n = T.int64()
        x = T.match_buffer(a, (n,), "float32")
        y = T.match_buffer(b, (n,), "float32")
        for i in range(n):
            with T.sblock("copy"):
                vi = T.axis.spatial(n, i)
                y[vi] = x[vi]

    with pytest.raises(ValueError, match="cannot follow this loop nest"):
        cache.misses([copy])


def test_extrapolated_footprints_follow_the_enumerated_ones(monkeypatch):
    funcs = _funcs("nn.conv2d", (1, 8, 32, 32), (16, 8, 3, 3),
                   attrs={"padding": [1, 1, 1, 1], "strides": [1, 1]})

    def footprints():
        return [a.footprint(d) for f in funcs for a in cache._accesses(f)
                for d in range(len(a.loops) + 1)]

    exact, exact_misses = footprints(), cache.misses(funcs)
    monkeypatch.setattr(cache, "_ENUMERATED", 512)  # the outer loops of every access extrapolate
    for e, g in zip(exact, footprints(), strict=True):
        assert g[:-1].sum() == pytest.approx(e[:-1].sum(), rel=0.5)
        assert g[-1] == pytest.approx(e[-1], rel=0.5, abs=1)
    guessed = cache.misses(funcs)
    assert exact_misses["l1_misses"] > 0
    for name, value in exact_misses.items():
        assert guessed[name] == pytest.approx(value, rel=0.1, abs=1)


def test_code_counts_are_kept_on_disk_for_the_next_process(tmp_path, monkeypatch):
    import numpy as np

    from autoplace import Device

    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    target = str(Device.cpu(0).tvm_target())
    key = '["relax.nn.relu",[[[1,64],"float32"]],{},[]]'
    first = KernelAnalysis().code_counts(key, target)
    assert np.isfinite(first[0]).all()

    def compiled(*args):
        raise AssertionError("compiled again although the counts are on disk")

    monkeypatch.setattr(KernelAnalysis, "_compile_and_count", compiled)
    again = KernelAnalysis().code_counts(key, target)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    # a damaged file is compiled again, not trusted
    for f in tmp_path.rglob("*.json"):
        f.write_text("{not json")
    monkeypatch.undo()
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path))
    for a, b in zip(first, KernelAnalysis().code_counts(key, target)):
        np.testing.assert_array_equal(a, b)


def test_distinct_lines_match_a_sort_whether_they_are_dense_or_sparse():
    import numpy as np

    rng = np.random.default_rng(0)
    for lines in (rng.integers(-300, 5000, 2000), rng.integers(0, 1 << 40, 50),
                  np.arange(64 * 3) * 7):
        unique = np.unique(lines)
        expected = np.append(np.bincount(unique % cache.LINE, minlength=64),
                             np.unique(unique // 64).size)
        np.testing.assert_array_equal(cache._distinct(lines), expected)


def test_counts_compiled_on_threads_equal_those_compiled_one_at_a_time(tmp_path, monkeypatch):
    """Every workload a prediction needs is counted in one call, its LLVM builds on threads (two
    workers here even on one core): the same counts as one workload at a time."""
    import numpy as np

    from autoplace import Device
    from autoplace.predict import kernels

    target = str(Device.cpu(0).tvm_target())
    keys = [json.dumps([f"relax.{op}", [[[1, n], "float32"]], {}, []])
            for op in ("nn.relu", "exp", "negative") for n in (64, 1000)]
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path / "alone"))
    alone = [KernelAnalysis().code_counts(k, target) for k in keys]
    cpus = kernels.process_cpus()
    monkeypatch.setattr(kernels, "process_cpus", lambda: cpus * 2)
    monkeypatch.setenv("AUTOPLACE_CACHE_DIR", str(tmp_path / "together"))
    analysis, builds = KernelAnalysis(), []
    compile_and_count = analysis._compile_and_count
    monkeypatch.setattr(analysis, "_compile_and_count",
                        lambda *a: builds.append(a) or compile_and_count(*a))
    analysis.count([(k, target) for k in keys * 2])
    assert len(builds) == len(keys)  # each once
    for key, expected in zip(keys, alone):
        for a, b in zip(analysis.code_counts(key, target), expected):
            np.testing.assert_array_equal(a, b)
