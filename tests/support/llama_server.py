"""llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`) as a real
subprocess on 127.0.0.1, serving several GGUF models from one config file. It holds one model
at a time and swaps to whichever model a request names."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, models: list[dict[str, Any]], workdir: Path) -> None:
        """`models`: llama-cpp-python model settings, each at least `model` (a path) and
        `model_alias`; the first one is loaded at start."""
        self.aliases = [m["model_alias"] for m in models]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "host": "127.0.0.1",
            "port": self.port,
            # Switchyard may send a second request while one streams; the default would cut
            # the first stream short instead of queueing the second.
            "interrupt_requests": False,
            "models": [{"n_ctx": 512, "verbose": False, **m} for m in models],
        }
        config_file = workdir / f"llama-server-{self.port}.json"
        config_file.write_text(json.dumps(config, indent=2))
        self.log_file = workdir / f"llama-server-{self.port}.log"
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--config_file", str(config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> None:
        """Ask the server itself until it answers: it binds its port only after loading the
        first model. Between attempts, wait on the process's exit, so a crash ends the wait
        at once instead of running into the deadline."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            try:
                code = self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(f"llama_cpp.server exited with {code}:\n{self.log()}")
        raise RuntimeError(f"llama_cpp.server did not answer in {START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
