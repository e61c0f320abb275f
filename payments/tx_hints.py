"""The safety net that does not depend on the scan's cursor: the transaction hash a customer pastes on the order
page is a hint that the portal verifies on chain itself, never proof on its own.

`invoice_check_tx_hint` reads the transaction and its receipt directly from the chain and credits what that
transaction paid to the invoice's deposit address: the native coin of a successful transaction sent to it, or the
ERC-20 Transfer logs of allow-listed tokens to it in the receipt. A failed receipt credits nothing. The credits go
through the scanner's own recording (`transfers.apply_logs`: the same `Transfer` rows, unique on
`(chain_id, tx_hash, log_index)`, so a later scan of the same transaction or log finds the row and never counts it
twice), under the same rules: not final before the confirmed block, and only on the canonical block (a receipt
from a block since replaced stays "seen" until the scanner settles it). The invoice then moves as a scan would
move it (`settlement.invoice_apply_chain_state`).
"""

import re
from datetime import datetime

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from payments import config
from payments.chain import ChainClient
from payments.chain_answers import MAX_TRANSFER_UNITS, TransferLog, parse_quantity, parse_transfer_log
from payments.models import ChainCursor, Invoice, Transfer
from payments.settlement import invoice_apply_chain_state
from payments.transfers import WatchedAddress, apply_logs

_HASH = re.compile(r"0x[0-9a-f]{64}")
_ADDRESS = re.compile(r"0x[0-9a-f]{40}")
_VALUE = re.compile(r"0x[0-9a-f]{1,64}")

Outcome = Invoice.TxHintOutcome


def credits_of(*, tx_hash: str, transaction_: object, receipt: object, to_address: str, tokens: frozenset[str]):
    """What a transaction paid to `to_address`, as (outcome, credits): the receipt is the only word on success;
    the chain is hostile input, so a field that is not what it claims counts as nothing paid."""
    if not isinstance(receipt, dict) or not isinstance(transaction_, dict):
        return Outcome.NOT_FOUND, []
    try:
        status = parse_quantity(receipt.get("status"))
        block_number = parse_quantity(receipt.get("blockNumber"))
    except ValueError:
        return Outcome.NOT_FOUND, []
    block_hash = str(receipt.get("blockHash") or "").lower()
    if str(receipt.get("transactionHash") or "").lower() != tx_hash or not _HASH.fullmatch(block_hash):
        return Outcome.NOT_FOUND, []
    if status != 1:
        return Outcome.FAILED, []
    credits = []
    recipient, value, sender = transaction_.get("to"), transaction_.get("value"), transaction_.get("from")
    if (
        isinstance(recipient, str)
        and recipient.lower() == to_address
        and isinstance(value, str)
        and _VALUE.fullmatch(value.lower())
        and 0 < int(value, 16) <= MAX_TRANSFER_UNITS
        and isinstance(sender, str)
        and _ADDRESS.fullmatch(sender.lower())
    ):
        credits.append(
            TransferLog(
                tx_hash=tx_hash,
                log_index=-1,  # as the scanner records a transaction's native coin
                block_number=block_number,
                block_hash=block_hash,
                token="",
                sender=sender.lower(),
                recipient=to_address,
                amount=int(value, 16),
            )
        )
    logs = receipt.get("logs")
    for entry in logs if isinstance(logs, list) else []:
        log = parse_transfer_log(entry, tokens=tokens)
        if log is not None and log.recipient == to_address and log.tx_hash == tx_hash and log.block_hash == block_hash:
            credits.append(log)
    return (Outcome.ELSEWHERE, []) if not credits else (Outcome.CONFIRMING, credits)


def invoice_check_tx_hint(*, invoice: Invoice, client: ChainClient | None = None, now: datetime | None = None) -> str:
    """Verify the hash the customer pasted on this invoice and credit what it paid. Returns the outcome, also
    written on the invoice for its order page. Raises ChainUnavailable when no RPC URL answers (nothing changed)."""
    now = now or timezone.now()
    tx_hash = invoice.customer_tx_hint
    chain = config.chain(invoice.chain_id)
    if not tx_hash or chain is None:
        return ""
    client = client or ChainClient(chain)
    transaction_, receipt = client.transaction_and_receipt(tx_hash)
    outcome, credits = credits_of(
        tx_hash=tx_hash,
        transaction_=transaction_,
        receipt=receipt,
        to_address=invoice.deposit_address,
        tokens=frozenset(chain.token_contracts),
    )
    if credits:
        head = client.head()
        # Confirmed only as far as the scanner has proven the chain (its cursor: end headers read with the logs,
        # heads of several URLs compared): a single URL's far-ahead head must not make a credit final.
        proven = ChainCursor.objects.filter(chain_id=chain.chain_id).values_list("confirmed_block", flat=True).first()
        confirmed = min(head, client.confirmed_block(head), proven or 0)
        block = credits[0].block_number
        (block_hash, block_time) = client.blocks([block])[block]
        watched = WatchedAddress(invoice_id=invoice.pk, asset_contract=invoice.asset_contract)
        with transaction.atomic():
            apply_logs(
                chain=chain,
                logs=credits,
                by_address={invoice.deposit_address: watched},
                seen=[],
                confirmed=confirmed,
                canonical={block: block_hash} if block_hash else {},
                block_times={block: block_time} if block_hash else {},
                now=now,
            )
        confirmed_units, pending_units = _sums(invoice)
        invoice_apply_chain_state(invoice=invoice, confirmed=confirmed_units, pending=pending_units, head=head, now=now)
        statuses = set(
            Transfer.objects.filter(
                chain_id=chain.chain_id, tx_hash=tx_hash, log_index__in=[credit.log_index for credit in credits]
            ).values_list("status", flat=True)
        )
        outcome = Outcome.CREDITED if statuses == {Transfer.Status.CONFIRMED} else Outcome.CONFIRMING
    with transaction.atomic():
        # Only while the hash is still the one checked: a newer paste has its own check.
        current = Invoice.objects.select_for_update().filter(pk=invoice.pk, customer_tx_hint=tx_hash).first()
        if current is not None and current.customer_tx_outcome != outcome:
            current.customer_tx_outcome = outcome
            current.save(update_fields=["customer_tx_outcome"])  # a save: the order page's caches follow
    return outcome


def _sums(invoice: Invoice) -> tuple[int, int]:
    """(confirmed, seen) base units in the invoice's own asset, as the scanner counts them."""
    rows = (
        Transfer.objects.filter(invoice=invoice, wrong_asset=False)
        .exclude(status=Transfer.Status.REMOVED)
        .values("status")
        .annotate(total=Sum("amount_units"))
    )
    confirmed = sum(int(row["total"] or 0) for row in rows if row["status"] == Transfer.Status.CONFIRMED)
    pending = sum(int(row["total"] or 0) for row in rows if row["status"] != Transfer.Status.CONFIRMED)
    return confirmed, pending
