"""What the order page shows of its payments, for the booking app's templates.

The order page belongs to booking, which imports nothing from payments (dependencies run booking ← payments ←
provisioning); its status block asks for the payment instructions through these tags instead:

    {% load payment_panels %}
    {% order_payment order as payment %}{% extension_payment order as extension %}
"""

from django import template

from booking.models import Order, OrderStatus
from payments.selectors import PaymentView, open_extension_invoice, payment_view

register = template.Library()


@register.simple_tag
def order_payment(order: Order) -> PaymentView | None:
    """The order's current invoice: address, amount, network, QR code, confirmations."""
    return payment_view(order)


@register.simple_tag
def extension_payment(order: Order) -> PaymentView | None:
    """The payment block of an extension being paid, on a ready or active window."""
    if order.status not in (OrderStatus.READY, OrderStatus.ACTIVE):
        return None
    invoice = open_extension_invoice(order)
    return payment_view(order, invoice=invoice) if invoice is not None else None
