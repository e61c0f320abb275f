"""Attacks of the money red team on issue 23 (an unreliable provider behind a load balancer, a pruned node, a
lagging logs backend, a lying head), kept as regressions: each failed before its fix."""

from booking.models import OrderStatus
from payments import scanner
from payments.models import ChainCursor, Invoice
from tests.builders.payments import pay_in_eth


def _hint_setup(client, booking_data):
    from payments.selectors import current_invoice
    from tests.builders.orders import place

    order, token = place(client, booking_data(lots="1"))
    return order, token, current_invoice(order)


def test_a_pasted_hash_is_not_made_final_by_one_far_ahead_head(client, chain, booking_data, proxies, use_chains_file):
    from payments import invoices
    from payments.demo import pay_invoice

    proxy = proxies()
    orig_one = proxy._one

    def one(call, lag=0):
        answer = orig_one(call, lag)
        if call.get("method") == "eth_blockNumber" and proxy.ahead:
            answer = {**answer, "result": hex(int(answer["result"], 16) + proxy.ahead)}
        return answer

    proxy._one, proxy._plain, proxy.ahead = one, (lambda calls: False), 0
    use_chains_file(proxy.url)
    order, _token, invoice = _hint_setup(client, booking_data)
    scanner.chain_scan(chain_id=31337)
    snap = chain.snapshot()
    tx = pay_invoice(chain, invoice)
    proxy.ahead = 50  # one bad answer for the head, as a load balancer's odd backend
    invoices.invoice_customer_paid(invoice=invoice, tx_hint=tx)
    proxy.ahead = 0
    chain.revert(snap)
    chain.mine(6)
    for _ in range(2):
        scanner.chain_scan(chain_id=31337)
    Invoice.objects.get(pk=invoice.pk)
    order.refresh_from_db()
    assert order.status != OrderStatus.PAID


def test_a_logs_backend_one_block_behind_still_lets_confirmed_payments_through(
    client, chain, booking_data, proxies, use_chains_file
):
    from payments.demo import pay_invoice

    balanced = proxies(logs_lag=1, logs_lag_error=None)
    use_chains_file(balanced.url)
    order, _token, invoice = _hint_setup(client, booking_data)
    scanner.chain_scan(chain_id=31337)
    pay_invoice(chain, invoice)
    for _ in range(5):
        chain.mine(2)
        scanner.chain_scan(chain_id=31337)
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_a_token_payment_missed_before_expiry_is_found_after_i_ve_paid(
    client, chain, booking_data, proxies, use_chains_file
):
    from datetime import timedelta

    from payments import invoices
    from payments.demo import pay_invoice

    balanced = proxies(logs_lag=1, logs_lag_error=None)
    use_chains_file(balanced.url)
    order, _token, invoice = _hint_setup(client, booking_data)
    scanner.chain_scan(chain_id=31337)
    pay_invoice(chain, invoice)  # paid in time
    chain.mine(4)
    after = invoice.expires_at + timedelta(seconds=30)
    scanner.chain_scan(chain_id=31337, now=after)
    inv = Invoice.objects.get(pk=invoice.pk)
    invoices.invoice_customer_paid(invoice=inv, now=after + timedelta(seconds=5))
    scanner.chain_scan(chain_id=31337, now=after + timedelta(seconds=10))
    inv = Invoice.objects.get(pk=invoice.pk)
    order.refresh_from_db()
    assert inv.status == Invoice.Status.SETTLED


def test_a_contract_payment_is_credited_on_a_node_that_prunes_old_state(
    client, chain, booking_data, proxies, use_chains_file
):
    proxy = proxies()
    orig_one = proxy._one

    def one(call, lag=0):
        old_state = call.get("method") in ("eth_getBalance", "eth_getTransactionCount") and call["params"][
            1
        ].startswith("0x")
        if (
            old_state and int(call["params"][1], 16) < proxy._head() - 16
        ):  # a full (non-archive) node keeps recent states only
            return {
                "jsonrpc": "2.0",
                "id": call.get("id"),
                "error": {
                    "code": -32000,
                    "message": "missing trie node 0xabc (path ) state 0xdef is not available",
                },
            }
        return orig_one(call, lag)

    proxy._one, proxy._plain = one, (lambda calls: False)
    use_chains_file(proxy.url)
    chain.mine(40)
    order, invoice = pay_in_eth(client, booking_data)
    scanner.chain_scan(chain_id=31337)
    payer = chain.accounts()[2]
    forwarder = chain.deploy("PaymentForwarder", sender=payer)
    chain.call(
        "PaymentForwarder",
        forwarder,
        "forward",
        invoice.deposit_address,
        sender=payer,
        value=int(invoice.amount_due_units),
    )
    chain.mine(3)
    for _ in range(3):
        scanner.chain_scan(chain_id=31337)
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID


def test_a_balance_read_the_node_cannot_serve_never_fails_the_scan(
    client, chain, booking_data, proxies, use_chains_file
):
    from payments.chain import ChainUnavailable

    proxy = proxies(logs_lag=1, logs_lag_error=None)
    orig_one = proxy._one

    def one(call, lag=0):
        old_state = call.get("method") in ("eth_getBalance", "eth_getTransactionCount") and call["params"][
            1
        ].startswith("0x")
        if old_state and int(call["params"][1], 16) < proxy._head() - 16:
            return {
                "jsonrpc": "2.0",
                "id": call.get("id"),
                "error": {"code": -32000, "message": "missing trie node"},
            }
        return orig_one(call, lag)

    proxy._one = one
    use_chains_file(proxy.url)
    _order, _invoice = pay_in_eth(client, booking_data)
    scanner.chain_scan(chain_id=31337)
    out = []
    for _ in range(4):
        chain.mine(10)
        try:
            r = scanner.chain_scan(chain_id=31337)
            out.append(("ok", r.confirmed, ChainCursor.objects.get(chain_id=31337).confirmed_block))
        except ChainUnavailable as exc:
            out.append(("unavailable", str(exc)[:80]))
    assert all(o[0] == "ok" for o in out)


def test_two_missed_direct_payments_then_a_pasted_hash_are_counted_once(client, chain, booking_data):
    from payments import invoices
    from tests.builders.payments import cursor_past_the_head

    _order, invoice = pay_in_eth(client, booking_data)
    half = int(invoice.amount_due_units) // 2
    payer = chain.accounts()[2]
    first = chain.send_native(invoice.deposit_address, half, sender=payer)["transactionHash"]
    chain.mine(2)
    chain.send_native(invoice.deposit_address, int(invoice.amount_due_units) - half, sender=payer)
    chain.mine(3)
    cursor_past_the_head(chain)
    scanner.chain_scan(chain_id=31337)
    invoices.invoice_customer_paid(invoice=invoice, tx_hint=first)
    inv = Invoice.objects.get(pk=invoice.pk)
    assert inv.amount_confirmed_units == inv.amount_due_units and not inv.paid_over


def test_a_load_balancer_splitting_a_batch_still_lets_the_balance_net_find_a_token_payment(
    client, chain, booking_data, proxies, use_chains_file
):
    """Finding 1: the range's last header asked in the same batch as its logs proves nothing when the balancer sends
    the header to an up-to-date backend and the logs to one that lags by more than the confirmations and clamps the
    range to its head. The cursor passes the payment's block as read. Without any "I've paid", the periodic sweep of
    open token invoices reads the deposit address's balance at an explicit block (a backend without that block
    answers an error, never an older balance), finds the rise and the transfer, and settles the order, dated by the
    transfer's own block: on time."""
    from datetime import timedelta

    from django.utils import timezone

    from payments import balances
    from payments.demo import pay_invoice

    balancer = proxies(logs_lag=6, logs_lag_error=None, split_batches=True)
    use_chains_file(balancer.url)
    order, _token, invoice = _hint_setup(client, booking_data)
    now = timezone.now()
    scanner.chain_scan(chain_id=31337, now=now)
    pay_invoice(chain, invoice)
    for step in range(1, 5):
        chain.mine(2)
        scanner.chain_scan(chain_id=31337, now=now + timedelta(seconds=10 * step))
    order.refresh_from_db()
    assert order.status != OrderStatus.PAID, "the split batch should have defeated the end-header proof"
    assert balancer.refused["clamped"] > 0
    chain.mine(8)  # the lagging backend now holds the payment's block
    balancer.reset_counts()
    later = now + balances.TOKEN_SWEEP_AFTER + timedelta(seconds=60)
    scanner.chain_scan(chain_id=31337, now=later)
    order.refresh_from_db()
    inv = Invoice.objects.get(pk=invoice.pk)
    assert inv.status == Invoice.Status.SETTLED
    assert order.status == OrderStatus.PAID
    assert inv.customer_paid_at is None  # nobody said "I've paid"
    assert sum(balancer.calls.values()) < 50


def test_a_balance_a_backend_cannot_serve_yet_is_read_again_next_cycle(
    client, chain, booking_data, proxies, use_chains_file
):
    """A backend behind the confirmed block answers "header not found" to a balance read at that block: that is no
    balance (not a token that answers nothing), so the invoice is not marked checked and is read again next cycle."""
    import pytest
    from django.utils import timezone

    from payments import balances, config
    from payments.chain import ChainClient, ChainUnavailable

    lagging = proxies(lag=20)
    use_chains_file(lagging.url)
    _order, _token, invoice = _hint_setup(client, booking_data)
    Invoice.objects.filter(pk=invoice.pk).update(created_at=timezone.now() - balances.TOKEN_SWEEP_AFTER)
    chain.mine(30)
    head = lagging._head()
    with pytest.raises(ChainUnavailable):
        balances.token_balance_checks(
            chain=config.chain(31337),
            client=ChainClient(config.chain(31337), backoff=0.01),
            confirmed=head - 3,
            now=timezone.now(),
        )
    assert Invoice.objects.get(pk=invoice.pk).native_checked_at is None
