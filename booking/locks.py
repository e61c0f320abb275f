"""Row locks, always taken in one order so that two transactions never wait on each other in a cycle:
the order, then its invoices (`payments.invoices.lock_invoice`), then the booking client (its e-mail address and
client address, whose limit of unpaid lots spans every class), then the hardware class (the capacity lock that
serialises bookings of one class), then allocation rows (as Saleor's `checkout/lock_objects.py` does).

Call inside a transaction; each function locks what it names and returns the fresh rows.
"""

import hashlib

from django.db import connection

from booking.models import Order, mailbox_of
from inventory.models import HardwareClass


def lock_order(order_id: int) -> Order:
    return Order.objects.select_for_update().get(pk=order_id)


def lock_capacity(hardware_class_id: int) -> None:
    """Bookings, reallocations and reassignments of this class wait here, then see each other's allocations."""
    list(HardwareClass.objects.select_for_update().filter(pk=hardware_class_id).values_list("pk", flat=True))


def lock_order_and_capacity(order_id: int) -> Order:
    order = lock_order(order_id)
    lock_capacity(order.hardware_class_id)
    return order


def lock_client(*, email: str, client_key: str) -> None:
    """Bookings by this e-mail address or from this client address wait here, whatever their class, so that the
    limit of unpaid lots is counted once at a time: two bookings of different classes at the same instant cannot
    both pass it. PostgreSQL: transaction-scoped advisory locks, taken in a fixed order. The embedded SQLite
    serialises every writing transaction already (IMMEDIATE, portal/settings.py)."""
    if connection.vendor != "postgresql":
        return
    names = {f"email:{mailbox_of(email)}"} | ({f"client:{client_key}"} if client_key else set())
    keys = sorted(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True) for name in names)
    with connection.cursor() as cursor:
        for key in keys:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
