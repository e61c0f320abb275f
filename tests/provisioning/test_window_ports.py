"""A window's port on a busy host: the port is its lot's (the host's first customer port plus its first GPU index),
so when something of the host's holds it anyway the run says what (process and pid), and the retry goes through once
it is released; a port forward podman's netavark left for a container it no longer has (a command interrupted
mid-removal) would win over the new container's, since the first rule wins: the host check names it and
provisioning drops it before it publishes the port. Against the real sshd on loopback, real podman with runc and
the host's real iptables (this machine is the tests' host)."""

import os
import secrets
import socket
import subprocess
import threading

import pytest

from booking.models import OrderStatus
from provisioning import runs
from provisioning.hosts import host_check
from provisioning.models import Access, ProvisioningRun, ProvisioningStep
from tests.builders.containers import _hand_over, _in, _provision
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.django_db


def test_a_window_port_held_on_the_host_is_named_with_its_process_and_the_retry_starts_once_it_is_free(
    container_host, booking_data, keypair, admin_user, admin, client, django_capture_on_commit_callbacks
):  # fmt: skip
    # given: a server of the host's own listening on the port of the lot the order gets (GPUs 0,1: the first port)
    port = container_host.ssh_port_base
    squatter = socket.create_server(("127.0.0.1", port))
    try:
        # when: the order is provisioned
        order, username, private_key = _provision(
            client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "held"
        )
        # then: the run fails naming the port and what holds it, this test's process
        run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.PROVISION)
        assert run.status == ProvisioningRun.Status.FAILED
        assert f"port {port} is held on the host by LISTEN" in run.error, run.error
        assert f"pid={os.getpid()}," in run.error
    finally:
        squatter.close()
    try:
        # when: the operator retries once the port is free
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_retry(order=order, actor=admin_user)
        # then: the run resumes and the container starts on that port (the one the failed start made, not a twin)
        started = run.steps.get(name="start_container")
        assert started.status == ProvisioningStep.Status.DONE, run.steps.values_list("name", "error")
        assert f"container binome-{username} (kept)" in started.output
        access = _hand_over(order, admin_user, django_capture_on_commit_callbacks)
        assert access.ssh_port == port
        assert _in(access, private_key, "id -un").stdout.strip() == username
    finally:
        remove_user(admin, username)


def _iptables(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "10", "-t", "nat", *argv], capture_output=True, text=True, check=check)


@pytest.fixture
def stale_forward(container_host):
    """A forward of the lot's port as netavark writes one, for a container podman never had, sending the port to a
    decoy server of the test's: where a customer's SSH would land if the stale rule won."""
    decoy = socket.create_server(("127.0.0.1", 0))
    decoy_port = decoy.getsockname()[1]

    def greet() -> None:
        while True:
            try:
                connection, _ = decoy.accept()
            except OSError:  # closed at the test's end
                return
            with connection:
                connection.sendall(b"SSH-2.0-decoy\r\n")

    threading.Thread(target=greet, daemon=True).start()
    if _iptables("-S", "NETAVARK-HOSTPORT-DNAT", check=False).returncode != 0:  # a host podman never published on
        _iptables("-N", "NETAVARK-HOSTPORT-DNAT")
    if _iptables("-C", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "NETAVARK-HOSTPORT-DNAT",
                 check=False).returncode != 0:  # fmt: skip
        _iptables("-A", "OUTPUT", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "NETAVARK-HOSTPORT-DNAT")
    port = container_host.ssh_port_base
    rule = ["NETAVARK-HOSTPORT-DNAT", "-p", "tcp", "-m", "tcp", "--dport", str(port), "-m", "comment", "--comment",
            f"dnat name: binome-bn-gone id: {secrets.token_hex(32)}", "-j", "DNAT", "--to-destination",
            f"127.0.0.1:{decoy_port}"]  # fmt: skip
    _iptables("-A", *rule)
    yield port
    _iptables("-D", *rule, check=False)
    decoy.close()


def test_a_stale_forward_of_the_window_port_is_reported_then_dropped_before_the_container_publishes_it(
    container_host, stale_forward, booking_data, keypair, admin_user, admin, client, django_capture_on_commit_callbacks
):  # fmt: skip
    port = stale_forward
    # given: the stale forward wins: a connection to the port reaches the decoy
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        assert connection.recv(64).startswith(b"SSH-2.0-decoy")

    # when: the operator checks the host, the check names it
    host_check(host=container_host)
    container_host.refresh_from_db()
    assert f"customer ports: {port} still forwarded for a container podman no longer has" in (
        container_host.isolation_report
    )

    # when: an order is provisioned on that lot
    order, username, private_key = _provision(
        client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "stale"
    )
    try:
        # then: the run dropped the stale forward before publishing, and the customer reaches their container
        run = order.provisioning_runs.get(kind=ProvisioningRun.Kind.PROVISION)
        started = run.steps.get(name="start_container")
        assert f"a stale forward of port {port}, of a removed container, dropped" in started.output
        assert "binome-bn-gone" not in _iptables("-S", "NETAVARK-HOSTPORT-DNAT").stdout
        access = _hand_over(order, admin_user, django_capture_on_commit_callbacks)
        assert Access.objects.get(order=order).ssh_port == port
        assert _in(access, private_key, "id -un").stdout.strip() == username
        assert order.status == OrderStatus.READY
        # and: the new container's own forward is kept, and the check has nothing stale to say
        assert f"--dport {port} " in _iptables("-S", "NETAVARK-HOSTPORT-DNAT").stdout
        host_check(host=container_host)
        container_host.refresh_from_db()
        assert "no longer has" not in container_host.isolation_report
    finally:
        remove_user(admin, username)


class NftablesHost:
    """A host whose netavark writes nftables rules: no NETAVARK-HOSTPORT-DNAT chain for iptables to list."""

    is_dry_run = False

    def run(self, argv, **_):
        from provisioning.drivers.base import CommandResult

        if argv[:4] == ["nft", "list", "table", "inet"]:
            return CommandResult(" ".join(argv), 0, "table inet netavark {\n}\n", "", 0.0)
        return CommandResult(" ".join(argv), 1, "", "iptables: No chain/target/match by that name.", 0.0)


def test_a_host_whose_forwards_are_nftables_rules_is_told_they_are_not_looked_at():
    from provisioning import host_probe
    from provisioning.containers import Runtime

    lines = host_probe._stale_forward_lines(NftablesHost(), Runtime("podman"), {42000})

    assert lines == [
        "customer ports: netavark forwards them with nftables here, which this check does not read: a forward left by "
        "a removed container is neither looked for nor dropped (podman's iptables driver is)"
    ]
