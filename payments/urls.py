from django.urls import path

from payments import views

# The order page's payment actions, under the customer pages' namespace ("booking:order-paid"): the project's
# URLconf (portal/urls.py) adds them to booking's routes.
urlpatterns = [
    path("orders/<str:public_id>/<str:token>/paid/", views.invoice_paid, name="order-paid"),
    path("orders/<str:public_id>/<str:token>/asset/", views.invoice_asset, name="order-asset"),
]
