"""A refund is paid only when the chain says so. The operator pays from their own wallet and enters the
transaction's hash; the portal reads the transaction and its receipt itself, with the reading of a pasted hash
(`tx_hints.credits_of`: a successful receipt, the Transfer logs of the refund's token to the refund address, or the
native coin of a transaction sent to it) and the invoice chain's confirmation rules: final only at or below both the
chain's confirmed block and the scanner's proven cursor, and only on the canonical block.

Each credit is a `RefundPayment`, unique on (chain_id, tx_hash, log_index): the same transfer, scanned or entered
twice, or for two refunds, counts once; one transaction paying several refunds (a batched payout) counts each
transfer for the refund it pays. The refund is paid when its confirmed credits reach its amount; less leaves it partly
paid with the remainder; a transfer to another address credits nothing. A credit still confirming is read again by
`payments.check_refund_tx` until it is final or gone.
"""

import re
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from booking import services as booking
from booking.models import OrderEvent
from payments import config, enqueue
from payments.chain import ChainClient, ChainUnavailable, RangeNotReady, RangeRefused
from payments.chain_answers import TransferLog
from payments.errors import PaymentError
from payments.invoices import lock_invoice
from payments.models import ChainCursor, Refund, RefundPayment
from payments.refunds import refund_destinations
from payments.tx_hints import Outcome as HintOutcome
from payments.tx_hints import credits_of

_HASH = re.compile(r"0x[0-9a-fA-F]{64}")


class RefundTxOutcome:
    NOT_FOUND = "not_found"
    FAILED = "failed"
    ELSEWHERE = "elsewhere"
    CONFIRMING = "confirming"
    CREDITED = "credited"
    OTHER_REFUND = "other_refund"


MESSAGES = {
    RefundTxOutcome.NOT_FOUND: gettext_lazy(
        "This transaction is not on this refund's network (yet): check the hash and the network, and enter it again "
        "once it is mined. Nothing was counted."
    ),
    RefundTxOutcome.FAILED: gettext_lazy("This transaction failed on chain: it paid nothing. Nothing was counted."),
    RefundTxOutcome.ELSEWHERE: gettext_lazy(
        "This transaction pays nothing in the refund's asset to the refund address: nothing was counted and the "
        "refund stays open."
    ),
    RefundTxOutcome.CONFIRMING: gettext_lazy(
        "Transaction found: it counts once its block is confirmed. It is read again by itself."
    ),
    RefundTxOutcome.CREDITED: gettext_lazy("Transaction confirmed and counted toward the refund."),
    RefundTxOutcome.OTHER_REFUND: gettext_lazy(
        "This transaction is already counted for another refund: it is not counted twice."
    ),
}


def refund_credit_tx(
    *,
    refund: Refund,
    tx_hash: str,
    user: AbstractBaseUser | None = None,
    client: ChainClient | None = None,
    now: datetime | None = None,
    recheck: bool = True,
) -> str:
    """Read `tx_hash` on the refund's chain and count what it paid to the refund's address. Returns an outcome of
    `RefundTxOutcome`. A credit still confirming is read again later by a task (unless `recheck` is False: the
    task itself). Raises PaymentError for a hash that is not one or a refund that cannot take it, and
    ChainUnavailable when no RPC URL answers: nothing changes then."""
    now = now or timezone.now()
    tx_hash = tx_hash.strip().lower()
    if not _HASH.fullmatch(tx_hash):
        raise PaymentError(_("Enter the transaction hash: 0x followed by 64 hexadecimal characters."), field="tx_hash")
    if not refund.address:
        raise PaymentError(_("This refund has no address yet: the customer has not given one."), field="tx_hash")
    if refund.status == Refund.Status.PAID and not refund.payments.filter(tx_hash=tx_hash).exists():
        raise PaymentError(_("This refund is already paid in full."), field="tx_hash")
    chain = config.chain(refund.chain_id)
    if chain is None:
        raise PaymentError(_("The refund's network is no longer configured: it cannot be read."), field="tx_hash")
    client = client or ChainClient(chain)
    transaction_, receipt = client.transaction_and_receipt(tx_hash)
    outcome, credits = HintOutcome.ELSEWHERE, []
    for address, _watch_from in refund_destinations(refund):  # any address the refund was given pays it
        outcome, paid_there = credits_of(
            tx_hash=tx_hash,
            transaction_=transaction_,
            receipt=receipt,
            to_address=address,
            tokens=frozenset({refund.asset_contract} if refund.asset_contract else ()),
        )
        credits += paid_there
        if outcome in (HintOutcome.NOT_FOUND, HintOutcome.FAILED):
            break
    credits = [credit for credit in credits if credit.token == refund.asset_contract]  # its asset, nothing else
    if outcome == HintOutcome.NOT_FOUND:
        return RefundTxOutcome.NOT_FOUND
    if outcome == HintOutcome.FAILED:
        return RefundTxOutcome.FAILED
    if not credits:
        return RefundTxOutcome.ELSEWHERE
    # Counted once per transfer, not per transaction: a batched payout (Multicall3, a Safe multisend) pays several
    # refunds in one transaction, one log each; only a log already counted for another refund is left out.
    credits = [credit for credit in credits if not _counted_for_another(refund=refund, credit=credit)]
    if not credits:
        return RefundTxOutcome.OTHER_REFUND
    head = client.head()
    # Final only as far as the scanner has proven the chain (as for a customer's pasted hash, payments/tx_hints.py).
    proven = ChainCursor.objects.filter(chain_id=chain.chain_id).values_list("confirmed_block", flat=True).first()
    confirmed_block = min(head, client.confirmed_block(head), proven or 0)
    block = credits[0].block_number
    canonical_hash, _time = client.blocks([block])[block]
    final = block <= confirmed_block and canonical_hash == credits[0].block_hash
    if _record_credits(refund=refund, credits=credits, final=final, user=user, now=now) is False:
        return RefundTxOutcome.OTHER_REFUND
    if not final and recheck:
        _request_recheck(refund_id=refund.pk, tx_hash=tx_hash)
    return RefundTxOutcome.CREDITED if final else RefundTxOutcome.CONFIRMING


def _counted_for_another(*, refund: Refund, credit: TransferLog) -> bool:
    return (
        RefundPayment.objects.filter(chain_id=refund.chain_id, tx_hash=credit.tx_hash, log_index=credit.log_index)
        .exclude(refund=refund)
        .exists()
    )


@transaction.atomic
def _record_credits(
    *, refund: Refund, credits: list[TransferLog], final: bool, user: AbstractBaseUser | None, now: datetime
) -> bool:
    """Record the credits of one transaction to a refund (locked: order, invoice, refund) and move it to what its
    confirmed credits add up to. A credit (one transfer: hash and log index) already another refund's is left
    out; False, and nothing counted, when every credit is."""
    order, _invoice = lock_invoice(refund.invoice)
    refund = Refund.objects.select_for_update().get(pk=refund.pk)
    recorded = 0
    for credit in credits:
        payment, _created = RefundPayment.objects.get_or_create(
            chain_id=refund.chain_id,
            tx_hash=credit.tx_hash,
            log_index=credit.log_index,
            defaults={
                "refund": refund,
                "block_number": credit.block_number,
                "block_hash": credit.block_hash,
                "token_contract": credit.token,
                "from_address": credit.sender,
                "to_address": credit.recipient,
                "amount_units": credit.amount,
                "entered_by": user,
                "first_seen_at": now,
            },
        )
        if payment.refund_id != refund.pk:
            continue  # counted for another refund meanwhile (the same address): not counted twice
        recorded += 1
        if payment.status == RefundPayment.Status.CONFIRMED:
            continue  # counted once, for good
        payment.block_number, payment.block_hash = credit.block_number, credit.block_hash
        if final:
            payment.status, payment.confirmed_at = RefundPayment.Status.CONFIRMED, now
        payment.save()
    if not recorded:
        return False
    _refund_apply_payments(refund=refund, order=order, tx_hash=credits[0].tx_hash, user=user, now=now)
    return True


def _refund_apply_payments(*, refund: Refund, order, tx_hash: str, user, now: datetime) -> None:
    """Move the locked refund to what its confirmed credits add up to; e-mail the customer once it is paid."""
    paid = int(
        refund.payments.filter(status=RefundPayment.Status.CONFIRMED).aggregate(total=Sum("amount_units"))["total"] or 0
    )
    if paid == int(refund.amount_paid_units):
        return
    was = refund.status
    refund.amount_paid_units = paid
    if paid >= int(refund.amount_units):
        refund.status, refund.paid_at = Refund.Status.PAID, now
    else:
        refund.status = Refund.Status.PARTLY_PAID
    refund.save(update_fields=["amount_paid_units", "status", "paid_at"])
    booking.order_note(
        order=order,
        reason="refund paid" if refund.status == Refund.Status.PAID else "refund partly paid",
        actor_kind=OrderEvent.Actor.OPERATOR if user else OrderEvent.Actor.SYSTEM,
        actor=user,
        evidence={
            "refund": refund.pk,
            "tx_hash": tx_hash,
            "paid_units": str(paid),
            "left_units": str(refund.amount_left_units),
            "from_status": was,
        },
    )
    if refund.status == Refund.Status.PAID:
        enqueue.send_refund_sent(refund.pk)


def _request_recheck(*, refund_id: int, tx_hash: str) -> None:
    enqueue.check_refund_tx(refund_id, tx_hash)


# --- the scan's watch of token refunds ---------------------------------------------------------------------------

# Refunds read per cycle, and blocks per refund per cycle (an address-filtered log read each).
DETECT_REFUNDS_PER_CYCLE = 50
DETECT_BLOCKS_PER_READ = 2_000


def refunds_detect(*, chain_id: int, client: ChainClient | None = None, now: datetime | None = None) -> int:
    """Credit what the console's link paid as is: a Transfer of exactly the amount left, in a token refund's
    token, to its address, in a block the scanner has proven final, after the address was given. Anything else
    (part of it, another asset, the native coin) is counted from the hash the operator enters: a transfer of some
    other amount to a customer's address may be anyone's. Returns how many refund payments were counted. A node
    that does not answer leaves the refund's watch where it was, to be read next cycle."""
    now = now or timezone.now()
    chain = config.chain(chain_id)
    proven = ChainCursor.objects.filter(chain_id=chain_id).values_list("confirmed_block", flat=True).first()
    if chain is None or not proven:
        return 0
    watched = Refund.objects.filter(
        chain_id=chain_id, status__in=[Refund.Status.DUE, Refund.Status.PARTLY_PAID]
    ).exclude(asset_contract="")
    # An address given before the chain was ever scanned is watched from the first proven block.
    watched.filter(scanned_to_block__isnull=True).update(scanned_to_block=proven)
    oldest_first = watched.filter(scanned_to_block__lt=proven).order_by("scanned_to_block", "pk")
    refunds = list(oldest_first[:DETECT_REFUNDS_PER_CYCLE])
    if not refunds:
        return 0
    client = client or ChainClient(chain)
    counted = 0
    for refund in refunds:
        start = int(refund.scanned_to_block) + 1
        end = min(proven, start + DETECT_BLOCKS_PER_READ - 1)
        logs = []
        try:  # every address the refund was given, each from the block it was given at
            for address, watch_from in refund_destinations(refund):
                first = max(start, int(watch_from) + 1 if watch_from is not None else start)
                if first <= end:
                    logs += client.token_transfers_to(
                        token=refund.asset_contract, address=address, start=first, end=end
                    )[0]
        except (RangeRefused, RangeNotReady, ChainUnavailable):
            continue
        for log in sorted(logs, key=lambda log: (log.block_number, log.log_index)):
            refund.refresh_from_db()
            if not refund.is_open or log.amount != refund.amount_left_units:
                continue
            if RefundPayment.objects.filter(chain_id=chain_id, tx_hash=log.tx_hash, log_index=log.log_index).exists():
                continue
            if _record_credits(refund=refund, credits=[log], final=True, user=None, now=now):
                counted += 1
        # Every address is read to `end` (a new address given meanwhile is watched from its own block).
        Refund.objects.filter(pk=refund.pk, scanned_to_block=start - 1).update(scanned_to_block=end)
    return counted
