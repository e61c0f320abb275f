"""Secret links: the token is shown once (redirect, e-mail); only its SHA-256 is stored."""

import hashlib
import secrets

# Crockford's base32 without look-alikes, for order numbers people read aloud.
_PUBLIC_ID_ALPHABET = "23456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_access_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_public_id() -> str:
    return "BN-" + "".join(secrets.choice(_PUBLIC_ID_ALPHABET) for _ in range(8))
