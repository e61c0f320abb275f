"""Tasks through the real broker and a real worker process."""

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from booking.tasks import expire_holds


@pytest.mark.integration
def test_a_real_worker_expires_an_unpaid_hold_and_frees_its_lots(celery_worker_process, catalog, booking_data):
    # given: an order whose hold ran out
    assert Client().post(reverse("customer:book"), booking_data(lots="6")).status_code == 302
    order = Order.objects.get()
    Order.objects.filter(pk=order.pk).update(hold_expires_at=timezone.now() - timedelta(seconds=1))

    # when: beat's sweep is published to Redis and picked up by the worker
    expire_holds.delay()

    # then
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        order.refresh_from_db()
        if order.status == OrderStatus.EXPIRED:
            break
        time.sleep(0.2)
    assert order.status == OrderStatus.EXPIRED
    assert not order.allocations.filter(released_at__isnull=True).exists()
    assert order.events.last().actor_kind == "system"
    # the six lots are offered again for that window
    choice = {key: booking_data()[key] for key in ("hardware_class", "environment", "start_date", "days")}
    assert "6 / 6" in Client().get(reverse("customer:book"), {**choice, "lots": "1"}).content.decode()
