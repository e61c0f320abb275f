"""Orders provisioned on the container host (sshd + podman) and commands run inside the tenant's container."""

import secrets
import socket
import subprocess
import textwrap
from pathlib import Path

from booking.models import OrderStatus
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import rules, runs, services
from provisioning.models import Access
from tests.builders.orders import place
from tests.provisioning.conftest import customer_ssh, customer_ssh_options

ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]


def _stray_container(test_image: str, fake_gpus, *cards: int) -> str:
    """A container nobody booked holding cards (an operator's debugging session left on the host, a container of
    another tool): made with podman directly, as its owner would."""
    name = f"binome-test-stray-{secrets.token_hex(3)}"
    devices = [option for card in cards for option in ("--device", f"{fake_gpus}/nvidia{card}:/dev/nvidia{card}")]
    argv = ["podman", "--runtime", "runc", "run", "-d", "--name", name, *ULIMITS, *devices, test_image, "sleep", "3600"]
    subprocess.run(argv, check=True, capture_output=True)
    return name


def _remove_container(name: str) -> None:
    subprocess.run(["podman", "rm", "--force", "--time", "0", name], check=False, capture_output=True)


def _nvidia_nodes(access, key) -> list[str]:
    return _in(access, key, "ls /dev | grep ^nvidia | tr '\\n' ' '").stdout.split()


def _provision(client, booking_data, keypair, admin_user, callbacks, name):
    private_key, public_key = keypair(name)
    order, token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    with callbacks(execute=True):
        runs.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    order.token = token  # the order page's key, for the tests that read it
    return order, rules.username_for(order), private_key


def _hand_over(order, admin_user, callbacks):
    with callbacks(execute=True):  # no GPU here: the pre-flight fails and the operator hands over anyway
        runs.provisioning_hand_over(order=order, actor=admin_user, reason="test machine without GPU")
    order.refresh_from_db()
    assert order.status == OrderStatus.READY, order.provisioning_runs.first().error
    return Access.objects.select_related("host").get(order=order)


def _in(access, key, command: str, **run) -> subprocess.CompletedProcess:
    result = customer_ssh(access, key, command, **run)
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result


def _build_marker_library(directory: Path, marker: str) -> Path:
    """A real shared library whose constructor writes `marker` wherever it is loaded (the attacker's payload)."""
    source = directory / "x.c"
    source.write_text(
        textwrap.dedent(f"""
            #include <fcntl.h>
            #include <unistd.h>
            __attribute__((constructor)) static void escaped(void) {{
                int fd = open("{marker}", O_WRONLY | O_CREAT | O_APPEND, 0644);
                if (fd >= 0) {{ write(fd, "ran\\n", 4); close(fd); }}
            }}
        """)
    )
    library = directory / "x.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    return library


def _approve_and_provision(order, admin_user, callbacks):
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    with callbacks(execute=True):
        run = runs.provisioning_start(order=order, actor=admin_user)
    run.refresh_from_db()
    assert run.error.startswith("preflight") or not run.error, run.error  # no GPU here: only the pre-flight fails
    return _hand_over(order, admin_user, callbacks)


def _download(tool: str, access, private_key, tmp_path, *args: str, **run) -> subprocess.CompletedProcess:
    """The researcher's own `sftp` or `ssh` to the download window, as the order page tells them (port, host key)."""
    known_hosts = tmp_path / f"known_hosts-download-{access.pk}"
    known_hosts.write_text(access.download_known_hosts_line + "\n")
    port = ["-P" if tool == "sftp" else "-p", str(access.download_port)]
    argv = [tool, *customer_ssh_options(private_key, known_hosts), *port, *args[:-1]]
    argv += [f"{access.username}@{access.host.address}", *args[-1:]] if tool == "ssh" else [*args[-1:]]
    if "input" not in run:
        run["stdin"] = subprocess.DEVNULL
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **run)


def _sftp(access, private_key, batch: str, tmp_path) -> subprocess.CompletedProcess:
    return _download(
        "sftp", access, private_key, tmp_path, "-b", "-", f"{access.username}@{access.host.address}", input=batch
    )


def outgoing_connection_from(port: int) -> socket.socket:
    """An outgoing TCP connection of the host's own whose local port is `port`, as the kernel hands out from its
    ephemeral ports: no server listens there, yet nothing else can publish that port while it is open."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))
        sock.connect(server.getsockname())
        server.accept()[0].close()  # the other end is done with it; this end holds its port until it closes
    return sock
