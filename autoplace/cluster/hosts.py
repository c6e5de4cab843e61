"""The hosts of a Ray cluster: their names, their devices, and the node each host is.

A host is named by its node's ``autoplace-host`` label (``ray start --labels
autoplace-host=NAME``), else by the node's hostname. Names stay the same when the cluster
restarts (a node's id does not), so a profile or plan that names hosts stays valid.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from autoplace.cluster._ray import ClusterError, connected_ray
from autoplace.devices import Device

#: The node label that names a host.
HOST_LABEL = "autoplace-host"


@dataclass(frozen=True)
class Host:
    """A live node of the cluster: its name, Ray node id, address and CPUs."""

    name: str
    node_id: str
    address: str
    cpus: int

    def devices(self) -> tuple[Device, ...]:
        """The devices autoplace can place on: its CPU, compiled for that host's CPU (the build
        runs there)."""
        return (Device.cpu(0, host=self.name),)


def hosts() -> tuple[Host, ...]:
    """The live hosts of the connected cluster, by name.

    Raises
    ------
    ClusterError
        Ray missing or not connected, or two nodes with one name (label them).
    """
    ray = connected_ray()
    found = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        labels = n.get("Labels") or {}
        name = labels.get(HOST_LABEL) or n.get("NodeManagerHostname") or n["NodeManagerAddress"]
        found.append(Host(name, n["NodeID"], n["NodeManagerAddress"],
                          int(n.get("Resources", {}).get("CPU", 0))))
    twice = sorted(k for k, c in Counter(h.name for h in found).items() if c > 1)
    if twice:
        raise ClusterError(f"several nodes are named {twice[0]!r}: name each node with "
                           f"'ray start --labels {HOST_LABEL}=NAME' (or labels= in ray.init)")
    return tuple(sorted(found, key=lambda h: h.name))


def cluster_devices() -> tuple[Device, ...]:
    """Every device of every live host of the connected cluster (``ray.init`` first).

    >>> ray.init(address="auto")                         # doctest: +SKIP
    >>> [d.spec for d in cluster_devices()]              # doctest: +SKIP
    ['node1/cpu:0', 'node2/cpu:0']
    """
    return tuple(d for h in hosts() for d in h.devices())


def named_hosts(names: Iterable[str] | None = None) -> dict[str, Host]:
    """The live hosts of the cluster by name: those of ``names`` (every one where None).

    Raises
    ------
    ClusterError
        Naming the first of ``names`` the cluster lacks, and the hosts it has.
    """
    live = {h.name: h for h in hosts()}
    names = sorted(live) if names is None else list(names)
    missing = [n for n in names if n not in live]
    if missing:
        raise ClusterError(f"no host {missing[0]!r} in the cluster (its hosts: "
                           f"{', '.join(live) or 'none'})")
    return {n: live[n] for n in names}


def host_nodes(devices: Iterable[Device]) -> dict[str | None, Host]:
    """The host of each of ``devices``' hosts (``None``: the driver's own node).

    Raises
    ------
    ClusterError
        Naming the first host the cluster lacks, and the hosts it has.
    """
    ray = connected_ray()
    live = {h.name: h for h in hosts()}
    wanted = sorted({d.host for d in devices}, key=lambda h: (h is not None, h or ""))
    found: dict[str | None, Host] = {}
    for name in wanted:
        if name is None:
            here = ray.get_runtime_context().get_node_id()
            found[None] = next(h for h in live.values() if h.node_id == here)
        elif name in live:
            found[name] = live[name]
        else:
            raise ClusterError(f"the plan places ops on host {name!r}, which the cluster "
                               f"lacks (its hosts: {', '.join(live) or 'none'})")
    return found
