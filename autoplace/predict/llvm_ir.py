"""What a kernel's optimized LLVM IR executes, estimated without running it.

Every basic block is counted as many times as the loops around it run: natural loops are found
from the control-flow graph's dominators (networkx), and a loop's trip count is read from the
compare of its induction variable that leaves it (``%i.next = add %i, 4`` /
``icmp eq %i.next, 64`` gives 16). TVM's untuned kernels have constant loop bounds, so this
recovers the op's arithmetic exactly: a ``[1,4,65,16]x[1,4,16,65]`` matmul counts
4 * 65 * 64 * 16 multiply-adds in ``<4 x float>`` vectors and 4 * 65 * 16 in scalars. A loop whose
trip count cannot be read counts once. Blocks inside a loop count at its full trip count, taken
branch or not.
"""

from __future__ import annotations

import math
import re

_ARITH = re.compile(r"= (?:tail )?(?:(?:fmul|fadd|fsub|fdiv|fcmp)\b"
                   r"|call .*@llvm\.(?:fmuladd|fma|maxnum|minnum|exp|sqrt)\.)")
FLOAT_VECTOR = re.compile(r"<(\d+) x (?:float|double|half|bfloat)>")
_VECTOR_LOAD = re.compile(r"= load <\d+ x ")

# Executed counts of :func:`executed_counts`, in this order.
EXECUTED_COUNT_NAMES = ("vector_float_ops", "scalar_float_ops", "vector_loads", "scalar_loads",
                        "stores", "copied_bytes", "loop_iterations", "instructions")

_LABEL = re.compile(r"^([-\w.$]+):")
_TARGET = re.compile(r"label %([-\w.$]+)")
_DEF = re.compile(r"^(%[-\w.$]+) = (.*)$")
_BRANCH = re.compile(r"^br i1 (%[-\w.$]+), label %([-\w.$]+), label %([-\w.$]+)")
_ICMP = re.compile(r"^icmp (\w+) i\d+ (%[-\w.$]+), (-?\d+)")
_ADD = re.compile(r"^add (?:nuw )?(?:nsw )?i\d+ (%[-\w.$]+), (-?\d+)")
_VALUE = r"(-?\d+|%[-\w.$]+), %[-\w.$]+"
_PHI = re.compile(rf"^phi i\d+ \[ {_VALUE} \], \[ {_VALUE} \]")
_MEMCPY = re.compile(r"@llvm\.mem(?:cpy|move|set)\.[^(]*\(.*, i64 (\d+), i1")


def executed_counts(ir: str) -> dict[str, float]:
    """Estimated executed counts (:data:`EXECUTED_COUNT_NAMES`) of every function in ``ir``.

    Float ops are multiply, add, subtract, divide, compare, fused multiply-add, min, max, exp and
    sqrt (one per vector instruction, whatever its lanes); ``copied_bytes`` the constant lengths
    of ``llvm.memcpy`` / ``memmove`` / ``memset`` (LLVM turns a concat's loops into copies);
    ``loop_iterations`` the conditional branches run.
    """
    total = dict.fromkeys(EXECUTED_COUNT_NAMES, 0.0)
    for blocks in _functions(ir):
        for lines, times in _block_frequencies(blocks):
            for s in lines:
                total["instructions"] += times
                if kind := line_kind(s):
                    total[kind] += times * (int(_MEMCPY.search(s).group(1))
                                            if kind == "copied_bytes" else 1)
    return total


def line_kind(line: str) -> str | None:
    """The column of :data:`EXECUTED_COUNT_NAMES` besides ``instructions`` that one IR line counts
    in, or ``None`` (stores and branches are told by the line's start: strip it first)."""
    if _ARITH.search(line):
        return "vector_float_ops" if FLOAT_VECTOR.search(line) else "scalar_float_ops"
    if "= load " in line:
        return "vector_loads" if _VECTOR_LOAD.search(line) else "scalar_loads"
    if line.startswith("store "):
        return "stores"
    if line.startswith("br i1 "):
        return "loop_iterations"
    return "copied_bytes" if _MEMCPY.search(line) else None


def _functions(ir: str):
    """Each defined function as ``{label: [instruction lines]}`` in source order."""
    blocks = None
    for line in ir.splitlines():
        if line.startswith("define "):
            blocks, label = {"": []}, ""
        elif blocks is None:
            continue
        elif line.startswith("}"):
            if not blocks[""]:
                del blocks[""]
            yield blocks
            blocks = None
        elif m := _LABEL.match(line):
            label = m.group(1)
            blocks[label] = []
        elif (s := line.strip()) and not s.startswith(("#dbg", ";")):
            blocks[label].append(s)


def _block_frequencies(blocks: dict[str, list[str]]):
    """``(lines, times run)`` of each block: the product of its enclosing loops' trip counts."""
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(blocks)
    defs = {}
    for label, lines in blocks.items():
        for s in lines:
            if m := _DEF.match(s):
                defs[m.group(1)] = m.group(2)
            elif s.startswith(("br ", "switch ", "i32 ", "i64 ")):  # terminator and switch cases
                graph.add_edges_from((label, t) for t in _TARGET.findall(s) if t in blocks)
    entry = next(iter(blocks))
    idom = nx.immediate_dominators(graph, entry)
    times = dict.fromkeys(blocks, 1)
    for tail, head in graph.edges:
        if tail in idom and _dominates(idom, head, tail):  # a back edge: head starts a loop
            body = {head, tail}
            if tail != head:
                body |= nx.ancestors(graph.subgraph(set(graph) - {head}), tail)
            trips = [_trip_count(blocks[b][-1], body, defs) for b in body
                     if blocks[b] and any(s not in body for s in graph.successors(b))]
            trip = min((t for t in trips if t is not None), default=1)
            for b in body:
                times[b] *= trip
    return [(blocks[b], times[b]) for b in blocks]


def _dominates(idom: dict, a: str, b: str) -> bool:
    while b != a:
        if idom.get(b, b) == b:
            return False
        b = idom[b]
    return True


def _trip_count(branch: str, body: set[str], defs: dict[str, str]) -> int | None:
    """Times the loop's header runs, from a branch leaving the loop on a compare of an induction
    variable ``i = phi [start], [i + step]`` (or of ``i + offset``) with a constant."""
    m = _BRANCH.match(branch)
    compare = m and _ICMP.match(defs.get(m.group(1), ""))
    if not compare:
        return None
    stays_if_true = m.group(2) in body
    predicate, value, bound = compare.group(1), compare.group(2), int(compare.group(3))
    offset = 0
    if add := _ADD.match(defs.get(value, "")):
        value, offset = add.group(1), int(add.group(2))
    phi = _PHI.match(defs.get(value, ""))
    if not phi:
        return None
    a, b = phi.groups()
    start, step_from = (a, b) if b.startswith("%") else (b, a)
    step = _ADD.match(defs.get(step_from, ""))
    if start.startswith("%") or not step or step.group(1) != value or int(step.group(2)) <= 0:
        return None
    if predicate in ("ule", "sle"):
        bound += 1
    leaves_on_bound = (predicate == "eq" and not stays_if_true) or (
        predicate in ("ne", "ult", "slt", "ule", "sle") and stays_if_true)
    if not leaves_on_bound:
        return None
    return max(1, math.ceil((bound - int(start) - offset) / int(step.group(2))) + 1)
