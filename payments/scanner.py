"""The chain scanner, the only code that moves an invoice towards paid: `chain_scan` reads one chain from its
persisted cursor and applies what it shows. The scanner is the source of truth: nothing here trusts an amount,
an address or a transaction from a request.

A cycle holds the chain through a lease on its `ChainCursor` (a second scan at the same moment skips), reads the
allow-listed token logs and, where the native coin is accepted, the blocks of each range, records them
(`payments/transfers.py`) and commits them with the cursor in batches of at most CATCH_UP_BATCH blocks (the lease
is renewed at each), then moves the invoices whose amounts or deadlines changed, each in its own transaction
(`payments/settlement.py`). While the chain does not answer, the
outage is recorded on the cursor and the holds about to run out are kept alive; when it answers again, quotes and
holds move by the length of the outage.

Locks, when several are taken: order, then invoice, then allocation rows (booking/locks.py).
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Exists, Min, OuterRef, Q, Sum
from django.utils import timezone

from booking import services as booking
from booking.models import OrderStatus
from payments import balances, config
from payments.chain import ChainClient, ChainUnavailable
from payments.chain_answers import TransferLog
from payments.invoices import lock_invoice
from payments.models import ChainCursor, Invoice, Transfer
from payments.selectors import watched_invoices
from payments.settlement import invoice_apply_chain_state
from payments.transfers import WatchedAddress, apply_logs

logger = logging.getLogger(__name__)


# How long a scan holds its chain before another may take it over (renewed at every batch it commits).
SCAN_LEASE = timedelta(minutes=2)
# Blocks read, recorded and committed at once: a catch-up after an outage holds one such batch at a time.
CATCH_UP_BATCH = 100
# Headers of blocks not final yet kept between cycles (a chain with `finalized` can have thousands on fast chains).
BLOCKS_REMEMBERED = 10_000
BLOCKS_REMEMBERED_SECONDS = 3600
# While a chain cannot be checked, every failed scan keeps the holds about to run out alive this much longer.
OUTAGE_HOLD_GRACE = timedelta(minutes=5)


@dataclass
class ScanResult:
    chain_id: int
    skipped: bool = False
    head: int = 0
    confirmed: int = 0
    invoices: int = 0
    logs: int = 0  # transfers to watched addresses
    skipped_logs: int = 0  # logs that were not a well-formed transfer of an allow-listed token, or failed to save
    ranges: int = 0
    failed_invoices: int = 0
    rpc_calls: int = 0
    unread: int = 0  # (block, contract, address) left unread in blocks crowded beyond the provider's cap
    balance_checks: int = 0  # balances read for payments the cursor's reading did not show (payments/balances.py)
    not_ready_from: int | None = None  # the first block no URL could serve logs for yet: read again next cycle
    settled: list[int] = field(default_factory=list)


def _watched_addresses(chain_id: int, now: datetime) -> dict[str, WatchedAddress]:
    """Every watched deposit address of the chain: three small columns per invoice, to match logs against."""
    rows = Invoice.objects.filter(watched_invoices(now), chain_id=chain_id).values_list(
        "deposit_address", "pk", "asset_contract"
    )
    return {address: WatchedAddress(invoice_id=pk, asset_contract=contract) for address, pk, contract in rows}


def _invoices_to_review(chain_id: int, now: datetime) -> list[Invoice]:
    """The watched invoices a cycle may have to move, loaded whole: those with a transfer, a deadline reached, a
    transfer being confirmed, amounts to take back, or a delayed check. An invoice waiting with nothing seen costs
    nothing more than its address."""
    has_transfer = Exists(Transfer.objects.filter(invoice=OuterRef("pk")))
    return list(
        Invoice.objects.filter(watched_invoices(now), chain_id=chain_id).filter(
            has_transfer
            | Q(status=Invoice.Status.NEW, expires_at__lte=now)
            | Q(status=Invoice.Status.PROCESSING)
            | Q(check_delayed_since__isnull=False)
            | Q(amount_confirmed_units__gt=0)
            | Q(amount_pending_units__gt=0)
        )
    )


def chain_scan(*, chain_id: int, client: ChainClient | None = None, now: datetime | None = None) -> ScanResult:
    """One pass over every watched invoice of a chain, from the persisted cursor.

    The chain is hostile input: logs are read by allow-listed token contract and matched to deposit addresses
    here; a log that is not a well-formed transfer is skipped and counted; each block range is committed with the
    cursor, so one bad item costs at most its range, never the chain's progress. Safe to run twice at once: the
    second finds the chain leased and skips. Raises ChainUnavailable (after recording it) when no RPC URL answers;
    what earlier ranges committed stays.

    What the settlements cause (approval, e-mails) runs after each commit, on the order's events: it can neither
    slow the scan nor undo it."""
    chain = config.chain(chain_id)
    if chain is None:
        raise ValueError(f"chain {chain_id} is not configured")
    client = client or ChainClient(chain)
    now = now or timezone.now()
    ChainCursor.objects.get_or_create(chain_id=chain_id)
    cursor = _cursor_take_lease(chain_id)
    if cursor is None:
        return ScanResult(chain_id=chain_id, skipped=True)
    result = ScanResult(chain_id=chain_id)
    try:
        _scan(chain=chain, client=client, cursor=cursor, result=result, now=now)
    except ChainUnavailable as exc:
        _record_unavailable(cursor=cursor, error=str(exc), now=now)
        raise
    finally:
        result.rpc_calls = client.calls
        _cursor_release_lease(cursor)
    return result


def _cursor_take_lease(chain_id: int) -> ChainCursor | None:
    """The chain's cursor, leased to this scan; None while another scan holds it. The lease runs on the wall
    clock, whatever `now` a caller passes."""
    clock = timezone.now()
    with transaction.atomic():
        cursor = ChainCursor.objects.select_for_update(skip_locked=True).filter(chain_id=chain_id).first()
        if cursor is None or (cursor.scan_lease_until is not None and cursor.scan_lease_until > clock):
            return None
        cursor.scan_lease_until = clock + SCAN_LEASE
        cursor.save(update_fields=["scan_lease_until"])
    return cursor


def _cursor_release_lease(cursor: ChainCursor) -> None:
    # Only our own lease: a scan that outlived it may have been taken over. Bookkeeping no page shows.
    ChainCursor.objects.filter(pk=cursor.pk, scan_lease_until=cursor.scan_lease_until).update(scan_lease_until=None)


def _scan(
    *,
    chain: config.Chain,
    client: ChainClient,
    cursor: ChainCursor,
    result: ScanResult,
    now: datetime,
) -> None:
    # A node whose head is behind the cursor is lagging, not reorganised: the client asks the next URL.
    head = client.head(not_below=cursor.confirmed_block)
    confirmed = min(head, client.confirmed_block(head))
    if cursor.unavailable_since is not None:
        _holds_move_by_outage(cursor=cursor, now=now)
    result.head, result.confirmed = head, confirmed
    by_address = _watched_addresses(chain.chain_id, now)
    result.invoices = len(by_address)
    watched = Invoice.objects.filter(watched_invoices(now), chain_id=chain.chain_id)
    recipients = frozenset(by_address)
    # The chain's native coin is read from the transactions of each block: then the hashes of all of them are
    # known too. A block not final yet that an earlier cycle read is checked by hash (see ChainClient.block_range).
    reads_blocks = any(asset.is_native for asset in chain.assets)
    start = _first_block_to_read(chain=chain, cursor=cursor, confirmed=confirmed, watched=watched)
    ranges = client.log_ranges(
        from_block=start,
        to_block=head,
        tokens=frozenset(chain.token_contracts),
        recipients=recipients,
        ready_to=confirmed,
    )
    # The blocks read by earlier cycles and not final yet: checked by header, read again only when replaced. A new
    # deposit address (a newer invoice) may have been paid in a block read before it was watched: all in full then.
    newest_invoice = max((watched_address.invoice_id for watched_address in by_address.values()), default=0)
    memory = _blocks_remembered(chain.chain_id, newest_invoice) if reads_blocks else {}
    for log_range in ranges:
        # Committed in batches of at most CATCH_UP_BATCH blocks: a long catch-up keeps what it read so far, holds
        # at most one batch of blocks at a time, and renews its lease at every batch.
        for batch_start in range(log_range.start, log_range.end + 1, CATCH_UP_BATCH):
            batch_end = min(log_range.end, batch_start + CATCH_UP_BATCH - 1)
            if not _scan_batch(
                chain=chain,
                client=client,
                cursor=cursor,
                result=result,
                batch=(batch_start, batch_end),
                logs=[log for log in log_range.logs if batch_start <= log.block_number <= batch_end],
                skipped=log_range.skipped if batch_start == log_range.start else 0,
                by_address=by_address,
                watched=watched,
                confirmed=confirmed,
                memory=memory if reads_blocks else None,
                now=now,
            ):
                return  # another scan took the chain over
            if reads_blocks:
                _blocks_remember(chain.chain_id, newest_invoice, memory, above=cursor.confirmed_block)
        result.ranges += 1
    result.unread = len(client.unread)
    result.not_ready_from = client.not_ready_from
    result.balance_checks = balances.balance_checks(chain=chain, client=client, confirmed=confirmed, now=now)
    invoices = _invoices_to_review(chain.chain_id, now)
    result.settled = _move_invoices(invoices=invoices, head=head, result=result, now=now)
    _mark_checked(cursor=cursor, invoices=invoices, head=head, now=now)


def _scan_batch(
    *,
    chain: config.Chain,
    client: ChainClient,
    cursor: ChainCursor,
    result: ScanResult,
    batch: tuple[int, int],
    logs: list,
    skipped: int,
    by_address: dict[str, WatchedAddress],
    watched,
    confirmed: int,
    memory: dict[int, tuple[str, int, str]] | None,
    now: datetime,
) -> bool:
    """Read, record and commit the blocks of `batch` (the token `logs` already read for it): the cursor moves and
    the lease is renewed with the commit. False when the lease was taken over (nothing more may be written)."""
    start, end = batch
    recipients = frozenset(by_address)
    matched = [log for log in logs if log.recipient in by_address]
    seen = list(
        Transfer.objects.filter(chain_id=chain.chain_id, status=Transfer.Status.SEEN, block_number__range=(start, end))
    )
    if memory is not None:
        block_range = client.block_range(start=start, end=end, recipients=recipients, known=memory)
        read, skipped = block_range.blocks, skipped + block_range.skipped
        matched += block_range.transfers
        # A block whose hash did not change holds the transactions it held: its native transfers are those
        # recorded when it was read, given again so that they become final with their block.
        matched += [
            _native_transfer_log(transfer)
            for transfer in seen
            if transfer.block_number in block_range.unchanged
            and not transfer.token_contract
            and transfer.block_hash == read[transfer.block_number][0]
            and transfer.to_address in by_address
        ]
        for number in [number for number in memory if start <= number <= end]:
            del memory[number]
        memory.update(block_range.links)
    else:
        # Canonical hashes: of the blocks whose transfers may become final, and of the blocks of transfers
        # seen before (a block replaced under one means it was removed by a reorganisation).
        blocks = {log.block_number for log in matched if log.block_number <= confirmed}
        blocks |= {transfer.block_number for transfer in seen}
        read = client.blocks(sorted(blocks)) if blocks else {}
    canonical = {number: block_hash for number, (block_hash, _time) in read.items()}
    block_times = {number: timestamp for number, (_hash, timestamp) in read.items()}
    with transaction.atomic():
        failed = apply_logs(
            chain=chain,
            logs=matched,
            by_address=by_address,
            seen=seen,
            confirmed=confirmed,
            canonical=canonical,
            block_times=block_times,
            now=now,
        )
        skipped += failed
        if not _cursor_advance(cursor=cursor, to_block=min(end, confirmed), skipped=skipped, watched=watched):
            transaction.set_rollback(True)
            return False
    if skipped:
        logger.warning(
            "chain %s: %s log(s) or transaction(s) in blocks %s-%s skipped (malformed or not storable)",
            chain.chain_id,
            skipped,
            start,
            end,
        )
    result.logs += len(matched)
    result.skipped_logs += skipped
    return True


def _native_transfer_log(transfer: Transfer) -> TransferLog:
    return TransferLog(
        tx_hash=transfer.tx_hash,
        log_index=transfer.log_index,
        block_number=transfer.block_number,
        block_hash=transfer.block_hash,
        token="",
        sender=transfer.from_address,
        recipient=transfer.to_address,
        amount=int(transfer.amount_units),
    )


def _blocks_key(chain_id: int) -> str:
    return f"chain-scan-blocks:{chain_id}"


def _blocks_remembered(chain_id: int, newest_invoice: int) -> dict[int, tuple[str, int, str]]:
    """The (hash, timestamp, parent hash) of the blocks not final yet that earlier cycles read, when no newer
    invoice is watched since (else none: every block is read in full once more). Lost or evicted, it only costs
    full reads."""
    remembered = cache.get(_blocks_key(chain_id))
    if not isinstance(remembered, dict) or remembered.get("newest_invoice") != newest_invoice:
        return {}
    blocks = remembered.get("blocks")
    if not isinstance(blocks, dict):
        return {}
    # Stored as JSON: block numbers come back as text keys, the (hash, timestamp, parent) tuples as lists.
    return {int(number): tuple(link) for number, link in blocks.items()}


def _blocks_remember(chain_id: int, newest_invoice: int, memory: dict, *, above: int) -> None:
    """Keep what this cycle read of the blocks after the cursor (at most BLOCKS_REMEMBERED, the newest)."""
    for number in [number for number in memory if number <= above]:
        del memory[number]
    if len(memory) > BLOCKS_REMEMBERED:
        for number in sorted(memory)[: len(memory) - BLOCKS_REMEMBERED]:
            del memory[number]
    cache.set(
        _blocks_key(chain_id), {"newest_invoice": newest_invoice, "blocks": memory}, timeout=BLOCKS_REMEMBERED_SECONDS
    )


def _first_block_to_read(*, chain: config.Chain, cursor: ChainCursor, confirmed: int, watched) -> int:
    """After the cursor, or from the lowest block of a transfer still waiting to be final: it is read again every
    cycle until it is final or gone. A first scan starts one range back from the confirmed block."""
    start = cursor.confirmed_block + 1 if cursor.confirmed_block else max(0, confirmed - chain.max_block_range)
    lowest_seen = _lowest_seen_block(chain_id=chain.chain_id, watched=watched)
    return min(start, lowest_seen) if lowest_seen is not None else start


def _lowest_seen_block(*, chain_id: int, watched) -> int | None:
    return Transfer.objects.filter(chain_id=chain_id, status=Transfer.Status.SEEN, invoice__in=watched).aggregate(
        lowest=Min("block_number")
    )["lowest"]


def _cursor_advance(*, cursor: ChainCursor, to_block: int, skipped: int, watched) -> bool:
    """Commit a range: the cursor moves to `to_block`, or to just below a transfer still waiting to be final,
    never backwards. False when this scan's lease was taken over (nothing is written then)."""
    locked = ChainCursor.objects.select_for_update().get(pk=cursor.pk)
    if locked.scan_lease_until != cursor.scan_lease_until:
        return False
    lowest_seen = _lowest_seen_block(chain_id=cursor.chain_id, watched=watched)
    if lowest_seen is not None:
        to_block = min(to_block, lowest_seen - 1)
    cursor.confirmed_block = max(locked.confirmed_block, to_block)
    cursor.skipped_logs = locked.skipped_logs + skipped
    cursor.scan_lease_until = timezone.now() + SCAN_LEASE
    cursor.save(update_fields=["confirmed_block", "skipped_logs", "scan_lease_until"])
    return True


def _move_invoices(*, invoices: list[Invoice], head: int, result: ScanResult, now: datetime) -> list[int]:
    """Move each invoice whose amounts or deadlines changed, each in its own transaction. Returns those settled."""
    settled = []
    sums = _chain_sums([invoice.pk for invoice in invoices])
    for invoice in invoices:
        confirmed_units, pending_units = sums.get(invoice.pk, (0, 0))
        if _unchanged(invoice, confirmed_units, pending_units, now):
            continue
        try:
            if invoice_apply_chain_state(
                invoice=invoice, confirmed=confirmed_units, pending=pending_units, head=head, now=now
            ):
                settled.append(invoice.pk)
        except Exception:  # one invoice must not stop the others nor the chain: logged, tried again next cycle
            logger.exception("invoice %s could not be moved to what the chain shows", invoice.pk)
            result.failed_invoices += 1
    return settled


def _mark_checked(*, cursor: ChainCursor, invoices: list[Invoice], head: int, now: datetime) -> None:
    """Note on each invoice that it was checked at this head, and on the cursor that the chain answered."""
    # Read again: the moves above ran on their own copies.
    shown = Invoice.objects.filter(pk__in=[invoice.pk for invoice in invoices]).filter(
        Q(status=Invoice.Status.PROCESSING) | Q(check_delayed_since__isnull=False)
    )
    for invoice in shown:
        # What the order page shows: the confirmations counted from the head while a transfer is being
        # confirmed, and "check delayed". Those invoices are saved (their orders' pages change, through the
        # signal); the others need nothing: when the chain was last read is the cursor's `last_scan_at`.
        pending = invoice.status == Invoice.Status.PROCESSING
        if invoice.check_delayed_since is not None or (pending and invoice.last_seen_head != head):
            invoice.last_checked_at, invoice.last_seen_head, invoice.check_delayed_since = now, head, None
            invoice.save(update_fields=["last_checked_at", "last_seen_head", "check_delayed_since"])
    cursor.head_block, cursor.last_scan_at = max(cursor.head_block, head), now
    update_fields = ["head_block", "last_scan_at"]
    if cursor.unavailable_since is not None:  # answering again: the pages saying "check delayed" change
        cursor.unavailable_since = None
        update_fields.append("unavailable_since")
    cursor.save(update_fields=update_fields)


def _record_unavailable(*, cursor: ChainCursor, error: str, now: datetime) -> None:
    """The cursor says since when the chain does not answer: every order page on this chain says "check delayed"
    (the page reads it; no invoice needs writing). Holds about to run out are kept alive meanwhile."""
    logger.warning("chain %s unavailable: %s", cursor.chain_id, error)
    cursor.last_error, cursor.last_error_at = error[:2000], now
    update_fields = ["last_error", "last_error_at"]
    if cursor.unavailable_since is None:  # the pages of every order on this chain say "check delayed"
        cursor.unavailable_since = now
        update_fields.append("unavailable_since")
    cursor.save(update_fields=update_fields)
    _holds_keep_during_outage(cursor=cursor, now=now)


def _quotes_live_at_outage(cursor: ChainCursor):
    """Unpaid first-payment quotes of the chain that were still valid when it stopped answering."""
    return Invoice.objects.filter(
        chain_id=cursor.chain_id,
        purpose=Invoice.Purpose.ORDER,
        status=Invoice.Status.NEW,
        expires_at__gt=cursor.unavailable_since,
        order__status=OrderStatus.AWAITING_PAYMENT,
    ).select_related("order")


def _holds_keep_during_outage(*, cursor: ChainCursor, now: datetime) -> None:
    """Holds do not run out while nobody can see the payment: those about to are kept a little longer, at every
    failed scan (the recovery then moves them by the whole outage)."""
    until = now + OUTAGE_HOLD_GRACE
    for invoice in _quotes_live_at_outage(cursor).filter(order__hold_expires_at__lt=until):
        booking.order_hold_extend(
            order=invoice.order,
            until=until,
            reason="hold kept: the payment network is not answering",
            evidence={"chain_id": cursor.chain_id, "unavailable_since": cursor.unavailable_since.isoformat()},
        )


def _holds_move_by_outage(*, cursor: ChainCursor, now: datetime) -> None:
    """The chain answers again: quotes and holds that were live when it stopped move by the length of the outage,
    in the transaction that ends it (so that they move once)."""
    outage = max(now - cursor.unavailable_since, timedelta(0))
    with transaction.atomic():
        for live in _quotes_live_at_outage(cursor):
            order, invoice = lock_invoice(live)  # order first, then invoice
            invoice.expires_at += outage
            invoice.monitor_until += outage
            invoice.save(update_fields=["expires_at", "monitor_until"])
            booking.order_hold_extend(
                order=order,
                until=invoice.expires_at,
                reason="hold moved by the payment network's outage",
                evidence={"chain_id": cursor.chain_id, "outage_seconds": int(outage.total_seconds())},
            )
        cursor.unavailable_since = None
        cursor.save(update_fields=["unavailable_since"])


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
    if invoice.status == Invoice.Status.PROCESSING and now >= invoice.monitor_until:
        return False
    return not (invoice.status == Invoice.Status.PROCESSING and not pending)
