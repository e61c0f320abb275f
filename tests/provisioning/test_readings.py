"""GPU readings during the window: the host's tool asked once a minute, each access keeping its own cards only,
drawn on the order page and downloadable as CSV. The tools' answers are hostile input."""

import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from provisioning import readings
from provisioning.models import GpuReading
from tests.builders.hosts import NVIDIA_SMI
from tests.provisioning.customer_ssh import login_as, provisioned  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_nvidia_smi_s_csv_is_read_field_by_field():
    samples = readings.parse_nvidia(NVIDIA_SMI)
    assert samples[0] == [0, 97.0, 171234.0, 184320.0, 812.5]
    assert samples[3] == [3, None, None, 184320.0, None]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("0, 150, 1, 2, 3", {0: [0, None, 1.0, 2.0, 3.0]}),  # utilisation over 100 %: no figure
        ("0, nan, inf, -5, 1e400", {0: [0, None, None, None, None]}),
        ("99, 1, 1, 1, 1", {}),  # no such GPU index
        ("x, 1, 1, 1, 1", {}),
        ("0, 1, 1", {}),  # too few fields
        ("\x00\xff" * 5000, {}),
    ],
)
def test_a_hostile_or_broken_answer_gives_no_figure_rather_than_a_wrong_one(answer, expected):
    assert readings.parse_nvidia(answer) == expected


def test_a_flood_of_lines_is_bounded():
    assert readings.parse_nvidia("0, 1, 1, 1, 1\n" * 100_000) == {0: [0, 1.0, 1.0, 1.0, 1.0]}


def test_rocm_smi_s_json_is_read_and_garbage_is_ignored():
    answer = {
        "card0": {
            "GPU use (%)": "88",
            "VRAM Total Memory (B)": str(192 * 2**30),
            "VRAM Total Used Memory (B)": str(150 * 2**30),
            "Average Graphics Package Power (W)": "640.0",
        },
        "card1": {"GPU use (%)": "N/A"},
        "system": {"Driver version": "6.8"},
        "card99": {"GPU use (%)": "1"},
    }
    samples = readings.parse_rocm(json.dumps(answer))
    assert samples[0] == [0, 88.0, 150 * 1024.0, 192 * 1024.0, 640.0]
    assert samples[1] == [1, None, None, None, None]
    assert set(samples) == {0, 1}
    assert readings.parse_rocm("not json") == {} and readings.parse_rocm("[1, 2]") == {}


def test_a_running_window_gets_its_own_gpus_minute_by_minute_on_the_page_and_in_csv(
    provisioned,  # noqa: F811
    stand_in_nvidia_smi,
    client,
):
    order, token, _username, _key = provisioned
    access = order.accesses.get()
    assert access.gpu_index_list == [0, 1]
    now = timezone.now()
    for minute in range(3):
        assert readings.readings_sample(now=now + timedelta(minutes=minute)) == 1
    assert readings.readings_sample(now=now) == 0  # the same minute twice is kept once

    stored = list(GpuReading.objects.filter(access=access))
    assert len(stored) == 3
    assert {gpu[0] for reading in stored for gpu in reading.gpus} == {0, 1}  # never GPUs 2 and 3: not this order's

    kwargs = {"public_id": order.public_id, "token": token}
    page = client.get(reverse("customer:order", kwargs=kwargs)).content.decode()
    assert page.count("<polyline") == 2
    assert "GPU 0 on loopback: peak 93 % of its memory" in page and "GPU 1 on loopback: peak 1 % of its memory" in page

    csv = b"".join(client.get(reverse("customer:order-readings", kwargs=kwargs)).streaming_content).decode()
    lines = csv.splitlines()
    assert lines[0] == "taken_at_utc,host,gpu,utilization_pct,memory_used_mib,memory_total_mib,power_w"
    assert len(lines) == 1 + 3 * 2
    assert lines[1].endswith(",loopback,0,97,171234,184320,812.5")
    assert not any(",loopback,2," in line or ",loopback,3," in line for line in lines)


def test_the_readings_of_an_order_are_not_reachable_with_another_order_s_link(client, provisioned):  # noqa: F811
    order, _token, _username, _key = provisioned
    response = client.get(reverse("customer:order-readings", kwargs={"public_id": order.public_id, "token": "x" * 43}))
    assert response.status_code == 404
