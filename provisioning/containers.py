"""The container an order gets on a host: how it is started (the argv), with only the lot's GPUs inside.

Design (docs/architecture.md "Provisioning"): one container per order and host, from the chosen image, the
customer's uid inside, no capability, no-new-privileges, its own /tmp and /dev/shm, lowered ulimits, the home
bind-mounted from the host (700), the root-owned kit read-only at /opt/binome. This module only builds the
commands; steps run them through a driver.
"""

import hashlib
from dataclasses import dataclass

# What this kernel's cgroup layout needs (crun fails on it), and limits a runaway data loader cannot exceed.
RUNTIME = "runc"
ULIMITS = ("nofile=1024:1024", "nproc=4096:4096")


@dataclass(frozen=True)
class ContainerSpec:
    name: str  # binome-<user>
    image: str
    username: str
    uid: int
    gid: int
    home: str  # on the host; the same path inside
    vendor: str  # "nvidia" or "amd"
    gpu_indices: tuple[int, ...]
    shm_size: str = "8g"  # PyTorch data loaders pass batches through /dev/shm
    tmp_size: str = "16g"
    cpus: str = ""  # the lot's share of the host, when the host sets one
    memory: str = ""
    # The host's network namespace: outbound traffic (pip, datasets) and the customer's `ssh -L` forwards to the
    # host's loopback reach the container's servers (Jupyter, TensorBoard). See docs: ports are the host's.
    network: str = "host"
    use_cdi: bool = True  # NVIDIA: nvidia.com/gpu=<i> (CDI); False: the /dev/nvidia<i> nodes themselves
    device_dir: str = "/dev"  # where the host's device nodes are (tests point it at mknod stand-ins)
    group_ids: tuple[int, ...] = ()  # the groups owning the lot's device nodes (AMD's render nodes are 660)
    kit_dir: str = ""  # root-owned, on the host: mounted read-only at KIT_MOUNT (the pre-flight check, the kit)


# What a host's container runtime setting may be: podman or docker, by name or absolute path (root runs it).
RUNTIME_PATTERN = r"(/[A-Za-z0-9._-]+)*/?(podman|docker)"
KIT_MOUNT = "/opt/binome"
SPEC_LABEL = "binome.spec"


def lot_devices(spec: ContainerSpec) -> list[str]:
    """--device values giving the container the lot's GPUs and nothing else."""
    if spec.vendor == "amd":  # the compute interface, and the lot's render nodes (renderD128 is GPU 0)
        return [f"{spec.device_dir}/kfd:/dev/kfd"] + [
            f"{spec.device_dir}/dri/renderD{128 + index}:/dev/dri/renderD{128 + index}" for index in spec.gpu_indices
        ]
    if spec.use_cdi:
        return [f"nvidia.com/gpu={index}" for index in spec.gpu_indices]
    return [f"{spec.device_dir}/nvidia{index}:/dev/nvidia{index}" for index in spec.gpu_indices]


def _runtime_argv(runtime: str) -> list[str]:
    """podman is told to use runc (crun fails on this kernel's cgroup layout); docker uses its configured one."""
    return [runtime, "--runtime", RUNTIME] if runtime.rsplit("/", 1)[-1] == "podman" else [runtime]


def run_argv(spec: ContainerSpec, command: list[str], *, runtime: str = "podman", detach: bool = False) -> list[str]:
    """`podman run` for the order's container, running `command` (a long-lived init when detached)."""
    argv = [*_runtime_argv(runtime), "run", "--name", spec.name, "--hostname", spec.name]
    argv += ["--detach", "--init"] if detach else ["--rm"]
    argv += ["--user", f"{spec.uid}:{spec.gid}", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
    if _runtime_argv(runtime) != [runtime]:  # podman: the customer's name in the image's /etc/passwd
        argv += ["--passwd-entry", f"{spec.username}:*:{spec.uid}:{spec.gid}::{spec.home}:/bin/sh"]
    for group in spec.group_ids:
        argv += ["--group-add", str(group)]
    for ulimit in ULIMITS:
        argv += ["--ulimit", ulimit]
    private_tmp = f"/tmp:rw,nosuid,nodev,size={spec.tmp_size}"  # noqa: S108 (a tmpfs of the container's own)
    argv += ["--tmpfs", private_tmp, "--shm-size", spec.shm_size]
    argv += ["--network", spec.network, "--volume", f"{spec.home}:{spec.home}:rw", "--workdir", spec.home]
    argv += ["--env", f"HOME={spec.home}", "--env", f"USER={spec.username}"]
    if spec.kit_dir:
        argv += ["--volume", f"{spec.kit_dir}:{KIT_MOUNT}:ro"]
    if spec.cpus:
        argv += ["--cpus", spec.cpus]
    if spec.memory:
        argv += ["--memory", spec.memory]
    for device in lot_devices(spec):
        argv += ["--device", device]
    return [*argv, "--label", f"{SPEC_LABEL}={spec_digest(spec)}", spec.image, *command]


def spec_digest(spec: ContainerSpec) -> str:
    """What the container was made from: a container whose label differs (another lot, image or share) is
    replaced, one that matches is kept (and started if it stopped)."""
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]


def container_command(runtime: str, verb: str, *args: str) -> list[str]:
    """`podman <verb> ...` (inspect, start, exec, rm) with the runtime options run_argv uses."""
    return [*_runtime_argv(runtime), verb, *args]
