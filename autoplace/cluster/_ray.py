"""Ray, imported where it is used: a missing install is one line saying how to get it."""

from __future__ import annotations

from typing import Any

#: The pip command that installs what the cluster unit needs.
INSTALL = "pip install 'autoplace[cluster]'"


class ClusterError(RuntimeError):
    """The cluster cannot run what was asked; the message says what is wrong and how to fix it."""


def import_ray() -> Any:
    """The ``ray`` module; :class:`ClusterError` (one line, with the install command) when Ray
    is not installed."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"Ray is not installed: {INSTALL}") from None
    return ray


def connected_ray() -> Any:
    """The ``ray`` module, connected to a cluster (``ray.init`` was called)."""
    ray = import_ray()
    if not ray.is_initialized():
        raise ClusterError("not connected to a Ray cluster: call ray.init(address=...) first "
                           "(address 'auto' finds one started with 'ray start' on this machine)")
    return ray
