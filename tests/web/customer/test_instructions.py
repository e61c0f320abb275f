"""Every command the product tells someone to type, found where they read it (the guide and the order page in both
languages, the e-mails, the booking page, nodekit/README.md and README.md), is run as written by a named test, or
is listed here with the reason it cannot run on this machine. A command added to a page without either fails this
test: no instruction is left untried by accident."""

import html
import re
from collections import Counter
from pathlib import Path

import pytest
from django.core import mail
from django.urls import reverse

from tests.builders.orders import order_url

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]
# What starts a command line (a shell command, not a Python expression or a flag named in a sentence).
COMMAND = re.compile(
    r"^(?:\$ )?(?:python3?|ssh|sftp|torchrun|make|\.venv/bin/python|curl|pip|podman|docker"
    r"|ps|top|df|nvidia-smi|rocm-smi|openssl|sha256sum)\s"
)

# The test that types each command as written, or why it cannot run here. Patterns match the whole command.
RUN_BY = "run by"
NOT_HERE = "not runnable here"
WATCH_CHECKS = (
    "tests/provisioning/test_container_access.py::"
    "test_the_checks_the_readings_alerts_give_run_as_written_in_the_container"
)
RECORD_CHECKS = "tests/provisioning/test_research_record.py::test_the_order_page_s_checks_run_as_written"
COMMANDS = {
    r"python3 /opt/binome/split_trial\.py --help": (
        RUN_BY,
        "tests/provisioning/test_container_access.py::"
        "test_the_split_trial_commands_of_the_guide_and_the_order_page_run_as_written_in_the_customer_s_container",
    ),
    r"python3 archcheck\.py": (RUN_BY, "tests/nodekit/test_archcheck.py::test_the_guide_s_commands_run_as_written"),
    r"python3 archcheck\.py --json report\.json": (
        RUN_BY,
        "tests/nodekit/test_archcheck.py::test_the_guide_s_commands_run_as_written",
    ),
    r"ssh -p \d+ bn-[a-z0-9]+@\S+": (
        RUN_BY,
        "tests/provisioning/test_container_access.py::"
        "test_the_order_page_s_login_line_works_as_written_from_a_researcher_s_own_account",
    ),
    r"ssh -N -L 8888:localhost:8888 -p \d+ bn-[a-z0-9]+@\S+": (
        RUN_BY,
        "tests/provisioning/test_container_access.py::"
        "test_a_server_on_8888_in_the_container_is_reached_through_the_order_page_s_forward_line",
    ),
    r"sftp -P \d+ bn-[a-z0-9]+@\S+": (
        RUN_BY,
        "tests/provisioning/test_data_continuity.py::"
        "test_after_the_end_sftp_reads_the_files_until_the_wipe_but_cannot_write_and_nothing_runs",
    ),
    r"make run +# .*": (
        RUN_BY,
        "tests/portal/test_embedded_default.py::test_make_run_installs_what_the_demo_needs_and_nothing_only_the_tests_use"
        " (and its embedded_portal: the processes make run starts)",
    ),
    r"make test +# .*": (RUN_BY, ".ci/run (CI types `make test` on a fresh clone)"),
    r"torchrun --nproc_per_node=2 train\.py": (NOT_HERE, "the researcher's own train.py on two GPUs"),
    r"python3 -m venv ~/env": (
        RUN_BY,
        "tests/provisioning/test_container_access.py::"
        "test_what_the_guide_says_can_be_installed_where_holds_in_the_container",
    ),
    r"pip install --user (PACKAGE|PAQUET)": (
        NOT_HERE,
        "PyPI from the container (this machine reaches PyPI only through a proxy whose certificate authority the "
        "test image does not carry); where it installs (the home) is what the venv's test shows",
    ),
    r'python -c "import torch; print\(torch\.__version__, torch\.version\.cuda, torch\.cuda\.get_arch_list\(\)\)"': (
        NOT_HERE,
        "PyTorch of the rented image on its GPUs (the test image has no PyTorch; the pre-flight reads the same "
        "facts in the container)",
    ),
    r"\.venv/bin/python -m nodekit\.bundle (preflight|split_trial) > /tmp/\w+\.py": (
        RUN_BY,
        "tests/nodekit/test_bundle.py::test_the_readme_s_bundle_commands_run_as_written",
    ),
    r"python3 -I /tmp/preflight\.py --gpus 0,1 .*": (NOT_HERE, "two GPUs and PyTorch (a device check)"),
    r"python3 -I /tmp/split_trial\.py --device cpu .*": (NOT_HERE, "PyTorch (not in this machine's Python)"),
    # the checks of the readings' alerts (provisioning/watch.py), e-mailed while the window runs
    r'ps -u "\$USER" -o pid,pcpu,etime,args': (RUN_BY, WATCH_CHECKS),
    r'top -b -n 1 -u "\$USER" \| head -n 15': (RUN_BY, WATCH_CHECKS),
    r"df -h ~": (RUN_BY, WATCH_CHECKS),
    r"nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv": (
        NOT_HERE,
        "NVIDIA's own tool on the rented cards (this machine has no GPU; the host's stand-in prints readings only)",
    ),
    r"rocm-smi --showpids": (NOT_HERE, "AMD's own tool on the rented cards (this machine has no GPU)"),
    # the research record's checks, on the order page of a window that ended
    r"openssl pkeyutl -verify -pubin -inkey binome-record-key\.pem -rawin -in binome-BN-\w+-record\.json "
    r"-sigfile binome-BN-\w+-record\.json\.sig": (RUN_BY, RECORD_CHECKS),
    r"sha256sum binome-BN-\w+-record\.pdf": (RUN_BY, RECORD_CHECKS),
}


def commands_in_html(page: str) -> list[str]:
    found = []
    for code in re.findall(r"<code(?: [^>]*)?>(.*?)</code>", page, re.S):
        text = html.unescape(re.sub(r"<[^>]+>", "", code)).strip()
        found += [line.strip() for line in text.splitlines() if COMMAND.match(line.strip())]
    return found


def commands_in_text(text: str) -> list[str]:
    """The command lines of a plain-text e-mail (what follows a run of spaces is a note about it)."""
    return [re.split(r"\s{2,}", line.strip())[0] for line in text.splitlines() if COMMAND.match(line.strip())]


def commands_in_markdown(path: Path) -> list[str]:
    """The command lines of a Markdown file's fenced blocks (a line ending in a backslash goes on)."""
    lines, inside = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    joined = "\n".join(lines).replace("\\\n", " ").splitlines()
    return [" ".join(line.split()) for line in joined if COMMAND.match(line.strip())]


def watch_alert_mails(order) -> list:
    """The e-mails of both kinds of the readings' alerts, for `order`, taken out of the outbox."""
    from provisioning import watch
    from provisioning.models import WatchAlert

    order.checkpoint_dir, order.checkpoint_watch_hours = "runs/ckpt", 6
    order.save(update_fields=["checkpoint_dir", "checkpoint_watch_hours"])
    before = len(mail.outbox)
    for kind in WatchAlert.Kind.values:
        now = order.starts_at
        alert = WatchAlert.objects.create(
            order=order, kind=kind, started_at=now, last_seen_at=now, idle_cards=[["h", 1]], busy_cards=[["h", 0]]
        )
        watch.watch_alert_send(order=order, alert=alert)
    sent = mail.outbox[before:]
    del mail.outbox[before:]
    return sent


def test_every_command_the_product_gives_is_run_as_written_or_said_why_not(client, ready_order):
    order, token = ready_order
    places: dict[str, list[str]] = {}
    for language in ("en", "fr"):
        client.cookies["django_language"] = language
        places[f"guide ({language})"] = commands_in_html(client.get(reverse("customer:guide")).content.decode())
        places[f"booking page ({language})"] = commands_in_html(client.get(reverse("customer:book")).content.decode())
        places[f"order page ({language})"] = commands_in_html(client.get(order_url(order, token)).content.decode())
    places["e-mails"] = [command for message in mail.outbox for command in commands_in_text(message.body)]
    places["readings' alerts (e-mails)"] = [
        command for message in watch_alert_mails(order) for command in commands_in_text(message.body)
    ]
    places["nodekit/README.md"] = commands_in_markdown(ROOT / "nodekit" / "README.md")
    places["README.md"] = commands_in_markdown(ROOT / "README.md")

    unlisted, counts = [], Counter()
    for place, commands in places.items():
        for command in commands:
            matches = [pattern for pattern in COMMANDS if re.fullmatch(pattern, command)]
            if not matches:
                unlisted.append((place, command))
            else:
                counts[(place, COMMANDS[matches[0]][0])] += 1
    assert unlisted == []
    # the e-mail gives the login line of the order page, which its test types
    access = order.accesses.get()
    assert places["e-mails"] == [access.ssh_command]
    # an unbalanced split: 2 checks; idle cards: 3; no new checkpoint: 2
    assert len(places["readings' alerts (e-mails)"]) == 7
    assert access.ssh_command in places["order page (en)"] and access.forward_command in places["order page (fr)"]
    # every test named exists
    for kind, where in COMMANDS.values():
        if kind == RUN_BY and "::" in where:
            path, name = where.split("::")
            name = name.split(" ")[0]
            assert f"def {name}(" in (ROOT / path).read_text(), where
    print("\ncommands by place:", dict(sorted(counts.items())))
    assert sum(counts.values()) >= 20
