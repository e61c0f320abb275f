"""The page of a fiscal invoice, printed to PDF/A-3 by payments (payments/fiscal_documents.py asks for it through
its `document_html` signal, connected in web/apps.py): drawn in the order's language, from the frozen figures."""

from django.template.loader import render_to_string
from django.utils import translation


def fiscal_invoice_html(sender, *, invoice, **kwargs) -> str:
    with translation.override(invoice.language):
        return render_to_string("documents/fiscal_invoice.html", {"invoice": invoice})
