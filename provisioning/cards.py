"""Which containers of a host hold which GPUs, as the container runtime says: the one source of truth for "a card
belongs to one window at a time". Bookings say which lot an order should have; they never say which cards are free
on the host (a move that failed, a teardown that failed, a host registered twice, an operator's own container).

A card is identified by its device number, not a name: NVIDIA's /dev/nvidia<N> is character device 195:N, AMD's
render node /dev/dri/renderD<128+N> is 226:(128+N). For podman, what a container may open is its OCI configuration
(the cgroup's device rules, and the device nodes made inside), which podman writes in root's storage when the
container first starts; a container never started has none and is read from its inspect data. For docker, the
inspect data (device paths, cgroup rules, GPU requests, privileged). A rule that opens every device of a kind (a
privileged container, `c 195:* rwm`, `--gpus all`, a GPU named by UUID) counts as holding every card.

This module only reads, as hostile input (parsed and bounded, never a crash): a configuration or a rule it cannot
read counts as opening every card, so a holder is never missed. container_steps refuses a start, host_probe
reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from provisioning.containers import Runtime
from provisioning.drivers.base import Connection

# The device numbers of a vendor's cards: (major, first minor, last minor, card index of the first minor).
CARD_DEVICES = {"nvidia": (195, 0, 253, 0), "amd": (226, 128, 255, 0)}  # 195:254/255 are modeset/ctl: no card
CARD_NAMES = {"nvidia": re.compile(r"nvidia(\d{1,3})"), "amd": re.compile(r"renderD(\d{1,3})")}
MAX_CONTAINERS = 500
MAX_CONFIG_BYTES = 1024 * 1024
MAX_REPORTED = 40
_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_CONFIG_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,400}/config\.json")
_MARK = "--binome-config "
# One round trip: the runtime's containers ($2... is `<runtime> container`), one line each in the template $1, then
# each OCI configuration file they name (root's storage: no customer path), bounded, after a marker line.
_LIST_CONTAINERS = (
    "# shellcheck disable=SC2086 # the container ids split into words on purpose\n"
    'template=$1; shift; ids=$("$@" ls --all --quiet --no-trunc) || exit 1; [ -n "$ids" ] || exit 0; '
    f'ids=$(printf "%s\\n" "$ids" | head -n {MAX_CONTAINERS}); '
    'rows=$("$@" inspect --format "$template" $ids 2>/dev/null); printf "%s\\n" "$rows"; '
    'printf "%s\\n" "$rows" | cut -d "|" -f 5 | while IFS= read -r f; do case "$f" in /*/config.json) '
    f'printf "\\n{_MARK}%s\\n" "$f"; head -c {MAX_CONFIG_BYTES} -- "$f" 2>/dev/null;; esac; done'
)


@dataclass(frozen=True)
class CardHolder:
    """A container of the host and the cards of one vendor it may open."""

    name: str
    state: str  # the runtime's word: running, paused, exited, created...
    created_ns: int  # when the runtime made it (nanoseconds): of two containers started at once, the first keeps
    cards: frozenset[int] = field(default_factory=frozenset)
    every_card: bool = False  # privileged, a wildcard device rule, every GPU requested

    def holds(self, card: int) -> bool:
        return self.every_card or card in self.cards

    def describe(self) -> str:
        held = "every GPU" if self.every_card else "GPU " + ", ".join(map(str, sorted(self.cards)))
        held = held if self.every_card or self.cards else "no GPU"
        return f"{self.name} ({self.state}): {held}"


def card_holders(connection: Connection, runtime: Runtime, vendor: str) -> list[CardHolder]:
    """Every container of the host (running, paused, stopped or only created: a stopped one starts again with its
    cards, at the next boot if nothing else) and the vendor's cards it may open (none for most), as the runtime
    says."""
    if runtime.is_podman:
        template = (
            "{{.Id}}|{{.Name}}|{{.State.Status}}|{{.Created.UnixNano}}|{{.OCIConfigPath}}|{{json .HostConfig.Devices}}"
        )
    else:
        template = "{{.Id}}|{{.Name}}|{{.State.Status}}|{{.Created}}||{{json .HostConfig}}"
    argv = ["sh", "-c", _LIST_CONTAINERS, "card_holders", template, *runtime.command("container")]
    answer = connection.run(argv, timeout=60)
    listing, *chunks = answer.stdout.split(f"\n{_MARK}")
    rows = [line.split("|", 5) for line in listing.splitlines()[:MAX_CONTAINERS]]
    rows = [row for row in rows if len(row) == 6 and _CONTAINER_ID.fullmatch(row[0])]
    configs = {}
    for chunk in chunks:
        path, _, content = chunk.partition("\n")
        if _CONFIG_PATH.fullmatch(path.strip()):
            configs[path.strip()] = content
    holders = []
    for _id, name, state, created, config_path, host_config in rows:
        cards, every = set(), False
        if runtime.is_podman and config_path in configs:
            every = _from_oci_config(configs[config_path], vendor, cards)
        if runtime.is_podman:  # a container never started: the devices it was made with (real /dev nodes)
            every |= _from_device_paths(_json(host_config), vendor, cards)
        else:
            every = _from_docker_host_config(_json(host_config), vendor, cards)
        holders.append(
            CardHolder(
                name=name.lstrip("/")[:128],
                state=re.sub(r"[^a-z]", "", state.lower())[:20] or "unknown",
                created_ns=_created_ns(created),
                cards=frozenset(cards),
                every_card=every,
            )
        )
    return sorted(holders, key=lambda holder: (holder.created_ns, holder.name))


def conflicts(holders: Iterable[CardHolder], *, cards: Iterable[int], own: str) -> list[tuple[CardHolder, list[int]]]:
    """The containers other than `own` that hold one of `cards`, with the cards they hold of them."""
    wanted = sorted(set(cards))
    found = []
    for holder in holders:
        if holder.name == own:
            continue
        overlap = [card for card in wanted if holder.holds(card)]
        if overlap:
            found.append((holder, overlap))
    return found


def held_twice(holders: list[CardHolder]) -> dict[str, list[CardHolder]]:
    """Each card held by more than one container ("2", or "every GPU" for a container that holds them all), with
    its holders: two tenants on one card."""
    holders = [holder for holder in holders if holder.cards or holder.every_card]
    every = [holder for holder in holders if holder.every_card]
    cards = sorted({card for holder in holders for card in holder.cards})
    twice = {}
    for card in cards:
        holding = [holder for holder in holders if holder.holds(card)]
        if len(holding) > 1:
            twice[str(card)] = holding
    if every and len(holders) > 1:
        twice.setdefault("every GPU", holders)
    return twice


def report_lines(connection: Connection, runtime: Runtime, vendors: Iterable[str]) -> list[str]:
    """The host check's lines: every container and the cards it holds, and a warning for each card held twice."""
    lines = []
    for vendor in sorted(set(vendors)):
        holders = card_holders(connection, runtime, vendor)
        label = "" if len(set(vendors)) == 1 else f" ({vendor})"
        holding = [holder for holder in holders if holder.cards or holder.every_card]
        lines.append(f"containers{label}: {len(holders)}, {len(holding)} holding GPUs")
        shown = holding + [holder for holder in holders if holder not in holding]  # those holding cards first
        lines += [f"container {holder.describe()}{label}" for holder in shown[:MAX_REPORTED]]
        if len(shown) > MAX_REPORTED:
            lines.append(f"… {len(shown) - MAX_REPORTED} more containers{label}")
        for card, sharing in held_twice(holding).items():
            names = ", ".join(f"{holder.name} ({holder.state})" for holder in sharing[:10])
            what = card if card == "every GPU" else f"GPU {card}"
            lines.append(
                f"WARNING: {what}{label} is held by {len(sharing)} containers, two tenants on one card: {names}"
            )
    return lines


def describe_conflicts(found: list[tuple[CardHolder, list[int]]]) -> str:
    return "; ".join(f"GPU {', '.join(map(str, cards))} held by {holder.describe()}" for holder, cards in found)


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_JSON_NESTING = re.compile(r"[\[\]{}]")
MAX_JSON_DEPTH = 64


def _json(text: str):
    """The JSON value of an answer, or None: too long, too deeply nested (the parser recurses in C, and a deep
    enough nesting ends the process, not the parse), or not JSON."""
    if len(text) > MAX_CONFIG_BYTES:
        return None
    depth = 0
    for bracket in _JSON_NESTING.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if bracket[0] in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _created_ns(text: str) -> int:
    """podman's UnixNano, or docker's RFC 3339 time (to the nanosecond); 0 when unreadable (then the oldest)."""
    if text.strip().isdigit():
        return int(text.strip()[:20])
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z", text.strip())
    if not match:
        return 0
    from datetime import UTC, datetime

    seconds = int(datetime.fromisoformat(match[1]).replace(tzinfo=UTC).timestamp())
    return seconds * 10**9 + int((match[2] or "0").ljust(9, "0"))


def _card_of(vendor: str, major, minor) -> int | None:
    first_major, low, high, base = CARD_DEVICES.get(vendor, (-1, 0, -1, 0))
    if major == first_major and isinstance(minor, int) and low <= minor <= high:
        return minor - low + base
    return None


def _wildcard(value) -> bool:
    """Whether a rule's major or minor matches every number: absent, -1, "*", or anything that is not a number (a
    rule we cannot read counts as opening everything: a holder is never missed)."""
    return not isinstance(value, int) or isinstance(value, bool) or value == -1


def _from_oci_config(text: str, vendor: str, cards: set[int]) -> bool:
    """The device nodes made in the container and the cgroup's device rules (runc: the last rule that matches a
    device decides); True when every card of the vendor is allowed."""
    config = _json(text)
    linux = config.get("linux") if isinstance(config, dict) else None
    if not isinstance(linux, dict):
        return True  # a configuration podman wrote that cannot be read: it may open any card
    for device in linux.get("devices") or []:
        if isinstance(device, dict) and device.get("type") in ("c", "u"):
            card = _card_of(vendor, device.get("major"), device.get("minor"))
            if card is not None:
                cards.add(card)
    resources = linux.get("resources") if isinstance(linux.get("resources"), dict) else {}
    rules = [rule for rule in resources.get("devices") or [] if isinstance(rule, dict)][:1000]
    major = CARD_DEVICES.get(vendor, (-1,))[0]
    mentioned = {rule.get("minor") for rule in rules if isinstance(rule.get("minor"), int)}

    def allowed(minor: int | None) -> bool:
        """The last rule matching the device decides; an allow that opens neither reading nor writing (only
        mknod) opens nothing, a deny counts only when it takes both away (so a holder is never missed)."""
        verdict = False
        for rule in rules:
            if rule.get("type", "a") not in ("a", "c"):
                continue
            if not (_wildcard(rule.get("major")) or rule.get("major") == major):
                continue
            if not (_wildcard(rule.get("minor")) or (minor is not None and rule.get("minor") == minor)):
                continue
            access = str(rule.get("access") or "rwm")
            if rule.get("allow") is True and ("r" in access or "w" in access):
                verdict = True
            elif rule.get("allow") is not True and "r" in access and "w" in access:
                verdict = False
        return verdict

    for minor in mentioned:
        card = _card_of(vendor, major, minor)
        if card is not None and allowed(minor):
            cards.add(card)
    return allowed(None)


def _from_device_paths(devices, vendor: str, cards: set[int]) -> bool:
    """podman's or docker's HostConfig.Devices: [{"PathOnHost": "/dev/nvidia2", ...}]."""
    for device in devices if isinstance(devices, list) else []:
        path = device.get("PathOnHost") if isinstance(device, dict) else None
        if isinstance(path, str):
            _card_from_name(path.rsplit("/", 1)[-1], vendor, cards)
    return False


def _card_from_name(name: str, vendor: str, cards: set[int]) -> None:
    match = CARD_NAMES[vendor].fullmatch(name) if vendor in CARD_NAMES else None
    if match:
        number = int(match[1])
        card = number - 128 if vendor == "amd" else number
        if 0 <= card <= CARD_DEVICES[vendor][2] - CARD_DEVICES[vendor][1]:
            cards.add(card)


def _from_docker_host_config(host_config, vendor: str, cards: set[int]) -> bool:
    """docker's HostConfig: privileged, device paths, cgroup rules ("c 195:* rwm"), GPU requests (--gpus)."""
    if not isinstance(host_config, dict):
        return False
    if host_config.get("Privileged") is True:
        return True
    _from_device_paths(host_config.get("Devices"), vendor, cards)
    every = False
    major = CARD_DEVICES.get(vendor, (-1,))[0]
    for rule in host_config.get("DeviceCgroupRules") or []:
        match = re.fullmatch(r"([acb]) (\*|\d+):(\*|\d+) [rwm]+", rule.strip()) if isinstance(rule, str) else None
        if not match or match[1] == "b" or (match[2] != "*" and int(match[2]) != major):
            continue
        if match[1] == "a" or match[3] == "*":
            every = True
        else:
            card = _card_of(vendor, major, int(match[3]))
            if card is not None:
                cards.add(card)
    for request in host_config.get("DeviceRequests") or []:
        if not isinstance(request, dict):
            continue
        capabilities = json.dumps(request.get("Capabilities") or [])
        if request.get("Driver") not in ("nvidia", "") and "gpu" not in capabilities:
            continue
        ids = request.get("DeviceIDs") or []
        if request.get("Count") == -1 or any(not str(device).isdigit() for device in ids):
            every = True  # every GPU, or GPUs named by UUID (which index they are is the driver's to say)
        cards.update(int(device) for device in ids if str(device).isdigit() and int(device) < 254)
    return every
