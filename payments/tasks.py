"""Thin Celery wrappers for the chain queue."""

from celery import shared_task
from django.utils import timezone

from booking import notices
from booking.notices import Notice
from payments import config, scanner
from payments.chain import ChainUnavailable
from payments.models import Invoice


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
    invoice = Invoice.objects.filter(pk=invoice_id).first() if isinstance(invoice_id, int) else None
    if invoice is None:
        return "unknown"
    delay = CHECK_DELAYS[min(self.request.retries, len(CHECK_DELAYS) - 1)]
    try:
        result = scanner.chain_scan(chain_id=invoice.chain_id)
    except ChainUnavailable as exc:
        raise self.retry(exc=exc, countdown=delay) from exc
    invoice.refresh_from_db()
    if invoice.status == Invoice.Status.SETTLED or timezone.now() >= invoice.monitor_until or self.request.is_eager:
        return invoice.status
    if result.skipped or invoice.customer_paid_at:
        raise self.retry(countdown=delay)
    return invoice.status


@shared_task(name="payments.send_payment_received", autoretry_for=(OSError,), retry_backoff=True, max_retries=5)
def send_payment_received(invoice_id: int) -> None:
    invoice = Invoice.objects.select_related("order").filter(pk=invoice_id).first()
    if invoice is not None:
        notices.send(Notice.PAYMENT_RECEIVED, order=invoice.order, invoice=invoice)
