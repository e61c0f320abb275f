""" "Check host": whether a host keeps its customers apart, found by probing it through its driver.

A host offers its lots only in the container mode (docs/operations.md): its container runtime setting names a
runtime that answers `info`, and its login stack keeps customers out (`login_stack`): each customer account has no
login shell and a root-owned home, the host's sshd denies the customers' group, no user manager lingers for them.
Every order then runs in a container of its own, in a network namespace of its own, and the customer logs in to an
SSH server inside it. A host without a runtime is not isolated: customers are never given an account on the host.
The dry-run driver runs nothing: its hosts are labelled "dry run", never reported as isolated.

This module only runs commands and reads their answers (hostile input: parsed and bounded); recording what it
found is provisioning.hosts.host_check's job.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from inventory.models import Isolation
from provisioning import cards, escapes, ports, shares
from provisioning.containers import CUSTOMER_GROUP, GUARD_FORWARD, GUARD_IN, GUARD_TO, Runtime
from provisioning.drivers.base import Connection
from provisioning.step_context import VOLUME_ROOT

PROBE_TIMEOUT_S = 60
MAX_REPORT_LINES = 60
_CHARACTER_DEVICE = "character special file"
IMAGE_REFERENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
CUSTOMER_PREFIX = "bn-"
NO_LOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")


@dataclass(frozen=True)
class LotDevices:
    name: str
    vendor: str  # "nvidia" or "amd"
    gpu_indices: tuple[int, ...]
    active: bool = True


@dataclass(frozen=True)
class Finding:
    mode: str  # an Isolation value
    report: str  # one finding per line, for operators
    exclusive_lot: str = ""  # kept for the rows of the earlier design; no mode sets it now


@dataclass(frozen=True)
class LoginStack:
    """What the host's login stack would do with a customer account: `problems` make the host not isolated."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# One round trip: the accounts, the homes of the customer accounts (owner, mode), lingering user managers, the
# PAM configurations that read a user's environment file, and the sshd's effective deny lists.
_LOGIN_STACK = (
    'getent passwd | grep "^$1" | cut -d: -f1,6,7; echo "--homes"; '
    'getent passwd | grep "^$1" | cut -d: -f6 | while read -r home; do '
    'stat -c "%U %a %n" -- "$home" 2>/dev/null || echo "missing - $home"; done; echo "--linger"; '
    'for f in /var/lib/systemd/linger/"$1"*; do [ -e "$f" ] && printf "%s\\n" "${f##*/}"; done; echo "--pam"; '
    r'grep -lE "^[^#]*pam_env\.so.*user_readenv=1" /etc/pam.d/* 2>/dev/null; echo "--sshd"; '
    "sshd -T 2>/dev/null | grep -iE '^(denygroups|denyusers|allowgroups|allowusers) '; echo '--end'"
)


def login_stack(connection: Connection) -> LoginStack:
    """Whether nothing of a customer's can be read or run by the host's login stack. By construction (host_steps.py) a
    customer account has no login shell and a root-owned home with nothing of theirs in it, and the customer never
    has a process on the host: this checks that it holds on the host as it is, including accounts left by an
    earlier design."""
    answer = connection.run(["sh", "-c", _LOGIN_STACK, "login_stack", CUSTOMER_PREFIX], check=False)
    sections: dict[str, list[str]] = {"accounts": []}
    current = "accounts"
    for line in answer.stdout.splitlines()[:5000]:
        if line.startswith("--"):
            current = line[2:].strip()
            sections[current] = []
        else:
            sections.setdefault(current, []).append(line.strip()[:300])
    problems, notes = [], []
    for entry in sections.get("accounts", []):
        name, _, rest = entry.partition(":")
        _home, _, shell = rest.partition(":")
        if shell not in NO_LOGIN_SHELLS:
            problems.append(f"customer account {name} has a login shell ({shell or 'none'})")
    for entry in sections.get("homes", []):
        owner, _, rest = entry.partition(" ")
        mode_text, _, path = rest.partition(" ")
        try:
            mode = int(mode_text, 8)
        except ValueError:
            mode = 0  # missing: nothing to read there
            owner = "root"
        if owner != "root" or mode & 0o022:
            problems.append(f"home {path} of a customer account is theirs to write ({owner}, {mode_text})")
    for name in sections.get("linger", []):
        if name:
            problems.append(f"a user manager lingers for {name} (/var/lib/systemd/linger/{name})")
    pam = [path for path in sections.get("pam", []) if path]
    if pam:
        notes.append(
            f"PAM reads users' ~/.pam_environment ({', '.join(pam[:5])}): customer homes are root-owned and empty, "
            "so there is none of theirs to read"
        )
    deny = " ".join(sections.get("sshd", [])).lower()
    if "sshd" not in sections:
        problems.append("the login stack could not be read (no answer)")
    elif CUSTOMER_GROUP not in deny and f"{CUSTOMER_PREFIX}*" not in deny:
        notes.append(
            f"the host's sshd does not deny the group {CUSTOMER_GROUP} (DenyGroups {CUSTOMER_GROUP}, "
            "docs/operations.md): customer accounts still have no key, shell or home of theirs to log in with"
        )
    else:
        notes.append(f"the host's sshd denies the customers ({deny[:200]})")
    return LoginStack(problems=problems, notes=notes)


# Run inside the image, with no network, as nobody: what an image must have to be handed to a customer, then its
# accounts (the container's /etc/passwd and /etc/group are these plus the customer's, from the kit). Besides its
# SSH server and the pre-flight's Python, what VS Code Remote-SSH's server checks on connect (its
# check-requirements script): bash, tar, curl or wget to fetch itself, glibc 2.28 and libstdc++ with GLIBCXX_3.4.25.
_IMAGE_NEEDS = (
    'missing=; [ -x /usr/sbin/sshd ] || missing="$missing sshd(/usr/sbin/sshd)"; '
    'command -v python3 >/dev/null 2>&1 || missing="$missing python3"; '
    'for tool in bash tar; do command -v $tool >/dev/null 2>&1 || missing="$missing $tool"; done; '
    '{ command -v curl || command -v wget; } >/dev/null 2>&1 || missing="$missing curl-or-wget"; '
    "g=$(getconf GNU_LIBC_VERSION 2>/dev/null); g=${g#glibc }; major=${g%%.*}; minor=${g#*.}; minor=${minor%%.*}; "
    '{ [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 28 ]; }; } 2>/dev/null '
    '|| missing="$missing glibc>=2.28"; '
    "found=; for lib in /usr/lib/*/libstdc++.so.6 /usr/lib64/libstdc++.so.6 /usr/lib/libstdc++.so.6 "
    '/lib/*/libstdc++.so.6; do [ -r "$lib" ] && grep -q GLIBCXX_3.4.25 "$lib" && found=1 && break; done; '
    '[ -n "$found" ] || missing="$missing libstdc++(GLIBCXX_3.4.25)"; echo "missing:$missing"; '
    "echo '--passwd'; head -c 65536 /etc/passwd; echo; echo '--group'; head -c 65536 /etc/group; echo"
)
# What VS Code's server needs, of the above: said as such when one is missing.
_VSCODE_NEEDS = frozenset({"bash", "tar", "curl-or-wget", "glibc>=2.28", "libstdc++(GLIBCXX_3.4.25)"})
_ACCOUNT_LINE = {"passwd": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?:[^:]*:\d{1,10}:\d{1,10}:[^:]*:[^:]*:[^:]*"),
                 "group": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}:[^:]*:\d{1,10}:[A-Za-z0-9_.,-]*")}  # fmt: skip
MAX_ACCOUNTS = 2000


@dataclass(frozen=True)
class ImageFacts:
    problem: str  # why it cannot be handed to a customer ("" if it can)
    passwd: list[str] = field(default_factory=list)  # its accounts' lines, each checked for form
    group: list[str] = field(default_factory=list)


def image_facts(connection: Connection, command: Callable[..., list[str]], image: str) -> ImageFacts:
    """Whether an image can be handed to a customer (customers log in to its own SSH server, sftp being sshd's
    internal one; the pre-flight check runs with its own Python), and its accounts. What it prints is the image's
    word: only lines of the form of passwd and group entries are kept."""
    argv = command(
        "run", "--rm", "--network", "none", "--user", "65534:65534", "--cap-drop", "all",
        "--security-opt", "no-new-privileges", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096",
        "--entrypoint", "/bin/sh", image, "-c", _IMAGE_NEEDS,
    )  # fmt: skip
    result = connection.run(argv, check=False, timeout=PROBE_TIMEOUT_S)
    sections: dict[str, list[str]] = {"needs": []}
    current = "needs"
    for line in result.stdout.splitlines()[: MAX_ACCOUNTS * 2 + 10]:
        if line in ("--passwd", "--group"):
            current = line[2:]
            sections[current] = []
        elif current == "needs" or _ACCOUNT_LINE[current].fullmatch(line):
            sections[current].append(line)
    lines = [line for line in sections["needs"] if line.startswith("missing:")]
    if not lines:
        return ImageFacts(f"it does not run a shell ({_first_line(result.stderr) or f'exit {result.exit_status}'})")
    missing = lines[-1].removeprefix("missing:").split()
    problem = f"it has no {', '.join(missing)}" if missing else ""
    if _VSCODE_NEEDS & set(missing):
        problem += (
            " (VS Code Remote-SSH's server needs bash, tar, curl or wget, glibc 2.28 or newer and libstdc++ with "
            "GLIBCXX_3.4.25: add them to the image)"
        )
    return ImageFacts(
        problem,
        sections.get("passwd", [])[:MAX_ACCOUNTS],
        sections.get("group", [])[:MAX_ACCOUNTS],
    )


def image_problem(connection: Connection, command: Callable[..., list[str]], image: str) -> str:
    """Why an image cannot be handed to a customer ("" if it can)."""
    return image_facts(connection, command, image).problem


def device_paths(lot: LotDevices, device_dir: str = "/dev") -> list[str]:
    """The device nodes that give access to the lot's cards (the shared control nodes, /dev/nvidiactl or
    /dev/kfd, open no card by themselves)."""
    if lot.vendor == "amd":
        return [posixpath.join(device_dir, "dri", f"renderD{128 + index}") for index in lot.gpu_indices]
    return [posixpath.join(device_dir, f"nvidia{index}") for index in lot.gpu_indices]


def probe(
    connection: Connection,
    *,
    lots: list[LotDevices],
    runtime: str = "",
    device_dir: str = "/dev",
    images: list[str] = (),
    customer_ports: set[int] = frozenset(),
) -> Finding:
    """Find the host's isolation mode. `runtime`: the host's container runtime setting (unset: podman and docker
    are looked for, only to tell the operator to set one); `device_dir`: where the GPU device nodes are (tests
    point it at mknod stand-ins); `images`: the catalog's images for the host's lots, each checked for what a
    customer's container needs when the host has it (an image that cannot serve SSH is named with the reason);
    `customer_ports`: the ports its customers' SSH servers are published on (said whether the kernel keeps them
    from its outgoing connections; not part of the isolation mode)."""
    if connection.is_dry_run:
        return Finding(
            Isolation.DRY_RUN,
            "dry-run driver: nothing runs on this host, so nothing was probed; its lots are offered for the demo only",
        )
    lines = []
    runtime_found = _answering_runtime(connection, runtime, lines)
    stack = login_stack(connection)
    lines += [f"login stack: {problem}" for problem in stack.problems] + [
        f"login stack: {note}" for note in stack.notes
    ]
    _devices_protected(connection, lots, device_dir, lines)
    if runtime_found:
        lines += cards.report_lines(connection, Runtime(runtime_found), [lot.vendor for lot in lots] or ["nvidia"])
        lines += _image_lines(connection, Runtime(runtime_found), images)
    guard = _guard_in_place(connection, runtime_found) if runtime_found else False
    lines.append(f"firewall guard around the customers' networks: {'in place' if guard else 'missing'}")
    if customer_ports:
        lines.append(_ports_line(connection, customer_ports))
        if runtime_found and Runtime(runtime_found).is_podman:
            lines += _stale_forward_lines(connection, Runtime(runtime_found), customer_ports)
    shared_ids = []
    if runtime_found:  # each container's shares read back, the ids of its user namespace, the runtime's escapes
        share_lines, shared_ids = shares.shares_report(connection, Runtime(runtime_found), VOLUME_ROOT)
        lines += (
            share_lines + [f"user namespaces: {problem}" for problem in shared_ids] + escapes.escape_lines(connection)
        )
    if runtime_found and stack.ok and shared_ids:
        lines.insert(0, "mode: not isolated (two customer accounts share host ids: their containers' roots are one)")
        return Finding(Isolation.NOT_ISOLATED, _report(lines))
    if runtime_found and stack.ok and not guard:
        lines.insert(0, "mode: not isolated (the firewall guard around the customers' networks is missing)")
        lines.append("provision an order on the host (its first step rebuilds the guard), then check the host again")
        return Finding(Isolation.NOT_ISOLATED, _report(lines))
    if runtime_found and stack.ok:
        lines.insert(0, f"mode: container ({runtime_found} answers; one container and network per order)")
        return Finding(Isolation.CONTAINER, _report(lines))
    reason = "the login stack could reach a customer" if runtime_found else "no container runtime answers"
    lines.insert(0, f"mode: not isolated ({reason})")
    lines.append(
        "to offer its lots: set the host's container runtime to podman (or docker) where it answers, and fix what the "
        "login stack lines say; then check the host again"
    )
    return Finding(Isolation.NOT_ISOLATED, _report(lines))


def _image_lines(connection: Connection, runtime: Runtime, images: list[str]) -> list[str]:
    lines = []
    for reference in list(dict.fromkeys(images))[:20]:
        if not IMAGE_REFERENCE.fullmatch(reference):
            lines.append(f"image {reference[:80]!r}: not an image reference")
            continue
        found = connection.run(runtime.command("image", "inspect", "--format", "{{.Id}}", reference), check=False)
        if not found.ok:
            lines.append(f"image {reference}: not on this host yet (pulled and checked at its first order)")
            continue
        problem = image_problem(connection, runtime.command, found.stdout.strip())
        lines.append(
            f"image {reference}: cannot be handed to a customer: {problem}"
            if problem
            else f"image {reference}: serves SSH and the pre-flight check"
        )
    return lines


# The guard's three jumps (mangle table), the last rule of BINOME-IN and BINOME-TO, the first of BINOME-FWD (the
# drop between bridges) and how many ranges it drops, and IPv6's drops: a chain emptied or cut is no guard.
_GUARD_CHECK = (
    f'iptables -w 10 -t mangle -C INPUT -i "$1" -j {GUARD_IN} '
    f'&& iptables -w 10 -t mangle -C FORWARD -i "$1" -j {GUARD_FORWARD} '
    f'&& iptables -w 10 -t mangle -C FORWARD -o "$1" -j {GUARD_TO} '
    f"&& iptables -w 10 -t mangle -S {GUARD_IN} | tail -n 1 "
    f"&& iptables -w 10 -t mangle -S {GUARD_TO} | tail -n 1 "
    f"&& iptables -w 10 -t mangle -S {GUARD_FORWARD} | sed -n 2p "
    f"&& iptables -w 10 -t mangle -S {GUARD_FORWARD} | grep -c -- ' -d .* -j DROP$' "
    '&& { ! command -v ip6tables >/dev/null || { ip6tables -w 10 -t mangle -C INPUT -i "$1" -j DROP '
    '&& ip6tables -w 10 -t mangle -C FORWARD -i "$1" -j DROP '
    '&& ip6tables -w 10 -t mangle -C FORWARD -o "$1" -j DROP; }; }'
)
GUARDED_RANGES = 6  # nodekit/binome-guard's private, carrier-grade NAT, link-local and metadata ranges


def _guard_in_place(connection: Connection, runtime: str) -> bool:
    """Whether the host's firewall sends the customers' bridges through the portal's guard chains, whole."""
    runtime = Runtime(runtime)
    if runtime.is_podman:  # the guard matches netavark's bridges (podman0...): CNI names them cni-podman0...
        backend = connection.run(runtime.command("info", "--format", "{{.Host.NetworkBackend}}"), check=False)
        if backend.stdout.strip() not in ("netavark", ""):
            return False
    argv = ["sh", "-c", _GUARD_CHECK, "guard", runtime.bridges]
    answer = connection.run(argv, check=False, timeout=PROBE_TIMEOUT_S)
    return answer.ok and answer.stdout.split("\n")[:4] == [
        f"-A {GUARD_IN} -j DROP",
        f"-A {GUARD_TO} -j DROP",
        f"-A {GUARD_FORWARD} -o {runtime.bridges} -j DROP",
        str(GUARDED_RANGES),
    ]


def _answering_runtime(connection: Connection, runtime: str, lines: list[str]) -> str:
    """The host's runtime when its `info` succeeds ("" if none): a docker client without its daemon does not count.
    With no runtime set, podman and docker are looked for only to tell the operator to set one."""
    for candidate in [runtime] if runtime else ["podman", "docker"]:
        result = connection.run([candidate, "info"], check=False, timeout=PROBE_TIMEOUT_S)
        if result.ok and runtime:
            lines.append(f"{candidate} info: ok")
            return candidate
        if result.ok:
            lines.append(
                f"{candidate} answers, but the host's container runtime is not set: set it to {candidate} to run "
                "each order in a container (customers are never given an account on the host)"
            )
            return ""
        detail = _first_line(result.stderr) or f"exit status {result.exit_status}"
        lines.append(f"{candidate} info: no answer ({detail})")
    return ""


def _devices_protected(connection: Connection, lots: list[LotDevices], device_dir: str, lines: list[str]) -> bool:
    """Whether every lot's device nodes exist as character devices with no access for others."""
    paths = [path for lot in lots for path in device_paths(lot, device_dir)]
    if not paths:
        lines.append("GPU device nodes: none to check (no lot on this host)")
        return False
    # stat prints what exists and fails for the rest; the name is last, so a "|" in it cannot shift the fields.
    result = connection.run(["stat", "-c", "%F|%a|%U|%G|%n", "--", *paths], check=False, timeout=PROBE_TIMEOUT_S)
    seen = {}
    for line in result.stdout.splitlines()[: len(paths)]:
        fields = line.split("|", 4)
        if len(fields) == 5:
            seen[fields[4]] = fields
    protected = True
    for path in paths:
        fields = seen.get(path)
        if fields is None:
            lines.append(f"{path}: missing")
            protected = False
            continue
        kind, mode_text, owner, group, _name = fields
        try:
            mode = int(mode_text, 8)
        except ValueError:
            mode = 0o7777  # unreadable answer: treat as open
        if kind != _CHARACTER_DEVICE:
            lines.append(f"{path}: not a character device ({kind[:40]})")
            protected = False
        elif mode & 0o007:
            lines.append(f"{path}: world-accessible (mode {mode:04o}, {owner[:32]}:{group[:32]})")
            protected = False
        else:
            lines.append(f"{path}: not world-accessible (mode {mode:04o}, {owner[:32]}:{group[:32]})")
    return protected


def _ports_line(connection: Connection, customer_ports: set[int]) -> str:
    state = ports.port_state(connection, customer_ports)
    if not state.exposed:
        return "customer ports: outside the ephemeral ports"
    if state.unreserved:
        return (
            f"customer ports: {ports.port_ranges(state.unreserved)} in the ephemeral ports and not reserved: an "
            "outgoing connection may hold one when a container starts (the next provisioning reserves them)"
        )
    if state.lost_at_boot:
        return (
            f"customer ports: {ports.port_ranges(state.exposed)} reserved from the ephemeral ports until the next "
            f"reboot: {ports.PERSISTED_RESERVATION} does not reserve {ports.port_ranges(state.lost_at_boot)} (the next "
            "provisioning writes it; a sysctl file of yours that sorts after it and sets the same key must list them)"
        )
    return (
        f"customer ports: {ports.port_ranges(state.exposed)} reserved from the ephemeral ports, at boot too "
        f"({ports.PERSISTED_RESERVATION})"
    )


def _stale_forward_lines(connection: Connection, runtime: Runtime, customer_ports: set[int]) -> list[str]:
    """netavark's forwards of a customer port whose container podman no longer has: the first rule wins, so one
    would send that port's SSH elsewhere; provisioning drops it before it publishes the port again."""
    forwards = ports.stale_forwards(connection, runtime)
    if forwards is None and connection.run(["nft", "list", "table", "inet", "netavark"], check=False).ok:
        return [
            "customer ports: netavark forwards them with nftables here, which this check does not read: a forward "
            "left by a removed container is neither looked for nor dropped (podman's iptables driver is)"
        ]
    stale = sorted({forward.port for forward in forwards or []} & customer_ports)
    if not stale:
        return []
    return [
        f"customer ports: {ports.port_ranges(set(stale))} still forwarded for a container podman no longer has "
        "(a command interrupted mid-removal): the next provisioning on that port drops the forward"
    ]


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:200]
    return ""


def _report(lines: list[str]) -> str:
    if len(lines) > MAX_REPORT_LINES:
        lines = [*lines[: MAX_REPORT_LINES - 1], f"… {len(lines) - MAX_REPORT_LINES + 1} more lines"]
    return "\n".join(lines)
