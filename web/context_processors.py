from django.db import DatabaseError
from django.utils.functional import SimpleLazyObject


def terms(request):
    """The current terms version for every page's footer, read (from the shared cache) only by pages that draw it."""
    return {"CURRENT_TERMS": SimpleLazyObject(_current_or_none)}


def _current_or_none():
    from booking.terms import terms_current

    try:
        return terms_current()
    except DatabaseError:  # a page drawn while the database is away (the booking form's 503) loses only the links
        return None
