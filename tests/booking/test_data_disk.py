"""The data disk a lot comes with, stated before paying: on the booking page per hardware class, and on the order
page (what the lots' hosts promise, then the volume as it was made)."""

import re

import pytest
from django.urls import reverse

from inventory.models import Host
from tests.builders.console import act
from tests.builders.orders import order_url, place

pytestmark = pytest.mark.django_db


def _row(page: str, class_name: str) -> str:
    """The text of the booking page's offers row of a hardware class, tags dropped, spaces collapsed."""
    row = re.search(rf"<tr[^>]*>\s*<th scope=\"row\">{re.escape(class_name)}.*?</tr>", page, re.S)
    assert row, class_name
    return " ".join(re.sub(r"<[^>]+>", " ", row.group()).split())


def _text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).split()).replace("\u2019", "'")


def _set_disks(**sizes: int) -> None:
    for name, gib in sizes.items():
        Host.objects.filter(name=name).update(disk_per_lot_gib=gib)


@pytest.mark.parametrize(
    ("language", "b200", "h200", "mixed", "explained"),
    [
        (
            "en",
            "500 GiB",
            "a share of the machine's data disk",
            "200 GiB on some machines; on the others a share of the machine's data disk",
            "split equally over its lots when your machines are prepared",
        ),
        (
            "fr",
            "500 Gio",
            "une part du disque de données de la machine",
            "200 Gio sur certaines machines ; sur les autres, une part du disque de données de la machine",
            "partagé à parts égales entre ses lots quand vos machines sont préparées",
        ),
    ],
)
def test_the_booking_page_states_the_smallest_data_disk_a_lot_of_each_class_is_sure_to_get(
    client, catalog, language, b200, h200, mixed, explained, django_capture_on_commit_callbacks
):
    # given: the B200 hosts' operators set 500, 800 and 900 GiB per lot; the H200 host none (its disk is shared)
    _set_disks(**{"b200-node-01": 800, "b200-node-02": 500, "b200-node-03": 900, "h200-node-01": 0})
    client.cookies["django_language"] = language

    page = client.get(reverse("customer:book")).content.decode()

    # then: the B200 row promises the smallest size, the H200 row says its disk is a share, not a made-up figure
    assert b200 in _row(page, "NVIDIA B200 pair") and "800" not in _row(page, "NVIDIA B200 pair")
    assert h200 in _row(page, "NVIDIA H200 pair")
    assert explained not in page  # the B200 pair is chosen: nothing of it is shared

    # when: one B200 host has its size taken away (the booking page's cache follows the host's save)
    with django_capture_on_commit_callbacks(execute=True):  # as the admin saves them, in their own transactions
        for name, gib in (("b200-node-02", 0), ("b200-node-01", 200)):
            host = Host.objects.get(name=name)
            host.disk_per_lot_gib = gib
            host.save()

    # then: the smallest size still promised, and where it may be a share instead, explained
    page = " ".join(client.get(reverse("customer:book")).content.decode().split()).replace("\u2019", "'")
    assert mixed in _row(page, "NVIDIA B200 pair")
    assert explained in page


@pytest.mark.parametrize(
    ("language", "promised"),
    [
        ("en", "Data disk 300 GiB per lot (your home directory on the machine;"),
        ("fr", "Disque de données 300 Gio par lot (votre répertoire personnel sur la machine ;"),
    ],
)
def test_the_order_page_says_what_disk_the_lots_come_with_before_they_are_prepared(
    client, catalog, booking_data, language, promised
):
    _set_disks(**{"b200-node-01": 300, "b200-node-02": 400, "b200-node-03": 400})
    client.cookies["django_language"] = language

    order, token = place(client, booking_data(lots="2"))

    assert promised in _text(client.get(order_url(order, token)))


def test_the_order_page_gives_each_data_volume_as_it_was_made(
    client,
    paid_order,
    operator,
    django_capture_on_commit_callbacks,
):
    # given: two lots on a host whose disk is shared (no size set): the size is known only once the volume is made
    order, token = paid_order
    host = order.allocations.get(lot__gpu_indices="0,1").lot.host
    assert host.disk_per_lot_gib == 0
    assert "a share of the machine's data disk per lot" in _text(client.get(order_url(order, token)))

    # when: the machines are prepared (the demo's dry-run hosts: 1000 GiB split over their two lots, less a tenth)
    client.force_login(operator)
    for action in ("approve", "provision"):
        act(client, order, action, callbacks=django_capture_on_commit_callbacks)
    client.logout()

    # then: the page gives the volume's size as made, on its host, in both languages
    access = order.accesses.get()
    assert access.disk_gib == 900
    assert f"Data disk 900 GiB on {host.name}" in _text(client.get(order_url(order, token)))
    client.cookies["django_language"] = "fr"
    assert f"Disque de données 900 Gio sur {host.name}" in _text(client.get(order_url(order, token)))
