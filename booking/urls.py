from django.urls import path

from booking import views

app_name = "booking"


def urlpatterns_with(*, place_order: views.PlaceOrder) -> list:
    """The customer pages. Placing an order spans apps (its invoice belongs to payments), so the function that
    does it is given here by the project's URLconf (portal/urls.py), which also adds payments' order actions to
    this namespace."""
    return [
        path("", views.book, {"place_order": place_order}, name="book"),
        path("guide/", views.guide, name="guide"),
        path("fit/", views.fit_advisor, name="fit"),
        path("tools/split_trial.py", views.split_trial_kit, name="split-trial-kit"),
        path("orders/resend-link/", views.resend_link, name="resend-link"),
        path("orders/<str:public_id>/<str:token>/", views.order_detail, name="order"),
        path("orders/<str:public_id>/<str:token>/cancel/", views.order_cancel, name="order-cancel"),
        path("orders/<str:public_id>/<str:token>/revoke-links/", views.order_links_revoke, name="order-revoke-links"),
        path("orders/<str:public_id>/<str:token>/split-trial/", views.split_trial_upload, name="order-split-trial"),
    ]
