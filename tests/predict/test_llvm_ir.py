"""Executed-instruction estimates from optimized LLVM IR: loop trip counts read from hand-written
IR, and the counts of real TVM kernels equal to their ops' arithmetic."""

import json

import pytest

import autoplace
from autoplace.predict.features import executed_counts
from autoplace.predict.llvm_ir import EXECUTED_COUNT_NAMES
from autoplace.predict.llvm_ir import executed_counts as ir_counts

LLVM = str(autoplace.Device.cpu(0).tvm_target())

# An outer loop of 10 around an inner one stepping 4 while < 32 (8 trips), then a loop whose bound
# is a run-time value, which counts once.
NESTED = """
define void @f(ptr %a, i64 %n) {
entry:
  br label %outer
outer:
  %i = phi i64 [ 0, %entry ], [ %i.next, %latch ]
  br label %inner
inner:
  %j = phi i64 [ 0, %outer ], [ %j.next, %inner ]
  %x = fadd float 0.0, 1.0
  %j.next = add nuw nsw i64 %j, 4
  %c = icmp ult i64 %j.next, 32
  br i1 %c, label %inner, label %latch
latch:
  %i.next = add nuw nsw i64 %i, 1
  %d = icmp eq i64 %i.next, 10
  br i1 %d, label %tail, label %outer
tail:
  %k = phi i64 [ 0, %latch ], [ %k.next, %tail ]
  %y = fmul float 1.0, 2.0
  %v = fmul <4 x float> zeroinitializer, zeroinitializer
  store float %y, ptr %a, align 4
  %k.next = add i64 %k, 1
  %e = icmp eq i64 %k.next, %n
  br i1 %e, label %done, label %tail
done:
  ret void
}
"""


def test_trip_counts_multiply_through_nested_loops():
    c = ir_counts(NESTED)
    assert c["scalar_float_ops"] == 10 * 8 + 1
    assert c["vector_float_ops"] == 1 and c["stores"] == 1
    assert c["loop_iterations"] == 10 * 8 + 10 + 1


def _matmul(m, k, n):
    return json.dumps(["relax.matmul", [[[m, k], "float32"], [[k, n], "float32"]],
                       {"out_dtype": "void"}, []])


def _counts(key):
    return dict(zip(EXECUTED_COUNT_NAMES, executed_counts([{"key": key}], LLVM)[0]))


def test_a_scalar_matmul_executes_one_multiply_add_per_mac():
    assert _counts(_matmul(4, 64, 32))["scalar_float_ops"] == 4 * 64 * 32
    # Unrolled by 4 with a remainder block counted at the loop's full trip count: within 1 %.
    assert _counts(_matmul(16, 128, 16))["scalar_float_ops"] == pytest.approx(16 * 128 * 16,
                                                                              rel=0.01)


def test_a_vectorised_matmul_counts_vector_ops_only():
    c = _counts(_matmul(4, 32, 32))
    assert c["scalar_float_ops"] == 0 and 0 < c["vector_float_ops"] < 4 * 32 * 32


def test_a_concat_is_counted_as_the_bytes_it_copies():
    # LLVM turns the concat's loops into memcpy calls of each input's channels.
    key = '["relax.concat",[[[1,8,4,4],"float32"],[[1,8,4,4],"float32"]],{"axis":1},[]]'
    assert 2 * 8 * 4 * 4 * 4 <= _counts(key)["copied_bytes"] <= 2 * 8 * 4 * 4 * 4 + 64
