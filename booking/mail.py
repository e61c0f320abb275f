"""E-mails to researchers, written in the language they booked in."""

from django.core.mail import send_mail
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.functional import Promise

from booking.models import Order


def send_in_language(
    *, language: str, to: str, subject: Promise, subject_values: dict, template: str, context: dict
) -> str:
    """Render `template` and the lazily translated `subject` (formatted with `subject_values`) in `language` and
    send them to `to`. Returns the body, for copies to the operators."""
    with translation.override(language):
        subject_text = str(subject) % subject_values
        body = render_to_string(template, context)
    send_mail(subject_text, body, None, [to])
    return body


def send_to_order_contact(
    *, order: Order, subject: Promise, template: str, context: dict | None = None, subject_values: dict | None = None
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
    )
