import logging

from django.apps import AppConfig
from django.conf import settings

log = logging.getLogger("access")


class AccessConfig(AppConfig):
    name = "access"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if settings.SWITCHYARD_AUTH == "off":
            log.warning(
                "SWITCHYARD_AUTH=off: the API serves anyone who reaches the port, without"
                " a key; every request, prompt and answer is readable and cancellable by"
                " anyone. For one person on a laptop only."
            )
