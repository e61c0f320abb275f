"""Security headers and failure pages. The Content-Security-Policy is django-csp's (settings.CONTENT_SECURITY_POLICY:
no inline script anywhere, htmx and portal.js are served from static/), with inline styles allowed on Django's
admin only; the Permissions-Policy, which django-csp does not set, is set here. And a 503 page, not a 500, while
the database does not answer."""

import logging

from csp.constants import UNSAFE_INLINE
from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
ADMIN_PREFIX = "/admin/"
ADMIN_UPDATE = {"style-src": [UNSAFE_INLINE]}


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, extended where its documentation says to (`get_policy_parts`, django-csp 4.0's
    migration guide): Django's admin sets a few inline style attributes (its scripts are files too), so its pages
    add 'unsafe-inline' to style-src and nothing else. Everything else, the decorators' per-response policies,
    nonces, exemptions and excluded prefixes included, is django-csp's own."""

    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and request.path.startswith(ADMIN_PREFIX):
            parts.update = {**ADMIN_UPDATE, **(parts.update or {})}  # a view's own update of style-src wins
        return parts


class PermissionsPolicyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
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
