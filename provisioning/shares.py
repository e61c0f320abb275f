"""Each container's share of what its host has one of: CPU, memory, /dev/shm and processes, and the tables every
tenant draws from, where one could otherwise take all and leave the others, and the host itself, without: the
kernel's connection-tracking table (full, it drops every new connection: logins, downloads, the portal's own SSH),
the pool of terminals (empty, `ssh -t` answers "PTY allocation request failed"), the disks' bandwidth.

A share is the operator's per-lot setting for the host when there is one, else the host's size split over its lots
less a reserve the host keeps for itself (HOST_RESERVE), so that however every tenant fills theirs, the others' and
the host's are left. This module reads the host's size (one round trip, the answer parsed as hostile input) and
computes the shares; container_steps gives them to the container (the runtime's flags) and to the firewall guard
(nodekit/binome-guard: a share of the connection-tracking table per container bridge, which counts the flows its
containers open and those into their published ports, open and closed); the host check reads them back.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from provisioning.drivers.base import Connection

HOST_RESERVE = 0.9  # what the lots share of a host; the rest is the host's own
PIDS_PER_LOT = 4096  # a lot's processes at most (threads count: a data loader's workers each run dozens)
MIN_PIDS = 256
MIN_CONNECTIONS = 1024
MIN_PTYS = 16
IO_WEIGHT_PER_LOT = 100  # the runtime's blkio weight (10-1000): a container of 2 lots weighs twice a 1-lot one
MAX_IO_WEIGHT = 1000
# Where provisioning writes each container bridge's cap of tracked connections, for nodekit/binome-guard to apply.
CONNTRACK_CAPS_DIR = "/etc/binome/conntrack"
CONNTRACK_CHAIN = "BINOME-CT"
BRIDGE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,15}")  # a Linux interface name

# The host's size, one line each: CPUs, memory (KiB), the connection-tracking table's size, the pty pool (max, then
# the part kept for the host's own /dev/pts), the cgroup version, and the disk under $1 (the data volumes'): its
# device number, node, whether the kernel honours a blkio weight on it (the BFQ scheduler, or cgroup v2's io.cost);
# the pids and threads the kernel has (each thread takes a pid: the less of the two is what the tenants share).
_HOST_SIZE = (
    "nproc; awk '/^MemTotal:/ { print $2 }' /proc/meminfo; cat /proc/sys/net/netfilter/nf_conntrack_max 2>/dev/null "
    '|| echo 0; echo "$(cat /proc/sys/kernel/pty/max 2>/dev/null) $(cat /proc/sys/kernel/pty/reserve 2>/dev/null)"; '
    "if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo v2; else echo v1; fi; "
    'dev=$(findmnt -n -o MAJ:MIN --target "$1" 2>/dev/null | head -n 1 | tr -d " "); '
    'if [ -e "/sys/dev/block/$dev/partition" ]; then dev=$(cat "/sys/dev/block/$dev/../dev"); fi; echo "${dev:-none}"; '
    'name=$(sed -n "s/^DEVNAME=//p" "/sys/dev/block/$dev/uevent" 2>/dev/null); echo "/dev/${name:-none}"; '
    'if grep -qs "\\[bfq\\]" "/sys/dev/block/$dev/queue/scheduler" || grep -qs "^$dev enable=1" '
    "/sys/fs/cgroup/io.cost.qos; then echo weight; else echo none; fi; "
    'echo "$(cat /proc/sys/kernel/pid_max 2>/dev/null) $(cat /proc/sys/kernel/threads-max 2>/dev/null)"'
)


@dataclass(frozen=True)
class HostSize:
    cpus: int = 1
    memory_bytes: int = 0
    conntrack_max: int = 0  # 0: no connection tracking on this host (nothing to share)
    pty_max: int = 0
    pty_reserve: int = 0
    cgroup: str = "v1"
    io_device: str = ""  # the node of the disk holding the data volumes ("" unknown)
    io_weight: bool = False  # whether a weight on that disk is honoured
    pid_max: int = 0  # kernel.pid_max (0: unknown)
    threads_max: int = 0  # kernel.threads-max (0: unknown)

    @property
    def ptys_shared(self) -> int:
        """The terminals the containers draw from: /dev/pts instances other than the host's own share the pool less
        the host's reserve (kernel.pty.max - kernel.pty.reserve)."""
        return max(0, self.pty_max - self.pty_reserve)

    @property
    def pids_shared(self) -> int:
        """The processes (and threads: each takes a pid) the host has, the less of pid_max and threads-max known."""
        known = [figure for figure in (self.pid_max, self.threads_max) if figure]
        return min(known) if known else 0


DRY_RUN_SIZE = HostSize(64, 512 * 2**30, 262144, 4096, 1024, "v2", "/dev/nvme0n1", True, 4194304, 4194304)


def host_size(conn: Connection, volume_root: str) -> HostSize:
    """The host's size, read in one round trip (a figure that does not parse counts as unknown: 0)."""
    if getattr(conn, "is_dry_run", False):
        return DRY_RUN_SIZE
    answer = conn.run(["sh", "-c", _HOST_SIZE, "host_size", volume_root], check=False).stdout
    lines = [*answer.split("\n")[:9], *[""] * 9]
    pty = [*lines[3].split(), "0", "0"]
    pids = [*lines[8].split(), "0", "0"]

    def number(text: str) -> int:
        text = text.strip()
        return int(text) if text.isdigit() and len(text) <= 15 else 0

    device = lines[6].strip()
    return HostSize(
        cpus=max(1, number(lines[0])),
        memory_bytes=number(lines[1]) * 1024,
        conntrack_max=number(lines[2]),
        pty_max=number(pty[0]),
        pty_reserve=number(pty[1]),
        cgroup="v2" if lines[4].strip() == "v2" else "v1",
        io_device=device if re.fullmatch(r"/dev/[a-z0-9/_-]{1,60}", device) and device != "/dev/none" else "",
        io_weight=lines[7].strip() == "weight",
        pid_max=number(pids[0]),
        threads_max=number(pids[1]),
    )


@dataclass(frozen=True)
class Shares:
    cpus: str
    memory: str  # "1536m", as the runtimes take it
    shm_size: str
    pids_limit: int
    connections: int  # tracked connections (0: no connection tracking on the host)
    ptys: int
    io_weight: int  # 0 where the kernel does not honour one
    io_device: str
    io_bps: int  # the operator's bandwidth per container, read and write, bytes/s (0: none)

    @property
    def disk_io(self) -> str:
        """The disk I/O share in words (the order page and the run's output say it so)."""
        if self.io_bps:
            return f"{self.io_bps // 2**20} MB/s"
        return f"weight {self.io_weight}" if self.io_weight else ""

    def as_access(self) -> dict:
        """What the order's access keeps (the order page shows it)."""
        return {
            "cpus": self.cpus,
            "memory": self.memory,
            "shm": self.shm_size,
            "pids": self.pids_limit,
            "connections": self.connections,
            "ptys": self.ptys,
            "disk_io": self.disk_io,
        }


def mib(size: str) -> int:
    """MiB in a size as podman takes it ("2g", "1536m")."""
    match = re.fullmatch(r"(\d+)([gm]?)", size.strip().lower())
    if not match:
        raise ValueError(f"not a size: {size[:20]!r}")
    return int(match[1]) * (1024 if match[2] == "g" else 1)


def container_shares(
    size: HostSize,
    *,
    lots_in_container: int,
    lots_on_host: int,
    cpus: str = "",
    memory: str = "",
    shm_size: str = "",
    connections: int = 0,
    ptys: int = 0,
    disk_mbps: int = 0,
) -> Shares:
    """A container's shares: the operator's (already multiplied by the container's lots) where set, else its lots'
    part of the host's size less the host's reserve."""
    fraction = HOST_RESERVE * lots_in_container / max(1, lots_on_host)
    cpus = cpus or format(max(0.5, math.floor(size.cpus * fraction * 100) / 100), "g")
    memory = memory or f"{max(1, int(size.memory_bytes * fraction / 2**20))}m"
    memory_mib = mib(memory)
    shm_mib = max(64, min(mib(shm_size) if shm_size else memory_mib, memory_mib // 2))
    if not connections and size.conntrack_max:
        connections = max(MIN_CONNECTIONS, int(size.conntrack_max * fraction))
    if not ptys and size.ptys_shared:
        ptys = max(MIN_PTYS, int(size.ptys_shared * fraction))
    # at most PIDS_PER_LOT a lot, and never more than the lots' part of the host's pids less its reserve (a host
    # whose pid_max is the kernel's 32,768 keeps pids for its sshd, the runtime and the portal's SSH)
    pids = PIDS_PER_LOT * lots_in_container
    if size.pids_shared:
        pids = min(pids, max(MIN_PIDS, int(size.pids_shared * fraction)))
    weight = min(MAX_IO_WEIGHT, IO_WEIGHT_PER_LOT * lots_in_container) if size.io_weight else 0
    return Shares(
        cpus=cpus,
        memory=memory,
        shm_size=f"{shm_mib}m",
        pids_limit=pids,
        connections=connections,
        ptys=ptys,
        io_weight=weight,
        io_device=size.io_device if disk_mbps else "",
        io_bps=disk_mbps * 2**20 if size.io_device else 0,
    )


def conntrack_cap_file(bridge: str) -> str:
    if not BRIDGE_NAME.fullmatch(bridge):
        raise ValueError(f"not an interface name: {bridge[:40]!r}")
    return f"{CONNTRACK_CAPS_DIR}/{bridge}"


# The firewall guard's rules of a bridge's share S (nodekit/binome-guard says why these make S a bound): the flows
# open at once are capped at (S - S/4) / 2, new TCP flows at a burst of S/8 then the rest of S/4 per timeout of the
# table's closed TCP flows. Both rules carry the share in their comment, which the host check reads back.
_DISPATCH = re.compile(
    rf"-A {CONNTRACK_CHAIN} -(?P<direction>[io]) (?P<bridge>{BRIDGE_NAME.pattern}) -j {CONNTRACK_CHAIN}-(?P=bridge)"
)
_OPEN_RULE = re.compile(
    rf"-A {CONNTRACK_CHAIN}-(?P<bridge>{BRIDGE_NAME.pattern}) -m conntrack --ctstate NEW -m connlimit "
    r"--connlimit-above (?P<open>\d{1,10}) --connlimit-mask 0 --connlimit-saddr -m comment "
    r'--comment "binome share (?P<share>\d{1,10}) over \d{1,6}s" -j DROP'
)
_NEW_RULE = re.compile(
    rf"-A {CONNTRACK_CHAIN}-(?P<bridge>{BRIDGE_NAME.pattern}) -p tcp -m conntrack --ctstate NEW -m hashlimit "
    r"--hashlimit-above \d{1,10}/(?:sec|min|hour|day) --hashlimit-burst (?P<burst>\d{1,10}) "
    r"--hashlimit-name b[0-9a-f]{14} .*-m comment "
    r'--comment "binome share (?P<share>\d{1,10}) over \d{1,6}s" -j DROP'
)


def open_flows(share: int) -> int:
    """The flows a bridge's containers may hold open at once under their share of the table (the guard's connlimit)."""
    return (share - share // 4) // 2


def conntrack_caps(conn: Connection) -> dict[str, int] | None:
    """The shares of the table the firewall applies now, by bridge, read from iptables' own listing: a bridge has
    its share when both directions of its flows go to its chain and that chain holds both caps, sized from it. None
    when the guard's chain or one of its jumps (the mangle table's PREROUTING, POSTROUTING) is missing."""
    answer = conn.run(["iptables", "-w", "10", "-t", "mangle", "-S"], check=False)
    listed = [line.strip() for line in answer.stdout.splitlines()[:20000]]
    jumps = {line.split()[1] for line in listed if line.startswith("-A ") and line.endswith(f" -j {CONNTRACK_CHAIN}")}
    if not answer.ok or not {"PREROUTING", "POSTROUTING"} <= jumps:
        return None
    directions: dict[str, set[str]] = {}
    opened: dict[str, int] = {}
    rated: dict[str, int] = {}
    for line in listed:
        if match := _DISPATCH.fullmatch(line):
            directions.setdefault(match["bridge"], set()).add(match["direction"])
        elif (match := _OPEN_RULE.fullmatch(line)) and int(match["open"]) == open_flows(int(match["share"])):
            opened[match["bridge"]] = int(match["share"])
        elif (match := _NEW_RULE.fullmatch(line)) and int(match["burst"]) == int(match["share"]) // 4 // 2:
            rated[match["bridge"]] = int(match["share"])
    return {
        bridge: share
        for bridge, share in opened.items()
        if rated.get(bridge) == share and directions.get(bridge) == {"i", "o"}
    }


# One round trip over the host's containers of the portal: for each init pid, the pty instance's cap as the kernel
# mounted it (its /dev/pts line in the process's mountinfo); then every customer account's subordinate ranges.
_PTYS_AND_RANGES = (
    'for pid; do max=$(grep -m 1 " /dev/pts " "/proc/$pid/mountinfo" 2>/dev/null | grep -o "max=[0-9]*"); '
    'echo "$pid ${max:-none}"; done; echo "--ranges"; grep -H "^bn-" /etc/subuid /etc/subgid 2>/dev/null'
)
_INSPECT = (
    "{{.Name}}|{{.State.Pid}}|{{.HostConfig.PidsLimit}}|{{.HostConfig.NanoCpus}}|{{.HostConfig.Memory}}|"
    "{{.HostConfig.BlkioWeight}}|{{range .HostConfig.BlkioDeviceReadBps}}{{.Rate}}{{end}}|"
    "{{range .HostConfig.IDMappings.UIDMap}}{{.}} {{end}}|{{.HostConfig.RestartPolicy.Name}}"
)
MAX_CONTAINERS = 200


def _number(text: str) -> int:
    return int(text) if text.isdigit() and len(text) <= 20 else 0


def ranges_overlap(lines: list[str]) -> list[str]:
    """Accounts whose subordinate ranges overlap in /etc/subuid or /etc/subgid ("file:name:start:count" lines)."""
    problems, seen = [], {}
    for line in lines:
        path, _, rest = line.partition(":")
        name, _, span = rest.partition(":")
        start_text, _, count_text = span.partition(":")
        if not (start_text.isdigit() and count_text.isdigit()):
            continue
        start, count = int(start_text), int(count_text)
        for other, other_start, other_count in seen.get(path, []):
            if other != name and start < other_start + other_count and other_start < start + count:
                problems.append(f"{path}: accounts {other} and {name} share host ids {max(start, other_start)}+")
        seen.setdefault(path, []).append((name, start, count))
    return problems


def shares_report(conn: Connection, runtime, volume_root: str) -> tuple[list[str], list[str]]:
    """The host check's read back: the host's size, each of the portal's containers' shares as the runtime and the
    kernel hold them (CPUs, memory, processes, terminals, disk I/O, tracked connections by bridge, user namespace,
    restart policy), and whether the customer accounts' ranges of ids are disjoint. Returns (lines, problems): a
    problem (two tenants sharing ids) makes the host not isolated; a container missing a share is a WARNING."""
    size = host_size(conn, volume_root)
    lines = [
        f"host's shared tables: {size.conntrack_max or 'no'} tracked connections, {size.pty_max} terminals "
        f"({size.ptys_shared} for containers), {size.pid_max or 'unknown'} pids (threads-max "
        f"{size.threads_max or 'unknown'}), cgroup {size.cgroup}; disk {size.io_device or 'unknown'}: "
        + ("blkio weights honoured" if size.io_weight else "blkio weights not honoured (no BFQ scheduler, no "
           "io.cost): a per-lot disk bandwidth shares it")
    ]  # fmt: skip
    listed = conn.run(
        runtime.command("ps", "--all", "--filter", "label=binome.spec", "--format", "{{.Names}}"), check=False
    )
    names = [name for name in listed.stdout.split()[:MAX_CONTAINERS] if re.fullmatch(r"binome-[a-z0-9-]{1,60}", name)]
    caps = conntrack_caps(conn)
    if caps is None:
        lines.append(f"WARNING tracked connections: no cap (the firewall guard's {CONNTRACK_CHAIN} is missing)")
        caps = {}
    bridges = {}
    if runtime.is_podman and names:
        networks = conn.run(runtime.command("network", "inspect", "--format", "{{.Name}} {{.NetworkInterface}}", *[
            name for name in names if not name.endswith("-files")]), check=False)  # fmt: skip
        bridges = dict(line.split(None, 1) for line in networks.stdout.splitlines() if len(line.split()) == 2)
    inspected = conn.run(runtime.command("inspect", "--format", _INSPECT, *names), check=False) if names else None
    rows = [line.split("|") for line in (inspected.stdout.splitlines() if inspected else [])[:MAX_CONTAINERS]]
    rows = [row for row in rows if len(row) == 9]
    pids = [row[1] for row in rows if row[1].isdigit() and row[1] != "0"]
    answer = conn.run(["sh", "-c", _PTYS_AND_RANGES, "read_back", *pids], check=False).stdout.split("--ranges")
    ptys = dict(line.split(None, 1) for line in answer[0].splitlines() if len(line.split()) == 2)
    problems = ranges_overlap(answer[1].split() if len(answer) > 1 else [])
    held_pids = sum(_number(row[2]) or size.pids_shared for row in rows if not row[0].endswith("-files"))
    if size.pids_shared and held_pids > size.pids_shared * HOST_RESERVE:
        lines.append(
            f"WARNING processes: the containers may hold {held_pids} of the host's {size.pids_shared} pids, more than "
            f"its {HOST_RESERVE:.0%} for the lots (made before this share: provision them again)"
        )
    for name, pid, pids_limit, nano_cpus, memory, weight, bps, uid_map, restart in rows:
        name = name.lstrip("/")
        bridge = bridges.get(name, "")
        pty_cap = ptys.get(pid, "none").removeprefix("max=") if pid != "0" else "stopped"
        io = (
            f"{_number(bps) // 2**20} MB/s" if _number(bps) else f"weight {weight}" if _number(weight) else "not shared"
        )
        said = (
            f"{name}: {_number(nano_cpus) / 1e9:g} CPUs, {_number(memory) // 2**20} MiB, {pids_limit} processes, "
            f"terminals {pty_cap}, tracked connections {caps.get(bridge, 'uncapped')} ({bridge or 'no bridge'}), "
            f"disk I/O {io}, user namespace {uid_map.strip() or 'none'}, restart policy {restart or 'none'}"
        )
        lines.append(said)
        if name.endswith("-files"):
            continue  # the download window: sftp only, nothing of the customer's runs there
        missing = [
            what
            for what, absent in (
                ("no user namespace", not uid_map.strip() and runtime.is_podman),
                ("no cap of terminals", pty_cap == "none" and runtime.is_podman),
                ("no cap of tracked connections", bridge not in caps and size.conntrack_max and runtime.is_podman),
                ("the runtime restarts it at once, forever", restart in ("always", "unless-stopped")),
            )
            if absent
        ]
        if missing:
            lines.append(f"WARNING {name}: {', '.join(missing)} (made before these shares: provision it again)")
        if io == "not shared":  # one tenant may take the disk's whole bandwidth from the others and the host
            lines.append(
                f"WARNING {name}: disk I/O not shared (the kernel honours no weight on "
                f"{size.io_device or 'the volumes disk'} and no disk bandwidth per lot is set: set one on the host)"
            )
    return lines, problems
