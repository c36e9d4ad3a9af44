"""The settings the runtime reads, and the policy's configuration made of them."""

from typing import Any

from django.conf import settings

from ..snapshot import PolicyConfig


def knob(name: str) -> Any:
    return settings.SWITCHYARD[name]


def policy_config() -> PolicyConfig:
    return PolicyConfig(
        aging_step_s=knob("AGING_STEP_S"),
        min_residency_s=knob("MIN_RESIDENCY_S"),
        warm_window_s=knob("WARM_WINDOW_S"),
        normal_warm_window_s=knob("NORMAL_WARM_WINDOW_S"),
        activity_window_s=knob("ACTIVITY_WINDOW_S"),
        parallel_load_queue=knob("PARALLEL_LOAD_QUEUE"),
        no_server_grace_s=knob("NO_SERVER_GRACE_S"),
        rescue_s=knob("RESCUE_S"),
        restore_window_s=knob("RESTORE_WINDOW_S"),
        urgent_load_s=knob("URGENT_LOAD_S"),
        time_zone=knob("TIME_ZONE"),
    )
