from django.urls import path

from web.customer import booking, order, terms

# The customer pages, under the "booking" namespace (the name their links have always had).
app_name = "booking"

urlpatterns = [
    path("", booking.book, name="book"),
    path("guide/", booking.guide, name="guide"),
    path("fit/", booking.fit_advisor, name="fit"),
    path("tools/split_trial.py", booking.split_trial_kit, name="split-trial-kit"),
    path("terms/<slug:document>/", terms.terms_page, name="terms"),
    path("terms/<slug:document>/v<int:number>/", terms.terms_page, name="terms-version"),
    path("orders/resend-link/", booking.resend_link, name="resend-link"),
    path("orders/<str:public_id>/<str:token>/", order.order_detail, name="order"),
    path("orders/<str:public_id>/<str:token>/events/", order.order_events, name="order-events"),
    path("orders/<str:public_id>/<str:token>/book-again/", booking.book_again, name="order-book-again"),
    path("orders/<str:public_id>/<str:token>/cancel/", order.order_cancel, name="order-cancel"),
    path("orders/<str:public_id>/<str:token>/extend/", order.order_extend, name="order-extend"),
    path("orders/<str:public_id>/<str:token>/end/", order.order_end_early, name="order-end"),
    path("orders/<str:public_id>/<str:token>/keys/", order.order_keys, name="order-keys"),
    path("orders/<str:public_id>/<str:token>/readings.csv", order.order_readings_csv, name="order-readings"),
    path("orders/<str:public_id>/<str:token>/revoke-links/", order.order_links_revoke, name="order-revoke-links"),
    path("orders/<str:public_id>/<str:token>/split-trial/", order.split_trial_upload, name="order-split-trial"),
    path("orders/<str:public_id>/<str:token>/paid/", order.invoice_paid, name="order-paid"),
    path("orders/<str:public_id>/<str:token>/refund-address/", order.order_refund_address, name="order-refund-address"),
    path("orders/<str:public_id>/<str:token>/asset/", order.invoice_asset, name="order-asset"),
    path("orders/<str:public_id>/<str:token>/billing/", order.order_billing, name="order-billing"),
    path(
        "orders/<str:public_id>/<str:token>/invoices/<str:number>.pdf",
        order.order_invoice_pdf,
        name="order-invoice-pdf",
    ),
]
