"""The `Transfer` rows a scan writes: what one block range shows (credits recorded, confirmed once their block is
final and canonical, removed when a reorganisation replaced their block). The chain is hostile input: every credit
comes from a parsed log or transaction (`payments/chain_answers.py`), each is stored in its own savepoint, and a
credit, once confirmed, is never revisited. `payments/scanner.py` decides what to read and commits each range
with its cursor; what balances show beyond it is `payments/balances.py`.
"""

import logging
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import DatabaseError, transaction

from payments import config
from payments.chain_answers import TransferLog, parse_timestamp
from payments.models import Transfer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchedAddress:
    """What a watched deposit address is matched to: its invoice, and the asset that invoice is paid in."""

    invoice_id: int
    asset_contract: str


def apply_logs(
    *,
    chain: config.Chain,
    logs: list[TransferLog],
    by_address: dict[str, WatchedAddress],
    seen: list[Transfer],
    confirmed: int,
    canonical: dict[int, str],
    block_times: dict[int, int],
    now: datetime,
) -> int:
    """Record the transfers of one range. Returns how many could not be stored (each is its own savepoint: one
    that the database refuses costs only itself)."""
    logs = _under_recorded_indices(chain_id=chain.chain_id, logs=logs)
    returned = {(log.tx_hash, log.log_index) for log in logs}
    # A transfer seen before and not returned now is gone only when its block was replaced: a provider that
    # answers less (a lagging or inconsistent node) removes nothing.
    for transfer in seen:
        if (transfer.tx_hash, transfer.log_index) in returned:
            continue
        replaced_by = canonical.get(transfer.block_number, "")
        if replaced_by and replaced_by != transfer.block_hash:
            transfer.status = Transfer.Status.REMOVED
            transfer.save(update_fields=["status"])
    failed = 0
    for log in logs:
        try:
            with transaction.atomic():
                _record_transfer(
                    chain=chain,
                    log=log,
                    watched=by_address[log.recipient],
                    confirmed=confirmed,
                    canonical=canonical,
                    block_time=block_times.get(log.block_number, 0),
                    now=now,
                )
        except DatabaseError:
            logger.exception("chain %s: transfer %s#%s not stored", chain.chain_id, log.tx_hash, log.log_index)
            failed += 1
    return failed


def _under_recorded_indices(*, chain_id: int, logs: list[TransferLog]) -> list[TransferLog]:
    """The logs, each token transfer under the index its row was recorded with. A credit is unique on (chain,
    transaction, log index), and the scan and the token net take the index from eth_getLogs (within the block) while
    a pasted hash takes it from the receipt; some clients number receipt logs within the transaction (Besu, lotus,
    skaled, Oasis), and one load-balanced URL can mix them. A log whose (transaction, index) has no row, but whose
    transfer (token, recipient, amount) matches a row of the same transaction that this answer does not name, is
    that row: one payment is never counted twice, and a credit is never left "seen" for good under an index no
    later read returns. Identical transfers in one transaction pair up one to one."""
    token_logs = [log for log in logs if log.log_index >= 0]
    if not token_logs:
        return logs
    rows = list(
        Transfer.objects.filter(
            chain_id=chain_id, tx_hash__in={log.tx_hash for log in token_logs}, log_index__gte=0
        ).values_list("tx_hash", "log_index", "token_contract", "to_address", "amount_units")
    )
    if not rows:
        return logs
    named = {(log.tx_hash, log.log_index) for log in logs}
    recorded = {(tx_hash, index) for tx_hash, index, *_rest in rows}
    unnamed: dict[tuple, list[int]] = {}
    for tx_hash, index, token, recipient, amount in sorted(rows, key=lambda row: row[1]):
        if (tx_hash, index) not in named:
            unnamed.setdefault((tx_hash, token, recipient, int(amount)), []).append(index)
    matched = []
    for log in logs:
        if log.log_index >= 0 and (log.tx_hash, log.log_index) not in recorded:
            same = unnamed.get((log.tx_hash, log.token, log.recipient, log.amount))
            if same:
                log = replace(log, log_index=same.pop(0))
        matched.append(log)
    return matched


def _record_transfer(
    *,
    chain: config.Chain,
    log: TransferLog,
    watched: WatchedAddress,
    confirmed: int,
    canonical: dict[int, str],
    block_time: int,
    now: datetime,
) -> None:
    on_canonical_block = canonical.get(log.block_number) == log.block_hash
    is_final = log.block_number <= confirmed and on_canonical_block
    defaults = {
        "block_number": log.block_number,
        "block_hash": log.block_hash,
        "token_contract": log.token,
        "from_address": log.sender,
        "to_address": log.recipient,
        "amount_units": log.amount,
        "invoice_id": watched.invoice_id,
        "wrong_asset": log.token != watched.asset_contract,
        "first_seen_at": now,
    }
    transfer, created = Transfer.objects.get_or_create(
        chain_id=chain.chain_id, tx_hash=log.tx_hash, log_index=log.log_index, defaults=defaults
    )
    if transfer.status == Transfer.Status.CONFIRMED:
        return  # credited once, for good
    changed = created
    if not created and (transfer.block_hash != log.block_hash or transfer.status == Transfer.Status.REMOVED):
        for name, value in defaults.items():
            setattr(transfer, name, value)
        transfer.status = Transfer.Status.SEEN
        changed = True
    if is_final:
        transfer.status, transfer.confirmed_at = Transfer.Status.CONFIRMED, now
        changed = True
    if on_canonical_block and block_time and transfer.block_time is None:
        transfer.block_time = parse_timestamp(block_time)
        changed = True
    if changed:
        transfer.save()
    if created and not log.token and not log.tx_hash.startswith(BALANCE_CREDIT_PREFIX):
        _balance_credits_explained(
            chain_id=chain.chain_id, address=log.recipient, block=log.block_number, amount=log.amount
        )


# Coin the balance safety net credited without a transaction of its own (payments/balances.py, models.Transfer).
BALANCE_CREDIT_PREFIX = "balance:"


def _balance_credits_explained(*, chain_id: int, address: str, block: int, amount: int) -> None:
    """A direct payment recorded after the balance safety net credited its coin as unexplained (a block the cursor
    passed, found later by a pasted hash or a rescan): the balance credits at or after its block counted it
    already, so they shrink by its amount, oldest first. Never counted twice."""
    left = amount
    credits = (
        Transfer.objects.select_for_update()
        .filter(
            chain_id=chain_id,
            to_address=address,
            token_contract="",
            tx_hash__startswith=BALANCE_CREDIT_PREFIX,
            block_number__gte=block,
        )
        .exclude(status=Transfer.Status.REMOVED)
        .order_by("block_number", "pk")
    )
    for credit in credits:
        if left <= 0:
            break
        taken = min(left, int(credit.amount_units))
        left -= taken
        credit.amount_units = int(credit.amount_units) - taken
        if not credit.amount_units:
            credit.status = Transfer.Status.REMOVED
        credit.save(update_fields=["amount_units", "status"])
