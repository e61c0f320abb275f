"""Deposit addresses from an account-level xpub (payments.addresses).

Plain tests: no database, no Django settings needed (messages are only turned into text where
pytest-django has configured settings). Test keys are derived here from anvil's public test
mnemonic with bip-utils; the module itself never sees a mnemonic.
"""

import ast
import inspect

import pytest
from bip_utils import (
    Base58Decoder,
    Base58Encoder,
    Bip32Secp256k1,
    Bip39SeedGenerator,
    Bip44,
    Bip44Changes,
    Bip44Coins,
    EthAddrEncoder,
)
from eth_utils import is_checksum_address

from payments import addresses
from payments.addresses import (
    DEMO_ACCOUNT_XPUB,
    DEMO_MNEMONIC_NOTE,
    InvalidXpub,
    deposit_address,
    deposit_addresses,
    validate_account_xpub,
)

ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
# anvil's ten pre-funded accounts: m/44'/60'/0'/0/0..9 of the mnemonic above.
ANVIL_ACCOUNTS = [
    "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
    "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
    "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
    "0x90F79bf6EB2c4f870365E785982E1f101E93b906",
    "0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65",
    "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc",
    "0x976EA74026E726554dB657fA54763abd0C3a0aa9",
    "0x14dC79964da2C08b23698B3D3cc7Ca32193d9955",
    "0x23618e81E3f5cdF7f54C3d65f7FBc0aBf5B21E8f",
    "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720",
]

# BIP-32 test vector 1 (https://github.com/bitcoin/bips/blob/master/bip-0032.mediawiki#test-vector-1).
BIP32_V1_MASTER_XPUB = (
    "xpub661MyMwAqRbcFtXgS5sYJABqqG9YLmC4Q1Rdap9gSE8NqtwybGhePY2gZ29ESFjqJoCu1Rupje8YtGqsefD265TMg7usUDFdp6W1EGMcet8"
)
BIP32_V1_0H_1_2H_XPUB = (  # chain m/0H/1/2H: depth 3, last step hardened
    "xpub6D4BDPcP2GT577Vvch3R8wDkScZWzQzMMUm3PWbmWvVJrZwQY4VUNgqFJPMM3No2dFDFGTsxxpG5uJh7n7epu4trkrX7x7DogT5Uv6fcLW5"
)
BIP32_V1_0H_1_2H_XPRV = (
    "xprv9z4pot5VBttmtdRTWfWQmoH1taj2axGVzFqSb8C9xaxKymcFzXBDptWmT7FwuEzG3ryjH4ktypQSAewRiNMjANTtpgP4mLTj34bhnZX7UiM"
)
BIP32_V1_0H_1_2H_2_XPUB = (  # chain m/0H/1/2H/2
    "xpub6FHa3pjLCk84BayeJxFW2SP4XRrFd1JYnxeLeU8EqN3vDfZmbqBqaGJAyiLjTAwm6ZLRQUMv1ZACTj37sR62cfN7fe5JnJ7dh8zL4fiyLHV"
)

INDEX_SAMPLE = [0, 1, 2, 3, 19, 999, 123_456, 2**31 - 2, 2**31 - 1]


@pytest.fixture(scope="module")
def seed():
    return Bip39SeedGenerator(ANVIL_MNEMONIC).Generate()


def _account(seed, account):
    return Bip44.FromSeed(seed, Bip44Coins.ETHEREUM).Purpose().Coin().Account(account)


@pytest.fixture(scope="module")
def account0(seed):
    return _account(seed, 0)


@pytest.fixture(scope="module")
def account1(seed):
    return _account(seed, 1)


def _reencode(extended_key: str, version_hex: str) -> str:
    """The same key data under other version bytes (tprv, zprv, ypub...), with a valid checksum."""
    payload = Base58Decoder.CheckDecode(extended_key)
    return Base58Encoder.CheckEncode(bytes.fromhex(version_hex) + payload[4:])


def _generic_address(xpub: str, path: str) -> str:
    """The address of ``path`` below ``xpub`` by bip-utils' generic BIP-32 derivation."""
    node = Bip32Secp256k1.FromExtendedKey(xpub).DerivePath(path)
    return EthAddrEncoder.EncodeKey(node.PublicKey().KeyObject())


def _refusal(xpub) -> InvalidXpub:
    with pytest.raises(InvalidXpub) as excinfo:
        validate_account_xpub(xpub)
    # deposit_address and deposit_addresses refuse the same key with the same check.
    with pytest.raises(InvalidXpub) as again:
        deposit_address(xpub, 0)
    assert again.value.code == excinfo.value.code
    with pytest.raises(InvalidXpub) as again:
        deposit_addresses(xpub, range(3))
    assert again.value.code == excinfo.value.code
    return excinfo.value


# --- Known vectors -----------------------------------------------------------------------------------------------


def test_anvil_account_0_gives_anvils_well_known_accounts(account0):
    xpub = account0.PublicKey().ToExtended()
    validate_account_xpub(xpub)
    assert [deposit_address(xpub, i) for i in range(3)] == [
        "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
        "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
        "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
    ]
    assert list(deposit_addresses(xpub, range(10)).values()) == ANVIL_ACCOUNTS


def test_public_derivation_matches_private_derivation(account0, account1):
    """From the xpub alone, the same addresses bip-utils derives with the private keys."""
    for account in (account0, account1):
        xpub = account.PublicKey().ToExtended()
        chain = account.Change(Bip44Changes.CHAIN_EXT)
        for i in (0, 1, 7, 2**31 - 1):
            assert deposit_address(xpub, i) == chain.AddressIndex(i).PublicKey().ToAddress()


def test_demo_xpub_is_anvil_mnemonic_account_1(account1):
    assert account1.PublicKey().ToExtended() == DEMO_ACCOUNT_XPUB
    validate_account_xpub(DEMO_ACCOUNT_XPUB)
    assert Bip32Secp256k1.FromExtendedKey(DEMO_ACCOUNT_XPUB).Depth().ToInt() == 3


def test_demo_addresses_are_not_anvils_prefunded_accounts():
    demo = deposit_addresses(DEMO_ACCOUNT_XPUB, range(20))
    assert len(set(demo.values())) == 20
    assert not set(demo.values()) & set(ANVIL_ACCOUNTS)
    assert [demo[i] for i in (1, 2, 3)] == [
        "0x40FBBE484b8Ee6139Af08446950B088e10b2306A",
        "0x2b382887D362cCae885a421C978c7e998D3c95a6",
        "0x9BF4beE5bfbEbb3a4b7060dAe40CA6fD49305D60",
    ]


def test_demo_note_names_the_mnemonic_and_account():
    assert ANVIL_MNEMONIC in DEMO_MNEMONIC_NOTE
    assert "m/44'/60'/1'" in DEMO_MNEMONIC_NOTE
    assert "account 1" in DEMO_MNEMONIC_NOTE
    assert "account 0" in DEMO_MNEMONIC_NOTE


def test_bip32_vector_1_is_an_arbitrary_account_xpub():
    vector = Bip32Secp256k1.FromExtendedKey(BIP32_V1_0H_1_2H_XPUB)
    assert vector.Depth().ToInt() == 3
    assert vector.IsPublicOnly()
    assert vector.Index().IsHardened()
    # bip-utils' public derivation reproduces the published next step of the chain (m/0H/1/2H/2) ...
    assert vector.ChildKey(2).PublicKey().ToExtended() == BIP32_V1_0H_1_2H_2_XPUB
    # ... and the private key of the same node gives the same public one.
    assert Bip32Secp256k1.FromExtendedKey(BIP32_V1_0H_1_2H_XPRV).PublicKey().ToExtended() == BIP32_V1_0H_1_2H_XPUB

    validate_account_xpub(BIP32_V1_0H_1_2H_XPUB)
    for i in INDEX_SAMPLE:
        assert deposit_address(BIP32_V1_0H_1_2H_XPUB, i) == _generic_address(BIP32_V1_0H_1_2H_XPUB, f"0/{i}")
    # The external chain, not the change chain 1.
    assert deposit_address(BIP32_V1_0H_1_2H_XPUB, 0) != _generic_address(BIP32_V1_0H_1_2H_XPUB, "1/0")


def test_surrounding_whitespace_is_ignored():
    padded = f"  {DEMO_ACCOUNT_XPUB}\n"
    validate_account_xpub(padded)
    assert deposit_address(padded, 5) == deposit_address(DEMO_ACCOUNT_XPUB, 5)


# --- Many addresses ----------------------------------------------------------------------------------------------


def test_deposit_addresses_matches_deposit_address():
    many = deposit_addresses(DEMO_ACCOUNT_XPUB, range(1000))
    assert list(many) == list(range(1000))
    assert len(set(many.values())) == 1000
    for i in [0, 1, 2, 17, 250, 500, 998, 999]:
        assert many[i] == deposit_address(DEMO_ACCOUNT_XPUB, i)
    for address in many.values():
        assert is_checksum_address(address)
        assert address.startswith("0x")
        assert len(address) == 42
    # EIP-55 mixed case, not plain hex (a single address may by chance have no upper-case letter).
    assert sum(address != address.lower() for address in many.values()) > 900


def test_deposit_addresses_keeps_the_order_of_a_list():
    indexes = [7, 2**31 - 1, 0, 7]
    result = deposit_addresses(BIP32_V1_0H_1_2H_XPUB, indexes)
    assert list(result) == [7, 2**31 - 1, 0]
    assert result == {i: deposit_address(BIP32_V1_0H_1_2H_XPUB, i) for i in indexes}
    assert deposit_addresses(BIP32_V1_0H_1_2H_XPUB, []) == {}


@pytest.fixture
def derivations(monkeypatch) -> dict[str, int]:
    """How many times an extended key is parsed and a BIP-32 child derived (the costly steps: a point on secp256k1)."""
    counts = {"parsed": 0, "children": 0}
    node = addresses.Bip32Slip10Secp256k1
    parse, child = node.FromExtendedKey.__func__, node.ChildKey

    def counted_parse(cls, *args, **kwargs):
        counts["parsed"] += 1
        return parse(cls, *args, **kwargs)

    def counted_child(self, *args, **kwargs):
        counts["children"] += 1
        return child(self, *args, **kwargs)

    monkeypatch.setattr(node, "FromExtendedKey", classmethod(counted_parse))
    monkeypatch.setattr(node, "ChildKey", counted_child)
    return counts


def test_thousand_addresses_cost_one_parse_and_one_derivation_each(derivations):
    """The key parsed and …/0 derived once, then one child derivation an address; a second batch hits the cache."""
    addresses._cached_external_chain.cache_clear()  # include parsing the key and deriving …/0
    result = deposit_addresses(BIP32_V1_0H_1_2H_XPUB, range(1000))
    assert len(result) == 1000
    assert derivations == {"parsed": 1, "children": 1 + 1000}
    assert deposit_addresses(BIP32_V1_0H_1_2H_XPUB, range(1000, 1500)).keys() == set(range(1000, 1500))
    assert derivations == {"parsed": 1, "children": 1 + 1000 + 500}


# --- Indexes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", [-1, -(2**31), 2**31, 2**31 + 5, 2**32])
def test_out_of_range_index_is_refused(index):
    with pytest.raises(ValueError) as excinfo:
        deposit_address(DEMO_ACCOUNT_XPUB, index)
    assert not isinstance(excinfo.value, InvalidXpub)
    with pytest.raises(ValueError):
        deposit_addresses(DEMO_ACCOUNT_XPUB, [0, 1, index])


@pytest.mark.parametrize("index", [1.0, "1", None, True])
def test_index_must_be_an_int(index):
    with pytest.raises(TypeError):
        deposit_address(DEMO_ACCOUNT_XPUB, index)
    with pytest.raises(TypeError):
        deposit_addresses(DEMO_ACCOUNT_XPUB, [0, index])


def test_largest_index_is_accepted():
    assert is_checksum_address(deposit_address(DEMO_ACCOUNT_XPUB, 2**31 - 1))


# --- Refusals ----------------------------------------------------------------------------------------------------


def test_xprv_from_the_mnemonic_is_refused_as_private(account0):
    xprv = account0.PrivateKey().ToExtended()
    assert xprv.startswith("xprv")
    error = _refusal(xprv)
    assert error.code == "private_key"
    assert not error.params  # the key is not repeated in the message


@pytest.mark.parametrize(
    ("version", "prefix"),
    [
        ("0488ade4", "xprv"),
        ("04358394", "tprv"),
        ("049d7878", "yprv"),
        ("04b2430c", "zprv"),
        ("02aa7a99", "Zprv"),
        ("045f18bc", "vprv"),
    ],
)
def test_private_keys_of_any_version_are_refused(version, prefix):
    private = _reencode(BIP32_V1_0H_1_2H_XPRV, version)
    assert private.startswith(prefix)
    assert _refusal(private).code == "private_key"


def test_private_key_data_under_an_unknown_version_is_refused_as_private():
    private = _reencode(BIP32_V1_0H_1_2H_XPRV, "01020304")
    assert _refusal(private).code == "private_key"


def test_private_key_data_under_the_xpub_version_is_refused_as_private():
    private = _reencode(BIP32_V1_0H_1_2H_XPRV, "0488b21e")
    assert private.startswith("xpub")
    assert _refusal(private).code == "private_key"


def test_mistyped_xprv_is_still_refused_as_private():
    mistyped = BIP32_V1_0H_1_2H_XPRV[:-1] + ("A" if BIP32_V1_0H_1_2H_XPRV[-1] != "A" else "B")
    assert _refusal(mistyped).code == "private_key"
    assert _refusal(BIP32_V1_0H_1_2H_XPRV[:60]).code == "private_key"


def test_mnemonic_is_refused():
    assert _refusal(ANVIL_MNEMONIC).code == "mnemonic"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "not a key",
        "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266",
        "xpub0OIl",  # 0, O, I and l are outside the Base58 alphabet
        "nope",  # Base58, but not a damaged extended key
        "1" * 111,
        "x" * 5000,
        None,
        12345,
        b"xpub",
    ],
)
def test_garbage_is_refused(garbage):
    assert _refusal(garbage).code == "not_xpub"


def test_base58check_of_the_wrong_length_is_refused():
    payload = Base58Decoder.CheckDecode(BIP32_V1_0H_1_2H_XPUB)
    assert _refusal(Base58Encoder.CheckEncode(payload[:-1])).code == "not_xpub"
    assert _refusal(Base58Encoder.CheckEncode(payload + b"\x00")).code == "not_xpub"


def test_truncated_xpub_fails_its_checksum():
    assert _refusal(DEMO_ACCOUNT_XPUB[:-1]).code == "checksum"
    assert _refusal(DEMO_ACCOUNT_XPUB[:100]).code == "checksum"


def test_mistyped_xpub_fails_its_checksum():
    position = 50
    replacement = "2" if DEMO_ACCOUNT_XPUB[position] != "2" else "3"
    mistyped = DEMO_ACCOUNT_XPUB[:position] + replacement + DEMO_ACCOUNT_XPUB[position + 1 :]
    assert _refusal(mistyped).code == "checksum"


@pytest.mark.parametrize(
    ("version", "prefix"),
    [("043587cf", "tpub"), ("049d7cb2", "ypub"), ("04b24746", "zpub"), ("02aa7ed3", "Zpub")],
)
def test_other_public_versions_are_refused(version, prefix):
    other = _reencode(DEMO_ACCOUNT_XPUB, version)
    assert other.startswith(prefix)
    error = _refusal(other)
    assert error.code == "wrong_version"
    assert error.params == {"prefix": prefix}


def test_unknown_version_is_refused():
    assert _refusal(_reencode(DEMO_ACCOUNT_XPUB, "01020304")).code == "not_xpub"


def test_key_off_the_curve_is_refused():
    payload = bytearray(Base58Decoder.CheckDecode(DEMO_ACCOUNT_XPUB))
    payload[45] = 0x04  # not a compressed-point prefix
    assert _refusal(Base58Encoder.CheckEncode(bytes(payload))).code == "invalid_point"


def test_master_xpub_depth_0_is_refused(seed):
    master = Bip32Secp256k1.FromSeed(seed).PublicKey().ToExtended()
    for xpub in (master, BIP32_V1_MASTER_XPUB):
        error = _refusal(xpub)
        assert error.code == "wrong_depth"
        assert error.params == {"depth": 0}


def test_address_level_xpub_depth_5_is_refused(account0):
    address_level = account0.Change(Bip44Changes.CHAIN_EXT).AddressIndex(0).PublicKey().ToExtended()
    error = _refusal(address_level)
    assert error.code == "wrong_depth"
    assert error.params == {"depth": 5}


@pytest.mark.parametrize("path", ["m/44'", "m/44'/60'", "m/44'/60'/0'/0"])
def test_other_depths_are_refused(seed, path):
    xpub = Bip32Secp256k1.FromSeed(seed).DerivePath(path).PublicKey().ToExtended()
    error = _refusal(xpub)
    assert error.code == "wrong_depth"
    assert error.params == {"depth": path.count("/")}


def test_depth_3_key_with_a_non_hardened_last_step_is_refused():
    xpub = Bip32Secp256k1.FromExtendedKey(BIP32_V1_MASTER_XPUB).DerivePath("0/1/2").PublicKey().ToExtended()
    assert Bip32Secp256k1.FromExtendedKey(xpub).Depth().ToInt() == 3
    assert _refusal(xpub).code == "not_hardened"


def test_refusals_are_value_errors():
    assert issubclass(InvalidXpub, ValueError)
    assert repr(_refusal("nope")) == "InvalidXpub(code='not_xpub', params={})"


# --- Messages (need Django settings: pytest-django configures them) ---------------------------------------------


@pytest.fixture
def english():
    from django.utils import translation

    with translation.override("en"):
        yield


def test_messages_say_what_is_wrong(english, account0):
    assert str(_refusal(account0.PrivateKey().ToExtended())) == (
        "This is a private extended key (xprv…): configure the account's public key (xpub…) only."
    )
    assert str(_refusal("not a key")) == "Not an extended public key."
    address_level = account0.Change(Bip44Changes.CHAIN_EXT).AddressIndex(0).PublicKey().ToExtended()
    assert str(_refusal(address_level)) == (
        "This key is at depth 5; the account-level key m/44'/60'/account' has depth 3."
    )
    assert "checksum" in str(_refusal(DEMO_ACCOUNT_XPUB[:-1]))
    assert "zpub…" in str(_refusal(_reencode(DEMO_ACCOUNT_XPUB, "04b24746")))
    assert "mnemonic" in str(_refusal(ANVIL_MNEMONIC))


def test_messages_never_repeat_the_key(english, account0):
    xprv = account0.PrivateKey().ToExtended()
    for key in (xprv, xprv[:-1], ANVIL_MNEMONIC):
        error = _refusal(key)
        assert key not in str(error)
        assert key[:20] not in str(error)
        assert "test test" not in str(error)


# --- The module never handles secrets ----------------------------------------------------------------------------


def test_module_has_no_code_that_derives_from_a_mnemonic_or_seed():
    tree = ast.parse(inspect.getsource(addresses))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    forbidden = {"Bip39SeedGenerator", "Bip39MnemonicDecoder", "Bip44", "Bip49", "Bip84", "FromSeed", "FromSeedAndPath"}
    forbidden |= {"FromPrivateKey", "Generate", "PrivateKey"}
    assert not names & forbidden
