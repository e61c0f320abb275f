"""Thin Celery wrappers, on the chain queue except the fiscal documents' printing (CELERY_TASK_ROUTES in
portal/settings.py decides)."""

from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from booking import links, notices
from booking.notices import Notice
from payments import config, fiscal_documents, invoices, refund_proofs, refunds, scanner, tx_hints
from payments.chain import ChainUnavailable
from payments.errors import PaymentError
from payments.models import ChainCursor, FiscalInvoice, Invoice, Refund


@shared_task(name="payments.scan_chains")
def scan_chains() -> list[int]:
    """Beat: one scan task per configured chain."""
    chain_ids = sorted(config.chains())
    for chain_id in chain_ids:
        scan_chain.delay(chain_id)
    return chain_ids


@shared_task(name="payments.sweep_ledger")
def sweep_ledger() -> int:
    """Beat: repair the refunds and flags a reaction lost after its commit (payments/refunds.py `ledger_sweep`)."""
    return refunds.ledger_sweep()


@shared_task(name="payments.scan_chain")
def scan_chain(chain_id: int) -> int:
    """Beat's scan of one chain. A chain that does not answer is recorded by the scan (the pages say "check
    delayed") and beat's next tick is the retry: nothing escapes the task."""
    if not isinstance(chain_id, int) or config.chain(chain_id) is None:
        return 0
    try:
        settled = len(scanner.chain_scan(chain_id=chain_id).settled)
    except ChainUnavailable:
        return 0
    refund_proofs.refunds_detect(chain_id=chain_id)  # what the scan proved, read for the refunds' addresses
    return settled


# After "I've paid": check now, then again with a growing delay until settled or out of monitoring.
CHECK_DELAYS = [1, 2, 3, 5, 8, 13, 20, 30, 45, 60]


@shared_task(name="payments.check_invoice", bind=True, acks_late=True, max_retries=200)
def check_invoice(self, invoice_id: int) -> str:
    """One chain of checks per invoice at a time: "I've paid" queues it only while its pending key is free
    (invoices.invoice_request_check); each attempt renews the key, and the last one frees it."""
    invoice = Invoice.objects.filter(pk=invoice_id).first() if isinstance(invoice_id, int) else None
    if invoice is None:
        return "unknown"
    pending_key = invoices.check_pending_key(invoice_id)
    cache.set(pending_key, True, timeout=invoices.CHECK_PENDING_SECONDS)
    delay = CHECK_DELAYS[min(self.request.retries, len(CHECK_DELAYS) - 1)]
    retry_possible = self.request.retries < self.max_retries and not self.request.is_eager
    skipped = False
    if _scan_due(chain_id=invoice.chain_id, first=self.request.retries == 0):
        try:
            skipped = scanner.chain_scan(chain_id=invoice.chain_id).skipped
        except ChainUnavailable as exc:
            if not retry_possible:
                cache.delete(pending_key)
            raise self.retry(exc=exc, countdown=delay) from exc
    invoice.refresh_from_db()
    done = invoice.status == Invoice.Status.SETTLED or timezone.now() >= invoice.monitor_until
    if not done and retry_possible and (skipped or invoice.customer_paid_at):
        raise self.retry(countdown=delay)
    cache.delete(pending_key)
    return invoice.status


def _scan_due(*, chain_id: int, first: bool) -> bool:
    """Whether a check should scan the chain itself: always at its first attempt, right after "I've paid" (one chain
    per invoice, and presses are rate-limited); a retry only when beat's scan is late (none for a whole period).
    Thirty pressed invoices retrying once a minute must not scan the chain thirty times a minute: beat's scans move
    them anyway."""
    if first:
        return True
    last = ChainCursor.objects.filter(chain_id=chain_id).values_list("last_scan_at", flat=True).first()
    period = timedelta(seconds=settings.CELERY_BEAT_SCHEDULE["payments.scan_chains"]["schedule"])
    return last is None or last <= timezone.now() - period


# A pasted hash not mined yet, or mined and not yet confirmed, is read again this many times (CHECK_DELAYS apart);
# a chain follows the invoice's current hash, each new one with a full count, up to TX_HINT_CHAIN_RETRIES in all.
TX_HINT_RETRIES = 30
TX_HINT_CHAIN_RETRIES = 200


@shared_task(name="payments.check_tx_hint", bind=True, acks_late=True, max_retries=TX_HINT_CHAIN_RETRIES)
def check_tx_hint(self, invoice_id: int) -> str:
    """Read the transaction hash the customer pasted, and credit what it paid (payments/tx_hints.py). One chain per
    invoice at a time (invoices._request_tx_hint_check): its key, renewed each attempt, remembers which hash it
    follows and from which retry, so that a hash pasted while it runs gets TX_HINT_RETRIES readings of its own."""
    invoice = Invoice.objects.filter(pk=invoice_id).first() if isinstance(invoice_id, int) else None
    pending_key = invoices.tx_hint_pending_key(invoice_id) if isinstance(invoice_id, int) else ""
    if invoice is None or not invoice.customer_tx_hint:
        if pending_key:
            cache.delete(pending_key)
        return "unknown"
    followed = cache.get(pending_key)
    if not isinstance(followed, dict) or followed.get("hash") != invoice.customer_tx_hint:
        followed = {"hash": invoice.customer_tx_hint, "from": self.request.retries}
    cache.set(pending_key, followed, timeout=invoices.CHECK_PENDING_SECONDS)
    delay = CHECK_DELAYS[min(self.request.retries, len(CHECK_DELAYS) - 1)]
    retry_possible = (
        not self.request.is_eager
        and self.request.retries < self.max_retries
        and self.request.retries - followed["from"] < TX_HINT_RETRIES
        and timezone.now() < invoice.monitor_until
    )
    try:
        outcome = tx_hints.invoice_check_tx_hint(invoice=invoice)
    except ChainUnavailable as exc:
        if not retry_possible:
            cache.delete(pending_key)
            raise
        raise self.retry(exc=exc, countdown=delay) from exc
    waiting = outcome in (Invoice.TxHintOutcome.NOT_FOUND, Invoice.TxHintOutcome.CONFIRMING)
    # A hash pasted during this attempt found the chain's key held and queued nothing: it is read next.
    replaced = Invoice.objects.filter(pk=invoice_id).exclude(customer_tx_hint=invoice.customer_tx_hint).exists()
    if (waiting or replaced) and retry_possible:
        raise self.retry(countdown=1 if replaced else delay)
    cache.delete(pending_key)
    return outcome


@shared_task(name="payments.send_payment_received", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_payment_received(invoice_id: int) -> None:
    invoice = Invoice.objects.select_related("order").filter(pk=invoice_id).first()
    if invoice is not None:
        notices.send(Notice.PAYMENT_RECEIVED, order=invoice.order, invoice=invoice)


# --- refunds (payments/refunds.py, payments/refund_proofs.py) ----------------------------------------------------


@shared_task(name="payments.check_refund_tx", bind=True, acks_late=True, max_retries=TX_HINT_RETRIES)
def check_refund_tx(self, refund_id: int, tx_hash: str) -> str:
    """Read again a refund transaction that was still confirming, until it counts (or stays unconfirmed too long:
    the operator can enter it again)."""
    refund = Refund.objects.filter(pk=refund_id).first() if isinstance(refund_id, int) else None
    if refund is None or not isinstance(tx_hash, str):
        return "unknown"
    delay = CHECK_DELAYS[min(self.request.retries, len(CHECK_DELAYS) - 1)]
    try:
        outcome = refund_proofs.refund_credit_tx(refund=refund, tx_hash=tx_hash, recheck=False)
    except ChainUnavailable as exc:
        raise self.retry(exc=exc, countdown=delay) from exc
    except PaymentError:
        return "refused"
    waiting = outcome in (refund_proofs.RefundTxOutcome.NOT_FOUND, refund_proofs.RefundTxOutcome.CONFIRMING)
    if waiting and not self.request.is_eager:
        raise self.retry(countdown=delay)
    return outcome


@shared_task(name="payments.send_refund_requested", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_refund_requested(refund_id: int) -> None:
    """Ask the customer for the address to refund to, with a fresh link to their order page."""
    refund = Refund.objects.select_related("order").filter(pk=refund_id).first()
    if refund is not None and refund.status == Refund.Status.AWAITING_ADDRESS:
        link = links.order_link(order=refund.order, token=links.issue_token(order=refund.order))
        notices.send(Notice.REFUND_REQUESTED, order=refund.order, refund=refund, link=link)


@shared_task(name="payments.send_refund_address_changed", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_refund_address_changed(refund_id: int, address: str, previous: str) -> None:
    """Tell the contact the refund's address was given or changed (by whoever holds the order link)."""
    refund = Refund.objects.select_related("order").filter(pk=refund_id).first()
    if refund is not None:
        notices.send(
            Notice.REFUND_ADDRESS_CHANGED, order=refund.order, refund=refund, address=address, previous=previous
        )


@shared_task(name="payments.send_refund_sent", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_refund_sent(refund_id: int) -> None:
    refund = Refund.objects.select_related("order").filter(pk=refund_id, status=Refund.Status.PAID).first()
    if refund is not None:
        payments = list(refund.payments.filter(status="confirmed"))
        notices.send(Notice.REFUND_SENT, order=refund.order, refund=refund, payments=payments)


@shared_task(name="payments.issue_fiscal_document", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def issue_fiscal_document(fiscal_invoice_id: int) -> str:
    """Print an issued fiscal invoice once (PDF/A-3 with its Factur-X XML) and e-mail it to the order's contact."""
    fiscal_invoice = FiscalInvoice.objects.select_related("order").filter(pk=fiscal_invoice_id).first()
    if fiscal_invoice is None:
        return "unknown"
    try:
        fiscal_invoice = fiscal_documents.fiscal_invoice_write_document(fiscal_invoice=fiscal_invoice)
    except fiscal_documents.DocumentNotPrintable:
        return "not printable"  # recorded for the operator; retrying would fail the same way
    if fiscal_invoice.emailed_at is None:
        notices.send(Notice.INVOICE_ISSUED, order=fiscal_invoice.order, fiscal_invoice=fiscal_invoice)
        fiscal_documents.fiscal_invoice_mark_emailed(fiscal_invoice=fiscal_invoice)
    return fiscal_invoice.number


@shared_task(name="payments.print_fiscal_documents")
def print_fiscal_documents() -> int:
    """Beat: queue again the invoices a stopped worker left without their PDF or e-mail."""
    due = fiscal_documents.fiscal_invoices_without_document(now=timezone.now())
    for fiscal_invoice_id in due:
        issue_fiscal_document.delay(fiscal_invoice_id)
    return len(due)
