"""A schema registry process (`dcmirror registry`) for the registry tests."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

from tests.harness import REPO, ChildProcess, free_port


class RegistryProcess(ChildProcess):
    """`dcmirror registry --bootstrap ... --listen ...` (or `--config FILE --cluster NAME`)
    as a child process; start() returns once it printed its ready line (state replayed,
    port open)."""

    def __init__(self, log_path: Path, *, bootstrap: str | None = None, config: tuple[Path, str] | None = None,
                 port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap = bootstrap
        self.config = config
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0
        self._began = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        # The console script, as operators run it (it also skips kio's optional hypothesis import).
        cmd = [str(Path(sys.executable).parent / "dcmirror"), "registry", "--listen", f"127.0.0.1:{self.port}"]
        if self.config is not None:
            cmd += ["--config", str(self.config[0]), "--cluster", self.config[1]]
        else:
            assert self.bootstrap is not None
            cmd += ["--bootstrap", self.bootstrap]
        return cmd

    def start(self, timeout_s: float = 30.0) -> RegistryProcess:
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> RegistryProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self._began = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), cwd=REPO, stdout=subprocess.PIPE, stderr=log, env=env)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> RegistryProcess:
        assert self.proc is not None and self.proc.stdout is not None
        began = self._began
        deadline = began + timeout_s
        line = b""
        # A selector, not select.select(): an xdist worker that ran hundreds of tests holds
        # descriptors above FD_SETSIZE (1024), which select() refuses.
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"registry not ready (exit {self.proc.poll()}):\n{self.log_text()[-4000:]}")
                if selector.select(min(left, 1.0)):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        time.sleep(0.05)  # EOF: the process is exiting; poll() says so next round
                        continue
                    line += chunk
        assert b"schema registry ready" in line, line
        self.started_s = time.monotonic() - began
        return self

    def is_primary(self) -> bool:
        """What its log last said about the election."""
        lines = [line for line in self.log_text().splitlines() if "schema registry primary:" in line]
        return bool(lines) and lines[-1].endswith("(this instance)")

    def stop(self, timeout_s: float = 15.0) -> int:
        return super().stop(timeout_s)
