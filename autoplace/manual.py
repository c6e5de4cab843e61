"""Placement rules a person writes: by op type, binding name or index range, first match wins.

A rule is ``(pattern, device_name)``. Patterns:

- ``op:GLOB`` matches the op type (``op:nn.conv2d``, ``op:nn.*``);
- ``name:GLOB`` matches the binding name (``name:lv1*``);
- ``index:A-B`` matches node indices A..B inclusive (``index:0-9``; ``index:5`` one node);
- ``*`` matches every node.

A ``#K`` or ``#A-B`` suffix keeps only the K-th (or A-th to B-th) of the pattern's matches, counted
from 0 in topological order: ``("op:nn.conv2d#0", "a")`` puts the first conv on ``a``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

from autoplace.devices import Device
from autoplace.graph import OpGraph
from autoplace.plan import Plan, PlanError

_RULE = re.compile(r"(?:(op|name|index):)?([^#]+)(?:#(\d+)(?:-(\d+))?)?")


def match_rule(graph: OpGraph, pattern: str) -> list[int]:
    """Indices of the nodes ``pattern`` selects (see the module docstring for the syntax)."""
    m = _RULE.fullmatch(pattern.strip())
    if not m:
        raise PlanError(f"rule {pattern!r}: expected 'op:GLOB', 'name:GLOB', 'index:A-B' or '*', "
                        "optionally with '#K' or '#A-B'")
    kind, body, first, last = m.groups()
    if kind is None and body != "*":
        raise PlanError(f"rule {pattern!r}: say what it matches, e.g. 'op:{body}' or 'name:{body}'")
    if kind == "index":
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", body)
        if not r:
            raise PlanError(f"rule {pattern!r}: an index range is 'index:A-B' or 'index:A'")
        lo, hi = int(r.group(1)), int(r.group(2) or r.group(1))
        if hi >= len(graph.nodes):
            raise PlanError(f"rule {pattern!r}: the graph has only {len(graph.nodes)} nodes "
                            f"(indices 0-{len(graph.nodes) - 1})")
        hits = list(range(lo, hi + 1))
    else:
        hits = [n.index for n in graph.nodes
                if body == "*" or fnmatch.fnmatchcase(n.op_type if kind == "op" else n.name, body)]
    if first is not None:
        hits = hits[int(first): int(last if last is not None else first) + 1]
    return hits


def rule_assignment(graph: OpGraph, devices: Sequence[Device],
                    rules: Sequence[tuple[str, str]]) -> dict[int, str]:
    """Node index -> device name for the nodes the rules match (first matching rule wins)."""
    names = {d.name for d in devices}
    out: dict[int, str] = {}
    for pattern, dev in rules:
        if dev not in names:
            raise PlanError(f"rule {pattern!r} names device {dev!r}; devices are {sorted(names)}")
        hits = match_rule(graph, pattern)
        if not hits:
            raise PlanError(f"rule {pattern!r} matches no node (op types in the graph: "
                            f"{sorted({n.op_type for n in graph.nodes})})")
        for i in hits:
            out.setdefault(i, dev)
    return out


def place(graph: OpGraph, devices: Sequence[Device], rules: Sequence[tuple[str, str]],
          default: str | None = None) -> Plan:
    """A plan from rules; nodes no rule matches go to ``default`` (an error if there is none).
    Over a torch device, each chain of a conv or linear, its bias add and its activation
    (:func:`autoplace.graph.chains.fused_chains`) is one of the plan's groups: the rules that
    put it whole on the torch device make it one PyTorch call.

    >>> place(g, devs, [("op:nn.conv2d#0", "a"), ("*", "b")])   # doctest: +SKIP
    """
    chosen = rule_assignment(graph, devices, rules)
    if default is not None:
        chosen = {i: chosen.get(i, default) for i in range(len(graph.nodes))}
    missing = [graph.nodes[i].name for i in range(len(graph.nodes)) if i not in chosen]
    if missing:
        raise PlanError(f"{len(missing)} node(s) match no rule, first {missing[:5]}: add a rule "
                        "('*' for the rest) or pass default=")
    groups = ()
    if any(d.runtime == "torch" for d in devices):
        from autoplace.graph.chains import fused_chains

        groups = tuple(tuple(c) for c in fused_chains(graph))
    return Plan.from_assignment(graph, devices, [chosen[i] for i in range(len(graph.nodes))],
                                groups=groups)
