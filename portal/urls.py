from django.contrib import admin
from django.urls import include, path
from django.views.i18n import JavaScriptCatalog

from booking import urls as booking_urls
from payments import urls as payments_urls
from portal import checkout, views

customer_pages = booking_urls.urlpatterns_with(place_order=checkout.order_place) + payments_urls.urlpatterns

urlpatterns = [
    path("", include((customer_pages, booking_urls.app_name))),
    path("console/", include("provisioning.urls")),
    path("healthz", views.healthz, name="healthz"),
    path("livez", views.livez, name="livez"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("jsi18n/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("admin/", admin.site.urls),
]

admin.site.site_header = "Binôme"
admin.site.site_title = "Binôme admin"
