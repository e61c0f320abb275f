"""The container an order gets on a host: how it is started (the argv), with only the lot's GPUs inside.

Design (docs/architecture.md "Provisioning"): one container per order and host, from the chosen image, the
customer's uid inside, no capability, no-new-privileges, its own /tmp and /dev/shm, lowered ulimits, the home
bind-mounted from the host (700). This module only builds the command; steps run it through a driver.
"""

from dataclasses import dataclass

# What this kernel's cgroup layout needs (crun fails on it), and limits a runaway data loader cannot exceed.
RUNTIME = "runc"
ULIMITS = ("nofile=1024:1024", "nproc=4096:4096")


@dataclass(frozen=True)
class ContainerSpec:
    name: str  # binome-<user>
    image: str
    uid: int
    gid: int
    home: str  # on the host; the same path inside
    vendor: str  # "nvidia" or "amd"
    gpu_indices: tuple[int, ...]
    shm_size: str = "8g"  # PyTorch data loaders pass batches through /dev/shm
    tmp_size: str = "16g"
    cpus: str = ""  # the lot's share of the host, when the host sets one
    memory: str = ""
    network: str = "none"
    use_cdi: bool = True  # NVIDIA: nvidia.com/gpu=<i> (CDI); False: the /dev/nvidia<i> nodes themselves
    device_dir: str = "/dev"  # where the host's device nodes are (tests point it at mknod stand-ins)


def lot_devices(spec: ContainerSpec) -> list[str]:
    """--device values giving the container the lot's GPUs and nothing else."""
    if spec.vendor == "amd":  # the compute interface, and the lot's render nodes (renderD128 is GPU 0)
        return [f"{spec.device_dir}/kfd:/dev/kfd"] + [
            f"{spec.device_dir}/dri/renderD{128 + index}:/dev/dri/renderD{128 + index}" for index in spec.gpu_indices
        ]
    if spec.use_cdi:
        return [f"nvidia.com/gpu={index}" for index in spec.gpu_indices]
    return [f"{spec.device_dir}/nvidia{index}:/dev/nvidia{index}" for index in spec.gpu_indices]


def run_argv(spec: ContainerSpec, command: list[str], *, runtime: str = "podman", detach: bool = False) -> list[str]:
    """`podman run` for the order's container, running `command` (a long-lived init when detached)."""
    argv = [runtime, "--runtime", RUNTIME, "run", "--name", spec.name, "--hostname", spec.name]
    argv += ["--detach"] if detach else ["--rm"]
    argv += ["--user", f"{spec.uid}:{spec.gid}", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
    for ulimit in ULIMITS:
        argv += ["--ulimit", ulimit]
    private_tmp = f"/tmp:rw,nosuid,nodev,size={spec.tmp_size}"  # noqa: S108 (a tmpfs of the container's own)
    argv += ["--tmpfs", private_tmp, "--shm-size", spec.shm_size]
    argv += ["--network", spec.network, "--volume", f"{spec.home}:{spec.home}:rw", "--workdir", spec.home]
    argv += ["--env", f"HOME={spec.home}"]
    if spec.cpus:
        argv += ["--cpus", spec.cpus]
    if spec.memory:
        argv += ["--memory", spec.memory]
    for device in lot_devices(spec):
        argv += ["--device", device]
    return [*argv, spec.image, *command]
