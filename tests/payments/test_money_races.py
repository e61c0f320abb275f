"""Races on the money path, on real transactions (issue 32's red team, kept): the operator's buttons pressed at
once with beat's sweep, the refund reaction delivered twice while the sweep runs, and the invoice prefix changed
while settlements are numbered. Each held, and holds: exactly one action wins, one refund of each reason, each
prefix's series gapless and the settings' history true."""

from decimal import Decimal

import pytest

from booking import services as booking_services
from booking.models import Order, OrderStatus
from payments import fiscal, ledger, refunds, unapplied
from payments.errors import PaymentError
from payments.models import FiscalInvoice, Invoice, OperatorRate, Refund
from tests.builders.orders import place


@pytest.fixture(autouse=True)
def first_terms_version(transactional_db):
    """The published terms the data migration seeds: a transactional test run before these flushed them with the
    rest of the database (its own data is gone too, so each race starts from the migrations' state)."""
    import importlib

    from django.apps import apps

    importlib.import_module("booking.migrations.0006_seed_first_terms_version").seed(apps, None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("money_rules")
def test_the_operators_buttons_pressed_at_once_pay_once(client, booking_data, admin_user, monkeypatch):
    """Tried and held: "Apply to the order" pressed twice, "Refund" at the same moment, and beat's sweep, on one
    flagged full payment to a replaced quote. Order then invoice are locked and `needs_operator` re-read under the
    lock (payments/unapplied.py): exactly one wins, and every coin is bought time or owed back, once."""
    import threading

    from django.db import close_old_connections, connection

    from payments import invoices as invoice_services
    from payments import settlement

    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    OperatorRate.objects.create(chain_id=31337, asset_symbol="dUSDT", fiat_currency="EUR", rate=Decimal("0.9"))
    order, _token = place(client, booking_data(lots="1"))
    replaced = Invoice.objects.get(order=order)
    invoice_services.invoice_change_asset(order=order, asset_key="31337:dUSDT")
    replaced.refresh_from_db()
    settlement.invoice_apply_chain_state(
        invoice=replaced, confirmed=int(replaced.amount_due_units), pending=0, head=0, now=replaced.created_at
    )
    replaced.refresh_from_db()
    assert replaced.needs_operator and replaced.status == Invoice.Status.INVALID

    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def press(action: str) -> None:
        try:
            barrier.wait(timeout=30)
            if action == "sweep":
                refunds.ledger_sweep()
            else:
                service = unapplied.invoice_apply_to_order if action == "apply" else unapplied.invoice_refund_unapplied
                service(invoice=Invoice.objects.get(pk=replaced.pk), actor=admin_user)
            outcomes.append(f"{action}: done")
        except PaymentError as exc:
            outcomes.append(f"{action}: {exc.message}")
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=press, args=(a,)) for a in ("apply", "apply", "refund", "sweep")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    done = [outcome for outcome in outcomes if outcome.endswith("done") and not outcome.startswith("sweep")]
    assert len(done) == 1, outcomes
    money = ledger.order_money(Order.objects.get(pk=order.pk))
    assert money.breaches() == [] and all(m.unaccounted >= 0 for m in money.invoices)
    paid_once = ledger.invoice_is_taken(Invoice.objects.get(pk=replaced.pk))
    owed = sum((int(r.amount_units) for r in Refund.objects.filter(invoice=replaced)), 0)
    assert paid_once != bool(owed), (outcomes, paid_once, owed)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("money_rules")
def test_the_reaction_delivered_twice_and_the_sweep_at_once_refund_once(client, booking_data, admin_user, monkeypatch):
    """Tried and held: a paid order (overpaid, and a part paid to a replaced quote) cancelled by its customer; the
    refund reaction is delivered twice while beat's sweep runs, all at the same moment. One refund of each reason,
    credit notes equal to the refunds of the price, and the ledger holds."""
    import threading

    from django.db import close_old_connections, connection

    from booking.cancellation import refund_quote
    from booking.signals import order_status_changed
    from payments import invoices as invoice_services
    from payments import settlement

    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    OperatorRate.objects.create(chain_id=31337, asset_symbol="dUSDT", fiat_currency="EUR", rate=Decimal("0.9"))
    order, _token = place(client, booking_data(lots="1"))
    replaced = Invoice.objects.get(order=order)
    invoice_services.invoice_change_asset(order=order, asset_key="31337:dUSDT")
    current = Invoice.objects.get(order=order, status=Invoice.Status.NEW)
    replaced.refresh_from_db()
    settlement.invoice_apply_chain_state(
        invoice=replaced, confirmed=int(replaced.amount_due_units) // 3, pending=0, head=0, now=replaced.created_at
    )
    settlement.invoice_apply_chain_state(
        invoice=current,
        confirmed=int(current.amount_due_units) * 101 // 100,  # 1 % over: above the dust threshold
        pending=0,
        head=0,
        now=current.created_at,
    )
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    for uid in ("payments-refunds", "payments-credit-notes"):
        order_status_changed.disconnect(dispatch_uid=uid)
    try:
        shown = refund_quote(order=order, now=timezone_now()).amount
        booking_services.order_cancel_by_customer(order=order, refund_shown=shown)
    finally:
        order_status_changed.connect(settlement.on_order_status_changed, dispatch_uid="payments-refunds")
        order_status_changed.connect(fiscal.on_order_status_changed, dispatch_uid="payments-credit-notes")
    assert not Refund.objects.filter(order=order, reason=Refund.Reason.CANCELLATION).exists()

    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def run(job) -> None:
        try:
            barrier.wait(timeout=30)
            job()
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    jobs = [
        lambda: settlement.on_order_status_changed(order_id=order.pk, to_status=OrderStatus.CANCELLED),
        lambda: settlement.on_order_status_changed(order_id=order.pk, to_status=OrderStatus.CANCELLED),
        lambda: fiscal.on_order_status_changed(order_id=order.pk, to_status=OrderStatus.CANCELLED),
        lambda: refunds.ledger_sweep(),
    ]
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    given = Refund.objects.filter(order=order)
    assert sorted(given.values_list("reason", flat=True)) == sorted(
        [Refund.Reason.CANCELLATION, Refund.Reason.OVERPAYMENT, Refund.Reason.UNUSED_PAYMENT]
    ), list(given.values_list("reason", "amount_units"))
    assert given.get(reason=Refund.Reason.CANCELLATION).fiat_amount == shown
    notes = FiscalInvoice.objects.filter(order=order, kind=FiscalInvoice.Kind.CREDIT_NOTE)
    assert sum((note.total_gross for note in notes), Decimal(0)) == shown
    money = ledger.order_money(Order.objects.get(pk=order.pk))
    assert money.breaches() == [] and all(m.unaccounted >= 0 for m in money.invoices)


def timezone_now():
    from django.utils import timezone

    return timezone.now()


@pytest.mark.django_db(transaction=True)
def test_a_prefix_changed_while_settlements_run_keeps_each_series_gapless(catalog, booking_data, settings, monkeypatch):
    """Tried and held for the numbers: twelve settlements at once while the admin changes the prefix F → G. Each
    prefix's series is 1..n without gap or duplicate (the series row is locked, payments/fiscal.py `_take_number`).
    And what the history says holds: the settings row is locked before the series (payments/fiscal.py
    `_settings_locked`), so no invoice is numbered F after the change to G was saved (it was, before: the settings
    were read before the series lock)."""
    import threading

    from django.contrib.auth import get_user_model
    from django.db import close_old_connections, connection
    from django.test import Client
    from django.urls import reverse
    from django.utils import timezone

    from payments.models import InvoicingSettings
    from payments.settlement import invoice_mark_paid
    from tests.factories import add_lots

    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    settings.RATELIMIT_ENABLE = False
    add_lots(catalog["b200-pair"], 12)
    for index in range(12):
        client = Client(REMOTE_ADDR=f"10.1.0.{index + 1}")
        response = client.post(reverse("customer:book"), booking_data(lots="1", contact_email=f"p{index}@example.org"))
        assert response.status_code == 302
    pending = list(Invoice.objects.filter(status=Invoice.Status.NEW))
    admin = get_user_model().objects.create(username="operator-p", is_staff=True)
    barrier = threading.Barrier(13)
    errors: list[BaseException] = []
    changed_at: list = []

    def settle(invoice: Invoice) -> None:
        try:
            barrier.wait(timeout=60)
            invoice_mark_paid(invoice=invoice, user=admin, reason="paid by bank transfer")
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    def change_prefix() -> None:
        try:
            barrier.wait(timeout=60)
            row = InvoicingSettings.current()
            row.number_prefix = "G"
            row.save()
            changed_at.append(timezone.now())
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=settle, args=(invoice,)) for invoice in pending]
    threads.append(threading.Thread(target=change_prefix))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == []
    issued = list(FiscalInvoice.objects.values_list("prefix", "sequence", "number", "issued_at"))
    assert len(issued) == 12 and len({number for _p, _s, number, _at in issued}) == 12
    for prefix in {prefix for prefix, *_rest in issued}:
        sequences = sorted(sequence for p, sequence, *_rest in issued if p == prefix)
        assert sequences == list(range(1, len(sequences) + 1)), (prefix, sequences)
    late_f = [number for prefix, _s, number, at in issued if prefix == "F" and changed_at and at > changed_at[0]]
    assert late_f == [], f"numbered F after the change to G was saved: {late_f}"


@pytest.mark.django_db(transaction=True)
def test_a_prefix_change_waits_for_the_invoice_being_numbered(catalog, booking_data, monkeypatch):
    """The settings are read under the lock the admin's change takes (payments/fiscal.py `_settings_locked`): a
    settlement that read prefix F numbers its invoice before the change to G is saved, so the history never dates an
    F invoice after the change. Played step by step: the settlement stops between reading the settings and taking
    its number while the change is tried (found by issue 32's red team: the change went through, and the invoice
    was numbered F after it)."""
    import threading

    from django.contrib.auth import get_user_model
    from django.db import close_old_connections, connection
    from django.utils import timezone

    from payments.models import InvoicingSettings
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid

    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    from django.test import Client

    order, _token = place(Client(REMOTE_ADDR="10.2.0.1"), booking_data(lots="1"))
    invoice = current_invoice(order)
    admin = get_user_model().objects.create(username="operator-q", is_staff=True)
    InvoicingSettings.current()  # the row exists before: its creation would serialize the two by itself
    settings_read, change_saved = threading.Event(), threading.Event()
    take_number = fiscal._take_number

    def numbering_after_the_change_is_tried(**kwargs):
        settings_read.set()
        change_saved.wait(timeout=3)  # with the settings locked, the change cannot be saved meanwhile
        return take_number(**kwargs)

    monkeypatch.setattr(fiscal, "_take_number", numbering_after_the_change_is_tried)
    changed_at: list = []
    errors: list[BaseException] = []

    def settle() -> None:
        try:
            invoice_mark_paid(invoice=invoice, user=admin, reason="paid by bank transfer")
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    def change_prefix() -> None:
        try:
            settings_read.wait(timeout=30)
            row = InvoicingSettings.current()
            row.number_prefix = "G"
            row.save()
            changed_at.append(timezone.now())
            change_saved.set()
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=settle), threading.Thread(target=change_prefix)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    document = FiscalInvoice.objects.get(payment=invoice)
    assert (document.prefix, document.sequence) == ("F", 1)
    assert document.issued_at < changed_at[0], "numbered F after the change to G was saved"
