"""Refunds, paid from the operator's own wallet and proven on chain, on the demo chain (anvil, demo token): a paid
order cancelled opens a refund, the customer gives an address, the operator pays the console's EIP-681 link and
enters the hash, and only what the chain shows reached the refund address counts."""

from decimal import Decimal
from urllib.parse import parse_qs, urlparse

import pytest
from django.urls import reverse

from booking.models import Order, OrderStatus
from payments import scanner
from payments.chain import checksum
from payments.demo import pay_invoice
from payments.models import Invoice, Refund, RefundPayment
from payments.refunds import units_for_fiat
from payments.selectors import current_invoice
from tests.builders.orders import place
from tests.builders.refunds import (
    CHAIN_ID,
    CUSTOMER_WALLET,
    OPERATOR_WALLET,
    cancel,
    confirm,
    console_uri,
    enter_hash,
    give_address,
    page,
    paid_on_chain,
    pay_uri,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rules_published")]


@pytest.fixture
def rules_published(rules):
    return rules(days=3, fee="25.00", percent=40)


def order_url(order: Order, token: str) -> str:
    return reverse("customer:order", kwargs={"public_id": order.public_id, "token": token})


# --- the whole loop ------------------------------------------------------------------------------------------------


def test_a_cancelled_paid_order_is_refunded_through_the_consoles_link_and_proven_by_its_transaction(
    client, chain, booking_data, operator, admin_user, mailoutbox, django_capture_on_commit_callbacks
):
    order, token, invoice = paid_on_chain(client, chain, booking_data)
    payer = checksum(chain.accounts()[1])

    refund = cancel(client, order, token, django_capture_on_commit_callbacks)

    # The refund is fixed in the paid asset, at the payment's rate: the price less the fee, rounded down.
    expected_units = units_for_fiat(invoice=invoice, fiat_amount=order.total_price - Decimal("25.00"))
    assert refund.reason == Refund.Reason.CANCELLATION and refund.status == Refund.Status.AWAITING_ADDRESS
    assert int(refund.amount_units) == expected_units < int(invoice.amount_due_units)
    assert (refund.asset_contract, refund.chain_id) == (invoice.asset_contract, CHAIN_ID)
    (asked,) = [message for message in mailoutbox if "give your address" in message.subject]
    assert asked.to == [order.contact_email] and "/orders/" in asked.body and refund.asset_symbol in asked.body
    # The order page asks for an address and never offers the payer's.
    shown = page(client, order_url(order, token))
    assert "Your refund address" in shown and "Waiting for your refund address" in shown
    assert "are owed back to you" in shown and "were refunded to you" not in shown
    refund_section = shown[shown.index('id="refunds"') :]
    assert payer not in refund_section and payer.lower() not in refund_section

    customer_wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    answer = give_address(client, order, token, refund, customer_wallet)
    assert "Refund address saved" in answer
    refund.refresh_from_db()
    assert refund.status == Refund.Status.DUE and refund.address == customer_wallet.lower()

    client.force_login(operator)
    uri = console_uri(client, refund)
    assert uri == (
        f"ethereum:{checksum(refund.asset_contract)}@{CHAIN_ID}/transfer?address={customer_wallet}&uint256={expected_units}"
    )
    assert "<svg" in page(client, reverse("console:queue")).split(f'id="refund-{refund.pk}"')[1]
    before = chain.balance_of(refund.asset_contract, customer_wallet.lower())
    tx_hash = pay_uri(chain, uri)
    confirm(chain)

    console = enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)

    refund.refresh_from_db()
    assert refund.status == Refund.Status.PAID and refund.paid_at is not None
    assert int(refund.amount_paid_units) == expected_units
    assert chain.balance_of(refund.asset_contract, customer_wallet.lower()) - before == expected_units
    (payment,) = refund.payments.all()
    assert payment.tx_hash == tx_hash and payment.status == RefundPayment.Status.CONFIRMED
    assert "paid in full" in console and f'id="refund-{refund.pk}"' not in console  # the queue empties
    order_console = page(client, reverse("console:order", kwargs={"public_id": order.public_id}))
    assert "Refunded" in order_console and tx_hash in order_console
    (sent,) = [message for message in mailoutbox if "is sent" in message.subject]
    assert sent.to == [order.contact_email] and tx_hash in sent.body and customer_wallet in sent.body
    shown = page(client, order_url(order, token))
    assert "Refund sent and confirmed on chain" in shown and tx_hash in shown
    assert "Save the refund address" not in shown  # no longer editable once paid
    assert "were refunded to you" in shown and "are owed back to you" not in shown  # the status says it went back

    # The same hash entered again counts once.
    enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)
    refund.refresh_from_db()
    assert int(refund.amount_paid_units) == expected_units and refund.payments.count() == 1
    assert len([message for message in mailoutbox if "is sent" in message.subject]) == 1

    # The admin shows it, read only, with its transaction.
    client.force_login(admin_user)
    assert order.public_id in page(client, reverse("admin:payments_refund_changelist"))
    change = client.get(reverse("admin:payments_refund_change", args=[refund.pk]))
    assert change.status_code == 200 and tx_hash in change.content.decode() and "Save" not in change.content.decode()


def test_a_short_payment_leaves_the_remainder_open_and_a_transfer_elsewhere_closes_nothing(
    client, chain, booking_data, operator, mailoutbox, django_capture_on_commit_callbacks
):
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    give_address(client, order, token, refund, checksum(chain.accounts()[CUSTOMER_WALLET]))
    client.force_login(operator)
    uri = console_uri(client, refund)
    total = int(refund.amount_units)

    short = pay_uri(chain, uri, units=total // 3)
    elsewhere = pay_uri(chain, uri, to=chain.accounts()[4])  # the full amount, to another address
    confirm(chain)
    console = enter_hash(client, refund, short, django_capture_on_commit_callbacks)
    refund.refresh_from_db()
    assert refund.status == Refund.Status.PARTLY_PAID and refund.amount_left_units == total - total // 3
    assert "Still to pay" in console
    # The console's link now asks for the remainder only.
    assert console_uri(client, refund).endswith(f"&uint256={total - total // 3}")

    console = enter_hash(client, refund, elsewhere, django_capture_on_commit_callbacks)
    refund.refresh_from_db()
    assert "pays nothing in the refund's asset to the refund address" in console
    assert refund.status == Refund.Status.PARTLY_PAID and refund.amount_left_units == total - total // 3
    assert not RefundPayment.objects.filter(tx_hash=elsewhere).exists()
    assert not [message for message in mailoutbox if "is sent" in message.subject]

    rest = pay_uri(chain, console_uri(client, refund))
    confirm(chain)
    enter_hash(client, refund, rest, django_capture_on_commit_callbacks)
    refund.refresh_from_db()
    assert refund.status == Refund.Status.PAID and refund.payments.count() == 2
    (sent,) = [message for message in mailoutbox if "is sent" in message.subject]
    assert short in sent.body and rest in sent.body


def test_a_refund_transaction_counts_only_once_its_block_is_confirmed(
    client, chain, booking_data, operator, django_capture_on_commit_callbacks
):
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    give_address(client, order, token, refund, checksum(chain.accounts()[CUSTOMER_WALLET]))
    client.force_login(operator)
    tx_hash = pay_uri(chain, console_uri(client, refund))

    console = enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)

    refund.refresh_from_db()
    assert "it counts once its block is confirmed" in console
    assert refund.status == Refund.Status.DUE and refund.amount_paid_units == 0
    assert refund.payments.get().status == RefundPayment.Status.SEEN
    confirm(chain)
    enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)
    refund.refresh_from_db()
    assert refund.status == Refund.Status.PAID and refund.payments.get().status == RefundPayment.Status.CONFIRMED


# --- hostile input ------------------------------------------------------------------------------------------------


def test_bad_addresses_bad_hashes_and_someone_elses_refund_are_refused_and_change_nothing(
    client, chain, booking_data, operator, django_capture_on_commit_callbacks
):
    order, token, invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    other_order, other_token, _ = paid_on_chain(client, chain, booking_data, contact_email="eve@example.org")
    other_refund = cancel(client, other_order, other_token, django_capture_on_commit_callbacks)
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    mistyped = wallet[:-1] + ("a" if wallet[-1] != "a" else "b")
    flipped_case = "0x" + "".join(c.swapcase() if c.isalpha() else c for c in wallet[2:])

    refusals = {
        "not an address": "0x followed by 40 hexadecimal characters",
        wallet[:-2]: "0x followed by 40 hexadecimal characters",
        mistyped: "does not pass its checksum",
        flipped_case: "does not pass its checksum",
        wallet.lower(): "does not pass its checksum",
        "0x" + "0" * 40: "zero address",
        checksum(invoice.deposit_address): "belongs to the payment system",
        checksum(refund.asset_contract): "belongs to the payment system",
        "<script>alert(1)</script>": "0x followed by 40 hexadecimal characters",
    }
    for address, message in refusals.items():
        answer = give_address(client, order, token, refund, address)
        assert message in answer, address
        assert "<script>alert(1)</script>" not in answer
        refund.refresh_from_db()
        assert refund.status == Refund.Status.AWAITING_ADDRESS and refund.address == ""

    # Someone else's refund, through this order's link: refused, theirs untouched.
    answer = give_address(client, order, token, other_refund, wallet)
    assert "This order has no such refund" in answer
    other_refund.refresh_from_db()
    assert other_refund.address == "" and other_refund.status == Refund.Status.AWAITING_ADDRESS

    # The operator's hash: not one, not on chain, or a payment to the invoice (not to the refund address).
    give_address(client, order, token, refund, wallet)
    client.force_login(operator)
    paid_invoice_tx = current_invoice(order).transfers.get().tx_hash
    for tx_hash, message in [
        ("nonsense", "0x followed by 64 hexadecimal characters"),
        ("0x" + "ab" * 33, "0x followed by 64 hexadecimal characters"),
        ("0x" + "12" * 32, "not on this refund's network"),
        (paid_invoice_tx, "pays nothing in the refund's asset to the refund address"),
    ]:
        console = enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)
        assert message in console, tx_hash
        refund.refresh_from_db()
        assert refund.status == Refund.Status.DUE and not refund.payments.exists()
    # A hash already counted for one refund does not pay another.
    tx_hash = pay_uri(chain, console_uri(client, refund))
    confirm(chain)
    enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)
    give_address(client, other_order, other_token, other_refund, wallet)
    console = enter_hash(client, other_refund, tx_hash, django_capture_on_commit_callbacks)
    assert "already counted for another refund" in console
    other_refund.refresh_from_db()
    assert other_refund.status == Refund.Status.DUE and not other_refund.payments.exists()


def test_only_operators_may_enter_a_refund_transaction(client, chain, booking_data, django_capture_on_commit_callbacks):
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    url = reverse("console:refund-pay", kwargs={"refund_id": refund.pk})

    response = client.post(url, {"tx_hash": "0x" + "12" * 32})  # a customer holding the order's link

    assert response.status_code == 302 and "/login/" in response["Location"]
    refund.refresh_from_db()
    assert refund.status == Refund.Status.AWAITING_ADDRESS


# --- overpayment and payments after settlement --------------------------------------------------------------------


def test_an_overpayment_opens_a_refund_of_the_excess_only(
    client, chain, booking_data, mailoutbox, django_capture_on_commit_callbacks
):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=int(invoice.amount_due_units) + 7_000000)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(chain)

    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.paid_over
    refund = order.refunds.get()
    assert refund.reason == Refund.Reason.OVERPAYMENT and int(refund.amount_units) == 7_000000
    assert [message for message in mailoutbox if "give your address" in message.subject]

    pay_invoice(chain, invoice, units=3_000000)  # paid again after settlement
    confirm(chain)
    late = order.refunds.get(reason=Refund.Reason.LATE_PAYMENT)
    assert int(late.amount_units) == 3_000000
    scanner.chain_scan(chain_id=CHAIN_ID)  # scanned again: nothing counted twice
    assert order.refunds.count() == 2


def test_a_payment_to_an_order_cancelled_before_it_arrived_is_refunded_in_full(
    client, chain, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    client.post(reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token}))
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and not order.refunds.exists()

    pay_invoice(chain, invoice)  # sent anyway, after the cancellation
    with django_capture_on_commit_callbacks(execute=True):
        confirm(chain)

    refund = order.refunds.get()
    assert refund.reason == Refund.Reason.LATE_PAYMENT and refund.amount_units == invoice.amount_due_units


# --- the native coin ------------------------------------------------------------------------------------------------


def test_a_refund_in_the_native_coin_is_paid_by_the_value_of_a_transaction(
    client, chain, booking_data, operator, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data(lots="1"))
    client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
    )
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH" and not invoice.asset_contract
    pay_invoice(chain, invoice)
    confirm(chain)
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    give_address(client, order, token, refund, wallet)
    client.force_login(operator)

    uri = console_uri(client, refund)
    assert uri == f"ethereum:{wallet}@{CHAIN_ID}?value={int(refund.amount_units)}"
    operator_wallet = chain.accounts()[OPERATOR_WALLET]
    # A token transfer to the right address pays nothing of a native refund; the coin sent does.
    token = chain.chain.asset("dEURC").contract
    chain.mint(token, operator_wallet, 10**6, sender=operator_wallet)
    wrong_asset = chain.send_token(token, wallet.lower(), 10**6, sender=operator_wallet)["transactionHash"]
    paid = chain.send_native(wallet.lower(), int(parse_qs(urlparse(uri).query)["value"][0]), sender=operator_wallet)
    confirm(chain)
    console = enter_hash(client, refund, wrong_asset, django_capture_on_commit_callbacks)
    assert "pays nothing in the refund's asset" in console
    enter_hash(client, refund, paid["transactionHash"], django_capture_on_commit_callbacks)

    refund.refresh_from_db()
    assert refund.status == Refund.Status.PAID
    assert refund.payments.get().log_index == -1 and refund.payments.get().tx_hash == paid["transactionHash"]


# --- the queue's cost ---------------------------------------------------------------------------------------------


def test_the_refunds_queue_costs_the_same_queries_for_one_refund_or_many(
    client, chain, booking_data, operator, admin_user, django_capture_on_commit_callbacks
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from booking.services import order_cancel_by_operator
    from payments.settlement import invoice_mark_paid

    def refund_owed(number: int) -> None:
        order, token = place(client, booking_data(lots="1", contact_email=f"lab{number}@example.org"))
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by wire")
        with django_capture_on_commit_callbacks(execute=True):
            order_cancel_by_operator(order=order, actor=operator, reason="host lost")
        give_address(client, order, token, order.refunds.get(), checksum(chain.accounts()[CUSTOMER_WALLET]))

    def queue_queries() -> tuple[int, str]:
        client.force_login(operator)
        with CaptureQueriesContext(connection) as queries:
            answer = client.get(reverse("console:queue"))
        client.logout()
        return len(queries), answer.content.decode()

    refund_owed(1)
    one, _page = queue_queries()
    for number in range(2, 6):
        refund_owed(number)
    many, queue = queue_queries()

    assert queue.count("ethereum:") >= 5 and queue.count("<svg") >= 5
    assert many == one


# --- the scan's watch ---------------------------------------------------------------------------------------------


def test_the_scan_marks_a_refund_paid_when_the_consoles_link_is_paid_as_is(
    client, chain, booking_data, operator, mailoutbox, django_capture_on_commit_callbacks
):
    from payments.tasks import scan_chain

    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    give_address(client, order, token, refund, wallet)
    client.force_login(operator)
    uri = console_uri(client, refund)
    left = int(refund.amount_units)

    # Not the link's amount, or not to the refund address: the scan counts nothing (only a hash entered would).
    pay_uri(chain, uri, units=left - 1)
    pay_uri(chain, uri, to=chain.accounts()[4])
    chain.mine(3)
    with django_capture_on_commit_callbacks(execute=True):
        scan_chain(CHAIN_ID)
    refund.refresh_from_db()
    assert refund.status == Refund.Status.DUE and not refund.payments.exists()

    tx_hash = pay_uri(chain, uri)  # the link as is
    with django_capture_on_commit_callbacks(execute=True):
        scan_chain(CHAIN_ID)  # not yet confirmed: not counted
        assert not refund.payments.exists()
        chain.mine(3)
        scan_chain(CHAIN_ID)
        scan_chain(CHAIN_ID)  # read again: counted once

    refund.refresh_from_db()
    assert refund.status == Refund.Status.PAID and refund.payments.get().tx_hash == tx_hash
    (sent,) = [message for message in mailoutbox if "is sent" in message.subject]
    assert tx_hash in sent.body
    # The operator entering the same hash afterwards changes nothing.
    enter_hash(client, refund, tx_hash, django_capture_on_commit_callbacks)
    assert refund.payments.count() == 1
