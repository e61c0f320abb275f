"""Booking again with the data of an earlier order: proven by that order's link, on its host only (or said plainly
why not), once per volume; the earlier order's wipe waits for the order that carries its data. The demo's dry-run
hosts stand for the machines (the volume's move itself is tried on sshd + podman in tests/provisioning)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from booking.services import order_cancel_by_operator, order_end_early
from inventory.models import Lot
from provisioning import lifecycle
from provisioning.models import ProvisioningRun
from tests.builders.orders import order_url, place

pytestmark = pytest.mark.django_db


def _text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split()).replace("\u2019", "'")


@pytest.fixture
def ended_order(ready_order, django_capture_on_commit_callbacks):
    """Order 1: two lots of b200-node-01 (a dry-run host), prepared, handed over, ended early: its data is kept."""
    order, token = ready_order
    with django_capture_on_commit_callbacks(execute=True):
        order_end_early(order=order)
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED and order.accesses.get().disk_gib
    return order, token


def _carry(order: Order, token: str) -> dict:
    return {"carry_from": order.public_id, "carry_token": token, "carry_data": "on"}


def _later(start_date, days: int = 10) -> str:
    return (start_date + timedelta(days=days)).isoformat()


def test_the_order_page_offers_to_book_again_with_the_data_and_fills_the_booking_in(client, ended_order):
    order, token = ended_order
    page = _text(client.get(order_url(order, token)))
    assert "Book again with my data" in page and "900 GiB on b200-node-01" in page

    again = client.get(reverse("customer:order-book-again", kwargs={"public_id": order.public_id, "token": token}))
    text = _text(again)
    assert again.status_code == 200 and "no-store" in again["Cache-Control"]
    assert f"The data volume of order {order.public_id} (900 GiB) stays on its machine, b200-node-01" in text
    assert 'value="ada@example.org"' in again.content.decode()  # the contact and keys of order 1, filled in

    client.cookies["django_language"] = "fr"
    again = client.get(reverse("customer:order-book-again", kwargs={"public_id": order.public_id, "token": token}))
    assert f"Le volume de données de la commande {order.public_id} (900 Gio) reste sur sa machine" in _text(again)
    assert "Réserver à nouveau avec mes données" in _text(client.get(order_url(order, token)))


def test_a_carried_booking_takes_lots_on_the_data_s_host_only_or_says_why_not(
    client, ended_order, booking_data, start_date
):
    order, token = ended_order
    # given: someone else books both lots of b200-node-01 for the later dates (the first host by name)
    other, _token = place(
        client, booking_data(lots="2", start_date=_later(start_date, 12), contact_email="bo@example.org")
    )
    assert {a.lot.host.name for a in other.allocations.all()} == {"b200-node-01"}

    # when: the researcher books those dates carrying their data
    response = client.post(
        reverse("customer:book"), booking_data(lots="2", start_date=_later(start_date, 12), **_carry(order, token))
    )

    # then: refused with the reason and the way out; nothing booked; the box is still there to untick
    assert response.status_code == 200
    text = _text(response)
    assert "Your data stays on the machine that holds it, and only 0 lots of NVIDIA B200 pair are free there" in text
    assert "untick “carry my data” to book anywhere with an empty disk" in text
    assert not Order.objects.filter(carry_data_from=order).exists()

    # and: unticked, the booking goes on elsewhere with an empty disk
    without = {**_carry(order, token), "carry_data": ""}
    placed, _ = place(client, booking_data(lots="1", start_date=_later(start_date, 12), **without))
    assert placed.carry_data_from is None and placed.allocations.get().lot.host.name != "b200-node-01"

    # and: on dates when the host is free (before the data's deletion date), the carried booking lands there
    carried, _ = place(
        client, booking_data(lots="2", days="3", start_date=_later(start_date, 7), **_carry(order, token))
    )
    assert carried.carry_data_from == order
    assert {a.lot.host.name for a in carried.allocations.all()} == {"b200-node-01"}


@pytest.mark.parametrize("forged", ["wrong-token", "another-order-s-token", "no-token"])
def test_carrying_someone_else_s_data_needs_their_order_s_own_link(
    client, ended_order, booking_data, start_date, forged
):
    order, token = ended_order
    # the attacker holds the link of an order of their own, and knows the victim's order number
    _own, own_token = place(client, booking_data(lots="1", contact_email="mallory@example.org"))
    carry_token = {"wrong-token": token[:-2] + "xx", "another-order-s-token": own_token, "no-token": ""}[forged]

    response = client.post(
        reverse("customer:book"),
        booking_data(lots="1", start_date=_later(start_date), **{**_carry(order, token), "carry_token": carry_token}),
    )

    assert response.status_code == 200
    assert "The link of the order whose data you want to carry no longer works." in _text(response)
    assert not Order.objects.filter(carry_data_from=order).exists()
    page = client.get(
        reverse("customer:order-book-again", kwargs={"public_id": order.public_id, "token": carry_token or "x"})
    )
    assert page.status_code == 404


def test_one_order_carries_a_volume_and_the_earlier_order_s_wipe_waits_for_it(
    client, ended_order, booking_data, start_date, admin_user, django_capture_on_commit_callbacks
):
    order, token = ended_order
    carried, _ = place(client, booking_data(lots="2", start_date=_later(start_date), **_carry(order, token)))

    # a second booking carrying the same data is refused, and the order page offers it no more
    again = client.post(
        reverse("customer:book"), booking_data(lots="1", start_date=_later(start_date, 20), **_carry(order, token))
    )
    assert "can no longer be carried: it was deleted, carried to another order" in _text(again)
    assert "Book again with my data" not in _text(client.get(order_url(order, token)))

    # the wipe is due (days after the window) but waits while the carrying order has not taken the volume
    due = timezone.now() + timedelta(days=60)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.lifecycle_tick(now=due)["wiped"] == 0
    assert not order.provisioning_runs.filter(kind=ProvisioningRun.Kind.WIPE).exists()

    # released (cancelled), the carrying order gives the data back: offered again, and wiped when due
    order_cancel_by_operator(order=carried, actor=admin_user, reason="test")
    assert "Book again with my data" in _text(client.get(order_url(order, token)))
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.lifecycle_tick(now=due)["wiped"] == 1
    assert order.provisioning_runs.get(kind=ProvisioningRun.Kind.WIPE).status == ProvisioningRun.Status.SUCCEEDED


def test_a_window_whose_data_is_carried_cannot_be_extended_into_the_next_order(
    client,
    ready_order,
    booking_data,
    start_date,
):
    order, token = ready_order  # still running: its data can be carried to an order booked ahead
    # on a third lot of the same host, right after this window (its own two lots are held until then)
    host = order.allocations.first().lot.host
    b200 = order.hardware_class
    Lot.objects.create(name="b200-node-01 · GPUs 4,5", hardware_class=b200, host=host, gpu_indices="4,5")
    Lot.objects.create(name="b200-node-01 · GPUs 6,7", hardware_class=b200, host=host, gpu_indices="6,7")
    carried, _ = place(client, booking_data(lots="2", start_date=_later(start_date, 7), **_carry(order, token)))
    assert carried.carry_data_from == order
    assert {a.lot.gpu_indices for a in carried.allocations.all()} == {"4,5", "6,7"}

    extend = reverse("customer:order-extend", kwargs={"public_id": order.public_id, "token": token})
    refused = _text(client.post(extend, {"days": "3"}, follow=True))

    assert f"Your data is carried to order {carried.public_id}, which starts on" in refused
    assert not order.invoices.filter(purpose="extension").exists()
