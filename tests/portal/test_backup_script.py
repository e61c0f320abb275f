"""deploy/backup, the compose stack's backup service, run here as the service runs it but with stand-ins for
PostgreSQL's tools: a dump that fails or does not read back to its end is never named a dump, never costs the
earlier dumps, and settings that would erase them or loop are refused. (The whole drill, with the real tools, a
real database and bin/restore, is tests/portal/test_compose_stack_host.py's.)"""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKUP = ROOT / "deploy" / "backup"
DAY = 86400

# pg_dump writes what FAKE_DUMP says (or fails); pg_restore reads a dump back to its end only if it is whole.
PG_DUMP = """#!/bin/sh
for argument; do case "$argument" in --file=*) file=${argument#--file=} ;; esac; done
case "$FAKE_DUMP" in
    fail) echo "pg_dump: error: could not write: No space left on device" >&2; exit 1 ;;
    cut) printf 'PGDMP cut short' > "$file" ;;
    *) printf 'PGDMP whole' > "$file" ;;
esac
"""
PG_RESTORE = """#!/bin/sh
for argument; do case "$argument" in --file=*) ;; *) dump=$argument ;; esac; done
grep -q whole "$dump" || { echo "pg_restore: error: could not read input file: end of file" >&2; exit 1; }
"""


@pytest.fixture
def tools(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    for name, text in {"pg_dump": PG_DUMP, "pg_restore": PG_RESTORE, "pg_isready": "#!/bin/sh\nexit 0\n"}.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture
def backups(tmp_path):
    """The backup folder with two earlier dumps, 20 and 2 days old."""
    folder = tmp_path / "backups"
    folder.mkdir()
    for name, age in [("binome-20261117T030000Z.dump", 20 * DAY), ("binome-20261205T030000Z.dump", 2 * DAY)]:
        (folder / name).write_text("PGDMP whole")
        os.utime(folder / name, (time.time() - age, time.time() - age))
    return folder


def _environment(tools: Path, backups: Path, **settings: str) -> dict[str, str]:
    return {"PATH": f"{tools}:/usr/bin:/bin", "BACKUP_TARGET_DIR": str(backups), **settings}


def _dumps(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_a_dump_that_fails_in_the_service_s_loop_is_not_kept_and_costs_no_earlier_dump(tools, backups):
    for failure in ("fail", "cut"):
        service = subprocess.Popen(
            ["sh", str(BACKUP)], env=_environment(tools, backups, FAKE_DUMP=failure, BACKUP_KEEP_DAYS="14"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(service.stdout), daemon=True).start()  # noqa: B023
        deadline = time.monotonic() + 20
        while not any("next try in an hour" in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(service.pid, signal.SIGTERM)
        service.wait(timeout=10)
        said = "".join(lines)
        assert "next try in an hour" in said, said
        assert _dumps(backups) == ["binome-20261117T030000Z.dump", "binome-20261205T030000Z.dump"], (failure, said)


def test_a_whole_dump_is_named_private_and_only_then_the_old_ones_go(tools, backups):
    taken = subprocess.run(
        ["sh", str(BACKUP), "once"], env=_environment(tools, backups, BACKUP_KEEP_DAYS="14"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert taken.returncode == 0, taken.stderr
    kept = _dumps(backups)
    assert len(kept) == 2 and "binome-20261205T030000Z.dump" in kept and "binome-20261117T030000Z.dump" not in kept
    new = backups / next(name for name in kept if name != "binome-20261205T030000Z.dump")
    assert new.stat().st_mode & 0o777 == 0o600 and f"backup: {new}" in taken.stdout


def test_once_says_a_failure_by_its_exit_status(tools, backups):
    failed = subprocess.run(
        ["sh", str(BACKUP), "once"], env=_environment(tools, backups, FAKE_DUMP="cut"),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert failed.returncode == 1 and "does not read back to its end" in failed.stderr
    assert len(_dumps(backups)) == 2


@pytest.mark.parametrize("setting", ["BACKUP_KEEP_DAYS", "BACKUP_EVERY_HOURS"])
@pytest.mark.parametrize("value", ["0", "-1", "1h", "007"])
def test_settings_that_would_erase_every_dump_or_loop_are_refused(tools, backups, setting, value):
    refused = subprocess.run(
        ["sh", str(BACKUP), "once"], env=_environment(tools, backups, **{setting: value}),
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 2 and setting in refused.stderr
    assert len(_dumps(backups)) == 2
