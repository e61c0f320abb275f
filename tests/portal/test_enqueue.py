"""Each app's enqueue.py queues its tasks by name (the services never import the tasks): every name it uses is a
task that the app registers when Django is ready (its AppConfig.ready imports its tasks)."""

import ast
from pathlib import Path

import pytest
from celery import current_app

ROOT = Path(__file__).resolve().parents[2]
ENQUEUE_MODULES = sorted(ROOT.glob("*/enqueue.py"))


def task_names(path: Path) -> set[str]:
    """The names passed to task("...") or after_commit("...") in an enqueue module."""
    return {
        node.args[0].value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in ("task", "after_commit")
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_the_three_apps_that_queue_work_have_an_enqueue_module():
    assert [path.parent.name for path in ENQUEUE_MODULES] == ["booking", "payments", "provisioning"]


@pytest.mark.parametrize("path", ENQUEUE_MODULES, ids=lambda path: path.parent.name)
def test_every_task_an_enqueue_module_names_is_registered_by_its_app(path):
    names = task_names(path)

    assert names and all(name.startswith(f"{path.parent.name}.") for name in names), names
    assert names <= set(current_app.tasks), sorted(names - set(current_app.tasks))
