from django.urls import path

from web import converters  # noqa: F401 (registers the `linkpart` converter)
from web.console import views

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("calendar/", views.calendar, name="calendar"),
    path("hosts/", views.hosts, name="hosts"),
    path("reports/", views.reports, name="reports"),
    path("hosts/<slug:name>/", views.host_detail, name="host"),
    path("hosts/<slug:name>/check/", views.host_check, name="host-check"),
    path("refunds/<int:refund_id>/pay/", views.refund_pay, name="refund-pay"),
    path("payments/<int:invoice_id>/<slug:action>/", views.flagged_payment_action, name="flagged-payment"),
    path("orders/<linkpart:public_id>/", views.order_detail, name="order"),
    path("orders/<linkpart:public_id>/events/", views.order_events, name="order-events"),
    path("orders/<linkpart:public_id>/<slug:action>/", views.order_action, name="action"),
]
