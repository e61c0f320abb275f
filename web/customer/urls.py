from django.urls import path

from web import converters  # noqa: F401 (registers the `linkpart` and `printable` converters)
from web.customer import booking, order, terms

# The customer pages, under the "booking" namespace (the name their links have always had).
app_name = "customer"

urlpatterns = [
    path("", booking.book, name="book"),
    path("guide/", booking.guide, name="guide"),
    path("calendar/", booking.calendar, name="calendar"),
    path("fit/", booking.fit_advisor, name="fit"),
    path("tools/split_trial.py", booking.split_trial_kit, name="split-trial-kit"),
    path("tools/archcheck.py", booking.archcheck, name="archcheck"),
    path("tools/archcheck/verdict/", booking.archcheck_verdict, name="archcheck-verdict"),
    path("terms/<slug:document>/", terms.terms_page, name="terms"),
    path("terms/<slug:document>/v<int:number>/", terms.terms_page, name="terms-version"),
    path("orders/resend-link/", booking.resend_link, name="resend-link"),
    path("book/confirm-address/", booking.confirm_address, name="confirm-address"),
    # Under /orders/<x>/<secret>/: the logs redact it as they do an order's link (infrastructure/redaction.py).
    path("orders/address-confirmed/<str:signed>/", booking.address_confirmed, name="address-confirmed"),
    path("orders/<linkpart:public_id>/<linkpart:token>/", order.order_detail, name="order"),
    path("orders/<linkpart:public_id>/<linkpart:token>/events/", order.order_events, name="order-events"),
    path("orders/<linkpart:public_id>/<linkpart:token>/book-again/", booking.book_again, name="order-book-again"),
    path("orders/<linkpart:public_id>/<linkpart:token>/cancel/", order.order_cancel, name="order-cancel"),
    path("orders/<linkpart:public_id>/<linkpart:token>/extend/", order.order_extend, name="order-extend"),
    path("orders/<linkpart:public_id>/<linkpart:token>/end/", order.order_end_early, name="order-end"),
    path("orders/<linkpart:public_id>/<linkpart:token>/keys/", order.order_keys, name="order-keys"),
    path("orders/<linkpart:public_id>/<linkpart:token>/readings.csv", order.order_readings_csv, name="order-readings"),
    path("orders/<linkpart:public_id>/<linkpart:token>/record/<slug:kind>", order.order_record, name="order-record"),
    path("records/signing-key.pem", order.record_signing_key, name="record-signing-key"),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/revoke-links/",
        order.order_links_revoke,
        name="order-revoke-links",
    ),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/split-trial/", order.split_trial_upload, name="order-split-trial"
    ),
    path("orders/<linkpart:public_id>/<linkpart:token>/paid/", order.invoice_paid, name="order-paid"),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/refund-address/",
        order.order_refund_address,
        name="order-refund-address",
    ),
    path("orders/<linkpart:public_id>/<linkpart:token>/asset/", order.invoice_asset, name="order-asset"),
    path("orders/<linkpart:public_id>/<linkpart:token>/billing/", order.order_billing, name="order-billing"),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/alert-mails/", order.order_alert_mails, name="order-alert-mails"
    ),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/checkpoints/", order.order_checkpoints, name="order-checkpoints"
    ),
    path(
        "orders/<linkpart:public_id>/<linkpart:token>/invoices/<printable:number>.pdf",
        order.order_invoice_pdf,
        name="order-invoice-pdf",
    ),
]
