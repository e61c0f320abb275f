"""Checkout: the few sequences that write an order and its invoice in one transaction.

An order is never placed without its invoice, nor an extension asked for without its own (Saleor's
`checkout/complete_checkout.py`). Payments sits above booking (booking ← payments ← provisioning), so it may call
booking's services in the same transaction; booking never calls back. The pages (web/) call these functions.
"""

from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from booking import placing
from booking import services as booking
from booking.locks import lock_order
from booking.models import BookingPolicy, Order, OrderEvent
from payments import invoices as payments
from payments.models import Invoice


def order_place(*, request: placing.BookingRequest, policy: BookingPolicy | None = None) -> tuple[Order, str]:
    """Place an order: its lots held, its quote and deposit address, in one transaction (an invoice that cannot
    be made undoes the booking). Returns the order and its secret token.

    The checks that need no lock come first (a rush on the last lot is answered there); when the lots are gone
    under the class lock, the answer (with the next free dates) is drawn after the transaction, lock released.
    """
    plan = placing.order_plan(request=request, policy=policy)
    try:
        with transaction.atomic():
            order, token = placing.order_hold(plan=plan)
            payments.invoice_for_new_order(order=order)
    except placing.SoldOutUnderLock as refused:
        raise placing.sold_out_answer(plan=plan, refused=refused) from refused
    return order, token


@transaction.atomic
def order_extension_request(
    *, order: Order, days: int, actor: AbstractBaseUser | None, now: datetime | None = None
) -> Invoice:
    """An extension is its own invoice, quoted and watched from now; the order's end moves only once it is paid
    (booking.order_extend)."""
    order = lock_order(order.pk)
    amount = booking.extension_price(order=order, days=days)
    booking.extension_hold(order=order, days=days, actor=actor, now=now)  # the lots wait for the payment
    invoice = payments.invoice_create(
        order=order, fiat_amount=amount, purpose=Invoice.Purpose.EXTENSION, extension_days=days, now=now
    )
    booking.order_note(
        order=order,
        reason="extension requested",
        actor_kind=OrderEvent.Actor.OPERATOR if actor else OrderEvent.Actor.CUSTOMER,
        actor=actor,
        evidence={"days": days, "invoice": invoice.pk},
    )
    return invoice
