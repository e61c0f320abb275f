"""A provider fault on a real host (the test sshd, podman with runc, mknod stand-ins for /dev/nvidia0..3): an order
moved to other cards of the same host keeps its files, its host key and its keys, and its new container holds only
the new cards."""

import pytest

from inventory.models import Lot
from provisioning import runs
from provisioning.models import Access, ProvisioningRun
from tests.provisioning.conftest import customer_ssh, remove_user
from tests.provisioning.test_container_access import _hand_over, _in, _provision

pytestmark = pytest.mark.django_db


def test_moved_to_other_cards_of_its_host_the_customer_finds_their_files_and_only_the_new_cards(
    client, container_host, catalog, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks
):
    order, username, private_key = _provision(
        client, booking_data, keypair, admin_user, django_capture_on_commit_callbacks, "moved"
    )
    try:
        access = _hand_over(order, admin_user, django_capture_on_commit_callbacks)
        # given the customer's checkpoint on GPUs 0,1, and a process of theirs running
        _in(access, private_key, "echo step-4200 > ~/checkpoint && ls /dev | grep ^nvidia | tr '\\n' ' '")
        spare = Lot.objects.create(
            name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host, gpu_indices="2,3"
        )
        held = order.allocations.get(released_at__isnull=True).lot

        # when GPU 1 fails and the operator moves the order to the host's other cards
        with django_capture_on_commit_callbacks(execute=True):
            runs.order_move(order=order, from_lot_id=held.pk, to_lot_id=spare.pk, actor=admin_user)

        move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
        assert move.status == ProvisioningRun.Status.SUCCEEDED, move.error
        moved = Access.objects.select_related("host").get(order=order)
        # then the same key logs in to the same host key (on the new cards' port, which the page and e-mail give)...
        assert moved.known_hosts_line.split()[1:] == access.known_hosts_line.split()[1:]
        assert moved.gpu_indices == "2,3" and moved.status == Access.Status.READY
        listing = _in(moved, private_key, "cat ~/checkpoint; ls /dev | grep ^nvidia | tr '\\n' ' '").stdout.split()
        # ...their checkpoint is there, and the container holds the new cards and not the failed ones
        assert listing == ["step-4200", "nvidia2", "nvidia3"]
        assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST).exists()
        # a key that is not theirs still gets nothing
        _other_key, _public = keypair("stranger")
        assert customer_ssh(moved, _other_key, "true").returncode != 0
    finally:
        remove_user(admin, username)
