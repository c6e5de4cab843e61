"""Plans across machines: the hosts of a Ray cluster, their devices, the links between them,
the actor call a stage on a host costs and what a tensor costs through its object store, each
host's ops timed on that host, and a staged plan run as one Ray actor per stage on its host (a
throughput plan's stream, or a latency plan's one input at a time).

Ray is an optional dependency (``pip install 'autoplace[cluster]'``), imported where it is used.
"""

from autoplace.cluster._ray import INSTALL, ClusterError
from autoplace.cluster.calls import host_overheads, measure_call_overheads, shared_machines
from autoplace.cluster.hosts import HOST_LABEL, Host, cluster_devices, host_nodes, hosts
from autoplace.cluster.links import host_fingerprint, host_links, measure_host_links
from autoplace.cluster.objects import measure_object_costs, object_costs
from autoplace.cluster.pipeline import ClusterPipelineError, RayModel, RayPipeline
from autoplace.cluster.profiling import (RayRunner, host_cost_model, host_profiles,
                                         profile_on_hosts)
from autoplace.cluster.solve import solve_over_hosts

__all__ = ["HOST_LABEL", "INSTALL", "ClusterError", "ClusterPipelineError", "Host", "RayModel",
           "RayPipeline", "RayRunner", "cluster_devices", "host_cost_model", "host_fingerprint",
           "host_links", "host_nodes", "host_overheads", "host_profiles", "hosts",
           "measure_call_overheads", "measure_host_links", "measure_object_costs",
           "object_costs", "profile_on_hosts",
           "shared_machines", "solve_over_hosts"]
