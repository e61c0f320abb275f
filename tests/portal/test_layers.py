"""What each part of the code depends on follows the graph written once, in docs/architecture.md ("Layers"):
infrastructure ← inventory ← booking ← payments ← provisioning ← web ← portal. A dependency is anything that makes
one part need another: a Python import (top-level or inside a function), a model relation named by string
("booking.Order"), a migration's dependency, a template's {% load %}, {% include %} or {% extends %}, a template
named in Python code, a URLconf include("..."), and a URL name reversed in code or in a template
(reverse("customer:order"), {% url 'console:order' %}) whose namespace a higher layer serves. Each kind is also
planted in a small tree of its own, which the check must refuse.

Within an app, its tasks call its services and never the other way round: a service queues work through the app's
enqueue.py, by the task's name. No import (function-local ones included) closes a circle through a tasks module.
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


def urls_served(tree: ast.AST) -> set[str]:
    """What a URLconf module serves, as reversed by name: its `app_name` namespace ("customer:"), or, in a URLconf
    without one, the bare names of its path()s ("healthz")."""
    namespaces = {
        node.value.value
        for node in getattr(tree, "body", [])
        if isinstance(node, ast.Assign)
        and any(getattr(target, "id", "") == "app_name" for target in node.targets)
        and isinstance(node.value, ast.Constant)
    }
    if namespaces:
        return {f"{namespace}:" for namespace in namespaces}
    return {
        keyword.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in URL_PATTERNS
        for keyword in node.keywords
        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)
    }


URL_PATTERNS = {"path", "re_path"}
URL_REVERSERS = {"reverse", "reverse_lazy", "redirect", "resolve_url"}


def url_names_in_python(tree: ast.AST) -> set[str]:
    """URL names a file reverses: the first argument of reverse(), reverse_lazy(), redirect() and resolve_url()."""
    return {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) in URL_REVERSERS
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    }


URL_TAG = re.compile(r"""{%\s*url\s+(["'])([^"']+)\1""")


def url_server(name: str, served: dict[str, str]) -> str | None:
    """The layer that serves a URL name ("customer:order" by its namespace, "healthz" by itself), None for one that
    is not ours (Django's admin:, a URL that is not a name)."""
    namespace, colon, _rest = name.partition(":")
    return served.get(f"{namespace}:") if colon else served.get(name)


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


def template_references(text: str) -> tuple[set[str], set[str], set[str]]:
    """(tag libraries loaded, template names included or extended, URL names of {% url %}) of a template."""
    urls = {name for _quote, name in URL_TAG.findall(text)}
    libraries, templates = set(), set()
    for tag, argument in TEMPLATE_TAG.findall(text):
        if tag == "load":
            libraries.update(word for word in argument.split() if word != "from")
        else:
            name = argument.split()[0].strip("\"'")
            if argument[:1] in "\"'":
                templates.add(name.split("#")[0])
    return libraries, templates, urls


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
    served = {}  # "namespace:" or a bare URL name: the layer whose URLconf serves it
    for source in graph:
        for path in sorted((root / source).rglob("*.py")) if source != SHARED and (root / source).is_dir() else []:
            served.update(dict.fromkeys(urls_served(ast.parse(path.read_text(), filename=str(path))), source))

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
            for name in url_names_in_python(tree):
                judge(path, source, "URL name", name, url_server(name, served))
    for path in sorted((root / "templates").rglob("*")):
        if not path.is_file():
            continue
        name = str(path.relative_to(root / "templates"))
        source = template_owner(name, root, graph)
        libraries, templates, urls = template_references(path.read_text())
        for library in libraries:
            judge(path, source, "{% load %}", library, tag_library_owner(library, root, graph))
        for template in templates:
            judge(path, source, "{% include/extends %}", template, template_owner(template, root, graph))
        for name in urls:
            judge(path, source, "{% url %}", name, url_server(name, served))
    return found


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Every module, or module.name, a file imports at any depth, relative imports resolved."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            package = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join([*package, node.module] if node.level else [node.module or ""]).strip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def is_tasks_module(module: str) -> bool:
    return "tasks" in module.split(".")[1:]


def task_circles(root: Path, graph: dict[str, set[str]]) -> list[str]:
    """Every import circle inside an app that passes through one of its tasks modules, as "a -> b -> a"."""
    found = []
    for app in graph:
        if app == SHARED or not (root / app).is_dir():
            continue
        paths = {module_name(path, root): path for path in (root / app).rglob("*.py") if "migrations" not in path.parts}
        edges = {}
        for module, path in paths.items():
            imported = imported_modules(ast.parse(path.read_text()), module, path.name == "__init__.py")
            edges[module] = sorted(name for name in imported & paths.keys() if name != module)
        for start in sorted(filter(is_tasks_module, paths)):
            reached_from, queue, closing = {start: None}, [start], None  # breadth first: the shortest circle
            while queue and closing is None:
                current = queue.pop(0)
                if start in edges[current]:
                    closing = current
                for following in edges[current]:
                    if following not in reached_from:
                        reached_from[following] = current
                        queue.append(following)
            circle = []
            while closing is not None:
                circle.insert(0, closing)
                closing = reached_from[closing]
            if circle:
                found.append(" -> ".join([*circle, start]))
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


def test_infrastructure_is_the_ground_floor_and_portal_the_roof():
    """Every layer stands on infrastructure, which stands on nothing; portal stands on every layer, and none on it."""
    layers = {layer for layer in GRAPH if layer != SHARED}
    assert GRAPH["infrastructure"] == set()
    assert all("infrastructure" in GRAPH[layer] for layer in layers - {"infrastructure"})
    assert GRAPH["portal"] == layers - {"portal"}
    assert not any("portal" in below for below in GRAPH.values())


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
    "url name in python": (
        "booking/links.py",
        'from django.urls import reverse\n\n\ndef link():\n    return reverse("customer:order", args=["x"])\n',
        "URL name customer:order",
    ),
    "bare url name in python": (
        "payments/views.py",
        'from django.shortcuts import redirect\n\n\ndef back():\n    return redirect("healthz")\n',
        "URL name healthz",
    ),
    "url tag": (
        "templates/admin/booking/order.html",
        "<a href=\"{% url 'console:order' 'BN-1' %}\">console</a>\n",
        "{% url %} console:order",
    ),
    "template include": (
        "templates/admin/booking/order.html",
        '{% include "customer/_payment.html" %}\n',
        "{% include/extends %} customer/_payment.html",
    ),
}


@pytest.fixture
def clean_tree(tmp_path: Path) -> Path:
    for package in ("infrastructure", "inventory", "booking", "payments", "provisioning", "web", "portal"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "web" / "templatetags").mkdir()
    (tmp_path / "web" / "templatetags" / "payment_panels.py").write_text("")
    (tmp_path / "templates" / "customer").mkdir(parents=True)
    (tmp_path / "templates" / "email").mkdir()
    (tmp_path / "templates" / "customer" / "_payment.html").write_text("{% load payment_panels %}")
    (tmp_path / "templates" / "email" / "payment_received.txt").write_text("Paid.")
    (tmp_path / "web" / "mail.py").write_text('from booking import notices\nTEMPLATE = "email/payment_received.txt"\n')
    (tmp_path / "portal" / "urls.py").write_text(
        'from django.urls import include, path\n\nurlpatterns = [path("", include("web.customer.urls")), '
        'path("healthz", None, name="healthz")]\n'
    )
    (tmp_path / "web" / "customer").mkdir()
    (tmp_path / "web" / "customer" / "urls.py").write_text('app_name = "customer"\nurlpatterns = []\n')
    (tmp_path / "web" / "console").mkdir()
    (tmp_path / "web" / "console" / "urls.py").write_text('app_name = "console"\nurlpatterns = []\n')
    (tmp_path / "web" / "views.py").write_text(
        'from django.shortcuts import redirect\n\n\ndef go():\n    return redirect("customer:order", "x")\n'
    )
    (tmp_path / "templates" / "customer" / "book.html").write_text("{% url 'customer:book' %}{% url 'console:queue' %}")
    (tmp_path / "templates" / "admin" / "booking").mkdir(parents=True)
    (tmp_path / "templates" / "admin" / "booking" / "terms.html").write_text("{% url 'admin:index' %}")
    (tmp_path / "booking" / "admin.py").write_text(
        "from django.shortcuts import redirect\n\n\ndef back():\n"
        '    return redirect("admin:booking_order_changelist")\n'
    )
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


def test_no_app_imports_its_tasks_from_what_its_tasks_import():
    circles = task_circles(ROOT, GRAPH)
    assert not circles, "import circles through a tasks module (queue through the app's enqueue.py):\n" + "\n".join(
        circles
    )


def test_a_planted_circle_between_a_service_and_its_tasks_is_refused(clean_tree):
    # given: the tasks call a service that queues through enqueue.py, by name
    (clean_tree / "booking" / "tasks.py").write_text("from booking import services\n")
    (clean_tree / "booking" / "enqueue.py").write_text(
        'def send(order_id):\n    task("booking.send").delay(order_id)\n'
    )
    (clean_tree / "booking" / "services.py").write_text("from booking import enqueue\n")
    assert task_circles(clean_tree, GRAPH) == []
    # when: another service imports the task itself, inside a function
    (clean_tree / "booking" / "links.py").write_text("def send():\n    from .tasks import send\n")
    (clean_tree / "booking" / "services.py").write_text("from booking import enqueue, links\n")

    circles = task_circles(clean_tree, GRAPH)

    assert circles == ["booking.tasks -> booking.services -> booking.links -> booking.tasks"], circles
    shutil.rmtree(clean_tree)


def web3_importers(root: Path) -> list[str]:
    """The project's modules that import web3, outside the chain adapter (payments/chain.py)."""
    return [
        str(path.relative_to(root))
        for package in GRAPH
        if package != SHARED and (root / package).is_dir()
        for path in sorted((root / package).rglob("*.py"))
        if not (path.parent == root / "payments" and path.name == "chain.py")
        and any(name.split(".")[0] == "web3" for name in python_imports(ast.parse(path.read_text())))
    ]


def test_only_the_chain_adapter_imports_web3(clean_tree):
    assert web3_importers(ROOT) == []
    (clean_tree / "payments" / "chain_demo.py").write_text("from web3 import Web3\n")
    (clean_tree / "payments" / "scanner.py").write_text("def read():\n    import web3.exceptions\n")

    assert web3_importers(clean_tree) == ["payments/chain_demo.py", "payments/scanner.py"]
    shutil.rmtree(clean_tree)
