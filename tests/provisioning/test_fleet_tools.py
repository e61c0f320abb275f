"""The operator's fleet tools on the console: orders already placed on a host that is switched off or put in
maintenance are listed to be moved, on the queue and on the host's page."""

from datetime import timedelta

import pytest
from django.urls import reverse

from booking.models import Order
from booking.services import order_cancel_by_customer
from inventory.models import Host, MaintenanceWindow
from provisioning import selectors

pytestmark = pytest.mark.django_db


def _place(client, booking_data, **overrides) -> Order:
    assert client.post(reverse("customer:book"), booking_data(**overrides)).status_code == 302
    return Order.objects.get(contact_email=overrides.get("contact_email", "ada@example.org"))


def _host_of(order: Order) -> Host:
    return order.allocations.select_related("lot__host").first().lot.host


def test_orders_placed_over_a_maintenance_window_are_listed_to_move_and_others_are_not(
    client, operator, catalog, booking_data, start_date, django_assert_max_num_queries
):
    # given: two orders, one week apart, on the same lot
    first = _place(client, booking_data, lots="1", days="3")
    later = start_date + timedelta(days=10)
    second = _place(client, booking_data, lots="1", days="3", start_date=later.isoformat(), contact_email="b@x.org")
    host = _host_of(first)
    assert _host_of(second) == host

    # when: the operator plans maintenance on that host during the first order's window only
    window = MaintenanceWindow.objects.create(
        host=host,
        starts_at=first.starts_at + timedelta(days=1),
        ends_at=first.starts_at + timedelta(days=1, hours=6),
        reason="Replace GPU 1 fan",
    )

    # then: only the first order is to move, with the maintenance that overlaps it
    with django_assert_max_num_queries(2):
        rows = selectors.orders_to_move()
    assert [(row.order, row.host, row.maintenance) for row in rows] == [(first, host, window)]
    client.force_login(operator)
    queue = client.get(reverse("console:queue")).content.decode()
    assert 'id="section-to-move"' in queue and first.public_id in queue and "Replace GPU 1 fan" in queue
    assert second.public_id not in queue.split('id="section-to-move"')[1].split("</section>")[0]
    page = client.get(reverse("console:host", kwargs={"name": host.name})).content.decode()
    assert "Maintenance windows" in page and "Replace GPU 1 fan" in page
    to_move = page.split('id="section-to-move"')[1].split("</section>")[0]
    assert first.public_id in to_move and second.public_id not in to_move
    other_host = Host.objects.exclude(pk=host.pk).first()
    other_page = client.get(reverse("console:host", kwargs={"name": other_host.name})).content.decode()
    assert first.public_id not in other_page.split('id="section-to-move"')[1].split("</section>")[0]


def test_every_order_still_to_come_on_an_inactive_host_is_listed_to_move(client, operator, catalog, booking_data):
    order = _place(client, booking_data, lots="1")
    host = _host_of(order)
    assert selectors.orders_to_move() == []
    queue_before = client.get(reverse("console:queue"))

    host.is_active = False
    host.save()

    rows = selectors.orders_to_move()
    assert [(row.order, row.host, row.maintenance) for row in rows] == [(order, host, None)]
    client.force_login(operator)
    page = client.get(reverse("console:host", kwargs={"name": host.name})).content.decode()
    assert "Host inactive: its lots are not offered" in page
    assert "Host inactive" in page.split('id="section-to-move"')[1] and order.public_id in page
    assert queue_before.status_code == 302  # the console is for operators only

    # a cancelled order lets go of its lots: nothing is left to move
    order_cancel_by_customer(order=order)
    assert selectors.orders_to_move(host=host) == []


def test_the_fleet_sections_speak_french(client, operator, catalog, booking_data):
    order = _place(client, booking_data, lots="1")
    host = _host_of(order)
    MaintenanceWindow.objects.create(
        host=host, starts_at=order.starts_at, ends_at=order.starts_at + timedelta(hours=2), reason="BIOS"
    )
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    page = client.get(reverse("console:host", kwargs={"name": host.name})).content.decode()

    assert "Fenêtres de maintenance" in page and "À déplacer : réservées alors que l’hôte est hors vente" in page
    assert "Maintenance " in page and " : BIOS" in page
