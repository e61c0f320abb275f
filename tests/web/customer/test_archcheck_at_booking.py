"""Check before you pay: the report archcheck.py writes on the researcher's machine, given on the booking page, says
per class on offer whether their compiled extensions run there and what to rebuild with which flag; the order keeps
it. Any file given there is hostile: refused with the reason in the reader's language, nothing saved."""

import html
import json
import re
import subprocess

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from booking.models import Order
from nodekit.bundle import script_bytes
from tests.builders.extensions import build_extension, fatbin, offload_bundle
from tests.builders.orders import order_url, place

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def report_bytes(tmp_path_factory) -> bytes:
    """The report of the tool as the guide tells a researcher to run it, on a site-packages of real extensions:
    one with B200 and H200 code, one for Hopper only, one ROCm build."""
    root = tmp_path_factory.mktemp("env")
    marker = root / "loaded"
    site = root / "site-packages"
    build_extension(site / "flash_attn", "flash_attn_cuda", ".nv_fatbin", fatbin(("sm", 90), ("sm", 100)), marker)
    build_extension(site / "hopper_only", "_kernels", ".nv_fatbin", fatbin(("sm", 90)), marker)
    build_extension(site / "rocm_ext", "_hip", ".hip_fatbin", offload_bundle("gfx942"), marker)
    (root / "archcheck.py").write_bytes(script_bytes("archcheck"))  # the file /tools/archcheck.py serves
    ran = subprocess.run(
        ["python3", "-I", "archcheck.py", str(site), "--json", "report.json"],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return (root / "report.json").read_bytes()


def upload(content: bytes, name: str = "report.json") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/json")


def verdict_page(client, content: bytes) -> str:
    response = client.post(reverse("customer:archcheck-verdict"), {"archcheck_report": upload(content)})
    assert response.status_code == 200
    return text_of(response.content.decode())


def text_of(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())


def test_the_booking_page_says_which_cards_run_the_extensions_and_what_to_rebuild(client, catalog, report_bytes):
    said = verdict_page(client, report_bytes)
    assert (
        "NVIDIA B200 pair (sm_100): does not run them as built. "
        'Rebuild hopper_only/_kernels.so with TORCH_CUDA_ARCH_LIST="10.0".'
    ) in said
    assert "NVIDIA H200 pair (sm_90): does not run them as built." in said  # the ROCm build
    assert "rocm_ext/_hip.so: built for the other vendor's cards only" in said
    assert "AMD MI300X pair (gfx942): does not run them as built." in said
    assert "flash_attn/flash_attn_cuda.so, hopper_only/_kernels.so: built for the other vendor's cards only" in said

    # a report of the CUDA extensions alone: the H200 runs them all, the B200 still needs one rebuilt
    report = json.loads(report_bytes)
    report["extensions"] = [item for item in report["extensions"] if item["vendor"] == "nvidia"]
    said = verdict_page(client, json.dumps(report).encode())
    assert "NVIDIA H200 pair (sm_90): runs your extensions: each carries code for it." in said
    assert 'Rebuild hopper_only/_kernels.so with TORCH_CUDA_ARCH_LIST="10.0".' in said


def test_the_order_keeps_the_report_and_its_page_says_what_it_means_for_its_cards(
    client, catalog, booking_data, report_bytes
):
    order, token = place(client, {**booking_data(lots="1"), "archcheck_report": upload(report_bytes)})
    assert [item["name"] for item in order.archcheck_report["extensions"]] == [
        "flash_attn/flash_attn_cuda.so", "hopper_only/_kernels.so", "rocm_ext/_hip.so"
    ]  # fmt: skip
    assert "classes" not in order.archcheck_report  # the verdicts are drawn by the portal, not taken from the file
    page = text_of(client.get(order_url(order, token)).content.decode())
    assert "NVIDIA B200 pair (sm_100): does not run them as built. Rebuild hopper_only/_kernels.so with " in page


@pytest.mark.parametrize(
    ("content", "english", "french"),
    [
        (b"not json {", "This file is not a JSON report written by archcheck.py.", "n’est pas un rapport JSON"),
        (b'{"schema": "binome.split-trial/2"}', "This is not a report of archcheck.py", "n’est pas un rapport"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply", "trop profondément"),
        (b'{"schema": "binome.archcheck/1", "read": 1, "extensions": "' + b"x" * 210_000 + b'"}', "too large", "trop"),
        (
            b'{"schema": "binome.archcheck/1", "read": 1, "extensions": [{"name": "a", "vendor": "intel",'
            b' "b200": "native", "h200": "native", "mi300x": "native"}]}',
            "a field archcheck.py does not write so",
            "un champ",
        ),
    ],
)
def test_a_hostile_report_is_refused_in_the_reader_s_language_and_nothing_is_booked(
    client, catalog, booking_data, content, english, french
):
    assert english in verdict_page(client, content)
    response = client.post(reverse("customer:book"), {**booking_data(lots="1"), "archcheck_report": upload(content)})
    assert response.status_code == 200 and english in html.unescape(response.content.decode())
    client.cookies["django_language"] = "fr"
    assert french in verdict_page(client, content)
    assert not Order.objects.exists()


def test_names_in_a_report_are_shown_as_text_never_as_markup(client, catalog, report_bytes):
    report = json.loads(report_bytes)
    report["extensions"][1]["name"] = "<script>alert(1)</script>.so"
    response = client.post(
        reverse("customer:archcheck-verdict"), {"archcheck_report": upload(json.dumps(report).encode())}
    )
    text = response.content.decode()
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.so" in text


def test_an_extension_whose_targets_cannot_be_listed_is_said_so_not_called_a_fallback(client, catalog):
    report = {
        "schema": "binome.archcheck/1",
        "read": 1,
        "extensions": [
            {"name": "rocm_ext/_hip.so", "vendor": "amd", "archs": [], "b200": "other_vendor", "h200": "other_vendor",
             "mi300x": "unreadable"},
        ],
    }  # fmt: skip
    said = verdict_page(client, json.dumps(report).encode())
    assert "AMD MI300X pair (gfx942): rocm_ext/_hip.so: its device code is compressed" in said
    assert "only through a fallback" not in said
