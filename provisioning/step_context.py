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
    disk_gib: int = 0
    image_id: str = ""  # pinned by prepare_image
    device_dir: str = "/dev"  # where the host's GPU device nodes are (tests: mknod stand-ins)
    # The account on this host of the customer's earlier order whose data volume this order takes over ("" = none).
    carry_from_username: str = ""
    # When the order's files are deleted, for a window that ended: its read-only download window lasts until then.
    download_until: datetime | None = None

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


def account_ids(conn: Connection, username: str) -> tuple[int, int]:
    """uid and gid of the customer's account on the host."""
    if is_dry_run(conn):
        return 10000, 10000
    fields = conn.run(["getent", "passwd", username]).stdout.strip().split(":")
    return int(fields[2]), int(fields[3])


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
