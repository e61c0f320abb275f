"""The refund loop in Chromium: a researcher cancels a paid order and gives a refund address on the order page; the
operator pays the console's EIP-681 link from their own wallet and enters the hash; the researcher's page then says
"refund sent" with the transaction. Both forms are submitted by the browser (Origin, Referer, cookies as sent)."""

import re

import pytest

from booking.models import OrderStatus
from payments import scanner
from payments.chain import checksum
from payments.models import Refund
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.browser.steps import ORDER_URL, log_in, pay_link, place_order, submitted

pytestmark = pytest.mark.integration

REFUNDS_URL = re.compile(r".*/orders/BN-[^/]+/[^/]+/#refunds$")
OPERATOR_WALLET = 2
CUSTOMER_WALLET = 3


def test_a_cancelled_order_is_refunded_to_the_address_given_and_the_page_shows_the_transaction(
    researcher, new_page, live_server, live_chain, catalog, admin_user, operator
):
    page = researcher
    chain, _path = live_chain
    order = place_order(page, live_server.url, email="refund-loop@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    page.reload()
    submitted(page, page.get_by_role("button", name=re.compile(r"^Cancel and be refunded ")), to=ORDER_URL)
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    assert "Waiting for your refund address" in page.inner_text("#refunds")
    assert page.input_value("input[name=address]") == ""  # never prefilled

    # A typo (one capital letter lowered) is caught by the checksum; the address as the wallet shows it is taken.
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    first_letter = next(index for index, char in enumerate(wallet) if index > 1 and char.isalpha())
    typo = wallet[:first_letter] + wallet[first_letter].swapcase() + wallet[first_letter + 1 :]
    page.fill("input[name=address]", typo)
    submitted(page, page.get_by_role("button", name="Save the refund address"), to=REFUNDS_URL)
    assert "does not pass its checksum" in page.inner_text("ul.messages")
    assert order.refunds.get().address == ""
    page.fill("input[name=address]", wallet)
    submitted(page, page.get_by_role("button", name="Save the refund address"), to=REFUNDS_URL)
    assert "Refund address saved" in page.inner_text("ul.messages")
    assert wallet in page.inner_text("#refunds")

    console = new_page()
    log_in(console, live_server.url + "/console/", "olga")
    refunds = console.locator("#section-refunds")
    assert wallet in refunds.inner_text() and refunds.locator("svg").count() >= 1
    receipt = pay_link(refunds.locator("a[href^='ethereum:']").get_attribute("href"), chain, account=OPERATOR_WALLET)
    chain.mine(3)
    scanner.chain_scan(chain_id=31337)
    console.fill("input[name=tx_hash]", receipt["transactionHash"])
    with console.expect_navigation():
        console.get_by_role("button", name="Verify on chain").click()
    assert "paid in full" in console.inner_text("ul.messages")
    assert "Nothing here." in console.inner_text("#section-refunds")  # the queue emptied

    refund = order.refunds.get()
    assert refund.status == Refund.Status.PAID
    page.reload()
    assert "Refund sent and confirmed on chain" in page.inner_text("#refunds")
    assert receipt["transactionHash"] in page.inner_text("#refunds")
