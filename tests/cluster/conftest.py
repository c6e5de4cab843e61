"""A Ray cluster of two nodes on this machine, hosts ``alpha`` (the head) and ``beta``, one CPU
each, shared by the tests of this folder and shut down after them."""

import builtins

import pytest

STORE_BYTES = 200 * 2**20  # object store per node: small, the machine is shared


@pytest.fixture(scope="session")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="the cluster tests need Ray: "
                                            "pip install 'autoplace[cluster]'")
    from ray.cluster_utils import Cluster

    from autoplace.cluster import HOST_LABEL

    c = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, object_store_memory=STORE_BYTES, include_dashboard=False,
        labels={HOST_LABEL: "alpha"}))
    try:
        c.add_node(num_cpus=1, object_store_memory=STORE_BYTES, labels={HOST_LABEL: "beta"})
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def without_ray(monkeypatch):
    """Imports of Ray fail in this test, as where it is not installed."""
    real = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
