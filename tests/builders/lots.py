"""The lots of an order, as the tests of moves read them."""

from inventory.models import Lot


def live_lots(order) -> dict[int, Lot]:
    """The lots the order uses (a lot a move left is held, for no one, until its container is gone)."""
    return {a.lot_id: a.lot for a in order.allocations.in_use().select_related("lot__host")}


def free_lot(order, *, on_host=None, off_hosts=()) -> Lot:
    taken = order.allocations.values_list("lot_id", flat=True)
    lots = Lot.objects.filter(hardware_class=order.hardware_class).exclude(pk__in=taken).exclude(host__in=off_hosts)
    return (lots.filter(host=on_host) if on_host else lots).order_by("host__name", "name").first()
