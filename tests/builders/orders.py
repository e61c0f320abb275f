"""Orders built through the booking pages: placed (in English or French), paid before, ready on dry-run hosts."""

import re

from django.test import Client
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import runs
from provisioning import services as provisioning_services


def order_url(order: Order, token: str) -> str:
    return reverse("customer:order", kwargs={"public_id": order.public_id, "token": token})


def _why_not_placed(response) -> str:
    """The messages of a booking page that came back instead of the order (the page's head says nothing)."""
    page = response.content.decode()
    pattern = r'<(?:ul class="errorlist[^"]*"|p class="(?:notice|error)[^"]*"|li class="[^"]*")[^>]*>(.*?)</'
    messages = " | ".join(text.strip() for text in re.findall(pattern, page, re.S))
    return f"{response.status_code}: {messages[:2000] or page[-2000:]}"


def place(client, data: dict) -> tuple[Order, str]:
    response = client.post(reverse("customer:book"), data)
    assert response.status_code == 302, _why_not_placed(response)
    match = re.fullmatch(r"/orders/(?P<public_id>[^/]+)/(?P<token>[^/]+)/", response["Location"])
    assert match, response["Location"]
    assert client.get(response["Location"]).status_code == 200  # as a browser follows the redirect
    return Order.objects.get(public_id=match["public_id"]), match["token"]


def place_in_french(client, data):
    client.cookies["django_language"] = "fr"
    order, token = place(client, data)
    assert order.language == "fr"
    return order, token


def _paid_before(booking_data, admin_user, email: str) -> Order:
    """An earlier order of the researcher's, paid."""
    order, _token = place(Client(REMOTE_ADDR="203.0.113.99"), booking_data(lots="1", contact_email=email))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    return order


def make_ready_order(client, booking_data, admin_user, capture, lots: str = "1") -> tuple[Order, str]:
    """A paid order (marked paid by an admin), approved and provisioned on the demo's dry-run hosts before its
    window starts: READY, still cancellable by its customer with a refund."""
    order, token = place(client, booking_data(lots=lots))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    order.refresh_from_db()
    provisioning_services.order_approve(order=order, actor=admin_user)
    with capture(execute=True):
        runs.provisioning_start(order=order, actor=admin_user)
    order.refresh_from_db()
    assert order.status == OrderStatus.READY and order.starts_at > timezone.now()
    return order, token
