"""The order page's poll, answered before the rest of the stack when nothing it shows has changed.

Every open order page polls its status block every few seconds, and nearly every answer is "unchanged". That
answer needs one cache round trip (`booking.status_cache.unchanged`) and nothing of the session, the language,
CSRF, the user or the messages: this middleware sits right after the security ones (so the answer carries their
headers) and answers "204 No Content" there. Anything else, a changed block included, goes on to the view.
"""

from django.http import HttpResponse
from django.urls import Resolver404, resolve

from booking import status_cache
from booking.views import mark_private, order_detail

NEVER_CACHE = {"Cache-Control": "max-age=0, no-cache, no-store, must-revalidate, private"}


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
            try:
                match = resolve(request.path_info)
            except Resolver404:
                match = None
            if match is not None and match.func is order_detail:
                request.get_host()  # an unknown host is refused here as everywhere else (400)
                if status_cache.unchanged(**match.kwargs, rendering_id=rendering_id):
                    # htmx keeps the block the page shows; what never_cache says, without the clock
                    return mark_private(HttpResponse(status=204, headers=NEVER_CACHE))
        return self.get_response(request)
