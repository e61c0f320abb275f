"""Every form of the customer pages, submitted by Chromium and checked by its effect.

A test client sends no `Origin` or `Referer` unless told; Chromium derives them from the page's Referrer-Policy. Under
`no-referrer` it posted `Origin: null` from the order page, which Django's CSRF check refuses (403): these tests are
the proof that each form works in a real browser, and that the order's secret link still reaches no other site."""

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from booking.models import Order, OrderStatus, SplitTrialReport
from booking.services import order_transition
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.browser.steps import ORDER_URL, fill_booking, place_order, submitted
from tests.builders.split_trial import VALID as SPLIT_TRIAL_REPORT
from tests.factories import make_ssh_key

pytestmark = pytest.mark.integration


@pytest.fixture
def researcher(page):
    """The page of a researcher who answers yes to the pages' "Are you sure?" questions, and whose refused posts
    are kept to explain a failure."""
    page.on("dialog", lambda dialog: dialog.accept())
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    return page


def test_a_researcher_changes_the_asset_then_cancels_the_order(researcher, live_server, live_chain, catalog):
    page = researcher
    order = place_order(page, live_server.url, email="asset@example.org")
    assert current_invoice(order).asset_symbol == "dEURC"

    page.select_option("select[name=asset]", "31337:dUSDT")
    submitted(page, page.get_by_role("button", name="Get new instructions"), to=ORDER_URL)
    assert "New payment instructions below" in page.inner_text("ul.messages")
    assert current_invoice(order).asset_symbol == "dUSDT"
    assert "dUSDT" in page.inner_text("#payment")

    submitted(page, page.get_by_role("button", name="Cancel this order"), to=ORDER_URL)
    assert "Your order is cancelled and its lots are released." in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED


def test_without_javascript_ive_paid_and_the_language_switch_are_plain_forms(
    new_page, live_server, live_chain, catalog
):
    page = new_page(java_script_enabled=False)
    page.refused = []
    page.on("response", lambda response: response.status == 403 and page.refused.append(response.url))
    order = place_order(page, live_server.url, email="nojs@example.org")

    page.fill("input[name=tx_hint]", "0x" + "ab" * 32)
    submitted(page, page.get_by_role("button", name="I've paid"), to=ORDER_URL)
    assert "We are looking for your transfer on chain" in page.inner_text("ul.messages")
    invoice = current_invoice(order)
    assert invoice.customer_paid_at is not None and invoice.customer_tx_hint == "0x" + "ab" * 32

    page.select_option("#language-select", "fr")
    submitted(page, page.locator(".language-switch button"), to=ORDER_URL)
    assert page.get_attribute("html", "lang") == "fr"
    assert "Vous nous avez indiqué avoir payé" in page.inner_text("#order-status")


def test_the_language_switch_keeps_the_order_page_open_and_ive_paid_answers_in_place(
    researcher, live_server, live_chain, catalog
):
    page = researcher
    order = place_order(page, live_server.url, email="langue@example.org")
    order_address = page.url

    with page.expect_navigation():
        page.select_option("#language-select", "fr")  # sends its form by itself (portal.js)
    assert not page.refused, f"refused (403): {page.refused}"
    assert page.url == order_address
    assert page.get_attribute("html", "lang") == "fr"
    assert "En attente de paiement" in page.inner_text("#order-status")

    # With JavaScript, "I've paid" is an htmx post (its CSRF token in a header) that swaps the status block.
    page.get_by_role("button", name="J’ai payé").click()
    page.locator("#order-status").get_by_text("Vous nous avez indiqué avoir payé").wait_for(timeout=15000)
    assert not page.refused, f"refused (403): {page.refused}"
    assert page.url == order_address and current_invoice(order).customer_paid_at is not None


def test_a_split_trial_report_is_uploaded_from_the_order_page(researcher, live_server, live_chain, catalog, admin_user):
    page = researcher
    order = place_order(page, live_server.url, email="trial@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    page.reload()

    page.set_input_files(
        "input[name=report]",
        {"name": "report.json", "mimeType": "application/json", "buffer": json.dumps(SPLIT_TRIAL_REPORT).encode()},
    )
    submitted(page, page.get_by_role("button", name="Upload"))
    assert "Split-trial report added to your order." in page.inner_text("ul.messages")
    assert SPLIT_TRIAL_REPORT["conclusion"] in page.inner_text("#split-trial")
    assert SplitTrialReport.objects.get(order=order).report["conclusion"] == SPLIT_TRIAL_REPORT["conclusion"]


def test_a_researcher_accepts_the_terms_then_cancels_the_paid_order_for_the_refund_shown(
    researcher, live_server, live_chain, catalog, admin_user
):
    page = researcher
    order = place_order(page, live_server.url, email="refund@example.org")  # the terms box is ticked
    assert order.terms_version.number == 1
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    page.reload()

    shown = page.get_attribute("input[name=refund_shown]", "value")
    button = page.get_by_role("button", name=re.compile(r"^Cancel and be refunded "))
    assert shown in button.inner_text().replace(",", "")
    submitted(page, button, to=ORDER_URL)

    assert "are owed back to you" in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.status == OrderStatus.CANCELLED and str(order.refund_due) == shown
    assert not order.allocations.filter(released_at__isnull=True).exists()


def mailed_links(mail_dir: Path, order: Order, *, count: int, timeout: float = 30) -> list[str]:
    """The first `count` links to `order` in the e-mails the worker wrote to `mail_dir`, oldest first."""
    pattern = re.compile(rf"https?://[^\s/]+/orders/{re.escape(order.public_id)}/[A-Za-z0-9_-]+/")
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(mail_dir.glob("*.log"), key=lambda path: path.stat().st_mtime_ns) if mail_dir.exists() else []
        links = [link for path in files for link in pattern.findall(path.read_text())]
        if len(links) >= count or time.monotonic() > deadline:
            assert len(links) >= count, f"{len(links)} link(s) mailed, {count} expected"
            return links[:count]
        time.sleep(0.2)


def test_revoking_the_links_and_asking_for_them_again_mail_links_that_open_the_order(
    researcher, live_server, live_chain, catalog, start_celery_worker, tmp_path
):
    page = researcher
    _chain, chains_path = live_chain
    mail_dir = tmp_path / "mail"
    start_celery_worker(
        PAYMENTS_CHAINS_FILE=str(chains_path), SITE_URL=live_server.url, EMAIL_URL=f"filemail:///{mail_dir}"
    )
    order = place_order(page, live_server.url, email="revoke@example.org")
    leaked_address = page.url
    (booking_mail_link,) = mailed_links(mail_dir, order, count=1)  # a link of its own (the worker mints it)

    # Revoke: every link stops working, the one in the address bar included; a new one is mailed.
    submitted(page, page.get_by_role("button", name="Revoke every link to this order"))
    assert "Every link to order" in page.inner_text("main")
    assert order.events.filter(reason="links revoked").exists()

    # The answer's language switch (the answer is sent under the order page's policy too), then back to English.
    with page.expect_navigation():
        page.select_option("#language-select", "fr")
    assert not page.refused, f"refused (403): {page.refused}"
    assert page.get_attribute("html", "lang") == "fr"
    with page.expect_navigation():
        page.select_option("#language-select", "en")
    assert page.get_attribute("html", "lang") == "en"

    assert page.goto(leaked_address).status == 404 and page.goto(booking_mail_link).status == 404
    _booked, new_link = mailed_links(mail_dir, order, count=2)
    assert page.goto(new_link).status == 200 and order.public_id in page.inner_text("h1")

    # Find my order: the form answers the same for everyone, and the links come by e-mail.
    page.goto(live_server.url + "/orders/resend-link/")
    page.fill("input[name=email]", "revoke@example.org")
    submitted(page, page.get_by_role("button", name="Send me my order links"))
    assert "a message with their links is on its way" in page.inner_text("main")
    *_earlier, resent_link = mailed_links(mail_dir, order, count=3)
    assert page.goto(resent_link).status == 200 and order.public_id in page.inner_text("h1")


def test_the_sold_out_page_books_the_next_date_or_goes_back_to_the_form(researcher, live_server, live_chain, catalog):
    page = researcher
    place_order(page, live_server.url, lots="6", email="first@example.org")
    page.goto(live_server.url + "/")
    fill_booking(page, lots="1", email="second@example.org")
    submitted(page, page.get_by_role("button", name="Place the order and hold the lots"))
    assert "Sold out" in page.inner_text("#sold-out")

    submitted(page, page.get_by_role("button", name="Change my choices"))
    assert page.input_value("input[name=contact_email]") == "second@example.org"
    page.go_back()

    next_date = page.locator(".next-dates button").first
    day = next_date.get_attribute("value")
    submitted(page, next_date, to=ORDER_URL)
    order = Order.objects.get(contact_email="second@example.org")
    assert order.starts_at.date().isoformat() == day and order.status == OrderStatus.AWAITING_PAYMENT


class _Recorder(BaseHTTPRequestHandler):
    """Another site: it keeps the headers of every request it receives."""

    received: list[dict[str, str]]

    def do_GET(self):
        self.received.append({**dict(self.headers), "path": self.path})
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"another site")

    def log_message(self, format, *args):
        pass


@pytest.fixture
def another_site():
    handler = type("Recorder", (_Recorder,), {"received": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.received
    server.shutdown()
    server.server_close()


def test_a_link_followed_from_the_order_page_tells_the_other_site_nothing(
    researcher, live_server, live_chain, catalog, another_site
):
    """A link on the order page (a block explorer, a pasted address in a message) must not carry the page's
    address: the other site's logs would hold the order's key."""
    page = researcher
    place_order(page, live_server.url, email="leak@example.org")
    token = page.url.rstrip("/").rsplit("/", 1)[1]
    url, received = another_site

    page.evaluate(
        "url => { const a = document.createElement('a'); a.href = url; a.id = 'away'; a.textContent = 'away';"
        " document.querySelector('main').append(a); }",
        url + "/explorer",
    )
    with page.expect_navigation(url=url + "/explorer"):
        page.click("#away")

    # Chromium may also fetch the other site's /favicon.ico, sooner or later: every request is checked.
    assert [request["path"] for request in received if request["path"] != "/favicon.ico"] == ["/explorer"]
    for request in received:
        headers = {name.lower(): value for name, value in request.items()}
        if request["path"] == "/explorer":  # the navigation from the order page: no referrer at all
            assert "referer" not in headers, headers
        else:  # the favicon, fetched for the other site's own page: at most that page as its referrer
            assert headers.get("referer", url).startswith(url), headers
        assert not any(token in value for value in headers.values())


def test_the_booking_form_asks_the_method_first_and_a_30_day_campaign_its_plan(researcher, live_server, catalog):
    page = researcher
    page.goto(live_server.url + "/")
    fields = ["sharing", "hypothesis", "hypothesis_detail", "hypothesis_measure", "hardware_class", "days"]
    tops = [page.locator(f"[name={name}]").first.bounding_box()["y"] for name in fields]
    assert tops == sorted(tops), dict(zip(fields, tops, strict=True))

    # The plan's fields are asked only once 30 days are chosen.
    assert not page.is_visible("input[name=checkpoint_interval_hours]")
    fill_booking(page, lots="1", email="campaign@example.org")
    page.check("input[name=days][value='30']")
    assert page.is_visible("input[name=checkpoint_interval_hours]")

    # Sent without the plan or the measure: the form comes back and says what is missing, nothing typed is lost.
    page.fill("textarea[name=hypothesis_measure]", "")
    submitted(page, page.locator("button.button-primary"))
    errors = page.inner_text(".booking-form")
    assert "Say which measure would confirm your hypothesis." in errors
    assert "A 30-day campaign checkpoints regularly: give the interval." in errors
    assert "A 30-day campaign needs its stop criteria" in errors
    assert page.input_value("textarea[name=hypothesis_detail]").startswith("A 13B model trains at all")
    assert not Order.objects.filter(contact_email="campaign@example.org").exists()

    page.fill("textarea[name=hypothesis_measure]", "The run completes at 1,000 tokens per second or more.")
    page.fill("input[name=checkpoint_interval_hours]", "6")
    page.fill("textarea[name=stop_criteria]", "Validation loss flat for three days.")
    submitted(page, page.locator("button.button-primary"), to=ORDER_URL)

    order = Order.objects.get(contact_email="campaign@example.org")
    assert (order.days, order.sharing, order.hypothesis) == (30, "parameters_sharded", "make_possible")
    assert (order.checkpoint_interval_hours, order.stop_criteria) == (6, "Validation loss flat for three days.")
    assert "A checkpoint every 6 hours" in page.inner_text("body")


def test_a_researcher_extends_the_window_then_ends_it_early(researcher, live_server, live_chain, catalog, admin_user):
    page = researcher
    order = place_order(page, live_server.url, email="window@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    page.reload()
    end = order.ends_at

    page.locator("#your-window input[name=days][value='7']").check()
    submitted(page, page.get_by_role("button", name="Extend and pay"), to=ORDER_URL)
    assert "The lots are held for your extension" in page.inner_text("ul.messages")
    extension = order.invoices.get(purpose="extension")
    assert extension.extension_days == 7 and extension.deposit_address in page.content().lower()

    # the browser's own check holds the form until the box is ticked; then the window ends
    page.get_by_role("button", name="End my window now").click()
    order.refresh_from_db()
    assert order.status == OrderStatus.READY and order.ends_at == end
    page.get_by_label("I saved my results and checkpoints: end my window now.").check()
    submitted(page, page.get_by_role("button", name="End my window now"), to=ORDER_URL)
    assert "Your window is ended" in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.status == OrderStatus.ENDED
    assert not order.allocations.filter(released_at__isnull=True).exists()


def test_a_researcher_adds_a_collaborator_s_key_then_removes_their_own(
    researcher, live_server, live_chain, catalog, admin_user
):
    page = researcher
    order = place_order(page, live_server.url, email="keys@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    page.reload()
    own = order.ssh_keys.get()

    page.fill("textarea#add-keys", make_ssh_key())
    submitted(page, page.get_by_role("button", name="Add keys"))
    assert "Keys saved." in page.inner_text("ul.messages")
    collaborator = order.ssh_keys.exclude(pk=own.pk).get()
    assert collaborator.fingerprint in page.inner_text("ul.keys")

    submitted(page, page.locator(f"button[name=remove][value='{own.pk}']"))
    assert list(order.ssh_keys.values_list("pk", flat=True)) == [collaborator.pk]
    assert own.fingerprint not in page.inner_text("ul.keys")


def test_a_researcher_corrects_the_billing_details_then_downloads_the_invoice(
    researcher, live_server, live_chain, catalog, admin_user
):
    from payments.models import FiscalInvoice
    from tests.builders.payments import pdf_text

    page = researcher
    order = place_order(page, live_server.url, email="billing@example.org")

    page.fill("#billing input[name=organisation]", "Institut Pasteur")
    page.fill("#billing input[name=vat_number]", "FR 40 303 265 045")
    submitted(page, page.get_by_role("button", name="Save the billing details"))
    assert "Billing details saved." in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert (order.organisation, order.vat_number) == ("Institut Pasteur", "FR40303265045")

    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    page.reload()
    assert page.locator("#billing form").count() == 0  # issued: the details can no longer change
    with page.expect_download() as download:
        page.click("#billing a[download]")
    pdf = Path(download.value.path()).read_bytes()
    fiscal_invoice = FiscalInvoice.objects.get(order=order)
    assert download.value.suggested_filename == f"invoice-{fiscal_invoice.number}.pdf"
    text = pdf_text(pdf)
    assert fiscal_invoice.number in text and "Institut Pasteur" in text and "FR40303265045" in text


def _until(condition, *, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_researcher_books_again_with_the_data_of_an_ended_order(
    researcher, live_server, live_chain, catalog, admin_user, worker_and_beat
):
    from datetime import timedelta

    from booking.services import order_end_early
    from provisioning.runs import provisioning_start
    from provisioning.services import order_approve

    page = researcher
    # given: an order prepared on the demo's dry-run hosts by the worker, then ended early: its data is kept
    order = place_order(page, live_server.url, lots="2", email="again@example.org")
    order_url = page.url
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    order_approve(order=order, actor=admin_user)
    provisioning_start(order=order, actor=admin_user)
    _until(lambda: Order.objects.get(pk=order.pk).status == OrderStatus.READY)
    order_end_early(order=order)
    _until(lambda: order.accesses.filter(status="revoked").exists())

    # when: the researcher follows "Book again with my data" and books a later window, the box ticked for them
    page.goto(order_url)
    with page.expect_navigation():
        page.get_by_role("link", name="Book again with my data").click()
    assert page.is_checked("input[name=carry_data]")
    assert page.input_value("input[name=contact_email]") == "again@example.org"
    page.fill("input[name=start_date]", (order.starts_at.date() + timedelta(days=10)).isoformat())
    page.fill("textarea[name=billing_address]", "12 rue de la Paix\n75002 Paris")
    page.fill("input[name=billing_country]", "FR")
    page.check("input[name=sharing][value='parameters_sharded']")
    page.check("input[name=hypothesis][value='make_possible']")
    page.fill("textarea[name=hypothesis_detail]", "The campaign resumes from the trial's checkpoints.")
    page.fill("textarea[name=hypothesis_measure]", "The loss keeps falling from where the trial left it.")
    page.check("input[name=accept_terms]")
    submitted(page, page.locator("button.button-primary"), to=ORDER_URL)

    # then: the new order carries the data, on the machine that keeps it
    carried = Order.objects.get(carry_data_from=order)
    assert page.url.split("/")[-3] == carried.public_id
    assert f"Carried from order {order.public_id}" in page.inner_text("#carried-data")
    host = order.accesses.get().host
    assert {allocation.lot.host for allocation in carried.allocations.all()} == {host}


def test_a_researcher_beyond_the_unconfirmed_share_confirms_their_address_and_books(
    researcher, live_server, live_chain, catalog, booking_data, start_celery_worker, tmp_path, admin_user
):
    from django.test import Client

    from booking.models import BookingPolicy
    from tests.builders.orders import _paid_before, place

    _chain, chains_path = live_chain
    mail_dir = tmp_path / "mail"
    start_celery_worker(
        PAYMENTS_CHAINS_FILE=str(chains_path), SITE_URL=live_server.url, EMAIL_URL=f"filemail:///{mail_dir}"
    )
    policy = BookingPolicy.current()
    policy.unconfirmed_share_percent = 50  # the default: 3 of the 6 B200 lots (the catalog fixture opens all)
    policy.save()
    _paid_before(booking_data, admin_user, "ada@lab.example")  # the share binds contacts who never paid
    for number in range(3):  # strangers hold the share, with addresses nobody confirms
        place(Client(REMOTE_ADDR=f"198.51.100.{number + 1}"), booking_data(lots="1", contact_email=f"x{number}@t.ex"))
    page = researcher
    page.goto(live_server.url + "/")
    fill_booking(page, lots="1", email="ada@lab.example")
    submitted(page, page.get_by_role("button", name="Place the order and hold the lots"))
    assert "may hold 3 of the 6 NVIDIA B200 pair lots" in page.inner_text("#field-contact_email")

    submitted(page, page.get_by_role("button", name="E-mail me a confirmation link"))
    assert "A link is on its way to ada@lab.example" in page.inner_text("#confirmation-sent")
    assert page.input_value("input[name=contact_email]") == "ada@lab.example"
    link = _mailed_confirmation_link(mail_dir)
    tab = page.context.new_page()  # the e-mail opened in the same browser
    tab.goto(link)
    assert "ada@lab.example is confirmed in this browser" in tab.inner_text("#address-confirmed")
    tab.close()

    page.check("input[name=accept_terms]")
    submitted(page, page.get_by_role("button", name="Place the order and hold the lots"), to=ORDER_URL)
    order = Order.objects.filter(contact_email="ada@lab.example").latest("pk")  # after the paid one
    assert order.status == OrderStatus.AWAITING_PAYMENT and order.email_verified_at is not None


def _mailed_confirmation_link(mail_dir: Path, timeout: float = 30) -> str:
    pattern = re.compile(r"https?://[^\s/]+/orders/address-confirmed/[^\s/]+/")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [link for path in mail_dir.glob("*.log") for link in pattern.findall(path.read_text())]
        if found:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError("no confirmation link was mailed")


def test_the_fit_advice_follows_the_hypothesis_as_the_researcher_changes_it(researcher, live_server, catalog):
    page = researcher
    page.goto(live_server.url + "/")
    # given: the advice for a 1B model, asked before any hypothesis is chosen
    page.fill("input[name=fit-parameters_billion]", "1")
    advice = page.locator("#fit-advice")
    advice.get_by_text("How this was computed").wait_for(timeout=15000)
    assert "independent" not in advice.inner_text()

    # when: the researcher then says what they want to learn, and changes their mind
    page.check("input[name=hypothesis][value='compare_hyperparameters']")
    # then: the advice follows each answer without touching the advisor's fields
    advice.get_by_text("run two independent single-card experiments").wait_for(timeout=15000)
    page.check("input[name=hypothesis][value='bigger_batch']")
    advice.get_by_text("For a bigger global batch or a shorter step, data parallelism fits").wait_for(timeout=15000)


def test_a_researcher_books_from_the_calendar_to_start_as_soon_as_ready(researcher, live_server, live_chain, catalog):
    page = researcher
    page.goto(live_server.url + "/")
    page.get_by_role("link", name="Availability").click()
    page.wait_for_url(re.compile(r".*/calendar/$"))

    # a day of the calendar fills the booking page's date
    page.select_option("select[name=hardware_class]", "h200-pair")
    submitted(page, page.get_by_role("button", name="Show"))
    day = page.locator("td.free a").nth(3)
    chosen = day.get_attribute("data-start-date")
    submitted(page, day)
    assert page.input_value("input[name=start_date]") == chosen
    assert page.input_value("input[name=hardware_class]:checked") == "h200-pair"

    # the calendar's earliest start books a window that starts as soon as ready
    page.go_back()
    submitted(page, page.get_by_role("link", name="Book to start as soon as ready"))
    assert page.is_checked("input[name=start_when_ready]")
    fill_booking(page, lots="1", email="today@example.org")
    page.locator("#quote").get_by_text("starts as soon as your machines are ready").wait_for(timeout=15000)
    submitted(page, page.locator("button.button-primary"), to=ORDER_URL)
    order = Order.objects.get(contact_email="today@example.org")
    assert order.start_when_ready and order.hardware_class.slug == "h200-pair"
    assert order.starts_at.minute == 0 and order.starts_at.second == 0
    assert "7 days from the hand-over: as soon as your machines are ready" in page.inner_text("#window")


def test_an_archcheck_report_given_on_the_booking_page_says_which_cards_run_it_then_stays_with_the_order(
    researcher, live_server, live_chain, catalog, tmp_path
):
    page = researcher
    report = {
        "schema": "binome.archcheck/1",
        "read": 2,
        "extensions": [
            {"name": "flash_attn/flash_attn_cuda.so", "vendor": "nvidia", "archs": ["sm_100", "sm_90"],
             "b200": "native", "h200": "native", "mi300x": "other_vendor"},
            {"name": "hopper_only/_kernels.so", "vendor": "nvidia", "archs": ["sm_90"],
             "b200": "missing", "h200": "native", "mi300x": "other_vendor"},
        ],
    }  # fmt: skip
    (tmp_path / "report.json").write_text(json.dumps(report))
    page.goto(live_server.url + "/")
    page.set_input_files("input[name=archcheck_report]", str(tmp_path / "report.json"))
    verdict = page.locator("#archcheck-verdict")
    verdict.get_by_text('TORCH_CUDA_ARCH_LIST="10.0"').wait_for(timeout=15000)
    assert "NVIDIA H200 pair (sm_90): runs your extensions" in verdict.inner_text()

    fill_booking(page, lots="1", email="extensions@example.org")
    submitted(page, page.locator("button.button-primary"), to=ORDER_URL)
    assert "Rebuild hopper_only/_kernels.so with" in page.inner_text("#archcheck")
    order = Order.objects.get(contact_email="extensions@example.org")
    assert len(order.archcheck_report["extensions"]) == 2


def test_a_researcher_names_the_checkpoint_directory_then_stops_the_alert_mails(
    researcher, live_server, live_chain, catalog, admin_user
):
    page = researcher
    order = place_order(page, live_server.url, email="watch@example.org")
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="paid by bank transfer")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    page.reload()

    page.fill("#id_checkpoint_dir", "~/runs/ckpt")
    page.fill("#id_checkpoint_interval_hours", "3")
    submitted(page, page.locator("#checkpoints button[type=submit]"))
    assert "~/runs/ckpt is watched every 3 hours" in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert (order.checkpoint_dir, order.checkpoint_watch_interval_hours) == ("runs/ckpt", 3)

    page.fill("#id_checkpoint_dir", "../../etc")  # refused, and what was saved stays
    submitted(page, page.locator("#checkpoints button[type=submit]"))
    assert "inside your home" in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.checkpoint_dir == "runs/ckpt"

    page.get_by_label("once per window").check()
    submitted(page, page.locator("#alert-mails").get_by_role("button", name="Save"))
    assert "come once per window" in page.inner_text("ul.messages")
    submitted(page, page.get_by_role("button", name="Stop these e-mails"))
    assert "No more e-mails about your cards" in page.inner_text("ul.messages")
    order.refresh_from_db()
    assert order.alert_mails == "off" and page.refused == []
