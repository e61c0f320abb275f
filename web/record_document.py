"""The page of a research record, printed to PDF by provisioning (provisioning/research_record.py asks for it through
its `document_html` signal, connected in web/apps.py): drawn in the order's language, from the record's facts."""

from django.template.loader import render_to_string
from django.utils import translation


def research_record_html(sender, *, order, facts: dict, **kwargs) -> str:
    with translation.override(order.language):
        return render_to_string("documents/research_record.html", {"order": order, "facts": facts})
