from django.contrib import admin
from django.urls import include, path
from django.views.i18n import JavaScriptCatalog

from portal import views

urlpatterns = [
    path("", include("web.customer.urls")),
    path("console/", include("web.console.urls")),
    path("healthz", views.healthz, name="healthz"),
    path("livez", views.livez, name="livez"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("jsi18n/", JavaScriptCatalog.as_view(), name="javascript-catalog"),
    path("admin/", admin.site.urls),
]

admin.site.site_header = "Binôme"
admin.site.site_title = "Binôme admin"
