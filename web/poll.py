"""The order page's poll, answered before the rest of the stack when nothing it shows has changed.

Every open order page polls its status block every few seconds, and nearly every answer is "unchanged". That
answer needs one cache round trip (`web.status_cache.unchanged`) and nothing of the session, the language,
CSRF, the user or the messages: this middleware sits right after the security ones (so the answer carries their
headers) and answers "204 No Content" there. Anything else, a changed block included, goes on to the view.
"""

from functools import lru_cache

from django.http import HttpResponse
from django.urls import Resolver404, get_urlconf, resolve

from web import status_cache
from web.customer.order import mark_private, order_detail

NEVER_CACHE = {"Cache-Control": "max-age=0, no-cache, no-store, must-revalidate, private"}
LONGEST_ORDER_PATH = 256  # "/orders/<number>/<token>/" is about 70 characters; longer paths are not remembered


@lru_cache(maxsize=4096)
def _order_link(path: str, urlconf) -> tuple[str, str] | None:
    """(order number, token) when `path` is an order page's address, from Django's resolver (web/customer/urls.py stays
    the one route). Remembered per path: an open page polls the same address every few seconds, and resolving
    costs about as much as the rest of the "unchanged" answer."""
    try:
        match = resolve(path, urlconf)
    except Resolver404:
        return None
    return (match.kwargs["public_id"], match.kwargs["token"]) if match.func is order_detail else None


class UnchangedStatusMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # The cheap tests first, the query string only for an htmx GET: this runs before every view. META rather
        # than request.headers, which copies every header first.
        if (
            request.method == "GET"
            and request.META.get("HTTP_HX_REQUEST") == "true"
            and (rendering_id := request.GET.get("v"))
        ):
            path = request.path_info
            link = _order_link(path, get_urlconf()) if len(path) <= LONGEST_ORDER_PATH else None
            if link is not None:
                request.get_host()  # an unknown host is refused here as everywhere else (400)
                public_id, token = link
                if status_cache.unchanged(public_id=public_id, token=token, rendering_id=rendering_id):
                    # htmx keeps the block the page shows; what never_cache says, without the clock
                    return mark_private(HttpResponse(status=204, headers=NEVER_CACHE))
        return self.get_response(request)
