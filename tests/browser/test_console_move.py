"""The console's "Move (provider fault)" form in Chromium: an operator moves a lot of a ready order to a free one
on another host and gives the lost hours back as a longer window; the researcher's page says the order is moving."""

import re
from datetime import timedelta

import pytest

from booking.models import OrderStatus
from booking.services import order_transition
from inventory.models import Lot
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning.models import ProvisioningRun
from tests.browser.steps import place_order
from tests.browser.test_forms import submitted
from tests.browser.test_journeys import log_in, operator  # noqa: F401 (a fixture)

pytestmark = pytest.mark.integration

CONSOLE_ORDER_URL = re.compile(r".*/console/orders/BN-[^/]+/$")


@pytest.fixture
def browser_page(page):
    page.on("dialog", lambda dialog: dialog.accept())  # the form's confirmation
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    return page


def test_an_operator_moves_a_lot_after_a_provider_fault_and_credits_the_hours(
    browser_page,
    new_page,
    live_server,
    live_chain,
    catalog,
    admin_user,
    operator,  # noqa: F811
):
    researcher = browser_page
    order = place_order(researcher, live_server.url, email="fault@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    order.refresh_from_db()
    held = order.allocations.filter(released_at__isnull=True).select_related("lot__host").first().lot
    taken = order.allocations.values_list("lot_id", flat=True)
    target = Lot.objects.filter(hardware_class=order.hardware_class).exclude(pk__in=taken).exclude(host=held.host)
    target = target.order_by("host__name", "name").first()
    end = order.ends_at

    console = new_page()
    console.on("dialog", lambda dialog: dialog.accept())
    console.refused = []
    console.on("response", lambda response: response.status == 403 and console.refused.append(response.url))
    log_in(console, f"{live_server.url}/console/orders/{order.public_id}/", "olga")
    form = console.locator("form", has=console.locator(f"input[name=from_lot][value='{held.pk}']")).filter(
        has=console.get_by_role("button", name="Move (provider fault)")
    )
    form.locator("select[name=to_lot]").select_option(str(target.pk))
    form.locator("input[name=hours_lost]").fill("5")
    form.locator("select[name=credit]").select_option("extension")
    submitted(console, form.get_by_role("button", name="Move (provider fault)"), to=CONSOLE_ORDER_URL)

    assert "move (the customer is e-mailed) done" in console.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.ends_at == end + timedelta(hours=5)
    assert target.pk in order.allocations.filter(released_at__isnull=True).values_list("lot_id", flat=True)
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE).exists()
    researcher.reload()
    assert "your order is moving to other cards" in researcher.inner_text("main")
