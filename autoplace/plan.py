"""A placement plan: the device (and optionally the pipeline stage) of every node of an op graph."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import TYPE_CHECKING

from autoplace.backend.ort_segments import LEVELS as ORT_LEVELS, level_parts
from autoplace.devices import Device
from autoplace.solve.problem import OBJECTIVES

if TYPE_CHECKING:
    from autoplace.graph import OpGraph

#: The newest plan format this reads. A plan is written as version 1 unless it replicates the
#: model or fixes its thread count (fields an older reader would drop), then as version 2.
PLAN_FORMAT_VERSION = 2
#: What a plan says it minimizes: a solver's objective, or "manual" (placed by rules).
PLAN_OBJECTIVES = (*OBJECTIVES, "manual")
# Where a node's cost came from ("tuned": a tuned kernel timed alone, charged to its anchor op);
# a node whose devices differ joins them: "measured+roofline"; "torch-timed": a PyTorch call
# timed here, its hand-off from the VM included.
COST_SOURCES = ("measured", "learned", "roofline", "tuned", "torch-timed", "ort-profiled", "unsupported")


class PlanError(ValueError):
    """A plan that does not fit its graph or devices; the message says which node and why."""


@dataclass(frozen=True)
class Plan:
    """Device per node (by name), optional stage per node, and what the plan is predicted to take.

    Build one with :meth:`from_assignment` (or get it from ``optimize``), never by mutating one:
    use ``dataclasses.replace``.

    ``replicas``: device names that each run the whole model on every k-th input (data
    parallelism, a throughput plan's way to use several devices without a pipeline); the
    assignment then puts every node on the first of them, in one stage. ``threads``: TVM threads
    the plan's one device runs with, on every core this process may use (a single-device plan
    given the threads of all the CPU devices it was chosen over); ``None``: TVM's default.
    ``groups``: node indices a runtime device runs as one call where the plan puts them all
    on it (a conv or linear with its bias add and activation, on PyTorch): the colocation
    groups the plan was solved with; :func:`autoplace.annotate.annotate` makes one call of each
    group placed whole on a runtime device. ``ort_levels``: ``(device name, level)`` per ONNX
    Runtime device, the graph optimization level (``"all"``, ``"extended"``, ...) its segments
    were priced at, which a build gives their sessions; a device missing here is measured at
    build (the level that runs its segment fastest). ``ort_threads``: ``(device name, threads)``
    per ONNX Runtime device, the intra-op threads its segments were priced at (the plan's, or
    one where that ran faster); a device missing here runs the plan's threads, or where its
    level is measured at build, the faster of those and one.
    """

    nodes: tuple[str, ...]
    devices: tuple[Device, ...]
    assignment: tuple[str, ...]
    stages: tuple[int, ...] | None = None
    objective: str = "manual"
    predicted_s: float | None = None
    cost_sources: tuple[str, ...] | None = None
    solver: str = "manual"
    replicas: tuple[str, ...] = ()
    threads: int | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    ort_levels: tuple[tuple[str, str], ...] = ()
    ort_threads: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        names = [d.name for d in self.devices]
        if len(set(names)) != len(names):
            raise PlanError(f"device names must be unique, got {names}")
        if len(self.assignment) != len(self.nodes):
            raise PlanError(f"{len(self.nodes)} nodes but {len(self.assignment)} assignments")
        unknown = sorted(set(self.assignment) - set(names))
        if unknown:
            raise PlanError(f"plan uses unknown device(s) {unknown}; devices are {names}")
        if self.stages is not None and len(self.stages) != len(self.nodes):
            raise PlanError(f"{len(self.nodes)} nodes but {len(self.stages)} stages")
        if self.objective not in PLAN_OBJECTIVES:
            raise PlanError(f"objective {self.objective!r} is not one of {PLAN_OBJECTIVES}")
        if self.cost_sources is not None:
            if len(self.cost_sources) != len(self.nodes):
                raise PlanError(f"{len(self.nodes)} nodes but {len(self.cost_sources)} cost sources")
            bad = sorted({p for s in self.cost_sources for p in s.split("+")} - set(COST_SOURCES))
            if bad:
                raise PlanError(f"unknown cost source(s) {bad}; use {COST_SOURCES}")
        if self.replicas:
            self._check_replicas(names)
        if self.threads is not None:
            t = self.threads
            if isinstance(t, bool) or not isinstance(t, int) or t < 1:
                raise PlanError(f"threads must be a positive int or None, got {self.threads!r}")
            if len(set(self.assignment)) > 1 or self.replicas:
                raise PlanError("threads is for a plan of one device: a plan over several "
                                "devices gives each its share of the cores")
        grouped = [i for g in self.groups for i in g]
        if len(set(grouped)) != len(grouped) or any(
                not isinstance(i, int) or not 0 <= i < len(self.nodes) for i in grouped):
            raise PlanError("groups must be disjoint tuples of node indices of the plan")
        for name, level in self.ort_levels:
            if name not in names or self.device(name).runtime != "ort" \
                    or not _ort_level(level):
                raise PlanError(f"ort_levels: ({name!r}, {level!r}) is not an ONNX Runtime "
                                f"device of the plan with a level of {ORT_LEVELS} (and the "
                                "fusions it disables after a '-' each)")
        for name, t in self.ort_threads:
            if name not in names or self.device(name).runtime != "ort" \
                    or isinstance(t, bool) or not isinstance(t, int) or t < 1:
                raise PlanError(f"ort_threads: ({name!r}, {t!r}) is not an ONNX Runtime "
                                "device of the plan with a positive thread count")

    def _check_replicas(self, names: list[str]) -> None:
        reps = tuple(self.replicas)
        if len(reps) < 2 or len(set(reps)) != len(reps):
            raise PlanError(f"replicas must name two or more distinct devices, got {list(reps)}")
        unknown = sorted(set(reps) - set(names))
        if unknown:
            raise PlanError(f"replicas name unknown device(s) {unknown}; devices are {names}")
        several_stages = self.stages is not None and len(set(self.stages)) > 1
        if set(self.assignment) - {reps[0]} or several_stages:
            raise PlanError(f"a replicated plan runs the whole model on each replica: place "
                            f"every node on its first replica {reps[0]!r}, in one stage")

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_assignment(
        cls,
        graph: OpGraph,
        devices: Sequence[Device],
        assignment: Mapping[str, str] | Sequence[str],
        **fields,
    ) -> Plan:
        """A plan from node name -> device name (or a device name per node, in graph order).

        Raises
        ------
        PlanError
            For an unknown node or device, a node left unplaced, or an op placed on a device
            that cannot run it.
        """
        node_names = [n.name for n in graph.nodes]
        if isinstance(assignment, Mapping):
            extra = sorted(set(assignment) - set(node_names))
            if extra:
                raise PlanError(f"assignment names node(s) not in the graph: {extra[:5]}")
            missing = [n for n in node_names if n not in assignment]
            if missing:
                raise PlanError(f"{len(missing)} node(s) left unplaced, first {missing[:5]}: "
                                "every node needs a device")
            assigned = tuple(assignment[n] for n in node_names)
        else:
            assigned = tuple(assignment)
            if len(assigned) != len(node_names):
                raise PlanError(f"got {len(assigned)} devices for {len(node_names)} nodes")
        plan = cls(tuple(node_names), tuple(devices), assigned, **fields)
        plan.validate(graph)
        return plan

    # ------------------------------------------------------------------ queries

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(f"no device {name!r} in the plan (devices: {[d.name for d in self.devices]})")

    def device_of(self, node: str) -> Device:
        try:
            return self.device(self.assignment[self.nodes.index(node)])
        except ValueError:
            raise KeyError(f"no node {node!r} in the plan") from None

    def device_indices(self) -> list[int]:
        """The index into ``devices`` of each node's device, in node order."""
        pos = {d.name: k for k, d in enumerate(self.devices)}
        return [pos[a] for a in self.assignment]

    def used_devices(self) -> tuple[Device, ...]:
        """The devices that run something, in device order (every replica of a replicated
        plan)."""
        used = set(self.assignment) | set(self.replicas)
        return tuple(d for d in self.devices if d.name in used)

    def validate(self, graph: OpGraph) -> None:
        """Check the plan against ``graph``: same nodes, every op on a device that can run it,
        no device holding more than its ``memory_bytes`` (:attr:`OpNode.mem_bytes` summed); every
        replica runs and holds the whole model."""
        if tuple(n.name for n in graph.nodes) != self.nodes:
            raise PlanError("the plan was made for another graph: its node names differ "
                            f"({len(self.nodes)} in the plan, {len(graph.nodes)} in the graph)")
        for other in self.replicas[1:]:
            Plan.validate(dataclasses.replace(self, assignment=(other,) * len(self.nodes),
                                              replicas=()), graph)
        for node, dev_name in zip(graph.nodes, self.assignment):
            dev = self.device(dev_name)
            if not dev.can_run(node.op_type):
                raise PlanError(f"node {node.name!r} ({node.op_type}) is placed on {dev.name!r}, "
                                f"which cannot run {node.op_type}; place it on another device")
        held = dict.fromkeys(self.assignment, 0)
        for node, dev_name in zip(graph.nodes, self.assignment):
            held[dev_name] += node.mem_bytes
        for dev_name, used in held.items():
            cap = self.device(dev_name).memory_bytes
            if used > cap * (1 + 1e-12):
                raise PlanError(f"device {dev_name!r} holds {used:.6g} bytes of parameters and "
                                f"outputs, over its memory_bytes of {cap:.6g}; place some of its "
                                "nodes on another device")

    # ------------------------------------------------------------------ text forms

    def to_json(self) -> str:
        extra = {}
        if self.replicas:
            extra["replicas"] = list(self.replicas)
        if self.threads is not None:
            extra["threads"] = self.threads
        if self.groups:
            extra["groups"] = [list(g) for g in self.groups]
        if self.ort_levels:
            extra["ort_levels"] = dict(self.ort_levels)
        if self.ort_threads:
            extra["ort_threads"] = dict(self.ort_threads)
        return json.dumps({
            "format_version": 2 if extra else 1,
            "objective": self.objective,
            "solver": self.solver,
            "predicted_s": self.predicted_s,
            "devices": [d.to_dict() for d in self.devices],
            "nodes": list(self.nodes),
            "assignment": list(self.assignment),
            "stages": None if self.stages is None else list(self.stages),
            "cost_sources": None if self.cost_sources is None else list(self.cost_sources),
            **extra,
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"not a plan: invalid JSON ({e})") from None
        if not isinstance(d, dict) or "format_version" not in d:
            raise PlanError("not a plan: no 'format_version' field")
        if d["format_version"] not in (1, PLAN_FORMAT_VERSION):
            raise PlanError(f"plan format version {d['format_version']} is not supported "
                            f"(this autoplace reads versions 1 to {PLAN_FORMAT_VERSION})")
        try:
            return cls(
                nodes=tuple(d["nodes"]),
                devices=tuple(Device.from_dict(x) for x in d["devices"]),
                assignment=tuple(d["assignment"]),
                stages=None if d.get("stages") is None else tuple(d["stages"]),
                objective=d["objective"],
                predicted_s=d.get("predicted_s"),
                cost_sources=None if d.get("cost_sources") is None else tuple(d["cost_sources"]),
                solver=d.get("solver", "manual"),
                replicas=tuple(d.get("replicas") or ()),
                threads=d.get("threads"),
                groups=tuple(tuple(g) for g in d.get("groups") or ()),
                ort_levels=tuple((d.get("ort_levels") or {}).items()),
                ort_threads=tuple((d.get("ort_threads") or {}).items()),
            )
        except (KeyError, TypeError) as e:
            raise PlanError(f"not a plan: missing or malformed field {e}") from None

    def __str__(self) -> str:
        pred = "" if self.predicted_s is None else f", predicted {self.predicted_s * 1e3:.3f} ms"
        head = (f"Plan({self.objective}, {len(self.nodes)} nodes on "
                f"{len(self.used_devices())}/{len(self.devices)} devices{pred}, solver {self.solver})")
        if self.replicas:
            return (f"{head}\n  replicated: the whole model on each of "
                    f"{', '.join(self.replicas)}, each taking the next input when it is free")
        if self.threads is not None:
            head += f"\n  with {self.threads} TVM threads"
        lines, i = [head], 0
        keys = self.assignment if self.stages is None else list(zip(self.assignment, self.stages))
        for key, run in groupby(keys):
            n = len(list(run))
            dev, stage = (key, None) if self.stages is None else key
            where = _with_host(self.device(dev))
            where = where if stage is None else f"{where} stage {stage}"
            span = f"{i}" if n == 1 else f"{i}-{i + n - 1}"
            lines.append(f"  {span:>9}  {where}  ({self.nodes[i]}{' .. ' + self.nodes[i + n - 1] if n > 1 else ''})")
            i += n
        return "\n".join(lines)


def _with_host(device: Device) -> str:
    """A device's name, and its host where the name does not start with it (``"gpu@node2"``)."""
    host = device.host
    if host is None or device.name.startswith(f"{host}-"):
        return device.name
    return f"{device.name}@{host}"


def _ort_level(level) -> bool:
    """Whether ``level`` is an ONNX Runtime level a plan can carry (:func:`level_parts`)."""
    try:
        level_parts(level)
    except ValueError:
        return False
    return True
