"""The product end to end as its users meet it, in the browser: a researcher in English and in French, the
operator who approves, extends and tears down, the admin who settles a partial payment by hand. Each page's final
state is saved in test-artifacts/ (`make screenshots` copies some into docs/img/)."""

import re
import time

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from booking.models import Order, OrderStatus
from inventory.models import Lot
from payments.models import Invoice
from provisioning.models import Access, OperatorSettings, ProvisioningRun
from provisioning.rules import awaits_preflight_decision, username_for
from provisioning.runs import provisioning_hand_over
from provisioning.services import order_approve
from provisioning.steps import PROVISION_STEPS
from tests.browser.conftest import ARTIFACTS, start_worker_and_beat
from tests.browser.steps import ORDER_URL, PASSWORD, fill_booking, log_in, pay_as_a_wallet, place_order
from tests.provisioning.conftest import remove_user

pytestmark = pytest.mark.integration


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def admin_reviewer(transactional_db):
    return get_user_model().objects.create_superuser("adele", "adele@binome.example", PASSWORD)


@pytest.fixture
def operations(live_chain, loopback_host, start_celery_worker, sshd, fake_gpus):
    """A worker and beat that reach the loopback host over SSH; two B200 lots on it (GPUs 0,1 and 2,3)."""
    _chain, path = live_chain
    b200 = Lot.objects.filter(host=loopback_host).first().hardware_class
    Lot.objects.create(name="loopback · GPUs 2,3", hardware_class=b200, host=loopback_host, gpu_indices="2,3")
    OperatorSettings.objects.update_or_create(pk=1, defaults={"provision_lead_hours": 72})  # approve = provision
    stop = start_worker_and_beat(
        start_celery_worker,
        path,
        PROVISIONING_SSH_KEY_FILE=str(sshd.host_spec.client_key_path),
        PROVISIONING_DEVICE_DIR=str(fake_gpus),  # the mknod stand-ins of the host's GPUs
        PROVISIONING_PUBLISH_ADDRESS="127.0.0.1",  # the containers' SSH servers, on loopback only
    )
    yield
    stop()


def test_a_researcher_books_pays_and_an_operator_runs_the_order_to_its_end(
    new_page, page, live_server, live_chain, catalog, operations, operator, admin
):
    chain, _path = live_chain
    # The researcher reads availability and price, and asks the fit advisor.
    page.goto(live_server.url + "/")
    quote = page.inner_text("#quote")
    assert "NVIDIA B200 pair" in quote and "2 / 2" in quote
    page.fill("input[name=fit-parameters_billion]", "13")  # 13B mixed-precision AdamW: 208 GB of states
    page.locator("#fit-advice").get_by_text("The B200 pair with sharding").wait_for(timeout=15000)

    # Two lots for 7 days, contact details and a key: the order page with its payment instructions.
    fill_booking(page, lots="2", email="ada@example.org")
    page.click("text=Place the order and hold the lots")
    page.wait_for_url(ORDER_URL)
    assert "Awaiting payment" in page.inner_text("#order-status")
    assert page.locator("#order-status svg").count() == 1  # the QR code
    order = Order.objects.get()

    # Pay as a wallet would, press I've paid, watch k/N confirmations become "paid" without reloading.
    receipt = pay_as_a_wallet(page, chain)
    page.fill("input[name=tx_hint]", receipt["transactionHash"])
    page.click("text=I've paid")
    page.locator("#order-status").get_by_text("confirmations").wait_for(timeout=30000)
    chain.mine(2)
    page.locator("#order-status").get_by_text("Paid: 6300.00 dEURC received and confirmed.").wait_for(timeout=30000)
    shot(page, "researcher-paid")
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID and order.fit_advice["recommendation"] == "b200_pair_sharded"

    # The operator logs in, finds the paid order in the console and approves it; provisioning runs over SSH.
    console = new_page()
    console.on("dialog", lambda dialog: dialog.accept())
    log_in(console, live_server.url + "/console/", "olga")
    paid_section = console.locator("section", has_text="Paid, awaiting approval")
    paid_section.get_by_role("link", name=order.public_id).click()
    console.click("button:has-text('Approve')")
    runs = console.locator("#runs")
    runs.get_by_text("Provision · Succeeded").wait_for(timeout=90000)
    steps = runs.locator("table.steps").first.inner_text()
    assert steps.count("Done") == len(PROVISION_STEPS), steps
    shot(console, "console-provisioned")

    # No GPU on the test machine: the pre-flight check fails and the hand-over waits for the operator, who reads
    # the report and hands over anyway, with a reason the researcher reads beside it.
    console.get_by_text("the hand-over waits for your decision").wait_for(timeout=30000)
    console.fill("input[name=reason][required]", "Test bench without GPUs: the check cannot pass here")
    console.click("button:has-text('Hand over anyway')")
    console.get_by_text("hand-over done").wait_for(timeout=30000)

    # The researcher's page shows how to log in and the pre-flight report, without a reload.
    access = Access.objects.get(order=order)
    page.locator("#order-status").get_by_text("How to log in").wait_for(timeout=30000)
    status = page.inner_text("#order-status")
    assert access.ssh_command in status and "You land in a container of" in status
    assert access.known_hosts_line in status  # the container's host key, to pin
    assert "Pre-flight report: FAIL" in status  # no GPU on the test machine: a report with reasons, not a crash
    assert "GPUs visible" in status  # the check, named in the page's language
    assert "The operator's note: Test bench without GPUs: the check cannot pass here" in status
    shot(page, "researcher-ready")

    # The operator extends the window by 7 days: a new invoice the researcher pays from the same page.
    ends_at = order.ends_at
    console.locator("h1 .status", has_text="Ready").wait_for(timeout=30000)  # the page follows the order's status
    console.select_option("select[name=days]", "7")
    console.click("button:has-text('Extend (new invoice)')")
    console.locator("ul.messages").get_by_text("extension request done").wait_for(timeout=30000)
    page.locator("#order-status").get_by_text("Extension by 7 days").wait_for(timeout=30000)
    pay_as_a_wallet(page, chain)
    chain.mine(3)
    page.locator("#order-status").get_by_text("Extension paid: your window now ends on").wait_for(timeout=60000)
    order.refresh_from_db()
    assert (order.ends_at - ends_at).days == 7
    console.locator("dl.summary", has_text=order.ends_at.strftime("%Y-%m-%d %H:%M")).wait_for(timeout=30000)

    # The operator tears it down: the run revokes the login, the researcher's page says the window has ended.
    username = username_for(order)
    try:
        console.fill("input[name=reason][placeholder=Reason] >> nth=0", "experiment finished early")
        console.click("button:has-text('Tear down now')")
        runs.get_by_text("Teardown · Succeeded").wait_for(timeout=90000)
        shot(console, "console-torn-down")
        page.locator("#order-status").get_by_text("The window has ended and access was revoked.").wait_for(
            timeout=30000
        )
        shot(page, "researcher-ended")
        order.refresh_from_db()
        assert order.status == OrderStatus.ENDED
        assert order.provisioning_runs.get(kind=ProvisioningRun.Kind.TEARDOWN).status == "succeeded"
        history = console.inner_text("ol.timeline")
        assert "olga" in history and "experiment finished early" in history
    finally:
        remove_user(admin, username)


def test_une_chercheuse_reserve_paie_et_trouve_ses_acces_en_francais(
    page, live_server, live_chain, catalog, operations, operator, admin
):
    chain, _path = live_chain
    page.goto(live_server.url + "/")
    with page.expect_navigation():
        page.select_option("#language-select", "fr")
    assert page.get_attribute("html", "lang") == "fr"
    quote = page.inner_text("#quote")
    assert "Disponibilité et prix" in quote and "2 / 2" in quote
    page.fill("input[name=fit-parameters_billion]", "13")
    page.locator("#fit-advice").get_by_text("Il faut la paire de B200 avec partitionnement").wait_for(timeout=15000)

    fill_booking(page, lots="2", email="marie@example.org")
    page.fill("input[name=contact_email]", "pas-une-adresse")
    page.click("button.button-primary")
    assert "Saisissez une adresse de courriel valide." in page.inner_text("#field-contact_email")
    assert Order.objects.count() == 0

    page.fill("input[name=contact_email]", "marie@example.org")
    page.click("text=Passer la commande et bloquer les lots")
    page.wait_for_url(ORDER_URL)
    assert page.get_attribute("html", "lang") == "fr"
    assert "En attente de paiement" in page.inner_text("#order-status")

    pay_as_a_wallet(page, chain)
    page.click("text=J’ai payé")
    page.locator("#order-status").get_by_text(re.compile(r"Transfert détecté dans le bloc \d+\s*:\s*\d/3")).wait_for(
        timeout=30000
    )
    chain.mine(2)
    paid = re.compile(r"Payé\s*:\s*réception de 6300[.,]00 dEURC confirmée")  # French spacing: a no-break space
    page.locator("#order-status").get_by_text(paid).wait_for(timeout=30000)
    shot(page, "commande-fr")
    order = Order.objects.get()
    assert order.language == "fr"

    # An operator approves (the console is the English test's); the page shows, in French, how to log in.
    order_approve(order=order, actor=operator)
    try:
        # No GPU here: the pre-flight check fails and the operator hands over anyway, with a reason.
        deadline = time.monotonic() + 90
        while not awaits_preflight_decision(order) and time.monotonic() < deadline:
            time.sleep(0.5)
            order.refresh_from_db()
        provisioning_hand_over(order=order, actor=operator, reason="Banc de test sans GPU")
        page.locator("#order-status").get_by_text("Comment vous connecter").wait_for(timeout=30000)
        status = page.inner_text("#order-status")
        assert Access.objects.get(order=order).ssh_command in status
        assert re.search(r"Rapport de vérification préalable\s*:\s*FAIL", status)
        shot(page, "commande-fr-acces")
    finally:
        remove_user(admin, username_for(order))


def test_an_admin_settles_a_partially_paid_invoice_with_a_reason(
    new_page, page, live_server, live_chain, catalog, worker_and_beat, admin_reviewer
):
    chain, _path = live_chain
    order = place_order(page, live_server.url, email="partial@example.org")
    pay_as_a_wallet(page, chain, fraction=(1, 2))  # half of it: the other half came by bank, the researcher says
    chain.mine(3)
    page.locator("#order-status").get_by_text("are still missing").wait_for(timeout=30000)
    invoice = Invoice.objects.get(order=order)
    assert invoice.paid_partial and invoice.status != Invoice.Status.SETTLED

    admin_page = new_page(viewport={"width": 1400, "height": 1200})
    log_in(admin_page, live_server.url + "/admin/payments/invoice/", "adele")
    with admin_page.expect_navigation():
        admin_page.click("text=Partially paid")  # the exception filter
    rows = admin_page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    assert order.public_id in rows.first.inner_text()
    rows.first.locator("input[name=_selected_action]").check()
    admin_page.select_option("select[name=action]", "mark_paid")
    admin_page.click("button[name=index]")
    admin_page.fill("textarea[name=reason]", "Second half received by bank transfer, ref 2026-118")
    admin_page.click("input[type=submit][value='Mark paid']")
    assert "1 invoice(s) marked paid." in admin_page.inner_text("ul.messagelist")

    # The audit trail: the order's history and the invoice's admin history both name who and why.
    admin_page.goto(live_server.url + f"/admin/booking/order/{order.pk}/change/")
    events = admin_page.inner_text("body")
    assert "marked paid: Second half received by bank transfer, ref 2026-118" in events and "adele" in events
    admin_page.goto(live_server.url + f"/admin/payments/invoice/{invoice.pk}/history/")
    assert "Marked paid: Second half received by bank transfer" in admin_page.inner_text("#change-history")
    shot(admin_page, "admin-invoice-history")

    page.locator("#order-status").get_by_text("Confirmed by an operator.").wait_for(timeout=30000)
    shot(page, "researcher-marked-paid")
    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
