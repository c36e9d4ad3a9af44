from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from scheduler import health
from scheduler.api.callers import schema_view
from scheduler.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("scheduler.api.urls")),
    path("", include("batches.urls")),
    path("api/schema/", schema_view(SpectacularAPIView.as_view()), name="schema"),
    path(
        "api/docs/",
        schema_view(SpectacularSwaggerView.as_view(url_name="schema")),
        name="api-docs",
    ),
    path("metrics", metrics_view, name="metrics"),
    path("", include("access.urls")),
    path("", include("dashboard.urls")),
]
