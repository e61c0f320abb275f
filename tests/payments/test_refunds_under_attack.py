"""Red team, issue 21 (money after the payment): attacks on refunds, cancellation, credit notes and the provider-fault
remedy. Each test states the behaviour the product promises; a test that FAILS here is a VULNERABILITY that
reproduces (its docstring starts with "VULNERABILITY"); a test that passes is an attack the product held against
("HELD"). Real Postgres and anvil, through the same fixtures as tests/payments/test_refunds.py. The team's findings
on invoices are in tests/payments/test_fiscal_invoices_under_attack.py, on the terms in
tests/booking/test_terms_under_attack.py."""

import contextlib
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from booking.cancellation import refund_quote
from booking.models import Order, OrderStatus
from booking.rules import BookingError
from booking.services import order_cancel_by_customer, order_cancel_by_operator
from payments import checkout, scanner
from payments.chain import checksum
from payments.demo import pay_invoice
from payments.models import FiscalInvoice, Invoice, Refund
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.builders.console import act
from tests.builders.orders import make_ready_order, place
from tests.builders.refunds import (
    CHAIN_ID,
    CUSTOMER_WALLET,
    cancel,
    confirm,
    console_uri,
    enter_hash,
    give_address,
    paid_on_chain,
    pay_uri,
)

pytestmark = pytest.mark.django_db


def total_refunded_units(order: Order, invoice: Invoice) -> int:
    return sum(int(refund.amount_units) for refund in Refund.objects.filter(order=order, invoice=invoice))


def other_free_lot(order: Order):
    from inventory.models import Lot

    live = order.allocations.filter(released_at__isnull=True).select_related("lot__host")
    hosts = {allocation.lot.host_id for allocation in live}
    taken = order.allocations.values_list("lot_id", flat=True)
    free = Lot.objects.filter(hardware_class=order.hardware_class).exclude(pk__in=taken).exclude(host_id__in=hosts)
    return live.first().lot, free.order_by("host__name", "name").first()


# --- 1. the refund address changed after the operator paid ----------------------------------------------------------


@pytest.mark.usefixtures("rules_published")
def test_refund_address_changed_after_the_operator_paid_does_not_make_the_operator_pay_twice(
    client,
    chain,
    booking_data,
    operator,
    django_capture_on_commit_callbacks,
):
    """Fixed (was high): the refund address stays editable until the refund is paid, but every address it was
    given is kept (RefundAddress) and a transfer to any of them pays it. The customer gives address A, the operator
    pays the console's link to A, the customer sees the transfer arrive and changes the address to B before the
    scan counts it: the scan's watch (which goes on reading A) and the operator's hash both count the transfer to A,
    and the refund is paid; the operator is not asked to pay B."""
    capture = django_capture_on_commit_callbacks
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, capture)
    first = checksum(chain.accounts()[CUSTOMER_WALLET])
    give_address(client, order, token, refund, first)
    client.force_login(operator)
    owed = int(refund.amount_units)
    before = chain.balance_of(refund.asset_contract, first.lower())

    tx_hash = pay_uri(chain, console_uri(client, refund))  # the operator pays the link, to the address given
    # The customer sees it in their wallet (mempool or first block) and gives another address of theirs at once.
    second = checksum(chain.accounts()[4])
    answer = give_address(client, order, token, refund, second)
    queue = client.get(reverse("console:queue")).content.decode()
    assert "Address changed" in queue and first in queue  # the operator is told a payout to the first counts
    with capture(execute=True):
        confirm(chain)  # the scan, with its refund watch
    console = enter_hash(client, refund, tx_hash, capture)

    assert chain.balance_of(refund.asset_contract, first.lower()) - before == owed  # the customer holds the refund
    refund.refresh_from_db()
    assert "Refund address saved" in answer  # the change was accepted after the transfer was sent
    assert refund.status == Refund.Status.PAID, (
        f"the customer holds the {owed} units sent to the address they gave, yet the refund is {refund.status} "
        f"with {refund.amount_left_units} units left, now to be paid to {refund.address}; console: "
        f"{'pays nothing' in console}"
    )


# --- 2. a provider-fault refund and a cancellation refund on the same invoice ---------------------------------------


@pytest.mark.usefixtures("full_refund_rules")
@pytest.mark.parametrize("who", ["customer", "operator"])
def test_provider_fault_refund_then_cancellation_never_refunds_more_than_was_paid(
    client,
    booking_data,
    admin_user,
    operator,
    who,
    django_capture_on_commit_callbacks,
):
    """Fixed (was high): a READY order (provisioned before its window) is both movable with a pro-rata refund and
    cancellable with a refund. The refunds of an invoice's price (provider fault, cancellation, rejection) never
    add up to more than it received: refunds_open_for_order opens only what is left of it, the quote shown to the
    customer is capped by what is left of the price (Order.fault_refunds), and the credit notes follow the
    refunds (fiscal_credit_notes_for_refund credits what they add up to, less the notes issued already)."""
    capture = django_capture_on_commit_callbacks
    order, _token = make_ready_order(client, booking_data, admin_user, capture)
    invoice = order.invoices.get(status=Invoice.Status.SETTLED)
    failing, target = other_free_lot(order)
    client.force_login(operator)
    act(
        client,
        order,
        "move",
        {"from_lot": failing.pk, "to_lot": target.pk, "hours_lost": "24", "credit": "refund"},
        capture,
    )
    assert Refund.objects.get(order=order).reason == Refund.Reason.PROVIDER_FAULT

    order.refresh_from_db()
    with capture(execute=True):
        if who == "customer":  # still before the window: a full refund (no fee) by the rules it accepted
            order_cancel_by_customer(order=order, refund_shown=refund_quote(order=order, now=timezone.now()).amount)
        else:
            order_cancel_by_operator(order=order, actor=operator, reason="customer asked after the fault")

    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED
    refunds = list(Refund.objects.filter(order=order))
    refunded_fiat = sum(refund.fiat_amount for refund in refunds)
    credited = sum(note.total_gross for note in FiscalInvoice.objects.filter(order=order, kind="credit_note"))
    assert (
        total_refunded_units(order, invoice) <= int(invoice.amount_due_units) and refunded_fiat <= invoice.fiat_amount
    ), (
        f"refunds {[(r.reason, str(r.fiat_amount)) for r in refunds]} add up to {refunded_fiat} "
        f"{invoice.fiat_currency} ({total_refunded_units(order, invoice)} units) on an invoice of "
        f"{invoice.fiat_amount} ({invoice.amount_due_units} units)"
    )
    assert credited == refunded_fiat, f"credit notes {credited}, refunds {refunded_fiat}"


# --- 3. a paid extension, then a cancellation: the quote shown vs what is refunded, and the credit notes ----------


@pytest.fixture
def partial_refund_rules(rules):
    # Full refund only until 30 days before the start: the booking (7+ days ahead) is in the 50 % period already.
    return rules(days=30, fee="0.00", percent=50)


@pytest.mark.usefixtures("partial_refund_rules")
def test_a_cancelled_order_with_a_paid_extension_refunds_what_the_customer_was_shown_with_credit_notes_for_it(
    client, booking_data, admin_user, django_capture_on_commit_callbacks
):
    """Fixed (was medium): a READY order can be extended before its window starts and still be cancelled with a
    refund. The cancellation rules apply to everything paid for the window (Order.total_price plus the paid
    extensions, Order.extensions_price): the quote on the cancel button is what is refunded, spread over the
    booking's invoice first and then the extension's, and credited by credit notes of the same total. Since issue
    32, a READY order's access is handed over: the quote is the started window's (nothing), and nothing is refunded
    or credited beyond it."""
    capture = django_capture_on_commit_callbacks
    order, _token = make_ready_order(client, booking_data, admin_user, capture)
    extension = checkout.order_extension_request(order=order, days=3, actor=None)
    with capture(execute=True):
        invoice_mark_paid(invoice=extension, user=admin_user, reason="test: paid by wire")
    order.refresh_from_db()
    extension.refresh_from_db()
    assert extension.status == Invoice.Status.SETTLED and order.status == OrderStatus.READY

    shown = refund_quote(order=order, now=timezone.now())
    assert (shown.rule, shown.amount) == ("handed_over", 0)
    with capture(execute=True):
        order_cancel_by_customer(order=order, refund_shown=shown.amount)

    refunds = list(Refund.objects.filter(order=order))
    refunded = sum(refund.fiat_amount for refund in refunds)
    credited = sum(note.total_gross for note in FiscalInvoice.objects.filter(order=order, kind="credit_note"))
    assert refunded == credited, f"refunded {refunded} ({[str(r.fiat_amount) for r in refunds]}), credited {credited}"
    assert refunded == shown.amount, f"the customer was shown {shown.amount}, {refunded} is owed back"


# --- 4. a second payment after settlement --------------------------------------------------------------------------


@pytest.mark.usefixtures("full_refund_rules")
def test_held_every_payment_received_after_settlement_is_owed_back(client, chain, booking_data):
    """HELD: a second and a third payment after settlement (a wallet that sent twice) each open their own
    late-payment refund (the unique constraint on (invoice, reason) leaves late_payment out), and a scan read
    again counts nothing twice."""
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    confirm(chain)
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED

    pay_invoice(chain, invoice, units=3_000000)
    confirm(chain)
    pay_invoice(chain, invoice, units=2_000000)
    confirm(chain)

    scanner.chain_scan(chain_id=CHAIN_ID)
    owed = sum(int(refund.amount_units) for refund in order.refunds.all())
    assert owed == 5_000000, f"5 received after settlement, {owed / 1e6} owed back"


# --- 5. a cancel posted on an unpaid order while its payment settles ---------------------------------------------


@pytest.mark.usefixtures("partial_refund_rules")
def test_a_cancel_racing_the_settlement_gives_the_refund_the_rules_give_not_a_full_one(
    client, booking_data, admin_user, django_capture_on_commit_callbacks
):
    """Fixed (was low, a race): order_cancel_by_customer decides paid or unpaid from the order row it locked, not
    from the order as the view read it. A cancel posted while the payment settles (the view read
    AWAITING_PAYMENT, the settlement committed PAID before the lock) takes the paid path: the refund the
    customer was shown (none) is not the quote, so nothing is cancelled and they are asked again; a paid order is
    never cancelled through the unpaid path with a full refund."""
    capture = django_capture_on_commit_callbacks
    order, _token = place(client, booking_data(lots="1"))
    as_the_view_read_it = Order.objects.get(pk=order.pk)
    assert as_the_view_read_it.status == OrderStatus.AWAITING_PAYMENT
    invoice = current_invoice(order)
    with capture(execute=True):
        invoice_mark_paid(invoice=invoice, user=admin_user, reason="the scan settles it meanwhile")
    invoice.refresh_from_db()

    with capture(execute=True), contextlib.suppress(BookingError):  # refused: the boundary held
        order_cancel_by_customer(order=as_the_view_read_it)

    order.refresh_from_db()
    refunded = sum(refund.fiat_amount for refund in order.refunds.all())
    rules_give = refund_quote(order=order, now=timezone.now()).amount
    assert order.status != OrderStatus.CANCELLED or refunded <= rules_give, (
        f"cancelled through the unpaid path: {refunded} refunded, the rules give {rules_give}"
    )


# --- what held ------------------------------------------------------------------------------------------------------


@pytest.fixture
def rules_published(rules):
    return rules(days=3, fee="25.00", percent=40)


@pytest.mark.usefixtures("rules_published")
def test_held_one_transaction_cannot_pay_two_refunds_even_at_the_same_address(
    client,
    chain,
    booking_data,
    operator,
    django_capture_on_commit_callbacks,
):
    """HELD: two refunds with the same address and the same amount; one transfer is counted for one of them only,
    by the scan and by the hash entered for the other."""
    capture = django_capture_on_commit_callbacks
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    first_order, first_token, _ = paid_on_chain(client, chain, booking_data)
    second_order, second_token, _ = paid_on_chain(client, chain, booking_data, contact_email="bob@example.org")
    first = cancel(client, first_order, first_token, capture)
    second = cancel(client, second_order, second_token, capture)
    assert first.amount_units == second.amount_units
    give_address(client, first_order, first_token, first, wallet)
    give_address(client, second_order, second_token, second, wallet)
    client.force_login(operator)
    tx_hash = pay_uri(chain, console_uri(client, first))
    with capture(execute=True):
        confirm(chain)
        from payments.tasks import scan_chain

        scan_chain(CHAIN_ID)
    enter_hash(client, first, tx_hash, capture)
    enter_hash(client, second, tx_hash, capture)
    first.refresh_from_db()
    second.refresh_from_db()
    assert sorted([first.status, second.status]) == sorted([Refund.Status.PAID, Refund.Status.DUE])


@pytest.mark.usefixtures("rules_published")
def test_held_bad_refund_shown_and_bad_inputs_answer_in_words_and_change_nothing(
    client,
    chain,
    booking_data,
    operator,
    django_capture_on_commit_callbacks,
):
    """HELD: the cancel form's refund_shown (NaN, sNaN, huge exponents, a higher amount), the refund address form
    (another order's refund, overflowing ids, NUL bytes) and the console's hash form answer without a 500 and
    change nothing."""
    from django.urls import reverse

    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    url = reverse("customer:order-cancel", kwargs={"public_id": order.public_id, "token": token})
    quote = refund_quote(order=order, now=timezone.now()).amount
    for shown in [
        "NaN",
        "sNaN",
        "-0",
        "1E+999999999",
        "1e-999999999",
        str(quote + Decimal("0.01")),
        "Infinity",
        "9" * 25,
        "",
        "0x10",
        " ".join("1" * 5),
    ]:
        response = client.post(url, {"refund_shown": shown})
        assert response.status_code == 302, shown
        order.refresh_from_db()
        assert order.status == OrderStatus.PAID and order.refund_due is None, shown
    refund = cancel(client, order, token, django_capture_on_commit_callbacks)
    address_url = reverse("customer:order-refund-address", kwargs={"public_id": order.public_id, "token": token})
    for data in [
        {"refund": "9" * 40, "address": "0x" + "1" * 40},
        {"refund": str(refund.pk), "address": "0x\x00"},
        {"refund": "-1"},
        {"refund": str(refund.pk), "address": "\u0660x" + "1" * 40},
    ]:
        assert client.post(address_url, data).status_code == 302, data
    refund.refresh_from_db()
    assert refund.address == "" and refund.status == Refund.Status.AWAITING_ADDRESS
    client.force_login(operator)
    for tx_hash in ["0x" + "g" * 64, "0x" + "0" * 64, "\x00", "0X" + "1" * 64]:
        response = client.post(reverse("console:refund-pay", kwargs={"refund_id": refund.pk}), {"tx_hash": tx_hash})
        assert response.status_code == 302, tx_hash
    assert client.post(reverse("console:refund-pay", kwargs={"refund_id": 10**12}), {"tx_hash": "x"}).status_code in (
        302,
        404,
    )


@pytest.mark.usefixtures("rules_published")
def test_held_a_transfer_in_another_token_pays_nothing(
    client,
    chain,
    booking_data,
    operator,
    django_capture_on_commit_callbacks,
):
    """HELD: a transfer of the full amount in another allow-listed token (same decimals) to the refund address
    counts for nothing, by the scan or by its hash."""
    capture = django_capture_on_commit_callbacks
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, capture)
    wallet = checksum(chain.accounts()[CUSTOMER_WALLET])
    give_address(client, order, token, refund, wallet)
    client.force_login(operator)
    operator_wallet = chain.accounts()[2]
    other = "dUSDT" if refund.asset_symbol == "dEURC" else "dEURC"
    other_token = chain.chain.asset(other).contract
    chain.mint(other_token, operator_wallet, int(refund.amount_units), sender=operator_wallet)
    wrong = chain.send_token(other_token, wallet.lower(), int(refund.amount_units), sender=operator_wallet)
    with capture(execute=True):
        confirm(chain)
    console = enter_hash(client, refund, wrong["transactionHash"], capture)
    assert "pays nothing in the refund's asset" in console
    refund.refresh_from_db()
    assert refund.status == Refund.Status.DUE and not refund.payments.exists()


@pytest.mark.usefixtures("rules_published")
def test_the_contact_is_told_when_the_refund_address_changes(
    client, chain, booking_data, mailoutbox, django_capture_on_commit_callbacks
):
    """Fixed (was low-medium): the order link is the only credential for the refund address, so whoever holds a
    forwarded or leaked link could redirect the refund silently. Every address given or changed is now e-mailed
    to the contact (Notice.REFUND_ADDRESS_CHANGED, with the previous address), who can undo a change they did not
    make before the operator pays; a payout sent to the previous address still counts."""
    capture = django_capture_on_commit_callbacks
    order, token, _invoice = paid_on_chain(client, chain, booking_data)
    refund = cancel(client, order, token, capture)
    give_address(client, order, token, refund, checksum(chain.accounts()[CUSTOMER_WALLET]))
    mailoutbox.clear()

    with capture(execute=True):
        answer = give_address(client, order, token, refund, checksum(chain.accounts()[5]))  # someone with the link

    refund.refresh_from_db()
    assert "Refund address saved" in answer and refund.address == chain.accounts()[5].lower()
    told = [mail for mail in mailoutbox if order.contact_email in mail.to]
    assert told, "the contact was not told"
    assert checksum(chain.accounts()[5]) in told[0].body
    assert checksum(chain.accounts()[CUSTOMER_WALLET]) in told[0].body


# --- 8. a lost-time credit while an extension waits for its payment -------------------------------------------------


@pytest.mark.usefixtures("full_refund_rules")
def test_an_extension_paid_after_a_lost_time_credit_is_given_or_refunded(
    client, booking_data, admin_user, operator, django_capture_on_commit_callbacks
):
    """Fixed (was medium): a lost-time credit while an extension waits for its payment. order_credit_time moves
    the extension's hold after the new end when the lots are free for it; when they are not (here another lab
    booked the lot from end + 5 days), the credit is still given and the hold ends with the new window. When the
    extension's payment then confirms and order_extend refuses it, _settle opens a refund of it (reason
    extension_refused) instead of keeping the money for an operator with nothing owed back."""
    from booking.services import order_reassign_lot

    capture = django_capture_on_commit_callbacks
    order, _token = make_ready_order(client, booking_data, admin_user, capture)
    end = order.ends_at
    failing, target = other_free_lot(order)
    extension = checkout.order_extension_request(order=order, days=3, actor=None)  # lots held to end + 3 days

    # Another lab books the target lot from end + 5 days (after the hold: a legitimate booking).
    other, _other_token = place(
        client,
        booking_data(
            lots="1", contact_email="lab@example.org", start_date=(end + timedelta(days=5)).date().isoformat()
        ),
    )
    invoice_mark_paid(invoice=current_invoice(other), user=admin_user, reason="test: paid by wire")
    other_lot = other.allocations.get(released_at__isnull=True).lot_id
    if other_lot != target.pk:
        order_reassign_lot(order=other, from_lot_id=other_lot, to_lot_id=target.pk, actor=admin_user)

    # The host fails: the operator moves the order to the target lot and credits 72 hours as a longer window.
    client.force_login(operator)
    answer = act(
        client,
        order,
        "move",
        {"from_lot": failing.pk, "to_lot": target.pk, "hours_lost": "72", "credit": "extension"},
        capture,
    )
    assert "move (the customer is e-mailed) done" in answer.content.decode()
    order.refresh_from_db()
    assert order.ends_at == end + timedelta(hours=72)

    with capture(execute=True):
        invoice_mark_paid(invoice=extension, user=admin_user, reason="the extension's transfer confirmed")

    order.refresh_from_db()
    extension.refresh_from_db()
    delivered = order.ends_at == end + timedelta(hours=72) + timedelta(days=3)
    refunded = Refund.objects.filter(invoice=extension).exists()
    assert delivered or refunded, (
        f"extension paid ({extension.status}, needs_operator={extension.needs_operator}), window ends "
        f"{order.ends_at:%Y-%m-%d %H:%M} (credited end {end + timedelta(hours=72):%Y-%m-%d %H:%M}), no refund opened"
    )


@pytest.mark.usefixtures("full_refund_rules")
def test_a_held_extension_keeps_its_days_after_a_lost_time_credit(
    client, booking_data, admin_user, operator, django_capture_on_commit_callbacks
):
    """A lost-time credit moves a held extension's days after the new end when the lots are free for them: the
    extension paid afterwards is given in full (end + hours lost + its days), and nobody can book those days
    meanwhile."""
    capture = django_capture_on_commit_callbacks
    order, _token = make_ready_order(client, booking_data, admin_user, capture)
    end = order.ends_at
    failing, target = other_free_lot(order)
    extension = checkout.order_extension_request(order=order, days=3, actor=None)

    client.force_login(operator)
    act(
        client,
        order,
        "move",
        {"from_lot": failing.pk, "to_lot": target.pk, "hours_lost": "72", "credit": "extension"},
        capture,
    )
    held = order.allocations.filter(released_at__isnull=True).values_list("ends_at", flat=True)
    assert all(until >= end + timedelta(hours=72) + timedelta(days=3) for until in held)

    with capture(execute=True):
        invoice_mark_paid(invoice=extension, user=admin_user, reason="the extension's transfer confirmed")

    order.refresh_from_db()
    assert order.ends_at == end + timedelta(hours=72) + timedelta(days=3)
    assert not Refund.objects.filter(invoice=extension).exists()


# --- 11. one batched payout for two refunds ----------------------------------------------------------------------


@pytest.mark.usefixtures("rules_published")
def test_two_refunds_paid_in_one_batched_transaction_are_both_counted(
    client, chain, booking_data, operator, django_capture_on_commit_callbacks
):
    """HELD (was a medium finding: a batched payout proved only its first refund): refund_credit_tx counts each
    transfer (hash and log index, as the unique constraint) for the refund it pays, not the whole hash for the
    first refund that counted one of its logs. An operator who pays two refunds in one transaction (a Safe
    multisend, Multicall3, Disperse: how payouts are usually batched) proves both: the first, counted by the scan's
    watch, stays counted once, and the second is credited with what that transaction paid to its address."""
    from payments.tasks import scan_chain

    capture = django_capture_on_commit_callbacks
    first_order, first_token, _ = paid_on_chain(client, chain, booking_data)
    second_order, second_token, _ = paid_on_chain(client, chain, booking_data, contact_email="bob@example.org")
    first = cancel(client, first_order, first_token, capture)
    second = cancel(client, second_order, second_token, capture)
    give_address(client, first_order, first_token, first, checksum(chain.accounts()[CUSTOMER_WALLET]))
    give_address(client, second_order, second_token, second, checksum(chain.accounts()[4]))
    first.refresh_from_db()
    second.refresh_from_db()

    # The operator's batch: the first refund in full, half of the second, in one transaction.
    operator_wallet = chain.accounts()[2]
    batcher = chain.deploy("Multicall3", sender=operator_wallet)
    token = checksum(first.asset_contract)
    half = int(second.amount_units) // 2
    chain.mint(first.asset_contract, batcher, int(first.amount_units) + half, sender=operator_wallet)
    calls = [
        (
            token,
            False,
            chain._call_data("DemoStablecoin", "transfer", checksum(first.address), int(first.amount_units)),
        ),
        (token, False, chain._call_data("DemoStablecoin", "transfer", checksum(second.address), half)),
    ]
    tx_hash = chain.call("Multicall3", batcher, "aggregate3", calls, sender=operator_wallet)["transactionHash"]
    with capture(execute=True):
        confirm(chain)
        scan_chain(CHAIN_ID)  # the scan and its refund watch
    client.force_login(operator)
    enter_hash(client, first, tx_hash, capture)
    console = enter_hash(client, second, tx_hash, capture)

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == Refund.Status.PAID
    assert int(second.amount_paid_units) == half, (
        f"the second refund received {half} units in that transaction, counted {second.amount_paid_units}; "
        f"console: {'already counted for another refund' in console}"
    )
