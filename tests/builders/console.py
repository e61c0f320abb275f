"""The operator's console, driven as a staff member would: an action on an order, a host's pre-flight answer."""

import json

from django.urls import reverse

from provisioning import step_context


def preflight_reporting(status: str):
    """A pre-flight step that reports `status` (dry-run hosts otherwise report DRY-RUN)."""

    def preflight(conn, ctx):
        check = {"name": "bf16_matmul", "status": status, "reason": "bf16 matmul differs" if status == "FAIL" else ""}
        summary = {"status": status, "passed": int(status == "PASS"), "failed": int(status == "FAIL")}
        report = {"schema": "binome.preflight/1", "checks": [check], "summary": summary}
        return step_context.StepOutput(json.dumps(report), {"preflight_report": report, "preflight_status": status})

    return preflight


def act(client, order, action, data=None, callbacks=None):
    url = reverse("console:action", kwargs={"public_id": order.public_id, "action": action})
    if callbacks is None:
        return client.post(url, data or {}, follow=True)
    with callbacks(execute=True):
        return client.post(url, data or {}, follow=True)
