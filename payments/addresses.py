"""Deposit addresses for crypto invoices, derived from an account-level extended public key.

Each invoice gets its own EVM address, the external-chain child ``m/44'/60'/account'/0/index``
of the account the operator configured. The server is given only the account's extended
*public* key (``xpub…``, depth 3, the last step hardened), so it can derive every deposit
address but can never spend from them: no private key, extended private key or mnemonic may
ever be configured, and :func:`validate_account_xpub` refuses them with a message that says so.

Derivation is BIP-32 public child derivation (CKDpub) on secp256k1, done by bip-utils. The
node ``…/0`` of an xpub is derived once and cached, so each address costs one CKD step, one
Keccak-256 and the EIP-55 checksum.

Messages are lazy translations, turned into text only when ``str()`` is called on the
exception, so this module can be imported and used without Django settings.
``InvalidXpub.code`` says which check failed, for callers and tests. Messages never repeat the
key that was given: it might be a private one, and messages end up in logs.
"""

from __future__ import annotations

import functools
from typing import Any

from bip_utils import Base58ChecksumError, Base58Decoder, Bip32KeyError, Bip32Slip10Secp256k1, EthAddrEncoder
from django.utils.translation import gettext_lazy as _

__all__ = [
    "ACCOUNT_DEPTH",
    "DEMO_ACCOUNT_XPUB",
    "DEMO_MNEMONIC_NOTE",
    "MAX_INDEX",
    "InvalidXpub",
    "deposit_address",
    "deposit_addresses",
    "validate_account_xpub",
]

ACCOUNT_DEPTH = 3  # m / 44' / 60' / account'
EXTERNAL_CHAIN = 0  # BIP-44 "change" level: 0 is the external (receiving) chain
MAX_INDEX = 2**31 - 1  # non-hardened child indexes only: hardened ones cannot be derived from a public key

DEMO_MNEMONIC_NOTE = (
    "The demo xpub is derived from anvil's public test mnemonic "
    "\"test test test test test test test test test test test junk\" at account 1 (m/44'/60'/1'), "
    "so its deposit addresses are not anvil's pre-funded accounts, which are account 0 (m/44'/60'/0'/0/0..9); "
    "that mnemonic is public: never use it, or any address derived from it, outside a local chain."
)

# m/44'/60'/1' of the mnemonic above, computed once with bip-utils and pasted here: this module
# deliberately contains no code that derives keys from a mnemonic or a seed.
DEMO_ACCOUNT_XPUB = (
    "xpub6Ce9NcJvTk372KjsGfWqbcex5DumjpNquQLApoeQUavSCjEc823BV1tb4rXUuPuht8h2hSxkg2EXUaKUJmniJvRZAELxypsCzBFdtosmV76"
)

_SERIALIZED_LEN = 78  # version 4, depth 1, parent fingerprint 4, child index 4, chain code 32, key 33
_MAX_INPUT_LEN = 200  # a serialized extended key is 111 Base58 characters; anything much longer is not one
_XPUB_VERSION = bytes.fromhex("0488b21e")
# BIP-32 and SLIP-132 private versions: xprv tprv yprv uprv zprv vprv Yprv Uprv Zprv Vprv.
_PRIVATE_VERSIONS = frozenset(
    bytes.fromhex(v)
    for v in (
        "0488ade4", "04358394", "049d7878", "044a4e28", "04b2430c",
        "045f18bc", "0295b005", "024285b5", "02aa7a99", "02575048",
    )
)  # fmt: skip
# The public counterparts, refused but named in the message: tpub ypub upub zpub vpub Ypub Upub Zpub Vpub.
_OTHER_PUBLIC_VERSIONS = {
    bytes.fromhex(v): prefix
    for v, prefix in (
        ("043587cf", "tpub"), ("049d7cb2", "ypub"), ("044a5262", "upub"), ("04b24746", "zpub"),
        ("045f1cf6", "vpub"), ("0295b43f", "Ypub"), ("024289ef", "Upub"), ("02aa7ed3", "Zpub"), ("02575483", "Vpub"),
    )
}  # fmt: skip
_PRIVATE_PREFIXES = ("xprv", "tprv", "yprv", "uprv", "zprv", "vprv", "Yprv", "Uprv", "Zprv", "Vprv")
_PUBLIC_PREFIXES = ("xpub", *_OTHER_PUBLIC_VERSIONS.values())


class InvalidXpub(ValueError):
    """An extended key Binôme refuses as an account's deposit key.

    ``code`` names the failed check (``"private_key"``, ``"mnemonic"``, ``"not_xpub"``,
    ``"checksum"``, ``"wrong_version"``, ``"invalid_point"``, ``"wrong_depth"``,
    ``"not_hardened"``), ``params`` the values put in the message. ``str(exc)`` (or
    ``exc.message``) gives the translated text.
    """

    def __init__(self, message: Any, code: str, params: dict[str, Any] | None = None):
        self.template = message
        self.code = code
        self.params = dict(params or {})
        super().__init__(message, code)

    @property
    def message(self) -> str:
        return str(self.template % self.params if self.params else self.template)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"InvalidXpub(code={self.code!r}, params={self.params!r})"


def _private_key() -> InvalidXpub:
    return InvalidXpub(
        _("This is a private extended key (xprv…): configure the account's public key (xpub…) only."),
        "private_key",
    )


def _not_xpub() -> InvalidXpub:
    return InvalidXpub(_("Not an extended public key."), "not_xpub")


def _parse_account_xpub(xpub: object) -> Bip32Slip10Secp256k1:
    """The public-only BIP-32 node of ``xpub`` after every check, or ``InvalidXpub``."""
    if not isinstance(xpub, str):
        raise _not_xpub()
    text = xpub.strip()
    if text.startswith(_PRIVATE_PREFIXES):
        # Said before the checksum is checked: a mistyped private key is still a private key.
        raise _private_key()
    if len(text.split()) >= 12:
        raise InvalidXpub(
            _(
                "This looks like a mnemonic (seed phrase): never configure it on the server; "
                "configure the account's public key (xpub…) only."
            ),
            "mnemonic",
        )
    if not text or len(text) > _MAX_INPUT_LEN:
        raise _not_xpub()
    try:
        payload = Base58Decoder.CheckDecode(text)
    except Base58ChecksumError:
        if not text.startswith(_PUBLIC_PREFIXES):  # "hello" is Base58 too: only a damaged key gets the checksum message
            raise _not_xpub() from None
        raise InvalidXpub(
            _("The key's checksum does not match: it is truncated or mistyped. Copy the whole xpub… again."),
            "checksum",
        ) from None
    except ValueError:  # a character outside the Base58 alphabet
        raise _not_xpub() from None
    if len(payload) != _SERIALIZED_LEN:
        raise _not_xpub()
    version, key_bytes = payload[:4], payload[45:]
    if version in _PRIVATE_VERSIONS or key_bytes[0] == 0:  # serialized private keys start with 0x00
        raise _private_key()
    if version != _XPUB_VERSION:
        if version in _OTHER_PUBLIC_VERSIONS:
            raise InvalidXpub(
                _("This is a %(prefix)s… key; give the account's public key in the standard xpub… form."),
                "wrong_version",
                {"prefix": _OTHER_PUBLIC_VERSIONS[version]},
            )
        raise _not_xpub()
    try:
        node = Bip32Slip10Secp256k1.FromExtendedKey(text)
    except (Bip32KeyError, ValueError):  # the 33 key bytes are not a point of secp256k1
        raise InvalidXpub(
            _("Not an extended public key: its key is not a valid secp256k1 public key."), "invalid_point"
        ) from None
    depth = node.Depth().ToInt()
    if depth != ACCOUNT_DEPTH:
        raise InvalidXpub(
            _("This key is at depth %(depth)d; the account-level key m/44'/60'/account' has depth 3."),
            "wrong_depth",
            {"depth": depth},
        )
    if not node.Index().IsHardened():
        raise InvalidXpub(
            _(
                "This depth-3 key was derived with a non-hardened last step; "
                "the account-level key m/44'/60'/account' ends with a hardened index."
            ),
            "not_hardened",
        )
    return node


def validate_account_xpub(xpub: str) -> None:
    """Raise ``InvalidXpub`` unless ``xpub`` is an account-level extended public key (depth 3).

    Surrounding whitespace is ignored. Refused: private extended keys (``xprv…``, ``tprv…``,
    ``zprv…``… and any key whose data is a private key), mnemonics, strings that are not
    Base58Check, a wrong checksum, other versions (``tpub``, ``ypub``, ``zpub``…), a key that
    is not a point of secp256k1, a depth other than 3, a depth-3 key whose last step is not
    hardened.
    """
    _external_chain(xpub)


def _external_chain(xpub: object) -> Bip32Slip10Secp256k1:
    """The node ``…/0`` of a checked account xpub."""
    if not isinstance(xpub, str):
        raise _not_xpub()
    return _cached_external_chain(xpub)


@functools.lru_cache(maxsize=32)
def _cached_external_chain(xpub: str) -> Bip32Slip10Secp256k1:
    # Derived once per xpub: BIP-32 nodes are immutable, and refusals (exceptions) are not cached.
    return _parse_account_xpub(xpub).ChildKey(EXTERNAL_CHAIN)


def _check_index(index: object) -> int:
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"A deposit address index is an int, not {type(index).__name__}.")
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"A deposit address index is between 0 and 2**31 - 1 inclusive, not {index}.")
    return index


def _address(chain: Bip32Slip10Secp256k1, index: int) -> str:
    return EthAddrEncoder.EncodeKey(chain.ChildKey(index).PublicKey().KeyObject())


def deposit_address(xpub: str, index: int) -> str:
    """The EIP-55 checksummed address of ``m/44'/60'/account'/0/index`` under the account ``xpub``.

    ``InvalidXpub`` if the key is refused (see :func:`validate_account_xpub`); ``ValueError``
    unless ``0 <= index < 2**31``; ``TypeError`` if ``index`` is not an int.
    """
    _check_index(index)
    return _address(_external_chain(xpub), index)


def deposit_addresses(xpub: str, indexes: range | list[int]) -> dict[int, str]:
    """``{index: deposit_address(xpub, index)}`` for each of ``indexes``, in their order.

    Every index is checked before any address is derived; the node ``…/0`` is derived once,
    then each address costs one child derivation.
    """
    checked = [_check_index(index) for index in indexes]
    chain = _external_chain(xpub)
    return {index: _address(chain, index) for index in checked}
