"""Limits that strangers cannot turn against a researcher (issue 19): the unpaid-lots limit of an e-mail address
counts only orders whose contact confirmed the address; the limit holds across classes under concurrency; a
revocation pressed many times at once sends one e-mail; reaching an address's resend limit locks no one out."""

import re
import threading

import pytest
from django.core import mail
from django.db import close_old_connections, connection
from django.test import Client
from django.urls import reverse

from booking import links
from booking.models import BookingPolicy, Order
from tests.builders.orders import place


def _limit_unpaid_lots(limit: int) -> None:
    policy = BookingPolicy.current()
    policy.max_unpaid_lots_per_client = limit
    policy.save()


def _mailed_link(message) -> str:
    return re.findall(r"http://\S+/orders/\S+/", message.body)[0].replace("http://127.0.0.1:8000", "")


def test_a_stranger_typing_a_researchers_address_cannot_lock_them_out(
    catalog, booking_data, django_capture_on_commit_callbacks
):
    _limit_unpaid_lots(2)
    stranger = Client(REMOTE_ADDR="203.0.113.66")
    # The stranger holds the limit under the victim's address (orders they can pay or not: the lots are held).
    with django_capture_on_commit_callbacks(execute=True):
        place(stranger, booking_data(lots="2", contact_email="victim@lab.example"))
    assert stranger.post(reverse("customer:book"), booking_data(lots="1")).status_code == 200  # their own limit

    # The victim, from their own connection, books as usual: an address nobody confirmed spends nothing of theirs.
    victim = Client(REMOTE_ADDR="198.51.100.20")
    order, _token = place(victim, booking_data(lots="2", contact_email="victim@lab.example"))
    assert order.lot_count == 2 and Order.objects.filter(contact_email="victim@lab.example").count() == 2


def test_an_address_counts_once_its_owner_opened_a_link_sent_there(
    catalog, booking_data, django_capture_on_commit_callbacks
):
    _limit_unpaid_lots(2)
    first_place = Client(REMOTE_ADDR="198.51.100.20")
    with django_capture_on_commit_callbacks(execute=True):
        order, _token = place(first_place, booking_data(lots="2"))
    # The link shown in the browser at booking proves nothing about the mailbox.
    assert Order.objects.get(pk=order.pk).email_verified_at is None
    assert first_place.get(_mailed_link(mail.outbox[-1])).status_code == 200
    assert Order.objects.get(pk=order.pk).email_verified_at is not None

    elsewhere = Client(REMOTE_ADDR="192.0.2.30")
    refused = elsewhere.post(reverse("customer:book"), booking_data(lots="1", contact_email="Ada@Example.org"))
    assert refused.status_code == 200
    assert "one client may hold at most 2" in refused.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_limit_holds_across_classes_when_bookings_arrive_at_once(catalog, booking_data):
    _limit_unpaid_lots(1)
    classes = ["b200-pair", "h200-pair", "mi300x-pair"]
    environments = {
        "b200-pair": booking_data()["environment"],
        "h200-pair": "pytorch-2-4-cuda-12-4",
        "mi300x-pair": "pytorch-2-6-rocm-6-4",
    }
    barrier = threading.Barrier(len(classes))
    answers: list[int] = []
    lock = threading.Lock()

    def book(slug: str) -> None:
        try:
            client = Client(REMOTE_ADDR="198.51.100.99")  # one client, three classes, one instant
            data = booking_data(lots="1", hardware_class=slug, environment=environments[slug])
            barrier.wait(timeout=30)
            response = client.post(reverse("customer:book"), data)
            with lock:
                answers.append(response.status_code)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=book, args=(slug,)) for slug in classes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert sorted(answers) == [200, 200, 302]
    assert Order.objects.count() == 1


def test_a_revocation_pressed_again_with_the_same_link_sends_no_second_email(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data())
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        first = links.order_links_revoke(order=order, token=token)
        again = links.order_links_revoke(order=order, token=token)  # the second of two parallel presses

    assert first >= 1 and again == 0
    assert len(mail.outbox) == 1


def test_a_stranger_spending_an_addresses_resend_limit_does_not_turn_its_owner_away(
    catalog, booking_data, django_capture_on_commit_callbacks
):
    place(Client(REMOTE_ADDR="198.51.100.20"), booking_data())
    url = reverse("customer:resend-link")
    with django_capture_on_commit_callbacks(execute=True):
        for index in range(5):  # from five connections, the address's whole hourly limit
            Client(REMOTE_ADDR=f"203.0.113.{index + 1}").post(url, {"email": "ada@example.org"})
    sent = len(mail.outbox)
    assert sent == 5

    with django_capture_on_commit_callbacks(execute=True):
        owner = Client(REMOTE_ADDR="198.51.100.20").post(url, {"email": "ada@example.org"})

    assert owner.status_code == 200 and "a message with their links is on its way" in owner.content.decode()
    assert len(mail.outbox) == sent  # the mailbox is not flooded: the links are there already
