"""What a paid order waits for, said as the operator set it (OperatorSettings): automatic approval or their stated
response time, and when the machines are prepared; on the order page, in the payment e-mail, and in the console's
queue, which marks a paid order waiting longer than the operator said."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.models import OrderEvent, OrderStatus
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning.models import OperatorSettings
from tests.builders.orders import place

pytestmark = pytest.mark.django_db


def _paid(client, booking_data, admin_user, callbacks):
    order, token = place(client, booking_data(lots="2"))
    with callbacks(execute=True):
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by wire")
    order.refresh_from_db()
    page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token}))
    return order, page.content.decode()


def test_the_page_and_the_e_mail_give_the_operator_s_response_time_and_when_preparation_starts(
    client, catalog, booking_data, admin_user, django_capture_on_commit_callbacks, mailoutbox
):
    # given: an operator who approves each order within 12 hours, and prepares machines 6 hours before a window
    OperatorSettings.objects.update_or_create(
        pk=1, defaults={"auto_approve": False, "approval_response_hours": 12, "provision_lead_hours": 6}
    )

    # when: a researcher's order is paid
    order, page = _paid(client, booking_data, admin_user, django_capture_on_commit_callbacks)

    # then: the order page and the e-mail say who approves it, within how long, and when preparation starts
    prepared = (order.starts_at - timedelta(hours=6)).strftime("%Y-%m-%d %H:%M")
    assert order.status == OrderStatus.PAID
    assert "An operator approves each order, within 12 hours of its payment." in page
    assert f"Your machines are prepared from {prepared} UTC, 6 hours before your window, then checked" in page
    (received,) = [message for message in mailoutbox if "Payment received" in message.subject]
    assert "Next: an operator approves the order, within 12 hours of its payment." in received.body
    assert f"Your machines are prepared from {prepared} UTC, 6 hours before your window, then checked." in received.body
    assert "will approve" not in page + received.body


def test_with_automatic_approval_nobody_is_told_to_wait_for_an_operator(
    client, catalog, booking_data, admin_user, django_capture_on_commit_callbacks, mailoutbox
):
    OperatorSettings.objects.update_or_create(pk=1, defaults={"auto_approve": True, "provision_lead_hours": 24})

    order, page = _paid(client, booking_data, admin_user, django_capture_on_commit_callbacks)

    prepared = (order.starts_at - timedelta(hours=24)).strftime("%Y-%m-%d %H:%M")
    assert order.status == OrderStatus.APPROVED
    assert "Approved." in page and f"prepared from {prepared} UTC, 24 hours before your window" in page
    (received,) = [message for message in mailoutbox if "Payment received" in message.subject]
    assert "Next: your order is approved automatically." in received.body
    assert "operator approves" not in page + received.body


def test_the_queue_says_how_long_each_order_has_waited_and_marks_a_late_approval(client, paid_order, operator):
    order, _token = paid_order
    OperatorSettings.objects.update_or_create(pk=1, defaults={"auto_approve": False, "approval_response_hours": 24})
    client.force_login(operator)
    paid_event = OrderEvent.objects.filter(order=order, to_status=OrderStatus.PAID)

    def paid_section() -> str:
        queue = client.get(reverse("console:queue")).content.decode()
        return queue.split('id="section-paid"')[1].split("</section>")[0]

    paid_event.update(created_at=timezone.now() - timedelta(hours=2, minutes=5))
    waiting = paid_section()
    assert order.public_id in waiting and "2\xa0hours" in waiting and "late:" not in waiting

    paid_event.update(created_at=timezone.now() - timedelta(hours=30))
    late = paid_section()
    assert "1\xa0day, 6\xa0hours" in late and "late: past the approval time you state" in late

    OperatorSettings.objects.filter(pk=1).update(auto_approve=True)  # nobody is late for what is automatic
    assert "late:" not in paid_section()
