"""One order's money life: the machine tests/payments/test_money_sequences.py plays (OrderMoneyLife), and the same
with the operator in it (RedMoneyLife, issue 32's red team): its steps grown with the operator's two actions on a
flagged payment, a payment to any closed invoice at any time, the sweep run days later, the window ended early; and
its invariant checks the documents too (credit notes, revenue) and the stricter rule (bought + refunds <= received).
The `machine` fixture (tests/payments/conftest.py) gives one, for sequences played by hand."""

import contextlib
from datetime import date, timedelta
from decimal import ROUND_FLOOR, Decimal

from django.core.cache import cache
from django.db import transaction
from django.test import TestCase
from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from booking import services as booking_services
from booking.cancellation import refund_quote
from booking.models import ORDER_TRANSITIONS, PAID_CANCELLABLE_STATUSES, Order, OrderEvent, OrderStatus
from booking.rules import BookingError
from inventory.models import MaintenanceWindow
from payments import checkout, fiscal, invoices, ledger, refund_proofs, refunds, selectors, settlement, unapplied
from payments.chain import checksum
from payments.chain_answers import TransferLog
from payments.errors import PaymentError
from payments.models import FiscalInvoice, Invoice, Refund
from payments.refunds import units_for_fiat
from tests.builders.orders import place

CUSTOMER_ADDRESS = checksum("0x" + "5a" * 20)


WINDOW_RUNS = frozenset({OrderStatus.READY, OrderStatus.ACTIVE})


CUSTOMER_CANCELLABLE = PAID_CANCELLABLE_STATUSES | {OrderStatus.AWAITING_PAYMENT}


def capture(execute: bool = True):
    """The step's commit, as the test sees it: what it sends on commit (the order's event, e-mails) runs now."""
    return TestCase.captureOnCommitCallbacks(execute=execute)


class OrderMoneyLife(RuleBasedStateMachine):
    # Set by the test function from its fixtures.
    fixtures: dict = {}

    def __init__(self):
        super().__init__()
        self._savepoint = transaction.atomic()
        self._savepoint.__enter__()
        self.now = timezone.now()
        self.order: Order | None = None
        self.maintenance_planned = False
        self.time_credited = timedelta(0)
        self.tx_counter = 0
        cache.clear()  # the booking form's rate limit counts every order placed from the test's address
        # What the preconditions read, taken after every step (`every_coin_is_accounted_for`).
        self.status = ""
        self.can_switch_asset = self.extension_waits = self.refund_open = self.flagged = False

    def snapshot(self) -> None:
        order = self.fresh()
        self.status = order.status
        current = self.open_invoice(Invoice.Purpose.ORDER)
        self.can_switch_asset = (
            order.status == OrderStatus.AWAITING_PAYMENT
            and current is not None
            and current.status == Invoice.Status.NEW
            and not current.amount_confirmed_units
        )
        self.extension_waits = bool(order.extension_held_until and order.extension_held_until > self.now)
        refunds_of_order = Refund.objects.filter(order=order)
        self.refund_open = refunds_of_order.exclude(status=Refund.Status.PAID).exists()
        self.flagged = Invoice.objects.filter(order=order, needs_operator=True).exists()

    def teardown(self):
        transaction.set_rollback(True)
        self._savepoint.__exit__(None, None, None)

    # --- helpers ------------------------------------------------------------------------------------------------

    def fresh(self) -> Order:
        self.order.refresh_from_db()
        return self.order

    def open_invoice(self, purpose: str) -> Invoice | None:
        return (
            Invoice.objects.filter(order=self.order, purpose=purpose)
            .exclude(status=Invoice.Status.INVALID)
            .order_by("-created_at", "-pk")
            .first()
        )

    def credit(self, invoice: Invoice, units: int, *, late: bool = False) -> None:
        """`units` more confirmed on chain to the invoice, read by the scanner (late: after its quote expired)."""
        invoice.refresh_from_db()
        now = max(self.now, invoice.expires_at + timedelta(minutes=1)) if late else self.now
        with capture():
            settlement.invoice_apply_chain_state(
                invoice=invoice, confirmed=int(invoice.amount_confirmed_units) + units, pending=0, head=0, now=now
            )

    def react(self, to_status: str) -> None:
        """The order's event, as payments' receivers take it after the commit (provisioning's teardown of a
        window never provisioned is not the subject)."""
        settlement.on_order_status_changed(order_id=self.order.pk, to_status=to_status)
        fiscal.on_order_status_changed(order_id=self.order.pk, to_status=to_status)

    def window_price_model(self) -> Decimal:
        """What bought the window, by the test's own account: the booking's price (the order was paid to be where
        it is), and 1,450.00 for each 3 days the window grew (the catalog's 3-day price of one B200 lot)."""
        order = self.fresh()
        extended_days = (order.ends_at - order.starts_at - self.time_credited).days - order.days
        return order.total_price + Decimal("1450.00") * (extended_days // 3)

    # --- the order ---------------------------------------------------------------------------------------------

    @initialize(start=st.sampled_from(["unpaid", "paid", "ready"]))
    def place_order(self, start):
        """An order placed; for a third of the examples paid in full, for another third handed over too (through
        the same steps as below): the sequences that matter most start from a window bought."""
        with capture(execute=False):
            self.order, self.token = place(self.fixtures["client"], self.fixtures["booking_data"](lots="1"))
        if start != "unpaid":
            invoice = self.open_invoice(Invoice.Purpose.ORDER)
            self.credit(invoice, int(invoice.amount_due_units))
        if start == "ready":
            self.approve_and_hand_over()

    # --- payments ----------------------------------------------------------------------------------------------

    @rule(
        purpose=st.sampled_from([Invoice.Purpose.ORDER, Invoice.Purpose.EXTENSION]),
        share=st.sampled_from(["full", "rest", "part", "over"]),
        late=st.booleans(),
    )
    def pay(self, purpose, share, late):
        invoice = self.open_invoice(purpose) or self.open_invoice(Invoice.Purpose.ORDER)
        due, confirmed = int(invoice.amount_due_units), int(invoice.amount_confirmed_units)
        units = {
            "full": due,
            "rest": max(due - confirmed, 1),
            "part": units_for_fiat(invoice=invoice, fiat_amount=Decimal("1000.00")),
            "over": due + units_for_fiat(invoice=invoice, fiat_amount=Decimal("10.00")),
        }[share]
        self.credit(invoice, units, late=late)

    @precondition(lambda self: self.can_switch_asset)
    @rule(share=st.sampled_from(["full", "part"]))
    def pay_the_replaced_quote(self, share):
        """The researcher switches asset, then pays the replaced quote's address anyway."""
        order = self.fresh()
        current = self.open_invoice(Invoice.Purpose.ORDER)
        if order.status != OrderStatus.AWAITING_PAYMENT or current is None or current.status != Invoice.Status.NEW:
            return
        if current.amount_confirmed_units or current.amount_pending_units:
            return
        asset = "31337:dUSDT" if current.asset_symbol != "dUSDT" else "31337:dEURC"
        try:
            with capture(execute=False):
                invoices.invoice_change_asset(order=order, asset_key=asset, now=self.now)
        except PaymentError:
            return  # switched too often within the hour: the page says so
        current.refresh_from_db()
        units = int(current.amount_due_units) if share == "full" else int(current.amount_due_units) // 3
        self.credit(current, units)

    @precondition(lambda self: self.status == OrderStatus.AWAITING_PAYMENT or self.extension_waits)
    @rule()
    def hold_runs_out(self):
        """The clock passes the hold: booking's sweep expires an unpaid order and gives back an extension's days."""
        order = self.fresh()
        later = max(filter(None, [order.hold_expires_at, order.extension_held_until, self.now])) + timedelta(minutes=1)
        self.now = later
        with capture(execute=False):
            booking_services.orders_expire_stale_holds(now=self.now)
            booking_services.extension_holds_release(now=self.now)

    # --- the operator and the window ---------------------------------------------------------------------------

    @precondition(lambda self: self.status == OrderStatus.PAID)
    @rule()
    def approve_and_hand_over(self):
        order = self.fresh()
        with capture(execute=False):  # the provisioning itself is not the subject
            for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
                booking_services.order_transition(
                    order=order, to_status=status, reason="test", actor_kind=OrderEvent.Actor.OPERATOR
                )

    @precondition(lambda self: self.status == OrderStatus.PAID)
    @rule()
    def reject(self):
        order = self.fresh()
        if order.status != OrderStatus.PAID:
            return
        with capture(execute=False):
            booking_services.order_transition(
                order=order,
                to_status=OrderStatus.REJECTED,
                reason="not our workload",
                actor_kind=OrderEvent.Actor.OPERATOR,
            )
        self.react(OrderStatus.REJECTED)

    @precondition(lambda self: self.status in WINDOW_RUNS and not self.extension_waits)
    @rule(outcome=st.sampled_from(["paid", "refused", "paid_after_its_hold", "waits"]))
    def extend(self, outcome):
        """The researcher extends by 3 days; its payment confirms at once, or after a maintenance window was planned
        on the host (refused: the lots are no longer free for it), or after its hold ran out, or later (`pay`)."""
        order = self.fresh()
        try:
            with capture(execute=False):
                extension = checkout.order_extension_request(order=order, days=3, actor=None, now=self.now)
        except BookingError:
            return  # maintenance planned, or the lots booked after the window: the page says so
        if outcome == "refused":
            self.plan_maintenance_after_the_window()
        if outcome == "paid_after_its_hold":
            self.now = order.extension_held_until or self.now
            self.now += timedelta(days=1)
            with capture(execute=False):
                booking_services.extension_holds_release(now=self.now)
        if outcome != "waits":
            self.credit(extension, int(extension.amount_due_units), late=outcome == "paid_after_its_hold")

    def plan_maintenance_after_the_window(self):
        order = self.fresh()
        allocation = order.allocations.filter(released_at__isnull=True).select_related("lot").first()
        if self.maintenance_planned or allocation is None:
            return
        MaintenanceWindow.objects.create(
            host_id=allocation.lot.host_id,
            starts_at=order.ends_at + timedelta(days=1),
            ends_at=order.ends_at + timedelta(days=2),
            reason="fans",
        )
        self.maintenance_planned = True

    @precondition(lambda self: self.status in WINDOW_RUNS)
    @rule(credit=st.sampled_from(["money", "time"]), hours=st.sampled_from([1, 24, 72, 168]))
    def provider_fault(self, credit, hours):
        """A card fails: the operator moves the order and credits the hours lost as a pro-rata refund (checked
        against the test's own model of what bought the window) or as a longer window."""
        order = self.fresh()
        if credit == "time":
            try:
                with capture(execute=False):
                    booking_services.order_credit_time(
                        order=order, lost=timedelta(hours=hours), actor=self.fixtures["admin"]
                    )
            except BookingError:
                return  # the lots are taken after the window: the operator refunds instead
            self.time_credited += timedelta(hours=hours)
            return
        expected_share = (
            self.window_price_model()
            * Decimal(hours * 3600)
            / Decimal((order.ends_at - order.starts_at).total_seconds())
        ).quantize(Decimal("0.01"), rounding=ROUND_FLOOR)
        try:
            with capture(), transaction.atomic():
                refund = refunds.refund_for_lost_time(order=order, lost=timedelta(hours=hours), lots=1)
        except PaymentError:
            return  # one fault refund per order; a second is credited as time
        booking_invoice = refund.invoice
        left = booking_invoice.fiat_amount
        assert refund.fiat_amount == min(expected_share, left), (
            f"{hours} h lost of a window bought for {self.window_price_model()}: refunded {refund.fiat_amount}, "
            f"expected {min(expected_share, left)}"
        )

    # --- cancellations -----------------------------------------------------------------------------------------

    @precondition(lambda self: self.status and OrderStatus.CANCELLED in ORDER_TRANSITIONS[self.status])
    @rule(by=st.sampled_from(["customer", "operator"]))
    def cancel(self, by):
        """The customer cancels (unpaid, or paid for the refund its terms give, the amount shown on the button); an
        operator cancels whatever the customer no longer can."""
        order = self.fresh()
        shown = None
        if by == "customer" and order.status in CUSTOMER_CANCELLABLE:
            if order.can_be_cancelled_with_refund:
                shown = refund_quote(order=order, now=timezone.now()).amount
            with capture(execute=False):
                booking_services.order_cancel_by_customer(order=order, refund_shown=shown)
        else:
            with capture(execute=False):
                booking_services.order_cancel_by_operator(order=order, actor=self.fixtures["admin"], reason="test")
        self.react(OrderStatus.CANCELLED)
        if shown is not None:  # what the cancel button showed is what its refunds give back
            given = Refund.objects.filter(order=order, reason=Refund.Reason.CANCELLATION)
            assert sum((refund.fiat_amount for refund in given), Decimal(0)) == shown

    @rule()
    def the_reaction_runs_again(self):
        """A reaction delivered twice, and beat's sweep: neither opens anything more."""
        before = Refund.objects.filter(order=self.order).count()
        order = self.fresh()
        if order.status in refunds.REFUND_REASON_BY_STATUS:
            with capture():
                refunds.refunds_open_for_order(order_id=order.pk)
        with capture():
            refunds.ledger_sweep(now=self.now)
        if order.status in refunds.REFUND_REASON_BY_STATUS:
            assert Refund.objects.filter(order=self.order).count() == before

    @precondition(lambda self: self.flagged)
    @rule(action=st.sampled_from(["refund", "apply"]), twice=st.booleans())
    def operator_resolves_a_flagged_payment(self, action, twice):
        """The console's two actions on a payment waiting for an operator (pressed twice: a double click, a second
        operator): a refund of what it holds, or the payment applied to the order while its lots are free. A
        refusal says why and changes nothing."""
        invoice = Invoice.objects.filter(order=self.order, needs_operator=True).order_by("pk").first()
        if invoice is None:
            return
        act = unapplied.invoice_refund_unapplied if action == "refund" else unapplied.invoice_apply_to_order
        for _press in range(2 if twice else 1):
            before = ledger.order_money(self.fresh(), now=self.now)
            try:
                with capture(), transaction.atomic():
                    act(invoice=Invoice.objects.get(pk=invoice.pk), actor=self.fixtures["admin"], now=self.now)
            except PaymentError as refusal:
                assert str(refusal)  # the console shows it
                after = ledger.order_money(self.fresh(), now=self.now)
                assert (after.received, after.refunds) == (before.received, before.refunds)

    # --- refunds paid ------------------------------------------------------------------------------------------

    @precondition(lambda self: self.refund_open)
    @rule(whole=st.booleans())
    def operator_pays_a_refund(self, whole):
        refund = Refund.objects.filter(order=self.order).exclude(status=Refund.Status.PAID).order_by("pk").first()
        if refund is None:
            return
        with capture():
            refunds.refund_set_address(refund=refund, address=CUSTOMER_ADDRESS, now=self.now)
        refund.refresh_from_db()
        left = refund.amount_left_units
        amount = left if whole or left < 2 else left // 2
        self.tx_counter += 1
        credit = TransferLog(
            tx_hash="0x" + f"{self.order.pk:08x}{self.tx_counter:056x}",
            log_index=0,
            block_number=100 + self.tx_counter,
            block_hash="0x" + "b" * 64,
            token=refund.asset_contract,
            sender="0x" + "0" * 39 + "1",
            recipient=refund.address,
            amount=amount,
        )
        with capture(), transaction.atomic():
            refund_proofs._record_credits(
                refund=refund, credits=[credit], final=True, user=self.fixtures["admin"], now=self.now
            )

    # --- the rule, after every step ----------------------------------------------------------------------------

    @invariant()
    def every_coin_is_accounted_for(self):
        if self.order is None:
            return
        money = ledger.order_money(self.fresh(), now=self.now)
        assert money.breaches() == [], money.breaches()
        for invoice in money.invoices:
            assert invoice.refunds <= invoice.received
        assert money.refunds <= money.received
        self.snapshot()


class RedMoneyLife(OrderMoneyLife):
    def _react_if_moved(self, before: str) -> None:
        after = self.fresh().status
        if after != before:
            self.react(after)

    @rule(
        actions=st.sampled_from(
            [
                ("apply",),
                ("refund",),
                ("apply", "apply"),
                ("refund", "refund"),
                ("apply", "refund"),
                ("refund", "apply"),
            ]
        )
    )
    def operator_acts_on_a_flagged_payment(self, actions):
        """The console's buttons on the oldest flagged payment of the order, one press or two."""
        invoice = Invoice.objects.filter(order=self.order, needs_operator=True).order_by("pk").first()
        if invoice is None:
            return
        for action in actions:
            before = self.fresh().status
            service = unapplied.invoice_apply_to_order if action == "apply" else unapplied.invoice_refund_unapplied
            try:
                with capture(execute=False):
                    service(invoice=Invoice.objects.get(pk=invoice.pk), actor=self.fixtures["admin"], now=self.now)
            except PaymentError:
                continue
            self._react_if_moved(before)

    @rule(share=st.sampled_from(["dust", "full"]), which=st.sampled_from(["invalid", "settled", "any"]))
    def pay_a_closed_invoice(self, share, which):
        """Money sent later to an address the customer was once given: a replaced quote, a settled invoice."""
        invoices = Invoice.objects.filter(order=self.order).order_by("pk")
        if which == "invalid":
            invoices = invoices.filter(status=Invoice.Status.INVALID)
        elif which == "settled":
            invoices = invoices.filter(status=Invoice.Status.SETTLED)
        invoice = invoices.first()
        if invoice is None:
            return
        self.credit(invoice, 1 if share == "dust" else int(invoice.amount_due_units), late=True)

    @rule(days=st.sampled_from([0, 1, 10]))
    def sweep_later(self, days):
        """Beat's sweep, some days later."""
        self.now += timedelta(days=days)
        with capture():
            refunds.ledger_sweep(now=self.now)

    @rule()
    def end_early(self):
        order = self.fresh()
        if not order.can_be_ended_early:
            return
        with capture(execute=False):
            booking_services.order_end_early(order=order, now=max(self.now, order.starts_at + timedelta(hours=1)))
        self.react(OrderStatus.ENDED)

    @rule()
    def customer_switches_asset_and_pays_the_old_quote_in_part(self):
        with contextlib.suppress(BookingError):
            self.pay_the_replaced_quote("part")

    # --- the documents and the stricter rule ----------------------------------------------------------------------

    @invariant()
    def every_coin_is_accounted_for(self):
        super().every_coin_is_accounted_for()
        if self.order is None:
            return
        money = ledger.order_money(self.fresh(), now=self.now)
        for invoice_money in money.invoices:
            assert invoice_money.unaccounted >= 0, (
                f"invoice {invoice_money.invoice_id}: bought {invoice_money.bought} + refunds "
                f"{invoice_money.refunds} exceed what it received {invoice_money.received}: a refund of money that "
                f"bought time"
            )
        # Each fiscal invoice's credit notes say what the refunds of its price gave back, never more than it.
        for document in FiscalInvoice.objects.filter(order=self.order, kind=FiscalInvoice.Kind.INVOICE):
            notes = list(document.credit_notes.all())
            gross = sum((note.total_gross for note in notes), Decimal(0))
            net = sum((note.total_net for note in notes), Decimal(0))
            vat = sum((note.vat_amount for note in notes), Decimal(0))
            assert gross <= document.total_gross and net <= document.total_net and vat <= document.vat_amount
            if gross == document.total_gross:
                assert (net, vat) == (document.total_net, document.vat_amount)
            price_refunds = Refund.objects.filter(invoice=document.payment, reason__in=ledger.PRICE_REFUND_REASONS)
            refunded = sum((refund.fiat_amount or Decimal(0) for refund in price_refunds), Decimal(0))
            assert gross == refunded, (
                f"{document.number}: credit notes {gross}, refunds of its price {refunded} "
                f"(order {self.fresh().status})"
            )
        # The revenue report says what the ledger says was bought (this example's invoices are the only ones).
        revenue = sum((row.net for row in selectors.revenue_by_month(since=date(2000, 1, 1))), Decimal(0))
        assert revenue == money.bought_price, (
            f"revenue {revenue}, the ledger's price of time given {money.bought_price}"
        )
