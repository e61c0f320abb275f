"""What an invoice costs in an asset: at par for a stablecoin pegged to the order's currency, at the answer of the
asset's rate feed read on chain (refused when stale, carried over or quoted in another currency: `feed_problem`),
or at the rate an operator set; and which asset is offered first. Reads only: a new invoice is priced here, and
a late payment is quoted again here to see how far the rate moved.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.utils import timezone
from django.utils.translation import gettext as _

from infrastructure.numbers import whole_number
from payments import config
from payments.chain import ChainClient, ChainUnavailable
from payments.chain_answers import FeedRound, parse_timestamp
from payments.errors import PaymentError
from payments.models import OperatorRate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quote:
    asset: config.Asset
    amount_due_units: int
    rate: Decimal
    rate_source: str


def default_asset() -> config.Asset | None:
    """The configured default, else the first stablecoin pegged to the price currency, else the first asset."""
    configured = settings.PAYMENTS_DEFAULT_ASSET
    if configured:
        chain_id, _sep, symbol = configured.partition(":")
        if (number := whole_number(chain_id)) is not None and (found := config.asset(number, symbol)):
            return found
    assets = config.assets()
    pegged = [asset for asset in assets if asset.pegged_to == settings.PRICE_CURRENCY]
    return (pegged or assets or [None])[0]


class FeedRefused(PaymentError):
    """A rate feed's answer was refused; `reason` says why, for the log and the operators."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def feed_problem(feed: FeedRound, *, asset: config.Asset, fiat_currency: str, now: datetime) -> str:
    """Why a feed's answer cannot price an invoice ("" when it can): no contract at the address, an answer that is
    not a round or not positive, older than the asset's heartbeat, carried over from an earlier round, or a pair
    quoted in another currency than the order's."""
    if not feed.has_code:
        return f"no contract at {asset.rate_feed} (chains file)"
    if feed.rate is None or feed.rate <= 0:
        return f"the answer is not a positive rate ({feed.rate})"
    age = now.timestamp() - feed.updated_at
    if age < -300:
        return f"the answer is dated {int(-age)} s in the future"
    if age > asset.rate_feed_heartbeat:
        return f"the answer is {int(age)} s old, beyond the heartbeat of {asset.rate_feed_heartbeat} s"
    if feed.answered_in_round < feed.round_id:
        return f"the answer was carried over (answeredInRound {feed.answered_in_round} < roundId {feed.round_id})"
    pair = [part.strip().upper() for part in feed.description.split("/")]
    if len(pair) != 2 or pair[1] != fiat_currency.upper():
        return f"the feed quotes {feed.description!r}, not a price in {fiat_currency}"
    base = (asset.rate_feed_base or asset.symbol).upper()
    if pair[0] != base:
        return f"the feed quotes {feed.description!r}, not the price of {base}"
    return ""


def quote(*, asset: config.Asset, fiat_amount: Decimal, fiat_currency: str, now: datetime | None = None) -> Quote:
    """How many base units of `asset` pay `fiat_amount`: at par for a stablecoin of that currency, else at the rate
    of the asset's feed (read on chain) or the operator's rate. Rounded up to the unit: never short."""
    if asset.pegged_to:
        if asset.pegged_to != fiat_currency:
            raise PaymentError(
                _("%(asset)s is pegged to %(peg)s, not to %(currency)s.")
                % {"asset": asset.symbol, "peg": asset.pegged_to, "currency": fiat_currency}
            )
        rate, source = Decimal(1), f"peg 1 {asset.symbol} = 1 {fiat_currency}"
    elif asset.rate_feed:
        chain = config.chain(asset.chain_id)
        try:
            feed = ChainClient(chain).feed_round(asset.rate_feed)
        except ChainUnavailable as exc:
            raise PaymentError(
                _("The %(asset)s rate cannot be read right now. Choose another asset or try again in a minute.")
                % {"asset": asset.symbol}
            ) from exc
        problem = feed_problem(feed, asset=asset, fiat_currency=fiat_currency, now=now or timezone.now())
        if problem:
            logger.error("rate feed of %s refused: %s", asset.key, problem)
            raise FeedRefused(
                _("The %(asset)s rate cannot be trusted right now. Choose another asset or try again later.")
                % {"asset": asset.symbol},
                reason=problem,
            )
        rate = feed.rate
        source = f"feed {asset.rate_feed} round {feed.round_id} at {parse_timestamp(feed.updated_at).isoformat()}"
    else:
        operator_rate = OperatorRate.objects.filter(
            chain_id=asset.chain_id, asset_symbol=asset.symbol, fiat_currency=fiat_currency
        ).first()
        if operator_rate is None:
            raise PaymentError(_("%(asset)s cannot be used: no rate is set for it.") % {"asset": asset.symbol})
        rate, source = operator_rate.rate, f"operator rate of {operator_rate.updated_at.isoformat()}"
    units = (fiat_amount / rate).scaleb(asset.decimals).to_integral_value(rounding=ROUND_CEILING)
    return Quote(asset=asset, amount_due_units=int(units), rate=rate, rate_source=source)
