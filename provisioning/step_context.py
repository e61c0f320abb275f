"""What every step of provisioning gets and gives: the order's context on one host (`StepContext`), what a step
found (`StepOutput`), its failure (`StepFailed`), root's directories on the host, and the probes the steps share.
"""

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime

from inventory.rules import RUNTIME_PATTERN
from provisioning import containers, ports
from provisioning.drivers.base import Connection

KIT_ROOT = "/var/lib/binome"  # root-owned, 755: one kit directory per account, which is also the account's home
VOLUME_ROOT = "/var/lib/binome-volumes"  # root-owned, 700: the file systems of the customers' data volumes
ACCOUNT_NAME = r"bn-[a-z0-9]{1,28}"  # provisioning.rules.username_for
IDS_LOCK = f"{KIT_ROOT}/.subordinate-ids.lock"  # held while an account's range of subordinate ids changes


@dataclass(frozen=True)
class StepContext:
    username: str
    comment: str
    authorized_keys: str
    gpu_indices: list[int]
    expect_arch: str
    expect_vendor: str
    image_ref: str
    container_runtime: str
    keys_expire_at: datetime  # the window's end plus the grace period: sshd refuses the keys after it
    ssh_port_base: int = 42000  # the host port of the container's sshd is this plus the lot's first GPU index
    host_port_span: int = 8  # how many such ports the host has: its highest lot GPU index + 1
    publish_address: str = ""  # where the host publishes it ("" = every address)
    lots_in_container: int = 1
    lots_on_host: int = 1
    cpus: str = ""  # the operator's share for this container ("" = derived from the host's size)
    memory: str = ""
    shm_size: str = ""
    connections: int = 0  # tracked connections, terminals, disk MB/s: the operator's for this container (0: derived)
    ptys: int = 0
    disk_mbps: int = 0
    disk_gib: int = 0
    image_id: str = ""  # pinned by prepare_image
    device_dir: str = "/dev"  # where the host's GPU device nodes are (tests: mknod stand-ins)
    # The account on this host of the customer's earlier order whose data volume this order takes over ("" = none).
    carry_from_username: str = ""
    # When the order's files are deleted, for a window that ended: its read-only download window lasts until then.
    download_until: datetime | None = None
    # The watch left the container stopped after it kept stopping (provisioning/restarts.py): no run but the
    # operator's restart starts it again (a customer's change of keys would otherwise restart it at will).
    container_held: bool = False
    # Whether this run may start the container when it finds it stopped: the watch's restarts (counted, with their
    # backoff and ceiling), a provision, a move, the operator's pre-flight and the hand-over may; a change of keys in
    # the window may not (the customer stops their container at will: each change would be a restart counted nowhere).
    starts_stopped_container: bool = True

    @property
    def container_name(self) -> str:
        return f"binome-{self.username}"

    @property
    def network_name(self) -> str:
        return f"binome-{self.username}"

    @property
    def volume_name(self) -> str:
        return f"binome-{self.username}-data"

    @property
    def kit_dir(self) -> str:
        """The account's home on the host: root's, the kit the container mounts read-only."""
        return f"{KIT_ROOT}/{self.username}"

    @property
    def ssh_dir(self) -> str:
        return f"{self.kit_dir}/ssh"

    @property
    def volume_file(self) -> str:
        """The root-owned file holding the file system of the customer's data volume."""
        return f"{VOLUME_ROOT}/{self.username}.ext4"

    @property
    def carried_volume_file(self) -> str:
        """The earlier order's volume file that this order's takes over: root's path, built from our own names."""
        if not re.fullmatch(ACCOUNT_NAME, self.carry_from_username):
            raise StepFailed(f"not an account name of ours: {self.carry_from_username[:40]!r}")
        return f"{VOLUME_ROOT}/{self.carry_from_username}.ext4"

    @property
    def home(self) -> str:
        """The customer's home inside the container: their data volume."""
        return f"/home/{self.username}"

    @property
    def ssh_port(self) -> int:
        return self.ssh_port_base + min(self.gpu_indices or [0])

    @property
    def download_ports(self) -> range:
        return ports.download_ports(self.ssh_port_base)


@dataclass(frozen=True)
class StepOutput:
    """What a step says for the run's record, and what it found that the order's access keeps (pinned image,
    published port, host key, shares)."""

    text: str
    access: dict = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return self.text


class StepFailed(Exception):
    """A step could not complete; `message` is for operators."""


def is_dry_run(conn: Connection) -> bool:
    return bool(getattr(conn, "is_dry_run", False))


# The first subordinate range of $1 in /etc/subuid, then /etc/subgid ("start count", or "none").
_ID_RANGES = (
    'for f in /etc/subuid /etc/subgid; do r=$(grep -m 1 "^$1:" "$f" 2>/dev/null | cut -d: -f2,3 | tr : " "); '
    'echo "${r:-none}"; done'
)
DOCKER_REMAP_ACCOUNT = "dockremap"  # docker's daemon maps every container onto this account's range (userns-remap)


def id_ranges(conn: Connection, ctx: "StepContext") -> tuple[int, int]:
    """The host uid and gid of container root in the tenant's user namespace: the account's subordinate ranges
    (useradd gives each new account its own; create_user makes sure), or docker's daemon-wide range."""
    if is_dry_run(conn):
        return 100000, 100000
    podman = containers.Runtime(ctx.container_runtime).is_podman
    owner = ctx.username if podman else DOCKER_REMAP_ACCOUNT
    answer = conn.run(["sh", "-c", _ID_RANGES, "id_ranges", owner]).stdout.splitlines()
    bases = []
    for line in [*answer, "none", "none"][:2]:
        fields = line.split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields) or int(fields[1]) < containers.ID_RANGE:
            where = f"the account {owner}" if podman else "docker's daemon (userns-remap=default)"
            raise StepFailed(
                f"{where} has no range of {containers.ID_RANGE} subordinate ids in /etc/subuid and /etc/subgid: "
                "containers run in a user namespace of the tenant's own"
            )
        bases.append(int(fields[0]))
    return bases[0], bases[1]


def user_exists(conn: Connection, username: str) -> bool:
    return conn.run(["id", "-u", username], check=False).exit_status == 0


def runtime_of(ctx: StepContext) -> containers.Runtime:
    """The host's container runtime as set by the operator, checked for form: it is run by root."""
    runtime = ctx.container_runtime
    if not runtime:
        raise StepFailed(
            "this host has no container runtime set: customers are only ever given a container (set podman or "
            "docker on the host and check it again)"
        )
    if not re.fullmatch(RUNTIME_PATTERN, runtime):
        raise StepFailed(f"the host's container runtime must be podman or docker (a name or a path): {runtime[:80]!r}")
    return containers.Runtime(runtime)


# Root's own files on the host: for each path $@, "mode:owner:group sha256" or "missing" (one round trip for all).
_FILE_STATES = (
    'for f; do if [ -f "$f" ] && [ ! -L "$f" ]; then printf "%s %s\\n" "$(stat -c %a:%U:%G -- "$f")" '
    '"$(sha256sum < "$f" | cut -d " " -f 1)"; else echo missing; fi; done'
)


def install_root_files(conn: Connection, wanted: dict[str, tuple[bytes, int, str]]) -> list[str]:
    """Root's own files (outside any customer's reach) with this content, mode and group, owned by root: those that
    differ are rewritten, in one round trip to read them all. Returns the paths written."""
    states = conn.run(["sh", "-c", _FILE_STATES, "install", *wanted]).stdout.splitlines()
    written = []
    for (path, (content, mode, group)), state in zip(wanted.items(), states + [""] * len(wanted), strict=False):
        if state != f"{mode:o}:root:{group} {hashlib.sha256(content).hexdigest()}":
            conn.put_file(path, content, mode=mode, owner=f"root:{group}")
            written.append(path)
    return written
