from django.apps import AppConfig


class BackendsConfig(AppConfig):
    name = "backends"
    verbose_name = "Servers and models"

    def ready(self) -> None:
        from . import signals  # noqa: F401 (the receivers it connects)
