"""Links between hosts: timed over Ray's object transfer, stored by host name, and charged by the
solver on the edges that cross hosts."""

import numpy as np
import pytest

import autoplace
from autoplace.cluster.links import host_fingerprint, host_links, measure_host_links
from autoplace.devices import Device, Link
from autoplace.profile import LinkFit, ProfileStore
from autoplace.solve import solve
from autoplace.solve.build import build_problem
from cluster_models import chain  # noqa: E402


def _fit(src, dst, alpha, beta):
    return LinkFit(host_fingerprint(src), host_fingerprint(dst), alpha, beta, 1.0, ())


def test_host_links_match_devices_by_host():
    devs = [Device.cpu(0, host="alpha"), Device.cpu(1, host="alpha"), Device.cpu(0, host="beta"),
            Device.cpu(0)]
    links = host_links(devs, [_fit("alpha", "beta", 1e-4, 1e9)])
    # Both alpha devices to beta's; not back (no fit), not within alpha, not this host's device.
    assert links == {("alpha-cpu0", "beta-cpu0"): Link("alpha-cpu0", "beta-cpu0", 1e-4, 1e9),
                     ("alpha-cpu1", "beta-cpu0"): Link("alpha-cpu1", "beta-cpu0", 1e-4, 1e9)}


@pytest.mark.parametrize("beta, split", [(0.2e9, False), (1e12, True)])
def test_solver_charges_the_host_link(beta, split):
    # Two ops of 10 ms on either host. Split over the hosts, each host runs one (10 ms per
    # input) but 4 MiB crosses the link: 0.1 + 21 ms at 0.2 GB/s (worse than one host's
    # 20 ms), 0.1 ms at 1 TB/s (better).
    g = autoplace.OpGraph.from_relax(chain((1024, 1024)))
    devs = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]
    links = host_links(devs, [_fit("alpha", "beta", 1e-4, beta), _fit("beta", "alpha", 1e-4, beta)])
    p = build_problem(g, devs, np.full((2, 2), 10e-3), links)
    assert p.alpha[0, 1] == 1e-4 and p.beta[0, 1] == beta
    sol = solve(p, "throughput", "brute")
    assert (len(set(sol.assignment)) == 2) == split
    # Split: the busier of a host (10 ms) and the link (0.1 ms + 4 MiB / beta); one host: 20 ms.
    assert sol.value == pytest.approx(10e-3 if split else 20e-3, rel=1e-6)


@pytest.mark.slow
def test_measured_host_links_are_stored_by_host(ray_cluster, tmp_path):
    path = tmp_path / "profile.db"
    with ProfileStore(path) as store:
        fits = measure_host_links(store, sizes=(4096, 2**16, 2**20), repeats=3)
        assert {(f.src, f.dst) for f in fits} == {
            (host_fingerprint("alpha"), host_fingerprint("beta")),
            (host_fingerprint("beta"), host_fingerprint("alpha"))}
        for f in fits:
            assert f.alpha_s > 0 and 0 < f.beta_bps < np.inf and len(f.points) == 3
        # Stored: measured again only when asked (a restarted cluster keeps its host names).
        assert measure_host_links(store, sizes=(4096, 2**16)) == []
    with ProfileStore(path) as store:
        devs = [Device.cpu(0, host="alpha"), Device.cpu(0, host="beta")]
        links = host_links(devs, store)
        assert set(links) == {("alpha-cpu0", "beta-cpu0"), ("beta-cpu0", "alpha-cpu0")}
        assert {store.device(host_fingerprint(h)).name for h in ("alpha", "beta")} == {
            "host:alpha", "host:beta"}
