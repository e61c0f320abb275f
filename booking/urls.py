from django.urls import path

from booking import views

app_name = "booking"

urlpatterns = [
    path("", views.book, name="book"),
    path("orders/resend-link/", views.resend_link, name="resend-link"),
    path("orders/<str:public_id>/<str:token>/", views.order_detail, name="order"),
    path("orders/<str:public_id>/<str:token>/cancel/", views.order_cancel, name="order-cancel"),
]
