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
    assert samples[0] == [0, 97.0, 171234.0, 184320.0, 812.5, 71.0]
    assert samples[3] == [3, None, None, 184320.0, None, None]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("0, 150, 1, 2, 3, 40", {0: [0, None, 1.0, 2.0, 3.0, 40.0]}),  # utilisation over 100 %: no figure
        ("0, 1, 1, 2, 3, 400", {0: [0, 1.0, 1.0, 2.0, 3.0, None]}),  # no card runs at 400 °C
        ("0, nan, inf, -5, 1e400, -1", {0: [0, None, None, None, None, None]}),
        ("99, 1, 1, 1, 1, 1", {}),  # no such GPU index
        ("x, 1, 1, 1, 1, 1", {}),
        ("0, 1, 1, 1, 1", {}),  # the fields of an older query: not this one's
        ("0, 1, 1", {}),  # too few fields
        ("\x00\xff" * 5000, {}),
    ],
)
def test_a_hostile_or_broken_answer_gives_no_figure_rather_than_a_wrong_one(answer, expected):
    assert readings.parse_nvidia(answer) == expected


def test_a_flood_of_lines_is_bounded():
    assert readings.parse_nvidia("0, 1, 1, 1, 1, 1\n" * 100_000) == {0: [0, 1.0, 1.0, 1.0, 1.0, 1.0]}


def test_rocm_smi_s_json_is_read_and_garbage_is_ignored():
    answer = {
        "card0": {
            "GPU use (%)": "88",
            "VRAM Total Memory (B)": str(192 * 2**30),
            "VRAM Total Used Memory (B)": str(150 * 2**30),
            "Average Graphics Package Power (W)": "640.0",
            "Temperature (Sensor edge) (C)": "54.0",
            "Temperature (Sensor junction) (C)": "67.0",
        },
        "card2": {"Temperature (Sensor junction) (C)": "80.0"},  # no edge sensor: the junction's
        "card1": {"GPU use (%)": "N/A"},
        "system": {"Driver version": "6.8"},
        "card99": {"GPU use (%)": "1"},
    }
    samples = readings.parse_rocm(json.dumps(answer))
    assert samples[0] == [0, 88.0, 150 * 1024.0, 192 * 1024.0, 640.0, 54.0]
    assert samples[1] == [1, None, None, None, None, None]
    assert samples[2] == [2, None, None, None, None, 80.0]
    assert set(samples) == {0, 1, 2}
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
    assert page.count("<polyline") == 4 * 2  # utilisation, memory, power and temperature, for each of its 2 cards
    assert "GPU 0 on loopback: peak 93 % of its memory" in page and "GPU 1 on loopback: peak 1 % of its memory" in page
    assert "GPU 0 on loopback: 97 % on average, peak 97 %" in page and "GPU 1 on loopback: 38 °C on average" in page
    assert "GPU 0 on loopback: 812 W on average, peak 812 W" in page and "Power (0 to 900 W)" in page

    csv = b"".join(client.get(reverse("customer:order-readings", kwargs=kwargs)).streaming_content).decode()
    lines = csv.splitlines()
    assert lines[0] == "taken_at_utc,host,gpu,utilization_pct,memory_used_mib,memory_total_mib,power_w,temperature_c"
    assert len(lines) == 1 + 3 * 2
    assert lines[1].endswith(",loopback,0,97,171234,184320,812.5,71")
    assert not any(",loopback,2," in line or ",loopback,3," in line for line in lines)


def test_the_readings_of_an_order_are_not_reachable_with_another_order_s_link(client, provisioned):  # noqa: F811
    order, _token, _username, _key = provisioned
    response = client.get(reverse("customer:order-readings", kwargs={"public_id": order.public_id, "token": "x" * 43}))
    assert response.status_code == 404


def test_the_charts_cover_the_whole_window_in_stretches_and_read_older_or_broken_readings(
    client, booking_data, admin_user, django_capture_on_commit_callbacks
):
    """Thirty days of minutes are drawn as 240 points per card, each the mean of its stretch (a point sampled from
    the last day only would hide the start of the window). Readings stored before temperature was read (five
    figures) still draw their figures; stored garbage draws nothing and breaks no page."""
    from provisioning import selectors
    from provisioning.models import Access
    from tests.builders.orders import make_ready_order

    order, token = make_ready_order(client, booking_data, admin_user, django_capture_on_commit_callbacks)
    access = order.accesses.first() or Access.objects.create(
        order=order, host=order.allocations.first().lot.host, username="bn-charts", gpu_indices="0,1"
    )
    start = order.starts_at
    minutes = 30 * 24 * 60
    GpuReading.objects.bulk_create(
        GpuReading(
            access=access,
            taken_at=start + timedelta(minutes=minute),
            # the first half of the window: card 0 busy, card 1 idle; the second half: both at 50 %
            gpus=[[0, 90, 900, 1000, 700, 70], [1, 0, 10, 1000, 100, 30]]
            if minute < minutes // 2
            else [[0, 50, 500, 1000, 400, 50], [1, 50, 500, 1000, 400, 50]],
        )
        for minute in range(minutes)
    )
    GpuReading.objects.create(access=access, taken_at=start - timedelta(minutes=1), gpus=[[0, 90, 900, 1000, 700]])
    GpuReading.objects.create(access=access, taken_at=start - timedelta(minutes=2), gpus={"0": "x"})
    garbage = [[0, "9" * 400, None, 1000, True, None], [99], [1, 1e308, -5, 1e308, 1e6, 200], [1, 5, 9e6, 1e-300, 1, 1]]
    GpuReading.objects.create(access=access, taken_at=start - timedelta(minutes=3), gpus=garbage)

    summary = selectors.readings_summary(order)
    card0, card1 = summary.cards
    assert (card0.gpu, card1.gpu) == (0, 1) and card0.minutes == minutes + 2
    assert round(card0.mean("utilisation")) == 70 and round(card1.mean("utilisation")) == 25
    assert card0.count["temperature"] == minutes  # the older reading has no temperature, and is no zero either
    assert card1.peak["power"] == 400 and card1.peak["utilisation"] == 50  # out-of-range figures are none
    assert card1.peak["memory"] == 50  # nor is a share of a total under 1 MiB (it would be infinite)
    assert round(card1.energy_kwh) == round((minutes // 2 * (100 + 400)) / 60 / 1000)

    charts = {chart["measure"]: chart for chart in selectors.readings_charts(order)["charts"]}
    utilisation = charts["utilisation"]["lines"][1]["points"].split()
    assert len(utilisation) == selectors.READINGS_SHOWN  # every stretch of the 30 days, not the last hours
    heights = [float(point.split(",")[1]) for point in utilisation]
    assert heights[10] == 160.0 and heights[-10] == 80.0  # idle at the start, 50 % at the end (of 160 px)
    assert charts["temperature"]["top"] == 100 and charts["power"]["top"] == 700

    page = client.get(reverse("customer:order", kwargs={"public_id": order.public_id, "token": token}))
    assert page.status_code == 200 and page.content.decode().count("<polyline") == 4 * 2
    csv = client.get(reverse("customer:order-readings", kwargs={"public_id": order.public_id, "token": token}))
    rows = b"".join(csv.streaming_content).decode().splitlines()
    assert rows[1].endswith(",0,,,1000,,") and rows[2].endswith(",1,,,,,")  # garbage: no figure
    assert rows[4].endswith(",0,90,900,1000,700,")  # five figures, before temperature was read
