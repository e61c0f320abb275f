"""A researcher on a host that runs containers: `ssh user@host` lands in the order's container, made from the image
they chose, with their lot's GPUs only; files move in and out with scp, sftp and rsync; a local forward reaches a
server in the container; after teardown the login is refused and nothing of theirs runs. Against the real sshd on
loopback (configured with provisioning.steps.SSHD_MATCH_BLOCK), real podman with runc, and mknod stand-ins for
/dev/nvidia0..3."""

import os
import socket
import subprocess
import time
from decimal import Decimal

import pytest
from django.urls import reverse

from booking.models import Lot
from payments.selectors import current_invoice
from payments.services import invoice_mark_paid
from provisioning import services, steps
from provisioning.models import Access, Host, ProvisioningRun
from tests.booking.test_pages import place
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.django_db


def _provision(client, booking_data, keypair, admin_user, callbacks, name):
    private_key, public_key = keypair(name)
    order, token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    with callbacks(execute=True):
        services.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    order.token = token  # the order page's key, for the tests that read it
    return order, services.username_for(order), private_key


@pytest.fixture
def two_customers(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks
):
    """Two orders on the same container host: one gets GPUs 0,1, the other 2,3; each lot's share is 1.5 CPUs,
    2 GiB of memory and 1 GiB of /dev/shm."""
    Host.objects.filter(pk=container_host.pk).update(cpus_per_lot=Decimal("1.5"), memory_per_lot_gib=2, shm_size_gib=1)
    Lot.objects.create(
        name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host, gpu_indices="2,3"
    )
    made = []
    try:
        for name in ("alice", "bob"):
            made.append(_provision(client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, name))
        yield made
    finally:
        for _order, username, _key in made:
            remove_user(admin, username)


def test_the_login_lands_in_the_order_s_container_with_its_own_gpus_and_not_the_other_customer_s(
    two_customers, container_sshd, admin
):
    for order, username, private_key in two_customers:
        run = order.provisioning_runs.get()
        assert run.status == ProvisioningRun.Status.SUCCEEDED, run.error
        access = Access.objects.get(order=order)
        probe = (
            "hostname; id -un; ls /dev | grep '^nvidia' | tr '\\n' ' '; echo; ls /home; "
            "grep -c sleep /proc/1/cmdline; grep ^CapEff /proc/self/status"
        )
        result = container_sshd.login_as(username, private_key, probe)
        assert result.returncode == 0, result.stderr
        own = " ".join(f"nvidia{index}" for index in access.gpu_indices.split(",")) + " "
        # its own container, as its own user, its lot's two GPUs and no other, no other home, no capability
        assert result.stdout.splitlines() == [
            f"binome-{username}",
            username,
            own,
            username,
            "1",
            "CapEff:\t0000000000000000",
        ]
        # the pre-flight check ran inside the container too (its report names the container's hostname)
        assert access.preflight_report["hostname"] == f"binome-{username}"
        # and the container holds the lot's share of the host: CPUs, memory, /dev/shm
        shares = "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.ShmSize}}"
        limits = admin.run(["podman", "inspect", "--format", shares, f"binome-{username}"])
        assert limits.stdout.split() == ["1500000000", str(2 * 2**30), str(2**30)]
    assert {Access.objects.get(order=order).gpu_indices for order, _u, _k in two_customers} == {"0,1", "2,3"}


def test_the_customer_s_shell_rc_files_run_in_the_container_never_on_the_host(two_customers, container_sshd, admin):
    _order, username, private_key = two_customers[0]
    marker = f"/tmp/binome-escaped-{username}"  # noqa: S108 (a name to look for, on the host and inside)
    planted = container_sshd.login_as(username, private_key, f"echo 'touch {marker}' >> ~/.bashrc")
    assert planted.returncode == 0, planted.stderr
    # an interactive login (a terminal, no command) reads ~/.bashrc: inside the container, where /tmp is its own
    shell = subprocess.run(
        [
            "ssh",
            *container_sshd.client_options(private_key),
            "-tt",
            "-p",
            str(container_sshd.port),
            username + "@127.0.0.1",
        ],
        input="test -e " + marker + " && echo inside-$(hostname); exit\n",
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert f"inside-binome-{username}" in shell.stdout, shell.stdout + shell.stderr
    assert not os.path.exists(marker)  # the host never ran the customer's rc file
    # and the account cannot ask sudo for anything but the way into its container
    assert container_sshd.login_as(username, private_key, "sudo -n true").returncode != 0


def test_files_move_with_scp_sftp_and_rsync_and_a_local_forward_reaches_a_server_in_the_container(
    two_customers, container_sshd, admin, tmp_path
):
    _order, username, private_key = two_customers[0]
    options = container_sshd.client_options(private_key)
    target = f"{username}@127.0.0.1"
    payload = tmp_path / "weights.bin"
    payload.write_bytes(os.urandom(300_000))

    def run(argv):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{argv[0]}: {result.stderr}"
        return result

    # scp (SFTP protocol) in, then out under another name
    run(["scp", *options, "-P", str(container_sshd.port), str(payload), f"{target}:weights.bin"])
    run(["scp", *options, "-P", str(container_sshd.port), f"{target}:weights.bin", str(tmp_path / "back.bin")])
    assert (tmp_path / "back.bin").read_bytes() == payload.read_bytes()
    # sftp, batch mode
    batch = tmp_path / "batch"
    batch.write_text("mkdir runs\nput " + str(payload) + " runs/copy.bin\nls runs\n")
    listed = run(["sftp", *options, "-P", str(container_sshd.port), "-b", str(batch), target])
    assert "copy.bin" in listed.stdout
    # rsync over ssh
    shell = " ".join(["ssh", *options, "-p", str(container_sshd.port)])
    run(["rsync", "-a", "-e", shell, str(payload), f"{target}:synced.bin"])
    sums = container_sshd.login_as(username, private_key, "cd && sha256sum weights.bin runs/copy.bin synced.bin")
    assert len({line.split()[0] for line in sums.stdout.splitlines()}) == 1, sums.stdout
    # the same files, seen from the host: the home the container mounts
    home = admin.run(["getent", "passwd", username]).stdout.split(":")[5]
    assert admin.run(["stat", "-c", "%U %a", f"{home}/synced.bin"]).stdout.split()[0] == username

    # a server in the container (Jupyter, TensorBoard...), reached through a local forward to the host's loopback
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    container_sshd.login_as(
        username,
        private_key,
        f"cd && echo served-from-container > index.html && "
        f"nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &",
    )
    deadline, answer = time.monotonic() + 15, ""
    while time.monotonic() < deadline and "served-from-container" not in answer:
        forward = subprocess.run(
            ["ssh", *options, "-p", str(container_sshd.port), "-W", f"localhost:{port}", target],
            input="GET /index.html HTTP/1.0\r\n\r\n",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        answer = forward.stdout
        time.sleep(0.2)
    assert "served-from-container" in answer


def test_after_teardown_the_login_is_refused_the_container_is_gone_and_nothing_of_the_user_runs(
    two_customers, container_sshd, admin, django_capture_on_commit_callbacks, admin_user
):
    order, username, private_key = two_customers[0]
    container_sshd.login_as(username, private_key, "nohup sleep 600 >/dev/null 2>&1 &")
    assert admin.run(["pgrep", "-u", username], check=False).ok  # a process of theirs runs, in the container

    with django_capture_on_commit_callbacks(execute=True):
        services.teardown_start(order=order, actor=admin_user, reason="test")
    teardown = order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN)
    assert teardown.status == ProvisioningRun.Status.SUCCEEDED, teardown.error
    assert teardown.steps.get(name="remove_container").output == f"container binome-{username} removed"

    assert container_sshd.login_as(username, private_key, "true").returncode != 0
    assert not admin.run(["podman", "container", "exists", f"binome-{username}"], check=False).ok
    assert not admin.run(["pgrep", "-u", username], check=False).ok
    assert not admin.run(["test", "-e", f"{steps.KEYS_DIR}/{username}"], check=False).ok
    # the other customer's container is untouched
    other = two_customers[1][1]
    assert (
        admin.run(
            ["podman", "container", "inspect", "--format", "{{.State.Running}}", f"binome-{other}"]
        ).stdout.strip()
        == "true"
    )


def test_the_order_page_tells_the_researcher_they_land_in_a_container_of_their_image(
    client, two_customers, admin_user, django_capture_on_commit_callbacks
):
    order, _username, _key = two_customers[0]
    with django_capture_on_commit_callbacks(execute=True):  # no GPU here: the operator hands over anyway
        services.provisioning_hand_over(order=order, actor=admin_user, reason="test machine without GPU")
    url = reverse("booking:order", kwargs={"public_id": order.public_id, "token": order.token})
    english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert f"You land in a container of {order.environment.name}" in english
    assert "set at login" not in english  # the host-account wording is for hosts without containers
    french = client.get(url, HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert f"Vous arrivez dans un conteneur {order.environment.name}" in french
