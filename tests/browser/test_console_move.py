"""The console's "Move (provider fault)" form in Chromium: an operator moves a lot of a ready order to a free one
on another host and gives the lost hours back as a longer window; the researcher's page says the order is moving."""

import re
from datetime import timedelta

import pytest

from booking.models import OrderStatus
from booking.services import order_transition
from inventory.models import Lot
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from provisioning.models import ProvisioningRun
from tests.browser.steps import browser_ready_order, log_in, submitted

pytestmark = pytest.mark.integration

CONSOLE_ORDER_URL = re.compile(r".*/console/orders/BN-[^/]+/$")


def test_an_operator_moves_a_lot_after_a_provider_fault_and_credits_the_hours(
    browser_page,
    new_page,
    live_server,
    live_chain,
    catalog,
    admin_user,
    operator,
):
    researcher = browser_page
    order = browser_ready_order(researcher, live_server.url, email="fault@example.org", admin_user=admin_user)
    held = order.allocations.filter(released_at__isnull=True).select_related("lot__host").first().lot
    taken = order.allocations.values_list("lot_id", flat=True)
    target = Lot.objects.filter(hardware_class=order.hardware_class).exclude(pk__in=taken).exclude(host=held.host)
    target = target.order_by("host__name", "name").first()
    end = order.ends_at

    console = new_page()
    console.on("dialog", lambda dialog: dialog.accept())
    console.refused = []
    console.on("response", lambda response: response.status == 403 and console.refused.append(response.url))
    log_in(console, f"{live_server.url}/console/orders/{order.public_id}/", "olga")
    form = console.locator("form", has=console.locator(f"input[name=from_lot][value='{held.pk}']")).filter(
        has=console.get_by_role("button", name="Move (provider fault)")
    )
    form.locator("select[name=to_lot]").select_option(str(target.pk))
    form.locator("input[name=hours_lost]").fill("5")
    form.locator("select[name=credit]").select_option("extension")
    submitted(console, form.get_by_role("button", name="Move (provider fault)"), to=CONSOLE_ORDER_URL)

    assert "move (the customer is e-mailed) done" in console.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.ends_at == end + timedelta(hours=5)
    assert target.pk in order.allocations.filter(released_at__isnull=True).values_list("lot_id", flat=True)
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.MOVE).exists()
    researcher.reload()
    assert "your order is moving to other cards" in researcher.inner_text("main")


def test_an_operator_stops_retrying_a_failed_move(
    browser_page,
    live_server,
    catalog,
    booking_data,
    admin_user,
    operator,
    settings,
    tmp_path,
):
    """A move whose new host does not answer is retried by itself; the operator decides to stop, with a reason,
    from the console's queue."""
    from django.test import Client

    from booking.models import Order
    from inventory.models import Host
    from provisioning import moves
    from provisioning.execution import run_execute
    from tests.builders.orders import place
    from tests.provisioning.conftest import _free_port, generate_keypair

    order, _token = place(Client(), booking_data(lots="1"))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    order = Order.objects.get(pk=order.pk)
    held = order.allocations.get().lot
    target = Lot.objects.filter(hardware_class=order.hardware_class).exclude(host=held.host).order_by("name").first()
    key, public = generate_keypair(tmp_path / "portal")
    settings.PROVISIONING_SSH_KEY_FILE = str(key)
    Host.objects.filter(pk=target.host_id).update(
        driver=Host.Driver.SSH, address="127.0.0.1", ssh_port=_free_port(), host_key=" ".join(public.split()[:2])
    )  # its sshd is down
    move = moves.order_move(order=order, from_lot_id=held.pk, to_lot_id=target.pk, actor=admin_user)
    run_execute(run=move)  # as a worker would
    move.refresh_from_db()
    assert move.status == ProvisioningRun.Status.FAILED and move.next_retry_at is not None

    console = browser_page
    log_in(console, f"{live_server.url}/console/", "olga")
    row = console.locator("#section-failing-teardowns tr", has_text=order.public_id)
    row.locator("input[name=reason]").fill("the spare host is out for repair: moving it elsewhere")
    submitted(console, row.get_by_role("button", name="Stop retrying"), to=CONSOLE_ORDER_URL)

    assert "decision on the failed move (not retried any more) done" in console.inner_text("ul.messages")
    assert "Not retried any more" in console.inner_text("#runs")
    move.refresh_from_db()
    assert move.given_up_at is not None and move.next_retry_at is None
    assert order.events.filter(reason__startswith="move given up: the spare host is out for repair").exists()
