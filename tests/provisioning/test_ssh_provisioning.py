"""Provisioning for real: a host reached over SSH (Debian's sshd on 127.0.0.1), a customer who logs in with their
own key to their container and finds their GPUs, a teardown after which the same login is refused."""

import re
from datetime import UTC, timedelta
from urllib.parse import urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from inventory.models import Host
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import lifecycle, rules, runs, services, step_context
from provisioning.models import Access, OperatorSettings, ProvisioningRun
from provisioning.steps import PROVISION_STEPS
from tests.builders.orders import place
from tests.provisioning.conftest import remove_user, tenant_processes
from tests.provisioning.customer_ssh import login_as, provisioned  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_the_customer_logs_in_with_their_key_and_finds_their_gpus(provisioned, login_as, client):  # noqa: F811
    order, token, username, private_key = provisioned
    run = order.provisioning_runs.get(kind="provision")
    assert run.status == ProvisioningRun.Status.SUCCEEDED, run.error
    assert order.status == OrderStatus.READY
    # the environment's image was already in the host's podman store: used, not pulled (no registry here)
    assert run.steps.get(name="prepare_image").output.startswith(
        f"podman: {order.environment.image_ref} already present, pinned sha256:"
    )

    whoami = login_as(
        username, private_key, "whoami; ls /dev | grep ^nvidia; stat -c %U /opt/binome/ssh/authorized_keys"
    )
    assert whoami.returncode == 0, whoami.stderr
    # the keys file is host root's: nobody's inside the tenant's user namespace, which cannot change it
    assert whoami.stdout.split() == [username, "nvidia0", "nvidia1", "nobody"]

    access = Access.objects.get(order=order)
    # No GPU on the test machine: a well-formed report that fails with reasons, not a crash.
    assert access.preflight_status == "FAIL"
    assert {check["name"] for check in access.preflight_report["checks"]} >= {"gpu_visible", "torch_import"}
    page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token}))
    assert f"ssh -p {access.ssh_port} {username}@127.0.0.1" in page.content.decode()


def test_after_teardown_the_same_login_is_refused_nothing_of_the_user_runs_and_files_go_after_the_grace_period(
    provisioned,  # noqa: F811
    login_as,  # noqa: F811
    admin,
    admin_user,
    django_capture_on_commit_callbacks,
):
    order, _token, username, private_key = provisioned
    # given a customer who left work running in the background
    left = login_as(username, private_key, "setsid nohup sleep 600 >/dev/null 2>&1 < /dev/null & echo started")
    assert left.stdout.strip() == "started", left.stderr
    assert tenant_processes(admin, username)

    # when the access is torn down
    with django_capture_on_commit_callbacks(execute=True):
        runs.teardown_start(order=order, actor=admin_user, reason="test")

    # then the login is refused, no process of the user remains, the keys are gone, the data volume is kept
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED
    teardown = order.provisioning_runs.get(kind="teardown")
    assert teardown.status == ProvisioningRun.Status.SUCCEEDED, teardown.error
    assert login_as(username, private_key, "true").returncode != 0
    assert not tenant_processes(admin, username)
    assert admin.run(["cat", f"{step_context.KIT_ROOT}/{username}/ssh/authorized_keys"]).stdout == ""
    volume = f"binome-{username}-data"
    assert admin.run(["podman", "volume", "exists", volume], check=False).ok
    access = Access.objects.get(order=order)
    assert access.status == Access.Status.REVOKED and access.wiped_at is None

    # and the files are deleted once the announced grace period (7 days by default) has passed
    assert lifecycle.lifecycle_tick(now=order.ends_at + timedelta(days=6))["wiped"] == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.lifecycle_tick(now=order.ends_at + timedelta(days=7, minutes=1))["wiped"] == 1
    wipe = order.provisioning_runs.get(kind="wipe")
    assert wipe.status == ProvisioningRun.Status.SUCCEEDED, wipe.error
    assert not admin.run(["id", "-u", username], check=False).ok
    assert not admin.run(["podman", "volume", "exists", volume], check=False).ok
    assert not admin.run(["test", "-e", f"{step_context.VOLUME_ROOT}/{username}.ext4"], check=False).ok
    assert not admin.run(["test", "-e", f"{step_context.KIT_ROOT}/{username}"], check=False).ok
    access.refresh_from_db()
    assert access.wiped_at is not None
    assert lifecycle.lifecycle_tick(now=order.ends_at + timedelta(days=8))["wiped"] == 0


def test_the_end_of_window_email_offers_the_download_window_and_the_carry_until_the_wipe(
    client, catalog, booking_data, mailoutbox
):
    order, _token = place(client, booking_data(lots="1"))
    operator_settings = OperatorSettings.current()
    operator_settings.wipe_after_days = 3
    operator_settings.save()

    lifecycle.end_warning_send(order=order, kind="24h")

    wipe = (order.ends_at + timedelta(days=3)).strftime("%Y-%m-%d %H:%M")
    body = " ".join(mailoutbox[-1].body.split())
    assert "your files stay on the machine for 3 days, read-only: download them by SFTP" in body
    assert "Book again with my data" in body and f"They are deleted for good on {wipe} UTC" in body
    # it offers the extension, through a fresh link that opens the order page
    link = re.search(r"https?://\S+/orders/\S+/", mailoutbox[-1].body).group(0)
    assert "Extend the window" in mailoutbox[-1].body
    page = client.get(urlsplit(link).path)
    assert page.status_code == 200 and order.public_id in page.content.decode()


def test_a_wrong_host_key_fails_the_run_with_a_reason_and_a_retry_resumes_it(
    client, loopback_host, booking_data, keypair, admin_user, admin, sshd, django_capture_on_commit_callbacks
):
    _private, public_key = keypair("customer")
    order, _token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    Host.objects.filter(pk=loopback_host.pk).update(host_key=keypair("impostor")[1])
    try:
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_start(order=order, actor=admin_user)
        order.refresh_from_db()
        run = order.provisioning_runs.get(kind="provision")
        assert order.status == OrderStatus.PROVISIONING_FAILED
        assert "host key" in run.error.lower()

        Host.objects.filter(pk=loopback_host.pk).update(host_key=sshd.host_key_line)
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_retry(order=order, actor=admin_user)
        order.refresh_from_db()
        run.refresh_from_db()
        assert run.status == ProvisioningRun.Status.SUCCEEDED
        assert rules.awaits_preflight_decision(order)  # no GPU here: the check fails, an operator decides
        assert [step.attempts for step in run.steps.all()] == [2] + [1] * (len(PROVISION_STEPS) - 1)  # connect twice
    finally:
        remove_user(admin, rules.username_for(order))


@pytest.mark.integration
def test_a_worker_killed_mid_run_is_replaced_and_the_run_completes_with_each_step_done_once(
    loopback_host, booking_data, keypair, admin_user, start_celery_worker, tmp_path, sshd, fake_gpus
):
    import os
    import signal
    import time

    from django.test import Client

    from provisioning.drivers import get_driver

    # A container runtime that takes its time, so the worker can be killed while it pulls.
    (tmp_path / "slow").mkdir()
    slow_runtime = tmp_path / "slow" / "podman"  # podman itself, but its image is never there and a pull is slow
    slow_runtime.write_text(
        f'#!/bin/sh\n[ "$1" = --runtime ] && shift 2\n'
        f'case "$1 $2" in "image inspect") [ -e {tmp_path}/pulled ] || exit 1 ;; esac\n'
        f'[ "$1" = pull ] && {{ sleep 4; touch {tmp_path}/pulled; echo pulled "$2"; exit 0; }}\n'
        'exec podman --runtime runc "$@"\n'
    )
    slow_runtime.chmod(0o755)
    Host.objects.filter(pk=loopback_host.pk).update(container_runtime=str(slow_runtime))
    _private, public_key = keypair("customer")
    client = Client()
    order, _token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    worker_env = {
        "PROVISIONING_SSH_KEY_FILE": str(sshd.host_spec.client_key_path),
        "PROVISIONING_LEASE_SECONDS": "3",
        "PROVISIONING_DEVICE_DIR": str(fake_gpus),
    }
    first = start_celery_worker(**worker_env)
    try:
        run = runs.provisioning_start(order=order, actor=admin_user)  # committed: the worker picks it up
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not run.steps.filter(name="prepare_image", status="running").exists():
            time.sleep(0.05)
        assert run.steps.filter(name="prepare_image", status="running").exists()

        os.killpg(first.pid, signal.SIGKILL)  # the worker dies in the middle of the run
        first.wait(timeout=10)
        start_celery_worker(**worker_env)
        time.sleep(3.5)  # the dead worker's lease runs out ...
        lifecycle.lifecycle_tick()  # ... and beat's sweep hands the run to the new worker

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.status in (ProvisioningRun.Status.SUCCEEDED, ProvisioningRun.Status.FAILED):
                break
            time.sleep(0.1)
        assert run.status == ProvisioningRun.Status.SUCCEEDED, run.error
        attempts = {step.name: step.attempts for step in run.steps.all()}
        assert attempts == {
            "connect": 1,
            "prepare_host": 1,
            "create_user": 1,
            "prepare_data": 1,
            "prepare_image": 2,
            "start_container": 1,
            "preflight": 1,
        }
        assert " created (" in run.steps.get(name="create_user").output  # made once, not "already exists"
        order.refresh_from_db()
        assert rules.awaits_preflight_decision(order)  # no GPU here: the check fails, an operator decides
    finally:
        with get_driver("ssh").connect(sshd.host_spec) as connection:
            remove_user(connection, rules.username_for(order))


def test_every_key_is_restricted_and_forwards_reach_the_container_s_network_not_the_host_s_loopback(
    provisioned,  # noqa: F811
    login_as,  # noqa: F811
    admin,
    sshd,
):
    order, _token, username, private_key = provisioned
    keys = admin.run(["cat", f"{step_context.KIT_ROOT}/{username}/ssh/authorized_keys"]).stdout.splitlines()
    expiry = Access.objects.get(order=order).keys_expire_at.astimezone(UTC).strftime("%Y%m%d%H%M%SZ")
    assert keys and all(line.startswith("restrict,pty,port-forwarding,") for line in keys)
    assert all(f'expiry-time="{expiry}"' in line for line in keys)
    # the host's own sshd listens on the host's loopback: a forward from the container does not reach it
    forward = login_as(username, private_key, None, options=["-W", f"127.0.0.1:{sshd.port}"])
    assert not forward.stdout.startswith("SSH-2.0-")


def test_a_key_past_its_expiry_time_is_refused_without_any_teardown_and_an_extension_renews_it(
    provisioned,  # noqa: F811
    login_as,  # noqa: F811
    admin,
    django_capture_on_commit_callbacks,
):
    order, _token, username, private_key = provisioned
    assert login_as(username, private_key, "true").returncode == 0

    # given the keys written with an expiry-time already past (the window's end plus the grace period)
    now = timezone.now()
    Order.objects.filter(pk=order.pk).update(starts_at=now - timedelta(days=3), ends_at=now - timedelta(minutes=61))
    with django_capture_on_commit_callbacks(execute=True):
        renewal = runs.access_keys_renew(order=order)
    renewal.refresh_from_db()
    assert renewal.status == ProvisioningRun.Status.SUCCEEDED, renewal.error

    # then the container's sshd refuses the key, while the container runs on and no teardown ran
    refused = login_as(username, private_key, "true")
    assert refused.returncode != 0
    running = ["podman", "container", "inspect", "--format", "{{.State.Running}}", f"binome-{username}"]
    assert admin.run(running).stdout.strip() == "true"
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN).exists()

    # when the window is extended, the lifecycle sweep writes the new end into the keys, and the login works again
    Order.objects.filter(pk=order.pk).update(ends_at=timezone.now() + timedelta(days=7))
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.lifecycle_tick()["keys_renewed"] == 1
    assert login_as(username, private_key, "true").returncode == 0
    assert lifecycle.lifecycle_tick()["keys_renewed"] == 0


def test_a_key_added_during_the_window_logs_in_after_one_keys_run_and_a_removed_one_is_refused(
    provisioned,  # noqa: F811
    login_as,  # noqa: F811
    keypair,
    client,
    django_capture_on_commit_callbacks,
):
    order, token, username, private_key = provisioned
    collaborator_key, collaborator_public = keypair("collaborator")
    assert login_as(username, collaborator_key, "true").returncode != 0  # not yet
    keys_url = reverse("customer:order-keys", kwargs={"public_id": order.public_id, "token": token})

    with django_capture_on_commit_callbacks(execute=True):
        client.post(keys_url, {"ssh_keys": collaborator_public})
    run = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).first()
    assert run.status == ProvisioningRun.Status.SUCCEEDED, run.error
    assert login_as(username, collaborator_key, "whoami").stdout.strip() == username
    assert login_as(username, private_key, "true").returncode == 0  # the first key still logs in

    first = order.ssh_keys.order_by("pk").first()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(keys_url, {"remove": str(first.pk)})
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).first().status == "succeeded"
    assert login_as(username, private_key, "true").returncode != 0  # the lost laptop's key is refused
    assert login_as(username, collaborator_key, "true").returncode == 0
