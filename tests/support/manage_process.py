"""A `manage.py` command (or another of the project's programs) in a process of its own,
started once it says it is ready."""

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ManageProcess:
    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        ready: Callable[[str], bool],
        program: tuple[str, ...] = ("manage.py",),
        pass_fds: tuple[int, ...] = (),
    ):
        self.proc = subprocess.Popen(
            [sys.executable, *program, *args],
            pass_fds=pass_fds,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log: list[str] = []
        for line in self.proc.stdout:  # waits on the process's own word that it is ready
            self.log.append(line)
            if ready(line):
                return
        raise RuntimeError(f"{' '.join(program)} {args[0]} did not start:\n" + "".join(self.log))

    def wait_for_line(self, text: str) -> None:
        """Read what it prints until a line says `text`."""
        for line in self.proc.stdout:
            self.log.append(line)
            if text in line:
                return
        raise AssertionError(f"it exited before saying {text!r}:\n{''.join(self.log)}")

    def output(self, timeout: float) -> str:
        """Everything it printed, once it has exited (killed after `timeout`, with what it
        printed in the failure)."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            said = "".join(self.log) + (out or "")
            raise AssertionError(f"still running after {timeout} s; it said:\n{said}") from None
        return "".join(self.log) + (out or "")
