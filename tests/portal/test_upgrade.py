"""Migrations only move forward: a database made by an earlier commit of main, with its data, is migrated by this
code, and keeps the data. EARLIER moves forward at each release (to the release's commit); its code runs from `git
archive`, with this checkout's Python packages, on a PostgreSQL database of the test's own."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import sql

ROOT = Path(__file__).resolve().parents[2]
# Stop 40 (6 December 2026), the code before issue 35: the migrations' one baseline, deployed as the first release.
EARLIER = "08876c81cd84fde0bc622b437aa9d1685b3ad644"
COUNTED = [
    "inventory_hardwareclass", "inventory_lot", "inventory_host", "booking_price", "booking_environmentimage",
    "auth_user", "booking_bookingpolicy",
]  # fmt: skip


@pytest.fixture
def empty_database():
    """The URL of a new, empty PostgreSQL database, dropped after the test."""
    settings = connection.settings_dict
    name = f"binome_upgrade_{secrets.token_hex(4)}"
    server = {"host": settings["HOST"], "port": settings["PORT"], "user": settings["USER"], "dbname": "postgres"}
    with psycopg.connect(**server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{name}", {**server, "dbname": name}
    with psycopg.connect(**server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _manage(code: Path, url: str, *argv: str) -> str:
    environment = {**os.environ, "DATABASE_URL": url, "DEBUG": "1", "PYTHONPATH": str(code)}
    done = subprocess.run(
        [sys.executable, "manage.py", *argv], cwd=code, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{code.name}: manage.py {' '.join(argv)}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def _counts(database: dict) -> dict[str, int]:
    with psycopg.connect(**database) as reader:
        count = sql.SQL("SELECT count(*) FROM {}")
        return {table: reader.execute(count.format(sql.Identifier(table))).fetchone()[0] for table in COUNTED}


def test_a_database_of_the_earlier_release_with_its_data_migrates_forward_and_keeps_it(tmp_path, empty_database):
    url, database = empty_database
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    archive = subprocess.run(["git", "archive", EARLIER], cwd=ROOT, capture_output=True, check=False)
    assert archive.returncode == 0, f"commit {EARLIER[:12]} is not in this clone: {archive.stderr.decode()[-500:]}"
    subprocess.run(["tar", "-x", "-C", str(earlier)], input=archive.stdout, check=True)

    # given: the earlier release's database, made by its own migrations, with its catalog, lots and operator
    _manage(earlier, url, "migrate", "--no-input", "-v", "0")
    _manage(earlier, url, "seed_demo")
    before = _counts(database)
    assert all(before.values()), before

    # when: this code migrates it
    _manage(ROOT, url, "migrate", "--no-input", "-v", "0")

    # then: nothing is left to apply, the data is all there, and what this code added works on it
    assert "No planned migration operations." in _manage(ROOT, url, "migrate", "--plan")
    assert _counts(database) == before
    with psycopg.connect(**database) as reader:
        assert reader.execute("SELECT count(*) FROM portal_scheduledrun").fetchone() == (0,)
    assert "Demo catalog" in _manage(ROOT, url, "seed_demo")  # the current code reads and writes the old rows
    assert _counts(database) == before
