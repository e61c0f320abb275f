"""Validation of the SSH public keys a customer gives for their booking.

The portal writes these keys into the ``authorized_keys`` of the machines it
hands out, so it accepts only one plain OpenSSH public key per line, of a
modern type, and refuses anything else with a message that says what is wrong.

The friendly checks on the line (a private key, an RFC 4716 block, options,
DSA, control characters, the comment) are made here, before any parsing. The
key blob itself is parsed by ``cryptography`` (``load_ssh_public_key``, which
reads the ``sk-`` security-key variants too), so that a label that does not
match its data, a truncated key or a key with trailing bytes is refused, not
written to a server. The lines are bounded before cryptography sees them.

Messages are lazy translations, turned into text only when ``str()`` is called
on the exception, so this module can be imported and used without Django
settings. ``InvalidSshKey.code`` says which check failed, for callers and tests.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    SSHPublicKeyTypes,
    load_ssh_public_key,
)
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext_lazy

__all__ = [
    "MAX_COMMENT_LENGTH",
    "MAX_LINE_LENGTH",
    "MIN_RSA_BITS",
    "InvalidSshKey",
    "SshPublicKey",
    "parse_authorized_keys",
    "parse_public_key",
]

MAX_LINE_LENGTH = 16 * 1024
MAX_COMMENT_LENGTH = 200
MIN_RSA_BITS = 3072
MAX_RSA_BITS = 16384  # OpenSSH's own limit (SSHBUF_MAX_BIGNUM).

ED25519 = "ssh-ed25519"
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
RSA = "ssh-rsa"
SK_ECDSA_P256 = "sk-ecdsa-sha2-nistp256@openssh.com"
DSS = "ssh-dss"
# Key type -> the names its blob starts with: the type, then the curve for ECDSA.
_BLOB_NAMES = {
    ED25519: (b"ssh-ed25519",),
    SK_ED25519: (b"sk-ssh-ed25519@openssh.com",),
    RSA: (b"ssh-rsa",),
    "ecdsa-sha2-nistp256": (b"ecdsa-sha2-nistp256", b"nistp256"),
    "ecdsa-sha2-nistp384": (b"ecdsa-sha2-nistp384", b"nistp384"),
    "ecdsa-sha2-nistp521": (b"ecdsa-sha2-nistp521", b"nistp521"),
    SK_ECDSA_P256: (b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256"),
}
ACCEPTED_TYPES = frozenset(_BLOB_NAMES)

# authorized_keys options (sshd(8), "AUTHORIZED_KEYS FILE FORMAT").
_OPTION_NAMES = (
    "agent-forwarding",
    "cert-authority",
    "command",
    "environment",
    "expiry-time",
    "from",
    "no-agent-forwarding",
    "no-port-forwarding",
    "no-pty",
    "no-touch-required",
    "no-user-rc",
    "no-x11-forwarding",
    "permitlisten",
    "permitopen",
    "port-forwarding",
    "principals",
    "pty",
    "restrict",
    "tunnel",
    "user-rc",
    "verify-required",
    "x11-forwarding",
)
_OPTION_RE = re.compile(r"^(?:" + "|".join(re.escape(name) for name in _OPTION_NAMES) + r")(?:=|,|$)", re.I)
# A key type followed by key data, somewhere after an options prefix.
_EMBEDDED_KEY_RE = re.compile(r"""(?:^|[\s,"])(?:ssh-|ecdsa-sha2-|sk-)[A-Za-z0-9@.-]+[ \t]+AAAA""")
# Space-like separators: a key copied from a web page or a chat may carry non-breaking spaces.
_SEPARATOR_RE = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_TYPE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9@._+-]{0,63}$")
_BASE64_RE = re.compile(r"^AAAA[A-Za-z0-9+/]*={0,2}$")
# Bidirectional controls, which can make a comment display as something it is not.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class InvalidSshKey(ValueError):
    """A key (or a list of keys) the portal refuses.

    ``code`` names the failed check (``"private_key"``, ``"unknown_type"``,
    ``"rsa_too_short"``, ...), ``params`` the values put in the message, and
    ``line`` the 1-based line number when the key came from a list of keys.
    ``str(exc)`` (or ``exc.message``) gives the translated text.
    """

    def __init__(self, message: Any, code: str, params: dict[str, Any] | None = None, line: int | None = None):
        self.template = message
        self.code = code
        self.params = dict(params or {})
        self.line = line
        super().__init__(message, code)

    @property
    def message(self) -> str:
        text = self.template % self.params if self.params else str(self.template)
        if self.line is not None:
            text = _("Line %(line)d: %(message)s") % {"line": self.line, "message": text}
        return str(text)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"InvalidSshKey(code={self.code!r}, params={self.params!r}, line={self.line!r})"

    def at_line(self, line: int) -> InvalidSshKey:
        """The same error, located on ``line`` of a list of keys."""
        return InvalidSshKey(self.template, self.code, self.params, line)


@dataclass(frozen=True)
class SshPublicKey:
    key_type: str  # e.g. "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "sk-ssh-ed25519@openssh.com"
    bits: int  # RSA modulus size, 256 for ed25519, curve size for ECDSA (256/384/521)
    fingerprint: str  # OpenSSH style "SHA256:<base64 without padding>" of the decoded blob
    comment: str  # trailing comment, stripped, may be ""
    blob: bytes = field(repr=False)  # the decoded key data (wire format)

    def openssh(self) -> str:
        """The normalised ``type base64 comment`` line (no comment part when the comment is empty)."""
        line = f"{self.key_type} {base64.b64encode(self.blob).decode('ascii')}"
        return f"{line} {self.comment}" if self.comment else line


# --- Key data ----------------------------------------------------------------------------------


def _fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode("ascii").rstrip("=")


def _damaged() -> InvalidSshKey:
    return InvalidSshKey(_("The key is truncated or damaged."), "damaged")


def _mismatch(key_type: str) -> InvalidSshKey:
    return InvalidSshKey(
        _("The key data is damaged: it does not match its declared type “%(key_type)s”."),
        "type_mismatch",
        {"key_type": key_type},
    )


def _leading_names(blob: bytes, count: int) -> list[bytes]:
    """The first ``count`` length-prefixed strings of ``blob``; fewer where the blob ends first."""
    names: list[bytes] = []
    position = 0
    while len(names) < count and len(blob) - position >= 4:
        length = int.from_bytes(blob[position : position + 4], "big")
        start = position + 4
        if length > len(blob) - start:
            break
        names.append(blob[start : start + length])
        position = start + length
    return names


def _check_declared_names(key_type: str, blob: bytes) -> None:
    """Refuse a blob that names another key type, or another curve, than its label.

    cryptography refuses it with the same ``ValueError`` as a damaged key; the
    names are read here only so that the message can say what is wrong. Names
    cut short are left to cryptography, which reports the key as damaged.
    """
    expected = _BLOB_NAMES[key_type]
    if any(found != wanted for found, wanted in zip(_leading_names(blob, len(expected)), expected, strict=False)):
        raise _mismatch(key_type)


def _load(key_type: str, key_data: str) -> SSHPublicKeyTypes:
    """The key that cryptography reads from ``key_data``, or ``InvalidSshKey``."""
    try:
        return load_ssh_public_key(f"{key_type} {key_data}".encode("ascii"))
    except Exception as exc:
        # Hostile input, so nothing cryptography raises on it may become a server error: it documents
        # ValueError and UnsupportedAlgorithm, and also raises NotImplementedError (compressed EC points).
        # Only the call is guarded, so that a bug of ours still shows. cryptography says trailing bytes
        # only in its message; should the wording change, such a key is still refused, as damaged.
        if isinstance(exc, ValueError) and "unparsed data" in str(exc):
            raise InvalidSshKey(
                _("The key data is damaged: it has unexpected bytes after the key."), "trailing_bytes"
            ) from None
        raise _damaged() from None


def _key_bits(key: SSHPublicKeyTypes) -> int:
    if isinstance(key, rsa.RSAPublicKey):
        if key.public_numbers().n % 2 == 0:  # cryptography loads an even modulus, which no RSA key has.
            raise _damaged()
        return key.key_size
    if isinstance(key, ec.EllipticCurvePublicKey):
        return key.curve.key_size
    if isinstance(key, ed25519.Ed25519PublicKey):
        return 256
    raise _damaged()  # Not reached: the accepted types load as one of the three kinds above.


def _check_key_data(key_type: str, key_data: str, blob: bytes) -> int:
    """Check the key data against ``key_type``; return the key size in bits."""
    _check_declared_names(key_type, blob)
    key = _load(key_type, key_data)
    bits = _key_bits(key)
    if key_type == RSA:
        # cryptography, like sshd, reads numbers padded with leading zero bytes; OpenSSH fingerprints
        # the key written back without them, so such a blob would get another fingerprint here than
        # ssh-keygen shows, and the same key given twice would pass as two.
        if key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).split()[1] != base64.b64encode(blob):
            raise _damaged()
        if bits < MIN_RSA_BITS:
            raise InvalidSshKey(
                _("RSA key of %(bits)d bits is too short: at least %(min_bits)d bits are required."),
                "rsa_too_short",
                {"bits": bits, "min_bits": MIN_RSA_BITS},
            )
        if bits > MAX_RSA_BITS:
            raise InvalidSshKey(
                _("RSA key of %(bits)d bits is too long: at most %(max_bits)d bits are accepted."),
                "rsa_too_long",
                {"bits": bits, "max_bits": MAX_RSA_BITS},
            )
    return bits


# --- Lines -------------------------------------------------------------------------------------


def _not_a_key() -> InvalidSshKey:
    return InvalidSshKey(
        _("This is not an OpenSSH public key line. It should look like “ssh-ed25519 AAAA… you@host”."),
        "not_a_key",
    )


def _has_control(text: str) -> bool:
    return any(unicodedata.category(char) == "Cc" for char in text)


def _clip(text: str, length: int = 40) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def parse_public_key(line: str) -> SshPublicKey:
    """Parse and check one OpenSSH public key line (``type base64 [comment]``).

    Raises ``InvalidSshKey`` saying what is wrong with it.
    """
    if not isinstance(line, str):
        raise TypeError("parse_public_key() takes a str")
    if len(line) > MAX_LINE_LENGTH:
        raise InvalidSshKey(_("Key too long."), "too_long")
    if "PRIVATE KEY" in line.upper() or "PuTTY-User-Key-File" in line:
        raise InvalidSshKey(
            _("This is a private key. Paste the public key (the .pub file), never the private one."),
            "private_key",
        )
    if "BEGIN SSH2 PUBLIC KEY" in line.upper():
        raise InvalidSshKey(
            _(
                "This is an SSH2 (RFC 4716) public key. Convert it with “ssh-keygen -i -f key.pub” "
                "and paste the one-line result."
            ),
            "rfc4716",
        )
    stripped = line.strip()
    if not stripped:
        raise _not_a_key()
    if "\n" in stripped or "\r" in stripped:
        raise InvalidSshKey(
            _("The key contains line breaks. Give one key per line, each on a single line."), "control_chars"
        )
    tokens = _SEPARATOR_RE.split(stripped, maxsplit=2)
    key_type = tokens[0]
    key_data = tokens[1] if len(tokens) > 1 else ""
    comment = tokens[2].strip() if len(tokens) > 2 else ""
    if _has_control(key_type) or _has_control(key_data):
        raise InvalidSshKey(
            _("The key contains invisible control characters. Paste it again as plain text."), "control_chars"
        )

    if key_type not in ACCEPTED_TYPES:
        if key_type == DSS:
            raise InvalidSshKey(
                _("DSA keys (ssh-dss) are no longer accepted: they are insecure. Use ssh-ed25519."), "dsa"
            )
        if _OPTION_RE.match(key_type) or _EMBEDDED_KEY_RE.search(stripped, len(key_type)):
            raise InvalidSshKey(
                _(
                    'Options before the key (such as command="…" or from="…") are not accepted: '
                    "the portal sets its own. Give the key alone, starting with its type."
                ),
                "options",
            )
        if _TYPE_NAME_RE.match(key_type) and _BASE64_RE.match(key_data):
            raise InvalidSshKey(
                _(
                    "Unknown key type “%(key_type)s”. Accepted: ssh-ed25519, ecdsa-sha2-nistp256/384/521, "
                    "ssh-rsa (%(min_bits)d bits or more), and their security-key (sk-) variants."
                ),
                "unknown_type",
                {"key_type": _clip(key_type), "min_bits": MIN_RSA_BITS},
            )
        raise _not_a_key()

    if not key_data:
        raise _not_a_key()
    try:
        blob = base64.b64decode(key_data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSshKey(_("The key data is not valid base64."), "bad_base64") from None
    if not blob:
        raise _damaged()
    bits = _check_key_data(key_type, key_data, blob)

    if len(comment) > MAX_COMMENT_LENGTH:
        raise InvalidSshKey(
            _("The comment after the key is too long: at most %(max_length)d characters."),
            "comment_too_long",
            {"max_length": MAX_COMMENT_LENGTH},
        )
    if _has_control(comment) or any(char in _BIDI_CONTROLS for char in comment):
        raise InvalidSshKey(_("The comment after the key contains control characters."), "comment_control_chars")
    return SshPublicKey(key_type=key_type, bits=bits, fingerprint=_fingerprint(blob), comment=comment, blob=blob)


def parse_authorized_keys(text: str, *, max_keys: int = 10) -> list[SshPublicKey]:
    """Parse one public key per non-empty line; lines starting with ``#`` are ignored.

    Raises ``InvalidSshKey`` for the first bad line (its message names the line),
    for a key given twice, for more than ``max_keys`` keys, or for no key at all.
    """
    if not isinstance(text, str):
        raise TypeError("parse_authorized_keys() takes a str")
    if len(text) > MAX_LINE_LENGTH * max(max_keys, 1):
        raise InvalidSshKey(_("Too much text: give only your SSH public keys."), "too_long")
    lines = [
        (number, raw)
        for number, raw in enumerate(text.split("\n"), start=1)
        if raw.strip() and not raw.strip().startswith("#")
    ]
    if not lines:
        raise InvalidSshKey(_("Give at least one SSH public key."), "empty")
    keys: list[SshPublicKey] = []
    first_line: dict[str, int] = {}
    for index, (number, raw) in enumerate(lines):
        # Lines are checked in order before counting, so that a pasted private key
        # (many lines) is reported as such rather than as too many keys.
        if index == max_keys:
            raise InvalidSshKey(
                ngettext_lazy(
                    "Too many keys: %(count)d given, at most %(max_keys)d is accepted.",
                    "Too many keys: %(count)d given, at most %(max_keys)d are accepted.",
                    "max_keys",
                ),
                "too_many",
                {"count": len(lines), "max_keys": max_keys},
            )
        try:
            key = parse_public_key(raw)
        except InvalidSshKey as exc:
            raise exc.at_line(number) from exc
        if key.fingerprint in first_line:
            raise InvalidSshKey(
                _("This key is already given on line %(first_line)d."),
                "duplicate",
                {"first_line": first_line[key.fingerprint]},
                line=number,
            )
        first_line[key.fingerprint] = number
        keys.append(key)
    return keys
