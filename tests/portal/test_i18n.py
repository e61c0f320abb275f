"""French and English: the switch, the negotiated language, and translated pages."""

import pytest
from django.urls import reverse


@pytest.mark.django_db
def test_the_language_switch_turns_the_booking_page_french_and_back(client, catalog):
    response = client.post(reverse("set_language"), {"language": "fr", "next": "/"})
    assert response.status_code == 302

    page = client.get("/").content.decode()
    assert '<html lang="fr">' in page
    assert "Deux GPU de centre de données, une fenêtre de recherche" in page or "fenêtre de recherche" in page
    assert "Réserver" in page

    client.post(reverse("set_language"), {"language": "en", "next": "/"})
    assert "Two data-centre GPUs, one research window" in client.get("/").content.decode()


@pytest.mark.django_db
def test_a_french_browser_gets_french_without_choosing(client, catalog):
    page = client.get("/", headers={"Accept-Language": "fr-FR,fr;q=0.9,en;q=0.5"}).content.decode()
    assert '<html lang="fr">' in page


@pytest.mark.django_db
def test_unknown_languages_fall_back_to_english(client, catalog):
    client.cookies["django_language"] = "xx-evil<script>"
    page = client.get("/").content.decode()
    assert '<html lang="en">' in page
