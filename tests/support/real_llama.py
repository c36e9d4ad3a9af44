"""The real llama.cpp `llama-server` (C++, build b11434) as a subprocess on 127.0.0.1, in
single-model or router mode. `make llama-server` (scripts/build_llama_server.sh) builds the
binary once per machine into ~/.cache/switchyard/; tests skip when it is not there."""

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

BUILD = "11434"
START_TIMEOUT_S = 60.0


def binary() -> Path:
    """Where scripts/build_llama_server.sh puts it (SWITCHYARD_LLAMA_SERVER overrides)."""
    if found := os.environ.get("SWITCHYARD_LLAMA_SERVER"):
        return Path(found)
    root = os.environ.get("SWITCHYARD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "switchyard"
    )
    return Path(root) / f"llama-server-b{BUILD}" / "llama-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preset(sections: dict[str, dict[str, Any]]) -> str:
    """An INI `--models-preset` file's text: `{"*": {...}, "model-id": {...}}`."""
    lines = ["version = 1", ""]
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        for key, value in keys.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            lines.append(f"{key} = {value}")
        lines.append("")
    return "\n".join(lines)


class RealLlamaServer:
    """One `llama-server` process. `args` are its own (`-m FILE`, or `--models-preset FILE`);
    host and port are added. It runs in a process group of its own, so that stopping or
    killing it also ends the router's children (one `llama-server` per loaded model)."""

    def __init__(self, args: list[str], workdir: Path, wait_loaded: bool = True) -> None:
        self.args = args
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = workdir / f"llama-server-{self.port}.log"
        self.cache = workdir / "llama-cache"  # empty: no cached hub models are listed
        self.cache.mkdir(exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.start(wait_loaded)

    def start(self, wait_loaded: bool = True) -> None:
        """Start (again, on the same port). `wait_loaded`: until `/health` is 200, else
        only until it answers at all (a single-model server says 503 while loading)."""
        env = {**os.environ, "LLAMA_CACHE": str(self.cache), "LLAMA_LOG_COLORS": "off"}
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(binary()), "--host", "127.0.0.1", "--port", str(self.port), *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            self.wait_ready(wait_loaded)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, wait_loaded: bool) -> None:
        """Ask the server itself until it answers; between attempts wait on the process's
        exit, so a crash ends the wait at once."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"{self.url}/health", timeout=5).status_code
                if status == 200 or not wait_loaded:
                    return
            except httpx.TransportError:
                pass
            try:
                code = self.proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"llama-server exited with {code}:\n{self.log()}")
        raise RuntimeError(f"llama-server did not answer in {START_TIMEOUT_S}s:\n{self.log()}")

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, timeout=60, **kwargs)

    def status(self, model: str) -> dict[str, Any]:
        """A router model's `status` object as `GET /models` says now."""
        for entry in self.api("GET", "/models").json()["data"]:
            if entry["id"] == model:
                return entry["status"]
        raise KeyError(model)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")[-20000:]

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to the whole group: no cleanup of any kind, as a crash."""
        self.signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        self.signal(signal.SIGKILL)  # children the router left behind, if any
