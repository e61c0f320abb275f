"""Attacks on the versioned terms (issue 21's red team): a published version cannot be changed by a save racing it."""

import pytest

pytestmark = pytest.mark.django_db


# --- 9. a published terms version and a concurrent save of its draft ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_terms_version_being_published_cannot_be_overwritten_by_a_concurrent_save_of_its_draft():
    """HELD (was a low finding: two admins racing): TermsVersion.save reads "published?" under the row's lock. An
    admin saving the draft's form while another publishes it waits for the publication to commit, then sees it
    published and is refused (TermsPublished; the admin answers it with a message): the published version keeps its
    number, its date and the cancellation rules that orders accepted."""
    import threading
    import time

    from django.db import connection, transaction

    from booking.models import TermsVersion
    from booking.terms import terms_draft_from, terms_publish, terms_seed_demo

    draft = terms_draft_from(version=terms_seed_demo())
    stale = TermsVersion.objects.get(pk=draft.pk)  # the admin's change form, read while it is a draft
    stale.partial_refund_percent, stale.cancellation_en = 100, "Everything is refunded, always."
    published, go, errors = threading.Event(), threading.Event(), []

    def publish() -> None:
        try:
            with transaction.atomic():
                terms_publish(version=draft)
                published.set()
                go.wait(10)
        except BaseException as exc:  # reported below
            errors.append(exc)
            published.set()
        finally:
            connection.close()

    def save() -> None:
        try:
            stale.save()
        except BaseException as exc:  # the guard refusing is the boundary holding
            errors.append(exc)
        finally:
            connection.close()

    publisher = threading.Thread(target=publish)
    publisher.start()
    published.wait(10)
    saver = threading.Thread(target=save)
    saver.start()
    time.sleep(1.0)  # the save's check has run; its UPDATE waits on the row the publication locked
    go.set()
    publisher.join(20)
    saver.join(20)

    version = TermsVersion.objects.get(pk=draft.pk)
    assert version.published_at is not None and version.number is not None, (
        f"published version {draft.pk} is a draft again (errors: {errors})"
    )
    assert version.partial_refund_percent == draft.partial_refund_percent, "its cancellation rules changed"
