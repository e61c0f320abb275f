"""A provider fault on a real host (the test sshd, podman with runc, mknod stand-ins for /dev/nvidia0..3): an order
moved to other cards of the same host keeps its files, its host key and its keys, and its new container holds only
the new cards. A move that fails (the new cards are held on the host) keeps the lot it left off sale, the customer
working where they are, and is retried with backoff until it succeeds or an operator gives it up."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import Allocation
from inventory.models import Lot
from provisioning import hosts, moves
from provisioning.models import Access, ProvisioningRun
from tests.builders.containers import _hand_over, _in, _nvidia_nodes, _provision, _remove_container, _stray_container
from tests.builders.teardown import tick
from tests.provisioning.conftest import customer_ssh, remove_user

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
            moves.order_move(order=order, from_lot_id=held.pk, to_lot_id=spare.pk, actor=admin_user)

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


@pytest.fixture
def spare(container_host, catalog) -> Lot:
    """The container host's other lot, GPUs 2,3: where the operator moves an order whose cards fail."""
    return Lot.objects.create(
        name="containers · GPUs 2,3", hardware_class=catalog["b200-pair"], host=container_host, gpu_indices="2,3"
    )


def test_a_failed_move_keeps_the_old_lot_off_sale_and_is_retried_until_it_succeeds(
    client, container_host, spare, booking_data, keypair, admin_user, operator, admin, test_image, fake_gpus,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    made, stray = [], ""
    try:
        # given Alice's window on GPUs 0,1, with a checkpoint of hers
        alice, alice_user, alice_key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
        made.append(alice_user)
        access = _hand_over(alice, admin_user, callbacks)
        _in(access, alice_key, "echo step-4200 > ~/checkpoint")
        old = alice.allocations.get().lot
        # and GPU 2 of the spare lot held by a container nobody booked
        stray = _stray_container(test_image, fake_gpus, 2)

        # when GPU 1 fails and the operator moves Alice to GPUs 2,3
        with callbacks(execute=True):
            moves.order_move(order=alice, from_lot_id=old.pk, to_lot_id=spare.pk, actor=admin_user)

        # then the move fails before anything of Alice's is touched: the new cards are not free on the host
        move = alice.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
        assert move.status == ProvisioningRun.Status.FAILED
        assert f"GPU 2 held by {stray} (running)" in move.error, move.error
        assert _nvidia_nodes(access, alice_key) == ["nvidia0", "nvidia1"]  # she works on, in her container
        # the lot she left is held for no one: Mallory, booking the same dates, finds it sold out
        vacated = Allocation.objects.get(order=alice, lot=old)
        assert vacated.released_at is None and vacated.vacated_at is not None
        mallory = client.post(reverse("customer:book"), booking_data(lots="1", contact_email="mallory@example.org"))
        assert mallory.status_code == 200 and "Sold out for these dates" in mallory.content.decode()

        # the sweep retries the move with backoff; it keeps failing while the cards are held, and says so
        first_retry = move.next_retry_at
        tick(callbacks, first_retry + timedelta(seconds=1))
        move.refresh_from_db()
        assert move.status == ProvisioningRun.Status.FAILED and move.attempts == 2
        assert move.next_retry_at - move.finished_at == timedelta(minutes=2)  # twice as far as the first time
        assert first_retry - alice.events.get(reason__startswith="move failed").created_at <= timedelta(minutes=1)
        client.force_login(operator)
        queue = client.get(reverse("console:queue")).content.decode()
        failing = queue.split('id="section-failing-teardowns"')[1].split("</section>")[0]
        assert alice.public_id in failing and "Move to other lots" in failing and stray in failing
        assert "Stop retrying" in failing
        client.logout()

        # when the stray container goes, the next retry succeeds
        _remove_container(stray)
        tick(callbacks, move.next_retry_at + timedelta(seconds=1))
        move.refresh_from_db()
        assert move.status == ProvisioningRun.Status.SUCCEEDED, move.error
        moved = Access.objects.select_related("host").get(order=alice)
        assert _nvidia_nodes(moved, alice_key) == ["nvidia2", "nvidia3"]
        assert _in(moved, alice_key, "cat ~/checkpoint").stdout.strip() == "step-4200"
        # and the lot she left is on sale again: no container of hers holds GPUs 0,1 any more
        vacated.refresh_from_db()
        assert vacated.released_at is not None
        mallory, mallory_user, mallory_key = _provision(client, booking_data, keypair, admin_user, callbacks, "mallory")
        made.append(mallory_user)
        assert mallory.allocations.get().lot == old
        mallory_access = _hand_over(mallory, admin_user, callbacks)
        assert _nvidia_nodes(mallory_access, mallory_key) == ["nvidia0", "nvidia1"]

        # the host check lists each container with its cards, and no card held twice
        report = hosts.host_check(host=container_host, device_dir=str(fake_gpus)).finding.report
        assert f"container binome-{alice_user} (running): GPU 2, 3" in report
        assert f"container binome-{mallory_user} (running): GPU 0, 1" in report
        assert "held by 2 containers" not in report
    finally:
        _remove_container(stray)
        for username in made:
            remove_user(admin, username)


def test_a_move_given_up_by_an_operator_is_not_retried(
    client, container_host, spare, booking_data, keypair, admin_user, operator, admin, test_image, fake_gpus,
    django_capture_on_commit_callbacks,
):  # fmt: skip
    callbacks = django_capture_on_commit_callbacks
    made, stray = [], ""
    try:
        alice, alice_user, _key = _provision(client, booking_data, keypair, admin_user, callbacks, "alice")
        made.append(alice_user)
        _hand_over(alice, admin_user, callbacks)
        stray = _stray_container(test_image, fake_gpus, 3)
        with callbacks(execute=True):
            moves.order_move(order=alice, from_lot_id=alice.allocations.get().lot_id, to_lot_id=spare.pk,
                            actor=admin_user)  # fmt: skip
        move = alice.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
        assert move.status == ProvisioningRun.Status.FAILED

        client.force_login(operator)
        url = reverse("console:action", kwargs={"public_id": alice.public_id, "action": "give_up_move"})
        refused = client.post(url, {"run": move.pk, "reason": "  "}, follow=True).content.decode()
        assert "Say why the move is given up" in refused
        decided = client.post(url, {"run": move.pk, "reason": "GPU 3 is out for repair"}, follow=True)
        assert "decision on the failed move (not retried any more) done" in decided.content.decode()

        _remove_container(stray)
        assert tick(callbacks, timezone.now() + timedelta(hours=2))["retried"] == 0
        move.refresh_from_db()
        assert move.status == ProvisioningRun.Status.FAILED and move.given_up_at is not None
        assert "move given up: GPU 3 is out for repair" in alice.events.values_list("reason", flat=True)
        queue = client.get(reverse("console:queue")).content.decode()
        assert 'id="section-failing-teardowns"' not in queue
        again = client.post(
            reverse("console:action", kwargs={"public_id": alice.public_id, "action": "retry"}), {"run": move.pk},
            follow=True,
        )  # fmt: skip
        assert "This run was given up" in again.content.decode()
    finally:
        _remove_container(stray)
        for username in made:
            remove_user(admin, username)
