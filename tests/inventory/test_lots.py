"""The fleet's lots as the operator edits them in the admin: a lot's GPUs are as many as its class has cards, each
named once, none taken by another lot of the host (inventory's Lot.clean)."""

import pytest
from django.urls import reverse

from inventory.models import Lot

pytestmark = pytest.mark.django_db


def test_a_lot_must_have_as_many_distinct_free_gpus_as_its_class_has_cards(admin_client, catalog):
    existing = Lot.objects.select_related("host").filter(hardware_class=catalog["b200-pair"]).first()
    add_url = reverse("admin:inventory_lot_add")
    base = {"name": "new-lot", "hardware_class": catalog["b200-pair"].pk, "host": existing.host.pk, "status": "active"}

    for indices, message in [
        ("0", "A lot of NVIDIA B200 pair has 2 cards."),
        ("4,4", "A GPU index appears twice."),
        ("a,b", "List GPU indices as numbers separated by commas"),
        (existing.gpu_indices, "These GPUs already belong to another lot of this host."),
    ]:
        response = admin_client.post(add_url, {**base, "gpu_indices": indices})
        assert message in response.content.decode(), indices
    assert not Lot.objects.filter(name="new-lot").exists()

    assert admin_client.post(add_url, {**base, "gpu_indices": "4, 5"}).status_code == 302
    assert Lot.objects.get(name="new-lot").gpu_indices == "4,5"
