import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from infrastructure.client import client_address
from portal.health import CHECKS, check_schedule


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """200 when every dependency answers, 503 when one does not, so a load balancer can act on the status alone.
    Which one, and what it runs on, only to operators (a staff session) and to the machine itself (a probe on
    loopback, not through a proxy): to anyone else the body is one word. The broker is asked at most every few
    seconds (portal/health.py), however often this is called. The details also say whether beat's chain scan and
    lifecycle sweep ran on time (`schedule`), which does not change the status."""
    results = {}
    for name, check in CHECKS.items():
        ok, detail = check()
        results[name] = {"ok": ok, "detail": detail}
    healthy = all(result["ok"] for result in results.values())
    status = 200 if healthy else 503
    if not _may_see_health_details(request):
        return HttpResponse("ok" if healthy else "unavailable", content_type="text/plain", status=status)
    on_time, detail = check_schedule()  # beat and the workers: said, not a 503 (portal/health.py)
    body = {"status": "ok" if healthy else "degraded", "checks": results, "schedule": {"ok": on_time, "detail": detail}}
    return JsonResponse(body, status=status)


def _may_see_health_details(request: HttpRequest) -> bool:
    if request.user.is_active and request.user.is_staff:
        return True
    # Loopback, and not relayed: a proxy on the same machine connects from loopback for every client.
    if "HTTP_X_FORWARDED_FOR" in request.META:
        return False
    try:
        return ipaddress.ip_address(client_address(request)).is_loopback
    except ValueError:
        return False


@require_GET
def livez(request: HttpRequest) -> HttpResponse:
    """The process answers: no database, no template. Also the baseline of bench/pages.py."""
    return HttpResponse("ok", content_type="text/plain")


def ratelimited(request: HttpRequest, exception: Exception) -> HttpResponse:
    return render(request, "429.html", status=429)


def login_locked(request: HttpRequest, response: HttpResponse | None = None, credentials: dict | None = None):
    """django-axes' answer to a sign-in while its address is locked out: why, and for how long (429)."""
    context = {
        "failure_limit": settings.AXES_FAILURE_LIMIT,
        "minutes": int(settings.AXES_COOLOFF_TIME.total_seconds() // 60),
    }
    return render(request, "login_locked.html", context, status=429)


def axes_username(request: HttpRequest, credentials: dict | None = None) -> str | None:
    """The username django-axes records for a sign-in attempt, cut to what a username can be (150 characters):
    Django's login form does not enforce that length, and axes keeps it in a 255-character column."""
    username = (credentials or {}).get("username")
    if username is None and request is not None:
        username = request.POST.get("username")
    return None if username is None else str(username)[:150]
