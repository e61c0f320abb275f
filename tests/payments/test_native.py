"""The native coin is credited by what was paid, not by a balance that moves: a sweep between two payments, a
payment by an internal transaction from a contract, a derived address that already holds coin (anvil)."""

from django.conf import settings
from django.urls import reverse

from booking.models import OrderStatus
from payments import services
from payments.addresses import deposit_address
from payments.demo import pay_invoice
from payments.models import DerivationSlot, Invoice, Transfer
from payments.selectors import current_invoice
from tests.booking.test_pages import place

CHAIN_ID = 31337


def pay_in_eth(client, booking_data, **overrides):
    order, token = place(client, booking_data(lots="1", **overrides))
    client.post(
        reverse("booking:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
    )
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH"
    return order, invoice


def scan():
    return services.chain_scan(chain_id=CHAIN_ID)


def test_a_sweep_between_two_partial_payments_hides_neither(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    due = int(invoice.amount_due_units)
    pay_invoice(chain, invoice, units=due // 2)
    chain.mine(3)
    scan()

    # The operator sweeps the deposit address (its key is offline; anvil lets the test send for it).
    chain.request("anvil_impersonateAccount", [invoice.deposit_address])
    balance = int(chain.request("eth_getBalance", [invoice.deposit_address, "latest"]), 16)
    chain.send_native(chain.accounts()[0], balance - 10**15, sender=invoice.deposit_address)
    chain.request("anvil_stopImpersonatingAccount", [invoice.deposit_address])
    chain.mine(3)
    scan()

    pay_invoice(chain, invoice, units=due - due // 2)
    chain.mine(3)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.amount_confirmed_units == due
    assert order.status == OrderStatus.PAID


def test_a_payment_by_an_internal_transaction_from_a_contract_is_credited(client, chain, booking_data):
    order, invoice = pay_in_eth(client, booking_data)
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    amount = int(invoice.amount_due_units)
    chain.call("PaymentForwarder", forwarder, "forward", invoice.deposit_address, sender=payer, value=amount)
    chain.mine(3)

    scan()

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    credit = Transfer.objects.get(invoice=invoice)
    assert credit.amount_units == invoice.amount_due_units and credit.block_time is not None


def test_a_derived_address_that_already_holds_coin_is_never_issued(client, chain, booking_data, caplog):
    order, _token = place(client, booking_data(lots="1"))
    next_index = DerivationSlot.objects.order_by("-pk").first().pk + 1
    prefunded = deposit_address(settings.PAYMENTS_XPUB, next_index).lower()
    chain.send_native(prefunded, 10**18, sender=chain.accounts()[3])  # someone funds it first

    invoice = services.invoice_change_asset(order=order, asset_key=f"{CHAIN_ID}:ETH")

    assert invoice.deposit_address != prefunded and invoice.derivation_index > next_index
    assert f"derivation index {next_index} ({deposit_address(settings.PAYMENTS_XPUB, next_index)})" in caplog.text
    assert not Invoice.objects.filter(deposit_address=prefunded).exists()
