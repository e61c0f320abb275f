"""Every third-party package the code imports is declared in pyproject.toml, where a packager reads it: the portal's
in `dependencies`, the GPU-node tools' (nodekit) in the `trial` extra, the tests' and benchmarks' in `dev` too. A
package that only arrives as another's dependency (requests, through web3) vanishes when that one stops needing it."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FIRST_PARTY = {*PYPROJECT["tool"]["ruff"]["lint"]["isort"]["known-first-party"], "tests"}
# The benchmarks import one another by file name (bench/load.py: `from pages import ...`).
FIRST_PARTY |= {path.stem for path in (ROOT / "bench").glob("*.py")}
# Dotted names in strings that Django and Celery import (INSTALLED_APPS, MIDDLEWARE, BACKEND, ...).
DOTTED_NAME = re.compile(r"[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # PEP 508: the name comes first


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(*groups: str) -> set[str]:
    names = set()
    for group in groups:
        requirements = (
            PYPROJECT["project"]["dependencies"]
            if group == "runtime"
            else PYPROJECT["project"]["optional-dependencies"][group]
        )
        names |= {_normalised(REQUIREMENT_NAME.match(requirement).group()) for requirement in requirements}
    return names


def _imported_modules(path: Path) -> set[str]:
    """Top-level names of the modules `path` imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - FIRST_PARTY - set(sys.stdlib_module_names)


def _named_modules(path: Path, distributions: dict) -> set[str]:
    """Top-level names of the installed modules that strings of `path` name for Django or Celery to import
    (INSTALLED_APPS, MIDDLEWARE, BACKEND, ...)."""
    strings = {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED_NAME.fullmatch(node.value)
    }
    return {value.split(".")[0] for value in strings} & set(distributions) - FIRST_PARTY


def _undeclared(paths: list[Path], declared: set[str]) -> dict[str, str]:
    """{module: why} for each third-party module imported from `paths` (or named by the settings) whose
    distribution is not `declared`."""
    distributions = importlib.metadata.packages_distributions()
    found = {}
    for path in paths:
        modules = _imported_modules(path)
        named = _named_modules(path, distributions) if path.name == "settings.py" else set()
        for module in modules | named:
            providers = {_normalised(name) for name in distributions.get(module, [])}
            # The settings may name what the embedded default alone uses (they check it is installed).
            allowed = declared | _declared("embedded") if module in named - modules else declared
            if not providers:
                found[module] = f"imported by {path.relative_to(ROOT)}, provided by no installed distribution"
            elif not providers & allowed:
                found[module] = f"imported by {path.relative_to(ROOT)}, from {sorted(providers)}: not declared"
    return found


def _python_files(*directories: str) -> list[Path]:
    return [path for directory in directories for path in sorted((ROOT / directory).rglob("*.py"))]


def test_the_portal_imports_only_what_its_dependencies_declare():
    paths = [
        *_python_files("portal", "infrastructure", "inventory", "booking", "payments", "provisioning", "web"),
        ROOT / "manage.py",
    ]
    assert _undeclared(paths, _declared("runtime")) == {}


def test_the_gpu_node_tools_import_only_what_the_trial_extra_declares():
    assert _undeclared(_python_files("nodekit"), _declared("runtime", "trial")) == {}


def test_the_tests_and_benchmarks_import_only_what_dev_declares():
    assert _undeclared(_python_files("tests", "bench"), _declared("runtime", "trial", "dev")) == {}


def test_the_check_sees_the_undeclared_import_of_requests_in_the_chain_adapter():
    """The check itself: without its line in pyproject.toml, requests would be reported."""
    declared = _declared("runtime") - {"requests"}
    assert "requests" in _undeclared([ROOT / "payments" / "chain.py"], declared)


CSP_PUBLIC = {  # what django-csp 4.0 documents: the middleware and its extension point, the constants, decorators
    "csp.middleware": {"CSPMiddleware", "PolicyParts"},
    "csp.constants": None,  # every name
    "csp.decorators": {"csp", "csp_exempt", "csp_replace", "csp_update"},
}


def test_the_portal_uses_only_django_csp_s_documented_names():
    """The CSP is built through django-csp's public interface: a private name (a response's `_csp_update`, the
    middleware's `_csp_nonce_post_response`, an undocumented helper) would break silently on an upgrade."""
    found = []
    for path in _python_files("portal", "infrastructure", "inventory", "booking", "payments", "provisioning", "web"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "csp":
                allowed = CSP_PUBLIC.get(node.module, set())
                names = {alias.name for alias in node.names}
                if allowed is not None and not names <= allowed:
                    found.append(f"{path.relative_to(ROOT)}: from {node.module} import {sorted(names - allowed)}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_csp"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_csp"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []


# --- the production image's packages ----------------------------------------------------------------------------


def _closure(requirements: list[str]) -> set[str]:
    """The normalised names of the installed distributions `requirements` need, with the extras they ask for."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    pending = [Requirement(requirement) for requirement in requirements]
    while pending:
        requirement = pending.pop()
        name = _normalised(requirement.name)
        if name in seen:
            continue
        try:
            needs = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not for this platform or Python (a marker said so)
        seen.add(name)
        for text in needs:
            need = Requirement(text)
            wanted = need.marker is None or any(
                need.marker.evaluate({"extra": extra}) for extra in {"", *requirement.extras}
            )
            if wanted:
                pending.append(need)
    return seen


def _only_in_extras() -> set[str]:
    """Top-level modules that only the extras' distributions (and what they alone need) provide."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    runtime = _closure(PYPROJECT["project"]["dependencies"])
    extras_only = _closure([requirement for group in optional.values() for requirement in group]) - runtime
    return {
        module
        for module, providers in importlib.metadata.packages_distributions().items()
        if providers and {_normalised(provider) for provider in providers} <= extras_only
    }


# Runs in a fresh interpreter: the extras' modules cannot be imported, as in the Dockerfile's image.
WITHOUT_EXTRAS = """
import importlib, pkgutil, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` fails; importlib.util.find_spec(name) is None
sys.argv = ["manage.py", *{argv!r}]
if sys.argv[1:] == ["import-everything"]:
    import django
    django.setup()
    for package in ("portal", "infrastructure", "inventory", "booking", "payments", "provisioning", "web"):
        for module in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            importlib.import_module(module.name)
    print("imported")
else:
    import runpy
    runpy.run_path("manage.py", run_name="__main__")
"""


def _without_extras(*argv: str, **env: str | None):
    from tests.builders.production import _production

    script = WITHOUT_EXTRAS.format(blocked=sorted(_only_in_extras()), argv=list(argv))
    return _production(command=(sys.executable, "-c", script), **env)


def test_the_extras_hold_the_embedded_default_the_tests_and_the_gpu_tools():
    blocked = _only_in_extras()
    assert {"sqlalchemy", "honcho", "pytest", "hypothesis", "playwright", "torch", "yaml"} <= blocked
    assert not {"django", "celery", "kombu", "redis", "web3", "requests", "csp"} & blocked


def test_the_portal_runs_on_the_production_image_s_packages_alone(tmp_path):
    """Every module of the portal imports, and `check --deploy` passes, with no package of the extras."""
    from tests.builders.production import NOT_DEMO_XPUB, PRODUCTION_CHAINS, PRODUCTION_SECRET_KEY

    chains = tmp_path / "chains.toml"
    chains.write_text(PRODUCTION_CHAINS)
    production = {
        "SECRET_KEY": PRODUCTION_SECRET_KEY,
        "PAYMENTS_XPUB": NOT_DEMO_XPUB,
        "PAYMENTS_CHAINS_FILE": str(chains),
        "ALLOWED_HOSTS": "book.example.org",
    }

    imported = _without_extras("import-everything", **production)
    assert imported.returncode == 0 and "imported" in imported.stdout, imported.stderr[-3000:]
    checked = _without_extras("check", "--deploy", "--fail-level", "ERROR", **production)
    assert checked.returncode == 0, checked.stderr[-3000:]


def test_the_embedded_default_without_its_extra_says_what_to_install():
    result = _without_extras("check", DEBUG="1", REDIS_URL="", CELERY_BROKER_URL=None, CELERY_RESULT_BACKEND=None)
    assert result.returncode != 0
    assert "needs the `embedded` extra" in result.stderr and "set REDIS_URL" in result.stderr


# --- the image's packages: bounded in pyproject.toml, pinned with their hashes in requirements.lock --------------


def _locked() -> dict[str, tuple[str, int]]:
    """requirements.lock's pins: normalised name → (version, how many file hashes it lists)."""
    pins: dict[str, tuple[str, int]] = {}
    name = None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^ ;\\]+)", line):
            name = _normalised(match[1])
            pins[name] = (match[2], 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


def test_every_dependency_of_the_portal_has_an_upper_bound_below_its_next_major():
    from packaging.requirements import Requirement

    unbounded = [
        text
        for text in PYPROJECT["project"]["dependencies"]
        if not any(spec.operator in ("<", "<=", "==", "~=") for spec in Requirement(text).specifier)
    ]
    assert not unbounded, f"no upper bound (a new major would arrive unread): {unbounded}"


def test_the_lock_pins_every_dependency_in_its_bounds_with_the_files_hashes_and_the_image_installs_it_so():
    from packaging.requirements import Requirement

    locked = _locked()
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        name = _normalised(requirement.name)
        assert name in locked, f"{name} is not in requirements.lock: run `make lock`"
        assert requirement.specifier.contains(locked[name][0]), f"{name}=={locked[name][0]} is outside {text}"
    assert all(hashes for _version, hashes in locked.values()), [name for name, (_v, h) in locked.items() if not h]
    assert len(locked) > len(PYPROJECT["project"]["dependencies"])  # and what they need, pinned too
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock" in dockerfile
    assert "!requirements.lock" in (ROOT / ".dockerignore").read_text().splitlines()
