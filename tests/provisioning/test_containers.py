"""The commands that make an order's container, as each runtime's own command-line parser reads them: podman's (it
runs here, so the container tests run them for real) and docker's (no engine runs here: its client parses every
flag before it looks for the daemon, so a flag it does not know fails before "cannot connect")."""

import shutil
import subprocess

import pytest

from provisioning.containers import ContainerSpec, Runtime, run_argv

SPEC = ContainerSpec(
    name="binome-bn-test",
    image="0" * 64,
    username="bn-test",
    uid_base=1_000_000,
    gid_base=1_000_000,
    home="/home/bn-test",
    volume="binome-bn-test-data",
    vendor="nvidia",
    gpu_indices=(2, 3),
    network="binome-bn-test",
    ssh_port=42002,
    publish_address="127.0.0.1",
    cpus="1.5",
    memory="2g",
    shm_size="1024m",
    pids_limit=4096,
    ptys=1382,
    io_weight=200,
    io_device="/dev/nvme0n1",
    io_bps=300 * 2**20,
    use_cdi=False,
    kit_dir="/var/lib/binome/bn-test",
)


def _every_command(runtime: Runtime) -> list[list[str]]:
    return [
        run_argv(SPEC, runtime),
        runtime.remove(SPEC.name),
        runtime.network_create(SPEC.network),
        runtime.volume_create(SPEC.volume, "/var/lib/binome-volumes/bn-test.ext4"),
        runtime.command("exec", "--user", "42001:42001", "--workdir", SPEC.home, SPEC.name, "true"),
        runtime.command("container", "inspect", "--format", "{{.State.Running}}", SPEC.name),
        runtime.command("network", "rm", SPEC.network),
        runtime.command("volume", "rm", "--force", SPEC.volume),
        runtime.command("logs", "--tail", "20", SPEC.name),
    ]


def test_docker_s_own_parser_accepts_every_command_the_steps_give_it():
    docker = shutil.which("docker")
    if docker is None:
        pytest.fail("the docker client is missing: run `make system-deps`", pytrace=False)
    runtime = Runtime(docker)
    assert runtime.remove("x") == [docker, "rm", "--force", "--volumes", "x"]  # docker's rm has no --time
    # the check can fail: the podman words it replaces are refused by docker's parser
    refused = subprocess.run(
        [docker, "--host", "unix:///nonexistent/binome-test.sock", "rm", "--force", "--time", "5", "x"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert "unknown flag: --time" in refused.stderr
    for argv in _every_command(runtime):
        answer = subprocess.run(
            [argv[0], "--host", "unix:///nonexistent/binome-test.sock", *argv[1:]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        # past the flag parser: the daemon is asked for (`run` asks for its OS first, to read --device values)
        reached_daemon = "Cannot connect to the Docker daemon" in answer.stderr or "unknown server OS" in answer.stderr
        assert reached_daemon, (argv, answer.stderr)
        for refusal in ("unknown flag", "unknown shorthand", "invalid argument", "flag needs an argument"):
            assert refusal not in answer.stderr, (argv, answer.stderr)


def test_the_podman_commands_name_runc_and_the_container_holds_only_its_lot_s_devices_and_shares():
    argv = run_argv(SPEC, Runtime("podman"))
    assert argv[:3] == ["podman", "--runtime", "runc"]
    devices = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--device"]
    assert devices == ["/dev/nvidia2:/dev/nvidia2", "/dev/nvidia3:/dev/nvidia3"]
    joined = " ".join(argv)
    for expected in (
        "--cap-drop all",
        "--security-opt no-new-privileges",
        "--network binome-bn-test",
        "--publish 127.0.0.1:42002:2222/tcp",
        "--pids-limit 4096",
        "--memory 2g --memory-swap 2g",
        "--cpus 1.5",
        "--shm-size 1024m",
        "--volume binome-bn-test-data:/home/bn-test:rw",
        "--volume /var/lib/binome/bn-test:/opt/binome:ro",
    ):
        assert expected in joined
    assert "--network host" not in joined and "--privileged" not in joined
    assert Runtime("podman").remove("x")[-5:] == ["--force", "--volumes", "--time", "5", "x"]
    for expected in ("--read-only", "--image-volume tmpfs", "--sysctl net.ipv6.conf.all.disable_ipv6=1"):
        assert expected in joined
    # its own user namespace (container root is host id 1000000), root's capabilities inside it only, shares of the
    # pty pool and the disk, and no restart by the runtime (the portal's watch decides: provisioning/restarts.py)
    for expected in (
        "--uidmap 0:1000000:65536 --gidmap 0:1000000:65536",
        "--user 0:0 --cap-drop all --cap-add CHOWN",
        "--mount type=devpts,destination=/dev/pts,max=1382,mode=620,gid=5",
        "--blkio-weight 200",
        f"--device-read-bps /dev/nvme0n1:{300 * 2**20} --device-write-bps /dev/nvme0n1:{300 * 2**20}",
        "--restart no",
        "--volume /var/lib/binome/bn-test/passwd:/etc/passwd:ro",
    ):
        assert expected in joined
    assert "SYS_ADMIN" not in joined and "--passwd-entry" not in joined and "always" not in joined
