from django.urls import path

from booking import views
from payments import views as payment_views

app_name = "booking"

urlpatterns = [
    path("", views.book, name="book"),
    path("guide/", views.guide, name="guide"),
    path("fit/", views.fit_advisor, name="fit"),
    path("tools/split_trial.py", views.split_trial_kit, name="split-trial-kit"),
    path("orders/resend-link/", views.resend_link, name="resend-link"),
    path("orders/<str:public_id>/<str:token>/", views.order_detail, name="order"),
    path("orders/<str:public_id>/<str:token>/cancel/", views.order_cancel, name="order-cancel"),
    path("orders/<str:public_id>/<str:token>/paid/", payment_views.invoice_paid, name="order-paid"),
    path("orders/<str:public_id>/<str:token>/split-trial/", views.split_trial_upload, name="order-split-trial"),
    path("orders/<str:public_id>/<str:token>/asset/", payment_views.invoice_asset, name="order-asset"),
]
