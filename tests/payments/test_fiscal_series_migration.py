"""Migration payments/0010: one counter a year, continued under whatever prefix was set, becomes one series per prefix
and year; the documents issued before it keep their numbers, and no number can be taken twice afterwards."""

from decimal import Decimal

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from payments.models import FiscalInvoice, FiscalInvoiceSeries
from payments.selectors import current_invoice
from tests.builders.orders import place

BEFORE = ("payments", "0009_merge_20261204_1924")
AFTER = ("payments", "0010_fiscal_invoice_series")


def migrate(target: tuple[str, str]):
    executor = MigrationExecutor(connection)
    executor.migrate([target])
    executor.loader.build_graph()
    return executor.loader.project_state([target]).apps


@pytest.fixture
def latest_schema_after():
    """The tests that run after this one need every later migration of payments applied again (0010 is not the last:
    the schema would lack the columns added since)."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_schema_after")
def test_each_prefix_used_before_the_migration_gets_its_series_from_its_highest_number(catalog, booking_data, settings):
    settings.RATELIMIT_ENABLE = False
    year = timezone.now().year
    payments = [
        current_invoice(
            place(Client(REMOTE_ADDR=f"10.2.0.{n}"), booking_data(lots="1", contact_email=f"m{n}@example.org"))[0]
        )
        for n in range(1, 5)
    ]
    # given: before the migration, one counter a year went on from F to G, and last year's under F
    old = migrate(BEFORE)
    issued = [(f"F-{year}-000001", year, 1), (f"F-{year}-000002", year, 2), (f"G-{year}-000003", year, 3)]
    issued.append((f"F-{year - 1}-000007", year - 1, 7))
    old.get_model("payments", "FiscalInvoiceCounter").objects.create(year=year, last_sequence=3)
    old.get_model("payments", "FiscalInvoiceCounter").objects.create(year=year - 1, last_sequence=7)
    for (number, issued_year, sequence), payment in zip(issued, payments, strict=True):
        old.get_model("payments", "FiscalInvoice").objects.create(
            number=number,
            year=issued_year,
            sequence=sequence,
            order_id=payment.order_id,
            payment_id=payment.pk,
            issued_at=timezone.now(),
            seller={},
            buyer={},
            lines=[],
            currency="EUR",
            vat_category="S",
            vat_rate=Decimal("20.00"),
            total_net=Decimal("100.00"),
            vat_amount=Decimal("20.00"),
            total_gross=Decimal("120.00"),
            payment_chain_id=31337,
            payment_asset="dEURC",
            payment_amount="120",
            payment_rate=Decimal("1"),
            payment_rate_source="test",
            paid_at=timezone.now(),
        )

    # when: the migration runs
    migrate(AFTER)

    # then: each document has the prefix it was numbered with, and each series starts after its highest number
    assert dict(FiscalInvoice.objects.values_list("number", "prefix")) == {
        number: number.split("-")[0] for number, *_rest in issued
    }
    assert set(FiscalInvoiceSeries.objects.values_list("prefix", "year", "last_sequence")) == {
        ("F", year, 2),
        ("G", year, 3),
        ("F", year - 1, 7),
    }
    from payments.fiscal import _take_number

    with transaction.atomic():
        assert _take_number(prefix="F")[2] == f"F-{year}-000003"
        assert _take_number(prefix="G")[2] == f"G-{year}-000004"
        assert _take_number(prefix="BIN")[2] == f"BIN-{year}-000001"
    # and the issued rows are guarded again (the migration disabled the guard for its one UPDATE only)
    with pytest.raises(DatabaseError, match="fiscal invoice"), transaction.atomic():
        FiscalInvoice.objects.filter(number=f"G-{year}-000003").update(prefix="F")
