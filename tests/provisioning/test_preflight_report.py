"""The pre-flight report comes from inside the customer's container: the customer can replace what prints it. Every
shape that is not a report is a failed step with a reason, never an exception that re-queues the run for ever."""

import json

import pytest

from provisioning.preflight_report import MAX_PREFLIGHT_REPORT_BYTES, parse_preflight_report
from provisioning.step_context import StepFailed

GOOD = {
    "schema": "binome.preflight/1",
    "checks": [{"name": "gpu_visible", "status": "FAIL"}],
    "summary": {"status": "FAIL"},
}


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    ("printed", "reason"),
    [
        ("", "printed no report"),
        ("not json", "printed no report"),
        ("[]", "is not an object but list"),
        ("null", "is not an object but NoneType"),
        ('"PASS"', "is not an object but str"),
        (json.dumps({**GOOD, "summary": "PASS"}), "no summary with a known status"),
        (json.dumps({**GOOD, "summary": {"status": "EXCELLENT"}}), "no summary with a known status"),
        (json.dumps({**GOOD, "checks": "all good"}), "checks are not a list of objects"),
        (json.dumps({**GOOD, "checks": [1, 2]}), "checks are not a list of objects"),
        (nested(50), "nested deeper than 8 levels"),
        (nested(20_000), "nested deeper|printed no report"),  # however deep: a failed step, never a RecursionError
        (json.dumps({**GOOD, "pad": "x" * MAX_PREFLIGHT_REPORT_BYTES}), "larger than"),
    ],
)
def test_a_report_that_is_not_one_fails_the_step_with_its_reason(printed, reason):
    with pytest.raises(StepFailed, match=reason):
        parse_preflight_report(printed)


def test_a_well_formed_report_is_kept_as_it_is():
    assert parse_preflight_report(json.dumps(GOOD)) == GOOD


# ----------------------------------------------------------------------------------------------------------------
# The order page's pre-flight section: each result explained in the page's language, from the report's figures
# ----------------------------------------------------------------------------------------------------------------

H200_REPORT = {
    "schema": "binome.preflight/1",
    "results": {
        "sdpa_max_rel_error": {"bfloat16": 0.0071, "float16": 0.0009, "float32": 2.1e-06},
        "checkpoint_bytes": 1993141,
        "extensions": {
            "target": "sm_90",
            "missing": ["old_kernels/_C.so"],
            "fallback": ["flash_attn/flash_attn_cuda.so"],
            "unreadable": [],
            "native_count": 3,
        },
    },
    "checks": [
        {"name": "compiled_extensions", "status": "FAIL", "reason": "no code for sm_90 in old_kernels/_C.so (sm_80)"},
        {"name": "sdpa_attention", "status": "PASS", "reason": "forward and backward match"},
        {"name": "checkpoint_roundtrip", "status": "PASS", "reason": "model + AdamW state in /home/r"},
    ],
    "summary": {"status": "FAIL"},
}


def render_preflight(report: dict, language: str) -> str:
    from django.template.loader import render_to_string
    from django.utils import translation

    with translation.override(language):
        return render_to_string("customer/_preflight.html", {"report": report})


def test_the_new_checks_are_explained_in_english_with_their_figures():
    page = render_preflight(H200_REPORT, "en")
    assert "Compiled extensions built for this card" in page
    assert "These extensions have no code for sm_90 and will fail when called on this card: old_kernels/_C.so" in page
    assert "flash_attn/flash_attn_cuda.so" in page
    assert "largest relative error: bfloat16 7.1e-03, float16 9.0e-04, float32 2.1e-06" in page
    assert "AdamW optimizer state (1.9 MiB) were saved in your home directory" in page


def test_the_same_report_is_explained_in_french():
    page = render_preflight(H200_REPORT, "fr")
    assert "Extensions compilées pour cette carte" in page
    assert "Ces extensions n’ont pas de code pour sm_90 et échoueront dès leur appel" in page
    assert "plus grande erreur relative : bfloat16 7.1e-03" in page
    assert "AdamW (1.9 Mio) ont été sauvegardés dans votre répertoire personnel" in page
    assert "Sauvegarde et rechargement d’un checkpoint" in page
    assert "have no code for" not in page


def test_the_pass_and_warn_results_of_the_extension_check_are_explained():
    report = json.loads(json.dumps(H200_REPORT))
    report["checks"][0]["status"] = "PASS"
    assert "Every compiled extension with GPU code in the image (3) carries code built for sm_90." in render_preflight(
        report, "en"
    )
    report["checks"][0]["status"] = "WARN"
    page = render_preflight(report, "fr")
    assert "que du code portable (PTX)" in page and "old_kernels/_C.so, flash_attn/flash_attn_cuda.so" in page


def test_hostile_report_values_are_shown_bounded_and_escaped_never_explained():
    huge = "<script>alert(1)</script>" + "x" * 100_000
    report = {
        "checks": [
            {"name": "rm_rf", "status": "PASS", "reason": huge},
            {"name": huge, "status": "<b>EXCELLENT</b>", "reason": 12},
            {"name": "compiled_extensions", "status": "FAIL", "reason": None},
            "not a check",
            {"name": "sdpa_attention", "status": "PASS"},
        ]
        * 20,
        "results": {
            "sdpa_max_rel_error": {"float32": "NaN", "bfloat16": float("inf"), "<i>": 1},
            "checkpoint_bytes": True,
            "extensions": {"target": huge, "missing": [huge, 7, {"a": 1}], "native_count": "many"},
        },
    }
    page = render_preflight(report, "en")
    assert "<script>" not in page and "<b>EXCELLENT" not in page
    assert "&lt;script&gt;" in page
    assert len(page) < 60_000
    assert page.count("<tr data-check") == 32  # the first 40 entries are read, the 8 that are not objects dropped
    assert 'data-check="rm_rf"' in page  # an unknown check is shown as its name, without an explanation
    assert "largest relative error: —" in page
    assert '<span class="status status-check-">?</span>' in page
    assert render_preflight({"checks": "all good"}, "en").count("<tr") == 1  # the header row only
    assert render_preflight([], "en").count("<tr") == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("language", "words"),
    [
        ("en", ["Attention (SDPA)", "Checkpoint save and reload", "only PTX", "names the extension to rebuild"]),
        ("fr", ["Attention (SDPA)", "Sauvegarde et rechargement", "seulement du PTX", "nomme l’extension"]),
    ],
)
def test_the_guide_explains_each_new_result_and_the_report_links_to_it(client, language, words):
    from django.urls import reverse

    client.cookies["django_language"] = language
    guide = client.get(reverse("customer:guide")).content.decode()
    section = guide[guide.index('id="preflight"') : guide.index("</section>", guide.index('id="preflight"'))]
    for word in words:
        assert word in section
    link = f'href="{reverse("customer:guide")}#preflight"'
    assert link in render_preflight(H200_REPORT, language)
    assert ("Ce que signifie chaque résultat" in render_preflight(H200_REPORT, language)) == (language == "fr")
