"""A refund's life through the pages: paid on chain, cancelled, the customer's address, the operator's payment."""

import html
import re
from urllib.parse import parse_qs, urlparse

from django.urls import reverse
from django.utils import timezone

from booking.cancellation import refund_quote
from booking.models import Order, OrderStatus
from payments import scanner
from payments.chain_demo import DevChain
from payments.demo import pay_invoice
from payments.models import Invoice, Refund
from payments.selectors import current_invoice
from tests.builders.orders import place

CHAIN_ID = 31337


OPERATOR_WALLET = 2  # the anvil account the operator pays refunds from


CUSTOMER_WALLET = 3  # the customer's own wallet (not the one that paid: index 1)


def confirm(chain: DevChain) -> None:
    chain.mine(3)
    scanner.chain_scan(chain_id=CHAIN_ID)


def page(client, url: str) -> str:
    return html.unescape(client.get(url).content.decode())


def paid_on_chain(client, chain, booking_data, **overrides) -> tuple[Order, str, Invoice]:
    order, token = place(client, booking_data(lots="1", **overrides))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    confirm(chain)
    order.refresh_from_db()
    invoice.refresh_from_db()
    assert order.status == OrderStatus.PAID and invoice.status == Invoice.Status.SETTLED
    return order, token, invoice


def cancel(client, order: Order, token: str, capture) -> Refund:
    shown = refund_quote(order=order, now=timezone.now()).amount
    with capture(execute=True):
        client.post(
            reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}),
            {"refund_shown": str(shown)},
        )
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    return order.refunds.get()


def give_address(client, order: Order, token: str, refund: Refund, address: str) -> str:
    url = reverse("customer:order-refund-address", kwargs={"public_id": order.public_id, "token": token})
    response = client.post(url, {"refund": refund.pk, "address": address}, follow=True)
    return html.unescape(response.content.decode())


def console_uri(client, refund: Refund) -> str:
    queue = page(client, reverse("console:queue"))
    match = re.search(rf'id="refund-{refund.pk}".*?href="(ethereum:[^"]+)"', queue, flags=re.S)
    assert match, "no EIP-681 link for the refund on the console"
    return match.group(1)


def pay_uri(chain: DevChain, uri: str, *, units: int | None = None, to: str | None = None) -> str:
    """The operator's wallet pays an EIP-681 token transfer link, as a wallet reads it (amount or recipient changed
    when the test says so)."""
    parsed = urlparse(uri)
    token = parsed.path.split("@")[0]
    query = parse_qs(parsed.query)
    wallet = chain.accounts()[OPERATOR_WALLET]
    units = units if units is not None else int(query["uint256"][0])
    chain.mint(token.lower(), wallet, units, sender=wallet)
    receipt = chain.send_token(token.lower(), (to or query["address"][0]).lower(), units, sender=wallet)
    return receipt["transactionHash"]


def enter_hash(client, refund: Refund, tx_hash: str, capture) -> str:
    with capture(execute=True):
        response = client.post(reverse("console:refund-pay", kwargs={"refund_id": refund.pk}), {"tx_hash": tx_hash})
    assert response.status_code == 302
    return html.unescape(client.get(response["Location"]).content.decode())
