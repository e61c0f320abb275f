"""A payment that bought nothing, resolved from the console in Chromium: a researcher pays part of an order, its hold
runs out; the payment waits in the console's flagged payments. The operator's "Apply to the order" is refused with
the reason (only part was paid) and changes nothing; "Refund" opens the refund, which the researcher's page then
asks an address for. Both buttons are pressed by the browser (Origin, Referer, cookies as sent)."""

import re
from datetime import timedelta

import pytest

from booking.models import OrderStatus
from booking.services import orders_expire_stale_holds
from payments import scanner
from payments.models import Refund
from payments.selectors import current_invoice
from tests.browser.steps import ORDER_URL, log_in, pay_as_a_wallet, place_order, submitted

pytestmark = pytest.mark.integration

QUEUE_URL = re.compile(r".*/console/#section-flagged$")


def test_the_operator_refunds_a_partial_payment_of_an_expired_order_from_the_console(
    researcher,
    new_page,
    live_server,
    live_chain,
    catalog,
    operator,
):
    # given a researcher who paid 1,000.00 of 3,150.00, then let the hold run out
    page = researcher
    chain, _path = live_chain
    order = place_order(page, live_server.url, email="part-paid@example.org")
    invoice = current_invoice(order)
    pay_as_a_wallet(page, chain, fraction=(1000, 3150))
    chain.mine(3)
    scanner.chain_scan(chain_id=31337)
    orders_expire_stale_holds(now=invoice.expires_at + timedelta(minutes=1))
    order.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED

    # the payment waits in the console, with its two actions
    console = new_page()
    console.refused = []
    console.on("response", lambda response: response.status == 403 and console.refused.append(response.url))
    log_in(console, live_server.url + "/console/", "olga")
    flagged = console.locator(f"#flagged-{invoice.pk}")
    assert "Partial payment" in flagged.inner_text() and "1000.00 of 3150.00 dEURC received" in flagged.inner_text()

    # when the operator applies it: refused, with the reason, and nothing changes
    submitted(console, flagged.get_by_role("button", name="Apply to the order"), to=QUEUE_URL)
    assert "Only 1000.00 of the 3150.00 dEURC asked for were received" in console.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.status == OrderStatus.EXPIRED and not order.refunds.exists()

    # when they refund it
    submitted(console, console.locator(f"#flagged-{invoice.pk}").get_by_role("button", name="Refund"), to=QUEUE_URL)

    # then the refund is open, in the refunds queue, and the payment left the flagged ones
    assert "a refund of 1000.00 dEURC is opened" in console.inner_text("ul.messages")
    refund = order.refunds.get()
    assert (refund.reason, int(refund.amount_units)) == (Refund.Reason.UNUSED_PAYMENT, 1000_000000)
    assert console.locator(f"#flagged-{invoice.pk}").count() == 0
    assert "Waiting for the customer's refund address" in console.inner_text(f"#refund-{refund.pk}")

    # and the researcher's page asks for the address to refund to
    page.goto(page.url.split("#")[0])
    assert ORDER_URL.fullmatch(page.url)
    assert "Waiting for your refund address" in page.inner_text("#refunds")
