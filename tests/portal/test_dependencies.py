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
        if path.name == "settings.py":
            modules |= _named_modules(path, distributions)
        for module in modules:
            providers = {_normalised(name) for name in distributions.get(module, [])}
            if not providers:
                found[module] = f"imported by {path.relative_to(ROOT)}, provided by no installed distribution"
            elif not providers & declared:
                found[module] = f"imported by {path.relative_to(ROOT)}, from {sorted(providers)}: not declared"
    return found


def _python_files(*directories: str) -> list[Path]:
    return [path for directory in directories for path in sorted((ROOT / directory).rglob("*.py"))]


def test_the_portal_imports_only_what_its_dependencies_declare():
    paths = [*_python_files("portal", "inventory", "booking", "payments", "provisioning", "web"), ROOT / "manage.py"]
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
    for path in _python_files("portal", "inventory", "booking", "payments", "provisioning", "web"):
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
