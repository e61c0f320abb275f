"""Fixtures for the customer's side of ssh provisioning: an order provisioned on the loopback host and the
researcher's own ssh into it (which differs from conftest's `login_as`, hence a module the tests import)."""

import pytest

from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning import rules, runs, services
from provisioning.models import Access
from tests.builders.orders import place
from tests.provisioning.conftest import customer_ssh, remove_user


@pytest.fixture
def login_as():
    """login_as(user, private_key, command): the researcher's ssh to their container, as the order page says."""

    def login(user, private_key, command, *, options=(), timeout=30):
        access = Access.objects.select_related("host").get(username=user)
        return customer_ssh(access, private_key, command, options=list(options), timeout=timeout)

    return login


@pytest.fixture
def provisioned(client, loopback_host, booking_data, keypair, admin_user, admin, django_capture_on_commit_callbacks):
    private_key, public_key = keypair("customer")
    order, token = place(client, booking_data(lots="1", ssh_keys=public_key))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    services.order_approve(order=order, actor=admin_user)
    username = rules.username_for(order)
    try:  # from here on the user may exist: removed whatever happens
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_start(order=order, actor=admin_user)
        # No GPU on the test machine: the pre-flight check fails and the hand-over waits for an operator.
        with django_capture_on_commit_callbacks(execute=True):
            runs.provisioning_hand_over(order=order, actor=admin_user, reason="test machine without GPU")
        order.refresh_from_db()
        yield order, token, username, private_key
    finally:
        remove_user(admin, username)
