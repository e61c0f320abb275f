"""The ports a host publishes its customers' SSH servers on, and the kernel's ephemeral ports they are kept from.

Each window's sshd is published on the host's first customer port plus its lot's first GPU index; each download
window on the first free port from the first customer port + 1000. Linux hands its own outgoing connections (a
pull, a resolver, the portal's SSH session) their local port from the ephemeral ports (32768-60999), where the
default first customer port (42000) falls, and a port so held cannot be published: provisioning reserves the
customer ports there (host_steps.reserve_customer_ports), the host check says whether they are. The kernel forgets
the list at a reboot: provisioning also writes it to a sysctl file of the project's own, which the boot applies
(systemd-sysctl, or `sysctl --system`), so the ports are kept from the first outgoing connections on.
"""

import re
import shlex
from dataclasses import dataclass

from provisioning.containers import Runtime
from provisioning.drivers.base import CommandResult, Connection

EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
RESERVED_PORTS = "/proc/sys/net/ipv4/ip_local_reserved_ports"
# The reservation as the boot applies it: the kernel's whole list when it was written (the operator's own ports
# with the customers'), since a later sysctl file setting the same key replaces it rather than adds to it. A file of
# the operator's that sorts after this one (/etc/sysctl.conf is 99-sysctl.conf) wins at boot: the host check says
# so, and the next provisioning run reserves the customer ports again.
PERSISTED_RESERVATION = "/etc/sysctl.d/90-binome-customer-ports.conf"
SYSCTL_KEY = "net.ipv4.ip_local_reserved_ports"
DOWNLOAD_PORT_OFFSET = 1000
DOWNLOAD_PORTS = 1000
DOWNLOAD_PORTS_RESERVED = 64  # the first download ports, reserved with the windows' own
LAST_PORT = 65535
EPHEMERAL_RANGE = re.compile(r"\s*(\d{1,5})\s+(\d{1,5})\s*", re.ASCII)


def window_ports(base: int, span: int) -> range:
    """The ports the host's windows publish their sshd on: one per GPU index up to its highest lot's."""
    return range(base, min(base + span, LAST_PORT + 1))


def download_ports(base: int) -> range:
    """The download windows' ports, in the order they are taken; none past the last TCP port."""
    first = base + DOWNLOAD_PORT_OFFSET
    return range(first, min(first + DOWNLOAD_PORTS, LAST_PORT + 1))


def customer_ports(base: int, span: int) -> set[int]:
    """What the host keeps from its outgoing connections: every window port and the first download ports."""
    return {*window_ports(base, span), *download_ports(base)[:DOWNLOAD_PORTS_RESERVED]}


PART = re.compile(r"(\d{1,5})(?:-(\d{1,5}))?", re.ASCII)
MAX_PARTS = 40_000  # more than the kernel's own list can hold once merged (every other port): not its list


def _parts(text: str) -> list[tuple[int, int]] | None:
    """The ranges of a list in the kernel's spelling ("42000-42007,43000"), merged and sorted; None when any part
    is not a port or a range of ports, or when there are more parts than the kernel's list can hold."""
    parts = [part.strip() for part in text.strip().split(",") if part.strip()]
    if len(parts) > MAX_PARTS:
        return None
    ranges = []
    for part in set(parts):
        found = PART.fullmatch(part)
        if found is None:
            return None
        low, high = int(found[1]), int(found[2] or found[1])
        if not low <= high <= LAST_PORT:
            return None
        ranges.append((low, high))
    return _merged(ranges)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges sorted, the overlapping and adjacent ones joined."""
    merged: list[list[int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], high)
        else:
            merged.append([low, high])
    return [(low, high) for low, high in merged]


def port_set(text: str) -> set[int]:
    """The ports of a list in the kernel's spelling; nothing when the list is not one (see `_parts`). At most every
    port once: merged ranges, never a range per part."""
    return {port for low, high in _parts(text) or [] for port in range(low, high + 1)}


def port_ranges(ports: set[int]) -> str:
    """The kernel's list of ranges for a set of ports."""
    ranges = _merged([(port, port) for port in ports])
    return ",".join(f"{low}-{high}" if high > low else str(low) for low, high in ranges)


@dataclass(frozen=True)
class PortState:
    exposed: set[int]  # the customer ports that fall in the host's ephemeral ports
    reserved: set[int]  # every port the host reserves from them
    known: bool = True  # whether the reserved list was read whole: only then may it be written back, widened
    persisted: frozenset[int] = frozenset()  # what the sysctl file of the project's reserves at boot

    @property
    def unreserved(self) -> set[int]:
        return self.exposed - self.reserved

    @property
    def lost_at_boot(self) -> set[int]:
        return self.exposed - self.persisted


def port_state(conn: Connection, ports: set[int]) -> PortState:
    """Which of `ports` the host's kernel could hand to an outgoing connection, and what it reserves. Read, never
    trusted: an ephemeral range that is not two numbers counts as none."""
    found = EPHEMERAL_RANGE.fullmatch(conn.run(["cat", EPHEMERAL_PORTS], check=False).stdout)
    low, high = (int(found[1]), int(found[2])) if found else (0, -1)
    exposed = {port for port in ports if low <= port <= high}
    if not exposed:
        return PortState(exposed=exposed, reserved=set())
    listed = conn.run(["cat", RESERVED_PORTS], check=False)
    # Read whole: the command answered, the kernel's closing newline came (a cut read would lose the rest of the
    # list on writing back), and every part is a port or a range of ports.
    known = listed.ok and listed.stdout.endswith("\n") and _parts(listed.stdout) is not None
    persisted = conn.run(["cat", PERSISTED_RESERVATION], check=False)
    return PortState(
        exposed=exposed, reserved=port_set(listed.stdout), known=known, persisted=frozenset(_boot_list(persisted))
    )


def _boot_list(read: CommandResult) -> set[int]:
    """The ports the sysctl file reserves: its one `key = list` line, read as the kernel's list; none when the file
    is missing or holds anything else (root's file, but read as any file of a host is)."""
    if not read.ok:
        return set()
    lines = [line.strip() for line in read.stdout.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        return set()
    key, equals, value = lines[0].partition("=")
    return port_set(value) if equals and key.strip() == SYSCTL_KEY else set()


# $1 the list, $2 the file: written aside, then renamed (a reboot mid-write finds the old file or the new one)
_PERSIST = (
    'install -d -m 755 "${2%/*}" && printf "%s\\n%s = %s\\n" "# Written by provisioning (Binome): the customer ports '
    'kept from outgoing connections, with what the host reserved besides (docs/operations.md, Provisioning)." '
    f'"{SYSCTL_KEY}" "$1" > "$2.part" && mv -f "$2.part" "$2"'
)


def reserve(conn: Connection, ports: set[int]) -> PortState:
    """Add the exposed ones of `ports` to what the host reserves, never narrowing it: a list that could not be read
    whole is left as it is; then the kernel's whole list written where the boot applies it, unless it says so
    already. The state read back."""
    state = port_state(conn, ports)
    if state.unreserved and state.known:
        value = port_ranges(state.reserved | state.exposed)
        conn.run(["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "reserve_ports", value, RESERVED_PORTS], check=False)
        state = port_state(conn, ports)
    if state.exposed and state.known and not state.unreserved and state.persisted != state.reserved:
        value = port_ranges(state.reserved)
        conn.run(["sh", "-c", _PERSIST, "persist_ports", value, PERSISTED_RESERVATION], check=False)
        state = port_state(conn, ports)
    return state


# --- a window port held anyway -------------------------------------------------------------------------------------

# The runtimes' words when the published port is held already: by a socket of the host's (podman, docker), by
# another container (docker)
PORTS_TAKEN = ("address already in use", "port is already allocated")

# netavark's forwards of published ports (podman's iptables rules): one jump per container and port, its comment
# naming the network and the container's id. A container removed while podman was interrupted (a killed command, a
# worker stopped mid-step) can leave its rule: netavark appends the next container's after it, so the stale one
# still wins and sends the port to whatever later holds that address.
NETAVARK_FORWARDS = "NETAVARK-HOSTPORT-DNAT"
_FORWARD = re.compile(
    r"-A NETAVARK-HOSTPORT-DNAT .*?--dport (?P<port>\d{1,5}) .*?"
    r'--comment "dnat name: [A-Za-z0-9_.-]{1,128} id: (?P<id>[0-9a-f]{64})" .*',
    re.ASCII,
)
MAX_FORWARD_RULES = 20_000  # more than a host's containers ever publish: the rest of an answer is not read
_ID = re.compile(r"[0-9a-f]{64}", re.ASCII)


@dataclass(frozen=True)
class Forward:
    port: int
    container: str  # the id netavark wrote
    rule: str  # as `iptables -S` prints it: what deletes it, with -D for -A


def stale_forwards(conn: Connection, runtime: Runtime) -> list[Forward] | None:
    """netavark's forwards whose container the runtime no longer has. The rules are read before the containers, so a
    container being started meanwhile is listed with its rule; when either answer is not whole, none is stale.
    None when there are no iptables rules of netavark's to read (nothing published yet, or its nftables driver)."""
    rules = conn.run(["iptables", "-w", "10", "-t", "nat", "-S", NETAVARK_FORWARDS], check=False)
    if not rules.ok:
        return None
    forwards = []
    for line in rules.stdout.splitlines()[:MAX_FORWARD_RULES]:
        found = _FORWARD.fullmatch(line.strip())
        if found and int(found["port"]) <= LAST_PORT:
            forwards.append(Forward(int(found["port"]), found["id"], line.strip()))
    if not forwards:
        return []
    listed = conn.run(runtime.command("ps", "--all", "--no-trunc", "--format", "{{.ID}}"), check=False)
    known = set(listed.stdout.split())
    if not listed.ok or not all(_ID.fullmatch(container) for container in known):
        return []
    return [forward for forward in forwards if forward.container not in known]


def drop_stale_forwards(conn: Connection, runtime: Runtime, port: int) -> list[Forward]:
    """Delete the stale forwards of `port` (before a container publishes it): those dropped."""
    dropped = []
    for forward in stale_forwards(conn, runtime) or []:
        if forward.port == port:
            rule = shlex.split(forward.rule)
            deleted = conn.run(["iptables", "-w", "10", "-t", "nat", "-D", *rule[1:]], check=False)
            if deleted.ok:
                dropped.append(forward)
    return dropped


_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def holders(conn: Connection, port: int) -> list[str]:
    """What holds `port` on the host now, as `ss` says it: a server listening there or a connection whose local
    port it is, with the process (name, pid). At most five lines, printable ASCII, each cut at 200 characters."""
    found = conn.run(["ss", "-Htanp", "sport", "=", f":{port}"], check=False)
    lines = [" ".join(_UNPRINTABLE.sub("?", line).split()) for line in found.stdout.splitlines()[:5]]
    return [line[:200] for line in lines if line]
