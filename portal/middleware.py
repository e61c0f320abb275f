"""Security headers Django 5.2 does not set by itself: a Content-Security-Policy (no inline script anywhere: htmx
and portal.js are served from static/) and a Permissions-Policy. And a 503 page, not a 500, while the database
does not answer."""

import logging

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)
# Django's admin sets a few inline style attributes; its scripts are files too.
ADMIN_CSP = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"


class SecurityHeadersMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        self.admin_prefix = "/admin/"

    def __call__(self, request):
        response = self.get_response(request)
        policy = ADMIN_CSP if request.path.startswith(self.admin_prefix) else CSP
        response.headers.setdefault("Content-Security-Policy", policy)
        response.headers.setdefault("Permissions-Policy", PERMISSIONS_POLICY)
        return response


class DatabaseUnavailableMiddleware:
    """A view that lost its database answers 503 with a page that needs none (templates/503.html): what happened,
    that nothing was saved by this attempt, and to retry. The broken connection is dropped so the next request
    opens a fresh one."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.warning("database unavailable during %s %s: %s", request.method, request.path, exception)
        connection.close()
        return HttpResponse(render_to_string("503.html"), status=503, headers={"Retry-After": "30"})


class RequestSizeLimitMiddleware:
    """Answers 413, before anything reads the body, a request whose declared length is over what any form of the
    portal can send: DATA_UPLOAD_MAX_MEMORY_SIZE, or FILE_UPLOAD_MAX_MEMORY_SIZE for a multipart body (the one
    upload form: a report and the CSRF token). Django reads no more than the declared length, and the only upload
    handler keeps files in memory up to that size, so an upload is refused or kept in memory: never on disk."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0  # Django reads such a body as empty
        multipart = request.META.get("CONTENT_TYPE", "").startswith("multipart/")
        limit = settings.FILE_UPLOAD_MAX_MEMORY_SIZE if multipart else settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if declared > limit:
            return render(request, "413.html", status=413)
        return self.get_response(request)
