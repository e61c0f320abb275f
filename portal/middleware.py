"""Security headers and failure pages. The Content-Security-Policy is django-csp's (settings.CONTENT_SECURITY_POLICY:
no inline script anywhere, htmx and portal.js are served from static/), with inline styles allowed on Django's
admin only; the Permissions-Policy, which django-csp does not set, is set here. And a 503 page, not a 500, while
the database does not answer."""

import functools
import http
import logging

from csp.constants import HEADER, HEADER_REPORT_ONLY, UNSAFE_INLINE
from csp.middleware import CheckableLazyObject, CSPMiddleware
from csp.utils import build_policy
from django.conf import settings
from django.core.signals import setting_changed
from django.db import InterfaceError, OperationalError, connection
from django.dispatch import receiver
from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
ADMIN_PREFIX = "/admin/"
ADMIN_UPDATE = {"style-src": [UNSAFE_INLINE]}
# What a view or decorator of django-csp may set on one response to change its policy.
RESPONSE_PARTS = ("_csp_config", "_csp_update", "_csp_replace", "_csp_config_ro", "_csp_update_ro", "_csp_replace_ro")
DEBUG_EXEMPT = (http.HTTPStatus.INTERNAL_SERVER_ERROR, http.HTTPStatus.NOT_FOUND)  # as django-csp: debug pages


@functools.cache
def _built_policy(*, admin: bool, report_only: bool) -> tuple[str, tuple[str, ...]]:
    """The header django-csp builds from the settings (with the admin's addition), and the URL prefixes it is
    not sent on. Built once per process: django-csp builds it again for every response (about 120 us)."""
    setting = "CONTENT_SECURITY_POLICY_REPORT_ONLY" if report_only else "CONTENT_SECURITY_POLICY"
    policy = getattr(settings, setting, None) or {}
    header = build_policy(update=ADMIN_UPDATE if admin else None, report_only=report_only)
    return header, tuple(policy.get("EXCLUDE_URL_PREFIXES", None) or ())


@receiver(setting_changed)
def _forget_built_policies(*, setting: str, **kwargs) -> None:
    if setting.startswith("CONTENT_SECURITY_POLICY"):
        _built_policy.cache_clear()


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware. Django's admin sets a few inline style attributes (its scripts are files too), so
    its pages add 'unsafe-inline' to style-src and nothing else.

    The header is the same for every response that sets no policy of its own (django-csp's decorators) and used
    no nonce (no template here does): that one, and the admin's, are built once (`_built_policy`); any other
    response goes through django-csp as it is."""

    def get_policy_parts(self, request, response, report_only: bool = False):
        if not report_only and request.path.startswith(ADMIN_PREFIX) and getattr(response, "_csp_update", None) is None:
            response._csp_update = {**ADMIN_UPDATE}
        return super().get_policy_parts(request, response, report_only)

    def process_response(self, request, response):
        if getattr(request, "_csp_nonce", None) is not None or any(
            getattr(response, part, None) is not None for part in RESPONSE_PARTS
        ):
            return super().process_response(request, response)
        if response.status_code in DEBUG_EXEMPT and settings.DEBUG:
            return response
        admin = request.path.startswith(ADMIN_PREFIX)
        for header, report_only, exempt in (
            (HEADER, False, "_csp_exempt"),
            (HEADER_REPORT_ONLY, True, "_csp_exempt_ro"),
        ):
            policy, excluded_prefixes = _built_policy(admin=admin, report_only=report_only)
            if (
                policy
                and header not in response
                and getattr(response, exempt, False) is False
                and not request.path_info.startswith(excluded_prefixes)
            ):
                response[header] = policy
        # As django-csp: a nonce asked for once the header is written raises rather than go unlisted.
        request.csp_nonce = CheckableLazyObject(self._csp_nonce_post_response)
        return response


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
