"""What a paid order's cancellation refunds, by the rules of the terms version its customer accepted: in full less
the fee until N days before the start, a percentage until the start, nothing once the window has started.

"The price" is everything paid for the window: the booking and its paid extensions. What was refunded already
for a provider fault is not refunded twice: the quote never exceeds what is left of the price. The quote is the
amount shown on the cancel button, checked by the cancel service, and refunded (payments/refunds.py)."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from django.utils.translation import gettext as _

from booking.models import Order, TermsVersion

CENT = Decimal("0.01")


class RefundRule:
    FULL = "full"
    PARTIAL = "partial"
    NONE = "none"


@dataclass(frozen=True)
class RefundQuote:
    amount: Decimal
    currency: str
    rule: str
    # When the next rule takes over (the amount changes then), or None when nothing more changes.
    valid_until: datetime | None


def refund_quote(*, order: Order, now: datetime) -> RefundQuote:
    """The refund if `order` (paid) were cancelled at `now`."""
    terms: TermsVersion = order.terms_version
    full_until = order.starts_at - timedelta(days=terms.full_refund_days_before)
    total = order.total_price + order.extensions_price
    if now < full_until:
        amount, rule, until = max(total - terms.cancellation_fee, Decimal("0")), RefundRule.FULL, full_until
    elif now < order.starts_at:
        amount = total * terms.partial_refund_percent / Decimal(100)
        rule, until = RefundRule.PARTIAL, order.starts_at
    else:
        amount, rule, until = Decimal("0"), RefundRule.NONE, None
    left = max(total - order.fault_refunds, Decimal("0"))
    return RefundQuote(
        amount=min(amount.quantize(CENT, rounding=ROUND_HALF_UP), left),
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
        _("Once the window has started: no refund."),
        _("A cancelled order's lots are released at once; the refund is paid in the asset and on the network used."),
    ]
