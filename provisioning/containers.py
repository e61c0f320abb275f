"""The container an order gets on a host: the commands that make it, with only the lot's GPUs inside.

Design (docs/architecture.md "The tenant boundary"): one container per order and host, from the chosen image pinned
by its ID, in a user namespace of the tenant's own (container root is an unprivileged uid of the host, from a range
no other tenant has), no capability outside that namespace, no-new-privileges, its own /tmp and /dev/shm, shares of
what the host has one of (CPU, memory, pids, ptys, disk I/O; tracked connections through the firewall guard), its
own network namespace (a bridge network of its own, isolated from every other customer's), the customer's data on a
sized volume mounted as their home, and the root-owned kit read-only at /opt/binome. The customer reaches it through
an SSH server that runs inside it, as container root, on a port the host publishes: the host's own login stack never
sees the customer, who logs in as their own account or as root. This module only builds the commands; steps run
them.

podman and docker take the same commands but for a few verbs: `Runtime` says which words each one uses, and
tests/provisioning/test_containers.py checks docker's against docker's own command-line parser.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nodekit.bundle import host_file_bytes

# What this kernel's cgroup layout needs (crun fails on it), and limits a runaway data loader cannot exceed.
OCI_RUNTIME = "runc"
ULIMITS = ("nofile=1024:1024", "nproc=4096:4096")

# Each tenant's user namespace: container ids 0..ID_RANGE-1 map onto a range of the host's subordinate ids (the
# account's line in /etc/subuid and /etc/subgid) that no other tenant has. The customer's account inside has the same
# ids in every container: a data volume carried to the next order keeps its owners, its range moving with it.
ID_RANGE = 65536
CUSTOMER_ID = 2000
# What the container's root (its sshd, and the customer logged in as root) may do, inside its own namespace only:
# sshd's privilege separation (setuid, setgid, chroot), owning and opening its files, its own ports below 1024.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "NET_BIND_SERVICE", "SETGID", "SETUID", "SYS_CHROOT"
)  # fmt: skip

CUSTOMER_GROUP = "binome-customers"  # the customers' accounts on a host; its sshd denies the group
KIT_MOUNT = "/opt/binome"  # the root-owned kit directory of the order, read-only inside
SSH_DIR = f"{KIT_MOUNT}/ssh"  # sshd's configuration, host key and the customer's keys, all root-owned
SSHD_CONFIG = f"{SSH_DIR}/sshd_config"
AUTHORIZED_KEYS = f"{SSH_DIR}/authorized_keys"
SSH_PORT_INSIDE = 2222  # the customer's uid cannot bind below 1024 (no capability)
SPEC_LABEL = "binome.spec"
LOG_SIZE = "10m"  # sshd logs to the container's log: capped, the host only keeps it


def supervise_sshd(username: str, home: str) -> str:
    """The container's main process, as container root: sshd once the hand-over wrote keys (until then nothing of the
    customer's can log in, so nothing of theirs runs beside the pre-flight check), started again if it stops, taking
    logins as the customer's account or root only. First its privilege separation directory, /dev/pts/ptmx openable
    by the customer's own terminals (tmux, screen: the runtime mounts the pty instance with ptmxmode 000), and the
    home's root given back to the customer (podman gives a volume's root to the container's user the first time it
    mounts it: container root here), all inside the tenant's namespace."""
    return (
        "mkdir -p /run/sshd && chmod 755 /run/sshd; chmod 666 /dev/pts/ptmx 2>/dev/null; "
        f"chown {CUSTOMER_ID}:{CUSTOMER_ID} {home}; "
        f"while :; do if [ -s {AUTHORIZED_KEYS} ]; then /usr/sbin/sshd -D -e -f {SSHD_CONFIG} "
        f'-o "AllowUsers=root {username}"; fi; sleep 1; done'
    )


GUARD_IN, GUARD_FORWARD, GUARD_TO = "BINOME-IN", "BINOME-FWD", "BINOME-TO"  # nodekit/binome-guard's chains
GUARD_PATH = "/usr/local/libexec/binome-guard"
GUARD_UNIT_PATH = "/etc/systemd/system/binome-guard.service"
GUARD_REFRESH_PATH = "/etc/systemd/system/binome-guard-refresh.service"
GUARD_TIMER_PATH = "/etc/systemd/system/binome-guard.timer"


@dataclass(frozen=True)
class Runtime:
    """The host's container runtime: its path, and how its words differ between podman and docker."""

    path: str

    @property
    def is_podman(self) -> bool:
        return self.path.rsplit("/", 1)[-1] == "podman"

    def command(self, verb: str, *args: str) -> list[str]:
        """`<runtime> <verb> ...` (inspect, start, exec, logs, ...): podman is told to use runc."""
        base = [self.path, "--runtime", OCI_RUNTIME] if self.is_podman else [self.path]
        return [*base, verb, *args]

    def remove(self, name: str) -> list[str]:
        """Stop (5 s, then kill) and remove a container: docker's `rm` has no --time, its --force kills at once."""
        return (
            self.command("rm", "--force", "--volumes", "--time", "5", name)
            if self.is_podman
            else self.command("rm", "--force", "--volumes", name)
        )

    def network_create(self, name: str) -> list[str]:
        """A bridge network of the order's own, from which no other customer's network is reachable: netavark's
        `isolate` (podman), inter-container traffic off and docker's isolation between bridges (docker)."""
        if self.is_podman:  # no aardvark resolver on the gateway: the container uses the host's upstream resolvers
            return self.command(
                "network", "create", "--driver", "bridge", "--disable-dns", "--opt", "isolate=true", name
            )
        option = "com.docker.network.bridge.enable_icc=false"
        return self.command("network", "create", "--driver", "bridge", "--opt", option, name)

    @property
    def bridges(self) -> str:
        """iptables' name pattern of the bridges this runtime makes for networks (netavark: podman0, podman1...;
        docker: br-<id>)."""
        return "podman+" if self.is_podman else "br-+"

    def guard_argv(self) -> list[str]:
        """The host's own firewall guard around the customers' networks, rebuilt in one command (idempotent):
        nothing from a container's bridge reaches the host itself (but answers to the host's own connections and DNS
        from the runtime's resolver on the gateway), another container's bridge, or link-local addresses (cloud
        metadata). netavark's own `isolate` rules are not enough: netavark 1.4 drops its jump rule whenever any
        isolated container stops, until another starts. The guard lives in the mangle table, which the kernel
        walks before the filter table: the accepting rules netavark and docker insert at the top of the filter
        table's FORWARD (on a fresh host, or at boot, after the guard) can never pass a packet it drops."""
        return ["sh", "-c", host_file_bytes("binome-guard").decode(), "binome-guard", self.bridges]

    def guard_units(self) -> dict[str, bytes]:
        """systemd units of the guard, by path. At boot it is built before the runtime restarts the containers
        (--restart always), and the restart requires it: a guard that fails starts no container. A timer rebuilds it
        every 30 s (the script is idempotent and swaps its chains in one transaction), so a firewall reload that
        flushes every table (nftables' `flush ruleset`) leaves the customers unguarded for 30 s at most."""
        run = f"[Service]\nType=oneshot\nExecStart={GUARD_PATH} {self.bridges}\n"
        title = "Description=Binome: firewall guard around the customers' container networks"
        return {
            GUARD_UNIT_PATH: (
                f"[Unit]\n{title}\nBefore=podman-restart.service docker.service\nAfter=network-pre.target\n\n"
                f"{run}RemainAfterExit=yes\n\n"
                "[Install]\nWantedBy=multi-user.target\nRequiredBy=podman-restart.service docker.service\n"
            ).encode(),
            GUARD_REFRESH_PATH: f"[Unit]\n{title} (rebuilt)\n\n{run}".encode(),
            GUARD_TIMER_PATH: (
                f"[Unit]\n{title} (rebuilt every 30 s)\n\n"
                "[Timer]\nOnBootSec=30s\nOnUnitActiveSec=30s\nAccuracySec=5s\nUnit=binome-guard-refresh.service\n\n"
                "[Install]\nWantedBy=timers.target\n"
            ).encode(),
        }

    def id_map(self, uid_base: int, gid_base: int, extra_groups: tuple[int, ...] = ()) -> list[str]:
        """The container's user namespace: the tenant's range (podman maps it per container; docker's daemon maps
        every container onto its one `userns-remap` range, so it takes nothing here), and each host group in
        `extra_groups` (the owners of AMD's render nodes) mapped to one id of its own above the range."""
        if not self.is_podman:
            return []
        argv = ["--uidmap", f"0:{uid_base}:{ID_RANGE}", "--gidmap", f"0:{gid_base}:{ID_RANGE}"]
        for position, group in enumerate(extra_groups):
            argv += ["--gidmap", f"{ID_RANGE + position}:{group}:1"]
        return argv

    def volume_create(self, name: str, image_path: str) -> list[str]:
        """A volume backed by an ext4 file system in `image_path`: its size is the customer's disk limit. The runtime
        mounts it (loop, nosuid, nodev) whenever the container starts, a reboot included."""
        return self.command(
            "volume", "create", "--driver", "local", "--opt", "type=ext4", "--opt", f"device={image_path}",
            "--opt", "o=loop,nosuid,nodev", name,
        )  # fmt: skip


@dataclass(frozen=True)
class ContainerSpec:
    name: str  # binome-<user>
    image: str  # the image's ID, pinned when it was pulled: a tag moved later changes nothing here
    username: str
    uid_base: int  # the host uid of container root: the start of the tenant's subordinate range
    gid_base: int
    home: str  # inside the container: /home/<user>, the data volume
    volume: str  # the data volume's name
    vendor: str  # "nvidia" or "amd"
    gpu_indices: tuple[int, ...]
    network: str  # the order's own network
    ssh_port: int  # on the host, published to SSH_PORT_INSIDE
    publish_address: str = ""  # "" for every address of the host
    shm_size: str = "8g"  # PyTorch data loaders pass batches through /dev/shm
    tmp_size: str = "16g"
    cpus: str = ""  # the lot's share of the host
    memory: str = ""
    pids_limit: int = 4096
    ptys: int = 0  # the most terminals its own /dev/pts instance holds (0: the runtime's default, the host's pool)
    io_weight: int = 0  # its weight on the disks (0: none, where the kernel does not honour one)
    io_device: str = ""  # the disk of the data volumes, throttled to io_bps when set
    io_bps: int = 0
    use_cdi: bool = True  # NVIDIA: nvidia.com/gpu=<i> (CDI); False: the /dev/nvidia<i> nodes themselves
    device_dir: str = "/dev"  # where the host's device nodes are (tests point it at mknod stand-ins)
    group_ids: tuple[int, ...] = ()  # the host groups owning the lot's device nodes (AMD's render nodes are 660)
    kit_dir: str = ""  # root-owned, on the host: mounted read-only at KIT_MOUNT

    @property
    def host_customer_ids(self) -> tuple[int, int]:
        """The host's uid and gid of the customer's account inside (what their files are owned by on the volume)."""
        return self.uid_base + CUSTOMER_ID, self.gid_base + CUSTOMER_ID


def lot_devices(spec: ContainerSpec) -> list[str]:
    """--device values giving the container the lot's GPUs and nothing else."""
    if spec.vendor == "amd":  # the compute interface, and the lot's render nodes (renderD128 is GPU 0)
        return [f"{spec.device_dir}/kfd:/dev/kfd"] + [
            f"{spec.device_dir}/dri/renderD{128 + index}:/dev/dri/renderD{128 + index}" for index in spec.gpu_indices
        ]
    if spec.use_cdi:
        return [f"nvidia.com/gpu={index}" for index in spec.gpu_indices]
    return [f"{spec.device_dir}/nvidia{index}:/dev/nvidia{index}" for index in spec.gpu_indices]


def passwd_entry(username: str, home: str) -> str:
    return f"{username}:*:{CUSTOMER_ID}:{CUSTOMER_ID}::{home}:/bin/sh"


def group_entry(username: str) -> str:
    return f"{username}:x:{CUSTOMER_ID}:"


def run_argv(spec: ContainerSpec, runtime: Runtime) -> list[str]:
    """`run --detach` of the order's container: its main process supervises the customer's sshd."""
    argv = runtime.command("run", "--name", spec.name, "--hostname", spec.name, "--detach", "--init")
    # Never restarted by the runtime, which would do it at once and forever (mounts, interfaces, firewall rules: root's
    # work outside the tenant's CPU share) for a customer who kills its main process in a loop: the portal's watch
    # starts it again with a backoff and a ceiling (provisioning/restarts.py), a host that rebooted included.
    argv += ["--restart", "no"]
    # The image's file system is read-only: what the customer writes goes to their volume (sized) or a tmpfs (counted
    # in their memory share), never to the host's container storage (world-writable /var/tmp, /run/lock of images).
    argv += ["--read-only"]  # podman adds tmpfs /run, /tmp and /var/tmp to it (--read-only-tmpfs); docker is told
    if runtime.is_podman:  # an image's VOLUME declarations become tmpfs (in the memory share), not host storage
        argv += ["--image-volume", "tmpfs"]
    # no IPv6 in the container: the bridge's link-local address would otherwise reach the host's services on ::
    argv += ["--sysctl", "net.ipv6.conf.all.disable_ipv6=1", "--sysctl", "net.ipv6.conf.default.disable_ipv6=1"]
    if not runtime.is_podman:
        argv += ["--tmpfs", "/var/tmp:rw,nosuid,nodev,size=1g", "--tmpfs", "/run:rw,nosuid,nodev,size=64m"]  # noqa: S108
    argv += runtime.id_map(spec.uid_base, spec.gid_base, spec.group_ids)
    argv += ["--user", "0:0", "--cap-drop", "all"]
    for capability in CAPABILITIES:
        argv += ["--cap-add", capability]
    argv += ["--security-opt", "no-new-privileges"]
    # the image's accounts and the customer's (sshd looks the account up), written by prepare_image in the kit
    argv += ["--volume", f"{spec.kit_dir}/passwd:/etc/passwd:ro", "--volume", f"{spec.kit_dir}/group:/etc/group:ro"]
    for position, group in enumerate(spec.group_ids):  # the device nodes' owners, mapped above the tenant's range
        argv += ["--group-add", str(ID_RANGE + position if runtime.is_podman else group)]
    for ulimit in ULIMITS:
        argv += ["--ulimit", ulimit]
    argv += ["--pids-limit", str(spec.pids_limit)]
    if spec.ptys and runtime.is_podman:  # a /dev/pts instance of its own, holding at most its share of the pool
        argv += ["--mount", f"type=devpts,destination=/dev/pts,max={spec.ptys},mode=620,gid=5"]
    if spec.io_weight:
        argv += ["--blkio-weight", str(spec.io_weight)]
    if spec.io_device and spec.io_bps:
        argv += ["--device-read-bps", f"{spec.io_device}:{spec.io_bps}"]
        argv += ["--device-write-bps", f"{spec.io_device}:{spec.io_bps}"]
    private_tmp = f"/tmp:rw,nosuid,nodev,size={spec.tmp_size}"  # noqa: S108 (a tmpfs of the container's own)
    argv += ["--tmpfs", private_tmp, "--shm-size", spec.shm_size]
    published = f"{spec.publish_address}:{spec.ssh_port}" if spec.publish_address else str(spec.ssh_port)
    argv += ["--network", spec.network, "--publish", f"{published}:{SSH_PORT_INSIDE}/tcp"]
    argv += ["--volume", f"{spec.volume}:{spec.home}:rw", "--workdir", spec.home]
    argv += ["--volume", f"{spec.kit_dir}:{KIT_MOUNT}:ro"]
    argv += ["--env", f"HOME={spec.home}", "--env", f"USER={spec.username}"]
    # A log file of the runtime's own, capped (journald, the default on some distributions, ignores max-size and
    # would let a customer flood the host's journal through the container's output)
    argv += ["--log-driver", "k8s-file" if runtime.is_podman else "json-file", "--log-opt", f"max-size={LOG_SIZE}"]
    if spec.cpus:
        argv += ["--cpus", spec.cpus]
    if spec.memory:  # swap included: a share of memory is not doubled by the host's swap
        argv += ["--memory", spec.memory, "--memory-swap", spec.memory]
    for device in lot_devices(spec):
        argv += ["--device", device]
    argv += ["--label", f"{SPEC_LABEL}={spec_digest(spec)}"]
    return [*argv, spec.image, "/bin/sh", "-c", supervise_sshd(spec.username, spec.home)]


def spec_digest(spec: ContainerSpec) -> str:
    """What the container was made from: a container whose label differs (another lot, image or share) is
    replaced, one that matches is kept (and started if it stopped)."""
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]
