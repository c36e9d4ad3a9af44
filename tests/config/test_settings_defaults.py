"""Secure by default: DEBUG is off unless set, and a missing SECRET_KEY is generated once,
readable by its owner only, and shared by the processes of one checkout."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRINT = "from django.conf import settings; print(settings.DEBUG, settings.SECRET_KEY)"


def settings_in(project: Path, **env: str) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DEBUG", "SECRET_KEY"}}
    clean.update(DJANGO_SETTINGS_MODULE="config.settings", PYTHONPATH=str(project), **env)
    out = subprocess.run(
        [sys.executable, "-c", PRINT], cwd=project, env=clean, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    debug, key = out.stdout.split()
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
