"""Every variable X may be given as X_FILE=/path (portal/environment.py): the settings of a real process read the
file, a file that cannot be read stops the start with its name, and the variables whose value is a path keep it."""

import json
import re

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.environment import SecretFileEnv, SecretFileMapping
from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_SECRET_KEY, ROOT, _production

DATABASE_PASSWORD = "s3cret-database-password"
PRINT_SECRETS = (
    "import json; from django.conf import settings; "
    "print(json.dumps([settings.SECRET_KEY, settings.DATABASES['default']['PASSWORD']]))"
)


def _secret_files(tmp_path, **contents: str) -> dict[str, str]:
    files = {}
    for name, content in contents.items():
        path = tmp_path / name.lower()
        path.write_text(content)
        path.chmod(0o400)
        files[f"{name}_FILE"] = str(path)
    return files


def test_secrets_given_as_files_reach_the_settings_without_their_line_ending(tmp_path, production_chains):
    database_url = f"postgres://binome_app:{DATABASE_PASSWORD}@127.0.0.1:5432/binome_h"
    files = _secret_files(tmp_path, SECRET_KEY=f"{PRODUCTION_SECRET_KEY}\n", DATABASE_URL=f"{database_url}\n")

    result = _production(
        "shell",
        "-c",
        PRINT_SECRETS,
        SECRET_KEY=None,
        DATABASE_URL=None,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        **files,
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [PRODUCTION_SECRET_KEY, DATABASE_PASSWORD]


def test_a_missing_secret_file_stops_the_start_naming_the_variable_and_the_path(tmp_path, production_chains):
    missing = tmp_path / "secret_key"
    files = _secret_files(tmp_path, DATABASE_URL=f"postgres://binome_app:{DATABASE_PASSWORD}@127.0.0.1:5432/binome_h\n")

    result = _production(
        "check",
        SECRET_KEY=None,
        SECRET_KEY_FILE=str(missing),
        DATABASE_URL=None,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        **files,
    )

    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"SECRET_KEY_FILE='{missing}': the file cannot be read (No such file or directory)" in result.stderr
    assert "FileNotFoundError" not in output and DATABASE_PASSWORD not in output


def test_a_value_given_both_ways_is_refused(tmp_path, production_chains):
    files = _secret_files(tmp_path, SECRET_KEY=PRODUCTION_SECRET_KEY)

    result = _production(
        "check",
        SECRET_KEY="q" * 64,
        PAYMENTS_XPUB=NOT_DEMO_XPUB,
        PAYMENTS_CHAINS_FILE=str(production_chains),
        **files,
    )

    assert result.returncode != 0
    assert "SECRET_KEY and SECRET_KEY_FILE are both set: give the value one way only" in result.stderr
    assert PRODUCTION_SECRET_KEY not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("content", "value"),
    [("value\n", "value"), ("value\r\n", "value"), ("value", "value"), ("value\n\n", "value\n"), ("\n", "")],
)
def test_one_line_ending_is_dropped_and_no_more(tmp_path, content, value):
    path = tmp_path / "secret"
    path.write_bytes(content.encode())

    assert SecretFileMapping(env={"SECRET_FILE": str(path)}, cache=False)["SECRET"] == value


@pytest.mark.parametrize(
    ("content", "reason"), [(None, "Is a directory"), (b"\xff\xfe not text", "the file is not UTF-8 text")]
)
def test_a_file_that_cannot_be_read_is_refused_with_its_name(tmp_path, content, reason):
    path = tmp_path / "secret"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)

    with pytest.raises(ImproperlyConfigured, match=re.escape(f"SECRET_FILE='{path}'")) as refusal:
        SecretFileMapping(env={"SECRET_FILE": str(path)}, cache=False)["SECRET"]
    assert reason in str(refusal.value)


def test_an_empty_file_variable_leaves_the_variable_as_it_is():
    environment = SecretFileMapping(env={"SECRET": "value", "SECRET_FILE": ""}, cache=False)

    assert environment["SECRET"] == "value"
    with pytest.raises(KeyError):
        SecretFileMapping(env={"SECRET_FILE": ""}, cache=False)["SECRET"]


def test_a_variable_whose_value_is_a_path_keeps_it():
    env = SecretFileEnv()
    env.ENVIRON = SecretFileMapping(env={"PAYMENTS_CHAINS_FILE": "/run/secrets/chains"}, cache=False)

    assert env.str("PAYMENTS_CHAINS_FILE", default="") == "/run/secrets/chains"


def test_no_setting_has_a_file_twin_that_already_means_a_path():
    """A setting `X` read beside a variable `X_FILE` that names a file the portal or compose reads itself
    (`PROVISIONING_SSH_KEY_FILE`, the key) would be given that file's contents: the private key as a setting."""
    settings = (ROOT / "portal" / "settings.py").read_text()
    read = set(re.findall(r'\benv(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', settings))
    readers = [settings, (ROOT / "docker-compose.yml").read_text()]
    readers += [path.read_text() for path in ROOT.glob("bin/*") if path.is_file()]
    paths = set(re.findall(r"\b([A-Z][A-Z0-9_]*_FILE)\b", "\n".join(readers)))
    for example in ROOT.glob("deploy/*.env*"):  # what the operator's file sets (its comments are prose)
        paths |= set(re.findall(r"(?m)^([A-Z][A-Z0-9_]*_FILE)=", example.read_text()))

    assert {"PAYMENTS_CHAINS_FILE", "PROVISIONING_SSH_KEY_FILE", "CACHE_FILE", "CHAINS_FILE"} <= paths
    assert not {f"{name}_FILE" for name in read} & paths


SIGN = "from django.core import signing; print(signing.dumps({'confirmed': 'ada@lab.example.org'}))"
NEW_SECRET_KEY = "n3w-" + "k" * 60


def test_a_rotated_secret_key_keeps_what_the_former_one_signed_while_it_is_a_fallback(production_chains):
    production = {"PAYMENTS_XPUB": NOT_DEMO_XPUB, "PAYMENTS_CHAINS_FILE": str(production_chains)}
    signed = _production("shell", "-c", SIGN, SECRET_KEY=PRODUCTION_SECRET_KEY, **production).stdout.splitlines()[-1]
    script = f"from django.core import signing; print(signing.loads({signed!r}))"

    kept = _production("shell", "-c", script, SECRET_KEY=NEW_SECRET_KEY, SECRET_KEY_FALLBACKS=PRODUCTION_SECRET_KEY,
                       **production)  # fmt: skip
    dropped = _production("shell", "-c", script, SECRET_KEY=NEW_SECRET_KEY, **production)
    weak = _production("check", SECRET_KEY=NEW_SECRET_KEY, SECRET_KEY_FALLBACKS="short", **production)

    assert kept.returncode == 0 and "{'confirmed': 'ada@lab.example.org'}" in kept.stdout, kept.stderr[-2000:]
    assert dropped.returncode != 0 and "BadSignature" in dropped.stderr
    assert weak.returncode != 0 and "SECRET_KEY_FALLBACKS holds a short or development key" in weak.stderr
