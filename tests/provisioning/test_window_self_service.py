"""The window is the customer's: extending it from the order page (the lots held while the extension is paid) and
ending it early (access torn down, the cards back on sale)."""

import html
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking import services as booking_services
from booking.models import Order, OrderStatus
from payments.models import Invoice
from payments.settlement import invoice_mark_paid
from provisioning import runs
from provisioning.models import ProvisioningRun

TURNAROUND = timedelta(hours=6)


def urls(order: Order, token: str) -> dict[str, str]:
    kwargs = {"public_id": order.public_id, "token": token}
    return {name: reverse(f"customer:{name}", kwargs=kwargs) for name in ("order", "order-extend", "order-end")}


def held_until(order: Order) -> set:
    return set(order.allocations.filter(released_at__isnull=True).values_list("ends_at", flat=True))


def test_a_customer_extends_from_the_order_page_and_the_lots_wait_for_the_payment(client, ready_order, admin_user):
    order, token = ready_order
    end = order.ends_at
    page = client.get(urls(order, token)["order"]).content.decode()
    assert "Extend and pay" in page and "3 more days: 2900.00" in " ".join(page.split())  # 2 lots × 1,450

    response = client.post(urls(order, token)["order-extend"], {"days": "3"}, follow=True)
    assert "The lots are held for your extension" in response.content.decode()
    extension = Invoice.objects.get(order=order, purpose="extension")
    assert extension.extension_days == 3 and extension.deposit_address in response.content.decode().lower()
    order.refresh_from_db()
    assert order.ends_at == end  # the window moves only once paid ...
    assert held_until(order) == {end + timedelta(days=3) + TURNAROUND}  # ... but nobody can book the lots meanwhile

    # one extension at a time: a second request is refused and nothing changes
    again = client.post(urls(order, token)["order-extend"], {"days": "7"}, follow=True).content.decode()
    assert "already waiting for its payment" in again
    assert Invoice.objects.filter(order=order, purpose="extension").count() == 1

    invoice_mark_paid(invoice=extension, user=admin_user, reason="test")
    order.refresh_from_db()
    assert order.ends_at == end + timedelta(days=3) and order.extension_held_until is None
    assert held_until(order) == {order.ends_at + TURNAROUND}


def test_an_unpaid_extension_gives_its_days_back(client, ready_order):
    order, token = ready_order
    end = order.ends_at
    client.post(urls(order, token)["order-extend"], {"days": "7"})
    order.refresh_from_db()
    assert held_until(order) == {end + timedelta(days=7) + TURNAROUND}

    assert booking_services.extension_holds_release(now=timezone.now()) == 0  # still within its quote
    assert booking_services.extension_holds_release(now=timezone.now() + timedelta(days=1)) == 1
    order.refresh_from_db()
    assert order.ends_at == end and order.extension_held_until is None
    assert held_until(order) == {end + TURNAROUND}
    assert "extension hold expired unpaid" in order.events.values_list("reason", flat=True)
    # and the customer can ask again
    client.post(urls(order, token)["order-extend"], {"days": "3"})
    assert Invoice.objects.filter(order=order, purpose="extension").count() == 2


@pytest.mark.parametrize("days", ["", "5", "abc", "99999999999999999999", "3\x00"])
def test_a_hostile_extension_request_is_answered_and_changes_nothing(client, ready_order, days):
    order, token = ready_order
    before = held_until(order)
    response = client.post(urls(order, token)["order-extend"], {"days": days}, follow=True)
    assert response.status_code == 200
    assert "Choose an extension of 3, 7 or 30 days, or the days left before the next booking." in (
        response.content.decode()
    )
    assert not Invoice.objects.filter(order=order, purpose="extension").exists()
    assert held_until(order) == before


def test_the_days_left_before_the_host_s_maintenance_are_offered_at_the_daily_rate(client, ready_order, admin_user):
    from decimal import Decimal

    from inventory.models import MaintenanceWindow

    order, token = ready_order
    end = order.ends_at
    host = order.allocations.first().lot.host
    starts = end + TURNAROUND + timedelta(days=1, hours=1)
    MaintenanceWindow.objects.create(host=host, starts_at=starts, ends_at=starts + timedelta(days=1), reason="BIOS")

    page = " ".join(client.get(urls(order, token)["order"]).content.decode().split())
    assert "1 more day: 966.66 EUR" in page  # 2 lots × 1,450 / 3, to the cent
    assert "the days left before these cards are booked again, priced per day" in page
    assert "The cards’ host is in maintenance after this window" in html.unescape(page).replace("'", "’")

    refused = client.post(urls(order, token)["order-extend"], {"days": "3"}, follow=True).content.decode()
    assert "in maintenance after this window: it cannot be extended that long" in html.unescape(refused)
    assert client.post(urls(order, token)["order-extend"], {"days": "2"}, follow=True).status_code == 200
    assert not Invoice.objects.filter(order=order, purpose="extension").exists()

    client.post(urls(order, token)["order-extend"], {"days": "1"})
    extension = Invoice.objects.get(order=order, purpose="extension")
    assert extension.extension_days == 1 and extension.fiat_amount == Decimal("966.66")
    invoice_mark_paid(invoice=extension, user=admin_user, reason="test")
    order.refresh_from_db()
    assert order.ends_at == end + timedelta(days=1)
    assert held_until(order) == {order.ends_at + TURNAROUND}


def test_the_days_left_before_another_booking_of_the_same_cards_are_offered(client, ready_order):
    from booking.models import Allocation

    order, token = ready_order
    end = order.ends_at
    lot = order.allocations.first().lot
    # The next researcher (an order of their own) has one of these cards from 5 days and 2 hours after this
    # window's turnaround.
    other = Order.objects.get(pk=order.pk)
    other.pk, other.public_id = None, "BN-NEXTNEXT"
    other.save()
    starts = end + TURNAROUND + timedelta(days=5, hours=2)
    Allocation.objects.create(order=other, lot=lot, starts_at=starts, ends_at=starts + timedelta(days=3))

    page = " ".join(client.get(urls(order, token)["order"]).content.decode().split())
    assert "5 more days: 4833.34 EUR" in page  # 2 × round(1,450 × 5 / 3, 2) = 2 × 2,416.67
    assert "7 more days (The same lots are booked after this window" in page
    assert booking_services.days_to_next_booking(order=order) == 5


def test_ending_early_needs_a_confirmation_then_frees_the_cards_and_tears_down(
    client, ready_order, django_capture_on_commit_callbacks
):
    order, token = ready_order
    response = client.post(urls(order, token)["order-end"], {}, follow=True)
    assert "Tick the box to confirm" in response.content.decode()
    order.refresh_from_db()
    assert order.status == OrderStatus.READY

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(urls(order, token)["order-end"], {"confirm": "end"}, follow=True)
    assert "Your window is ended" in response.content.decode()
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED
    assert not order.allocations.filter(released_at__isnull=True).exists()  # bookable again at once
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.TEARDOWN).exists()
    event = order.events.filter(from_status=OrderStatus.READY, to_status=OrderStatus.ENDED).get()
    assert event.reason == "ended early by the customer" and event.evidence["unused_hours"] > 0

    # the forms are gone, and a replayed request is refused without a change
    assert "End my window now" not in response.content.decode()
    replay = client.post(urls(order, token)["order-end"], {"confirm": "end"}, follow=True).content.decode()
    assert "Only a ready or running window can be ended early." in replay
    assert order.events.filter(from_status=OrderStatus.READY, to_status=OrderStatus.ENDED).count() == 1


def test_an_unpaid_order_cannot_be_ended_early(client, catalog, booking_data):
    from tests.builders.orders import place

    order, token = place(client, booking_data(lots="1"))
    replay = client.post(urls(order, token)["order-end"], {"confirm": "end"}, follow=True).content.decode()
    assert "Only a ready or running window can be ended early." in replay
    order.refresh_from_db()
    assert order.status == OrderStatus.AWAITING_PAYMENT


def a_key(keypair, name: str) -> str:
    return keypair(name)[1]


def test_keys_added_and_removed_during_the_window_are_rewritten_on_the_machines_and_mailed(
    client, ready_order, keypair, mailoutbox, django_capture_on_commit_callbacks
):
    order, token = ready_order
    first = order.ssh_keys.get()
    keys_url = reverse("customer:order-keys", kwargs={"public_id": order.public_id, "token": token})
    runs_before = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).count()

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(keys_url, {"ssh_keys": a_key(keypair, "collaborator")}, follow=True)
    assert "Keys changed: your machines get them within a minute." in response.content.decode()
    new = order.ssh_keys.exclude(pk=first.pk).get()
    assert new.fingerprint in response.content.decode()
    keys_runs = order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS)
    assert keys_runs.count() == runs_before + 1
    assert keys_runs.first().status == ProvisioningRun.Status.SUCCEEDED
    (mail,) = [message for message in mailoutbox if "SSH keys" in message.subject]
    assert mail.to == [order.contact_email] and f"+ added: {new.fingerprint}" in mail.body
    assert order.events.filter(reason="ssh keys changed", evidence__added=[new.fingerprint]).exists()

    with django_capture_on_commit_callbacks(execute=True):
        client.post(keys_url, {"remove": str(first.pk)})
    assert list(order.ssh_keys.values_list("pk", flat=True)) == [new.pk]
    assert f"- removed: {first.fingerprint}" in mailoutbox[-1].body

    # the last key stays; a key of another order, or garbage, changes nothing
    refused = client.post(keys_url, {"remove": str(new.pk)}, follow=True).content.decode()
    assert "Keep at least one key" in refused
    for hostile in ("", "abc", "-1", "99999999999999999999999", str(first.pk)):
        client.post(keys_url, {"remove": hostile})
    assert list(order.ssh_keys.values_list("pk", flat=True)) == [new.pk]
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.KEYS).count() == runs_before + 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----", "private"),
        ("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQC7 short", "truncated or damaged"),
        ("x" * 30000, "Ensure this value has at most"),
        ("", "This field is required."),
    ],
)
def test_a_bad_key_is_refused_with_a_message_and_the_keys_stay(client, ready_order, text, message):
    order, token = ready_order
    before = list(order.ssh_keys.values_list("fingerprint", flat=True))
    keys_url = reverse("customer:order-keys", kwargs={"public_id": order.public_id, "token": token})
    response = client.post(keys_url, {"ssh_keys": text}, follow=True)
    assert response.status_code == 200
    assert message.lower() in response.content.decode().lower()
    assert list(order.ssh_keys.values_list("fingerprint", flat=True)) == before
    assert not order.events.filter(reason="ssh keys changed").exists()


def test_at_most_ten_keys_still_changeable_for_the_download_window_and_none_once_cancelled(
    client, ready_order, keypair, booking_data, mailoutbox, django_capture_on_commit_callbacks
):
    order, token = ready_order
    keys_url = reverse("customer:order-keys", kwargs={"public_id": order.public_id, "token": token})
    nine = "\n".join(a_key(keypair, f"member{number}") for number in range(9))
    client.post(keys_url, {"ssh_keys": nine})
    assert order.ssh_keys.count() == 10
    refused = client.post(keys_url, {"ssh_keys": a_key(keypair, "one-too-many")}, follow=True).content.decode()
    assert "at most 10 keys" in refused and order.ssh_keys.count() == 10

    # after the end the files stay readable by SFTP until the wipe, with the order's keys: a lost one is removed
    booking_services.order_end_early(order=order)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(keys_url, {"remove": str(order.ssh_keys.first().pk)}, follow=True)
    assert order.ssh_keys.count() == 9
    # (the teardown has not opened the download window yet: the e-mail does not promise a hand-over)
    said = " ".join(mailoutbox[-1].body.split())
    assert "no download window is open now: it takes these keys if it opens" in said and "handed over" not in said

    # once the files are deleted, nothing takes keys: the page offers no change and a change is refused
    with django_capture_on_commit_callbacks(execute=True):
        runs.access_wipe_start(order=order)
    assert order.accesses.filter(wiped_at__isnull=True).count() == 0
    page = client.get(urls(order, token)["order"]).content.decode()
    assert "Add SSH public keys" not in page and 'name="remove"' not in page
    refused = client.post(keys_url, {"ssh_keys": a_key(keypair, "too-late")}, follow=True).content.decode()
    assert "The files of this order were deleted: no machine takes its keys any more." in refused
    assert order.ssh_keys.count() == 9

    # a cancelled order keeps nothing of the customer's: its keys no longer change
    from tests.builders.orders import place

    cancelled, cancelled_token = place(client, booking_data(lots="1", contact_email="grace@example.org"))
    booking_services.order_cancel_by_customer(order=cancelled)
    url = reverse("customer:order-keys", kwargs={"public_id": cancelled.public_id, "token": cancelled_token})
    refused = client.post(url, {"remove": str(cancelled.ssh_keys.first().pk)}, follow=True).content.decode()
    assert "can no longer be changed" in refused and cancelled.ssh_keys.count() == 1
