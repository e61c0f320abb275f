"""Production settings for the tests that start the project as production would: keys, chains, the site."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


NOT_DEMO_XPUB = (  # BIP-32 test vector 1, chain m/0H/1/2H: a valid depth-3 public key that is not the demo's
    "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7DogT5Uv6fcLW5"
)


PRODUCTION_CHAINS = """
[[chains]]
chain_id = 8453
name = "Base"
rpc_urls = ["http://127.0.0.1:9/rpc"]  # nothing listens: tests reach no outside node
confirmations = 12

  [[chains.assets]]
  symbol = "USDC"
  contract = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"
  decimals = 6
  pegged_to = "EUR"
"""


PRODUCTION_SECRET_KEY = "p" * 20 + "roduction-" + "k" * 40
# The research records' signing key of the production runs (base64 of 32 bytes); tests/conftest.py puts it in the
# tests' environment, so every production process a test starts has one, as a deployment must.
PRODUCTION_RECORD_KEY = "cHJvZHVjdGlvbi1yZWNvcmQta2V5LW9mLXRoZS10ZXM="


# What a production site gives besides its secrets: its public address and its mail server.
PRODUCTION_SITE = {
    "SITE_URL": "https://book.example.org",
    "ALLOWED_HOSTS": "book.example.org",
    "EMAIL_URL": "smtp+tls://binome:s3cret@mail.example.org:587",
    "DEFAULT_FROM_EMAIL": "Binôme <bookings@book.example.org>",
}


def _production(*args: str, command: tuple[str, ...] = (sys.executable, "manage.py"), **env: str | None):
    # A production environment: none of the development or test switches (the browser tests set
    # DJANGO_ALLOW_ASYNC_UNSAFE for Playwright in this process). A variable given as None is left unset.
    dropped = (
        "DEBUG",
        "SECRET_KEY",
        "PAYMENTS_XPUB",
        "PAYMENTS_CHAINS_FILE",
        "DJANGO_ALLOW_ASYNC_UNSAFE",
        "SITE_URL",
        "SITE_URL_PRIVATE_NETWORK",
        "EMAIL_URL",
    )
    environment = {key: value for key, value in os.environ.items() if key not in dropped}
    environment.update({"DEBUG": "0", **PRODUCTION_SITE, **env})
    environment = {key: value for key, value in environment.items() if value is not None}
    return subprocess.run(
        [*command, *args], cwd=ROOT, env=environment, capture_output=True, text=True, check=False, timeout=120
    )
