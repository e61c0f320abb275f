"""The revenue report reads the ledger (payments/ledger.py): revenue is the price of the time given less the price
refunded, per month; a refused extension or a payment to an order never served is not a sale; the refund of an
overpayment is not revenue; what is held or owed back is a line of its own. Each sequence is one of issue 32's."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from booking.models import Price
from booking.services import order_cancel_by_customer
from inventory.models import MaintenanceWindow
from payments import checkout, refunds
from payments.chain import checksum
from payments.demo import pay_invoice
from payments.models import Refund, RefundPayment
from payments.selectors import current_invoice, money_held_or_owed, revenue_by_month
from payments.settlement import invoice_mark_paid
from tests.builders.orders import make_ready_order, place
from tests.builders.payments import confirm

pytestmark = pytest.mark.django_db


def this_month():
    return datetime.now(UTC).date().replace(day=1)


def months() -> dict:
    return {(row.month, row.currency): row for row in revenue_by_month(since=this_month() - timedelta(days=40))}


def held() -> dict:
    return {line.currency: line for line in money_held_or_owed()}


def price_of(catalog, *, days: int, lots: int = 1) -> Decimal:
    return lots * Price.objects.get(hardware_class=catalog["b200-pair"], days=days).amount_per_lot


def test_a_refused_extension_is_not_a_sale_and_its_refund_is_owed_back_not_subtracted(
    client, catalog, booking_data, admin_user, operator, django_capture_on_commit_callbacks
):
    # given a ready order (3,150.00) and a 3-day extension (1,450.00) asked for, then a maintenance window planned
    # on its host right after the window: the extension's payment confirms and settlement refuses it
    capture = django_capture_on_commit_callbacks
    order, _token = make_ready_order(client, booking_data, admin_user, capture)
    extension = checkout.order_extension_request(order=order, days=3, actor=None)
    assert (current_invoice(order).fiat_amount, extension.fiat_amount) == (Decimal("3150.00"), Decimal("1450.00"))
    host = order.allocations.select_related("lot__host").get().lot.host
    MaintenanceWindow.objects.create(
        host=host, starts_at=order.ends_at, ends_at=order.ends_at + timedelta(days=10), reason="firmware"
    )
    with capture(execute=True):
        invoice_mark_paid(invoice=extension, user=admin_user, reason="the extension's transfer confirmed")
    assert Refund.objects.get(invoice=extension).reason == Refund.Reason.EXTENSION_REFUSED

    # then the month sold the booking only, and refunded no price: the extension's 1,450.00 is owed back
    month = months()[(this_month(), "EUR")]
    assert (month.settled, month.invoices, month.refunded, month.net) == (
        Decimal("3150.00"),
        1,
        Decimal("0.00"),
        Decimal("3150.00"),
    )
    assert held()["EUR"].owed_back == Decimal("1450.00")
    client.force_login(operator)
    page = client.get(reverse("console:reports")).content.decode()
    assert "<td>3150.00 EUR</td><td>1</td><td>0.00 EUR</td><td>3150.00 EUR</td>" in page
    assert '<tr data-currency="EUR"><td>1450.00 EUR</td>' in page


def test_an_overpayment_is_not_revenue_and_its_refund_is_not_subtracted(
    client, chain, catalog, booking_data, django_capture_on_commit_callbacks
):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=int(invoice.amount_due_units) + 50_000000)  # 50.00 too much
    with django_capture_on_commit_callbacks(execute=True):
        confirm(chain)
    assert order.refunds.get().reason == Refund.Reason.OVERPAYMENT

    month = months()[(this_month(), "EUR")]

    assert (month.settled, month.refunded, month.net) == (Decimal("3150.00"), Decimal("0.00"), Decimal("3150.00"))
    assert held()["EUR"].owed_back == Decimal("50.00")


def test_a_payment_to_an_order_cancelled_before_it_came_is_not_a_sale(
    client, catalog, booking_data, admin_user, django_capture_on_commit_callbacks
):
    order, _token = place(client, booking_data(lots="1"))
    order_cancel_by_customer(order=order)  # unpaid: nothing owed
    with django_capture_on_commit_callbacks(execute=True):
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="a wire that came after")
    assert order.refunds.get().reason == Refund.Reason.LATE_PAYMENT

    assert (this_month(), "EUR") not in months()
    assert held()["EUR"].owed_back == Decimal("3150.00")


def test_a_provider_fault_refunds_the_price_of_the_time_lost_in_the_month_it_is_given(
    client, catalog, booking_data, admin_user
):
    # given a 7-day window (168 h) paid last month
    order, _token = place(client, booking_data(lots="1", days="7"))
    last_month = this_month() - timedelta(days=1)
    paid_at = datetime(last_month.year, last_month.month, last_month.day, 12, tzinfo=UTC)
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by wire", now=paid_at)
    price = price_of(catalog, days=7)

    # when 24 hours of it are lost to a provider fault, refunded as money this month
    with transaction.atomic():
        refund = refunds.refund_for_lost_time(order=order, lost=timedelta(hours=24), lots=1)

    # then last month sold the window, and this month gives back a seventh of its price
    lost = (price / 7).quantize(Decimal("0.01"))
    assert refund.fiat_amount == lost
    by_month = months()
    sold = by_month[(last_month.replace(day=1), "EUR")]
    given_back = by_month[(this_month(), "EUR")]
    assert (sold.settled, sold.refunded, sold.net) == (price, Decimal("0.00"), price)
    assert (given_back.settled, given_back.invoices, given_back.refunded, given_back.net) == (
        Decimal("0.00"),
        0,
        lost,
        -lost,
    )


def test_a_cancellation_keeps_its_fee_as_revenue_and_owes_back_the_rest_until_it_is_paid(
    client,
    catalog,
    booking_data,
    admin_user,
    rules,
    django_capture_on_commit_callbacks,
):
    rules(days=3, fee="25.00", percent=40)
    order, _token = place(client, booking_data(lots="1", days="7"))
    invoice = current_invoice(order)
    invoice_mark_paid(invoice=invoice, user=admin_user, reason="paid by wire")
    order.refresh_from_db()
    from booking.cancellation import refund_quote

    shown = refund_quote(order=order, now=timezone.now()).amount
    with django_capture_on_commit_callbacks(execute=True):
        order_cancel_by_customer(order=order, refund_shown=shown)
    refund = Refund.objects.get(order=order)
    price = price_of(catalog, days=7)
    assert refund.fiat_amount == price - Decimal("25.00")

    assert held()["EUR"].owed_back == price - Decimal("25.00")
    # the customer gives an address; the operator's first transaction carries half of it
    refund = refunds.refund_set_address(refund=refund, address=checksum("0x" + "12" * 20))
    RefundPayment.objects.create(
        refund=refund,
        chain_id=refund.chain_id,
        tx_hash="0x" + "ab" * 32,
        log_index=0,
        block_number=1,
        block_hash="0x" + "cd" * 32,
        token_contract=refund.asset_contract,
        to_address="0x" + "12" * 20,
        amount_units=int(refund.amount_units) // 2,
        status=RefundPayment.Status.CONFIRMED,
        confirmed_at=timezone.now(),
    )
    Refund.objects.filter(pk=refund.pk).update(
        amount_paid_units=int(refund.amount_units) // 2, status=Refund.Status.PARTLY_PAID
    )

    month = months()[(this_month(), "EUR")]
    assert (month.settled, month.refunded, month.net) == (price, price - Decimal("25.00"), Decimal("25.00"))
    left = int(refund.amount_units) - int(refund.amount_units) // 2
    expected_left = (Decimal(left).scaleb(-refund.asset_decimals) * refund.rate).quantize(Decimal("0.01"))
    assert held()["EUR"].owed_back == expected_left


def test_a_part_payment_still_open_and_a_flagged_one_are_held_not_revenue(
    client, chain, catalog, booking_data, django_capture_on_commit_callbacks
):
    from booking.services import orders_expire_stale_holds

    expired, _token = place(client, booking_data(lots="1", contact_email="late@example.org"))
    expired_invoice = current_invoice(expired)
    pay_invoice(chain, expired_invoice, units=700_000000)
    confirm(chain)
    with django_capture_on_commit_callbacks(execute=True):
        orders_expire_stale_holds(now=expired_invoice.expires_at + timedelta(minutes=1))
    waiting, _token = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(waiting), units=1000_000000)
    confirm(chain)

    line = held()["EUR"]

    assert (this_month(), "EUR") not in months()
    assert (line.pending, line.flagged, line.owed_back) == (Decimal("1000.00"), Decimal("700.00"), Decimal("0"))


def test_a_wire_marked_paid_for_an_order_whose_lots_were_taken_is_held_not_sold(
    client, catalog, booking_data, admin_user
):
    from booking.services import orders_expire_stale_holds

    order, _token = place(client, booking_data(lots="6"))
    invoice = current_invoice(order)
    orders_expire_stale_holds(now=invoice.expires_at + timedelta(minutes=1))
    place(client, booking_data(lots="6", contact_email="quick@example.org"))  # the lots go to someone else
    invoice_mark_paid(invoice=invoice, user=admin_user, reason="a wire that came late")
    invoice.refresh_from_db()
    assert invoice.needs_operator and not order.fiscal_invoices.exists()

    assert (this_month(), "EUR") not in months()
    assert held()["EUR"].flagged == price_of(catalog, days=7, lots=6) == invoice.fiat_amount
