"""The balance safety net: payments that the cursor's reading of logs and blocks cannot show, found by reading
what the deposit addresses hold, independently of the cursor.

- Native coin can reach an address without a transaction to it: a contract pays it on (a smart-contract wallet,
  an exchange's batch payout). The balances of open native-coin invoices, and of those expired within their
  monitoring window (such a payment near expiry is confirmed only after the scan expired the invoice), are read
  at the last block the scan has read; a rise that no recorded credit explains is credited, dated by the block
  where the balance rose (a bounded binary search), so that a payment made in time is judged in time; a direct
  transfer found in that block (its block passed by the cursor) is credited under its own hash instead.
- A token payment can be missed by the scan's log reading (a lagging node that answered less than asked, behind a
  load balancer that sent the range's end header to another backend). The token balance of every open token
  invoice (and of those expired within their monitoring window) is read at the confirmed block (one batch, or one
  call through the chain's Multicall3): every 10 minutes once its customer said "I've paid" (or an admin
  re-checked), otherwise every 30 minutes while the quote is open, once 5 minutes after it expired and every 6 hours
  after that, 20 such reads a cycle whatever else is asked. A read
  at an explicit block proves its own coverage: a backend without that block answers an error, never an older
  balance. When the balance is higher than the recorded credits explain, the token's Transfer logs to that
  address alone are read over the invoice's life and recorded like the scan's own (their (chain, transaction,
  log index) key: never counted twice); what they still leave unexplained is looked for again at the next read.

Every read is bounded per cycle, in invoices and in round trips; the chain is hostile input: a credit comes from a
parsed log, or from balances read at blocks the scan has read. `payments/scanner.py` calls `balance_checks` once a
cycle, after its ranges are committed.
"""

import logging
from datetime import datetime, timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import F, Q, Sum

from payments import config
from payments.chain import ChainClient, ChainUnavailable, RangeNotReady, RangeRefused
from payments.chain_answers import MAX_TRANSFER_UNITS, BlockRange, parse_timestamp
from payments.models import ChainCursor, Invoice, Transfer
from payments.selectors import watched_invoices
from payments.transfers import WatchedAddress, apply_logs

logger = logging.getLogger(__name__)

# Native-coin invoices whose balance is read in one cycle, for coin that no transaction explains.
NATIVE_BALANCE_CHECKS_PER_CYCLE = 50
# Rises dated in one cycle (each a binary search of at most RISE_SEARCH_CALLS balance reads): the others wait
# for the next cycle, first in line.
RISES_DATED_PER_CYCLE = 5
RISE_SEARCH_CALLS = 20  # 2**20 blocks: months on Ethereum, weeks on a 2-second chain
# The state every full node keeps (geth keeps 128 blocks unless it is an archive node): a balance read within it
# that fails is an outage; beyond it, pruned state.
RECENT_STATE_BLOCKS = 128
# Token invoices whose balance is read in one cycle: those whose customer said "I've paid" (or an admin asked a
# re-check) first, each again at most every TOKEN_RECHECK_AFTER; every other open one (or expired within its
# monitoring window) at most every TOKEN_SWEEP_AFTER, so that a payment the log reading missed with nobody saying so
# is still found (a load balancer that splits a batch defeats the range's end-header proof).
TOKEN_BALANCE_CHECKS_PER_CYCLE = 50
TOKEN_RECHECK_AFTER = timedelta(minutes=10)
TOKEN_SWEEP_AFTER = timedelta(minutes=30)
TOKEN_SWEEP_EXPIRED_AFTER = timedelta(hours=6)
SWEEP_AFTER_EXPIRY = timedelta(minutes=5)
# Unasked balances read in one cycle: a cycle when nothing changed stays within its byte budget (bench/chain_scan.py),
# and 20 a cycle at the 10 s scan period sweeps 3,600 open token invoices every 30 minutes (more stretch the period).
TOKEN_SWEEPS_PER_CYCLE = 20
OPEN = [Invoice.Status.NEW, Invoice.Status.PROCESSING]
# What the nets read: open quotes, expired ones, and replaced ones (a payment still arriving at a replaced quote's
# address is recorded and flagged for an operator), within the scan's watch (payments.selectors.watched_invoices).
NETTED = [Invoice.Status.NEW, Invoice.Status.PROCESSING, Invoice.Status.EXPIRED, Invoice.Status.INVALID]
# Address-filtered log reads in one cycle, each over at most LOG_SEARCH_CALLS ranges back from the confirmed
# block, until a range starts before the invoice was created (less this margin for clocks that disagree).
LOG_SEARCHES_PER_CYCLE = 5
LOG_SEARCH_CALLS = 10
CLOCK_MARGIN = timedelta(minutes=5)
# How long a search that ran out of round trips is remembered, to go on below where it stopped: the invoice is not
# marked checked, so it is searched again within a few cycles.
RESUME_SECONDS = 600


def balance_checks(*, chain: config.Chain, client: ChainClient, confirmed: int, now: datetime) -> int:
    """One cycle of the safety net. Returns how many balances were read. A net that cannot read what it needs (a
    node that no longer serves an old block's state, an outage) skips this cycle: it never stops the scan that
    called it, whose ranges are committed and whose invoices still move."""
    read = 0
    for check in (native_balance_checks, token_balance_checks):
        try:
            read += check(chain=chain, client=client, confirmed=confirmed, now=now)
        except (ChainUnavailable, RangeNotReady, RangeRefused, ValueError) as exc:
            logger.warning("chain %s: %s skipped this cycle: %s", chain.chain_id, check.__name__, exc)
    return read


# --- native coin ---------------------------------------------------------------------------------------------
def native_balance_checks(*, chain: config.Chain, client: ChainClient, confirmed: int, now: datetime) -> int:
    """Read, at the last block the scan has read (the cursor, at most `confirmed`: below it every transaction to
    the address is recorded already), the balance and nonce of at most NATIVE_BALANCE_CHECKS_PER_CYCLE native-coin
    invoices, open or expired within their monitoring window: those whose customer said "I've paid" since their
    last check first (the click clears it), then those checked longest ago. Where the address never sent a
    transaction (nonce 0: no sweep, no fee, nothing left it), its balance is exactly what it received; what
    exceeds the credits recorded up to that block is credited, at the block where the balance rose. An address
    that has sent a transaction (swept while a payment was awaited) is not reconciled this way: its direct
    payments still count. Returns how many balances were read."""
    invoices = list(
        Invoice.objects.filter(chain_id=chain.chain_id, asset_contract="", monitor_until__gt=now)
        .filter(watched_invoices(now), status__in=NETTED)
        .order_by(F("native_checked_at").asc(nulls_first=True), F("customer_paid_at").desc(nulls_last=True), "pk")
        .only("pk", "deposit_address", "amount_due_units")[:NATIVE_BALANCE_CHECKS_PER_CYCLE]
    )
    if not invoices:
        return 0
    read_to = _read_up_to(chain_id=chain.chain_id, confirmed=confirmed)
    addresses = [invoice.deposit_address for invoice in invoices]
    (block_hash, _time), readings = client.native_balances(addresses, block=read_to)
    credits: dict[str, list[tuple[int, int]]] = {}
    for address, block_number, amount in (
        Transfer.objects.filter(
            chain_id=chain.chain_id, token_contract="", to_address__in=addresses, block_number__lte=read_to
        )
        .exclude(status=Transfer.Status.REMOVED)
        .values_list("to_address", "block_number", "amount_units")
    ):
        credits.setdefault(address, []).append((block_number, int(amount)))
    checked, dated = [], 0
    for invoice, (balance, nonce) in zip(invoices, readings, strict=True):
        address = invoice.deposit_address
        unexplained = balance - sum(amount for _block, amount in credits.get(address, []))
        if nonce or unexplained <= 0 or not block_hash:
            checked.append(invoice.pk)
            continue
        if dated >= RISES_DATED_PER_CYCLE:
            continue  # not marked checked: first in line next cycle
        dated += 1
        # Dated by the block where the address first held what the invoice still lacked (or the whole rise, when
        # it was paid already): coin a stranger adds later (dust forwarded by a contract) never makes an on-time
        # payment late.
        lacking = int(invoice.amount_due_units) - sum(amount for _block, amount in credits.get(address, []))
        target = min(unexplained, lacking) if lacking > 0 else unexplained
        try:
            rise = _block_of_rise(
                client=client, address=address, credits=credits.get(address, []), unexplained=target, block=read_to
            )
            rise_block = client.block_range(start=rise, end=rise, recipients=frozenset({address}))
        except ChainUnavailable as exc:
            logger.warning("chain %s: the rise of %s's balance could not be dated: %s", chain.chain_id, address, exc)
            continue
        if not rise_block.blocks.get(rise, ("", 0))[0]:
            continue
        _credit_rise(chain=chain, invoice=invoice, rise=rise, rise_block=rise_block, unexplained=unexplained, now=now)
        checked.append(invoice.pk)
    Invoice.objects.filter(pk__in=checked).update(native_checked_at=now)
    return len(invoices)


def _credit_rise(
    *, chain: config.Chain, invoice: Invoice, rise: int, rise_block: BlockRange, unexplained: int, now: datetime
) -> None:
    """Credit the `unexplained` coin that reached the invoice's address in block `rise`. A successful transaction
    of that block paying the address (a direct payment the scan did not record: its cursor was moved past it) is
    credited under its own hash, as the scan or a pasted hash would: never twice. What remains came from a
    contract and is credited as "balance:<address>:<block>", dated by that block."""
    address = invoice.deposit_address
    rise_hash, rise_time = rise_block.blocks[rise]
    recorded = set(
        Transfer.objects.filter(
            chain_id=chain.chain_id, log_index=-1, tx_hash__in=[direct.tx_hash for direct in rise_block.transfers]
        ).values_list("tx_hash", flat=True)
    )
    direct = [
        payment
        for payment in rise_block.transfers
        if payment.recipient == address and payment.tx_hash not in recorded and payment.block_hash == rise_hash
    ]
    with transaction.atomic():
        if direct:
            apply_logs(
                chain=chain,
                logs=direct,
                by_address={address: WatchedAddress(invoice_id=invoice.pk, asset_contract="")},
                seen=[],
                confirmed=rise,
                canonical={rise: rise_hash},
                block_times={rise: rise_time},
                now=now,
            )
        remainder = unexplained - sum(payment.amount for payment in direct)
        if remainder <= 0:
            return
        Transfer.objects.get_or_create(
            chain_id=chain.chain_id,
            tx_hash=f"balance:{address}:{rise}",
            log_index=-1,
            defaults={
                "block_number": rise,
                "block_hash": rise_hash,
                "block_time": parse_timestamp(rise_time) if rise_time else None,
                "to_address": address,
                "amount_units": min(remainder, MAX_TRANSFER_UNITS),
                "invoice": invoice,
                "status": Transfer.Status.CONFIRMED,
                "first_seen_at": now,
                "confirmed_at": now,
            },
        )


def _read_up_to(*, chain_id: int, confirmed: int) -> int:
    """The last block whose transactions the scan has recorded: the cursor's, at most the confirmed block. A balance
    read beyond it would take a direct payment not recorded yet for coin no transaction explains."""
    cursor_block = ChainCursor.objects.filter(chain_id=chain_id).values_list("confirmed_block", flat=True).first()
    return min(confirmed, cursor_block or 0)


def _block_of_rise(
    *, client: ChainClient, address: str, credits: list[tuple[int, int]], unexplained: int, block: int
) -> int:
    """The first block at which the address held the whole `unexplained` amount beyond the credits recorded up to
    that block, by binary search over at most 2**RISE_SEARCH_CALLS blocks before `block` (one balance read a
    step). Before the address was handed out it held nothing; a rise older than the searched span is dated at
    the span's start, later than it was: never earlier."""

    def unexplained_at(number: int) -> int:
        explained = sum(amount for credit_block, amount in credits if credit_block <= number)
        return client.native_balance_at(address, block=number) - explained

    # Back from `block` in doubling steps (a payment near expiry is found in a few reads, and a node that keeps
    # only recent state, as most do, is never asked for state it pruned), then a binary search between the last
    # block that held it and the first that did not.
    at_or_after, below, step = block, None, 1
    for _ in range(RISE_SEARCH_CALLS):
        probe = block - step
        if probe < 0:
            below = -1
            break
        try:
            held = unexplained_at(probe) >= unexplained
        except ChainUnavailable:
            if step <= RECENT_STATE_BLOCKS:
                raise  # every node keeps that much state: an outage, tried again next cycle
            return at_or_after  # state this old is pruned on this node: dated later than it was, never earlier
        if not held:
            below = probe
            break
        at_or_after, step = probe, step * 2
    if below is None:
        return at_or_after  # older than the searched span
    while at_or_after - below > 1:
        middle = (below + at_or_after) // 2
        try:
            held = unexplained_at(middle) >= unexplained
        except ChainUnavailable:
            return at_or_after
        if held:
            at_or_after = middle
        else:
            below = middle
    return at_or_after


# --- tokens --------------------------------------------------------------------------------------------------
def token_balance_checks(*, chain: config.Chain, client: ChainClient, confirmed: int, now: datetime) -> int:
    """Read, at the confirmed block, the token balance of at most TOKEN_BALANCE_CHECKS_PER_CYCLE token invoices,
    open or expired within their monitoring window: at most TOKEN_SWEEPS_PER_CYCLE not read for TOKEN_SWEEP_AFTER
    (once after the expiry, then TOKEN_SWEEP_EXPIRED_AFTER once expired), longest unread first, and those whose
    customer said "I've paid", or for which an admin asked a re-check (each again at most every
    TOKEN_RECHECK_AFTER, or at once after another request); where a balance exceeds the credits in that token
    recorded up to that block, read that token's transfers to that address over the invoice's life and record
    them. Returns how many balances were read."""
    tokens = chain.token_contracts
    if not tokens:
        return 0
    watched = (
        Invoice.objects.filter(
            chain_id=chain.chain_id,
            asset_contract__in=list(tokens),
            # Expired ones too, within their monitoring window: a payment the scan missed while the quote was
            # open is found after "I've paid" even once the quote has run out (the late-payment policy applies).
            status__in=NETTED,
            monitor_until__gt=now,
        )
        .filter(watched_invoices(now))
        .annotate(prompted=Q(customer_paid_at__isnull=False) | Q(check_requested_at__isnull=False))
        .order_by(F("native_checked_at").asc(nulls_first=True), F("customer_paid_at").desc(nulls_last=True), "pk")
        .only("pk", "deposit_address", "asset_contract", "created_at")
    )
    # The sweep, TOKEN_SWEEPS_PER_CYCLE a cycle whatever else is asked (thousands of asked-for invoices never switch
    # it off): an open quote TOKEN_SWEEP_AFTER after it was made (an address handed out a moment ago holds nothing
    # yet) and as often after; an expired one once more SWEEP_AFTER_EXPIRY after its expiry (a payment sent on time
    # late in the quote is not left for hours), then every TOKEN_SWEEP_EXPIRED_AFTER.
    swept = list(
        watched.filter(prompted=False).filter(
            Q(native_checked_at__isnull=True, created_at__lte=now - TOKEN_SWEEP_AFTER)
            | Q(expires_at__gt=now, native_checked_at__lte=now - TOKEN_SWEEP_AFTER)
            | Q(expires_at__lte=now - SWEEP_AFTER_EXPIRY, native_checked_at__lt=F("expires_at") + SWEEP_AFTER_EXPIRY)
            | Q(expires_at__lte=now, native_checked_at__lte=now - TOKEN_SWEEP_EXPIRED_AFTER)
        )[:TOKEN_SWEEPS_PER_CYCLE]
    )
    # Asked for: at once, then every TOKEN_RECHECK_AFTER, in the rest of the cycle's reads.
    invoices = swept + list(
        watched.filter(prompted=True).filter(
            Q(native_checked_at__isnull=True) | Q(native_checked_at__lte=now - TOKEN_RECHECK_AFTER)
        )[: TOKEN_BALANCE_CHECKS_PER_CYCLE - len(swept)]
    )
    if not invoices:
        return 0
    balances = client.token_balances(
        [(invoice.asset_contract, invoice.deposit_address) for invoice in invoices], block=confirmed
    )
    credited = {
        (address, token): int(total or 0)
        for address, token, total in Transfer.objects.filter(
            chain_id=chain.chain_id,
            to_address__in=[invoice.deposit_address for invoice in invoices],
            block_number__lte=confirmed,
        )
        .exclude(status=Transfer.Status.REMOVED)
        .values("to_address", "token_contract")
        .annotate(total=Sum("amount_units"))
        .values_list("to_address", "token_contract", "total")
    }
    checked, searched = [], 0
    for invoice, balance in zip(invoices, balances, strict=True):
        explained = credited.get((invoice.deposit_address, invoice.asset_contract), 0)
        if balance is None or balance <= explained:
            checked.append(invoice.pk)
            continue
        if searched >= LOG_SEARCHES_PER_CYCLE:
            continue  # not marked checked: first in line next cycle
        searched += 1
        if _search_token_transfers(chain=chain, client=client, invoice=invoice, confirmed=confirmed, now=now):
            checked.append(invoice.pk)  # else read again next cycle, first in line
    Invoice.objects.filter(pk__in=checked).update(native_checked_at=now)
    return len(invoices)


def _search_token_transfers(
    *, chain: config.Chain, client: ChainClient, invoice: Invoice, confirmed: int, now: datetime
) -> bool:
    """Read the transfers of the invoice's token to its address, range by range back from the confirmed block,
    until a range starts before the invoice was created (at most LOG_SEARCH_CALLS round trips; a range the
    provider refuses is halved), and record them as the scan does. False when no URL could serve a range yet
    (lagging behind the confirmed block), or when the round trips ran out before the invoice's creation: what was
    read is recorded, and the search runs again next cycle (from where it stopped, in the second case)."""
    token, address = invoice.asset_contract, invoice.deposit_address
    # A search that ran out of round trips before reaching the invoice's creation (an old invoice on a fast chain)
    # goes on next cycle below where it stopped, instead of reading the same recent ranges again.
    resume_key = f"token-search:{chain.chain_id}:{invoice.pk}"
    resumed = cache.get(resume_key)  # [end, span]: where it stopped, and how wide the provider still answered
    end, span = confirmed, max(1, chain.max_block_range)
    well_formed = isinstance(resumed, list) and len(resumed) == 2 and all(isinstance(part, int) for part in resumed)
    if well_formed and 0 <= resumed[0] <= confirmed and 1 <= resumed[1] <= span:
        end, span = resumed
    logs, complete, reached = [], True, False
    born = invoice.created_at - CLOCK_MARGIN
    for _call in range(LOG_SEARCH_CALLS):
        start = max(0, end - span + 1)
        try:
            found, start_time = client.token_transfers_to(token=token, address=address, start=start, end=end)
        except RangeRefused:
            if span > 1:
                span = max(1, span // 2)
                continue
            # One block the provider will not answer for this one address (more transfers to it than its cap on
            # logs: a stranger's dust on their own address). Not read, and said so: the search goes on below it,
            # instead of asking for that block every cycle and holding a search of the cycle for good.
            logger.warning(
                "chain %s: the transfers of %s to %s in block %s exceed what the provider answers: not read",
                chain.chain_id,
                token,
                address,
                start,
            )
            if start == 0:
                reached = True
                break
            end, span = start - 1, max(1, chain.max_block_range)
            continue
        except (RangeNotReady, ChainUnavailable) as exc:
            logger.warning("chain %s: transfers to %s not read this cycle: %s", chain.chain_id, address, exc)
            complete = False
            break
        logs += found
        started = parse_timestamp(start_time) if start_time else None
        if start == 0 or (started is not None and started < born):
            reached = True
            break
        end = start - 1
    if complete and not reached:
        cache.set(resume_key, [end, span], timeout=RESUME_SECONDS)
        complete = False  # not checked: read on next cycle, from there
    elif reached:
        cache.delete(resume_key)
    if not logs:
        if complete:  # a token that moves balances without a Transfer log, or a transfer older than the search
            logger.warning(
                "chain %s: %s holds more %s than its credits explain, and no transfer to it was found",
                chain.chain_id,
                address,
                token,
            )
        return complete
    read = client.blocks(sorted({log.block_number for log in logs}))
    with transaction.atomic():
        apply_logs(
            chain=chain,
            logs=logs,
            by_address={address: WatchedAddress(invoice_id=invoice.pk, asset_contract=invoice.asset_contract)},
            seen=[],
            confirmed=confirmed,
            canonical={number: block_hash for number, (block_hash, _time) in read.items() if block_hash},
            block_times={number: block_time for number, (block_hash, block_time) in read.items() if block_hash},
            now=now,
        )
    return complete
