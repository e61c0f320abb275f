"""How payments' services hand work to a worker: by the task's name, so that the services never import the tasks
that call them (payments/tasks.py imports the services; the app registers its tasks when ready, payments/apps.py).
Each function says when it queues: after the current transaction commits, or now (a caller that must know whether
the broker took it, or that runs outside a transaction)."""

from infrastructure.queues import after_commit, task


def check_invoice_now(invoice_id: int) -> None:
    """Raises whatever the broker raises when it is unreachable: the caller records "check delayed"."""
    task("payments.check_invoice").apply_async(args=[invoice_id], retry=False)


def check_tx_hint_now(invoice_id: int) -> None:
    """Raises whatever the broker raises when it is unreachable."""
    task("payments.check_tx_hint").apply_async(args=[invoice_id], retry=False)


def check_refund_tx(refund_id: int, tx_hash: str) -> None:
    """After commit, five seconds later."""
    after_commit("payments.check_refund_tx", refund_id, tx_hash, countdown=5)


def send_payment_received(invoice_id: int) -> None:
    after_commit("payments.send_payment_received", invoice_id)


def issue_fiscal_document(fiscal_invoice_id: int) -> None:
    """After commit; an invoice whose PDF was not queued is printed by beat's sweep (print_fiscal_documents)."""
    after_commit("payments.issue_fiscal_document", fiscal_invoice_id)


def send_refund_requested(refund_id: int) -> None:
    after_commit("payments.send_refund_requested", refund_id)


def send_refund_address_changed(refund_id: int, address: str, previous: str) -> None:
    after_commit("payments.send_refund_address_changed", refund_id, address, previous)


def send_refund_sent(refund_id: int) -> None:
    after_commit("payments.send_refund_sent", refund_id)
