"""The clock and the sweeps of the end of a window: a paid and provisioned order, a host mended, one tick."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from booking.models import Order, OrderStatus
from inventory.models import Host
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import lifecycle, runs, services
from tests.builders.orders import place


@dataclass
class Clock:
    """The time every part of the portal reads (timezone.now), moved by the test like beat's ticks would."""

    now: datetime = field(default_factory=timezone.now)

    def advance(self, **delta) -> datetime:
        self.now += timedelta(**delta)
        return self.now


def mend(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(driver=Host.Driver.DRY_RUN)


def paid(client, booking_data, admin_user, lots: str = "1") -> Order:
    order, _token = place(client, booking_data(lots=lots))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    order.refresh_from_db()
    return order


def make_provisioned(client, booking_data, admin_user, capture, lots: str = "1") -> Order:
    """An order handed over on the demo's dry-run hosts."""
    order = paid(client, booking_data, admin_user, lots)
    services.order_approve(order=order, actor=admin_user)
    with capture(execute=True):
        runs.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    assert order.status == OrderStatus.READY
    return order


def tick(capture, now: datetime) -> dict:
    with capture(execute=True):  # eager Celery: the runs the tick queues are executed on commit
        return lifecycle.lifecycle_tick(now=now)
