"""The research record at a window's end: what was rented (lots, cards, window), in which environment (the image and
its pinned id), the pre-flight result, the GPU-hours used, the hypothesis and measure as written at booking, the
split-trial verdict if a report was given, and the readings' summary. A JSON document (the facts, the PDF's SHA-256
among them) signed with the portal's Ed25519 key, and a PDF of the same facts to read and attach; both in the order's
language.

Anyone checks a record with the public key the portal serves (/records/signing-key.pem), for example with
`openssl pkeyutl -verify -pubin -inkey … -rawin -in record.json -sigfile record.json.sig`; the signature covers
the JSON's exact bytes, and the JSON names the PDF's SHA-256. The signing uses libsodium (PyNaCl); the tests check
it with another implementation (`cryptography`).

Issued by the lifecycle's sweep once an order handed over has ended (`records_issue_due`), mailed with its files,
kept on the order page until the order's files are deleted (`records_delete_wiped`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.dispatch import Signal
from django.utils import timezone, translation

from booking import links, notices
from booking.models import Order, OrderStatus
from booking.notices import Notice
from booking.split_trial_conclusion import split_trial_conclusion
from provisioning import enqueue
from provisioning.models import Access, ResearchRecord, WatchAlert
from provisioning.selectors import readings_summary

FORMAT = "binome-research-record/1"
# the DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410): the 32 bytes of the key follow
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
ISSUED_PER_SWEEP = 10  # a PDF is printed for each: the rest wait for the next tick
RETRY_AFTER_S = 3600  # a record that could not be issued is tried again after this
SCANNED_PER_SWEEP = 1000  # due orders looked at per sweep, those left alone after a failure passed over

logger = logging.getLogger(__name__)

# Asked for the PDF's page: one receiver (web/apps.py connects web/record_document.py), as for the invoices.
document_html = Signal()


def _signing_key():
    from nacl.signing import SigningKey

    try:
        seed = base64.b64decode(settings.RECORD_SIGNING_KEY, validate=True)
    except ValueError as exc:
        raise ImproperlyConfigured("RECORD_SIGNING_KEY is not base64") from exc
    if len(seed) != 32:
        raise ImproperlyConfigured("RECORD_SIGNING_KEY must hold 32 bytes (base64 of 32 random bytes)")
    return SigningKey(seed)


def public_key_bytes() -> bytes:
    return bytes(_signing_key().verify_key)


def public_key_pem() -> str:
    """The public key as PEM (SubjectPublicKeyInfo), as openssl and most libraries read it."""
    body = base64.b64encode(ED25519_SPKI_PREFIX + public_key_bytes()).decode()
    return f"-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n"


def key_id() -> str:
    """A short name of the public key: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(public_key_bytes()).hexdigest()[:16]


def _hours(seconds: float) -> float:
    return round(seconds / 3600, 2)


def record_facts(order: Order, *, issued_at: datetime) -> dict:
    """What the record says, as plain JSON values (numbers rounded, times UTC ISO 8601), in the order's language
    where it is words."""
    accesses = list(order.accesses.select_related("host").order_by("host__name"))
    # the lots the order ended on: a lot a move took it off (vacated) is not counted twice
    allocations = order.allocations.filter(vacated_at__isnull=True).select_related("lot__host")
    lots = [
        {"lot": allocation.lot.name, "host": allocation.lot.host.name, "gpus": allocation.lot.gpu_index_list}
        for allocation in allocations.order_by("lot__name")
    ]
    cards = sum(len(lot["gpus"]) for lot in lots)
    started = order.clock_started_at or order.starts_at
    ended_event = order.events.filter(to_status=OrderStatus.ENDED).order_by("created_at").first()
    ended = min(order.ends_at, ended_event.created_at) if ended_event else order.ends_at  # an early end
    window_s = max((order.ends_at - started).total_seconds(), 0)  # as booked (extensions included)
    summary = readings_summary(order)
    readings = []
    for card in summary.cards if summary else []:
        mean = {measure: card.mean(measure) for measure in ("utilisation", "memory", "power", "temperature")}
        readings.append(
            {
                "host": card.host,
                "gpu": card.gpu,
                "minutes_read": card.minutes,
                "minutes_busy": card.busy_minutes,
                "utilisation_mean_pct": None if mean["utilisation"] is None else round(mean["utilisation"], 1),
                "memory_peak_pct": round(card.peak["memory"], 1) if card.count["memory"] else None,
                "power_mean_w": None if mean["power"] is None else round(mean["power"], 1),
                "energy_kwh": round(card.energy_kwh, 3),
                "temperature_max_c": round(card.peak["temperature"], 1) if card.count["temperature"] else None,
            }
        )
    trial = order.split_trials.order_by("-uploaded_at").first()
    with translation.override(order.language):
        verdict = (
            split_trial_conclusion(report=trial.report, hypothesis=order.hypothesis, sharing=order.sharing)
            if trial is not None
            else None
        )
        hypothesis_label = str(order.get_hypothesis_display())
        sharing_label = str(order.get_sharing_display()) if order.sharing else ""
    return {
        "format": FORMAT,
        "issued_at": issued_at.isoformat(),
        "language": order.language,
        "order": order.public_id,
        "hardware": {
            "class": order.hardware_class.name,
            "vendor": order.hardware_class.vendor,
            "lots": lots,
            "cards": cards,
        },
        "window": {
            "starts_at": started.isoformat(),
            "ends_at": order.ends_at.isoformat(),
            "ended_at": ended.isoformat(),  # before ends_at when the researcher ended it early
            "days": round((order.ends_at - started) / timedelta(days=1), 2),  # extensions included
            "days_booked": order.days,
            "started_when_ready": order.start_when_ready,
        },
        "environment": {
            "name": order.environment.name,
            "image": order.environment.image_ref,
            "runtime": f"{order.environment.get_runtime_display()} {order.environment.runtime_version}",
            "pytorch": order.environment.pytorch_version,
            "pinned_image_ids": sorted({access.image_id for access in accesses if access.image_id}),
        },
        "preflight": [
            {
                "host": access.host.name,
                "status": access.preflight_status or None,
                "checks": [
                    {"name": str(check.get("name"))[:80], "status": str(check.get("status"))[:8]}
                    for check in ((access.preflight_report or {}).get("checks") or [])[:50]
                    if isinstance(check, dict)
                ],
                "handed_over_despite": bool(access.handover_note),
                # a pre-flight run again during the window ran beside the customer's processes: their word
                "beside_customer": bool((access.preflight_report or {}).get("beside_customer")),
            }
            for access in accesses
        ],
        "gpu_hours": {
            "booked": _hours(cards * window_s),
            "read": round(sum(card["minutes_read"] for card in readings) / 60, 2),
            "busy": round(sum(card["minutes_busy"] for card in readings) / 60, 2),
        },
        "research": {
            "sharing": order.sharing,
            "sharing_label": sharing_label,
            "hypothesis": order.hypothesis,
            "hypothesis_label": hypothesis_label,
            "hypothesis_in_words": order.hypothesis_detail,
            "measure": order.hypothesis_measure,
            "checkpoint_interval_hours": order.checkpoint_interval_hours,
            "stop_criteria": order.stop_criteria,
        },
        "split_trial": None
        if verdict is None
        else {
            # the researcher's upload of the kit's report: its figures are theirs, not measured by the portal
            "source": "uploaded by the researcher",
            "report_sha256": hashlib.sha256(
                json.dumps(trial.report, sort_keys=True, ensure_ascii=False).encode()
            ).hexdigest(),
            "uploaded_at": trial.uploaded_at.isoformat(),
            "verdict": verdict["verdict"],
            "sentence": verdict["sentence"],
            "notes": verdict["notes"],
        },
        "readings": readings,
        "alerts": [
            {
                "kind": alert.kind,
                "from": alert.started_at.isoformat(),
                "to": (alert.ended_at or alert.last_seen_at).isoformat(),
            }
            for alert in WatchAlert.objects.filter(order=order).order_by("started_at")[:100]
        ],
        "signature": {"algorithm": "Ed25519", "key_id": key_id(), "public_key": "/records/signing-key.pem"},
    }


def document_bytes(facts: dict) -> bytes:
    """The JSON exactly as signed and served: keys sorted, two-space indents, UTF-8, one final line ending."""
    return (json.dumps(facts, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _pdf(order: Order, facts: dict) -> bytes:
    from weasyprint import HTML
    from weasyprint.urls import URLFetcher

    answers = [html for _receiver, html in document_html.send(sender=ResearchRecord, order=order, facts=facts)]
    if len(answers) != 1:
        raise ImproperlyConfigured("one receiver of provisioning.research_record.document_html must draw the record")
    fetch_nothing = URLFetcher(allowed_protocols=frozenset())  # the page is self-contained, whatever text it holds
    return HTML(string=answers[0], url_fetcher=fetch_nothing).write_pdf()


def record_issue(*, order: Order, now: datetime | None = None) -> ResearchRecord:
    """Write, sign and keep the order's record (once: a second call returns the first), and queue its e-mail."""
    now = now or timezone.now()
    with transaction.atomic():
        order = Order.objects.select_for_update().get(pk=order.pk)
        existing = ResearchRecord.objects.filter(order=order).first()
        if existing is not None:
            return existing
        facts = record_facts(order, issued_at=now)
        pdf = _pdf(order, facts)
        facts["pdf_sha256"] = hashlib.sha256(pdf).hexdigest()
        document = document_bytes(facts)
        signature = _signing_key().sign(document).signature
        record = ResearchRecord.objects.create(
            order=order, issued_at=now, document=document, signature=signature, pdf=pdf, key_id=key_id()
        )
        enqueue.send_research_record(order.pk)
    return record


def records_issue_due(*, now: datetime) -> int:
    """Orders that ended after a hand-over, whose files are still kept and that have no record yet: at most
    ISSUED_PER_SWEEP. One that cannot be issued (a bug, a key the portal cannot use) is logged and left alone for
    RETRY_AFTER_S, never in the way of the others."""
    handed_over = Access.objects.filter(order=OuterRef("pk"), ready_at__isnull=False, wiped_at__isnull=True)
    due = (
        Order.objects.filter(status=OrderStatus.ENDED)
        .filter(Exists(handed_over))
        .exclude(Exists(ResearchRecord.objects.filter(order=OuterRef("pk"))))
        .order_by("ends_at")
    )
    candidates = list(due.values_list("pk", flat=True)[:SCANNED_PER_SWEEP])
    if not candidates:
        return 0
    failed = cache.get_many([_failed_key(pk) for pk in candidates])  # those left alone for now are passed over
    # a failure takes a try, not a record's place: up to twice as many tries as records, so that a run of orders
    # that fail never holds back those behind them for more than a few sweeps
    chosen = [pk for pk in candidates if _failed_key(pk) not in failed][: ISSUED_PER_SWEEP * 2]
    issued = 0
    for order in Order.objects.filter(pk__in=chosen).order_by("ends_at"):
        if issued >= ISSUED_PER_SWEEP:
            break
        try:
            record_issue(order=order, now=now)
        except Exception:
            logger.exception("the research record of %s could not be issued", order.public_id)
            cache.set(_failed_key(order.pk), 1, timeout=RETRY_AFTER_S)
            continue
        issued += 1
    return issued


def _failed_key(order_id: int) -> str:
    return f"research-record:failed:{order_id}"


def records_delete_wiped() -> int:
    """The records of orders whose files were deleted on every host: they go with the data."""
    kept = Access.objects.filter(order=OuterRef("order"), wiped_at__isnull=True)
    deleted, _ = ResearchRecord.objects.exclude(Exists(kept)).delete()
    return deleted


def record_send(*, order: Order) -> None:
    record = ResearchRecord.objects.filter(order=order).first()
    if record is None:
        return
    notices.send(
        Notice.RESEARCH_RECORD,
        order=order,
        record=record,
        link=links.mailed_order_link(order=order),
    )
