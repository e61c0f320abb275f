"""The restart watch's count (provisioning/restarts.py), tried as a hostile customer who stops their container at will
(root inside: `kill 1`) and changes their keys from the order page, so that each change starts it again outside the
watch's backoff and ceiling (red team of issue 33, F4). One order on the test host, against the real sshd on loopback
and podman with runc (tests/provisioning/conftest)."""

import subprocess

import pytest
from django.utils import timezone

from booking.ssh_keys import parse_authorized_keys
from provisioning import restarts, services
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _hand_over, _provision
from tests.provisioning.conftest import customer_ssh, remove_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(client, container_host, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks):
    """One order on the test host, handed over: (order, access, private key)."""
    callbacks = django_capture_on_commit_callbacks
    order, username, key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
    try:
        yield order, _hand_over(order, admin_user, callbacks), key
    finally:
        remove_user(admin, username)


def _state(admin, access) -> str:
    return admin.run(["podman", "inspect", "--format", "{{.State.Status}}", f"binome-{access.username}"]).stdout.strip()


def test_a_key_change_does_not_restart_a_stopped_container_outside_the_watch_s_backoff(
    alice, admin, keypair, django_capture_on_commit_callbacks
):
    """kill 1 then a key change, in a loop (20 key changes an hour per order, the view's rate limit): each keys run
    leaves the stopped container to the watch, which alone starts it again, counted under its backoff and ceiling."""
    callbacks = django_capture_on_commit_callbacks
    order, access, key = alice
    _spare_private, spare_public = keypair("spare")
    spare = parse_authorized_keys(spare_public)
    customer_ssh(access, key, "kill 1", user="root")
    for round_ in range(6):
        for _attempt in range(100):
            if _state(admin, access) != "running":
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert _state(admin, access) != "running"
        with callbacks(execute=True):  # as the order page's key form does
            if round_ % 2 == 0:
                services.access_keys_change(order=order, add=spare, remove_ids=[])
            else:
                removed = order.ssh_keys.get(public_key__contains=spare_public.split()[1])
                services.access_keys_change(order=order, add=[], remove_ids=[removed.pk])
        keys = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).order_by("-pk").first()
        assert keys.status == ProvisioningRun.Status.SUCCEEDED, keys.error  # the keys are written all the same
        assert "left to the watch" in keys.steps.get(name="start_ssh").output
        customer_ssh(access, key, "kill 1", user="root")  # nothing answers: the container is still stopped
    access.refresh_from_db()
    assert _state(admin, access) != "running" and access.restarts == 0

    # the watch starts it again, counted: the first restart of its count, with the keys of the last change
    with callbacks(execute=True):
        assert restarts.containers_watch(now=timezone.now()).get("restarted") == 1
    assert _state(admin, access) == "running"
    assert Access.objects.get(pk=access.pk).restarts == 1
    assert customer_ssh(access, key, "true").returncode == 0
