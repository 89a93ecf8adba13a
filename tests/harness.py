"""Real broker processes on loopback for integration tests and benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    """`dcmirror broker --data-dir DIR --listen 127.0.0.1:PORT [--set k=v ...]` as a child process.

    Its stderr/stdout go to `<data_dir>.log` (appended across restarts) so tests can assert
    what the broker said (e.g. what recovery scanned).
    """

    def __init__(self, data_dir: Path, port: int | None = None, **overrides: object) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.overrides = {k.replace("_", "."): v for k, v in overrides.items()}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(self.data_dir),
               "--listen", self.bootstrap]
        for key, value in self.overrides.items():
            if isinstance(value, bool):
                value = str(value).lower()
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.command(), cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"broker did not listen within {timeout_s}s:\n{self.log_text()[-4000:]}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None
