"""Removing a key ends what it opened (issue 33), tried as the thief of a researcher's laptop: the laptop holds an
open shell, a port forward and an SFTP session (an sshfs-like client: paramiko's SFTP, reading files) when the
researcher removes its key from the order page; during the window and in the download window after the end, every
one of them ends within a minute and the key logs in nowhere. On the real harness (the test sshd as the host,
podman with runc)."""

import socket
import subprocess
import time

import paramiko
import pytest
from django.urls import reverse

from booking.services import order_end_early
from provisioning import rules
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _approve_and_provision
from tests.builders.orders import place
from tests.provisioning.conftest import _free_port, customer_ssh, customer_ssh_options, remove_user

pytestmark = pytest.mark.django_db

WITHIN = 60  # seconds: what the issue asks, the bound each wait below allows


def _laptop_key(order, laptop_public: str):
    return next(key for key in order.ssh_keys.all() if laptop_public.split()[1] in key.public_key)


def _ssh(access, key, known_hosts, *args: str) -> subprocess.Popen:
    known_hosts.write_text(access.known_hosts_line + "\n")
    argv = ["ssh", *customer_ssh_options(key, known_hosts), "-p", str(access.ssh_port), *args]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _open_shell(access, key, tmp_path) -> subprocess.Popen:
    """An interactive terminal (-tt), its first line read: the session is open."""
    shell = _ssh(access, key, tmp_path / "known_hosts_shell", "-tt", f"{access.username}@{access.host.address}",
                 "echo thief-in; exec sleep 3600")  # fmt: skip
    assert shell.stdout.readline().strip() == "thief-in"
    return shell


def _open_forward(access, key, tmp_path) -> tuple[subprocess.Popen, int]:
    """`ssh -N -L`: a local port forwarded to the container's own SSH server, answered through the tunnel."""
    local = _free_port()
    forward = _ssh(access, key, tmp_path / "known_hosts_forward", "-N", "-o", "ExitOnForwardFailure=yes",
                   "-L", f"127.0.0.1:{local}:127.0.0.1:2222", f"{access.username}@{access.host.address}")  # fmt: skip
    for _attempt in range(100):
        try:
            with socket.create_connection(("127.0.0.1", local), timeout=5) as tunnel:
                assert tunnel.recv(8) == b"SSH-2.0-"
                return forward, local
        except ConnectionRefusedError:
            time.sleep(0.1)
    raise AssertionError("the forward never opened")


def _open_sftp(host: str, port: int, username: str, key) -> paramiko.SFTPClient:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # noqa: S507 (a thief checks no host key)
    client.connect(host, port=port, username=username, key_filename=str(key), look_for_keys=False, allow_agent=False)
    return client.open_sftp()


def _sftp_ended(sftp: paramiko.SFTPClient) -> bool:
    """Whether the session ended within WITHIN seconds: every read until then is answered, then none is."""
    deadline = time.monotonic() + WITHIN
    while time.monotonic() < deadline:
        try:
            sftp.listdir(".")
        except (OSError, EOFError, paramiko.SSHException):
            return True
        time.sleep(0.2)
    return False


def _ended(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=WITHIN)
    except subprocess.TimeoutExpired:
        return False
    return True


def _remove_key_from_the_order_page(client, order, token, key, callbacks) -> str:
    url = reverse("customer:order-keys", kwargs={"public_id": order.public_id, "token": token})
    with callbacks(execute=True):
        return client.post(url, {"remove": str(key.pk)}, follow=True).content.decode()


def test_a_key_removed_during_the_window_ends_its_shell_forward_and_sftp(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, tmp_path,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    ada_key, ada_public = keypair("ada")
    laptop_key, laptop_public = keypair("laptop")
    order, token = place(client, booking_data(lots="1", days="3", ssh_keys=f"{ada_public}\n{laptop_public}"))
    opened = []
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        customer_ssh(access, ada_key, "echo results > ~/results.txt")
        # given the thief of the laptop holds a terminal, a tunnel and an SFTP session reading the files
        shell = _open_shell(access, laptop_key, tmp_path)
        forward, local = _open_forward(access, laptop_key, tmp_path)
        sftp = _open_sftp(access.host.address, access.ssh_port, access.username, laptop_key)
        opened += [shell, forward]
        assert "results.txt" in sftp.listdir(".")

        # when the researcher removes the laptop's key from the order page
        removed_at = time.monotonic()
        page = _remove_key_from_the_order_page(client, order, token, _laptop_key(order, laptop_public), callbacks)
        assert "every session open there (shells, forwards, SFTP) is closed" in page

        # then the terminal, the tunnel and the SFTP session end within a minute, and the key opens nothing new
        assert _ended(shell) and _ended(forward) and _sftp_ended(sftp)
        print(f"window: the thief's sessions ended {time.monotonic() - removed_at:.1f} s after the removal")
        with pytest.raises(ConnectionRefusedError):  # the tunnel is gone with its session
            socket.create_connection(("127.0.0.1", local), timeout=5)
        assert customer_ssh(access, laptop_key, "true").returncode != 0
        run = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).first()
        assert [step.name for step in run.steps.all()] == ["connect", "install_keys", "end_sessions", "start_ssh"]
        assert run.status == ProvisioningRun.Status.SUCCEEDED, run.error
        # the researcher logs in again with the key they kept, to their files
        assert customer_ssh(access, ada_key, "cat ~/results.txt").stdout.strip() == "results"
    finally:
        for process in opened:
            process.kill()
        remove_user(admin, rules.username_for(order))


def test_a_key_removed_after_the_end_ends_its_sftp_session_in_the_download_window(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks
):
    callbacks = django_capture_on_commit_callbacks
    ada_key, ada_public = keypair("ada")
    laptop_key, laptop_public = keypair("laptop")
    order, token = place(client, booking_data(lots="1", days="3", ssh_keys=f"{ada_public}\n{laptop_public}"))
    try:
        access = _approve_and_provision(order, admin_user, callbacks)
        customer_ssh(access, ada_key, "echo results > ~/results.txt")
        with callbacks(execute=True):
            order_end_early(order=order)
        access = Access.objects.select_related("host").get(pk=access.pk)
        assert access.download_port
        # given the thief's sshfs-like client reading the files in the download window after the end
        sftp = _open_sftp(access.host.address, access.download_port, access.username, laptop_key)
        with sftp.open("results.txt") as results:
            assert results.read() == b"results\n"

        # when the researcher removes the laptop's key from the order page
        removed_at = time.monotonic()
        _remove_key_from_the_order_page(client, order, token, _laptop_key(order, laptop_public), callbacks)

        # then the session ends within a minute, and the key reads nothing more
        assert _sftp_ended(sftp)
        print(f"download window: the thief's SFTP ended {time.monotonic() - removed_at:.1f} s after the removal")
        run = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.DOWNLOAD_KEYS).first()
        assert [step.name for step in run.steps.all()] == ["connect", "open_download", "end_sessions"]
        assert "session process(es) killed" in run.steps.get(name="end_sessions").output
        with pytest.raises(paramiko.AuthenticationException):
            _open_sftp(access.host.address, access.download_port, access.username, laptop_key)
        # the researcher still reads their files with the key they kept
        kept = _open_sftp(access.host.address, access.download_port, access.username, ada_key)
        assert "results.txt" in kept.listdir(".")
    finally:
        remove_user(admin, rules.username_for(order))
