"""What a customer, or the operators, must be told, as facts. The apps decide when; the presentation layer writes
the e-mail in the customer's language (web/mail.py), so no app renders a template a customer reads.

    notices.send(Notice.ACCESS_READY, order=order, accesses=accesses)

It is a Django signal with one writer, connected by web/apps.py. It is sent, not sent robustly: a mail that cannot
go out fails the task that sends it, which retries. A notice with no writer is a configuration error, never
silence.
"""

from enum import StrEnum

from django.core.exceptions import ImproperlyConfigured
from django.dispatch import Signal


class Notice(StrEnum):
    ORDER_LINK = "order_link"  # order=, link=: a fresh secret link to the order's contact
    ORDER_LINKS = "order_links"  # to=, language=, links=[(order, link)]: every recent order of an address
    # to=, language=, link=, valid_minutes=: a link that confirms the address in the browser that opens it
    ADDRESS_CONFIRMATION = "address_confirmation"
    PAYMENT_RECEIVED = "payment_received"  # order=, invoice=: to the contact, and a copy to the operators
    ACCESS_READY = "access_ready"  # order=, accesses=: how to log in
    END_WARNING = "end_warning"  # order=, kind= ("48h", "6h"), wipe_at=, wipe_after_days=, link= (to extend)
    # order=, alert= (provisioning.models.WatchAlert), minutes=, hours= (the operator's lengths), link=: the readings
    # show an unbalanced split or idle cards while the window runs
    WATCH_ALERT = "watch_alert"
    # order=, record= (provisioning.models.ResearchRecord), link=: the window's signed record, its files attached
    RESEARCH_RECORD = "research_record"
    PREFLIGHT_HELD = "preflight_held"  # order=, failed={host name: [check names]}: the hand-over waits
    ORDER_REJECTED = "order_rejected"  # order=, reason=: the operators refused a paid order
    ORDER_CANCELLED = "order_cancelled"  # order=, refund_due=: a paid order cancelled by its customer
    REFUND_REQUESTED = "refund_requested"  # order=, refund=, link=: money is owed back, give an address
    # order=, refund=, address=, previous= ("" when first given): to the contact, who can undo a change they did
    # not make before the operator pays
    REFUND_ADDRESS_CHANGED = "refund_address_changed"
    REFUND_SENT = "refund_sent"  # order=, refund=, payments=[RefundPayment]: the refund is paid, with its transactions
    KEYS_CHANGED = "keys_changed"  # order=, added=[fingerprint], removed=[fingerprint], applied= (on the machines)
    INVOICE_ISSUED = "invoice_issued"  # order=, fiscal_invoice=: the invoice's PDF attached, to the contact
    # order=, stage= ("started", "done"), accesses=, data_kept=, credit= ("none", "extension", "refund"), hours_lost=:
    # a provider fault moves the order to other lots
    ORDER_MOVED = "order_moved"
    HOST_FAILING = "host_failing"  # host_name=, problems=[str]: to the operators, when a host turns to failing
    # order=, host_name=, restarts=: to the operators, when the watch stops restarting a container that keeps stopping
    CONTAINER_HELD = "container_held"


notice = Signal()


def send(kind: Notice, /, **facts) -> None:
    if not notice.has_listeners(kind):
        raise ImproperlyConfigured(f"nothing writes the {kind} notice: is the `web` app installed?")
    notice.send(sender=kind, **facts)
