"""Fixtures for two tenants on one container host and a server outside it (imported by the tests that use them:
they build on tests/builders/containers.py, which itself uses conftest's ssh helpers)."""

import secrets
import subprocess
import time
from decimal import Decimal

import pytest

from inventory.models import Host, Lot
from tests.builders.containers import _hand_over, _provision
from tests.provisioning.conftest import remove_user


@pytest.fixture
def provisioned_pair(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks
):
    """Two orders on the same container host, provisioned (pre-flight failed: no GPU here), not handed over yet:
    one gets GPUs 0,1, the other 2,3; each lot's share is 1.5 CPUs, 2 GiB of memory, 1 GiB of /dev/shm."""
    Host.objects.filter(pk=container_host.pk).update(cpus_per_lot=Decimal("1.5"), memory_per_lot_gib=2, shm_size_gib=1)
    Lot.objects.create(
        name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host, gpu_indices="2,3"
    )
    made = []
    try:
        for name in ("alice", "bob"):
            made.append(_provision(client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, name))
        yield made
    finally:
        for _order, username, _key in made:
            remove_user(admin, username)


@pytest.fixture
def two_customers(provisioned_pair, admin_user, django_capture_on_commit_callbacks):
    """The same two orders, handed over: (order, access, private key) each."""
    return [
        (order, _hand_over(order, admin_user, django_capture_on_commit_callbacks), key)
        for order, _username, key in provisioned_pair
    ]


@pytest.fixture
def outside_server():
    """A server "on the internet": in a network namespace of the test's own, behind a veth pair routed by the host
    (TEST-NET-2 addresses; nothing leaves this machine). Yields its address and port."""
    tag = secrets.token_hex(3)
    namespace, host_end, far_end = f"binome-net-{tag}", f"bnh{tag}", f"bnf{tag}"
    setup = [
        ["ip", "netns", "add", namespace],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", far_end],
        ["ip", "link", "set", far_end, "netns", namespace],
        ["ip", "addr", "add", "198.51.100.1/30", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "netns", "exec", namespace, "ip", "addr", "add", "198.51.100.2/30", "dev", far_end],
        ["ip", "netns", "exec", namespace, "ip", "link", "set", far_end, "up"],
        ["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"],
        ["ip", "netns", "exec", namespace, "ip", "route", "add", "default", "via", "198.51.100.1"],
    ]
    server = None
    try:
        for argv in setup:
            subprocess.run(argv, check=True, capture_output=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", namespace, "python3", "-m", "http.server", "8080", "--bind", "198.51.100.2"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        yield "198.51.100.2:8080", namespace
    finally:
        if server:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_end], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", namespace], check=False, capture_output=True)
