"""One order's money life as a sequence (issue 32): a stateful property test (Hypothesis `RuleBasedStateMachine`)
that pays in full, in part, over, late and to a replaced quote; extends (paid, refused after a maintenance window
was planned, its hold expired); cancels by the customer or an operator; rejects; credits a provider fault as time
or as money; pays refunds in part or whole; sweeps. After every step the ledger rule holds for every invoice
(payments/ledger.py): received = bought + refunded + owed back + flagged (+ pending while it can still be
completed), refunds never exceed what an invoice received nor its price what its order took, and every coin
received is bought time, refunded or owed back, or in front of an operator. A provider-fault refund is checked
against a model of what bought the window, kept by the test itself.

Pure database steps on the real PostgreSQL: the chain's word comes through the settlement service as the scanner
gives it (`invoice_apply_chain_state`), and a refund's payout through the refund proofs' recording, as the chain
reading gives it. Each example runs in a savepoint rolled back at its end. The reactions to the order's transitions
(sent on commit) run when the step captures them, as they would after its commit.

Examples: `MONEY_SEQUENCE_EXAMPLES` (default 30, the `make test` budget, about 20 s). Run on main's code before
issue 32, the machine met each bug the issue reproduces within the number of examples given in
docs/architecture.md ("The ledger rule"); tests/payments/test_ledger.py keeps each as a regression."""

import os
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    run_state_machine_as_test,
)

from payments import fiscal
from payments.models import OperatorRate
from tests.payments.money_life import OrderMoneyLife

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("MONEY_SEQUENCE_EXAMPLES", "30"))
STEPS = int(os.environ.get("MONEY_SEQUENCE_STEPS", "14"))


@pytest.fixture
def money_rules(rules):
    return rules(days=3, fee="100.00", percent=50)


@pytest.mark.usefixtures("money_rules")
def test_money_adds_up_over_any_sequence(client, booking_data, admin_user, monkeypatch):
    monkeypatch.setattr(fiscal, "_write_document", lambda fiscal_invoice_id: None)  # printing is not the subject
    # The second asset a researcher may switch to, priced by the operator (the demo's feed prices only ETH).
    OperatorRate.objects.create(chain_id=31337, asset_symbol="dUSDT", fiat_currency="EUR", rate=Decimal("0.9"))
    OrderMoneyLife.fixtures = {"client": client, "booking_data": booking_data, "admin": admin_user}
    run_state_machine_as_test(
        OrderMoneyLife,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            derandomize=os.environ.get("MONEY_SEQUENCE_SEED") is None,
            suppress_health_check=list(HealthCheck),
        ),
    )
