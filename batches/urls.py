from django.urls import path

from . import api

urlpatterns = [
    path("v1/files", api.FileList.as_view(), name="file-list"),
    path("v1/files/<str:file_id>", api.file_detail, name="file-detail"),
    path("v1/files/<str:file_id>/content", api.file_content, name="file-content"),
    path("v1/batches", api.BatchList.as_view(), name="batch-list"),
    path("v1/batches/<str:batch_id>", api.batch_detail, name="batch-detail"),
    path("v1/batches/<str:batch_id>/cancel", api.batch_cancel, name="batch-cancel"),
]
