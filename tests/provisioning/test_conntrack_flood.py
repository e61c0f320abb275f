"""A tenant filling the host's connection-tracking table past their share, two ways the first cap (connlimit on the
flows their bridge opens) let through (issue 33's red team): connections opened and closed at once, which the
kernel's count leaves out while the table keeps them 120 s in TIME_WAIT; and connections into the tenant's published
port, which came in on the host's own interfaces. As a hostile tenant, root in their container, with a server and
clients of their own; against the real sshd on loopback and podman with runc (tests/provisioning/conftest), one
order on the test host with the operator's small share, so that each attack reaches it in seconds."""

# ruff: noqa: F811 (the harness's fixtures come from tests/provisioning/tenants.py)

import resource
import socket
import subprocess
import time

import pytest

from inventory.models import Host
from provisioning import container_steps, shares
from provisioning.drivers.base import CommandResult
from provisioning.step_context import StepContext
from tests.builders.containers import _hand_over, _in, _provision
from tests.provisioning.conftest import customer_ssh, remove_user
from tests.provisioning.tenants import outside_server  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

CAP = 1000  # the operator's share of the connection-tracking table per lot on the test host


@pytest.fixture
def alice(client, container_host, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks):
    """One order on the test host, handed over: (order, access, private key). The host's operator set a share of
    the connection-tracking table per lot."""
    Host.objects.filter(pk=container_host.pk).update(connections_per_lot=CAP)
    callbacks = django_capture_on_commit_callbacks
    order, username, key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
    try:
        access = _hand_over(order, admin_user, callbacks)
        yield order, access, key
    finally:
        remove_user(admin, username)


def _address(access, key) -> str:
    return _in(access, key, "hostname -I").stdout.split()[0]


def _bridge(admin, access) -> str:
    network = f"binome-{access.username}"
    return admin.run(["podman", "network", "inspect", "--format", "{{.NetworkInterface}}", network]).stdout.strip()


def _conntrack_lines() -> list[bytes]:
    with open("/proc/net/nf_conntrack", "rb") as table:
        return table.readlines()


def _tracked_with(address: str) -> int:
    """Entries of the host's connection-tracking table that name `address`, in either direction (a connection into
    the container names it in its reply direction only)."""
    needle = f"src={address} ".encode()
    return sum(1 for line in _conntrack_lines() if needle in line)


# Open `n` TCP connections to the outside and close each at once (the client's FIN first), for a minute at most:
# every one ends in the host's table in TIME_WAIT, where it stays 120 s (nf_conntrack_tcp_timeout_time_wait). The
# attack ends when the guard has dropped REFUSALS of its attempts in all: the guard lets about one new flow a second
# through once the share is reached (the rate its timeouts give back), so a count of refusals *in a row* was never
# reached and each attack ran its full minute. A dropped SYN is never answered: an attempt unanswered within
# REFUSED_AFTER seconds is refused (a connection the guard lets through is answered in milliseconds).
ATTACK_SECONDS = 60
REFUSALS = 30
REFUSED_AFTER = 0.5
OPEN_AND_CLOSE = """
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
REFUSALS, REFUSED_AFTER = int(sys.argv[5]), float(sys.argv[6])
for _ in range(100):  # the server is up
    try:
        socket.create_connection((host, port), timeout=5).close()
        break
    except OSError as exc:
        error = exc
        time.sleep(0.1)
else:
    sys.exit(f"the server never answered: {error}")
opened = refused = 0
deadline = time.monotonic() + float(sys.argv[4])
for _ in range(n):
    if time.monotonic() > deadline:
        break
    s = socket.socket()
    s.settimeout(REFUSED_AFTER)
    try:
        s.connect((host, port))
        opened += 1
    except OSError:
        refused += 1
        if refused == REFUSALS:  # the cap holds: dropped
            break
    s.close()
print(opened)
"""

CLOSING_SERVER = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=4096)
while True:
    server.accept()[0].close()
"""


def test_connections_opened_and_closed_at_once_hold_no_more_than_the_tenant_s_share(alice, outside_server, admin):
    """The kernel's count of open flows (connlimit's nf_conncount) leaves out a TCP flow once closed (TIME_WAIT,
    CLOSE), while the connection-tracking table keeps it 120 s in TIME_WAIT: unchecked, a tenant who opens and closes
    connections to any server of the internet (a CDN, their own) is never refused one and holds 120 s × their rate
    of the host's table (2,200 connections a second fill a table of 262,144, whatever their cap; the red team's 3,000
    with a cap of 1,000 held 3,004 places). The guard also caps the rate of new TCP flows, sized so that the flows
    closed within the table's timeout fit in the share with the open ones."""
    _order, access, key = alice
    assert access.shares["connections"] == CAP
    target, namespace = outside_server[0].split(":")[0], outside_server[1]
    port = "9090"  # a server of the attacker's on the internet: it answers each connection and closes it
    server = subprocess.Popen(["ip", "netns", "exec", namespace, "python3", "-c", CLOSING_SERVER, target, port])
    address = _address(access, key)

    # Alice opens and closes three times her share of connections, one after the other, for a minute
    attack = f"python3 - {target} {port} {3 * CAP} {ATTACK_SECONDS} {REFUSALS} {REFUSED_AFTER}"
    opened = _in(access, key, attack, input=OPEN_AND_CLOSE, timeout=ATTACK_SECONDS + 60)

    # the host's table holds her flows within her share: she was refused connections before it was full
    tracked = _tracked_with(address)
    states = [line.split()[5] for line in _conntrack_lines() if f"src={address} ".encode() in line]
    said = {state.decode(): states.count(state) for state in set(states)}
    print(f"Alice opened and closed {opened.stdout.strip()} connections; tracked: {tracked} {said} (cap {CAP})")
    print(admin.run(["iptables", "-w", "10", "-t", "mangle", "-L", f"{shares.CONNTRACK_CHAIN}-{_bridge(admin, access)}",
                     "-v", "-x", "-n"]).stdout)  # fmt: skip
    server.kill()
    server.wait()
    assert int(opened.stdout) < 3 * CAP  # refused before her three shares' worth
    assert tracked <= CAP, f"{tracked} entries of Alice's flows in the host's table, her share is {CAP}"


# As container root: the customer's own listener on the published port (sshd's listener killed; its supervisor
# retries every second and finds the port taken), a backlog the kernel completes handshakes into without an accept.
LISTENER = """
import os, signal, socket, sys, time
for pid in os.listdir("/proc"):
    try:
        if pid.isdigit() and open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"/usr/sbin/sshd\\0-D"):
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(200):
    try:
        server.bind(("0.0.0.0", 2222))
        break
    except OSError:
        time.sleep(0.01)
server.listen(4096)
if os.fork():
    print("listening", flush=True)
    os._exit(0)
os.setsid()
for fd in (0, 1, 2):
    os.close(fd)
time.sleep(600)
"""


def test_connections_into_the_tenant_s_published_port_hold_no_more_than_the_tenant_s_share(alice, admin):
    """The flows into a tenant's published port come in on the host's own interfaces, not the tenant's bridge: the
    tenant, root in their container, answers on that port with a listener of their own (or lets sshd hold them), and
    opens connections to it from machines of theirs; each one stays ESTABLISHED in the host's table for 5 days
    (nf_conntrack_tcp_timeout_established). Counted against no share (the red team's 3,000 with a cap of 1,000 held
    3,003 places), five client addresses × 64k source ports fill a table of 262,144 with idle connections. The guard
    counts the flows going out on the bridge (DNAT'd into the container) with the ones it opens."""
    _order, access, key = alice
    address = _address(access, key)
    assert "listening" in customer_ssh(access, key, "python3 -", user="root", input=LISTENER, timeout=60).stdout
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * CAP + 1024), hard))
    held, refused, deadline = [], 0, time.monotonic() + ATTACK_SECONDS
    try:
        # from outside (here the host's loopback, where the test host publishes), three times her share of
        # connections, held open, for a minute at most
        while len(held) < 3 * CAP and refused < REFUSALS and time.monotonic() < deadline:
            try:
                held.append(socket.create_connection(("127.0.0.1", access.ssh_port), timeout=REFUSED_AFTER))
            except OSError:
                refused += 1
        tracked = _tracked_with(address)
        print(f"tracked into Alice's container with {len(held)} connections held: {tracked} (share {CAP})")
        assert len(held) < 3 * CAP  # refused before her three shares' worth
        assert tracked <= CAP, f"{tracked} entries of flows into Alice's container in the host's table, share {CAP}"
    finally:
        for connection in held:
            connection.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _Listing:
    """A host whose `iptables -t mangle -S` answers `listing` (the guard's rules, as iptables lists them)."""

    is_dry_run = False

    def __init__(self, listing: str):
        self.listing = listing

    def run(self, argv, check=True, timeout=None):
        return CommandResult(" ".join(argv), 0, self.listing, "", 0.0)


GUARD_LISTING = """-N BINOME-CT
-N BINOME-CT-podman3
-A PREROUTING -i podman+ -j BINOME-CT
-A POSTROUTING -o podman+ -j BINOME-CT
-A BINOME-CT -i podman3 -j BINOME-CT-podman3
-A BINOME-CT -o podman3 -j BINOME-CT-podman3
-A BINOME-CT-podman3 -m conntrack --ctstate NEW -m connlimit --connlimit-above 375 --connlimit-mask 0 \
--connlimit-saddr -m comment --comment "binome share 1000 over 120s" -j DROP
-A BINOME-CT-podman3 -p tcp -m conntrack --ctstate NEW -m hashlimit --hashlimit-above 3750/hour \
--hashlimit-burst 125 --hashlimit-name b0123456789abcd --hashlimit-htable-expire 122000 -m comment \
--comment "binome share 1000 over 120s" -j DROP
"""


def test_the_host_check_reads_a_bridge_s_share_back_only_when_both_directions_and_both_caps_hold_it():
    assert shares.conntrack_caps(_Listing(GUARD_LISTING)) == {"podman3": 1000}
    # the flows into the container (POSTROUTING, out on the bridge) not counted: no share
    inbound = GUARD_LISTING.replace("-A BINOME-CT -o podman3 -j BINOME-CT-podman3\n", "")
    assert shares.conntrack_caps(_Listing(inbound)) == {}
    unjumped = GUARD_LISTING.replace("-A POSTROUTING -o podman+ -j BINOME-CT\n", "")
    assert shares.conntrack_caps(_Listing(unjumped)) is None
    # closed flows not rate-capped, or an open cap the share does not bound: no share
    unrated = "\n".join(line for line in GUARD_LISTING.splitlines() if "hashlimit" not in line)
    assert shares.conntrack_caps(_Listing(unrated)) == {}
    assert shares.conntrack_caps(_Listing(GUARD_LISTING.replace("-above 375 ", "-above 1000 "))) == {}


def test_removing_the_container_removes_its_share_s_rules_so_the_next_network_on_its_bridge_starts_afresh(
    alice, admin
):  # fmt: skip
    """A bridge's rules left behind would cap the next network that takes the bridge with a share and a count not its
    own (the red team found the harness's BINOME-CT holding rules for podman1 to podman10)."""
    _order, access, _key = alice
    bridge = _bridge(admin, access)
    assert shares.conntrack_caps(admin)[bridge] == CAP  # the host check reads her share back

    context = StepContext(
        username=access.username, comment="", authorized_keys="", gpu_indices=[0], expect_arch="",
        expect_vendor="nvidia", image_ref="", container_runtime="podman", keys_expire_at=None,
    )  # fmt: skip
    assert "network" in container_steps.remove_container(admin, context)

    listed = admin.run(["iptables", "-w", "10", "-t", "mangle", "-S"]).stdout
    assert not [
        line for line in listed.splitlines() if {bridge, f"{shares.CONNTRACK_CHAIN}-{bridge}"} & {*line.split()}
    ]
    assert bridge not in shares.conntrack_caps(admin)
    assert not admin.run(["test", "-e", shares.conntrack_cap_file(bridge)], check=False).ok
