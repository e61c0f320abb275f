"""The console's utilisation and revenue page, checked against figures computed by hand on seeded orders."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from booking.models import Price
from booking.selectors import utilisation_by_week
from booking.services import order_cancel_by_customer
from payments.selectors import current_invoice, revenue_by_month
from payments.settlement import invoice_mark_paid
from tests.builders.orders import place

pytestmark = pytest.mark.django_db


def _week_cells(page: str, host_label: str) -> list[str]:
    row = page.split(f"<td>{host_label}</td>", 1)[1].split("</tr>", 1)[0]
    return [cell.split(">", 1)[1].split("</td>")[0] for cell in row.split("<td data-week=")[1:]]


def test_utilisation_and_revenue_match_the_figures_computed_by_hand(
    client, operator, admin_user, catalog, booking_data, start_date, django_assert_max_num_queries
):
    # given: a paid order of 2 B200 lots for 7 days (the first host's two lots), an unpaid one, a cancelled one
    paid, _token = place(client, booking_data(lots="2", days="7"))
    invoice_mark_paid(invoice=current_invoice(paid), user=admin_user, reason="test")
    place(client, booking_data(lots="1", days="3", contact_email="unpaid@example.org"))
    cancelled, _token = place(client, booking_data(lots="1", days="3", contact_email="gone@example.org"))
    order_cancel_by_customer(order=cancelled)
    host = paid.allocations.select_related("lot__host").first().lot.host
    assert {allocation.lot.host for allocation in paid.allocations.select_related("lot__host")} == {host}

    # when
    with django_assert_max_num_queries(2):
        weeks, rows = utilisation_by_week(first_week=start_date, weeks=3)

    # then: by hand, the window's 7 days split over the week of its start and the next
    in_first_week = 7 - start_date.weekday()
    by_host = {(row.hardware_class, row.host): row.weeks for row in rows}
    on_host = by_host[("NVIDIA B200 pair", host.name)]
    assert [(use.sold, use.available) for use in on_host] == [
        (2 * in_first_week, 14),
        (2 * (7 - in_first_week), 14),
        (0, 14),
    ]
    b200_total = by_host[("NVIDIA B200 pair", "")]
    assert [(use.sold, use.available) for use in b200_total] == [
        (2 * in_first_week, 6 * 7),
        (2 * (7 - in_first_week), 6 * 7),
        (0, 6 * 7),
    ]
    assert on_host[0].percent == round(100 * in_first_week / 7)
    assert all(use.sold == 0 for use in by_host[("NVIDIA H200 pair", "")])

    # revenue: the one paid invoice, at the catalog's price, in the price currency, this month
    price = Price.objects.get(hardware_class=catalog["b200-pair"], days=7).amount_per_lot
    today = datetime.now(UTC).date()
    [month] = revenue_by_month(since=today)
    assert (month.month, month.settled, month.currency, month.invoices) == (
        today.replace(day=1),
        2 * price,
        "EUR",
        1,
    )

    # the page shows the same figures
    client.force_login(operator)
    page = client.get(reverse("console:reports"), {"from": start_date.isoformat()}).content.decode()
    first = _week_cells(page, host.name)
    assert first[0] == f"{2 * in_first_week} / 14 ({round(100 * in_first_week / 7)} %)"
    assert f"<td>{2 * price} EUR</td>" in page
    assert weeks[0] <= start_date < weeks[0] + timedelta(days=7) and weeks[0].weekday() == 0


def test_an_early_release_counts_the_days_used_only(catalog, booking_data, client, admin_user, start_date):
    paid, _token = place(client, booking_data(lots="1", days="7"))
    invoice_mark_paid(invoice=current_invoice(paid), user=admin_user, reason="test")
    allocation = paid.allocations.get()
    allocation.released_at = paid.starts_at + timedelta(days=2, hours=12)  # as an early end records it
    allocation.save(update_fields=["released_at"])

    _weeks, rows = utilisation_by_week(first_week=start_date, weeks=2)

    total = next(row for row in rows if row.hardware_class == "NVIDIA B200 pair" and not row.host)
    assert sum(use.sold for use in total.weeks) == Decimal("2.5")


def test_the_reports_page_refuses_a_bad_date_kindly_and_is_for_operators(client, operator, catalog):
    assert client.get(reverse("console:reports")).status_code == 302
    client.force_login(operator)
    response = client.get(reverse("console:reports"), {"from": "2026-13-45"})
    assert response.status_code == 200
    assert "Give the first week as a date, e.g. 2026-03-02." in response.content.decode()


def test_the_reports_page_speaks_french(client, operator, catalog):
    client.force_login(operator)
    client.cookies["django_language"] = "fr"

    page = client.get(reverse("console:reports"), {"from": "x"}).content.decode()

    assert "Lots-jours vendus / disponibles par semaine" in page and "Tous les hôtes" in page
    assert "Chiffre d’affaires" in page and "Indiquez la première semaine par une date" in page


def test_revenue_is_shown_net_of_the_price_refunded_that_month(
    catalog, booking_data, client, admin_user, operator, django_capture_on_commit_callbacks
):
    """A paid order cancelled for a refund: the month shows the price of the time sold, the price given back as the
    refund opened (its credit note's month), and what remains; the refund not paid yet is owed back, on its own
    line (payments/selectors.py `money_held_or_owed`)."""
    from booking.cancellation import refund_quote
    from payments.models import Refund

    order, _token = place(client, booking_data(lots="1", days="7"))
    invoice = current_invoice(order)
    invoice_mark_paid(invoice=invoice, user=admin_user, reason="test")
    order.refresh_from_db()
    shown = refund_quote(order=order, now=datetime.now(UTC)).amount  # what the cancel button shows the customer
    with django_capture_on_commit_callbacks(execute=True):  # the refund opens as the cancellation commits
        order_cancel_by_customer(order=order, refund_shown=shown)
    refund = Refund.objects.get(order=order)
    price = Price.objects.get(hardware_class=catalog["b200-pair"], days=7).amount_per_lot

    [month] = revenue_by_month(since=datetime.now(UTC).date())

    assert (month.settled, month.refunded, month.net) == (price, refund.fiat_amount, price - refund.fiat_amount)
    client.force_login(operator)
    page = client.get(reverse("console:reports")).content.decode()
    assert f"<td>{refund.fiat_amount} EUR</td><td>{price - refund.fiat_amount} EUR</td>" in page
    assert f'<tr data-currency="EUR"><td>{refund.fiat_amount} EUR</td>' in page  # owed back, not paid yet
