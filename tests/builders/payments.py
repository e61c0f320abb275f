"""Payments on the dev chain: an order paid in ETH, the scanner's passes, a crowd of invoices, the invoice PDF."""

import html
import io
from datetime import timedelta

from django.urls import reverse
from pypdf import PdfReader

from booking.models import Order
from payments import config, scanner
from payments.addresses import deposit_addresses
from payments.models import ChainCursor, DerivationSlot, Invoice
from payments.selectors import current_invoice
from tests.builders.orders import place

CHAIN_ID = 31337


def pay_in_eth(client, booking_data, **overrides):
    order, token = place(client, booking_data(lots="1", **overrides))
    client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
    )
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH"
    return order, invoice


def cursor_past_the_head(chain) -> int:
    """The scan's cursor moved past the blocks mined so far without reading them: what a lagging provider's
    answer, taken as complete, leaves behind."""
    head = int(chain.request("eth_blockNumber", []), 16)
    ChainCursor.objects.update_or_create(chain_id=CHAIN_ID, defaults={"confirmed_block": head})
    return head


# --- native coin paid by a contract near expiry --------------------------------------------------------------------
def forward_at(chain, invoice: Invoice, *, timestamp: int) -> int:
    """A contract pays the invoice's due amount on to its address (an internal transaction, no log), in a block
    whose time is `timestamp`. Returns that block's number."""
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    chain.request("evm_setNextBlockTimestamp", [timestamp])
    receipt = chain.call(
        "PaymentForwarder",
        forwarder,
        "forward",
        invoice.deposit_address,
        sender=payer,
        value=int(invoice.amount_due_units),
    )
    block = int(receipt["blockNumber"], 16)
    assert int(chain.request("eth_getBlockByNumber", [hex(block), False])["timestamp"], 16) == timestamp
    return block


def order_page(client, order: Order, token: str) -> str:
    url = reverse("customer:order", kwargs={"public_id": order.public_id, "token": token})
    return html.unescape(client.get(url).content.decode())


def after_expiry(chain, invoice: Invoice, minutes: int = 1):
    """The chain's clock past the invoice's expiry: the next blocks carry later timestamps (reverted with the
    fixture's snapshot)."""
    later = invoice.expires_at + timedelta(minutes=minutes)
    chain.request("evm_setNextBlockTimestamp", [int(later.timestamp())])
    return later


def pdf_text(pdf: bytes) -> str:
    return "\n".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)


def crowd_invoices(model: Invoice, count: int) -> None:
    """`count` open invoices like `model`, each with its own derived address, written in bulk: invoice_create
    one by one takes a minute for 10,000 (an xpub parse and a few queries each), which this test is not about."""
    slots = DerivationSlot.objects.bulk_create([DerivationSlot() for _ in range(count)])
    indexes = [slot.pk for slot in slots]
    addresses = deposit_addresses(config.account_xpub(), indexes)
    fields = {
        field.attname: getattr(model, field.attname)
        for field in Invoice._meta.concrete_fields
        if field.attname not in ("id", "derivation_index", "deposit_address")
    }
    Invoice.objects.bulk_create(
        [Invoice(**fields, derivation_index=index, deposit_address=addresses[index].lower()) for index in indexes],
        batch_size=2000,
    )


def scan(**kwargs):
    return scanner.chain_scan(chain_id=CHAIN_ID, **kwargs)


def confirm(chain, **kwargs) -> None:
    chain.mine(3)
    scan(**kwargs)
