"""Thin Celery wrappers for the chain queue."""

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from booking import notices
from booking.notices import Notice
from payments import config, fiscal_documents, invoices, scanner, tx_hints
from payments.chain import ChainUnavailable
from payments.models import FiscalInvoice, Invoice


@shared_task(name="payments.scan_chains")
def scan_chains() -> list[int]:
    """Beat: one scan task per configured chain."""
    chain_ids = sorted(config.chains())
    for chain_id in chain_ids:
        scan_chain.delay(chain_id)
    return chain_ids


@shared_task(name="payments.scan_chain")
def scan_chain(chain_id: int) -> int:
    """Beat's scan of one chain. A chain that does not answer is recorded by the scan (the pages say "check
    delayed") and beat's next tick is the retry: nothing escapes the task."""
    if not isinstance(chain_id, int) or config.chain(chain_id) is None:
        return 0
    try:
        return len(scanner.chain_scan(chain_id=chain_id).settled)
    except ChainUnavailable:
        return 0


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
    try:
        result = scanner.chain_scan(chain_id=invoice.chain_id)
    except ChainUnavailable as exc:
        if not retry_possible:
            cache.delete(pending_key)
        raise self.retry(exc=exc, countdown=delay) from exc
    invoice.refresh_from_db()
    done = invoice.status == Invoice.Status.SETTLED or timezone.now() >= invoice.monitor_until
    if not done and retry_possible and (result.skipped or invoice.customer_paid_at):
        raise self.retry(countdown=delay)
    cache.delete(pending_key)
    return invoice.status


# A pasted hash not mined yet, or mined and not yet confirmed, is read again this many times (CHECK_DELAYS apart).
TX_HINT_RETRIES = 30


@shared_task(name="payments.check_tx_hint", bind=True, acks_late=True, max_retries=TX_HINT_RETRIES)
def check_tx_hint(self, invoice_id: int) -> str:
    """Read the transaction hash the customer pasted, and credit what it paid (payments/tx_hints.py)."""
    invoice = Invoice.objects.filter(pk=invoice_id).first() if isinstance(invoice_id, int) else None
    if invoice is None or not invoice.customer_tx_hint:
        return "unknown"
    delay = CHECK_DELAYS[min(self.request.retries, len(CHECK_DELAYS) - 1)]
    try:
        outcome = tx_hints.invoice_check_tx_hint(invoice=invoice)
    except ChainUnavailable as exc:
        raise self.retry(exc=exc, countdown=delay) from exc
    waiting = outcome in (Invoice.TxHintOutcome.NOT_FOUND, Invoice.TxHintOutcome.CONFIRMING)
    if waiting and not self.request.is_eager and timezone.now() < invoice.monitor_until:
        raise self.retry(countdown=delay)
    return outcome


@shared_task(name="payments.send_payment_received", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_payment_received(invoice_id: int) -> None:
    invoice = Invoice.objects.select_related("order").filter(pk=invoice_id).first()
    if invoice is not None:
        notices.send(Notice.PAYMENT_RECEIVED, order=invoice.order, invoice=invoice)


@shared_task(name="payments.issue_fiscal_document", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def issue_fiscal_document(fiscal_invoice_id: int) -> str:
    """Print an issued fiscal invoice once (PDF/A-3 with its Factur-X XML) and e-mail it to the order's contact."""
    fiscal_invoice = FiscalInvoice.objects.select_related("order").filter(pk=fiscal_invoice_id).first()
    if fiscal_invoice is None:
        return "unknown"
    fiscal_invoice = fiscal_documents.fiscal_invoice_write_document(fiscal_invoice=fiscal_invoice)
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
