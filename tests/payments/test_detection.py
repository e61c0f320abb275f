"""Payments on a real chain (anvil): detection, confirmations, exceptions, reorgs, RPC failures."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import IntegrityError, transaction
from django.urls import reverse

from booking.models import Order, OrderStatus
from booking.services import orders_expire_stale_holds
from payments import config, scanner, settlement
from payments.chain import ChainClient, ChainUnavailable
from payments.demo import pay_invoice
from payments.models import Invoice, Transfer
from payments.selectors import current_invoice
from tests.builders.orders import place
from tests.builders.payments import after_expiry, order_page

CHAIN_ID = 31337


def scan(**kwargs) -> scanner.ScanResult:
    return scanner.chain_scan(chain_id=CHAIN_ID, **kwargs)


def test_an_exact_stablecoin_payment_is_seen_confirmed_and_pays_the_order(
    client, chain, booking_data, django_capture_on_commit_callbacks
):
    order, token = place(client, booking_data(lots="2"))
    invoice = current_invoice(order)
    assert (invoice.asset_symbol, invoice.amount_due_units) == ("dEURC", Decimal(6300_000000))

    pay_invoice(chain, invoice)
    scan()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.PROCESSING and order.status == OrderStatus.PAYMENT_PROCESSING
    assert "1/3 confirmations" in order_page(client, order, token)

    chain.mine(1)
    scan()
    assert "2/3 confirmations" in order_page(client, order, token)

    chain.mine(1)
    with django_capture_on_commit_callbacks(execute=True):
        result = scan()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert result.settled == [invoice.pk]
    assert invoice.status == Invoice.Status.SETTLED and not (invoice.paid_over or invoice.paid_partial)
    assert order.status == OrderStatus.PAID
    assert [(e.to_status, e.actor_kind) for e in order.events.all()][-2:] == [
        ("payment_processing", "system"),
        ("paid", "system"),
    ]
    assert "Paid: 6300.00 dEURC received and confirmed." in order_page(client, order, token)
    assert any("Payment received" in message.subject for message in mail.outbox)

    # Scanning again credits nothing twice.
    chain.mine(3)
    scan()
    scan()
    assert Transfer.objects.filter(invoice=invoice).count() == 1
    invoice.refresh_from_db()
    assert invoice.amount_confirmed_units == invoice.amount_due_units


def test_the_page_link_is_a_valid_eip681_request_a_wallet_can_pay(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    page = order_page(client, order, token)

    uri = re.search(r'href="(ethereum:[^"]+)"', page).group(1)
    match = re.fullmatch(r"ethereum:(0x[0-9a-fA-F]{40})@(\d+)/transfer\?address=(0x[0-9a-fA-F]{40})&uint256=(\d+)", uri)
    assert match, uri
    token_address, chain_id, to, units = match.groups()
    assert int(chain_id) == CHAIN_ID and "<svg" in page
    assert token_address == "0x5FbDB2315678afecb367f032d93F642f64180aa3"
    assert to in page  # the checksummed address is also shown in plain text

    # As a wallet would: pay what the link says, to whom it says.
    payer = chain.accounts()[2]
    chain.mint(token_address.lower(), payer, int(units), sender=payer)
    chain.send_token(token_address.lower(), to, int(units), sender=payer)
    chain.mine(2)
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_the_native_coin_is_priced_by_the_rate_feed_and_detected_in_the_blocks_transactions(
    client, chain, booking_data
):
    order, token = place(client, booking_data(lots="1"))
    client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
    )
    invoice = current_invoice(order)
    assert invoice.asset_symbol == "ETH" and not invoice.asset_contract
    # 3150 EUR at 2500 EUR/ETH (MockAggregator) = 1.26 ETH
    assert invoice.amount_due_units == Decimal(1_260_000_000_000_000_000)
    assert invoice.rate == Decimal("2500") and invoice.rate_source.startswith("feed 0x9fe4")
    assert f"ethereum:{invoice.deposit_address}".lower() in order_page(client, order, token).lower()

    pay_invoice(chain, invoice)
    scan()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.PROCESSING
    chain.mine(2)
    scan()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and order.status == OrderStatus.PAID


def test_a_token_whose_transfer_returns_nothing_is_detected_too(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:dUSDT"},
    )
    invoice = current_invoice(order)
    # 3150 EUR at the operator's 0.92 EUR per dUSDT, rounded up to the base unit
    assert invoice.amount_due_units == Decimal(3423913044)

    pay_invoice(chain, invoice)
    chain.mine(2)
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_a_partial_payment_keeps_the_order_waiting_and_says_what_is_missing(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)

    pay_invoice(chain, invoice, units=1000_000000)
    chain.mine(2)
    scan()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and invoice.paid_partial
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert "Received 1000.00 dEURC: 2150.00 dEURC are still missing." in order_page(client, order, token)

    invoice.refresh_from_db()
    pay_invoice(chain, invoice)  # the rest
    chain.mine(2)
    scan()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_partial and not invoice.paid_over
    assert order.status == OrderStatus.PAID


def test_an_overpayment_settles_and_is_flagged_for_a_refund(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)

    pay_invoice(chain, invoice, units=int(invoice.amount_due_units) + 50_000000)
    chain.mine(2)
    scan()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.paid_over
    assert "an operator will refund the difference" in order_page(client, order, token)


def test_a_late_payment_settles_and_takes_the_lots_again_when_they_are_still_free(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="2"))
    invoice = current_invoice(order)
    later = invoice.expires_at + timedelta(minutes=1)
    assert orders_expire_stale_holds(now=later) == 1
    scan(now=later)
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.EXPIRED

    after_expiry(chain, invoice)
    pay_invoice(chain, invoice)
    chain.mine(2)
    scan(now=later + timedelta(minutes=5))
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and invoice.paid_late and not invoice.needs_operator
    assert order.status == OrderStatus.PAID
    assert order.allocations.filter(released_at__isnull=True).count() == 2


def test_a_late_payment_for_lots_taken_meanwhile_waits_for_an_operator_with_the_figures(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="6"))
    invoice = current_invoice(order)
    later = invoice.expires_at + timedelta(minutes=1)
    orders_expire_stale_holds(now=later)
    place(client, booking_data(lots="6", contact_email="quick@example.org"))  # someone else takes them

    after_expiry(chain, invoice)
    pay_invoice(chain, invoice)
    chain.mine(2)
    scan(now=later + timedelta(minutes=5))
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.EXPIRED and invoice.paid_late and invoice.needs_operator
    assert invoice.amount_confirmed_units == invoice.amount_due_units and order.status == OrderStatus.EXPIRED
    note = order.events.last()
    assert note.reason == "late payment waits for an operator: its lots were taken after the hold expired"
    assert note.evidence["rate_moved_percent"] == "0.00"


def test_a_payment_mined_before_expiry_is_on_time_even_when_the_scanner_sees_it_later(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)  # in a block before the quote expires
    chain.mine(2)

    scan(now=invoice.expires_at + timedelta(minutes=30))  # the scanner was down meanwhile

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_late
    assert order.status == OrderStatus.PAID


@pytest.mark.parametrize(("new_rate", "settles"), [(2510, True), (2600, False)])
def test_a_late_payment_settles_by_itself_only_while_the_rate_moved_less_than_the_tolerance(
    client, chain, booking_data, new_rate, settles
):
    from payments.demo import DEMO_ETH_EUR

    order, token = place(client, booking_data(lots="1"))
    client.post(
        reverse("customer:order-asset", kwargs={"public_id": order.public_id, "token": token}),
        {"asset": f"{CHAIN_ID}:ETH"},
    )
    invoice = current_invoice(order)
    feed = config.chain(CHAIN_ID).asset("ETH").rate_feed
    chain.set_rate(feed, new_rate * DEMO_ETH_EUR // 2500, sender=chain.accounts()[0])  # 0.4 % or 4 % (tolerance 2 %)
    after_expiry(chain, invoice)
    pay_invoice(chain, invoice)
    chain.mine(3)

    scan(now=invoice.expires_at + timedelta(minutes=5))

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.paid_late
    if settles:
        assert invoice.status == Invoice.Status.SETTLED and not invoice.needs_operator
        assert order.status == OrderStatus.PAID
    else:
        assert invoice.status == Invoice.Status.EXPIRED and invoice.needs_operator
        assert order.status != OrderStatus.PAID
        note = order.events.last()
        assert note.reason.startswith("late payment waits for an operator: the rate moved 4.00%")
        assert (note.evidence["quoted_rate"], note.evidence["current_rate"]) == ("2500.0000000000", "2600.00000000")


def test_a_wrong_token_is_recorded_and_shown_to_admins_but_does_not_pay(client, chain, booking_data, admin_user):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    usdt = config.chain(CHAIN_ID).asset("dUSDT").contract
    payer = chain.accounts()[3]
    chain.mint(usdt, payer, int(invoice.amount_due_units), sender=payer, contract="NoReturnToken")
    chain.send_token(
        usdt, invoice.deposit_address, int(invoice.amount_due_units), sender=payer, contract="NoReturnToken"
    )
    chain.mine(2)
    scan()

    wrong = Transfer.objects.get()
    assert wrong.wrong_asset and wrong.invoice == invoice and wrong.token_contract == usdt
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and invoice.amount_confirmed_units == 0
    client.force_login(admin_user)
    queue = client.get(reverse("admin:payments_transfer_changelist") + "?matching=unmatched")
    assert wrong.tx_hash in queue.content.decode()


def test_a_transfer_is_credited_once_and_never_to_two_invoices(client, chain, booking_data):
    first, _ = place(client, booking_data(lots="1"))
    second, _ = place(client, booking_data(lots="1", contact_email="b@example.org"))
    invoice = current_invoice(first)
    pay_invoice(chain, invoice)
    chain.mine(2)
    scan()
    credited = Transfer.objects.get()

    with pytest.raises(IntegrityError), transaction.atomic():
        Transfer.objects.create(
            chain_id=CHAIN_ID,
            tx_hash=credited.tx_hash,
            log_index=credited.log_index,
            block_number=1,
            block_hash="0x0",
            to_address=current_invoice(second).deposit_address,
            amount_units=1,
            invoice=current_invoice(second),
        )


def test_a_reorganisation_that_removes_the_transfer_sends_the_invoice_back(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    before = chain.snapshot()
    pay_invoice(chain, invoice)
    scan()
    order.refresh_from_db()
    assert order.status == OrderStatus.PAYMENT_PROCESSING

    chain.revert(before)  # the block with the transfer is gone ...
    chain.mine(4)  # ... and the chain moves on without it
    scan()

    transfer = Transfer.objects.get()
    invoice.refresh_from_db()
    order.refresh_from_db()
    assert transfer.status == Transfer.Status.REMOVED
    assert invoice.status == Invoice.Status.NEW and invoice.amount_confirmed_units == 0
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert order.events.last().reason == "transfer no longer on chain (reorganisation)"
    chain.snapshot()  # the fixture reverts to its own snapshot afterwards


def test_a_dead_first_rpc_url_fails_over_to_the_second(client, chain, booking_data, anvil, settings, tmp_path):
    from tests.payments.conftest import chains_toml, free_port

    path = tmp_path / "failover.toml"
    path.write_text(chains_toml(f"http://127.0.0.1:{free_port()}", anvil.url))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _token = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    client_ = ChainClient(config.chain(CHAIN_ID))
    scan(client=client_)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert len(client_.errors) == 1 and "ConnectionError" in client_.errors[0]  # the dead URL, once


def test_when_no_rpc_url_answers_nothing_changes_and_the_page_says_the_check_is_delayed(
    client, chain, booking_data, settings, tmp_path
):
    from tests.payments.conftest import chains_toml, free_port

    order, token = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)
    path = tmp_path / "dead.toml"
    path.write_text(chains_toml(f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"))
    settings.PAYMENTS_CHAINS_FILE = str(path)

    with pytest.raises(ChainUnavailable):
        scan()

    invoice = current_invoice(order)
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.NEW and order.status == OrderStatus.AWAITING_PAYMENT
    assert "Check delayed: the network is not answering" in order_page(client, order, token)


def _ready_order(client, booking_data, admin_user) -> Order:
    """An order paid (marked by an admin), approved and provisioned: one that can be extended."""
    from booking.services import order_transition

    order, _token = place(client, booking_data(lots="1"))
    settlement.invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    return order


def test_a_paid_extension_moves_the_window_end_and_its_lots(client, chain, booking_data, admin_user):
    from payments.checkout import order_extension_request

    order = _ready_order(client, booking_data, admin_user)
    end = order.ends_at

    extension = order_extension_request(order=order, days=7, actor=admin_user)
    pay_invoice(chain, extension)
    chain.mine(2)
    scan()

    extension.refresh_from_db()
    order.refresh_from_db()
    assert extension.status == Invoice.Status.SETTLED
    assert order.ends_at == end + timedelta(days=7) and order.status == OrderStatus.READY
    assert order.events.last().reason == "window extended by 7 days"


def test_a_failure_in_what_a_settlement_triggers_never_undoes_it_nor_the_scan(
    client, chain, booking_data, monkeypatch, django_capture_on_commit_callbacks
):
    """Regression: auto-approval (and so provisioning) ran inside the scan's transaction: an exception there
    rolled back the settlement and the chain's cursor."""
    from payments.models import ChainCursor
    from provisioning import services as provisioning
    from provisioning.models import OperatorSettings

    OperatorSettings.objects.update_or_create(pk=1, defaults={"auto_approve": True})

    def broken_approval(**kwargs):
        raise RuntimeError("provisioning exploded")

    monkeypatch.setattr(provisioning, "order_approve", broken_approval)
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    chain.mine(3)
    with django_capture_on_commit_callbacks(execute=True):
        result = scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert result.settled == [invoice.pk] and invoice.status == Invoice.Status.SETTLED
    assert order.status == OrderStatus.PAID  # paid, waiting for an operator: the approval failed, not the payment
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block == result.confirmed


def test_a_transfer_seen_but_not_final_is_read_again_until_it_is(client, chain, booking_data, proxies, use_chains_file):
    """Regression: a transfer first read from a node that gave another block hash stayed "seen" forever: the
    cursor moved past its block and nothing read it again."""
    from payments.models import ChainCursor

    stale = proxies(stale_log_hashes=1)
    use_chains_file(stale.url)
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    chain.mine(3)  # final by the first scan, if its hash matched

    first = scan()
    transfer = Transfer.objects.get()
    assert transfer.status == Transfer.Status.SEEN and first.confirmed >= transfer.block_number
    assert ChainCursor.objects.get(chain_id=CHAIN_ID).confirmed_block < transfer.block_number

    scan()

    transfer.refresh_from_db()
    order.refresh_from_db()
    assert transfer.status == Transfer.Status.CONFIRMED and order.status == OrderStatus.PAID


def test_a_payment_still_unconfirmed_when_monitoring_ends_is_invalid_and_flagged(client, chain, booking_data):
    order, _token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    scan()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.PROCESSING

    scan(now=invoice.monitor_until + timedelta(minutes=1))  # no block since: still one confirmation

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.status == Invoice.Status.INVALID and invoice.needs_operator
    assert order.status == OrderStatus.AWAITING_PAYMENT
    assert order.events.filter(reason="payment not confirmed in time").exists()
    assert orders_expire_stale_holds(now=invoice.monitor_until + timedelta(minutes=2)) == 1


def test_an_extension_paid_ten_days_after_the_booking_has_its_own_quote_clock(client, chain, booking_data, admin_user):
    """Regression: extension invoices were created already expired (their expiry was the booking's hold)."""
    from payments.checkout import order_extension_request

    order = _ready_order(client, booking_data, admin_user)
    end = order.ends_at
    ten_days_later = order.created_at + timedelta(days=10)

    extension = order_extension_request(order=order, days=3, actor=None, now=ten_days_later)
    assert extension.expires_at > ten_days_later and extension.monitor_until > extension.expires_at
    pay_invoice(chain, extension)
    chain.mine(2)
    scan(now=ten_days_later + timedelta(minutes=10))

    extension.refresh_from_db()
    order.refresh_from_db()
    assert extension.status == Invoice.Status.SETTLED and not extension.paid_late and not extension.needs_operator
    assert order.ends_at == end + timedelta(days=3)


def test_a_payment_after_settlement_is_recorded_and_flagged_for_a_refund_never_as_a_reorg(client, chain, booking_data):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice)
    chain.mine(2)
    scan()
    invoice.refresh_from_db()
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_over

    pay_invoice(chain, invoice, units=25_000000)  # the customer pays again, days later
    scan()
    chain.mine(2)
    scan()

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert Transfer.objects.filter(invoice=invoice, status=Transfer.Status.CONFIRMED).count() == 2
    assert invoice.status == Invoice.Status.SETTLED and invoice.paid_over
    assert invoice.amount_confirmed_units == invoice.amount_due_units + 25_000000
    assert order.status == OrderStatus.PAID
    reasons = list(order.events.values_list("reason", flat=True))
    assert "payment after settlement: refund owed" in reasons
    assert not any("reorganisation" in reason for reason in reasons)
    assert "an operator will refund the difference" in order_page(client, order, token)


def test_while_a_payment_is_being_confirmed_the_page_shows_what_is_received_and_what_is_still_due(
    client, chain, booking_data
):
    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    pay_invoice(chain, invoice, units=1000_000000)
    scan()

    page = order_page(client, order, token)
    assert "Being confirmed: 1000.00 dEURC. Still to send: 2150.00 dEURC." in page
    assert "Send exactly" not in page and "uint256=2150000000" in page

    invoice.refresh_from_db()
    pay_invoice(chain, invoice, units=2150_000000)  # the rest, before the first part is final
    scan()

    page = order_page(client, order, token)
    assert "Still to send: 0.00 dEURC." in page
    assert "Send exactly" not in page and "I&#x27;ve paid" not in page and "I've paid" not in page


def test_a_hold_does_not_run_out_during_an_rpc_outage_and_moves_by_its_length(
    client, chain, booking_data, use_chains_file
):
    from tests.payments.conftest import free_port

    order, token = place(client, booking_data(lots="1"))
    invoice = current_invoice(order)
    quoted_until = invoice.expires_at
    healthy = chain.chain.rpc_urls[0]
    use_chains_file(f"http://127.0.0.1:{free_port()}", name="down")
    outage_start = quoted_until - timedelta(minutes=10)

    for minutes in range(0, 40, 5):  # beat's scans fail for 35 minutes, across the quote's expiry
        with pytest.raises(ChainUnavailable):
            scan(now=outage_start + timedelta(minutes=minutes))
        assert orders_expire_stale_holds(now=outage_start + timedelta(minutes=minutes + 1)) == 0
    assert "Check delayed" in order_page(client, order, token)

    use_chains_file(healthy, name="up")
    back = outage_start + timedelta(minutes=40)
    pay_invoice(chain, invoice)
    chain.mine(2)
    scan(now=back)

    invoice.refresh_from_db()
    order.refresh_from_db()
    assert invoice.expires_at == quoted_until + timedelta(minutes=40)
    assert invoice.status == Invoice.Status.SETTLED and not invoice.paid_late
    assert order.status == OrderStatus.PAID
    assert "hold moved by the payment network's outage" in order.events.values_list("reason", flat=True)
