from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("scheduler.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include("dashboard.urls")),
]
