"""A provider fault during a window (issue 21): the operator moves the order to other lots from the console, the new
lot is prepared and handed over before the old host is torn down, the time lost is given back as a longer window or
a pro-rata refund with its credit note, and the customer is e-mailed at both ends. On the demo's dry-run hosts; the
container and its data on a real host are in test_container_access.py."""

from datetime import timedelta
from decimal import Decimal

import pytest

from booking.models import OrderStatus
from inventory.models import Lot, MaintenanceWindow
from payments.models import FiscalInvoice, Refund
from provisioning.models import Access, ProvisioningRun
from tests.builders.console import act
from tests.builders.lots import free_lot, live_lots
from tests.builders.teardown import make_provisioned, mend, tick

pytestmark = pytest.mark.django_db
TURNAROUND = timedelta(hours=6)


@pytest.fixture
def active_order(client, paid_order, operator, clock, django_capture_on_commit_callbacks):
    """A 2-lot B200 order (3,150.00 a lot for 7 days), handed over on dry-run hosts, two days into its window; the
    operator is logged in to the console."""
    order, token = paid_order
    client.force_login(operator)
    for action in ("approve", "provision"):
        act(client, order, action, callbacks=django_capture_on_commit_callbacks)
    order.refresh_from_db()
    clock.now = order.starts_at + timedelta(days=2)
    tick(django_capture_on_commit_callbacks, clock.now)
    order.refresh_from_db()
    assert order.status == OrderStatus.ACTIVE
    return order, token


def submit_move(client, order, callbacks, from_lot, to_lot, *, hours_lost="0", credit="none"):
    """The console's "Move (provider fault)" form, submitted."""
    data = {"from_lot": from_lot, "to_lot": to_lot, "hours_lost": hours_lost, "credit": credit}
    return act(client, order, "move", data, callbacks)


def test_a_lot_moved_to_another_host_is_handed_over_before_the_old_host_is_torn_down(
    client,
    active_order,
    clock,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    # given an active 2-lot order on one host, whose host fails on one lot's cards
    order, _token = active_order
    (host,) = {lot.host for lot in live_lots(order).values()}
    failing, kept = sorted(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[host])
    end = order.ends_at
    mailoutbox.clear()

    # when the operator moves it, crediting the 10 hours lost as a longer window
    response = submit_move(
        client, order, django_capture_on_commit_callbacks, failing.pk, target.pk, hours_lost="10", credit="extension"
    )
    assert "move (the customer is e-mailed) done" in response.content.decode()

    # then the order runs on the kept lot and the new one, to a window 10 hours longer
    order.refresh_from_db()
    assert order.status == OrderStatus.ACTIVE and order.ends_at == end + timedelta(hours=10)
    assert set(live_lots(order)) == {kept.pk, target.pk}
    new = order.allocations.get(lot=target, released_at__isnull=True)
    assert new.starts_at == clock.now and new.ends_at == order.ends_at + TURNAROUND
    assert order.allocations.get(lot=failing).released_at == clock.now
    # the new host was prepared, checked and handed over in one run; the old host's container keeps only its lot
    move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
    assert move.status == ProvisioningRun.Status.SUCCEEDED, move.error
    assert move.steps.order_by("position").first().host == target.host
    assert "start_container" in move.steps.filter(host=host).values_list("name", flat=True)
    moved_access = Access.objects.get(order=order, host=target.host)
    assert moved_access.status == Access.Status.READY and moved_access.gpu_indices == target.gpu_indices
    assert Access.objects.get(order=order, host=host).gpu_indices == kept.gpu_indices
    # the host it still uses is not torn down: nothing was released
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST).exists()

    # and the customer was told where, that their files stay behind, the new end, then how to log in
    started, done = mailoutbox
    assert "moves to another machine" in started.subject
    assert target.host.name in started.body and "files are not carried over" in started.body
    assert order.ends_at.strftime("%Y-%m-%d %H:%M") in started.body and "10 hours lost" in started.body
    assert "ready on its new machine" in done.subject and moved_access.ssh_command in done.body
    reasons = list(order.events.values_list("reason", flat=True))
    assert "lot moved (provider fault)" in reasons and "moved: the new lots are handed over" in reasons


def test_the_only_lot_moved_elsewhere_leaves_the_old_host_torn_down_after_the_new_one_works(
    client, catalog, booking_data, admin_user, operator, mailoutbox, django_capture_on_commit_callbacks
):
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    order.__class__.objects.filter(pk=order.pk).update(language="fr")  # a French researcher: e-mails in French
    client.force_login(operator)
    (old,) = live_lots(order).values()
    mailoutbox.clear()
    target = free_lot(order, off_hosts=[old.host])
    act(client, order, "move", {"from_lot": old.pk, "to_lot": target.pk}, django_capture_on_commit_callbacks)

    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    release = order.provisioning_runs.get(kind=ProvisioningRun.Kind.RELEASE_HOST)
    move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
    assert release.status == ProvisioningRun.Status.SUCCEEDED and release.created_at >= move.finished_at
    assert Access.objects.get(order=order, host=old.host).status == Access.Status.REVOKED
    assert Access.objects.get(order=order, host=target.host).status == Access.Status.READY
    started, done = mailoutbox
    assert started.subject == f"Votre commande Binôme {order.public_id} change de machine"
    assert "vos fichiers ne sont pas transférés" in started.body and "rembours" not in started.body
    assert "prête sur sa nouvelle machine" in done.subject


def test_moved_to_other_cards_of_the_same_host_the_files_stay_and_nothing_is_torn_down(
    client, catalog, booking_data, admin_user, operator, mailoutbox, django_capture_on_commit_callbacks
):
    # given a ready 1-lot order, whose cards fail while the other lot of its host is free
    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    client.force_login(operator)
    (failing,) = live_lots(order).values()
    target = free_lot(order, on_host=failing.host)
    mailoutbox.clear()

    act(client, order, "move", {"from_lot": failing.pk, "to_lot": target.pk}, django_capture_on_commit_callbacks)

    # then the container is made again on the new cards of the same host, the volume kept, nothing torn down
    started, done = mailoutbox
    assert "your files stay where they are" in started.body and "processes stop" in started.body
    assert "ready on its new machine" in done.subject
    move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
    assert move.status == ProvisioningRun.Status.SUCCEEDED and {s.host for s in move.steps.all()} == {failing.host}
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RELEASE_HOST).exists()
    access = Access.objects.get(order=order, host=failing.host)
    assert access.status == Access.Status.READY and access.gpu_indices == target.gpu_indices


def test_the_hours_lost_are_refunded_pro_rata_with_a_credit_note(
    client, active_order, mailoutbox, django_capture_on_commit_callbacks
):
    # given an active order of 2 B200 lots for 7 days (6,300.00), one lot of which lost 24 hours
    order, _token = active_order
    failing = min(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[failing.host])
    end = order.ends_at

    submit_move(
        client, order, django_capture_on_commit_callbacks, failing.pk, target.pk, hours_lost="24", credit="refund"
    )

    # then a day of one lot of a 7-day window, 3,150.00 × 24 / 168 = 450.00, is owed back, at the invoice's rate
    (refund,) = Refund.objects.filter(order=order)
    assert refund.reason == Refund.Reason.PROVIDER_FAULT and refund.fiat_amount == Decimal("450.00")
    assert refund.status == Refund.Status.AWAITING_ADDRESS
    assert refund.amount_units == int(
        (Decimal("450.00") / refund.invoice.rate)
        .scaleb(refund.asset_decimals)
        .to_integral_value(rounding="ROUND_FLOOR")
    )
    # a credit note corrects the invoice by the same amount; the window's end is unchanged
    (note,) = FiscalInvoice.objects.filter(order=order, kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert note.total_gross == Decimal("450.00") and "provider fault" in note.reason
    order.refresh_from_db()
    assert order.ends_at == end
    subjects = [mail.subject for mail in mailoutbox]
    assert any("moves to another machine" in subject for subject in subjects)
    assert any("refund" in subject.lower() for subject in subjects)

    # a second fault on the same order cannot open a second refund on that invoice: nothing moves
    other = min(live_lots(order).values(), key=lambda lot: lot.name)
    elsewhere = free_lot(order, off_hosts=[other.host])
    before = set(live_lots(order))
    response = submit_move(
        client, order, django_capture_on_commit_callbacks, other.pk, elsewhere.pk, hours_lost="5", credit="refund"
    )
    assert "credit this time as a longer window" in response.content.decode()
    assert set(live_lots(order)) == before and Refund.objects.filter(order=order).count() == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"hours_lost": "-3", "credit": "extension"}, "hours_lost: a number is required"),
        ({"hours_lost": "x", "credit": "refund"}, "hours_lost: a number is required"),
        ({"hours_lost": "9999", "credit": "extension"}, "whole number from 0 to 168"),
        ({"hours_lost": "4", "credit": "gift"}, "Choose how the lost time is credited"),
        ({"hours_lost": "0", "credit": "refund"}, "Say how many hours were lost"),
        ({"to_lot": "own"}, "not free for the rest of this window"),
        ({"to_lot": "h200"}, "not free for the rest of this window"),
        ({"from_lot": "other"}, "not allocated to the order"),
    ],
)
def test_a_bad_move_is_answered_in_words_and_changes_nothing(
    client, active_order, catalog, data, message, mailoutbox, django_capture_on_commit_callbacks
):
    order, _token = active_order
    failing, kept = sorted(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[failing.host])
    lots = {
        "own": kept.pk,
        "h200": Lot.objects.filter(hardware_class=catalog["h200-pair"]).first().pk,
        "other": target.pk,
    }
    form = {"from_lot": failing.pk, "to_lot": target.pk, "hours_lost": "0", "credit": "none"}
    form.update({name: lots.get(value, value) for name, value in data.items()})
    before = (set(live_lots(order)), order.ends_at, order.events.count())
    mailoutbox.clear()

    response = act(client, order, "move", form, django_capture_on_commit_callbacks)

    assert response.status_code == 200 and message in response.content.decode()
    order.refresh_from_db()
    assert (set(live_lots(order)), order.ends_at, order.events.count()) == before
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE).exists() and not mailoutbox


def test_the_lost_time_cannot_be_given_as_a_longer_window_over_the_hosts_next_maintenance(
    client, active_order, django_capture_on_commit_callbacks
):
    # given the order's hosts in maintenance from an hour after its window (and its turnaround)
    order, _token = active_order
    failing, kept = sorted(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[failing.host])
    for host in {kept.host, target.host}:
        MaintenanceWindow.objects.create(
            host=host,
            starts_at=order.ends_at + TURNAROUND + timedelta(hours=1),
            ends_at=order.ends_at + timedelta(days=3),
            reason="firmware",
        )

    # then 24 hours cannot be added to the window, and nothing moves; a refund is the way
    response = submit_move(
        client, order, django_capture_on_commit_callbacks, failing.pk, target.pk, hours_lost="24", credit="extension"
    )
    assert "credit the lost time as a refund instead" in response.content.decode()
    assert failing.pk in live_lots(order)
    # one hour fits
    submit_move(
        client, order, django_capture_on_commit_callbacks, failing.pk, target.pk, hours_lost="1", credit="extension"
    )
    assert target.pk in live_lots(order)


def test_a_failed_move_leaves_the_order_on_its_old_host_until_a_retry_succeeds(
    client,
    active_order,
    unreachable,
    mailoutbox,
    django_capture_on_commit_callbacks,
):
    # given the new lot's host does not answer
    order, _token = active_order
    failing = min(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[failing.host])
    unreachable(target.host)
    mailoutbox.clear()

    act(client, order, "move", {"from_lot": failing.pk, "to_lot": target.pk}, django_capture_on_commit_callbacks)

    # then the move failed, the customer's access on the old host is untouched and no "ready" e-mail went out
    move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
    assert move.status == ProvisioningRun.Status.FAILED
    assert Access.objects.get(order=order, host=failing.host).status == Access.Status.READY
    assert "move failed" in order.events.last().reason
    assert [mail.subject for mail in mailoutbox if "ready on its new machine" in mail.subject] == []
    # a second move waits for nothing: the failed one is not under way; the operator retries it once the host mends
    mend(target.host)
    act(client, order, "retry", {"run": move.pk}, django_capture_on_commit_callbacks)
    move.refresh_from_db()
    assert move.status == ProvisioningRun.Status.SUCCEEDED
    assert Access.objects.get(order=order, host=target.host).status == Access.Status.READY
    assert any("ready on its new machine" in mail.subject for mail in mailoutbox)


def test_only_an_order_in_its_window_can_be_moved_so(client, paid_order, operator, django_capture_on_commit_callbacks):
    order, _token = paid_order
    client.force_login(operator)
    held = next(iter(live_lots(order).values()))
    target = free_lot(order, off_hosts=[held.host])
    response = act(
        client, order, "move", {"from_lot": held.pk, "to_lot": target.pk}, django_capture_on_commit_callbacks
    )
    assert "Only a ready or running window can be moved" in response.content.decode()
    assert held.pk in live_lots(order)


def test_a_failed_move_is_retried_by_the_sweep_until_a_later_move_replaces_it(
    client,
    active_order,
    clock,
    unreachable,
    django_capture_on_commit_callbacks,
):
    callbacks = django_capture_on_commit_callbacks
    order, _token = active_order
    failing = min(live_lots(order).values(), key=lambda lot: lot.name)
    target = free_lot(order, off_hosts=[failing.host])
    unreachable(target.host)
    act(client, order, "move", {"from_lot": failing.pk, "to_lot": target.pk}, callbacks)
    move = order.provisioning_runs.get(kind=ProvisioningRun.Kind.MOVE)
    assert move.status == ProvisioningRun.Status.FAILED and move.next_retry_at == clock.now + timedelta(minutes=1)
    # the lot it left is held for no one while the customer still works on it
    left = order.allocations.get(lot=failing)
    assert left.released_at is None and left.vacated_at == clock.now
    assert failing.pk not in live_lots(order)

    # the sweep retries it when due (and not before), the same run
    assert tick(callbacks, clock.advance(seconds=30))["retried"] == 0
    assert tick(callbacks, clock.advance(seconds=31))["retried"] == 1
    move.refresh_from_db()
    assert move.status == ProvisioningRun.Status.FAILED and move.attempts == 2
    assert order.events.filter(reason__startswith="move failed").count() == 1  # one note, not one per retry

    # the operator moves the lot elsewhere instead: the failed move is given up, never run again
    other = free_lot(order, off_hosts=[failing.host, target.host])
    act(client, order, "move", {"from_lot": target.pk, "to_lot": other.pk}, callbacks)
    move.refresh_from_db()
    assert move.given_up_at is not None and move.next_retry_at is None
    tick(callbacks, clock.advance(hours=2))
    move.refresh_from_db()
    assert move.attempts == 2
    later = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE).exclude(pk=move.pk).get()
    assert later.status == ProvisioningRun.Status.SUCCEEDED
    # the first host left was torn down: its lot is on sale again; the unreachable one keeps its lot until it is
    left.refresh_from_db()
    assert left.released_at is not None
    assert order.allocations.get(lot=target).released_at is None
