"""The operator's fleet switches as booking sees them: an inactive host sells nothing, a maintenance window takes its
host's lots off sale for its dates only."""

from datetime import UTC, datetime, time, timedelta

import pytest
from django.urls import reverse

from booking import selectors
from booking.models import Allocation, Order
from inventory.models import Host, Lot, MaintenanceWindow

pytestmark = pytest.mark.django_db

SOLD_OUT = "Sold out: not enough NVIDIA B200 pair lots are free for these dates."


def _b200_lots(catalog) -> list[Lot]:
    return list(Lot.objects.filter(hardware_class=catalog["b200-pair"]).select_related("host"))


def _busiest_host(lots: list[Lot]) -> Host:
    return max({lot.host for lot in lots}, key=lambda host: sum(lot.host_id == host.pk for lot in lots))


def test_unticking_a_host_s_active_box_takes_its_lots_off_sale_and_ticking_it_puts_them_back(
    client, catalog, booking_data, policy, start_date, django_capture_on_commit_callbacks
):
    # given: every B200 lot of the demo is free, one host holds several of them
    lots = _b200_lots(catalog)
    host = _busiest_host(lots)
    on_host = sum(lot.host_id == host.pk for lot in lots)
    window = selectors.window_for(start_date=start_date, days=7, policy=policy)

    # when: the operator unticks "active" (as the admin saves it)
    host.is_active = False
    host.save()

    # then: booking offers only the other hosts' lots, on any date, and asking for all of them is refused
    free = selectors.free_lot_ids(hardware_class=catalog["b200-pair"], window=window, limit=100)
    assert len(free) == len(lots) - on_host and not Lot.objects.filter(pk__in=free, host=host).exists()
    assert selectors.availability_for_window(window=window)[catalog["b200-pair"].pk].free == len(lots) - on_host
    response = client.post(reverse("customer:book"), booking_data(lots=str(len(lots))))
    remaining = len(lots) - on_host
    assert response.status_code == 200
    assert f"Only {remaining} lots of NVIDIA B200 pair exist." in response.content.decode()
    assert not Order.objects.exists()

    # and: ticked again, the same request gets its order on every lot
    with django_capture_on_commit_callbacks(execute=True):  # the booking page's cached answer is stale on commit
        host.is_active = True
        host.save()
    assert client.post(reverse("customer:book"), booking_data(lots=str(len(lots)))).status_code == 302
    assert Allocation.objects.filter(lot__host=host, released_at__isnull=True).count() == on_host


def test_a_maintenance_window_takes_the_host_s_lots_off_sale_for_its_dates_only(
    client, catalog, booking_data, policy, start_date
):
    lots = _b200_lots(catalog)
    host = _busiest_host(lots)
    on_host = sum(lot.host_id == host.pk for lot in lots)
    starts_at = datetime.combine(start_date, time.min, tzinfo=UTC) + timedelta(days=2)
    MaintenanceWindow.objects.create(
        host=host, starts_at=starts_at, ends_at=starts_at + timedelta(days=1), reason="PSU swap"
    )
    inside = selectors.window_for(start_date=start_date, days=7, policy=policy)
    after = selectors.window_for(start_date=start_date + timedelta(days=5), days=7, policy=policy)
    before = selectors.window_for(start_date=start_date - timedelta(days=5), days=3, policy=policy)

    # a 7-day window that overlaps the maintenance is not offered the host's lots
    free_inside = selectors.free_lot_ids(hardware_class=catalog["b200-pair"], window=inside, limit=100)
    assert len(free_inside) == len(lots) - on_host
    assert selectors.availability_for_window(window=inside)[catalog["b200-pair"].pk].free == len(lots) - on_host
    # windows before and after it still are
    assert len(selectors.free_lot_ids(hardware_class=catalog["b200-pair"], window=after, limit=100)) == len(lots)
    assert len(selectors.free_lot_ids(hardware_class=catalog["b200-pair"], window=before, limit=100)) == len(lots)

    # the booking page: every lot over the maintenance is sold out, and the next dates offered start after it
    response = client.post(reverse("customer:book"), booking_data(lots=str(len(lots))))
    assert response.status_code == 200 and SOLD_OUT in response.content.decode()
    next_dates = selectors.next_start_dates(
        hardware_class=catalog["b200-pair"], lot_count=len(lots), days=7, after=start_date, policy=policy
    )
    assert next_dates and all(
        selectors.window_for(start_date=day, days=7, policy=policy).held_from >= starts_at + timedelta(days=1)
        for day in next_dates
    )
    late = (start_date + timedelta(days=5)).isoformat()
    assert client.post(reverse("customer:book"), booking_data(lots=str(len(lots)), start_date=late)).status_code == 302
    # a booking of fewer lots over the maintenance gets the other hosts' lots
    response = client.post(
        reverse("customer:book"), booking_data(lots="1", contact_email="grace@example.org", days="3")
    )
    assert response.status_code == 302
    order = Order.objects.get(contact_email="grace@example.org")
    assert not order.allocations.filter(lot__host=host).exists()


def test_the_database_refuses_a_maintenance_window_that_ends_before_it_starts(catalog):
    from django.db import IntegrityError

    host = Host.objects.first()
    now = datetime.now(UTC)
    with pytest.raises(IntegrityError):
        MaintenanceWindow.objects.create(host=host, starts_at=now, ends_at=now - timedelta(hours=1), reason="x")


def test_the_lot_admin_says_a_lot_is_not_offered_because_its_host_is_inactive(admin_client, catalog):
    lot = Lot.objects.filter(hardware_class=catalog["b200-pair"]).select_related("host").first()
    Host.objects.filter(pk=lot.host_id).update(is_active=False)

    changelist = admin_client.get(reverse("admin:inventory_lot_changelist"), {"host__id__exact": lot.host_id})
    response = admin_client.post(
        reverse("admin:inventory_lot_change", args=[lot.pk]),
        {
            "name": lot.name,
            "hardware_class": lot.hardware_class_id,
            "host": lot.host_id,
            "gpu_indices": lot.gpu_indices,
            "status": Lot.Status.ACTIVE,
        },
        follow=True,
    )

    assert 'alt="True"' not in changelist.content.decode()
    assert f"Lot {lot.name} is active but not offered to customers: its host {lot.host.name} is inactive." in (
        response.content.decode()
    )
