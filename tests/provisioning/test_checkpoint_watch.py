"""The checkpoint watch: where the researcher said their job writes checkpoints, the portal reads only the newest
file's time, from inside their container, as them, once per declared interval, and says so when none is newer than
twice the interval. Nothing of the customer's is parsed on the host; hostile directories read nothing more and never
block."""

import os
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.urls import reverse
from django.utils import timezone

from booking.models import Order, OrderStatus
from booking.rules import BookingError, clean_checkpoint_dir
from provisioning import watch
from provisioning.models import Access, WatchAlert
from tests.builders.containers import _in
from tests.builders.orders import make_ready_order, order_url, place
from tests.provisioning.tenants import provisioned_pair, two_customers  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("typed", "kept"),
    [("checkpoints", "checkpoints"), ("~/runs/a/ckpt/", "runs/a/ckpt"), ("", ""), ("~/", ""), (" ckpt ", "ckpt")],
)
def test_a_directory_of_the_home_is_kept_as_a_relative_path(typed, kept):
    assert clean_checkpoint_dir(typed) == kept


@pytest.mark.parametrize(
    "hostile",
    ["/etc", "../other", "a/../../b", "a//b", "~root/x", "$(reboot)", "a b", "a\nb", "x" * 201, "/".join("a" * 17),
     "a/./b", "ckpt;id", "`id`", "\x00", "é/ckpt", "-delete", "runs/-exec", "--help"],
)  # fmt: skip
def test_a_hostile_directory_is_refused_with_a_clear_message(hostile):
    with pytest.raises(BookingError) as refused:
        clean_checkpoint_dir(hostile)
    assert refused.value.field == "checkpoint_dir" and "inside your home" in refused.value.message


@pytest.mark.parametrize("name", ["-delete", "-ls", "-newer", "(", "!"])
def test_the_script_reads_a_name_find_would_take_for_an_option_as_a_path(tmp_path, name):
    """Refused at input; and were one stored anyway, the script run as written (here with the machine's sh, find
    and awk on a home of the test's) reads it as a directory of the home, deleting and printing nothing else."""
    home = tmp_path / "home"
    (home / name).mkdir(parents=True)
    (home / name / "step.pt").write_text("weights")
    for precious in ("thesis.tex", ".bashrc"):
        (home / precious).write_text("precious")
    os.utime(home / name / "step.pt", (1765000000, 1765000000))
    result = subprocess.run(
        ["/bin/sh", "-c", watch.CHECKPOINT_SCRIPT, "sh", name],
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert watch.checkpoint_reading(result.stdout, result.returncode) == (
        "ok",
        datetime.fromtimestamp(1765000000, tz=UTC),
    )
    assert sorted(path.name for path in home.iterdir()) == sorted([name, "thesis.tex", ".bashrc"])


@pytest.mark.parametrize(
    ("stdout", "status", "expected"),
    [
        ("1765000000\n", 0, ("ok", datetime.fromtimestamp(1765000000, tz=UTC))),
        ("-1\n", 0, ("none", None)),
        ("notdir\n", 0, ("not a directory", None)),
        ("", 124, ("unreadable", None)),  # timeout's status
        ("1765000000\n", 1, ("unreadable", None)),
        ("9" * 13, 0, ("unreadable", None)),
        ("1765000000\n1765000001\n", 0, ("unreadable", None)),  # one line or nothing
        ("\x1b[2J" + "1" * 100_000, 0, ("unreadable", None)),
        ("999999999999", 0, ("unreadable", None)),  # past what a date holds
    ],
)
def test_what_the_container_prints_is_read_as_hostile(stdout, status, expected):
    assert watch.checkpoint_reading(stdout, status) == expected


def test_the_booking_form_keeps_a_30_day_campaign_s_directory(client, booking_data):
    order, _token = place(
        client,
        booking_data(
            days="30", checkpoint_interval_hours="6", stop_criteria="loss flat for a day", checkpoint_dir="~/ckpt"
        ),
    )
    assert (order.checkpoint_dir, order.checkpoint_interval_hours) == ("ckpt", 6)
    answer = client.post(reverse("customer:book"), booking_data(days="30", checkpoint_interval_hours="6",
                         stop_criteria="x", checkpoint_dir="../../etc"))  # fmt: skip
    assert answer.status_code == 200 and "inside your home" in answer.content.decode()


def test_the_order_page_sets_changes_and_stops_the_watch(
    client, booking_data, admin_user, django_capture_on_commit_callbacks
):
    order, token = make_ready_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    url = reverse("customer:order-checkpoints", kwargs={"public_id": order.public_id, "token": token})
    assert 'id="checkpoints"' in client.get(order_url(order, token)).content.decode()

    answer = client.post(url, {"checkpoint_dir": "~/runs/ckpt", "checkpoint_interval_hours": "2"}, follow=True)
    assert "~/runs/ckpt is watched every 2 hours" in answer.content.decode()
    order.refresh_from_db()
    assert (order.checkpoint_dir, order.checkpoint_watch_interval_hours) == ("runs/ckpt", 2)
    assert order.checkpoint_interval_hours is None  # what was declared at booking (nothing, for 7 days) stays
    for hostile in ({"checkpoint_dir": "/etc", "checkpoint_interval_hours": "2"},
                    {"checkpoint_dir": "ok", "checkpoint_interval_hours": "0"},
                    {"checkpoint_dir": "ok", "checkpoint_interval_hours": "1e9"},
                    {"checkpoint_dir": "x" * 5000, "checkpoint_interval_hours": "2"}):  # fmt: skip
        answer = client.post(url, hostile, follow=True)
        assert answer.status_code == 200 and "error" in answer.content.decode()
    order.refresh_from_db()
    assert (order.checkpoint_dir, order.checkpoint_watch_hours) == ("runs/ckpt", 2)  # nothing saved was changed
    answer = client.post(url, {"checkpoint_dir": "", "checkpoint_interval_hours": "2"}, follow=True)
    assert "The checkpoint watch is off." in answer.content.decode()
    Order.objects.filter(pk=order.pk).update(status=OrderStatus.ENDED)
    answer = client.post(url, {"checkpoint_dir": "ckpt", "checkpoint_interval_hours": "2"}, follow=True)
    assert "This window is over" in answer.content.decode()
    for _attempt in range(10):  # the 10th change in the hour is the last
        client.post(url, {"checkpoint_dir": "", "checkpoint_interval_hours": "2"})
    answer = client.post(url, {"checkpoint_dir": "", "checkpoint_interval_hours": "2"}, follow=True)
    assert "Too many changes of the checkpoint watch" in answer.content.decode()


def test_turning_the_watch_off_ends_its_alert(client, booking_data, admin_user, django_capture_on_commit_callbacks):
    order, token = make_ready_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    alert = WatchAlert.objects.create(
        order=order, kind="checkpoint", started_at=order.starts_at, last_seen_at=order.starts_at
    )
    url = reverse("customer:order-checkpoints", kwargs={"public_id": order.public_id, "token": token})
    client.post(url, {"checkpoint_dir": "", "checkpoint_interval_hours": "2"})
    watch.watch_checkpoints(now=timezone.now())
    alert.refresh_from_db()
    assert alert.ended_at is not None
    assert 'id="watch-checkpoint"' not in client.get(order_url(order, token)).content.decode()


def _watching(order, directory: str, hours: int = 1) -> None:
    Order.objects.filter(pk=order.pk).update(checkpoint_dir=directory, checkpoint_watch_hours=hours)


def _read(access) -> Access:
    return Access.objects.get(pk=access.pk)


def test_a_late_checkpoint_is_said_once_and_ends_with_a_newer_file(
    two_customers,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    """Files written in the real container by the researcher; the clock of the watch moved on by hand."""
    (order, access, key), (_other, other_access, other_key) = two_customers
    Order.objects.filter(pk=order.pk).update(starts_at=timezone.now() - timedelta(days=1))  # the window runs
    _watching(order, "runs/ckpt", hours=1)
    _in(access, key, "mkdir -p ~/runs/ckpt && touch -d @1765000000 ~/runs/ckpt/step-100.pt")
    _in(other_access, other_key, "mkdir -p ~/runs/ckpt && touch ~/runs/ckpt/step-999.pt")  # not the order's
    now = timezone.now()
    assert watch.watch_checkpoints(now=now) == {"ok": 1, "late": 0}  # read once, not late yet
    read = _read(access)
    assert read.checkpoint_read == "ok" and read.checkpoint_newest_at == datetime.fromtimestamp(1765000000, tz=UTC)
    assert _read(other_access).checkpoint_checked_at is None  # the other order named no directory

    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):  # within the interval: not read again
        assert watch.watch_checkpoints(now=now + timedelta(minutes=30)) == {}
    late = max(read.ready_at, datetime.fromtimestamp(1765000000, tz=UTC)) + timedelta(hours=2, minutes=1)
    with django_capture_on_commit_callbacks(execute=True):
        counts = watch.watch_checkpoints(now=max(late, now + timedelta(hours=1)))
    assert counts["late"] == 1
    alert = WatchAlert.objects.get(order=order, kind="checkpoint")
    assert alert.ended_at is None and len(mail.outbox) == 1
    assert "No new checkpoint" in mail.outbox[0].subject and "~/runs/ckpt" in mail.outbox[0].body

    newer = max(late, now + timedelta(hours=1)) + timedelta(hours=1)  # the watch's clock at its next read
    _in(access, key, f"touch -d @{int(newer.timestamp()) - 60} ~/runs/ckpt/step-200.pt")
    with django_capture_on_commit_callbacks(execute=True):
        counts = watch.watch_checkpoints(now=newer)
    alert.refresh_from_db()
    assert alert.ended_at is not None and counts["late"] == 0 and len(mail.outbox) == 1

    # another directory named meanwhile is read within the hour, whatever the interval
    after = newer
    _watching(order, "runs/other", hours=24)
    _in(access, key, "mkdir -p ~/runs/other && touch -d @1765000100 ~/runs/other/a.pt")
    assert watch.watch_checkpoints(now=after + timedelta(minutes=5)) == {}
    watch.watch_checkpoints(now=after + timedelta(minutes=61))
    assert _read(access).checkpoint_newest_at == datetime.fromtimestamp(1765000100, tz=UTC)


def test_a_hostile_checkpoint_directory_reads_nothing_more_and_never_blocks(
    two_customers,  # noqa: F811
    client,
):
    """As an attacker: the directory is a link to elsewhere, a FIFO, full of FIFOs and links to fresh files, holds
    a million files; the customer plants a `find` and an `awk` of their own on their PATH and shell start files. The
    watch answers within its bound each time, with the newest regular file's time of that directory or nothing."""
    (order, access, key), _other = two_customers
    home = f"/home/{access.username}"
    # their own find and awk, which would print a time in the far future, and start files that would run them
    _in(access, key, "mkdir -p ~/bin && printf '#!/bin/sh\\necho 4000000000\\n' > ~/bin/find && cp ~/bin/find ~/bin/awk"
        " && chmod +x ~/bin/* && printf 'PATH=$HOME/bin:$PATH\\n' > ~/.profile && cp ~/.profile ~/.shrc")  # fmt: skip

    def reads(directory: str):
        _watching(order, directory)
        Access.objects.filter(pk=access.pk).update(checkpoint_checked_at=None)
        started = time.monotonic()
        watch.watch_checkpoints(now=timezone.now())
        taken = time.monotonic() - started
        read = _read(access)
        return read.checkpoint_read, read.checkpoint_newest_at, taken

    planted = (
        "ln -s /etc ~/etc-link && mkfifo ~/a-fifo && mkdir ~/mixed && touch -d @1765000000 ~/mixed/real && "
        "mkfifo ~/mixed/pipe && touch ~/fresh && ln -s ~/fresh ~/mixed/link && ln -s /proc/self ~/mixed/proc"
    )
    _in(access, key, planted)
    assert reads("etc-link")[:2] == ("not a directory", None)  # a link to a directory is not followed
    assert reads("a-fifo")[:2] == ("not a directory", None)  # never opened
    status, newest, taken = reads("mixed")  # the FIFO and the links are not files: only `real` counts
    assert (status, newest) == ("ok", datetime.fromtimestamp(1765000000, tz=UTC)) and taken < 10
    assert reads("nothing-here")[:2] == ("not a directory", None)
    _in(access, key, "mkdir ~/empty")
    assert reads("empty")[:2] == ("none", None)

    # a million files (on the container's /tmp, reached through a link in the path: only the last part may not be one)
    many = (  # the container's own /tmp
        "mkdir /tmp/many && cd /tmp/many && seq 1000000 | xargs touch -d @1765000000 && "
        f"touch -d @1765000500 /tmp/many/1 && ln -s /tmp {home}/tmp-link"  # noqa: S108
    )
    _in(access, key, many, timeout=300)
    status, newest, taken = reads("tmp-link/many")
    assert (status, newest) == ("ok", datetime.fromtimestamp(1765000500, tz=UTC)), (status, newest)
    assert taken < 20, taken
    page = client.get(order_url(order, order.token)).content.decode()
    assert "Newest file 2025-12-06" in page


class _Answer:
    def __init__(self, stdout: str, exit_status: int = 0):
        self.stdout, self.exit_status = stdout, exit_status


def _hosts_answering(monkeypatch, answer):
    """The hosts as the watch reaches them: `answer(argv)` gives each command's result or raises DriverError (a host
    that times out or cannot be reached, which the real sshd of the container tests cannot be made to do on cue)."""
    from contextlib import contextmanager

    class Connection:
        def run(self, argv, *, check, timeout):
            return answer(argv)

    @contextmanager
    def connect(*, host):
        yield Connection()

    monkeypatch.setattr(watch, "host_connect", connect)


def _running_with_checkpoints(client, booking_data, admin_user, capture, count: int = 1):
    from inventory.models import Host

    accesses = []
    for _ in range(count):
        order, _token = make_ready_order(client, booking_data, admin_user, capture)
        Order.objects.filter(pk=order.pk).update(
            checkpoint_dir="ckpt", checkpoint_watch_hours=1, starts_at=timezone.now() - timedelta(hours=2)
        )
        accesses.append(order.accesses.get())
    Access.objects.filter(pk__in=[access.pk for access in accesses]).update(
        host=accesses[0].host, ready_at=timezone.now() - timedelta(hours=2)
    )
    Host.objects.filter(pk=accesses[0].host_id).update(driver=Host.Driver.SSH, container_runtime="podman")
    return [Access.objects.get(pk=access.pk) for access in accesses]


def test_a_tenant_whose_read_times_out_is_not_in_the_way_of_the_others_on_the_host(
    client, booking_data, admin_user, django_capture_on_commit_callbacks, monkeypatch
):
    from provisioning.drivers.base import DriverError

    slow, other = _running_with_checkpoints(client, booking_data, admin_user, django_capture_on_commit_callbacks, 2)

    def answer(argv):
        if f"binome-{slow.username}" in argv:  # a directory of millions of files on a saturated CPU share
            raise DriverError("timed out after 30 s running `podman exec`")
        return _Answer("1765000000\n")

    _hosts_answering(monkeypatch, answer)
    now = timezone.now()
    # the session may be gone after a timeout: the rest of the host is left for the next sweep, where it comes first
    assert watch.watch_checkpoints(now=now) == {"unreadable": 1, "left for the next sweep": 1}
    assert watch.watch_checkpoints(now=now + timedelta(minutes=5)) == {"ok": 1, "late": 1}
    assert (_read(slow).checkpoint_read, _read(other).checkpoint_read) == ("unreadable", "ok")
    # the one that did not answer is said nothing of: only the other's stale checkpoint opened an alert
    assert list(WatchAlert.objects.values_list("order_id", flat=True)) == [other.order_id]


def test_a_host_that_cannot_be_reached_says_nothing_of_the_researcher(
    client, booking_data, admin_user, django_capture_on_commit_callbacks, monkeypatch
):
    from provisioning.drivers.base import DriverError

    (access,) = _running_with_checkpoints(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    now = timezone.now()
    _hosts_answering(monkeypatch, lambda argv: _Answer(f"{int(now.timestamp())}\n"))
    watch.watch_checkpoints(now=now)  # a fresh checkpoint, read once
    assert _read(access).checkpoint_read == "ok"

    def unreachable(argv):
        raise DriverError("connection refused")

    _hosts_answering(monkeypatch, unreachable)
    with django_capture_on_commit_callbacks(execute=True):
        for hour in range(1, 5):
            watch.watch_checkpoints(now=now + timedelta(hours=hour, minutes=1))
    assert not WatchAlert.objects.filter(kind="checkpoint").exists()  # no reading, no word
