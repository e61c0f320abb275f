"""What a paid order's cancellation refunds, by the rules of the terms version its customer accepted: in full less
the fee until N days before the start, a percentage until the start, nothing once the window has started or its
access was handed over (READY: provisioning hands it over up to `provision_lead_hours` before the start).

"The price" is what bought the window and was not given back: the booking and its paid extensions, less what was
refunded already for a provider fault (`Order.total_price + extensions_price - fault_refunds`, booking's copy of
the ledger's `OrderMoney.bought_price`, payments/ledger.py). The rules apply to it as they are written: the fee is
charged, or the percentage taken, on what is left of the price, so a cancellation after a provider-fault refund
pays the fee too and never gives back more than is left. The quote is the amount shown on the cancel button,
checked by the cancel service, and refunded (payments/refunds.py)."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.utils.translation import gettext as _

from booking.models import Order, OrderStatus, TermsVersion

CENT = Decimal("0.01")


class RefundRule:
    FULL = "full"
    PARTIAL = "partial"
    NONE = "none"
    HANDED_OVER = "handed_over"  # the access was handed over before the start: as a started window, no refund


@dataclass(frozen=True)
class RefundQuote:
    amount: Decimal
    currency: str
    rule: str
    # When the next rule takes over (the amount changes then), or None when nothing more changes.
    valid_until: datetime | None


def access_handed_over(order: Order) -> bool:
    """Whether the order's access was ever handed over (READY), even if it is being provisioned again since (a lot
    reassigned): the customer had the machines."""
    return order.status == OrderStatus.READY or order.events.filter(to_status=OrderStatus.READY).exists()


def refund_quote(*, order: Order, now: datetime) -> RefundQuote:
    """The refund if `order` (paid) were cancelled at `now`."""
    terms: TermsVersion = order.terms_version
    starts_at = order.starts_at
    if order.start_when_ready and order.clock_started_at is None:
        # its window starts at the hand-over, not at the planned hour: until then it has not started
        starts_at = max(starts_at, now + timedelta(seconds=1))
    full_until = starts_at - timedelta(days=terms.full_refund_days_before)
    price = max(order.total_price + order.extensions_price - order.fault_refunds, Decimal("0"))
    if now < starts_at and access_handed_over(order):
        # The access is handed over up to the operator's lead time before the start (provisioning): the machines are
        # the customer's from then on, so the refund is the started window's. The quote, the cancel button and the
        # refund all read this one rule.
        amount, rule, until = Decimal("0"), RefundRule.HANDED_OVER, None
    elif now < full_until:
        amount, rule, until = max(price - terms.cancellation_fee, Decimal("0")), RefundRule.FULL, full_until
    elif now < starts_at:
        amount = price * terms.partial_refund_percent / Decimal(100)
        rule, until = RefundRule.PARTIAL, None if starts_at != order.starts_at else order.starts_at
    else:
        amount, rule, until = Decimal("0"), RefundRule.NONE, None
    return RefundQuote(
        amount=min(amount.quantize(CENT, rounding=ROUND_HALF_UP), price),
        currency=order.currency,
        rule=rule,
        valid_until=until,
    )


def rules_in_words(*, terms: TermsVersion, currency: str) -> list[str]:
    """The version's cancellation rules, one sentence each, for the policy page."""
    return [
        _("Until %(days)s days before the window starts: full refund, less a cancellation fee of %(fee)s %(currency)s.")
        % {"days": terms.full_refund_days_before, "fee": terms.cancellation_fee, "currency": currency},
        _("After that, until the window starts: %(percent)s%% of the price is refunded.")
        % {"percent": terms.partial_refund_percent},
        _(
            "Once the window has started, or its access has been handed over (this may be a few hours before it "
            "starts): no refund."
        ),
        _("A cancelled order's lots are released at once; the refund is paid in the asset and on the network used."),
    ]
