"""What each part of the code depends on follows the graph written once, in docs/architecture.md ("Layers"):
inventory ← booking ← payments ← provisioning ← web ← portal. A dependency is anything that makes one part need
another: a Python import (top-level or inside a function), a model relation named by string ("booking.Order"), a
migration's dependency, a template's {% load %}, {% include %} or {% extends %}, a template named in Python code,
and a URLconf include("..."). Each kind is also planted in a small tree of its own, which the check must refuse.
"""

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SHARED = "*"  # the graph's line of modules every layer may use


def read_graph(text: str) -> dict[str, set[str]]:
    """The fenced ```layers block: `layer: what it may depend on` per line; `*:` lists shared helper modules."""
    block = re.search(r"```layers\n(.*?)```", text, flags=re.S)
    assert block, "docs/architecture.md has no ```layers block"
    graph = {}
    for line in block.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _colon, below = line.partition(":")
            graph[name.strip()] = set(below.split())
    return graph


GRAPH = read_graph(ARCHITECTURE.read_text())


def layer_of_module(dotted: str, graph: dict[str, set[str]]) -> str | None:
    """The layer a project module belongs to (a shared helper is its own), None for a module not ours."""
    if dotted in graph[SHARED] or any(dotted.startswith(f"{shared}.") for shared in graph[SHARED]):
        return SHARED
    top = dotted.split(".")[0]
    return top if top in graph else None


def allowed(source: str, target: str | None, graph: dict[str, set[str]]) -> bool:
    return target is None or target in (source, SHARED) or target in graph[source]


# --- what a file depends on, by kind -------------------------------------------------------------------------


def python_imports(tree: ast.AST) -> set[str]:
    """Every module (or module.name) a file imports, at any depth: function-local imports included."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


RELATIONS = {"ForeignKey", "OneToOneField", "ManyToManyField"}


def model_relations(tree: ast.AST) -> set[str]:
    """Apps named by string in model relations: ForeignKey("booking.Order"), ManyToManyField(to="...")."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in RELATIONS:
            targets = [*node.args[:1], *(keyword.value for keyword in node.keywords if keyword.arg == "to")]
            for target in targets:
                if isinstance(target, ast.Constant) and isinstance(target.value, str) and "." in target.value:
                    found.add(target.value.split(".")[0])
    return found


def migration_dependencies(tree: ast.AST) -> set[str]:
    """The apps a migration depends on: the ("app", "migration") pairs of its `dependencies`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(target, "id", "") == "dependencies" for target in node.targets):
            for element in getattr(node.value, "elts", []):
                if isinstance(element, ast.Tuple) and isinstance(element.elts[0], ast.Constant):
                    found.add(element.elts[0].value)
    return found


def url_includes(tree: ast.AST) -> set[str]:
    """Modules named by include("module.urls") or include(("module.urls", ...))."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "include":
            for argument in node.args[:1]:
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    found.add(argument.value)
    return found


TEMPLATE_NAME = re.compile(r"[\w/-]+\.(?:html|txt)")


def template_names_in_python(tree: ast.AST) -> set[str]:
    """String constants that name a template ("customer/order.html", "email/x.txt#part")."""
    return {
        node.value.split("#")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and TEMPLATE_NAME.fullmatch(node.value.split("#")[0])
    }


TEMPLATE_TAG = re.compile(r"{%\s*(load|include|extends)\s+(.*?)\s*%}")


def template_references(text: str) -> tuple[set[str], set[str]]:
    """(tag libraries loaded, template names included or extended) of a template."""
    libraries, templates = set(), set()
    for tag, argument in TEMPLATE_TAG.findall(text):
        if tag == "load":
            libraries.update(word for word in argument.split() if word != "from")
        else:
            name = argument.split()[0].strip("\"'")
            if argument[:1] in "\"'":
                templates.add(name.split("#")[0])
    return libraries, templates


# --- the check over a tree -----------------------------------------------------------------------------------


def template_owner(name: str, root: Path, graph) -> str | None:
    """The layer of one of the project's templates: templates/admin/<app>/ belong to that app (its admin), every
    other one in templates/ to the pages (web). A template that is not ours (Django's admin) has none."""
    if not (root / "templates" / name).is_file():
        return None
    parts = Path(name).parts
    if parts[0] == "admin" and len(parts) > 2 and parts[1] in graph:
        return parts[1]
    return "web"


def tag_library_owner(library: str, root: Path, graph) -> str | None:
    for layer in graph:
        if layer != SHARED and (root / layer / "templatetags" / f"{library}.py").is_file():
            return layer
    return None


def violations(root: Path, graph: dict[str, set[str]]) -> list[str]:
    """Every dependency of the tree at `root` that the graph does not allow, as "path: kind target (layer)"."""
    found = []

    def judge(path: Path, source: str, kind: str, target: str, layer: str | None) -> None:
        if not allowed(source, layer, graph):
            found.append(f"{path.relative_to(root)}: {kind} {target} ({source} -> {layer})")

    for source in graph:
        if source == SHARED or not (root / source).is_dir():
            continue
        for path in sorted((root / source).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for name in python_imports(tree):
                judge(path, source, "import", name, layer_of_module(name, graph))
            for app in model_relations(tree):
                judge(path, source, "relation to", app, app if app in graph else None)
            if "migrations" in path.parts:
                for app in migration_dependencies(tree):
                    judge(path, source, "migration dependency on", app, app if app in graph else None)
            for module in url_includes(tree):
                judge(path, source, "URL include", module, layer_of_module(module, graph))
            for name in template_names_in_python(tree):
                judge(path, source, "template", name, template_owner(name, root, graph))
    for path in sorted((root / "templates").rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(root / "templates"))
        source = template_owner(name, root, graph)
        libraries, templates = template_references(path.read_text())
        for library in libraries:
            judge(path, source, "{% load %}", library, tag_library_owner(library, root, graph))
        for template in templates:
            judge(path, source, "{% include/extends %}", template, template_owner(template, root, graph))
    return found


# --- the tests -------------------------------------------------------------------------------------------------


def test_every_dependency_of_the_code_follows_the_graph_in_the_architecture_page():
    wrong = violations(ROOT, GRAPH)
    assert not wrong, "dependencies against docs/architecture.md's layers:\n" + "\n".join(wrong)


def test_the_graph_has_no_cycle_and_names_every_part_of_the_code():
    layers = [layer for layer in GRAPH if layer != SHARED]
    order = []
    while len(order) < len(layers):  # peel the layers that depend only on layers already peeled
        ready = [layer for layer in layers if layer not in order and GRAPH[layer] <= {*order}]
        assert ready, f"a cycle among {sorted(set(layers) - set(order))}"
        order.extend(sorted(ready))
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")} - {"tests", "bench", "nodekit"}
    assert packages <= set(layers), f"packages the graph does not place: {sorted(packages - set(layers))}"


# Each kind of dependency, planted in a copy of a tiny tree that is otherwise clean.
PLANTED = {
    "import": ("booking/services.py", "def f():\n    from web import mail\n", "import web.mail"),
    "relation": (
        "inventory/models.py",
        'from django.db import models\n\n\nclass Lot(models.Model):\n    order = models.ForeignKey("booking.Order")\n',
        "relation to booking",
    ),
    "migration": (
        "inventory/migrations/0001_initial.py",
        "from django.db import migrations\n\n\nclass Migration(migrations.Migration):\n"
        '    dependencies = [("provisioning", "0001_initial")]\n',
        "migration dependency on provisioning",
    ),
    "url include": (
        "provisioning/urls.py",
        'from django.urls import include, path\n\nurlpatterns = [path("", include("web.console.urls"))]\n',
        "URL include web.console.urls",
    ),
    "template in python": (
        "payments/tasks.py",
        'BODY = "email/payment_received.txt"\n',
        "template email/payment_received.txt",
    ),
    "template load": ("templates/admin/booking/order.html", "{% load payment_panels %}\n", "{% load %} payment_panels"),
    "template include": (
        "templates/admin/booking/order.html",
        '{% include "customer/_payment.html" %}\n',
        "{% include/extends %} customer/_payment.html",
    ),
}


@pytest.fixture
def clean_tree(tmp_path: Path) -> Path:
    for package in ("inventory", "booking", "payments", "provisioning", "web", "portal"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "web" / "templatetags").mkdir()
    (tmp_path / "web" / "templatetags" / "payment_panels.py").write_text("")
    (tmp_path / "templates" / "customer").mkdir(parents=True)
    (tmp_path / "templates" / "email").mkdir()
    (tmp_path / "templates" / "customer" / "_payment.html").write_text("{% load payment_panels %}")
    (tmp_path / "templates" / "email" / "payment_received.txt").write_text("Paid.")
    (tmp_path / "web" / "mail.py").write_text('from booking import notices\nTEMPLATE = "email/payment_received.txt"\n')
    (tmp_path / "portal" / "urls.py").write_text('from django.urls import include\nx = include("web.customer.urls")\n')
    assert violations(tmp_path, GRAPH) == []
    return tmp_path


@pytest.mark.parametrize("kind", PLANTED)
def test_a_planted_dependency_of_each_kind_is_refused(clean_tree, kind):
    relative, text, expected = PLANTED[kind]
    path = clean_tree / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

    wrong = violations(clean_tree, GRAPH)

    assert len(wrong) == 1 and wrong[0].startswith(f"{relative}: {expected} "), wrong
    shutil.rmtree(clean_tree)
