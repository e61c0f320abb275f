"""An invoice before the chain settles it: created with its quote and a deposit address of its own (a native-coin
address that already holds or has sent coin is never issued), replaced when the researcher picks another asset,
and "I've paid" recorded with a check of the chain asked for. `lock_invoice` takes the locks every write to an
invoice takes, order first (booking/locks.py). Amounts and transactions are never taken from a request: only the
scanner moves an invoice towards paid.
"""

import logging
import re
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import services as booking
from booking.locks import lock_order
from booking.models import BookingPolicy, Order, OrderEvent, OrderStatus
from infrastructure.numbers import whole_number
from payments import config, enqueue
from payments.addresses import deposit_address
from payments.chain import ChainClient, ChainUnavailable
from payments.errors import PaymentError
from payments.models import DerivationSlot, Invoice
from payments.quotes import default_asset, quote

logger = logging.getLogger(__name__)

_TX_HASH = re.compile(r"0x[0-9a-fA-F]{64}")

# How many derived addresses in a row may be found already used before giving up on this invoice.
USED_ADDRESS_SKIPS = 10


def _new_deposit_address(asset: config.Asset) -> tuple[int, str]:
    """The next child address. For the native coin an address that already holds coin or has sent a transaction is
    never issued: its index is skipped (and logged), since that coin would read as a payment when its balance is
    reconciled, and an address that has sent cannot be reconciled (`balances.native_balance_checks`)."""
    for _attempt in range(USED_ADDRESS_SKIPS):
        index = DerivationSlot.objects.create().pk
        address = deposit_address(config.account_xpub(), index)
        if not asset.is_native:
            return index, address
        try:
            used = ChainClient(config.chain(asset.chain_id)).address_used(address.lower())
        except ChainUnavailable as exc:
            raise PaymentError(
                _("%(asset)s cannot be used right now. Choose another asset or try again in a minute.")
                % {"asset": asset.symbol}
            ) from exc
        if not used:
            return index, address
        logger.warning("derivation index %s (%s) already holds coin or sent a transaction: skipped", index, address)
    raise PaymentError(
        _("%(asset)s cannot be used right now. Choose another asset or try again in a minute.")
        % {"asset": asset.symbol}
    )


@transaction.atomic
def invoice_create(
    *,
    order: Order,
    fiat_amount: Decimal,
    asset: config.Asset | None = None,
    purpose: str = Invoice.Purpose.ORDER,
    extension_days: int | None = None,
    now: datetime | None = None,
) -> Invoice:
    """A quote in `asset` with a deposit address of its own. The first payment's quote lasts as long as the order's
    hold; an extension's runs on its own clock, from when it is requested (the booking's hold is long gone)."""
    now = now or timezone.now()
    asset = asset or default_asset()
    if asset is None:
        raise PaymentError(_("No payment method is configured. Please contact us."))
    priced = quote(asset=asset, fiat_amount=fiat_amount, fiat_currency=order.currency, now=now)
    index, address = _new_deposit_address(asset)
    own_clock = now + timedelta(minutes=BookingPolicy.current().hold_minutes)
    expires_at = own_clock if purpose == Invoice.Purpose.EXTENSION else (order.hold_expires_at or own_clock)
    return Invoice.objects.create(
        order=order,
        purpose=purpose,
        extension_days=extension_days,
        chain_id=asset.chain_id,
        asset_symbol=asset.symbol,
        asset_contract=asset.contract,
        asset_decimals=asset.decimals,
        derivation_index=index,
        deposit_address=address.lower(),
        amount_due_units=priced.amount_due_units,
        fiat_amount=fiat_amount,
        fiat_currency=order.currency,
        rate=priced.rate,
        rate_source=priced.rate_source,
        expires_at=expires_at,
        monitor_until=expires_at + timedelta(days=settings.PAYMENTS_MONITOR_DAYS),
    )


def invoice_for_new_order(*, order: Order) -> Invoice:
    """The first invoice of an order being placed, in the same transaction (payments/checkout.py)."""
    return invoice_create(order=order, fiat_amount=order.total_price)


# Each switch derives a new deposit address the scanner watches: bounded per order.
ASSET_SWITCHES_PER_WINDOW = 5
ASSET_SWITCH_WINDOW = timedelta(hours=1)


@transaction.atomic
def invoice_change_asset(*, order: Order, asset_key: str, now: datetime | None = None) -> Invoice:
    """The researcher picks another asset or chain: a new quote and address replace the current invoice (at most
    ASSET_SWITCHES_PER_WINDOW times an hour). The replaced one stays watched while its quote would have been valid
    (a payment still arriving there is recorded and flagged for an operator), then only if it received
    something."""
    now = now or timezone.now()
    chain_id, _sep, symbol = asset_key.partition(":")
    asset = config.asset(number, symbol) if (number := whole_number(chain_id)) is not None else None
    if asset is None:
        raise PaymentError(_("Choose one of the payment methods listed."), field="asset")
    order = lock_order(order.pk)
    current = (
        Invoice.objects.select_for_update()
        .filter(order=order, purpose=Invoice.Purpose.ORDER)
        .exclude(status=Invoice.Status.INVALID)
        .order_by("-created_at")
        .first()
    )
    if order.status != OrderStatus.AWAITING_PAYMENT or current is None or current.status != Invoice.Status.NEW:
        raise PaymentError(_("The payment method can no longer be changed for this order."))
    if current.transfers.exists() or current.amount_confirmed_units or current.amount_pending_units:
        raise PaymentError(_("A transfer was already seen for this invoice: the payment method cannot change."))
    if (current.chain_id, current.asset_symbol) == (asset.chain_id, asset.symbol):
        return current
    recent = OrderEvent.objects.filter(
        order=order, reason="payment method changed", created_at__gte=now - ASSET_SWITCH_WINDOW
    ).count()
    if recent >= ASSET_SWITCHES_PER_WINDOW:
        raise PaymentError(
            _("The payment method was changed too often. Please wait a few minutes, or pay with the current one.")
        )
    current.status = Invoice.Status.INVALID
    current.save(update_fields=["status"])
    replacement = invoice_create(order=order, fiat_amount=current.fiat_amount, asset=asset, now=now)
    booking.order_note(
        order=order,
        reason="payment method changed",
        actor_kind=OrderEvent.Actor.CUSTOMER,
        evidence={"from": f"{current.chain_id}:{current.asset_symbol}", "to": asset.key},
    )
    return replacement


def invoice_customer_paid(*, invoice: Invoice, tx_hint: str = "", now: datetime | None = None) -> None:
    """Record the click first (kept even when the broker is down), then ask for a check of the chain. A pasted
    transaction hash is also read on chain by itself (payments/tx_hints.py), while the invoice is open or within
    its monitoring window; the same hash already credited is not read again."""
    now = now or timezone.now()
    tx_hint = tx_hint.strip().lower()
    if tx_hint and not _TX_HASH.fullmatch(tx_hint):
        raise PaymentError(
            _("A transaction hash is 0x followed by 64 hexadecimal characters. Leave it empty if unsure."),
            field="tx_hint",
        )
    check_hint = False
    with transaction.atomic():
        order, invoice = lock_invoice(invoice)
        if tx_hint and not (invoice.is_open or now < invoice.monitor_until):
            raise PaymentError(_("This invoice is no longer watched: contact us with your transaction hash."))
        if tx_hint and (
            tx_hint != invoice.customer_tx_hint or invoice.customer_tx_outcome != Invoice.TxHintOutcome.CREDITED
        ):
            invoice.customer_tx_hint, invoice.customer_tx_outcome = tx_hint, Invoice.TxHintOutcome.CHECKING
            check_hint = True
        invoice.customer_paid_at = now
        invoice.native_checked_at = None  # a native balance no transaction explains is read first
        invoice.save(update_fields=["customer_paid_at", "customer_tx_hint", "customer_tx_outcome", "native_checked_at"])
        booking.order_note(
            order=order,
            reason="customer says they paid",
            actor_kind=OrderEvent.Actor.CUSTOMER,
            evidence={"tx_hint": tx_hint} if tx_hint else {},
        )
    if check_hint:
        _request_tx_hint_check(invoice_id=invoice.pk)
    invoice_request_check(invoice_id=invoice.pk, now=now)


def tx_hint_pending_key(invoice_id: int) -> str:
    return f"invoice-tx-hint-pending:{invoice_id}"


def _request_tx_hint_check(*, invoice_id: int) -> None:
    """Queue the reading of the invoice's pasted hash, unless a chain of readings is already queued or retrying:
    that one reads the invoice's current hash at its next attempt, with a full count of retries for a new hash
    (payments/tasks.py). Ten pastes an hour start at most one chain, not ten."""
    if not cache.add(tx_hint_pending_key(invoice_id), {}, timeout=CHECK_PENDING_SECONDS):
        return
    try:
        enqueue.check_tx_hint_now(invoice_id)
    except Exception as exc:  # not queued: the scan still finds the payment; the next paste asks again
        cache.delete(tx_hint_pending_key(invoice_id))
        logger.warning("could not queue the check of the transaction hash of invoice %s: %s", invoice_id, exc)


# While a check of an invoice is queued or retrying, its key is held (renewed by each attempt, which waits at most
# a minute before the next, and whose scan may hold the chain's two-minute lease more than once): a worker lost
# mid-chain frees it within this time.
CHECK_PENDING_SECONDS = 600


def check_pending_key(invoice_id: int) -> str:
    return f"invoice-check-pending:{invoice_id}"


def invoice_request_check(*, invoice_id: int, now: datetime | None = None) -> bool:
    """Ask a worker to check this invoice now. False (and the invoice says "check delayed") if the broker is
    unreachable; beat's scan will find the payment anyway once it is back."""
    now = now or timezone.now()
    invoice = Invoice.objects.filter(pk=invoice_id).first()
    if invoice is None:
        return False
    # Asked, and its balance read first at the next scan, whoever asked (payments/balances.py): a payment the
    # cursor passed is found from there. Written before the check is queued, which may run at once. Bookkeeping
    # no page shows: no save, no cache to follow.
    Invoice.objects.filter(pk=invoice_id).update(native_checked_at=None, check_requested_at=now)
    if not cache.add(check_pending_key(invoice_id), True, timeout=CHECK_PENDING_SECONDS):
        # A check of this invoice is already queued or retrying: another press starts no second chain of retries.
        invoice.check_requested_at = now
        invoice.save(update_fields=["check_requested_at"])
        return True
    try:
        enqueue.check_invoice_now(invoice_id)
    except Exception as exc:  # kombu/redis raise many types; any of them means "not queued"
        cache.delete(check_pending_key(invoice_id))
        logger.warning("could not queue the check of invoice %s: %s", invoice_id, exc)
        if invoice.check_delayed_since is None:
            invoice.check_delayed_since = now
            invoice.save(update_fields=["check_delayed_since"])
        return False
    invoice.check_requested_at = now
    invoice.save(update_fields=["check_requested_at"])
    return True


def lock_invoice(invoice: Invoice) -> tuple[Order, Invoice]:
    """Lock the invoice's order, then the invoice (booking/locks.py gives the order), inside a transaction."""
    order = lock_order(invoice.order_id)
    return order, Invoice.objects.select_for_update().get(pk=invoice.pk)
