"""One order's money life with the operator in it (tests/payments/money_life.py, from issue 32's red team): the
money machine's steps and the console's two actions on flagged payments, payments to closed invoices, the sweep days
later, the window ended early; after every step the ledger rule holds, bought + refunds <= received, the credit
notes say what the refunds of a price gave back and the revenue report says what the ledger says was bought.
`OPERATOR_MONEY_EXAMPLES` and `OPERATOR_MONEY_STEPS` run more."""

import os
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from payments import fiscal
from payments.models import OperatorRate
from tests.payments.money_life import RedMoneyLife

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("OPERATOR_MONEY_EXAMPLES", "40"))
STEPS = int(os.environ.get("OPERATOR_MONEY_STEPS", "16"))


@pytest.mark.usefixtures("money_rules")
def test_money_and_its_documents_add_up_with_the_operator_in_the_sequence(
    client, booking_data, admin_user, monkeypatch
):
    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)
    OperatorRate.objects.create(chain_id=31337, asset_symbol="dUSDT", fiat_currency="EUR", rate=Decimal("0.9"))
    RedMoneyLife.fixtures = {"client": client, "booking_data": booking_data, "admin": admin_user}
    run_state_machine_as_test(
        RedMoneyLife,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            derandomize=os.environ.get("OPERATOR_MONEY_SEED") is None,
            suppress_health_check=list(HealthCheck),
        ),
    )
