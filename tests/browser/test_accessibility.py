"""Pages everyone can use: axe-core (npm, the engine of the browsers' accessibility audits) run in Chromium on every
customer page and the operator console, against WCAG 2 (and 2.1) levels A and AA, at a desktop's width and a phone's:
no serious or critical finding."""

import json
from pathlib import Path

import pytest
from django.urls import reverse

from booking.models import OrderStatus
from booking.services import order_transition
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.browser.steps import log_in, place_order

pytestmark = pytest.mark.integration

AXE = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
RUN = """async () => {
    const levels = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"];
    const found = await axe.run(document, {runOnly: {type: "tag", values: levels}});
    return found.violations
        .filter((rule) => rule.impact === "serious" || rule.impact === "critical")
        .map((rule) => ({id: rule.id, impact: rule.impact, help: rule.help,
                          nodes: rule.nodes.slice(0, 5).map((node) => node.target.join(" "))}));
}"""


def findings(page, url: str) -> list[dict]:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    page.add_script_tag(path=str(AXE))
    return page.evaluate(RUN)


@pytest.mark.parametrize("width", list(WIDTHS))
def test_every_page_meets_wcag_2_a_and_aa_without_serious_findings(
    new_page, live_server, live_chain, catalog, admin_user, operator, width
):
    assert AXE.exists(), "axe-core is missing: `make setup` installs the npm packages"
    page = new_page(viewport=WIDTHS[width], bypass_csp=True)  # axe is injected into the page
    page.on("dialog", lambda dialog: dialog.accept())
    base = live_server.url
    order = place_order(page, base, email=f"axe-{width}@example.org")
    order_address = page.url
    pages = {
        "booking page": base + reverse("customer:book"),
        "booking, as soon as ready": base + reverse("customer:book") + "?start_when_ready=on&hardware_class=h200-pair",
        "calendar": base + reverse("customer:calendar"),
        "guide": base + reverse("customer:guide"),
        "fit advisor": base + reverse("customer:fit") + "?fit-parameters_billion=13",
        "find my order": base + reverse("customer:resend-link"),
        "terms": base + reverse("customer:terms", kwargs={"document": "terms"}),
        "order, awaiting payment": order_address,
    }
    found = {name: findings(page, url) for name, url in pages.items()}
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    found["order, paid"] = findings(page, order_address)
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    found["order, ready"] = findings(page, order_address)
    page.context.add_cookies([{"name": "django_language", "value": "fr", "url": base}])
    found["order, ready, in French"] = findings(page, order_address)
    found["guide, in French"] = findings(page, base + reverse("customer:guide"))
    page.context.clear_cookies()

    log_in(page, base + reverse("console:queue"), operator.username)
    for name, url in {
        "console queue": reverse("console:queue"),
        "console order": reverse("console:order", kwargs={"public_id": order.public_id}),
        "console hosts": reverse("console:hosts"),
        "console host": reverse("console:host", kwargs={"name": "b200-node-01"}),
        "console calendar": reverse("console:calendar"),
        "console reports": reverse("console:reports"),
    }.items():
        found[name] = findings(page, base + url)

    serious = {name: rules for name, rules in found.items() if rules}
    assert serious == {}, json.dumps(serious, indent=1)
