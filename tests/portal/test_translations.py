"""The French catalogue is the code's: `make translations` (Django's makemessages) run on a copy of the tree changes
nothing in it, and every message in it is translated, none fuzzy. A string added or moved without refreshing the
catalogue, or left untranslated, is what a French researcher would meet in English."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = Path("locale/fr/LC_MESSAGES/django.po")
SOURCES = {".py", ".html", ".txt", ".js", ".po"}


def _without_creation_date(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith('"POT-Creation-Date:'))


def _copy_of_the_tree(target: Path) -> Path:
    """The files makemessages reads (the tracked and new ones git does not ignore), the Makefile and manage.py."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    for name in listed:
        source = ROOT / name
        if source.is_file() and (source.suffix in SOURCES or name in {"Makefile", "manage.py"}):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
    return target


def _refreshed(tree: Path) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", "translations", f"BIN={Path(sys.executable).parent}"],
        cwd=tree, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return (tree / CATALOGUE).read_text()


def _flagged(catalogue: Path, *flags: str) -> str:
    """The entries msgattrib selects (untranslated, fuzzy), obsolete ones left out; empty when there are none but
    the header."""
    result = subprocess.run(
        ["msgattrib", *flags, "--no-obsolete", "--no-wrap", str(catalogue)], capture_output=True, text=True, check=True
    )
    entries = [entry for entry in result.stdout.split("\n\n") if entry.strip() and 'msgid ""\nmsgstr ""' not in entry]
    return "\n\n".join(entries)


def test_makemessages_changes_nothing_in_the_french_catalogue(tmp_path):
    tree = _copy_of_the_tree(tmp_path)
    committed = (ROOT / CATALOGUE).read_text()
    refreshed = _refreshed(tree)
    assert _without_creation_date(refreshed) == _without_creation_date(committed), (
        "the French catalogue is not the code's: run `make translations`, translate what is new, commit the .po"
    )


def test_every_message_has_its_french_translation():
    assert _flagged(ROOT / CATALOGUE, "--untranslated") == ""
    assert _flagged(ROOT / CATALOGUE, "--only-fuzzy") == ""


def test_a_new_string_in_the_code_and_an_untranslated_one_are_both_refused(tmp_path):
    tree = _copy_of_the_tree(tmp_path)
    page = tree / "web" / "customer" / "terms.py"
    page.write_text(
        page.read_text() + '\n\nfrom django.utils.translation import gettext as _\n_("A sentence nobody translated")\n'
    )
    committed = (tree / CATALOGUE).read_text()
    refreshed = _refreshed(tree)
    assert _without_creation_date(refreshed) != _without_creation_date(committed)
    assert 'msgid "A sentence nobody translated"' in _flagged(tree / CATALOGUE, "--untranslated")
