"""Security headers Django 5.2 does not set by itself: a Content-Security-Policy (no inline script anywhere: htmx
and portal.js are served from static/) and a Permissions-Policy."""

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
