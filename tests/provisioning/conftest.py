"""A real OpenSSH server for the provisioning tests, and a real `ssh` client to log in like a researcher would.

The `sshd` fixture (one per test session) runs Debian's /usr/sbin/sshd on 127.0.0.1 at a free port, with its own
ed25519 host key (pinned in `sshd.host_spec`) and the portal's admin key authorised for root in a file of its own
(the real /root/.ssh is never touched). The configuration is a production one: keys only, root without password,
UsePAM yes (Debian's default, and the only way accounts that useradd leaves without a password can log in),
StrictModes yes (so provisioning must get the modes of ~/.ssh and authorized_keys right).

Needs root (sshd, useradd) and the Debian packages of `make system-deps`: openssh-server, openssh-client, sudo.
"""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.utils import timezone

from inventory.models import Host, Lot
from provisioning import shares
from provisioning.containers import Runtime
from provisioning.drivers import HostSpec, get_driver
from provisioning.drivers.base import Connection
from tests.builders.hosts import NVIDIA_SMI
from tests.builders.teardown import Clock

SSHD = "/usr/sbin/sshd"
ROOT = Path(__file__).resolve().parents[2]
MISSING_PACKAGES_HINT = (
    "run `make system-deps` (it installs Debian's openssh-server, openssh-client and sudo), "
    "or `apt-get install openssh-server openssh-client sudo`"
)


@dataclass
class SshServer:
    port: int
    host_key_line: str  # "ssh-ed25519 AAAA..." (the pinned key)
    log_path: Path  # sshd's own log (LogLevel VERBOSE)
    host_spec: HostSpec  # root@127.0.0.1:port, pinned host key, the portal's admin key
    directory: Path  # config, keys and logs; root-owned, mode 755 (not under /tmp: StrictModes refuses /tmp)
    known_hosts_path: Path
    authorized_keys_dir: Path  # <dir>/<user>: extra authorized_keys files, owned by root, mode 644
    process: subprocess.Popen = field(repr=False)

    def login_as(
        self,
        user: str,
        private_key_path: str | os.PathLike,
        command: str | None,
        *,
        options: list[str] = (),
        timeout: float = 30,
    ):
        """Run `command` as `user` with the system ssh client, like a researcher would; returns CompletedProcess.
        `options`: more ssh arguments (`-W host:port` with no command, `-R ...`)."""
        return subprocess.run(
            [
                "ssh",
                *self.client_options(private_key_path),
                "-p",
                str(self.port),
                *options,
                f"{user}@127.0.0.1",
                *([command] if command is not None else []),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def client_options(self, private_key_path: str | os.PathLike) -> list[str]:
        """The options of a researcher's OpenSSH client (ssh, scp, sftp) for this server, without the port flag
        (ssh's is -p, scp's and sftp's -P)."""
        return [
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts_path}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "ConnectTimeout=10",
            "-i",
            os.fspath(private_key_path),
        ]

    def authorize_admin_key(self, user: str, public_key_line: str) -> None:
        """Let `user` log in with `public_key_line` through the harness's own authorized-keys file for it."""
        path = self.authorized_keys_dir / user
        path.write_text(public_key_line.strip() + "\n")
        path.chmod(0o644)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def generate_keypair(path: Path, comment: str = "binome-test", key_type: str = "ed25519") -> tuple[Path, str]:
    """A key pair at `path` (private, mode 600) and `path`.pub; returns (private path, public line)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path, path.with_name(path.name + ".pub").read_text().strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ROOT_HOME = "root-home"  # the portal's account's home in the tests' sshd (_sshd_config says why)


def _sshd_config(directory: Path, port: int, *, per_source_penalties: bool, containers: bool = False) -> str:
    lines = [
        f"ListenAddress 127.0.0.1:{port}",
        f"PidFile {directory / 'sshd.pid'}",
        f"HostKey {directory / 'ssh_host_ed25519_key'}",
        f"AuthorizedKeysFile .ssh/authorized_keys {directory / 'authorized_keys'}/%u",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM yes",
        "StrictModes yes",
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "PrintMotd no",
        "MaxStartups 100:30:200",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
    ]
    if per_source_penalties:  # OpenSSH >= 9.8 only: would lock the test client out after a few failed logins
        lines.append("PerSourcePenalties no")
    if containers:  # a host prepared as docs/operations.md says: its sshd denies the customers' accounts
        from provisioning.containers import CUSTOMER_GROUP  # no Django here: bench/provisioning.py runs it first

        lines.append(f"DenyGroups {CUSTOMER_GROUP}")
    # The portal's account (root) gets a home of its own, empty: bash, started by sshd for each command, reads the
    # account's ~/.bashrc, and this machine's root has one that runs `pyenv init` (about 55 ms a command, half of each
    # command's time here, and pyenv's python first on PATH). A GPU host's root has no such file: this one runs the
    # portal's commands as a host prepared by docs/operations.md would. Last: a Match block runs to the file's end.
    lines += ["Match User root", f"    SetEnv HOME={directory / ROOT_HOME}"]
    return "\n".join(lines) + "\n"


def _check_config(config_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([SSHD, "-t", "-f", str(config_path)], capture_output=True, text=True, check=False)


def _wait_for_banner(process: subprocess.Popen, port: int, log_path: Path, deadline_s: float = 10.0) -> None:
    deadline = time.monotonic() + deadline_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with status {process.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(2)
                if sock.recv(256).startswith(b"SSH-2.0-"):
                    return
        except OSError as exc:
            last_error = exc
        time.sleep(0.05)
    raise RuntimeError(f"sshd did not answer on port {port} ({last_error}):\n{log_path.read_text(errors='replace')}")


@pytest.fixture(scope="session")
def sshd(reserved_ports_restored) -> Iterator[SshServer]:
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="session")
def container_sshd(reserved_ports_restored) -> Iterator[SshServer]:
    """An sshd configured as a container host's: customer sessions land in their container."""
    with running_sshd(containers=True) as server:
        yield server


@contextmanager
def running_sshd(*, containers: bool = False) -> Iterator[SshServer]:
    """Debian's sshd on 127.0.0.1 at a free port, for the tests and bench/provisioning.py. `containers`: configured
    as a container host's (docs/operations.md: it denies the customers' group)."""
    if not os.path.exists(SSHD):
        pytest.fail(f"{SSHD} is missing: {MISSING_PACKAGES_HINT}", pytrace=False)
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.fail(f"the ssh client is missing: {MISSING_PACKAGES_HINT}", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the provisioning tests run sshd and useradd: they need root", pytrace=False)

    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # Debian's sshd needs its privilege-separation directory
    directory = Path(tempfile.mkdtemp(prefix="binome-test-sshd-", dir="/run"))
    process = None
    try:
        directory.chmod(0o755)  # test users must reach their file in authorized_keys/ (read as the user)
        authorized_keys_dir = directory / "authorized_keys"
        authorized_keys_dir.mkdir(mode=0o755)
        (directory / ROOT_HOME).mkdir(mode=0o700)
        _, host_key_public = generate_keypair(directory / "ssh_host_ed25519_key", comment="binome-test-host")
        host_key_line = " ".join(host_key_public.split()[:2])
        client_key_path, client_public = generate_keypair(directory / "portal_admin_ed25519", "binome-portal")
        (authorized_keys_dir / "root").write_text(client_public + "\n")
        (authorized_keys_dir / "root").chmod(0o644)
        config_path = directory / "sshd_config"
        log_path = directory / "sshd.log"

        for _attempt in range(3):  # the free port may be taken between the probe and sshd's bind
            port = _free_port()
            config_path.write_text(_sshd_config(directory, port, per_source_penalties=True, containers=containers))
            check = _check_config(config_path)
            if check.returncode != 0 and "PerSourcePenalties" in check.stderr:
                config_path.write_text(_sshd_config(directory, port, per_source_penalties=False, containers=containers))
                check = _check_config(config_path)
            if check.returncode != 0:
                pytest.fail(f"sshd -t rejected the test configuration:\n{check.stderr}", pytrace=False)
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [SSHD, "-D", "-e", "-f", str(config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            try:
                _wait_for_banner(process, port, log_path)
                break
            except RuntimeError as exc:
                failure = str(exc)
                if process.poll() is None:
                    process.kill()
                process.wait()
                process = None
        else:
            pytest.fail(f"sshd did not start: {failure}", pytrace=False)

        known_hosts_path = directory / "known_hosts"
        known_hosts_path.write_text(f"[127.0.0.1]:{port} {host_key_line}\n")
        yield SshServer(
            port=port,
            host_key_line=host_key_line,
            log_path=log_path,
            host_spec=HostSpec(
                name="test-sshd",
                address="127.0.0.1",
                port=port,
                username="root",
                host_key=host_key_line,
                client_key_path=str(client_key_path),
            ),
            directory=directory,
            known_hosts_path=known_hosts_path,
            authorized_keys_dir=authorized_keys_dir,
            process=process,
        )
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def login_as(sshd: SshServer) -> Callable[..., subprocess.CompletedProcess]:
    """login_as(user, private_key_path, command) -> CompletedProcess, through the system ssh client."""
    return sshd.login_as


@pytest.fixture
def admin(sshd: SshServer) -> Iterator[Connection]:
    """The real SSH driver, logged in to the test sshd as root with the portal's key."""
    with get_driver("ssh").connect(sshd.host_spec) as connection:
        yield connection


@pytest.fixture
def keypair(tmp_path: Path) -> Callable[[str], tuple[Path, str]]:
    """keypair(name) -> (private key path, public key line): a fresh ed25519 pair, as a customer would make."""

    def make(name: str = "id_ed25519") -> tuple[Path, str]:
        return generate_keypair(tmp_path / name, comment=f"{name}@researcher")

    return make


def random_username(prefix: str = "binome-test") -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def remove_user(connection: Connection, user: str) -> None:
    """userdel -r, retried while the user's last ssh session is still winding down; and what provisioning made
    for the user: the container, its network and data volume, the kit directory."""
    for name in (f"binome-{user}", f"binome-{user}-files"):
        connection.run(["podman", "rm", "--force", "--time", "1", name], check=False, timeout=60)
    # the network's share of the connection-tracking table goes with it, and the guard drops its rules (as
    # container_steps.remove_container does): the next test's network may take the same bridge
    bridge = connection.run(["podman", "network", "inspect", "--format", "{{.NetworkInterface}}", f"binome-{user}"],
                            check=False).stdout.strip()  # fmt: skip
    if shares.BRIDGE_NAME.fullmatch(bridge):
        connection.run(["rm", "-f", "--", shares.conntrack_cap_file(bridge)], check=False)
    connection.run(["podman", "network", "rm", "--force", f"binome-{user}"], check=False, timeout=60)
    if shares.BRIDGE_NAME.fullmatch(bridge):
        connection.run(Runtime("podman").guard_argv(), check=False)
    # what podman 4.3 leaves mounted on the host after a container with a user namespace (container_steps)
    volume = connection.run(["podman", "volume", "inspect", "--format", "{{.Mountpoint}}", f"binome-{user}-data"],
                            check=False).stdout.strip()  # fmt: skip
    if volume.endswith("/_data"):
        connection.run(["umount", volume], check=False)
    connection.run(["podman", "volume", "rm", "--force", f"binome-{user}-data"], check=False, timeout=60)
    connection.run(["rm", "-rf", f"/var/lib/binome/{user}", f"/var/lib/binome-volumes/{user}.ext4"], check=False)
    for _attempt in range(20):
        result = connection.run(["userdel", "--remove", user], check=False)
        # 0: removed; 6: no such user; 12: home not removed (still gone from passwd); 8: user still logged in.
        if result.exit_status != 8:
            break
        time.sleep(0.25)
    else:
        connection.run(["userdel", "--remove", "--force", user], check=False)


def tenant_processes(connection: Connection, user: str) -> list[str]:
    """The host's processes of a tenant: its account's uid and the range of subordinate ids its containers' user
    namespace maps (what a customer runs in their container is an id of that range on the host)."""
    listed = connection.run(
        ["sh", "-c", 'r=$(grep -m 1 "^$1:" /etc/subuid | cut -d: -f2,3); u=$(id -u "$1" 2>/dev/null || echo -1); '
         'ps -e -o uid=,pid=,args= | awk -v u="$u" -v s="${r%:*}" -v n="${r#*:}" '
         '\'$1 == u || (s != "" && $1 >= s && $1 < s + n)\'', "tenant", user],
        check=False,
    )  # fmt: skip
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def test_image() -> str:
    """The containers' image, built from Debian packages (bin/test-image: cached, imported into podman once)."""
    if shutil.which("podman") is None or shutil.which("runc") is None or shutil.which("mmdebstrap") is None:
        pytest.fail("podman, runc and mmdebstrap are missing: run `make system-deps`", pytrace=False)
    built = subprocess.run([str(ROOT / "bin" / "test-image")], capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    return built.stdout.strip()


@pytest.fixture
def environment_images(test_image, catalog) -> Iterator[list[str]]:
    """The catalog's environment images present in the host's podman store (the test image under their names:
    no registry is reachable), so that prepare_image finds them instead of pulling."""
    from booking.models import EnvironmentImage

    references = sorted(set(EnvironmentImage.objects.values_list("image_ref", flat=True)))
    for reference in references:
        subprocess.run(["podman", "tag", test_image, reference], check=True, capture_output=True)
    try:
        yield references
    finally:
        for reference in references:  # that name only: the test image keeps its own
            subprocess.run(["podman", "untag", test_image, reference], check=False, capture_output=True)


@pytest.fixture
def fake_gpus() -> Iterator[Path]:
    """Four character devices standing in for /dev/nvidia0..3 (major 195, mode 666, as the NVIDIA driver's), at the
    host's own /dev: a container in a user namespace gets its device nodes bound from the host's path, which runc
    takes to be the path inside. Those this test made are removed at its end (a machine with real cards keeps its
    own), so that the host checks of other tests find none."""
    with stand_in_gpus() as directory:
        yield directory


@contextmanager
def stand_in_gpus() -> Iterator[Path]:
    """/dev/nvidia0..3, made where missing (tests and bench/provisioning.py)."""
    made = []
    for index in range(4):
        node = Path(f"/dev/nvidia{index}")
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(195, index))
            node.chmod(0o666)
            made.append(node)
    try:
        yield Path("/dev")
    finally:
        for node in made:
            node.unlink(missing_ok=True)


RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


PORT_SLOTS = 125  # first customer ports 20000-20992: their windows' ports all below the first download port, 21000
_port_slots = itertools.count(secrets.randbelow(PORT_SLOTS))


def loopback_port_base() -> int:
    """A test host's first customer port: another one for each host of the session (taken in turn: two hosts on
    this one machine never publish the same port, nor a window on another host's download port), and below Linux's
    ephemeral ports (32768), so that provisioning reserves nothing on this machine
    (tests/provisioning/test_customer_ports.py tests the reservation itself)."""
    return 20000 + 8 * (next(_port_slots) % PORT_SLOTS)


@pytest.fixture(scope="session")
def reserved_ports_restored() -> Iterator[None]:
    """This machine is the tests' GPU host: what provisioning reserves of its ephemeral ports is given back, at the
    end of the session of the worker that runs the host's tests (the sshd fixtures ask for it); a worker without
    them must not write the list back under the one that has them."""
    before = RESERVED_PORTS.read_text() if RESERVED_PORTS.exists() else None
    yield
    if before is not None and RESERVED_PORTS.read_text() != before:
        RESERVED_PORTS.write_text(before)


def make_loopback_host(server: SshServer, catalog, settings, *, name: str = "loopback", runtime: str = "podman"):
    """The test sshd as the only host with free B200 lots: GPUs 0,1 form the lot an order gets, 2,3 another. Its
    containers publish their SSH servers on 127.0.0.1, from a port range of its own (tests may run side by side);
    each lot's data volume is 1 GiB."""
    from inventory.models import Host, Lot  # here, not at import: bench/provisioning.py imports this before Django

    settings.PROVISIONING_SSH_KEY_FILE = str(server.host_spec.client_key_path)
    settings.PROVISIONING_PUBLISH_ADDRESS = "127.0.0.1"
    host = Host.objects.create(
        name=name,
        address="127.0.0.1",
        ssh_port=server.port,
        driver=Host.Driver.SSH,
        admin_user=server.host_spec.username,
        host_key=server.host_key_line,
        container_runtime=runtime,
        ssh_port_base=loopback_port_base(),
        disk_per_lot_gib=1,
    )
    Lot.objects.filter(hardware_class=catalog["b200-pair"]).update(status=Lot.Status.MAINTENANCE)
    Lot.objects.create(name=f"{name} · GPUs 0,1", hardware_class=catalog["b200-pair"], host=host, gpu_indices="0,1")
    return host


@pytest.fixture
def container_host(container_sshd, catalog, settings, environment_images, fake_gpus):
    """A host that runs each order in a podman container (runc), its GPUs the mknod stand-ins of `fake_gpus`."""
    settings.PROVISIONING_DEVICE_DIR = str(fake_gpus)
    return make_loopback_host(container_sshd, catalog, settings, name="containers", runtime="podman")


@pytest.fixture
def loopback_host(sshd, catalog, settings, environment_images, fake_gpus):
    """The plain test sshd as a host running podman containers (every host runs its orders in containers)."""
    settings.PROVISIONING_DEVICE_DIR = str(fake_gpus)
    return make_loopback_host(sshd, catalog, settings)


def customer_ssh(
    access, private_key_path, command: str | None = None, *, options=(), timeout: float = 30, user: str = "", **run
):
    """The researcher's own `ssh` to their container, as the order page tells them: its port, the pinned host key
    (the known_hosts line of the page), their key; as their account, or `user` (root). Returns CompletedProcess."""
    known_hosts = Path(private_key_path).with_name(f"known_hosts-{access.pk}")
    known_hosts.write_text(access.known_hosts_line + "\n")
    argv = ["ssh", *customer_ssh_options(private_key_path, known_hosts), "-p", str(access.ssh_port), *options]
    argv += [f"{user or access.username}@{access.host.address}", *([command] if command is not None else [])]
    if "input" not in run:
        run.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **run)


def customer_ssh_options(private_key_path, known_hosts) -> list[str]:
    return [
        "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
        "-i", os.fspath(private_key_path),
    ]  # fmt: skip


@pytest.fixture
def probed_host(sshd, catalog, settings, admin):
    """An SSH host on the test sshd with two B200 lots (GPUs 0,1 and 2,3), the only B200 lots offered. Prepared as
    provisioning prepares a host (its firewall guard in place), whatever ran on this machine before: a fresh
    machine has no guard until something installs it."""
    from provisioning.containers import Runtime

    admin.run(Runtime("podman").guard_argv())
    host = make_loopback_host(sshd, catalog, settings, name="probed", runtime="podman")
    Lot.objects.create(name="probed · GPUs 2,3", hardware_class=catalog["b200-pair"], host=host, gpu_indices="2,3")
    return host


@pytest.fixture
def stand_in_nvidia_smi(tmp_path, settings):
    """A stand-in for the host's nvidia-smi printing its CSV format for four GPUs (this machine has no GPU)."""
    tool = tmp_path / "tools" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ncat <<'END'\n{NVIDIA_SMI}END\n")
    tool.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    for directory in (tool.parent, tmp_path):
        directory.chmod(0o755)
    settings.PROVISIONING_GPU_TOOLS = {**settings.PROVISIONING_GPU_TOOLS, "nvidia": str(tool)}
    return tool


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(timezone, "now", lambda: clock.now)
    return clock


@pytest.fixture
def unreachable(settings, keypair):
    """Make a host unreachable: the SSH driver, a pinned key, and a port nothing listens on (connection refused),
    as a host whose sshd died, or a docker host whose teardown always fails, looks to the portal."""
    private_key, public_key = keypair("portal-admin")
    settings.PROVISIONING_SSH_KEY_FILE = str(private_key)

    def break_host(host: Host) -> None:
        Host.objects.filter(pk=host.pk).update(
            driver=Host.Driver.SSH,
            address="127.0.0.1",
            ssh_port=_free_port(),
            host_key=" ".join(public_key.split()[:2]),
        )

    return break_host
