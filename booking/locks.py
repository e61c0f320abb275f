"""Row locks, always taken in one order so that two transactions never wait on each other in a cycle:
the order, then its invoices (`payments.locks`), then the hardware class (the capacity lock that serialises
bookings of one class), then allocation rows (conventions.md #4, Saleor's `checkout/lock_objects.py`).

Call inside a transaction; each function locks what it names and returns the fresh rows.
"""

from booking.models import Order
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
