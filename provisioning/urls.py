from django.urls import path

from provisioning import views

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("calendar/", views.calendar, name="calendar"),
    path("orders/<str:public_id>/", views.order_detail, name="order"),
    path("orders/<str:public_id>/<slug:action>/", views.order_action, name="action"),
]
