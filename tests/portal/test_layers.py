"""The apps depend on each other one way only: booking ← payments ← provisioning ← web (design.md). booking imports
neither, payments never imports provisioning, no app imports the pages above them (web/) nor the URLconf, not
even inside a function. Other apps react to an order's transitions through booking's order_status_changed."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("booking", "payments", "provisioning", "web")
BELOW = {
    "booking": {"booking"},
    "payments": {"booking", "payments"},
    "provisioning": {"booking", "payments", "provisioning"},
    "web": set(APPS),
}
# The project's shared helpers any app may use (client: the client address behind the proxies).
PORTAL_HELPERS = {"numbers", "singleton", "client"}
PORTAL_FOR = dict.fromkeys(APPS, PORTAL_HELPERS)


def imports_of(path: Path) -> set[str]:
    """Every project module or name a file imports, at any depth (function-local imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in (*APPS, "portal")}


def upward(name: str, app: str) -> bool:
    top, *rest = name.split(".")
    if top == "portal":
        return not rest or rest[0] not in PORTAL_FOR[app]
    return top not in BELOW[app]


def app_files(app: str) -> list[Path]:
    return [path for path in sorted((ROOT / app).rglob("*.py")) if "migrations" not in path.parts]


@pytest.mark.parametrize("app", APPS)
def test_an_app_imports_only_the_apps_below_it(app):
    wrong = sorted(
        f"{path.relative_to(ROOT)}: {name}" for path in app_files(app) for name in imports_of(path) if upward(name, app)
    )
    assert not wrong, "imports against booking <- payments <- provisioning <- web:\n" + "\n".join(wrong)


def test_the_import_graph_of_the_apps_has_no_cycle():
    graph = {
        app: {name.split(".")[0] for path in app_files(app) for name in imports_of(path)} & set(APPS) - {app}
        for app in APPS
    }
    assert graph == {
        "booking": set(),
        "payments": {"booking"},
        "provisioning": {"booking"},
        "web": {"booking", "payments", "provisioning"},
    }
