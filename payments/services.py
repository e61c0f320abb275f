"""Every write of the payments app: quoting and creating invoices, recording "I've paid", scanning a chain and
applying what it shows, admin review. The scanner is the source of truth: nothing here trusts an amount, an
address or a transaction from a request.

Locks, when several are taken: order, then invoice, then allocation rows (conventions.md #4).
"""

import logging
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone
from django.utils.translation import gettext as _

from booking import services as booking
from booking.locks import lock_order
from booking.models import BookingPolicy, Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from payments import config
from payments.addresses import deposit_address
from payments.chain import ChainClient, ChainUnavailable, TransferLog
from payments.models import ChainCursor, DerivationSlot, Invoice, OperatorRate, Transfer
from portal.numbers import whole_number

logger = logging.getLogger(__name__)

_TX_HASH = re.compile(r"0x[0-9a-fA-F]{64}")


class PaymentError(BookingError):
    """A payment rule said no; the message is translated and safe to show."""


# --- quotes and invoices -----------------------------------------------------------------------------------


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


def quote(*, asset: config.Asset, fiat_amount: Decimal, fiat_currency: str) -> Quote:
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
            rate, updated = ChainClient(chain).aggregator_rate(asset.rate_feed)
        except ChainUnavailable as exc:
            raise PaymentError(
                _("The %(asset)s rate cannot be read right now. Choose another asset or try again in a minute.")
                % {"asset": asset.symbol}
            ) from exc
        source = f"feed {asset.rate_feed} at {datetime.fromtimestamp(updated, tz=UTC).isoformat()}"
    else:
        operator_rate = OperatorRate.objects.filter(
            chain_id=asset.chain_id, asset_symbol=asset.symbol, fiat_currency=fiat_currency
        ).first()
        if operator_rate is None:
            raise PaymentError(_("%(asset)s cannot be used: no rate is set for it.") % {"asset": asset.symbol})
        rate, source = operator_rate.rate, f"operator rate of {operator_rate.updated_at.isoformat()}"
    units = (fiat_amount / rate).scaleb(asset.decimals).to_integral_value(rounding=ROUND_CEILING)
    return Quote(asset=asset, amount_due_units=int(units), rate=rate, rate_source=source)


def _new_deposit_address() -> tuple[int, str]:
    index = DerivationSlot.objects.create().pk
    return index, deposit_address(settings.PAYMENTS_XPUB, index)


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
    """A quote in `asset` with a deposit address of its own, valid as long as the order's hold."""
    now = now or timezone.now()
    asset = asset or default_asset()
    if asset is None:
        raise PaymentError(_("No payment method is configured. Please contact us."))
    priced = quote(asset=asset, fiat_amount=fiat_amount, fiat_currency=order.currency)
    index, address = _new_deposit_address()
    expires_at = order.hold_expires_at or now + timedelta(minutes=BookingPolicy.current().hold_minutes)
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
    """The first invoice of an order being placed, in the same transaction (portal/checkout.py)."""
    return invoice_create(order=order, fiat_amount=order.total_price)


@transaction.atomic
def invoice_change_asset(*, order: Order, asset_key: str, now: datetime | None = None) -> Invoice:
    """The researcher picks another asset or chain: a new quote and address replace the current invoice, which
    stays watched (a payment still arriving there is recorded and flagged for an operator)."""
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


# --- "I've paid" ---------------------------------------------------------------------------------------------


def invoice_customer_paid(*, invoice: Invoice, tx_hint: str = "", now: datetime | None = None) -> None:
    """Record the click first (kept even when the broker is down), then ask for a check of the chain."""
    now = now or timezone.now()
    tx_hint = tx_hint.strip()
    if tx_hint and not _TX_HASH.fullmatch(tx_hint):
        raise PaymentError(
            _("A transaction hash is 0x followed by 64 hexadecimal characters. Leave it empty if unsure."),
            field="tx_hint",
        )
    with transaction.atomic():
        order, invoice = lock_invoice(invoice)
        invoice.customer_paid_at = now
        invoice.customer_tx_hint = tx_hint.lower() or invoice.customer_tx_hint
        invoice.save(update_fields=["customer_paid_at", "customer_tx_hint"])
        booking.order_note(
            order=order,
            reason="customer says they paid",
            actor_kind=OrderEvent.Actor.CUSTOMER,
            evidence={"tx_hint": tx_hint.lower()} if tx_hint else {},
        )
    invoice_request_check(invoice_id=invoice.pk, now=now)


def invoice_request_check(*, invoice_id: int, now: datetime | None = None) -> bool:
    """Ask a worker to check this invoice now. False (and the invoice says "check delayed") if the broker is
    unreachable; beat's scan will find the payment anyway once it is back."""
    from payments.tasks import check_invoice

    now = now or timezone.now()
    invoice = Invoice.objects.filter(pk=invoice_id).first()
    if invoice is None:
        return False
    try:
        check_invoice.apply_async(args=[invoice_id], retry=False)
    except Exception as exc:  # kombu/redis raise many types; any of them means "not queued"
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


# --- scanning ------------------------------------------------------------------------------------------------


@dataclass
class ScanResult:
    chain_id: int
    skipped: bool = False
    head: int = 0
    confirmed: int = 0
    invoices: int = 0
    logs: int = 0
    rpc_calls: int = 0
    settled: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ChainReading:
    """What one pass read from the chain, before anything is written."""

    head: int
    confirmed: int
    from_block: int
    logs: list[TransferLog]
    balances: list[int]  # per watched invoice: at the confirmed block, then at the head
    canonical: dict[int, str]  # block number -> hash, for the blocks that confirm something


def _monitored_invoices(chain_id: int, now: datetime):
    return list(
        Invoice.objects.filter(chain_id=chain_id)
        .filter(Q(status__in=[Invoice.Status.NEW, Invoice.Status.PROCESSING]) | Q(monitor_until__gt=now))
        .exclude(status=Invoice.Status.SETTLED)
        .select_related("order")
    )


def chain_scan(*, chain_id: int, client: ChainClient | None = None, now: datetime | None = None) -> ScanResult:
    """One pass over every watched invoice of a chain, from the persisted cursor. Safe to run twice at once:
    the second finds the cursor locked and skips. Raises ChainUnavailable (after recording it) when no RPC URL
    answers; nothing else changes then.

    What the settlements cause (approval, e-mails) runs after this transaction commits, on the order's
    events: it can neither slow the scan nor undo it."""
    chain = config.chain(chain_id)
    if chain is None:
        raise ValueError(f"chain {chain_id} is not configured")
    client = client or ChainClient(chain)
    now = now or timezone.now()
    ChainCursor.objects.get_or_create(chain_id=chain_id)
    unavailable = None
    with transaction.atomic():
        cursor = ChainCursor.objects.select_for_update(skip_locked=True).filter(chain_id=chain_id).first()
        if cursor is None:
            return ScanResult(chain_id=chain_id, skipped=True)
        invoices = _monitored_invoices(chain_id, now)
        result = ScanResult(chain_id=chain_id, invoices=len(invoices))
        try:
            reading = _read_chain(client=client, chain=chain, cursor=cursor, invoices=invoices)
        except ChainUnavailable as exc:
            _record_unavailable(cursor=cursor, invoices=invoices, error=str(exc), now=now)
            unavailable = exc
        else:
            result.head, result.confirmed, result.logs = reading.head, reading.confirmed, len(reading.logs)
            result.settled = _apply_reading(chain=chain, invoices=invoices, reading=reading, now=now)
            _mark_checked(cursor=cursor, invoices=invoices, reading=reading, now=now)
        result.rpc_calls = client.calls
    if unavailable is not None:
        raise unavailable
    return result


def _read_chain(*, client: ChainClient, chain: config.Chain, cursor: ChainCursor, invoices: list[Invoice]):
    head = client.head()
    confirmed = client.confirmed_block(head)
    from_block = cursor.confirmed_block + 1 if cursor.confirmed_block else max(0, confirmed - chain.max_block_range)
    logs = client.transfer_logs(
        from_block=from_block, to_block=head, recipients=[invoice.deposit_address for invoice in invoices]
    )
    balances = client.balances(
        [(invoice.deposit_address, block) for invoice in invoices for block in (confirmed, head)]
    )
    confirming = {log.block_number for log in logs if log.block_number <= confirmed}
    canonical = client.block_hashes(sorted(confirming | ({confirmed} if invoices else set())))
    return ChainReading(
        head=head, confirmed=confirmed, from_block=from_block, logs=logs, balances=balances, canonical=canonical
    )


def _apply_reading(*, chain: config.Chain, invoices: list[Invoice], reading: ChainReading, now: datetime) -> list[int]:
    """Record the transfers read, then move each invoice whose amounts changed. Returns the invoices settled."""
    _apply_logs(
        chain=chain,
        logs=reading.logs,
        by_address={invoice.deposit_address: invoice for invoice in invoices},
        from_block=reading.from_block,
        confirmed=reading.confirmed,
        canonical=reading.canonical,
        now=now,
    )
    native_pending = _apply_native(
        chain=chain,
        invoices=invoices,
        balances=reading.balances,
        confirmed=reading.confirmed,
        head=reading.head,
        confirmed_hash=reading.canonical.get(reading.confirmed, ""),
        now=now,
    )
    settled = []
    sums = _chain_sums([invoice.pk for invoice in invoices])
    for invoice in invoices:
        confirmed_units, pending_units = sums.get(invoice.pk, (0, 0))
        if not invoice.asset_contract:
            pending_units = native_pending.get(invoice.pk, 0)
        if _unchanged(invoice, confirmed_units, pending_units, now):
            continue
        if invoice_apply_chain_state(
            invoice=invoice, confirmed=confirmed_units, pending=pending_units, head=reading.head, now=now
        ):
            settled.append(invoice.pk)
    return settled


def _mark_checked(*, cursor: ChainCursor, invoices: list[Invoice], reading: ChainReading, now: datetime) -> None:
    """Move the cursor, and note on each invoice that it was checked at this head."""
    shown, bookkeeping = [], []
    for invoice in invoices:
        # What the order page shows: the confirmations counted from the head while a transfer is being
        # confirmed, and "check delayed". Those invoices are saved (their orders' pages change, through the
        # signal); for the others the head is bookkeeping, updated in one query.
        pending = invoice.status == Invoice.Status.PROCESSING or invoice.native_seen_block is not None
        if invoice.check_delayed_since is not None or (pending and invoice.last_seen_head != reading.head):
            shown.append(invoice)
        else:
            bookkeeping.append(invoice.pk)
    for invoice in shown:
        invoice.last_checked_at, invoice.last_seen_head, invoice.check_delayed_since = now, reading.head, None
        invoice.save(update_fields=["last_checked_at", "last_seen_head", "check_delayed_since"])
    Invoice.objects.filter(pk__in=bookkeeping).update(last_checked_at=now, last_seen_head=reading.head)
    cursor.confirmed_block, cursor.head_block, cursor.last_scan_at = reading.confirmed, reading.head, now
    update_fields = ["confirmed_block", "head_block", "last_scan_at"]
    if cursor.unavailable_since is not None:  # answering again: the pages saying "check delayed" change
        cursor.unavailable_since = None
        update_fields.append("unavailable_since")
    cursor.save(update_fields=update_fields)


def _record_unavailable(*, cursor: ChainCursor, invoices: list[Invoice], error: str, now: datetime) -> None:
    logger.warning("chain %s unavailable: %s", cursor.chain_id, error)
    cursor.last_error, cursor.last_error_at = error[:2000], now
    update_fields = ["last_error", "last_error_at"]
    if cursor.unavailable_since is None:  # the pages of every order on this chain say "check delayed"
        cursor.unavailable_since = now
        update_fields.append("unavailable_since")
    cursor.save(update_fields=update_fields)
    for invoice in invoices:
        if invoice.check_delayed_since is None:
            invoice.check_delayed_since = now
            invoice.save(update_fields=["check_delayed_since"])


def _apply_logs(
    *,
    chain: config.Chain,
    logs: list[TransferLog],
    by_address: dict[str, Invoice],
    from_block: int,
    confirmed: int,
    canonical: dict[int, str],
    now: datetime,
) -> None:
    seen_keys = {(log.tx_hash, log.log_index) for log in logs}
    # Transfers seen earlier in the re-read range but absent now were removed by a reorganisation.
    for transfer in Transfer.objects.filter(
        chain_id=chain.chain_id, status=Transfer.Status.SEEN, block_number__gte=from_block, log_index__gte=0
    ):
        if (transfer.tx_hash, transfer.log_index) not in seen_keys:
            transfer.status = Transfer.Status.REMOVED
            transfer.save(update_fields=["status"])
    for log in logs:
        invoice = by_address.get(log.recipient)
        is_final = log.block_number <= confirmed and canonical.get(log.block_number) == log.block_hash
        defaults = {
            "block_number": log.block_number,
            "block_hash": log.block_hash,
            "token_contract": log.token,
            "from_address": log.sender,
            "to_address": log.recipient,
            "amount_units": log.amount,
            "invoice": invoice,
            "wrong_asset": invoice is None or log.token != invoice.asset_contract,
            "first_seen_at": now,
        }
        transfer, created = Transfer.objects.get_or_create(
            chain_id=chain.chain_id, tx_hash=log.tx_hash, log_index=log.log_index, defaults=defaults
        )
        if transfer.status == Transfer.Status.CONFIRMED:
            continue  # credited once, for good
        changed = created
        if not created and (transfer.block_hash != log.block_hash or transfer.status == Transfer.Status.REMOVED):
            for name, value in defaults.items():
                setattr(transfer, name, value)
            transfer.status = Transfer.Status.SEEN
            changed = True
        if is_final:
            transfer.status, transfer.confirmed_at = Transfer.Status.CONFIRMED, now
            changed = True
        if changed:
            transfer.save()


def _apply_native(
    *,
    chain: config.Chain,
    invoices: list[Invoice],
    balances: list[int],
    confirmed: int,
    head: int,
    confirmed_hash: str,
    now: datetime,
) -> dict[int, int]:
    """Native coin: the balance at the confirmed block beyond what was already credited is a new credit; the
    balance at the head beyond that is pending (returned per native invoice). Native coin sent to a token invoice
    is recorded as a wrong asset."""
    credited_by_invoice = {
        row["invoice"]: int(row["total"] or 0)
        for row in Transfer.objects.filter(
            invoice__in=[invoice.pk for invoice in invoices], status=Transfer.Status.CONFIRMED, token_contract=""
        )
        .values("invoice")
        .annotate(total=Sum("amount_units"))
    }
    pending_by_invoice: dict[int, int] = {}
    for position, invoice in enumerate(invoices):
        balance_confirmed, balance_head = balances[2 * position], balances[2 * position + 1]
        credited = credited_by_invoice.get(invoice.pk, 0)
        if balance_confirmed > credited:
            try:
                with transaction.atomic():
                    Transfer.objects.create(
                        chain_id=chain.chain_id,
                        tx_hash=f"balance:{invoice.deposit_address}:{confirmed}",
                        log_index=-1,
                        block_number=confirmed,
                        block_hash=confirmed_hash,
                        to_address=invoice.deposit_address,
                        amount_units=balance_confirmed - credited,
                        invoice=invoice,
                        status=Transfer.Status.CONFIRMED,
                        wrong_asset=bool(invoice.asset_contract),
                        first_seen_at=now,
                        confirmed_at=now,
                    )
            except IntegrityError:  # this block's balance was already credited
                pass
        if invoice.asset_contract:
            continue
        pending = max(0, balance_head - max(balance_confirmed, credited))
        pending_by_invoice[invoice.pk] = pending
        seen_block = (invoice.native_seen_block or head) if pending else None
        if seen_block != invoice.native_seen_block:
            invoice.native_seen_block = seen_block
            invoice.save(update_fields=["native_seen_block"])  # its order's page shows the pending coin
    return pending_by_invoice


def _chain_sums(invoice_ids: list[int]) -> dict[int, tuple[int, int]]:
    """(confirmed, seen) base units in each invoice's own asset, for many invoices in one query."""
    sums: dict[int, list[int]] = {}
    rows = (
        Transfer.objects.filter(invoice__in=invoice_ids, wrong_asset=False)
        .exclude(status=Transfer.Status.REMOVED)
        .values("invoice", "status")
        .annotate(total=Sum("amount_units"))
    )
    for row in rows:
        totals = sums.setdefault(row["invoice"], [0, 0])
        totals[0 if row["status"] == Transfer.Status.CONFIRMED else 1] += int(row["total"] or 0)
    return {invoice_id: (confirmed, seen) for invoice_id, (confirmed, seen) in sums.items()}


def _unchanged(invoice: Invoice, confirmed: int, pending: int, now: datetime) -> bool:
    """Nothing for this invoice to move: same amounts, and no deadline or lost transfer to act on."""
    if (confirmed, pending) != (int(invoice.amount_confirmed_units), int(invoice.amount_pending_units)):
        return False
    if invoice.status == Invoice.Status.NEW and now >= invoice.expires_at:
        return False
    return not (invoice.status == Invoice.Status.PROCESSING and not pending)


def invoice_apply_chain_state(*, invoice: Invoice, confirmed: int, pending: int, head: int, now: datetime) -> bool:
    """Move the invoice and its order to what the chain shows (`confirmed` and `pending` base units in its asset).
    Returns True when the invoice settled now."""
    with transaction.atomic():
        order, invoice = lock_invoice(invoice)
        was = invoice.status
        invoice.amount_confirmed_units, invoice.amount_pending_units = confirmed, pending
        due = int(invoice.amount_due_units)
        evidence = {"invoice": invoice.pk, "confirmed_units": str(confirmed), "head": head}
        if invoice.status == Invoice.Status.SETTLED:
            pass
        elif invoice.status == Invoice.Status.INVALID:
            if confirmed or pending:
                invoice.needs_operator = True  # paid to a replaced quote: refund or apply by hand
        elif confirmed >= due:
            invoice.paid_over = confirmed > due
            invoice.paid_partial = False
            invoice.paid_late = was == Invoice.Status.EXPIRED or _first_seen(invoice, now) > invoice.expires_at
            _settle(
                order=order,
                invoice=invoice,
                actor_kind=OrderEvent.Actor.SYSTEM,
                reason="payment confirmed on chain",
                evidence=evidence,
                now=now,
            )
            return True
        elif pending:
            invoice.status = Invoice.Status.PROCESSING
            invoice.paid_partial = 0 < confirmed < due
        else:
            invoice.paid_partial = 0 < confirmed < due
            invoice.status = Invoice.Status.EXPIRED if now >= invoice.expires_at else Invoice.Status.NEW
        _follow_chain(order=order, invoice=invoice, was=was, evidence=evidence, now=now)
        invoice.save()
    return False


def _first_seen(invoice: Invoice, now: datetime) -> datetime:
    first = (
        (invoice.transfers.filter(wrong_asset=False).exclude(status=Transfer.Status.REMOVED).order_by("first_seen_at"))
        .values_list("first_seen_at", flat=True)
        .first()
    )
    return first or now


def _follow_chain(*, order: Order, invoice: Invoice, was: str, evidence: dict, now: datetime) -> None:
    """Before settlement, the order follows what the chain shows: a transfer seen, or gone again (reorg)."""
    if invoice.purpose != Invoice.Purpose.ORDER:
        return
    if invoice.status == Invoice.Status.PROCESSING and order.status == OrderStatus.AWAITING_PAYMENT:
        booking.order_transition(
            order=order,
            to_status=OrderStatus.PAYMENT_PROCESSING,
            actor_kind=OrderEvent.Actor.SYSTEM,
            reason="transfer seen on chain",
            evidence=evidence,
            now=now,
        )
    elif (
        invoice.status in (Invoice.Status.NEW, Invoice.Status.EXPIRED)
        and was == Invoice.Status.PROCESSING
        and order.status == OrderStatus.PAYMENT_PROCESSING
    ):
        booking.order_transition(
            order=order,
            to_status=OrderStatus.AWAITING_PAYMENT,
            actor_kind=OrderEvent.Actor.SYSTEM,
            reason="transfer no longer on chain (reorganisation)",
            evidence=evidence,
            now=now,
        )


def _settle(
    *,
    order: Order,
    invoice: Invoice,
    actor_kind: str,
    reason: str,
    evidence: dict,
    now: datetime,
    actor: AbstractBaseUser | None = None,
) -> None:
    """Settle a locked invoice and carry it to its order: the one way an invoice is paid, seen on chain by the
    scanner or marked by an admin. An extension moves the window's end; a first payment makes the order paid
    (what follows, such as auto-approval, reacts to that transition), or holds its lots again when it came after
    the hold expired. When the order cannot take the payment any more (cancelled meanwhile, lots taken), the
    invoice is flagged for an operator: a refund or a new date is owed."""
    invoice.status, invoice.settled_at = Invoice.Status.SETTLED, now
    try:
        if invoice.purpose == Invoice.Purpose.EXTENSION:
            booking.order_extend(order=order, days=invoice.extension_days, evidence=evidence)
        elif order.status in (OrderStatus.AWAITING_PAYMENT, OrderStatus.PAYMENT_PROCESSING):
            booking.order_transition(
                order=order,
                to_status=OrderStatus.PAID,
                actor_kind=actor_kind,
                actor=actor,
                reason=reason,
                evidence=evidence,
                now=now,
            )
        elif order.status == OrderStatus.EXPIRED:
            booking.order_reallocate_after_late_payment(order=order, evidence=evidence, now=now, actor=actor)
        else:
            raise BookingError(_("This order can no longer take a payment."))
    except BookingError as exc:
        invoice.needs_operator = True
        booking.order_note(
            order=order,
            reason=f"payment kept for an operator ({reason}): {exc.message}",
            actor_kind=actor_kind,
            actor=actor,
            evidence=evidence,
        )
    invoice.save()
    invoice_id = invoice.pk
    transaction.on_commit(lambda: _send_payment_received(invoice_id))


def _send_payment_received(invoice_id: int) -> None:
    from payments.tasks import send_payment_received

    send_payment_received.delay(invoice_id)


# --- admin review --------------------------------------------------------------------------------------------


@transaction.atomic
def invoice_mark_paid(*, invoice: Invoice, user: AbstractBaseUser, reason: str, now: datetime | None = None) -> None:
    """An admin settles an invoice by hand (e.g. paid by another route). The reason is required and audited."""
    now = now or timezone.now()
    reason = reason.strip()
    if not reason:
        raise PaymentError(_("Give the reason for marking this invoice paid."), field="reason")
    order, invoice = lock_invoice(invoice)
    if invoice.status == Invoice.Status.SETTLED:
        raise PaymentError(_("This invoice is already paid."))
    invoice.marked, invoice.marked_reason, invoice.marked_by = True, reason, user
    _settle(
        order=order,
        invoice=invoice,
        actor_kind=OrderEvent.Actor.ADMIN,
        actor=user,
        reason=f"marked paid: {reason}",
        evidence={"invoice": invoice.pk, "marked_by": user.get_username(), "reason": reason},
        now=now,
    )


# --- reactions to the order's transitions (connected in payments/apps.py) ------------------------------------

# Paid for and then refused or called off: the money goes back, by an operator's hand.
REFUND_OWED = frozenset({OrderStatus.CANCELLED, OrderStatus.REJECTED})


def on_order_status_changed(*, order_id: int, to_status: str, **kwargs) -> None:
    if to_status in REFUND_OWED:
        invoices_flag_refund(order_id=order_id)


def invoices_flag_refund(*, order_id: int) -> int:
    """Flag the settled invoices of an order that will not be served: a refund is owed."""
    flagged = 0
    with transaction.atomic():
        for invoice in Invoice.objects.select_for_update().filter(
            order_id=order_id, status=Invoice.Status.SETTLED, needs_operator=False
        ):
            invoice.needs_operator = True
            invoice.save(update_fields=["needs_operator"])
            flagged += 1
    return flagged
