"""Secure by default: DEBUG is off unless set, a missing SECRET_KEY is generated once,
readable by its owner only, and shared by the processes of one checkout, and behind a TLS
proxy the login's cookies go over HTTPS only."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINT = "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"


def printed(project: Path, code: str, **env: str) -> list[str]:
    """What `code` prints with the project's settings loaded, in a process of its own."""
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    clean.update(DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(project), **env)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=project, env=clean, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def settings_in(project: Path, **env: str) -> tuple[str, str]:
    debug, key = printed(project, PRINT, **env)
    return debug, key


def a_project(tmp_path: Path) -> Path:
    """The settings module alone, in a folder of its own (no .env, no .secret_key)."""
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "config" / "settings.py", tmp_path / "config" / "settings.py")
    (tmp_path / "config" / "__init__.py").touch()
    return tmp_path


def test_debug_is_off_unless_set_and_the_key_is_generated_once(tmp_path) -> None:
    project = a_project(tmp_path)

    debug, key = settings_in(project)

    assert debug == "False"
    kept = project / ".secret_key"
    assert kept.read_text().strip() == key and len(key) >= 50
    assert kept.stat().st_mode & 0o777 == 0o600
    assert settings_in(project) == ("False", key)  # the next process reads the same key
    assert [p.name for p in project.iterdir() if p.name.startswith(".secret_key")] == [
        ".secret_key"
    ]


def test_debug_and_the_key_come_from_the_environment(tmp_path) -> None:
    project = a_project(tmp_path)

    assert settings_in(project, DEBUG="true", SECRET_KEY="k" * 50) == ("True", "k" * 50)
    assert not (project / ".secret_key").exists()


COOKIES = (
    "from django.conf import settings as s;"
    " print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER,"
    " s.SECURE_HSTS_SECONDS)"
)


def test_behind_a_tls_proxy_the_logins_cookies_go_over_https_only(tmp_path) -> None:
    project = a_project(tmp_path)

    assert printed(project, COOKIES) == ["False", "False", "None", "0"]
    behind = printed(project, COOKIES, BEHIND_TLS_PROXY="on", HSTS_SECONDS="3600")
    assert behind == ["True", "True", "('HTTP_X_FORWARDED_PROTO',", "'https')", "3600"]


def test_a_first_run_without_collectstatic_starts_without_a_warning():
    """WhiteNoise serves the apps' files through the finders, so `collectstatic`'s folder
    missing (a first `manage.py serve` with DEBUG off) is nothing to warn about at start."""
    if (ROOT / "staticfiles").exists():
        pytest.skip("this checkout ran collectstatic: nothing is missing")
    script = (
        "import django; django.setup(); "
        "from whitenoise.middleware import WhiteNoiseMiddleware; "
        "WhiteNoiseMiddleware(lambda request: None)"
    )
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "PYTHONWARNINGS"}}
    clean.update(DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", script],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "No directory at" not in out.stderr
