"""The ports a host publishes its customers' SSH servers on, against the host's own outgoing connections: Linux hands
those their local port from its ephemeral ports (32768-60999), where the default first customer port (42000) falls,
and a port so held cannot be published. Provisioning reserves the customer ports from that range; the download
window takes the next port when one was taken after its look. Against the real sshd on loopback: this machine is
the host (its reserved ports are given back after the session, tests/provisioning/conftest.py)."""

import secrets
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from provisioning import download_steps, host_steps, ports
from provisioning.drivers.base import CommandResult
from provisioning.ports import DOWNLOAD_PORTS_RESERVED
from provisioning.step_context import StepContext
from tests.builders.containers import outgoing_connection_from
from tests.provisioning.conftest import RESERVED_PORTS

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _context(port_base: int, **values) -> StepContext:
    return StepContext(
        username="bn-ports", comment="", authorized_keys="", gpu_indices=[2, 3], expect_arch="", expect_vendor="nvidia",
        image_ref="", container_runtime="podman", keys_expire_at=datetime.now(UTC), ssh_port_base=port_base, **values,
    )  # fmt: skip


PERSISTED = Path(ports.PERSISTED_RESERVATION)


@pytest.fixture
def reserved_ports():
    """The host's reserved ports as they were, set back after the test, and the boot's file as it was."""
    before = RESERVED_PORTS.read_text()
    persisted = PERSISTED.read_text() if PERSISTED.exists() else None
    PERSISTED.unlink(missing_ok=True)
    yield before
    RESERVED_PORTS.write_text(before)
    PERSISTED.unlink(missing_ok=True)
    if persisted is not None:
        PERSISTED.write_text(persisted)


def _ephemeral() -> range:
    low, high = (int(word) for word in EPHEMERAL.read_text().split())
    return range(low, high + 1)


def _free(port: int) -> bool:
    """Whether a server could listen on `port` now: no outgoing connection of this machine's holds it."""
    try:
        socket.create_server(("127.0.0.1", port)).close()
    except OSError:
        return False
    return True


def _first_port_in_the_ephemeral_ports(span: int = 8) -> int:
    """A first customer port in the ephemeral ports whose window ports no connection holds yet: the suite's own
    connections (PostgreSQL, Redis, SSH) take their local ports there too, and one taken before the reservation
    keeps its port until it closes, as it would on a host (which the host check reports)."""
    ephemeral = _ephemeral()
    for _ in range(100):
        base = ephemeral.start + 8 * secrets.randbelow((len(ephemeral) - 2000) // 8)
        if all(_free(port) for port in range(base, base + span)):
            return base
    raise AssertionError("no free first customer port in 100 tries")


def test_provisioning_reserves_the_window_and_download_ports_that_fall_in_the_ephemeral_ports(admin, reserved_ports):
    # given: a host whose first customer port is in the ephemeral ports (as the default 42000 is), with 8 GPUs, and
    # a port range its operator reserved already for something of their own
    ephemeral = _ephemeral()
    base = _first_port_in_the_ephemeral_ports()
    operators_own = ephemeral.stop - 5
    RESERVED_PORTS.write_text(f"{operators_own}-{operators_own + 2}\n")

    # when: provisioning prepares the host
    summary = host_steps.prepare_host(admin, _context(base, host_port_span=8))

    # then: every window port and the download windows' first ports are reserved; the operator's range is kept
    reserved = ports.port_set(RESERVED_PORTS.read_text())
    download = base + 1000
    assert set(range(base, base + 8)) <= reserved
    assert set(range(download, download + DOWNLOAD_PORTS_RESERVED)) <= reserved
    assert {operators_own, operators_own + 1, operators_own + 2} <= reserved
    assert f"customer ports {base}-{base + 7},{download}-{download + DOWNLOAD_PORTS_RESERVED - 1} reserved" in summary
    # and: nothing else was taken from the host's outgoing connections
    assert len(reserved) == 8 + DOWNLOAD_PORTS_RESERVED + 3

    # and: a reserved port is only kept from the kernel's own choices: the window's server still listens there
    with socket.create_server(("127.0.0.1", base)) as server:
        assert server.getsockname()[1] == base

    # and: a second provisioning changes nothing
    again = host_steps.reserve_customer_ports(admin, _context(base, host_port_span=8))
    assert ports.port_set(RESERVED_PORTS.read_text()) == reserved and "reserved" in again


def test_the_reservation_is_kept_where_the_boot_applies_it_and_a_reboot_keeps_the_ports(admin, reserved_ports):
    # given: a host whose first customer port is in the ephemeral ports, and a range its operator reserved
    base = _first_port_in_the_ephemeral_ports()
    operators_own = _ephemeral().stop - 5
    RESERVED_PORTS.write_text(f"{operators_own}\n")

    # when: provisioning reserves the customer ports
    host_steps.reserve_customer_ports(admin, _context(base, host_port_span=8))

    # then: the sysctl file of the project's own holds the kernel's whole list, the operator's port with them
    reserved = ports.port_set(RESERVED_PORTS.read_text())
    (line,) = [line for line in PERSISTED.read_text().splitlines() if not line.startswith("#")]
    key, value = (part.strip() for part in line.split("="))
    assert key == "net.ipv4.ip_local_reserved_ports" and ports.port_set(value) == reserved
    assert set(range(base, base + 8)) | {operators_own} <= reserved

    # when: the host reboots (the kernel's list empty), and the boot applies the sysctl files
    RESERVED_PORTS.write_text("\n")
    applied = subprocess.run(["sysctl", "-p", str(PERSISTED)], capture_output=True, text=True, check=False)

    # then: the customer ports are kept from outgoing connections before any provisioning runs again
    assert applied.returncode == 0, applied.stderr
    assert ports.port_set(RESERVED_PORTS.read_text()) == reserved

    # and: a run that finds it all in place leaves the file alone
    written = PERSISTED.stat().st_mtime_ns
    host_steps.reserve_customer_ports(admin, _context(base, host_port_span=8))
    assert PERSISTED.stat().st_mtime_ns == written


@pytest.mark.parametrize(
    "text",
    [
        "net.ipv4.ip_local_reserved_ports = 42000-42001,x\n",  # not the kernel's list
        "net.ipv4.ip_local_port_range = 42000 42001\n",  # another key
        "net.ipv4.ip_local_reserved_ports = 42000\nnet.ipv4.ip_local_reserved_ports = 42001\n",  # two settings
        "",
    ],
)
def test_a_boot_file_that_is_not_one_list_of_the_key_reserves_nothing_at_boot(text):
    host = RefusingHost(
        {
            ports.EPHEMERAL_PORTS: "32768 60999\n",
            ports.RESERVED_PORTS: "42000-42001\n",
            ports.PERSISTED_RESERVATION: text,
        }
    )
    state = ports.port_state(host, {42000, 42001})
    assert state.unreserved == set() and state.lost_at_boot == {42000, 42001}


def test_ports_below_the_ephemeral_ports_reserve_nothing(admin, reserved_ports):
    summary = host_steps.reserve_customer_ports(admin, _context(20000))
    assert RESERVED_PORTS.read_text() == reserved_ports
    assert summary == "customer ports outside the ephemeral ports"


class RefusingHost:
    """A host whose kernel settings cannot be written (a read-only /proc/sys), with what its files say."""

    is_dry_run = False

    def __init__(self, files: dict[str, str]):
        self.files = files

    def run(self, argv, **_):
        if argv[0] == "cat":
            return CommandResult(" ".join(argv), 0, self.files.get(argv[1], ""), "", 0.0)
        return CommandResult(" ".join(argv), 1, "", "sh: 1: cannot create: Read-only file system", 0.0)


def test_a_host_that_refuses_the_reservation_is_said_in_the_output_and_does_not_fail_provisioning():
    host = RefusingHost({ports.EPHEMERAL_PORTS: "32768\t60999\n", ports.RESERVED_PORTS: "\n"})
    summary = host_steps.reserve_customer_ports(host, _context(42000, host_port_span=4))
    assert summary.startswith("WARNING: customer ports 42000-42003,43000-43063 are in the ephemeral ports")


@pytest.mark.parametrize(
    "files",
    [
        {},  # nothing readable
        {ports.EPHEMERAL_PORTS: "lots of ports\n"},
        {ports.EPHEMERAL_PORTS: "60999 32768 1\n"},
        {ports.EPHEMERAL_PORTS: "32768 ⁶⁰⁹⁹⁹\n"},  # digits int() refuses
        {ports.EPHEMERAL_PORTS: "1" * 5000 + " 60999\n"},  # longer than int() reads
    ],
)
def test_an_ephemeral_range_that_cannot_be_read_reserves_nothing(files):
    assert host_steps.reserve_customer_ports(RefusingHost(files), _context(42000)) == (
        "customer ports outside the ephemeral ports"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", set()),
        ("42000-42002,43000\n", {42000, 42001, 42002, 43000}),
        ("65535, 7 ,8-9,8-9,1-3,2-5", {65535, 7, 8, 9, 1, 2, 3, 4, 5}),  # repeated and overlapping parts
        # not the kernel's list: reversed, words, negatives, beyond 65535, halves, digits int() refuses, a number
        # longer than int() reads, so nothing of it is trusted
        *[(f"42000,{bad}", set()) for bad in ("42002-42000", "abc", "-5", "70000", "1-", "x-3", "²", "①", "9" * 5000)],
    ],
)
def test_the_kernels_port_list_is_read_and_anything_else_reads_as_none(text, expected):
    assert ports.port_set(text) == expected


def test_a_huge_list_is_read_at_once():
    # a million bytes of ranges (what one command's answer may hold) is no list of the kernel's, and no hang either
    assert ports.port_set("0-65535," * 125_000) == set()
    assert len(ports.port_set("0-65535," * 30_000)) == 65536  # repeated parts are read once


def test_the_port_list_written_back_is_the_kernels_own_spelling():
    assert ports.port_ranges({43000, 42000, 42001, 42002, 50000, 50001}) == "42000-42002,43000,50000-50001"
    assert ports.port_set(ports.port_ranges(set(range(42000, 42064)) | {1})) == set(range(42000, 42064)) | {1}


def test_the_download_windows_look_for_a_free_port_sees_outgoing_connections(admin):
    # given: an outgoing connection of the host's holds a port: no server listens on it
    ctx = _context(20000)
    sock = outgoing_connection_from(ctx.download_ports[0] + secrets.randbelow(900))
    try:
        # then: the download window's look for a free port counts it as taken
        assert sock.getsockname()[1] in download_steps._published_ports(admin, ctx)
    finally:
        sock.close()


def test_a_first_customer_port_near_the_last_tcp_port_has_no_download_port_past_it():
    # the highest first customer port the host form takes: its download windows would start past 65535
    assert list(_context(65000).download_ports) == []
    assert list(_context(64000).download_ports)[-1] == 65535
    assert host_steps.reserve_customer_ports(
        RefusingHost({ports.EPHEMERAL_PORTS: "1024 65535"}), _context(65000, host_port_span=8)
    ).startswith("WARNING: customer ports 65000-65007 are")


def test_the_host_check_says_whether_the_customer_ports_are_kept_from_outgoing_connections(
    sshd, admin, catalog, settings, reserved_ports
):  # fmt: skip
    from provisioning.hosts import host_check
    from tests.provisioning.conftest import make_loopback_host

    # given: a host whose first customer port is in the ephemeral ports, its lot on GPUs 0 and 1
    host = make_loopback_host(sshd, catalog, settings, name="ports", runtime="podman")
    host.ssh_port_base = _first_port_in_the_ephemeral_ports(span=2)
    host.save(update_fields=["ssh_port_base"])
    base, download = host.ssh_port_base, host.ssh_port_base + 1000

    # when: the operator checks it before anything was provisioned there
    host_check(host=host)
    host.refresh_from_db()

    # then: the report names the ports an outgoing connection could take, and that provisioning reserves them
    exposed = f"{base}-{base + 1},{download}-{download + DOWNLOAD_PORTS_RESERVED - 1}"
    assert f"customer ports: {exposed} in the ephemeral ports and not reserved" in host.isolation_report
    assert host.isolation_mode == host.Isolation.CONTAINER  # a matter of reliability, not of isolation

    # and: once provisioning reserved them, the check says so
    host_steps.reserve_customer_ports(admin, _context(base, host_port_span=2))
    host_check(host=host)
    host.refresh_from_db()
    assert f"customer ports: {exposed} reserved from the ephemeral ports, at boot too" in host.isolation_report

    # and: without the boot's file, the check says the next reboot gives them back
    PERSISTED.unlink()
    host_check(host=host)
    host.refresh_from_db()
    assert f"customer ports: {exposed} reserved from the ephemeral ports until the next reboot" in host.isolation_report


@pytest.mark.parametrize(
    "listed",
    [
        None,  # the list could not be read (the command failed)
        "42000-42007,garbage\n",  # not the kernel's own words: something in it would be lost on writing back
        "42000-42007,4500",  # cut: the kernel ends its list with a newline, the rest of it would be lost
    ],
)
def test_a_reserved_list_that_cannot_be_read_whole_is_never_written_back_narrower(listed):
    files = {ports.EPHEMERAL_PORTS: "32768 60999"}
    if listed is not None:
        files[ports.RESERVED_PORTS] = listed
    host = WritableHost(files)
    summary = host_steps.reserve_customer_ports(host, _context(45000, host_port_span=2))
    assert host.writes == [] and summary.startswith("WARNING: customer ports 45000-45001,46000-46063 are")


class WritableHost(RefusingHost):
    """A host that would take any write: whether one was sent is recorded."""

    def __init__(self, files: dict[str, str]):
        super().__init__(files)
        self.writes = []

    def run(self, argv, **_):
        if argv[0] == "cat" and argv[1] not in self.files:
            return CommandResult(" ".join(argv), 1, "", "cat: No such file or directory", 0.0)
        if argv[0] == "sh":
            self.writes.append(argv)
            return CommandResult(" ".join(argv), 0, "", "", 0.0)
        return super().run(argv)
