"""The terms pages: each document of the current terms version, or of the version an order accepted, in the
page's language. The operator's text is escaped and only its line breaks are kept (no markup from the admin)."""

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from booking.cancellation import rules_in_words
from booking.models import TermsDocument
from booking.terms import terms_current, terms_version_by_number


@require_http_methods(["GET"])
def terms_page(request: HttpRequest, document: str, number: int | None = None) -> HttpResponse:
    if document not in TermsDocument.values:
        raise Http404("No such document.")
    current = terms_current()
    version = current if number is None else terms_version_by_number(number=number)
    if version is None:
        raise Http404("No such terms version.")
    language = request.LANGUAGE_CODE if request.LANGUAGE_CODE in dict(settings.LANGUAGES) else "en"
    context = {
        "document": TermsDocument(document),
        "documents": TermsDocument,
        "version": version,
        "text": version.text(document, language),
        "is_current": current is not None and version.pk == current.pk,
        "rules": (
            rules_in_words(terms=version, currency=settings.PRICE_CURRENCY)
            if document == TermsDocument.CANCELLATION
            else []
        ),
    }
    return render(request, "customer/terms.html", context)
