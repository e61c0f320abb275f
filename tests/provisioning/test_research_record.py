"""The research record at a window's end: a PDF and a JSON in the order's language, the JSON signed with the portal's
Ed25519 key (libsodium) and checked here by another implementation (`cryptography`) and by openssl as the order page
writes it; mailed at the end, kept on the order page until the files are deleted."""

import hashlib
import html
import io
import json
import re
import subprocess
from datetime import timedelta

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from django.core import mail
from django.urls import reverse
from django.utils import timezone
from pypdf import PdfReader

from booking.models import Order, OrderStatus, SplitTrialReport
from booking.services import order_transition
from provisioning import research_record
from provisioning.lifecycle import lifecycle_tick
from provisioning.models import Access, GpuReading, ResearchRecord, WatchAlert
from tests.builders.orders import make_ready_order, order_url

pytestmark = pytest.mark.django_db


@pytest.fixture
def ended(client, booking_data, admin_user, django_capture_on_commit_callbacks):
    """A window that ran (handed over, read every minute for two hours, one alert), then ended; no record yet."""

    def make(language: str = "en"):
        order, token = make_ready_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
        order.language = language
        order.hypothesis_detail = "Sharding the optimizer states lets the 70B model train at batch 8 on two cards."
        order.save(update_fields=["language", "hypothesis_detail"])
        order_transition(order=order, to_status=OrderStatus.ACTIVE, actor_kind="system")
        access = order.accesses.get()
        assert access.ready_at is not None
        GpuReading.objects.bulk_create(
            GpuReading(
                access=access,
                taken_at=order.starts_at + timedelta(minutes=minute),
                gpus=[[0, 90, 150000, 184320, 700, 70], [1, 2, 3000, 184320, 120, 40]],
            )
            for minute in range(120)
        )
        WatchAlert.objects.create(
            order=order, kind="imbalance", started_at=order.starts_at, last_seen_at=order.starts_at, idle_cards=[]
        )
        SplitTrialReport.objects.create(order=order, report={"conclusion": "Two cards: 1.8x the single-card rate."})
        order_transition(order=order, to_status=OrderStatus.ENDED, actor_kind="system")
        return order, token

    return make


def _issue(order, capture):
    with capture(execute=True):
        counts = lifecycle_tick(now=order.ends_at + timedelta(minutes=5))
    return counts


def test_the_record_is_signed_mailed_and_checked_by_another_implementation(
    ended, client, django_capture_on_commit_callbacks
):
    order, _token = ended()
    mail.outbox.clear()
    assert _issue(order, django_capture_on_commit_callbacks)["records_issued"] == 1
    assert _issue(order, django_capture_on_commit_callbacks)["records_issued"] == 0  # once
    record = ResearchRecord.objects.get(order=order)

    message = mail.outbox[-1]
    assert message.to == [order.contact_email] and "research record" in message.subject
    files = {name: content for name, content, _type in message.attachments}
    stem = f"binome-{order.public_id}-record"
    assert set(files) == {f"{stem}.pdf", f"{stem}.json", f"{stem}.json.sig"}

    # the public key anyone downloads, and a separate implementation of Ed25519
    pem = client.get(reverse("customer:record-signing-key"))
    assert pem.status_code == 200 and pem.content.startswith(b"-----BEGIN PUBLIC KEY-----")
    public_key = load_pem_public_key(pem.content)
    document, signature = files[f"{stem}.json"], files[f"{stem}.json.sig"]
    public_key.verify(signature, document)  # raises if it does not hold
    for position in (0, len(document) // 2, len(document) - 2):  # one byte changed anywhere: refused
        changed = bytearray(document)
        changed[position] ^= 0x01
        with pytest.raises(InvalidSignature):
            public_key.verify(signature, bytes(changed))

    facts = json.loads(document)
    assert facts["order"] == order.public_id and facts["format"] == "binome-research-record/1"
    assert facts["pdf_sha256"] == hashlib.sha256(files[f"{stem}.pdf"]).hexdigest()
    assert facts["research"]["hypothesis_in_words"] == order.hypothesis_detail
    assert facts["hardware"]["cards"] == 2 and facts["gpu_hours"]["read"] == 4.0 and facts["gpu_hours"]["busy"] == 2.0
    assert facts["gpu_hours"]["booked"] == 2 * order.days * 24
    assert [card["energy_kwh"] for card in facts["readings"]] == [1.4, 0.24]
    assert facts["split_trial"]["sentence"] == "Two cards: 1.8x the single-card rate."
    assert facts["split_trial"]["source"] == "uploaded by the researcher"  # their figures, not the portal's
    assert [alert["kind"] for alert in facts["alerts"]] == ["imbalance"]
    assert facts["signature"]["key_id"] == record.key_id == research_record.key_id()

    # the PDF, parsed back
    text = " ".join(page.extract_text() for page in PdfReader(io.BytesIO(files[f"{stem}.pdf"])).pages)
    text = " ".join(text.split())
    assert f"Research record of order {order.public_id}" in text
    assert "lets the 70B model train at batch 8" in text
    assert "researcher uploaded (its figures are theirs, not measured by Binôme): Two cards: 1.8x" in text
    assert "GPU-hours" in text and "4.0 read by the minute" in text


def test_the_order_page_keeps_it_until_the_files_are_deleted(ended, client, django_capture_on_commit_callbacks):
    order, token = ended()
    other, other_token = ended()
    assert _issue(order, django_capture_on_commit_callbacks)["records_issued"] == 2  # both ended orders
    record = ResearchRecord.objects.get(order=order)
    page = client.get(order_url(order, token)).content.decode()
    assert 'id="record"' in page and "Your research record" in page
    for kind, field in (("pdf", "pdf"), ("json", "document"), ("sig", "signature")):
        url = reverse("customer:order-record", kwargs={"public_id": order.public_id, "token": token, "kind": kind})
        answer = client.get(url)
        assert answer.status_code == 200 and answer.content == bytes(getattr(record, field))
        assert "private" in answer["Cache-Control"]
        # another order's link, and a kind that is none, find nothing
        assert client.get(url.replace(token, other_token)).status_code == 404
    for hostile in ("exe", "pdf%00", "..", "x" * 300):
        url = reverse("customer:order-record", kwargs={"public_id": order.public_id, "token": token, "kind": "pdf"})
        assert client.get(url[: -len("pdf")] + hostile).status_code == 404

    Access.objects.filter(order=order).update(wiped_at=timezone.now())
    assert _issue(order, django_capture_on_commit_callbacks)["records_deleted"] == 1
    assert not ResearchRecord.objects.filter(order=order).exists()
    assert 'id="record"' not in client.get(order_url(order, token)).content.decode()
    url = reverse("customer:order-record", kwargs={"public_id": order.public_id, "token": token, "kind": "pdf"})
    assert client.get(url).status_code == 404
    assert ResearchRecord.objects.filter(order=other).exists()  # the other order's files are kept: so is its record


def test_the_order_page_s_checks_run_as_written(ended, client, tmp_path, django_capture_on_commit_callbacks):
    """The page's two command lines, typed as written in a directory holding the four files as they download."""
    order, token = ended()
    _issue(order, django_capture_on_commit_callbacks)
    page = client.get(order_url(order, token)).content.decode()
    section = page[page.index('id="record"') :]
    block = html.unescape(re.search(r"<pre><code>(.*?)</code></pre>", section, re.S)[1])
    verify, digest = block.splitlines()
    for href in re.findall(r'href="([^"]+)"', section[: section.index("</ul>")]):
        answer = client.get(html.unescape(href))
        name = re.search(r'filename="([^"]+)"', answer["Content-Disposition"])[1]
        (tmp_path / name).write_bytes(answer.content)

    checked = subprocess.run(verify, shell=True, cwd=tmp_path, capture_output=True, text=True, check=False)  # noqa: S602
    assert checked.returncode == 0 and "Signature Verified Successfully" in checked.stdout, checked.stderr
    summed = subprocess.run(digest, shell=True, cwd=tmp_path, capture_output=True, text=True, check=False)  # noqa: S602
    facts = json.loads((tmp_path / f"binome-{order.public_id}-record.json").read_bytes())
    assert summed.stdout.split()[0] == facts["pdf_sha256"]

    document = tmp_path / f"binome-{order.public_id}-record.json"
    document.write_bytes(document.read_bytes().replace(b'"days": ', b'"days": 1'))  # a window made longer
    refused = subprocess.run(verify, shell=True, cwd=tmp_path, capture_output=True, text=True, check=False)  # noqa: S602
    assert refused.returncode != 0 and "Signature Verified Successfully" not in refused.stdout


def test_a_french_order_gets_a_french_record(ended, django_capture_on_commit_callbacks):
    order, _token = ended("fr")
    mail.outbox.clear()
    _issue(order, django_capture_on_commit_callbacks)
    message = mail.outbox[-1]
    assert "dossier de recherche" in message.subject.lower(), message.subject
    pdf = next(content for name, content, _type in message.attachments if name.endswith(".pdf"))
    text = " ".join(" ".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages).split())
    assert f"Dossier de recherche de la commande {order.public_id}" in text and "Research record" not in text
    facts = json.loads(next(content for name, content, _type in message.attachments if name.endswith(".json")))
    assert facts["language"] == "fr"


def test_a_record_that_cannot_be_issued_is_not_in_the_way_of_the_others_or_of_the_sweep(
    ended, django_capture_on_commit_callbacks, monkeypatch, caplog
):
    """A bug in one order's record (here its facts cannot be read) is logged and left alone for an hour: the other
    orders' records are issued, and the sweep's other parts (failed teardowns retried, abandoned runs resumed) run."""
    broken, _token = ended()
    fine, _token = ended()
    facts = research_record.record_facts

    def failing(order, **kwargs):
        if order.pk == broken.pk:
            raise ValueError("a bug in one order's record")
        return facts(order, **kwargs)

    monkeypatch.setattr(research_record, "record_facts", failing)
    counts = _issue(broken, django_capture_on_commit_callbacks)
    assert counts["records_issued"] == 1 and {"retried", "resumed"} <= counts.keys()
    assert (
        ResearchRecord.objects.filter(order=fine).exists() and not ResearchRecord.objects.filter(order=broken).exists()
    )
    assert "could not be issued" in caplog.text
    monkeypatch.setattr(research_record, "record_facts", facts)
    assert _issue(broken, django_capture_on_commit_callbacks)["records_issued"] == 0  # left alone for the hour


def test_a_moved_order_s_record_counts_the_cards_it_ended_on_once(
    client, catalog, booking_data, admin_user, operator, django_capture_on_commit_callbacks
):
    """Moved to another host mid-window (a provider fault): its record counts the two cards of the lot it ended on,
    not those of the lot it left as well."""
    from tests.builders.console import act
    from tests.builders.lots import free_lot, live_lots
    from tests.builders.teardown import make_provisioned

    order = make_provisioned(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    client.force_login(operator)
    (old,) = live_lots(order).values()
    target = free_lot(order, off_hosts=[old.host])
    act(client, order, "move", {"from_lot": old.pk, "to_lot": target.pk}, django_capture_on_commit_callbacks)
    order.refresh_from_db()
    order_transition(order=order, to_status=OrderStatus.ACTIVE, actor_kind="system")
    order_transition(order=order, to_status=OrderStatus.ENDED, actor_kind="system")
    _issue(order, django_capture_on_commit_callbacks)
    facts = json.loads(bytes(ResearchRecord.objects.get(order=order).document))
    assert facts["hardware"]["cards"] == 2 and [lot["lot"] for lot in facts["hardware"]["lots"]] == [target.name]
    assert facts["gpu_hours"]["booked"] == 2 * order.days * 24


def test_orders_whose_record_fails_do_not_hold_back_those_behind_them(
    ended, django_capture_on_commit_callbacks, monkeypatch
):
    """Five older orders whose PDF cannot be printed, then a sixth: with one record a sweep, the sixth has its record
    within three sweeps (a failure takes a try, not a record's place), and the five are left alone for the hour."""
    monkeypatch.setattr(research_record, "ISSUED_PER_SWEEP", 1)
    orders = [ended()[0] for _ in range(6)]
    for position, order in enumerate(orders):
        Order.objects.filter(pk=order.pk).update(ends_at=orders[0].ends_at + timedelta(minutes=position))
    bad = {order.pk for order in orders[:5]}
    printed = research_record._pdf

    def pdf(order, facts):
        if order.pk in bad:
            raise RuntimeError("the page cannot be laid out")
        return printed(order, facts)

    monkeypatch.setattr(research_record, "_pdf", pdf)
    for sweep in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            research_record.records_issue_due(now=orders[0].ends_at + timedelta(minutes=sweep))
    assert list(ResearchRecord.objects.values_list("order_id", flat=True)) == [orders[5].pk]
