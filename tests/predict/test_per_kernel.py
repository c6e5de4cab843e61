"""Costs per fused kernel: ops without a kernel cost 0 on every device; on a GPU each kernel's
anchor keeps its cost and the rest of its ops cost 0."""

import numpy as np
import pytest

import autoplace
from autoplace import zoo
from autoplace.predict.per_kernel import fused_costs, kernel_anchors, kernel_floor
from autoplace.graph.fusion import fused_groups

CPU, GPU = autoplace.Device.cpu(0), autoplace.Device.cuda(0)


def test_each_gpu_kernel_is_charged_once_and_cpu_ops_without_a_kernel_cost_nothing():
    m = zoo.load("resnet")
    graph = autoplace.OpGraph.from_relax(m.mod)
    rng = np.random.default_rng(0)
    cost = rng.uniform(1e-6, 1e-5, size=(len(graph.nodes), 2))
    cost[3, 1] = np.inf  # a node the GPU cannot run stays impossible there
    out = fused_costs(m.mod, graph, [CPU, GPU], cost)
    in_kernel = {i for _, nodes in fused_groups(m.mod) for i in nodes}
    assert 0 < len(in_kernel) < len(graph.nodes)  # resnet's weight transposes run no kernel
    for i in range(len(graph.nodes)):
        assert out[i, 0] == (cost[i, 0] if i in in_kernel else 0.0)
    assert out[3, 1] == np.inf
    groups = [nodes for _, nodes in fused_groups(m.mod, gpu=True) if nodes]
    assert any(len(nodes) > 1 for nodes in groups)  # resnet's convs take their relus along
    for nodes in groups:
        charged = [i for i in nodes if out[i, 1] > 0]
        assert len(charged) <= 1
        if charged and np.isfinite(out[charged[0], 1]):
            assert out[charged[0], 1] == cost[charged[0], 1]
            flops = [graph.nodes[i].flops for i in nodes]
            assert graph.nodes[charged[0]].flops == max(flops)  # the anchor: most FLOPs
    anchors = kernel_anchors(groups, graph, np.nan_to_num(cost[:, 1], posinf=0.0))
    assert anchors.sum() == len(groups) < len(graph.nodes)


def test_the_kernel_floor_lifts_each_kernel_and_only_on_its_devices():
    m = zoo.load("resnet")
    graph = autoplace.OpGraph.from_relax(m.mod)
    rng = np.random.default_rng(0)
    cost = fused_costs(m.mod, graph, [CPU, GPU],
                       rng.uniform(1e-7, 1e-5, size=(len(graph.nodes), 2)))
    floor = 2e-6
    out = kernel_floor(m.mod, graph, [CPU, GPU], cost, {GPU.name: floor})
    assert out[:, 0].tolist() == cost[:, 0].tolist()  # no floor on the CPU
    assert ((out[:, 1] == 0) == (cost[:, 1] == 0)).all()  # no kernel, no cost
    groups = [nodes for _, nodes in fused_groups(m.mod, gpu=True) if nodes]
    for nodes in groups:  # each kernel at least the floor; one above it keeps its cost
        total, before = out[list(nodes), 1].sum(), cost[list(nodes), 1].sum()
        assert total == pytest.approx(max(before, floor), rel=1e-9)
    assert any(cost[list(n), 1].sum() < floor for n in groups)  # the floor did lift some
    # On the CPU, each kernel's ops together: a conv with its relu computed inline pays one
    # floor, not one per op.
    cpu = kernel_floor(m.mod, graph, [CPU], cost[:, :1], {CPU.name: floor})
    cpu_groups = [nodes for _, nodes in fused_groups(m.mod) if nodes]
    assert any(len(n) > 1 for n in cpu_groups)
    for nodes in cpu_groups:
        assert cpu[list(nodes), 0].sum() >= floor - 1e-15


def test_cpu_kernels_keep_their_ops_costs_and_optimize_charges_fused_gpu_kernels():
    m = zoo.load("mlp")  # every op of it is in a kernel
    graph = autoplace.OpGraph.from_relax(m.mod)
    cost = np.ones((len(graph.nodes), 1))
    np.testing.assert_array_equal(fused_costs(m.mod, graph, [CPU], cost), cost)
    res = autoplace.optimize(m.mod, [CPU, GPU], cost_model=autoplace.RooflineCostModel(),
                             check_devices=False, db=None)  # planned here, GPU or not
    raw, _ = autoplace.node_costs(graph, [CPU, GPU], autoplace.RooflineCostModel())
    np.testing.assert_array_equal(res.problem.cost[:, 0], raw[:, 0])
    gpu = res.problem.cost[:, 1]
    assert 0 < np.count_nonzero(gpu) < len(graph.nodes) and gpu.sum() < raw[:, 1].sum()
