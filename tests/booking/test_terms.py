"""Terms, versioned: the operator publishes versions in the admin, a published one never changes, every page links
to the current one, and an order keeps the version its customer accepted."""

import pytest
from django.urls import reverse

from booking.models import Order, TermsPublished, TermsVersion
from booking.terms import terms_current, terms_draft_from, terms_publish

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("terms-admin", "admin@example.org", "a-long-admin-password")
    client.force_login(admin)
    return client


def publish_new_version(django_capture_on_commit_callbacks, **texts) -> TermsVersion:
    """What the operator does in the admin: a draft from the current version, edited, published (the booking page
    learns of it once the publication commits)."""
    draft = terms_draft_from(version=terms_current())
    for name, value in texts.items():
        setattr(draft, name, value)
    draft.save()
    with django_capture_on_commit_callbacks(execute=True):
        return terms_publish(version=draft)


def test_a_fresh_database_has_a_published_first_version_marked_as_demo_text(catalog):
    version = terms_current()
    assert version.number == 1 and version.published_at is not None
    assert version.terms_en.startswith("DEMO TEXT") and version.terms_fr.startswith("TEXTE DE DÉMONSTRATION")


def test_the_admin_shows_a_published_version_read_only_and_never_saves_it(admin_client, catalog):
    version = terms_current()
    url = reverse("admin:booking_termsversion_change", args=[version.pk])

    page = admin_client.get(url).content.decode()
    assert 'name="terms_en"' not in page and 'name="_save"' not in page  # no field to edit, no save button
    posted = admin_client.post(url, {"terms_en": "Rewritten after the fact", "terms_fr": "x"})
    assert posted.status_code == 403
    version.refresh_from_db()
    assert version.terms_en.startswith("DEMO TEXT")

    deleted = admin_client.post(reverse("admin:booking_termsversion_delete", args=[version.pk]), {"post": "yes"})
    assert deleted.status_code == 403
    assert TermsVersion.objects.filter(pk=version.pk).exists()

    version.terms_en = "Rewritten by code"  # not through the admin either
    with pytest.raises(TermsPublished):
        version.save()


def test_the_operator_drafts_edits_and_publishes_a_new_version_in_the_admin(admin_client, catalog):
    first = terms_current()
    changelist = reverse("admin:booking_termsversion_changelist")

    admin_client.post(changelist, {"action": "new_draft", "_selected_action": [first.pk]})
    draft = TermsVersion.objects.get(published_at__isnull=True)
    fields = {name: getattr(first, name) for name in ("terms_en", "terms_fr", "cancellation_en", "cancellation_fr")}
    fields |= {name: getattr(first, name) for name in ("legal_en", "legal_fr", "privacy_en", "privacy_fr")}
    fields |= {"full_refund_days_before": "14", "cancellation_fee": "25.00", "partial_refund_percent": "30"}
    edited = admin_client.post(
        reverse("admin:booking_termsversion_change", args=[draft.pk]), {**fields, "legal_en": "Seller: Binôme SAS"}
    )
    assert edited.status_code == 302
    admin_client.post(changelist, {"action": "publish", "_selected_action": [draft.pk]})

    draft.refresh_from_db()
    assert draft.number == 2 and draft.legal_en == "Seller: Binôme SAS"
    assert (draft.full_refund_days_before, draft.partial_refund_percent) == (14, 30)
    assert TermsVersion.objects.filter(published_at__isnull=False).order_by("-number").first() == draft
    first.refresh_from_db()
    assert first.legal_en.startswith("DEMO TEXT")  # the old version is as it was


@pytest.mark.parametrize("path", ["/", "/guide/", "/orders/resend-link/", "/terms/privacy/"])
def test_every_page_links_to_each_document_of_the_current_version_in_its_footer(client, catalog, path):
    footer = client.get(path).content.decode().split('<footer class="site-footer">')[1]
    for document in ("terms", "cancellation", "legal", "privacy"):
        assert f'href="/terms/{document}/"' in footer
    assert f"version 1 of {terms_current().published_at:%Y-%m-%d}" in footer


def test_terms_pages_are_in_the_page_language_with_the_operator_text_escaped(
    client, catalog, django_capture_on_commit_callbacks
):
    publish_new_version(
        django_capture_on_commit_callbacks,
        legal_en="Seller: Binôme SAS <script>alert(1)</script>\nVAT: FR00123456789",
        legal_fr="Vendeur : Binôme SAS\nTVA : FR00123456789",
    )

    english = client.get("/terms/legal/").content.decode()
    assert "<h1>Legal notice</h1>" in english and "Version 2, published on" in english
    assert "Seller: Binôme SAS &lt;script&gt;alert(1)&lt;/script&gt;<br>VAT: FR00123456789" in english
    assert "<script>alert(1)" not in english

    client.cookies["django_language"] = "fr"
    french = client.get("/terms/legal/").content.decode()
    assert "<h1>Mentions légales</h1>" in french and "Version 2, publiée le" in french
    assert "Vendeur : Binôme SAS<br>TVA : FR00123456789" in french
    assert 'href="/terms/privacy/">Politique de confidentialité</a>' in french

    assert client.get("/terms/nonsense/").status_code == 404
    assert client.get("/terms/legal/v99/").status_code == 404


def test_the_booking_form_asks_to_accept_the_current_version(client, catalog, booking_data):
    page = client.get("/").content.decode()
    version = terms_current()
    assert f'name="terms_version" value="{version.pk}"' in page
    assert "Terms of sale, version 1 of" in page and 'href="/terms/terms/"' in page

    refused = client.post("/", booking_data(accept_terms=None))
    assert refused.status_code == 200
    assert "Read and accept the terms of sale to book." in refused.content.decode()
    assert not Order.objects.exists()


def test_an_order_keeps_the_version_it_accepted_when_a_new_one_is_published(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    first = terms_current()
    response = client.post("/", booking_data())
    order = Order.objects.get()
    assert order.terms_version == first

    publish_new_version(django_capture_on_commit_callbacks, terms_en="Version two of the terms.")

    order.refresh_from_db()
    assert order.terms_version == first
    order_page = client.get(response["Location"]).content.decode()
    assert "Version 1 of" in order_page and 'href="/terms/terms/v1/"' in order_page
    old = client.get("/terms/terms/v1/").content.decode()
    assert "DEMO TEXT" in old and "A newer version is in force" in old


def test_a_form_opened_before_a_new_version_is_refused_with_everything_typed_kept(
    client, catalog, booking_data, django_capture_on_commit_callbacks
):
    opened_with = terms_current()  # the researcher opens the form, reads and accepts version 1...
    second = publish_new_version(django_capture_on_commit_callbacks, terms_en="Version two of the terms.")

    refused = client.post("/", booking_data(terms_version=str(opened_with.pk), contact_name="Grace Hopper"))

    page = refused.content.decode()
    assert refused.status_code == 200 and not Order.objects.exists()
    assert "The terms of sale changed after you opened this page: version 2 of" in page
    assert 'value="Grace Hopper"' in page and "Global batch 2048 instead of 1024" in page
    assert f'name="terms_version" value="{second.pk}"' in page  # the version to accept now
    assert "checked" not in page.split('id="field-accept_terms"')[1].split("</div>")[0]

    # accepting again books, and the order records version 2
    assert client.post("/", booking_data(contact_name="Grace Hopper")).status_code == 302
    assert Order.objects.get().terms_version == second
