"""The console's "Start the container again" form in Chromium: the watch left a customer's container stopped after
it kept stopping (provisioning/restarts.py); the operator starts it again, which clears the hold and runs a restart."""

import re

import pytest
from django.utils import timezone

from provisioning import restarts, rules
from provisioning.models import Access, ProvisioningRun
from tests.browser.steps import browser_ready_order, log_in, submitted

pytestmark = pytest.mark.integration

CONSOLE_ORDER_URL = re.compile(r".*/console/orders/BN-[^/]+/$")


def test_an_operator_starts_again_a_container_the_watch_left_stopped(
    browser_page,
    new_page,
    live_server,
    live_chain,
    catalog,
    admin_user,
    operator,
):
    order = browser_ready_order(browser_page, live_server.url, email="loop@example.org", admin_user=admin_user)
    lot = order.allocations.filter(released_at__isnull=True).select_related("lot__host").first().lot
    # the watch's state after the container stopped once more than its ceiling (as restarts.access_restart_due
    # leaves it; the restarts themselves need a host that runs containers: tests/provisioning/test_shares.py)
    Access.objects.create(
        order=order, host=lot.host, username=rules.username_for(order), gpu_indices=lot.gpu_indices,
        status=Access.Status.READY, restarts=restarts.RESTART_LIMIT, restarted_at=timezone.now(),
        restarts_held_at=timezone.now(),
    )  # fmt: skip

    console = new_page()
    console.refused = []
    console.on("response", lambda response: response.status == 403 and console.refused.append(response.url))
    log_in(console, f"{live_server.url}/console/orders/{order.public_id}/", "olga")
    assert "left stopped since" in console.inner_text("main")
    submitted(console, console.get_by_role("button", name="Start the container again"), to=CONSOLE_ORDER_URL)

    assert "container start done" in console.inner_text("ul.messages")
    access = Access.objects.get(order=order)
    assert access.restarts_held_at is None and access.restarts == 0
    assert order.provisioning_runs.filter(kind=ProvisioningRun.Kind.RESTART, triggered_by__username="olga").exists()
    assert "left stopped since" not in console.inner_text("main")
