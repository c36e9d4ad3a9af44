"""Every policy knob an operator can set reaches the policy."""

from django.test import override_settings

from scheduler.snapshot import PolicyConfig
from scheduler.store import policy_config


def test_policy_knobs_come_from_settings(settings) -> None:
    knobs = {
        **settings.SWITCHYARD,
        "AGING_STEP_S": 11.0,
        "MIN_RESIDENCY_S": 12.0,
        "WARM_WINDOW_S": 13.0,
        "NORMAL_WARM_WINDOW_S": 7.0,
        "ACTIVITY_WINDOW_S": 14.0,
        "PARALLEL_LOAD_QUEUE": 5,
        "NO_SERVER_GRACE_S": 6.0,
        "RESCUE_S": 7.0,
        "URGENT_LOAD_S": 8.0,
    }
    with override_settings(SWITCHYARD=knobs):
        config = policy_config()

    assert config == PolicyConfig(
        aging_step_s=11.0,
        min_residency_s=12.0,
        warm_window_s=13.0,
        normal_warm_window_s=7.0,
        activity_window_s=14.0,
        parallel_load_queue=5,
        no_server_grace_s=6.0,
        rescue_s=7.0,
        urgent_load_s=8.0,
    )
