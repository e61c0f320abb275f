"""The ports a host publishes its customers' SSH servers on, and the kernel's ephemeral ports they are kept from.

Each window's sshd is published on the host's first customer port plus its lot's first GPU index; each download
window on the first free port from the first customer port + 1000. Linux hands its own outgoing connections (a
pull, a resolver, the portal's SSH session) their local port from the ephemeral ports (32768-60999), where the
default first customer port (42000) falls, and a port so held cannot be published: provisioning reserves the
customer ports there (host_steps.reserve_customer_ports), the host check says whether they are.
"""

from dataclasses import dataclass

from provisioning.drivers.base import Connection

EPHEMERAL_PORTS = "/proc/sys/net/ipv4/ip_local_port_range"
RESERVED_PORTS = "/proc/sys/net/ipv4/ip_local_reserved_ports"
DOWNLOAD_PORT_OFFSET = 1000
DOWNLOAD_PORTS = 1000
DOWNLOAD_PORTS_RESERVED = 64  # the first download ports, reserved with the windows' own
LAST_PORT = 65535


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


def port_set(text: str) -> set[int]:
    """The ports of the kernel's list of ranges ("42000-42007,43000"); what is not a port is left out."""
    ports: set[int] = set()
    for part in text.strip().split(","):
        low, dash, high = part.strip().partition("-")
        high = high if dash else low
        if low.isdigit() and high.isdigit() and int(low) <= int(high) <= LAST_PORT:
            ports.update(range(int(low), int(high) + 1))
    return ports


def port_ranges(ports: set[int]) -> str:
    """The kernel's list of ranges for a set of ports."""
    ranges: list[list[int]] = []
    for port in sorted(ports):
        if ranges and port == ranges[-1][1] + 1:
            ranges[-1][1] = port
        else:
            ranges.append([port, port])
    return ",".join(f"{low}-{high}" if high > low else str(low) for low, high in ranges)


@dataclass(frozen=True)
class PortState:
    exposed: set[int]  # the customer ports that fall in the host's ephemeral ports
    reserved: set[int]  # every port the host reserves from them
    known: bool = True  # whether the reserved list was read whole: only then may it be written back, widened

    @property
    def unreserved(self) -> set[int]:
        return self.exposed - self.reserved


def port_state(conn: Connection, ports: set[int]) -> PortState:
    """Which of `ports` the host's kernel could hand to an outgoing connection, and what it reserves. Read, never
    trusted: an ephemeral range that is not two numbers counts as none."""
    words = conn.run(["cat", EPHEMERAL_PORTS], check=False).stdout.split()
    low, high = (int(words[0]), int(words[1])) if len(words) == 2 and all(w.isdigit() for w in words) else (0, -1)
    exposed = {port for port in ports if low <= port <= high}
    if not exposed:
        return PortState(exposed=exposed, reserved=set())
    listed = conn.run(["cat", RESERVED_PORTS], check=False)
    parts = [part.strip() for part in listed.stdout.strip().split(",") if part.strip()]
    known = listed.ok and all(port_set(part) for part in parts)  # a part that is not a port: not the kernel's list
    return PortState(exposed=exposed, reserved=port_set(listed.stdout), known=known)


def reserve(conn: Connection, ports: set[int]) -> PortState:
    """Add the exposed ones of `ports` to what the host reserves, never narrowing it: a list that could not be read
    whole is left as it is. The state read back."""
    state = port_state(conn, ports)
    if state.unreserved and state.known:
        value = port_ranges(state.reserved | state.exposed)
        conn.run(["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "reserve_ports", value, RESERVED_PORTS], check=False)
        state = port_state(conn, ports)
    return state
