"""The balance safety net: payments that the cursor's reading of logs and blocks cannot show, found by reading
what the deposit addresses hold, independently of the cursor.

- Native coin can reach an address without a transaction to it: a contract pays it on (a smart-contract wallet,
  an exchange's batch payout). The balances of open native-coin invoices, and of those expired within their
  monitoring window (such a payment near expiry is confirmed only after the scan expired the invoice), are read
  at the last block the scan has read; a rise that no recorded credit explains is credited, dated by the block
  where the balance rose (a bounded binary search), so that a payment made in time is judged in time.

Every read is bounded per cycle, in invoices and in round trips; the chain is hostile input: a credit comes from a
parsed log, or from balances read at blocks the scan has read. `payments/scanner.py` calls `balance_checks` once a
cycle, after its ranges are committed.
"""

import logging
from datetime import datetime

from django.db.models import F

from payments import config
from payments.chain import ChainClient, ChainUnavailable
from payments.chain_answers import MAX_TRANSFER_UNITS, parse_timestamp
from payments.models import ChainCursor, Invoice, Transfer

logger = logging.getLogger(__name__)

# Native-coin invoices whose balance is read in one cycle, for coin that no transaction explains.
NATIVE_BALANCE_CHECKS_PER_CYCLE = 50
# Rises dated in one cycle (each a binary search of at most RISE_SEARCH_CALLS balance reads): the others wait
# for the next cycle, first in line.
RISES_DATED_PER_CYCLE = 5
RISE_SEARCH_CALLS = 20  # 2**20 blocks: months on Ethereum, weeks on a 2-second chain


def balance_checks(*, chain: config.Chain, client: ChainClient, confirmed: int, now: datetime) -> int:
    """One cycle of the safety net. Returns how many balances were read."""
    return native_balance_checks(chain=chain, client=client, confirmed=confirmed, now=now)


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
        .filter(status__in=[Invoice.Status.NEW, Invoice.Status.PROCESSING, Invoice.Status.EXPIRED])
        .order_by(F("native_checked_at").asc(nulls_first=True), F("customer_paid_at").desc(nulls_last=True), "pk")
        .only("pk", "deposit_address")[:NATIVE_BALANCE_CHECKS_PER_CYCLE]
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
        try:
            rise = _block_of_rise(
                client=client, address=address, credits=credits.get(address, []), unexplained=unexplained, block=read_to
            )
            rise_hash, rise_time = client.blocks([rise])[rise]
        except ChainUnavailable as exc:
            logger.warning("chain %s: the rise of %s's balance could not be dated: %s", chain.chain_id, address, exc)
            continue
        if not rise_hash:
            continue
        Transfer.objects.get_or_create(
            chain_id=chain.chain_id,
            tx_hash=f"balance:{address}:{rise}",
            log_index=-1,
            defaults={
                "block_number": rise,
                "block_hash": rise_hash,
                "block_time": parse_timestamp(rise_time) if rise_time else None,
                "to_address": address,
                "amount_units": min(unexplained, MAX_TRANSFER_UNITS),
                "invoice": invoice,
                "status": Transfer.Status.CONFIRMED,
                "first_seen_at": now,
                "confirmed_at": now,
            },
        )
        checked.append(invoice.pk)
    Invoice.objects.filter(pk__in=checked).update(native_checked_at=now)
    return len(invoices)


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

    below, at_or_after = max(-1, block - 2**RISE_SEARCH_CALLS), block
    while at_or_after - below > 1:
        middle = (below + at_or_after) // 2
        if unexplained_at(middle) >= unexplained:
            at_or_after = middle
        else:
            below = middle
    return at_or_after
