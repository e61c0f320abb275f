"""The console's "Check host" in Chromium: the operator presses it, the page says the check is queued, a real worker
on the provisioning queue runs it, and the polled block turns to its finding, or to why it failed, without a
reload (the web process opens no SSH itself)."""

import re
import socket

import pytest
from playwright.sync_api import expect

from inventory.models import Host
from tests.browser.steps import log_in, submitted

pytestmark = pytest.mark.integration

HOST_URL = re.compile(r".*/console/hosts/[\w-]+/$")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def olga(page, operator):
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    return page


def test_an_operator_checks_a_host_and_watches_the_finding_arrive(olga, live_server, catalog, start_celery_worker):
    page = olga
    start_celery_worker()
    dry_run = Host.objects.filter(driver=Host.Driver.DRY_RUN).order_by("name").first()
    log_in(page, f"{live_server.url}/console/hosts/{dry_run.name}/", "olga")

    submitted(page, page.get_by_role("button", name="Check host"), to=HOST_URL)

    # the answer comes at once (queued or already running), then the worker's finding replaces it in place
    assert re.search(r"Check (queued|running)|dry-run driver", page.inner_text("#host-check"))
    expect(page.locator("#host-check")).to_contain_text("uses the dry-run driver: nothing was probed", timeout=30_000)
    expect(page.get_by_role("button", name="Check host")).to_be_enabled()

    # a host whose SSH does not answer: the failure and its reason, and the previous finding is kept
    Host.objects.filter(pk=dry_run.pk).update(
        driver=Host.Driver.SSH, address="127.0.0.1", ssh_port=_closed_port(), host_key="ssh-ed25519 AAAAC3Nz"
    )
    page.reload()
    submitted(page, page.get_by_role("button", name="Check host"), to=HOST_URL)
    expect(page.locator("#host-check")).to_contain_text("failed", timeout=30_000)
    expect(page.locator("#host-check")).to_contain_text("The host keeps its previous finding")
    assert not page.refused
