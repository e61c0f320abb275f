"""Tests for booking.ssh_keys: parsing and checking customers' SSH public keys.

No database and no Django app registry are needed: when Django settings are not
configured (pytest run with ``-p no:django``), minimal settings without i18n are
configured so that the lazy messages can be turned into text.
"""

import base64
import contextlib
import dataclasses
import functools
import hashlib
import random
import shutil
import struct
import subprocess
import warnings

import pytest
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from django.conf import settings

if not settings.configured:
    settings.configure(USE_I18N=False)

from booking import ssh_keys
from booking.ssh_keys import (
    MAX_COMMENT_LENGTH,
    MAX_LINE_LENGTH,
    InvalidSshKey,
    SshPublicKey,
    parse_authorized_keys,
    parse_public_key,
)

# --- Helpers -----------------------------------------------------------------------------------


def ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def ssh_mpint(value: int) -> bytes:
    raw = value.to_bytes(value.bit_length() // 8 + 1, "big") if value else b""
    return ssh_string(raw)


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode("ascii")


def blob_of(line: str) -> bytes:
    return base64.b64decode(line.split()[1])


def expected_fingerprint(blob: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def openssh_line(private_key) -> str:
    return (
        private_key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode("ascii")
    )


@functools.cache
def ed25519_line() -> str:
    return openssh_line(ed25519.Ed25519PrivateKey.generate())


@functools.cache
def other_ed25519_line() -> str:
    return openssh_line(ed25519.Ed25519PrivateKey.generate())


@functools.cache
def rsa_line(bits: int) -> str:
    return openssh_line(rsa.generate_private_key(public_exponent=65537, key_size=bits))


CURVES = {256: ec.SECP256R1, 384: ec.SECP384R1, 521: ec.SECP521R1}


@functools.cache
def ec_private_key(bits: int) -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(CURVES[bits]())


def ec_point(bits: int) -> bytes:
    return (
        ec_private_key(bits)
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    )


@functools.cache
def dsa_line() -> str:
    """A DSA 1024 key, from cryptography if it still writes them, else built by hand."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return openssh_line(dsa.generate_private_key(key_size=1024))  # noqa: S505 - must be refused
    except Exception:  # Support for DSA keys is being removed from cryptography.
        p = (1 << 1023) | 0x1F  # Values only need the right framing, not to be a real group.
        blob = b"".join([ssh_string(b"ssh-dss"), ssh_mpint(p), ssh_mpint((1 << 159) | 1), ssh_mpint(2), ssh_mpint(3)])
        return f"ssh-dss {b64(blob)}"


def ed25519_raw() -> bytes:
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def sk_ed25519_blob(application: bytes = b"ssh:") -> bytes:
    """A FIDO security-key ed25519 blob (OpenSSH PROTOCOL.u2f), which cryptography cannot generate."""
    return ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(ed25519_raw()) + ssh_string(application)


def sk_ecdsa_blob(application: bytes = b"ssh:") -> bytes:
    return b"".join(
        [
            ssh_string(b"sk-ecdsa-sha2-nistp256@openssh.com"),
            ssh_string(b"nistp256"),
            ssh_string(ec_point(256)),
            ssh_string(application),
        ]
    )


def rsa_blob(exponent: int, modulus: int) -> bytes:
    return ssh_string(b"ssh-rsa") + ssh_mpint(exponent) + ssh_mpint(modulus)


def ed25519_private_pem() -> str:
    return (
        ed25519.Ed25519PrivateKey.generate()
        .private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
        .decode("ascii")
    )


def refused(line: str, code: str) -> InvalidSshKey:
    with pytest.raises(InvalidSshKey) as info:
        parse_public_key(line)
    assert info.value.code == code, str(info.value)
    return info.value


def refused_list(text: str, code: str, **kwargs) -> InvalidSshKey:
    with pytest.raises(InvalidSshKey) as info:
        parse_authorized_keys(text, **kwargs)
    assert info.value.code == code, str(info.value)
    return info.value


# --- Accepted keys -----------------------------------------------------------------------------


def test_ed25519_key_is_accepted():
    line = ed25519_line()
    key = parse_public_key(line)
    assert key.key_type == "ssh-ed25519"
    assert key.bits == 256
    assert key.fingerprint == expected_fingerprint(blob_of(line))
    assert key.comment == ""
    assert key.openssh() == line


def test_rsa_3072_key_is_accepted():
    line = rsa_line(3072)
    key = parse_public_key(line + " alice@laptop")
    assert key.key_type == "ssh-rsa"
    assert key.bits == 3072
    assert key.fingerprint == expected_fingerprint(blob_of(line))
    assert key.comment == "alice@laptop"
    assert key.openssh() == line + " alice@laptop"


@pytest.mark.parametrize("bits", [256, 384, 521])
def test_ecdsa_keys_are_accepted(bits):
    line = openssh_line(ec_private_key(bits))
    key = parse_public_key(line)
    assert key.key_type == f"ecdsa-sha2-nistp{bits}"
    assert key.bits == bits
    assert key.fingerprint == expected_fingerprint(blob_of(line))


def test_security_key_ed25519_is_accepted():
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    blob = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw) + ssh_string(b"ssh:")
    line = f"sk-ssh-ed25519@openssh.com {b64(blob)} bob@yubikey"
    key = parse_public_key(line)
    assert key.key_type == "sk-ssh-ed25519@openssh.com"
    assert key.bits == 256
    assert key.fingerprint == expected_fingerprint(blob)
    assert key.comment == "bob@yubikey"
    assert key.openssh() == line


def test_security_key_ecdsa_is_accepted():
    blob = b"".join(
        [
            ssh_string(b"sk-ecdsa-sha2-nistp256@openssh.com"),
            ssh_string(b"nistp256"),
            ssh_string(ec_point(256)),
            ssh_string(b"ssh:"),
        ]
    )
    key = parse_public_key(f"sk-ecdsa-sha2-nistp256@openssh.com {b64(blob)}")
    assert key.key_type == "sk-ecdsa-sha2-nistp256@openssh.com"
    assert key.bits == 256
    assert key.fingerprint == expected_fingerprint(blob)


def test_security_key_without_application_is_refused():
    public = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    blob = ssh_string(b"sk-ssh-ed25519@openssh.com") + ssh_string(raw)
    refused(f"sk-ssh-ed25519@openssh.com {b64(blob)}", "damaged")


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen is not installed")
def test_fingerprints_match_ssh_keygen(tmp_path):
    for line in (ed25519_line(), rsa_line(3072), openssh_line(ec_private_key(384))):
        path = tmp_path / "key.pub"
        path.write_text(line + " test\n")
        output = subprocess.run(
            [shutil.which("ssh-keygen"), "-l", "-E", "sha256", "-f", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        key = parse_public_key(line)
        assert output[1] == key.fingerprint
        assert int(output[0]) == key.bits


def test_key_is_a_frozen_value():
    key = parse_public_key(ed25519_line())
    assert key == parse_public_key(ed25519_line())
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.comment = "changed"  # type: ignore[misc]
    assert isinstance(key, SshPublicKey)


# --- Comments and whitespace -------------------------------------------------------------------


def test_comment_may_contain_spaces_and_is_stripped():
    line = ed25519_line()
    key = parse_public_key(f"  {line}   Alice Martin (lab laptop)  \r\n")
    assert key.comment == "Alice Martin (lab laptop)"
    assert key.openssh() == f"{line} Alice Martin (lab laptop)"


def test_tabs_and_repeated_spaces_between_fields_are_normalised():
    kind, data = ed25519_line().split()
    key = parse_public_key(f"{kind}\t  {data}\tme@host")
    assert key.openssh() == f"{kind} {data} me@host"


def test_non_breaking_spaces_from_a_web_page_separate_fields():
    kind, data = ed25519_line().split()
    key = parse_public_key(f"{kind}\u00a0{data}\u00a0me@host")
    assert key.openssh() == f"{kind} {data} me@host"


def test_unicode_comment_is_kept():
    key = parse_public_key(ed25519_line() + " Zoé — poste 3")
    assert key.comment == "Zoé — poste 3"


def test_comment_of_maximum_length_is_accepted():
    comment = "c" * MAX_COMMENT_LENGTH
    assert parse_public_key(f"{ed25519_line()} {comment}").comment == comment


def test_comment_too_long_is_refused():
    error = refused(f"{ed25519_line()} {'c' * (MAX_COMMENT_LENGTH + 1)}", "comment_too_long")
    assert "comment" in str(error)
    assert "200" in str(error)


@pytest.mark.parametrize("comment", ["me\x00@host", "me@host\x1b[31m red", "a\tb", "evil\u202etxt.exe"])
def test_comment_with_control_characters_is_refused(comment):
    error = refused(f"{ed25519_line()} {comment}", "comment_control_chars")
    assert "comment" in str(error)
    assert "control characters" in str(error)


# --- Refused keys ------------------------------------------------------------------------------


def test_private_key_is_refused():
    error = refused(ed25519_private_pem(), "private_key")
    assert "private key" in str(error)
    assert ".pub" in str(error)


@pytest.mark.parametrize(
    "line",
    [
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----",
        "PuTTY-User-Key-File-3: ssh-ed25519",
    ],
)
def test_private_key_first_lines_are_refused(line):
    refused(line, "private_key")


def test_unknown_key_type_is_refused():
    data = ed25519_line().split()[1]
    error = refused(f"ssh-foo {data}", "unknown_type")
    assert "Unknown key type “ssh-foo”" in str(error)
    assert "ssh-ed25519" in str(error)
    assert "3072" in str(error)


def test_certificate_is_an_unknown_type():
    data = ed25519_line().split()[1]
    refused(f"ssh-ed25519-cert-v01@openssh.com {data}", "unknown_type")


def test_short_rsa_key_is_refused():
    error = refused(rsa_line(2048), "rsa_too_short")
    assert str(error) == "RSA key of 2048 bits is too short: at least 3072 bits are required."
    assert error.params == {"bits": 2048, "min_bits": 3072}


def test_huge_rsa_key_is_refused():
    modulus = (1 << 16399) | 1
    blob = ssh_string(b"ssh-rsa") + ssh_mpint(65537) + ssh_mpint(modulus)
    error = refused(f"ssh-rsa {b64(blob)}", "rsa_too_long")
    assert "16400" in str(error)


def test_dsa_key_is_refused():
    line = dsa_line()
    assert line.startswith("ssh-dss ")
    error = refused(line + " old@host", "dsa")
    assert "DSA" in str(error)
    assert "ssh-ed25519" in str(error)


def test_invalid_base64_is_refused():
    kind, data = ed25519_line().split()
    error = refused(f"{kind} {data[:20]}$%{data[22:]}", "bad_base64")
    assert "base64" in str(error)
    refused(f"{kind} {data[:-1]}", "bad_base64")  # Bad padding.


@pytest.mark.parametrize("cut", [1, 5, 30, 47])
def test_truncated_key_is_refused(cut):
    blob = blob_of(ed25519_line())
    error = refused(f"ssh-ed25519 {b64(blob[:-cut])}", "damaged")
    assert "truncated or damaged" in str(error)


def test_truncated_rsa_key_is_refused():
    blob = blob_of(rsa_line(3072))
    refused(f"ssh-rsa {b64(blob[:-10])}", "damaged")


def test_missing_key_data_is_refused():
    refused("ssh-ed25519", "not_a_key")


def test_declared_type_must_match_the_key_data():
    error = refused(f"ssh-rsa {ed25519_line().split()[1]}", "type_mismatch")
    assert str(error) == "The key data is damaged: it does not match its declared type “ssh-rsa”."
    refused(f"ssh-ed25519 {rsa_line(3072).split()[1]}", "type_mismatch")


def test_ecdsa_curve_must_match_the_declared_type():
    blob = ssh_string(b"ecdsa-sha2-nistp384") + ssh_string(b"nistp256") + ssh_string(ec_point(256))
    refused(f"ecdsa-sha2-nistp384 {b64(blob)}", "type_mismatch")


def test_ecdsa_point_off_the_curve_is_refused():
    point = bytearray(ec_point(256))
    point[-1] ^= 1
    blob = ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(b"nistp256") + ssh_string(bytes(point))
    refused(f"ecdsa-sha2-nistp256 {b64(blob)}", "damaged")


def test_ed25519_key_of_wrong_length_is_refused():
    blob = ssh_string(b"ssh-ed25519") + ssh_string(b"\x01" * 31)
    refused(f"ssh-ed25519 {b64(blob)}", "damaged")


def test_rsa_key_with_negative_or_even_values_is_refused():
    modulus = int.from_bytes(b"\xc5" * 384, "big") | 1
    negative = ssh_string(b"ssh-rsa") + ssh_mpint(65537) + ssh_string(modulus.to_bytes(384, "big"))
    refused(f"ssh-rsa {b64(negative)}", "damaged")
    even_exponent = ssh_string(b"ssh-rsa") + ssh_mpint(65536) + ssh_mpint(modulus)
    refused(f"ssh-rsa {b64(even_exponent)}", "damaged")


@pytest.mark.parametrize("line", [ed25519_line, lambda: rsa_line(3072), lambda: openssh_line(ec_private_key(256))])
def test_trailing_bytes_are_refused(line):
    kind, data = line().split()
    error = refused(f"{kind} {b64(base64.b64decode(data) + bytes(1))}", "trailing_bytes")
    assert "unexpected bytes" in str(error)


@pytest.mark.parametrize(
    "prefix",
    [
        'command="echo hello" ',
        "restrict ",
        'no-pty,from="10.0.0.1" ',
        'environment="A=B" ',
        "no-port-forwarding,no-agent-forwarding ",
    ],
)
def test_options_prefix_is_refused(prefix):
    error = refused(prefix + ed25519_line(), "options")
    assert "not accepted" in str(error)
    assert "portal sets its own" in str(error)


@pytest.mark.parametrize(
    "line",
    [
        "ssh-ed25519\x00{data}",
        "ssh-ed25519 {data}\x1b[0m",
        "ssh-ed25519 \x07{data}",
    ],
)
def test_control_characters_are_refused(line):
    data = ed25519_line().split()[1]
    error = refused(line.format(data=data), "control_chars")
    assert "control characters" in str(error)


def test_line_break_inside_a_single_key_is_refused():
    error = refused(ed25519_line() + "\n" + other_ed25519_line(), "control_chars")
    assert "line" in str(error)


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "hello world",
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "<b>ssh-ed25519 AAAAC3NzaC1lZDI1NTE5</b>",
        "-----BEGIN PUBLIC KEY-----",
        "AAAAC3NzaC1lZDI1NTE5AAAAIGx1Y2t5",
    ],
)
def test_junk_is_not_a_key_line(line):
    error = refused(line, "not_a_key")
    assert str(error).startswith("This is not an OpenSSH public key line.")
    assert "ssh-ed25519 AAAA… you@host" in str(error)


def test_rfc4716_key_is_refused_with_a_hint():
    error = refused("---- BEGIN SSH2 PUBLIC KEY ----", "rfc4716")
    assert "ssh-keygen -i" in str(error)


def test_too_long_line_is_refused_before_parsing():
    assert str(refused("ssh-ed25519 " + "A" * MAX_LINE_LENGTH, "too_long")) == "Key too long."
    # Checked first: even a private key marker is not looked at.
    refused("-----BEGIN OPENSSH PRIVATE KEY-----" + " " * MAX_LINE_LENGTH, "too_long")


def test_error_is_a_value_error_with_code_and_message():
    error = refused(rsa_line(2048), "rsa_too_short")
    assert isinstance(error, ValueError)
    assert error.message == str(error)
    assert error.line is None
    assert "rsa_too_short" in repr(error)


def test_non_string_is_a_type_error():
    with pytest.raises(TypeError):
        parse_public_key(ed25519_line().encode())  # type: ignore[arg-type]


# --- Key data, parsed by cryptography ---------------------------------------------------------


@pytest.mark.parametrize("application", [b"ssh:", b"ssh:lab-gpu"])
def test_security_keys_with_an_application_are_accepted(application):
    for kind, blob in [
        ("sk-ssh-ed25519@openssh.com", sk_ed25519_blob(application)),
        ("sk-ecdsa-sha2-nistp256@openssh.com", sk_ecdsa_blob(application)),
    ]:
        key = parse_public_key(f"{kind} {b64(blob)} yubikey")
        assert (key.key_type, key.bits, key.blob) == (kind, 256, blob)
        assert key.fingerprint == expected_fingerprint(blob)
        assert key.openssh() == f"{kind} {b64(blob)} yubikey"


def test_security_key_application_must_start_with_ssh():
    refused(f"sk-ssh-ed25519@openssh.com {b64(sk_ed25519_blob(b'web:x'))}", "damaged")
    refused(f"sk-ecdsa-sha2-nistp256@openssh.com {b64(sk_ecdsa_blob(b''))}", "damaged")


@pytest.mark.parametrize(
    ("kind", "blob"),
    [
        ("sk-ssh-ed25519@openssh.com", lambda: blob_of(ed25519_line())),
        ("ssh-ed25519", sk_ed25519_blob),
        ("sk-ecdsa-sha2-nistp256@openssh.com", lambda: blob_of(openssh_line(ec_private_key(256)))),
        ("ecdsa-sha2-nistp256", sk_ecdsa_blob),
        ("ecdsa-sha2-nistp256", lambda: blob_of(openssh_line(ec_private_key(384)))),
        ("ssh-rsa", sk_ecdsa_blob),
    ],
)
def test_inner_type_must_match_the_outer_type(kind, blob):
    error = refused(f"{kind} {b64(blob())}", "type_mismatch")
    assert f"declared type “{kind}”" in str(error)


@pytest.mark.parametrize("cut", [1, 4, 5, 40, 70])
@pytest.mark.parametrize(
    ("kind", "blob"),
    [
        ("sk-ssh-ed25519@openssh.com", sk_ed25519_blob),
        ("sk-ecdsa-sha2-nistp256@openssh.com", sk_ecdsa_blob),
        ("ecdsa-sha2-nistp521", lambda: blob_of(openssh_line(ec_private_key(521)))),
    ],
)
def test_truncated_key_data_is_refused(kind, blob, cut):
    refused(f"{kind} {b64(blob()[:-cut])}", "damaged")


def test_key_data_cut_inside_its_type_name_is_damaged_not_mismatched():
    for length in (2, 4, 9):
        refused(f"ssh-ed25519 {b64(blob_of(ed25519_line())[:length])}", "damaged")


def test_trailing_bytes_after_a_security_key_are_refused():
    refused(f"sk-ssh-ed25519@openssh.com {b64(sk_ed25519_blob() + b'x')}", "trailing_bytes")


@pytest.mark.parametrize("bits", [1024, 2048, 3071])
def test_rsa_keys_below_the_minimum_are_refused(bits):
    modulus = (1 << (bits - 1)) | 1  # Only the size matters to the check.
    error = refused(f"ssh-rsa {b64(rsa_blob(65537, modulus))}", "rsa_too_short")
    assert error.params == {"bits": bits, "min_bits": 3072}


def test_rsa_keys_at_the_limits_are_accepted():
    assert parse_public_key(f"ssh-rsa {b64(rsa_blob(65537, (1 << 3071) | 1))}").bits == 3072
    assert parse_public_key(f"ssh-rsa {b64(rsa_blob(65537, (1 << 16383) | 1))}").bits == 16384


def test_rsa_key_with_zero_padded_numbers_is_refused():
    # ssh-keygen fingerprints the key written without the padding: the fingerprint would differ.
    modulus = rsa.generate_private_key(public_exponent=65537, key_size=3072).public_key().public_numbers().n
    padded_exponent = ssh_string(b"ssh-rsa") + ssh_string(b"\0\x01\0\x01") + ssh_mpint(modulus)
    padded_modulus = ssh_string(b"ssh-rsa") + ssh_mpint(65537) + ssh_string(b"\0" + ssh_mpint(modulus)[4:])
    for blob in (padded_exponent, padded_modulus):
        refused(f"ssh-rsa {b64(blob)}", "damaged")
    assert parse_public_key(f"ssh-rsa {b64(rsa_blob(65537, modulus))}").bits == 3072


def test_rsa_key_with_an_even_modulus_is_refused():
    refused(f"ssh-rsa {b64(rsa_blob(65537, 1 << 3071))}", "damaged")


def test_rsa_key_with_a_tiny_exponent_is_refused():
    refused(f"ssh-rsa {b64(rsa_blob(1, (1 << 3071) | 1))}", "damaged")


def test_compressed_ecdsa_point_is_refused():
    point = (
        ec_private_key(256)
        .public_key()
        .public_bytes(serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
    )
    blob = ssh_string(b"ecdsa-sha2-nistp256") + ssh_string(b"nistp256") + ssh_string(point)
    refused(f"ecdsa-sha2-nistp256 {b64(blob)}", "damaged")


def test_whatever_cryptography_raises_is_a_damaged_key(monkeypatch):
    for exception in (UnsupportedAlgorithm("no"), NotImplementedError("no"), TypeError("no"), OverflowError("no")):

        def load(data, exception=exception):
            raise exception

        monkeypatch.setattr(ssh_keys, "load_ssh_public_key", load)
        refused(ed25519_line(), "damaged")


def test_lines_too_long_never_reach_cryptography(monkeypatch):
    def load(data):
        raise AssertionError("cryptography was given an unbounded line")

    monkeypatch.setattr(ssh_keys, "load_ssh_public_key", load)
    refused("ssh-rsa AAAA" + "A" * (10 * 1024 * 1024), "too_long")
    refused_list(("ssh-rsa AAAA" + "A" * MAX_LINE_LENGTH + "\n") * 10, "too_long")


def test_mangled_key_data_is_refused_with_a_message_never_an_exception():
    rng = random.Random(10)
    sources = [
        ed25519_line().split()[1],
        rsa_line(3072).split()[1],
        openssh_line(ec_private_key(384)).split()[1],
        b64(sk_ed25519_blob()),
        b64(sk_ecdsa_blob()),
    ]
    kinds = sorted(ssh_keys.ACCEPTED_TYPES)
    for _ in range(1500):
        blob = bytearray(base64.b64decode(rng.choice(sources)))
        for _ in range(rng.randint(1, 4)):
            position = rng.randrange(len(blob))
            if rng.random() < 0.5:
                blob[position] = rng.randrange(256)
            else:
                del blob[position : position + rng.randint(1, 40)]
            if not blob:
                break
        with contextlib.suppress(InvalidSshKey):
            parse_public_key(f"{rng.choice(kinds)} {b64(bytes(blob))}")


# --- Lists of keys -----------------------------------------------------------------------------


def test_authorized_keys_with_comments_and_blank_lines():
    text = "\r\n".join(
        [
            "# my keys",
            "",
            ed25519_line() + " laptop",
            "   ",
            "  # old desktop, gone",
            rsa_line(3072) + " desktop",
            "",
        ]
    )
    keys = parse_authorized_keys(text)
    assert [key.comment for key in keys] == ["laptop", "desktop"]
    assert [key.key_type for key in keys] == ["ssh-ed25519", "ssh-rsa"]
    assert keys[0].fingerprint == expected_fingerprint(blob_of(ed25519_line()))


def test_error_in_a_list_names_the_line():
    text = "\n".join(["# comment", ed25519_line(), rsa_line(2048)])
    error = refused_list(text, "rsa_too_short")
    assert error.line == 3
    assert str(error) == "Line 3: RSA key of 2048 bits is too short: at least 3072 bits are required."


def test_junk_in_a_list_names_the_line():
    error = refused_list(ed25519_line() + "\n<script>alert(1)</script>\n", "not_a_key")
    assert str(error).startswith("Line 2: This is not an OpenSSH public key line.")


def test_duplicate_keys_are_refused():
    line = ed25519_line()
    text = "\n".join([line + " first", other_ed25519_line(), "", line + " same key, other comment"])
    error = refused_list(text, "duplicate")
    assert error.line == 4
    assert str(error) == "Line 4: This key is already given on line 1."


def test_at_most_max_keys():
    lines = [openssh_line(ed25519.Ed25519PrivateKey.generate()) for _ in range(4)]
    assert len(parse_authorized_keys("\n".join(lines[:3]), max_keys=3)) == 3
    error = refused_list("\n".join(lines), "too_many", max_keys=3)
    assert str(error) == "Too many keys: 4 given, at most 3 are accepted."
    assert "at most 1 is accepted" in str(refused_list("\n".join(lines[:2]), "too_many", max_keys=1))


def test_default_limit_is_ten_keys():
    lines = [openssh_line(ed25519.Ed25519PrivateKey.generate()) for _ in range(11)]
    assert len(parse_authorized_keys("\n".join(lines[:10]))) == 10
    refused_list("\n".join(lines), "too_many")


def test_pasted_private_key_file_is_reported_as_private_not_as_too_many_keys():
    error = refused_list(ed25519_private_pem(), "private_key", max_keys=2)
    assert str(error).startswith("Line 1: This is a private key.")


@pytest.mark.parametrize("text", ["", "   \n\n", "# only a comment\n#another\n"])
def test_empty_list_is_refused(text):
    error = refused_list(text, "empty")
    assert str(error) == "Give at least one SSH public key."


def test_too_much_text_is_refused():
    refused_list("#" * (MAX_LINE_LENGTH * 10 + 1), "too_long")
