"""The split-trial report on the order page: uploaded by the researcher, validated, shown as a table and a chart."""

import html
import json
import subprocess
import sys

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import translation

from booking.models import OrderStatus, SplitTrialReport
from booking.services import order_transition
from booking.split_trial_conclusion import split_trial_conclusion
from nodekit.bundle import script_bytes
from payments.selectors import current_invoice
from payments.settlement import invoice_mark_paid
from tests.builders.orders import place
from tests.nodekit.shipped import shipped_script

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def kit_report(tmp_path_factory) -> bytes:
    """A real report: the kit run on the CPU with gloo and two processes, as CI can."""
    output = tmp_path_factory.mktemp("kit") / "report.json"
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            str(shipped_script("split_trial")),
            "--device",
            "cpu",
            "--examples",
            "64",
            "--batch",
            "16",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--hidden",
            "32",
            "--layers",
            "2",
            "--output",
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return output.read_bytes()


@pytest.fixture
def ready_order(client, catalog, booking_data, admin_user):
    order, token = place(client, booking_data(lots="1"))
    invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test")
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        order_transition(order=order, to_status=status, actor_kind="system")
    return order, token


def upload(client, order, token, content: bytes, name: str = "report.json"):
    url = reverse("customer:order-split-trial", kwargs={"public_id": order.public_id, "token": token})
    return client.post(url, {"report": SimpleUploadedFile(name, content, "application/json")}, follow=True)


def test_a_kit_report_is_kept_and_shown_as_a_table_and_a_chart(client, ready_order, kit_report):
    order, token = ready_order
    response = upload(client, order, token, kit_report)

    assert response.status_code == 200
    saved = SplitTrialReport.objects.get(order=order)
    page = html.unescape(response.content.decode())
    assert "Split-trial report added to your order." in page
    order.refresh_from_db()
    with translation.override("en"):
        english = split_trial_conclusion(report=saved.report, hypothesis=order.hypothesis, sharing=order.sharing)
    assert english["sentence"] in page  # the portal's conclusion, beside the hypothesis written at booking
    assert f"Your hypothesis at booking: {order.get_hypothesis_display()}" in page
    assert order.hypothesis_measure and order.hypothesis_measure in page  # the measure the researcher wrote
    assert page.count("<svg") >= 3
    for way in ("data parallel (DDP)", "parameters sharded (FSDP)", "layers split (pipeline)"):
        assert way in page
    assert json.loads(kit_report)["environment"]["backend"] == "gloo"

    # the same report on the French page: the conclusion is written in French
    french_page = html.unescape(client.get(response.redirect_chain[-1][0], HTTP_ACCEPT_LANGUAGE="fr").content.decode())
    with translation.override("fr"):
        french = split_trial_conclusion(report=saved.report, hypothesis=order.hypothesis, sharing=order.sharing)
    assert french["sentence"] != english["sentence"]
    assert french["sentence"] in french_page and english["sentence"] not in french_page
    assert "parallélisme de données (DDP)" in french_page


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not json at all", "not a JSON report written by the split-trial kit"),
        (b'{"schema": "something/else"}', "This is not a report of the split-trial kit"),
        (b'{"schema": "binome.split-trial/1", "x": NaN}', "not a finite, plausible measurement"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b" " * 257_000, "too large"),  # larger bodies are refused unread: tests/portal/test_request_limits.py
    ],
)
def test_a_malformed_or_hostile_report_is_refused_and_nothing_saved(client, ready_order, content, message):
    order, token = ready_order
    response = upload(client, order, token, content)

    assert response.status_code == 200
    assert message in html.unescape(response.content.decode())
    assert not SplitTrialReport.objects.exists()


def test_the_kit_can_be_downloaded(client, catalog):
    response = client.get(reverse("customer:split-trial-kit"))
    assert response.status_code == 200 and b"split" in response.content
    assert response["Content-Disposition"] == 'attachment; filename="split_trial.py"'
    assert response.content == script_bytes("split_trial")  # the shipped single file, as the nodes get it


def test_uploads_need_the_order_token(client, ready_order, kit_report):
    order, _token = ready_order
    url = reverse("customer:order-split-trial", kwargs={"public_id": order.public_id, "token": "x" * 43})
    assert client.post(url, {"report": SimpleUploadedFile("r.json", kit_report)}).status_code == 404
    assert not SplitTrialReport.objects.exists()
