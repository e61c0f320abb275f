"""The admin's permissions as a staff member with fewer of them would try them (issue 19's red team): the terms'
publish and draft actions, the add form of a singleton settings row."""

import pytest
from django.test import Client


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["publish", "new_draft"])
def test_a_staff_member_who_may_only_view_the_terms_cannot_publish_or_draft_them(catalog, django_user_model, action):
    """The terms versions' admin actions "Publish the selected draft" (change permission) and "New draft from this
    version" (add permission) are neither offered to nor run for a staff account that may only *view* the terms
    (a bookkeeper, support): the legally binding terms every new order accepts change only with the permission
    the edit form requires."""
    from django.contrib.auth.models import Permission
    from django.urls import reverse

    from booking.models import TermsVersion
    from booking.terms import terms_current, terms_draft_from

    current = terms_current()
    draft = terms_draft_from(version=current)
    viewer = django_user_model.objects.create_user("reader", password="x-reader-password-1", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_termsversion"))
    browser = Client()
    browser.force_login(viewer)
    target = draft if action == "publish" else current
    before = TermsVersion.objects.count()

    response = browser.post(
        reverse("admin:booking_termsversion_changelist"),
        {"action": action, "_selected_action": [str(target.pk)], "index": "0"},
    )

    assert response.status_code in (302, 403)
    draft.refresh_from_db()
    assert draft.number is None, f"a view-only staff member published terms version {draft.number}"
    assert TermsVersion.objects.count() == before, "a view-only staff member made a new terms draft"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "permission"),
    [
        ("provisioning.operatorsettings", "view_provisioningrun"),
        ("booking.bookingpolicy", "view_order"),
        ("payments.paymentsettings", "view_invoice"),
    ],
)
def test_a_singleton_settings_row_is_added_only_with_the_add_permission(django_user_model, model, permission):
    """While a singleton settings row does not exist yet (a fresh database, until a process first reads it), its
    add form needs the user's add permission: a staff member with another permission in that app (a view-only
    account) gets 403 on the operator settings (auto-approval, wipe delay), the booking policy (holds, caps) and
    the payment settings, and cannot create the row the portal then runs on."""
    from django.apps import apps
    from django.contrib.auth.models import Permission

    app_label, model_name = model.split(".")
    apps.get_model(app_label, model_name).objects.all().delete()
    staff = django_user_model.objects.create_user("viewer", password="x-viewer-password-1", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename=permission, content_type__app_label=app_label))
    browser = Client()
    browser.force_login(staff)

    response = browser.get(f"/admin/{app_label}/{model_name}/add/")

    assert response.status_code == 403, f"a staff member with only {permission} gets {model}'s add form"
