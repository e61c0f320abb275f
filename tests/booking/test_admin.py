"""The admin: catalog editable with the compatibility rules enforced (a lot's GPUs: tests/inventory/test_lots.py);
orders readable, never edited by hand."""

import pytest
from django.urls import reverse

from booking.models import EnvironmentImage, Order

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root-admin", "admin@example.org", "a-long-admin-password")
    client.force_login(admin)
    return client


def test_an_image_cannot_be_offered_on_hardware_its_runtime_does_not_target(admin_client, catalog):
    rocm = EnvironmentImage.objects.get(slug="pytorch-2-6-rocm-6-4")
    url = reverse("admin:booking_environmentimage_change", args=[rocm.pk])

    response = admin_client.post(
        url,
        {
            "slug": rocm.slug,
            "name": rocm.name,
            "image_ref": rocm.image_ref,
            "runtime": rocm.runtime,
            "runtime_version": rocm.runtime_version,
            "pytorch_version": rocm.pytorch_version,
            "hardware_classes": [catalog["mi300x-pair"].pk, catalog["b200-pair"].pk],
            "is_active": "on",
            "position": "2",
        },
    )

    assert response.status_code == 200
    assert "is a ROCm image; NVIDIA B200 pair needs CUDA." in response.content.decode()
    assert list(rocm.hardware_classes.values_list("slug", flat=True)) == ["mi300x-pair"]


def test_orders_and_their_history_are_read_only_in_the_admin(admin_client, catalog, booking_data):
    admin_client.post(reverse("customer:book"), booking_data())
    order = Order.objects.get()

    change = admin_client.get(reverse("admin:booking_order_change", args=[order.pk]))
    assert change.status_code == 200
    page = change.content.decode()
    assert order.public_id in page and "order placed" in page
    assert 'name="status"' not in page  # no editable status field
    assert admin_client.get(reverse("admin:booking_order_add")).status_code == 403
    assert admin_client.get(reverse("admin:booking_order_changelist") + "?status=awaiting_payment").status_code == 200
