"""The e-mails customers and operators read, written from the apps' notices (booking/notices.py) in the language
the customer booked in."""

from django.conf import settings
from django.core.mail import EmailMessage, send_mail
from django.template.loader import render_to_string
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import gettext, gettext_lazy

from booking.models import Order, OrderStatus
from booking.notices import Notice
from provisioning import selectors as provisioning_selectors


def send_in_language(
    *,
    language: str,
    to: str,
    subject: Promise,
    subject_values: dict,
    template: str,
    context: dict,
    attachments: list[tuple[str, bytes, str]] | None = None,
) -> str:
    """Render `template` and the lazily translated `subject` (formatted with `subject_values`) in `language` and
    send them to `to`, with `attachments` (filename, content, MIME type). Returns the body, for copies to the
    operators."""
    with translation.override(language):
        subject_text = str(subject) % subject_values
        body = render_to_string(template, context)
    if attachments:
        EmailMessage(subject_text, body, None, [to], attachments=attachments).send()
    else:
        send_mail(subject_text, body, None, [to])
    return body


def send_to_order_contact(
    *,
    order: Order,
    subject: Promise,
    template: str,
    context: dict | None = None,
    subject_values: dict | None = None,
    attachments: list[tuple[str, bytes, str]] | None = None,
) -> str:
    """`send_in_language` to the order's contact, in the order's language; the subject may name the order's
    number as %(number)s and the template sees `order`."""
    return send_in_language(
        language=order.language,
        to=order.contact_email,
        subject=subject,
        subject_values={"number": order.public_id, **(subject_values or {})},
        template=template,
        context={"order": order, **(context or {})},
        attachments=attachments,
    )


def _order_link(*, order: Order, link: str) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme order %(number)s"),
        template="email/order_link.txt",
        context={"link": link},
    )


def _order_links(*, to: str, language: str, links: list[tuple[Order, str]]) -> None:
    send_in_language(
        language=language,
        to=to,
        subject=gettext_lazy("Your Binôme orders"),
        subject_values={},
        template="email/order_links.txt",
        context={"links": links},
    )


def _address_confirmation(*, to: str, language: str, link: str, valid_minutes: int) -> None:
    send_in_language(
        language=language,
        to=to,
        subject=gettext_lazy("Confirm your e-mail address to book on Binôme"),
        subject_values={},
        template="email/address_confirmation.txt",
        context={"link": link, "valid_minutes": valid_minutes},
    )


def _payment_received(*, order: Order, invoice) -> None:
    body = send_to_order_contact(
        order=order,
        subject=gettext_lazy("Payment received for your Binôme order %(number)s"),
        template="email/payment_received.txt",
        context={"invoice": invoice, "approval": provisioning_selectors.approval_outlook(order), "now": timezone.now()},
    )
    if settings.PAYMENTS_NOTIFY_EMAIL:
        send_mail(f"[Binôme] {order.public_id} paid, awaiting approval", body, None, [settings.PAYMENTS_NOTIFY_EMAIL])


def _access_ready(*, order: Order, accesses: list) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme machines are ready: order %(number)s"),
        template="email/access_ready.txt",
        context={"accesses": accesses},
    )


def _end_warning(*, order: Order, kind: str, wipe_at, wipe_after_days: int, link: str) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme window ends in %(left)s: order %(number)s"),
        subject_values={"left": kind.replace("h", " h")},
        template="email/end_warning.txt",
        context={"kind": kind, "wipe_at": wipe_at, "wipe_after_days": wipe_after_days, "link": link},
    )


def _watch_alert(*, order: Order, alert, minutes: int, hours: int, link: str) -> None:
    def cards(found: list) -> str:
        named = [gettext("GPU %(gpu)s on %(host)s") % {"gpu": gpu, "host": host} for host, gpu in found]
        return ", ".join(named) or "?"

    with translation.override(order.language):
        idle, busy = cards(alert.idle_cards), cards(alert.busy_cards)
    subject = {
        "imbalance": gettext_lazy("One card of your Binôme order %(number)s is nearly idle, the other busy"),
        "idle": gettext_lazy("The cards of your Binôme order %(number)s are idle"),
        "checkpoint": gettext_lazy("No new checkpoint on your Binôme order %(number)s"),
    }[alert.kind]
    send_to_order_contact(
        order=order,
        subject=subject,
        template="email/watch_alert.txt",
        context={
            "alert": alert,
            "idle": idle,
            "busy": busy,
            "minutes": minutes,
            "hours": hours,
            "vendor": order.hardware_class.vendor,
            "link": link,
        },
    )


def _research_record(*, order: Order, record, link: str) -> None:
    name = f"binome-{order.public_id}-record"
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("The research record of your Binôme order %(number)s"),
        template="email/research_record.txt",
        context={"record": record, "link": link, "name": name},
        attachments=[
            (f"{name}.pdf", bytes(record.pdf), "application/pdf"),
            (f"{name}.json", bytes(record.document), "application/json"),
            (f"{name}.json.sig", bytes(record.signature), "application/octet-stream"),
        ],
    )


def _preflight_held(*, order: Order, failed: dict[str, list[str]]) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("The pre-flight check of your Binôme order %(number)s failed"),
        template="email/preflight_held.txt",
        context={"failed": sorted(failed.items())},
    )


def _order_rejected(*, order: Order, reason: str) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme order %(number)s was not accepted"),
        template="email/order_rejected.txt",
        context={"reason": reason},
    )


def _keys_changed(*, order: Order, added: list[str], removed: list[str], applied: bool) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("The SSH keys of your Binôme order %(number)s changed"),
        template="email/keys_changed.txt",
        context={"added": added, "removed": removed, "applied": applied, "ended": order.status == OrderStatus.ENDED},
    )


def _order_moved(*, order: Order, stage: str, accesses: list, data_kept: bool, credit: str, hours_lost: int) -> None:
    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme order %(number)s moves to another machine")
        if stage == "started"
        else gettext_lazy("Your Binôme order %(number)s is ready on its new machine"),
        template="email/order_moved.txt",
        context={
            "stage": stage,
            "accesses": accesses,
            "data_kept": data_kept,
            "credit": credit,
            "hours_lost": hours_lost,
        },
    )


def _send_to_operators(*, subject, subject_values: dict, template: str, context: dict) -> None:
    """To the operators (ADMINS, and PAYMENTS_NOTIFY_EMAIL when set), in the portal's language."""
    recipients = list(dict.fromkeys([*(address for _name, address in settings.ADMINS), settings.PAYMENTS_NOTIFY_EMAIL]))
    for address in filter(None, recipients):
        send_in_language(
            language=settings.LANGUAGE_CODE,
            to=address,
            subject=subject,
            subject_values=subject_values,
            template=template,
            context=context,
        )


def _host_failing(*, host_name: str, problems: list[str]) -> None:
    _send_to_operators(
        subject=gettext_lazy("[Binôme] Host %(host)s is failing its health check"),
        subject_values={"host": host_name},
        template="email/host_failing.txt",
        context={"host_name": host_name, "problems": problems},
    )


def _container_held(*, order: Order, host_name: str, restarts: int) -> None:
    """A customer's container kept stopping and is left stopped (provisioning/restarts.py)."""
    _send_to_operators(
        subject=gettext_lazy("[Binôme] The container of order %(number)s keeps stopping: left stopped"),
        subject_values={"number": order.public_id},
        template="email/container_held.txt",
        context={"order": order, "host_name": host_name, "restarts": restarts},
    )


def _order_cancelled(*, order: Order, refund_due) -> None:
    body = send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your Binôme order %(number)s is cancelled"),
        template="email/order_cancelled.txt",
        context={"refund_due": refund_due},
    )
    if settings.PAYMENTS_NOTIFY_EMAIL and refund_due:
        send_mail(f"[Binôme] {order.public_id} cancelled, refund owed", body, None, [settings.PAYMENTS_NOTIFY_EMAIL])


def _refund_requested(*, order: Order, refund, link: str) -> None:
    from payments.selectors import format_units

    body = send_to_order_contact(
        order=order,
        subject=gettext_lazy("A refund is owed to you for your Binôme order %(number)s: give your address"),
        template="email/refund_requested.txt",
        context={
            "refund": refund,
            "amount": format_units(refund.amount_units, refund.asset_decimals),
            "link": link,
        },
    )
    if settings.PAYMENTS_NOTIFY_EMAIL:
        send_mail(f"[Binôme] {order.public_id}: refund opened", body, None, [settings.PAYMENTS_NOTIFY_EMAIL])


def _refund_address_changed(*, order: Order, refund, address: str, previous: str) -> None:
    from payments.chain import checksum

    send_to_order_contact(
        order=order,
        subject=(
            gettext_lazy("The refund address of your Binôme order %(number)s changed")
            if previous
            else gettext_lazy("The refund address of your Binôme order %(number)s is saved")
        ),
        template="email/refund_address_changed.txt",
        context={
            "refund": refund,
            "address": checksum(address),
            "previous": checksum(previous) if previous else "",
        },
    )


def _refund_sent(*, order: Order, refund, payments: list) -> None:
    from payments.chain import checksum
    from payments.selectors import format_units

    send_to_order_contact(
        order=order,
        subject=gettext_lazy("Your refund for Binôme order %(number)s is sent"),
        template="email/refund_sent.txt",
        context={
            "refund": refund,
            "address": checksum(refund.address),
            "amount": format_units(refund.amount_paid_units, refund.asset_decimals),
            "payments": [
                {"tx_hash": payment.tx_hash, "amount": format_units(payment.amount_units, refund.asset_decimals)}
                for payment in payments
            ],
        },
    )


def _invoice_issued(*, order: Order, fiscal_invoice) -> None:
    """An invoice or a credit note, its PDF attached."""
    send_to_order_contact(
        order=order,
        subject=(
            gettext_lazy("Credit note %(invoice)s for your Binôme order %(number)s")
            if fiscal_invoice.is_credit_note
            else gettext_lazy("Invoice %(invoice)s for your Binôme order %(number)s")
        ),
        subject_values={"invoice": fiscal_invoice.number},
        template="email/credit_note_issued.txt" if fiscal_invoice.is_credit_note else "email/invoice_issued.txt",
        context={"fiscal_invoice": fiscal_invoice},
        attachments=[(fiscal_invoice.filename, bytes(fiscal_invoice.pdf), "application/pdf")],
    )


WRITERS = {
    Notice.ORDER_LINK: _order_link,
    Notice.ORDER_LINKS: _order_links,
    Notice.ADDRESS_CONFIRMATION: _address_confirmation,
    Notice.PAYMENT_RECEIVED: _payment_received,
    Notice.ACCESS_READY: _access_ready,
    Notice.END_WARNING: _end_warning,
    Notice.PREFLIGHT_HELD: _preflight_held,
    Notice.WATCH_ALERT: _watch_alert,
    Notice.RESEARCH_RECORD: _research_record,
    Notice.ORDER_REJECTED: _order_rejected,
    Notice.KEYS_CHANGED: _keys_changed,
    Notice.HOST_FAILING: _host_failing,
    Notice.CONTAINER_HELD: _container_held,
    Notice.ORDER_MOVED: _order_moved,
    Notice.ORDER_CANCELLED: _order_cancelled,
    Notice.REFUND_REQUESTED: _refund_requested,
    Notice.REFUND_ADDRESS_CHANGED: _refund_address_changed,
    Notice.REFUND_SENT: _refund_sent,
    Notice.INVOICE_ISSUED: _invoice_issued,
}


def write(sender: Notice, **facts) -> None:
    """The receiver of booking.notices.notice: one e-mail (and its copies) per notice."""
    facts.pop("signal", None)
    WRITERS[sender](**facts)
