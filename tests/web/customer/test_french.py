"""Every customer page in French says nothing in English: its text (and what assistive technology reads of its
attributes) is scanned for English sentences, both those the catalogue translates (a template that forgot to mark
one) and any other (a string never marked). Code, commands, and what the operators named (classes, images, hosts)
are the reader's to read as they are."""

import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse
from django.utils.html import escape as html_escape
from django.utils.translation import trans_real

from booking.models import OrderStatus
from booking.services import order_transition
from tests.builders.orders import order_url, place

pytestmark = pytest.mark.django_db

# Function words of English that French sentences do not use: three or more in a run of text is English.
ENGLISH = frozenset(
    {
        *("the", "and", "your", "you", "is", "are", "of", "to", "with", "for", "this", "that", "not", "will", "be"),
        *("was", "were", "has", "have", "from", "at", "by", "it", "its", "an", "or", "when", "which", "what", "can"),
        *("our", "we"),
    }
)
# Words both languages write alike, and names of the product and of what operators set.
SHARED = re.compile(r"\b(NVIDIA|AMD|B200|H200|MI300X|PyTorch|CUDA|ROCm|Binôme|SSH|VS Code|Jupyter|UTC)\b")
SKIPPED_ELEMENTS = {"code", "pre", "kbd", "samp", "script", "style", "textarea", "option"}
READ_ATTRIBUTES = ("aria-label", "title", "placeholder", "alt")


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class TextOf(HTMLParser):
    """The runs of text a reader (or a screen reader) meets, outside code, commands and what is marked English
    (`lang="en"`: an error message quoted as the software prints it)."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[bool] = []  # per open element: whether its text is skipped
        self.runs: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        skipped = (bool(self.open) and self.open[-1]) or tag in SKIPPED_ELEMENTS
        # an English passage within the page (the page's own language is what is checked)
        skipped = skipped or (tag != "html" and (attributes.get("lang") or "").startswith("en"))
        if not skipped:
            self.runs += [value for name, value in attrs if name in READ_ATTRIBUTES and value]
        if tag not in VOID:
            self.open.append(skipped)

    def handle_endtag(self, tag):
        if tag not in VOID and self.open:
            self.open.pop()

    def handle_data(self, data):
        if not (self.open and self.open[-1]) and data.strip():
            self.runs.append(" ".join(data.split()))


def english_in(page: str, *, operator_names: set[str]) -> list[str]:
    parser = TextOf()
    parser.feed(page)
    found = []
    for run in parser.runs:
        text = SHARED.sub("", run)
        for name in operator_names:
            text = text.replace(name, "")
        words = re.findall(r"[a-z]+", text.lower())
        if sum(word in ENGLISH for word in words) >= 3:
            found.append(run)
    return found


def catalogue_english() -> list[str]:
    """Fragments of the catalogue's English sentences (four words or more between placeholders and tags) whose
    French differs: one of them on a French page is a string the template did not translate."""
    fragments = set()
    for msgid, msgstr in trans_real.translation("fr")._catalog.items():
        msgid = msgid[0] if isinstance(msgid, tuple) else msgid  # a plural's forms are keyed (msgid, index)
        for fragment in re.split(r"%\([a-z_]+\)[sd]|<[^>]+>|\{[^}]*\}", msgid):
            fragment = " ".join(fragment.split()).strip(" .,:;()")
            if len(fragment.split()) >= 4 and fragment not in msgstr:
                fragments.add(fragment)
    return sorted(fragments)


def french(client, url: str) -> str:
    client.cookies["django_language"] = "fr"
    response = client.get(url)
    assert response.status_code == 200, url
    assert '<html lang="fr">' in response.content.decode()
    return response.content.decode()


def test_no_customer_page_or_e_mail_in_french_says_anything_in_english(
    client, catalog, booking_data, admin_user, mailoutbox, django_capture_on_commit_callbacks
):
    from payments.selectors import current_invoice
    from payments.settlement import invoice_mark_paid

    client.cookies["django_language"] = "fr"
    with django_capture_on_commit_callbacks(execute=True):
        order, token = place(client, booking_data(lots="1"))
    assert order.language == "fr"
    urls = {
        "booking page": reverse("customer:book"),
        "booking page, as soon as ready": reverse("customer:book") + "?hardware_class=h200-pair&start_when_ready=on",
        "calendar": reverse("customer:calendar"),
        "guide": reverse("customer:guide"),
        "fit advisor": reverse("customer:fit") + "?fit-parameters_billion=13",
        "find my order": reverse("customer:resend-link"),
        "terms": reverse("customer:terms", kwargs={"document": "terms"}),
        "order, awaiting payment": order_url(order, token),
    }
    pages = {name: french(client, url) for name, url in urls.items()}
    with django_capture_on_commit_callbacks(execute=True):
        invoice_mark_paid(invoice=current_invoice(order), user=admin_user, reason="test: paid by wire")
    pages["order, paid"] = french(client, order_url(order, token))
    for status in (OrderStatus.APPROVED, OrderStatus.PROVISIONING, OrderStatus.READY):
        with django_capture_on_commit_callbacks(execute=True):
            order_transition(order=order, to_status=status, actor_kind="system")
    pages["order, ready"] = french(client, order_url(order, token))
    with django_capture_on_commit_callbacks(execute=True):
        order_transition(order=order, to_status=OrderStatus.ENDED, actor_kind="system")
    pages["order, ended"] = french(client, order_url(order, token))
    mailed = [message for message in mailoutbox if order.contact_email in message.to]
    assert len(mailed) >= 3, [message.subject for message in mailoutbox]
    for message in mailed:
        pages[f"e-mail: {message.subject}"] = html_escape(f"{message.subject}\n{message.body}")

    names = {hardware_class.name for hardware_class in catalog.values()}
    names |= {order.environment.name, order.contact_name, order.organisation}
    fragments = catalogue_english()
    assert len(fragments) > 500  # the scan reads the whole catalogue
    untranslated = {
        name: [fragment for fragment in fragments if fragment in page] + english_in(page, operator_names=names)
        for name, page in pages.items()
    }
    assert {name: found for name, found in untranslated.items() if found} == {}
    # and the scan does see English: the English booking page is full of it
    client.cookies["django_language"] = "en"
    english = client.get(reverse("customer:book")).content.decode()
    assert len(english_in(english, operator_names=names)) > 10
    assert len([fragment for fragment in fragments if fragment in english]) > 10
