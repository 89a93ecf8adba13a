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


_HANDED_OUT: set[int] = set()


def _free_pair() -> int:
    """A free loopback port whose next port is free too (and neither handed out before)."""
    for _ in range(100):
        port = free_port()
        if port + 1 in _HANDED_OUT or port + 1 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _HANDED_OUT.add(port + 1)
        return port
    raise RuntimeError("no pair of free loopback ports in 100 tries")


def free_port() -> int:
    """A loopback port free now and never handed out before by this process: the kernel may
    offer a just-closed port again, and two brokers of one test would then share it."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no new free loopback port in 100 tries")


class ChildProcess:
    """What every test-started server process shares: its Popen, its log file, and the
    signals tests send it (SIGKILL, SIGTERM and wait, SIGSTOP/SIGCONT)."""

    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILL and reap (nothing if it is not running)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown (SIGKILL, and TimeoutExpired, past `timeout_s`)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise

    def pause(self) -> None:
        """SIGSTOP: a node that is alive but does nothing (a GC pause, a hung VM)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)


class BrokerProcess(ChildProcess):
    """`dcmirror broker --data-dir DIR --listen 127.0.0.1:PORT [--set k=v ...]` as a child process.

    Its stderr/stdout go to `<data_dir>.log` (appended across restarts) so tests can assert
    what the broker said (e.g. what recovery scanned).
    """

    def __init__(self, data_dir: Path, port: int | None = None, *, topology: tuple[Path, str, int] | None = None,
                 **overrides: object) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.topology = topology  # (file, cluster, node id): run as a member of a topology cluster
        self.overrides = {k.replace("_", "."): v for k, v in overrides.items()}
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_mark = 0

    @property
    def node_id(self) -> int:
        return self.topology[2] if self.topology else 1

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "deploy.cli", "broker", "--data-dir", str(self.data_dir),
               "--listen", self.bootstrap]
        if self.topology is not None:
            path, cluster, node = self.topology
            cmd += ["--config", str(path), "--cluster", cluster, "--node", str(node)]
        for key, value in self.overrides.items():
            if isinstance(value, bool):
                value = str(value).lower()
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, timeout_s: float = 30.0, *, wait_ready: bool = True) -> BrokerProcess:
        """Launch; returns once the broker is ready (registered, logs loaded, unfenced), or
        only once it listens with wait_ready=False (a cluster member waiting for its quorum)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._log_mark = self.log_path.stat().st_size if self.log_path.exists() else 0
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
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise TimeoutError(f"broker did not listen within {timeout_s}s:\n{self.log_text()[-4000:]}")
        if wait_ready:
            self.wait_ready(max(1.0, deadline - time.monotonic()))
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait for this run's "is ready" log line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}")
            try:
                with open(self.log_path, "rb") as f:
                    f.seek(self._log_mark)
                    if b" is ready (broker epoch" in f.read():
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"broker was not ready within {timeout_s}s:\n{self.log_text()[-4000:]}")

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()


class ClusterProcesses:
    """A topology file with one cluster of `size` brokers on free loopback ports, run as
    `dcmirror broker --config FILE --cluster NAME --node ID` processes.

    `config` goes into the cluster's `config` table (broker configs, Kafka names).
    """

    def __init__(self, root: Path, size: int = 3, *, name: str = "east", controllers: int = 0,
                 racks: tuple[str, ...] = (), admin_http: bool = False, **config: object) -> None:
        self.root = Path(root)
        self.name = name
        self.root.mkdir(parents=True, exist_ok=True)
        ports = [free_port() for _ in range(size)]
        if admin_http:  # each broker's admin HTTP at its Kafka port + 1 (`admin_http_base(node)`)
            ports = [_free_pair() for _ in range(size)]
            config = {**config, "admin.http.port.offset": 1}
        controller_ports = [free_port() for _ in range(controllers)]
        self.topology_path = self.root / "topology.toml"
        lines = [f"[clusters.{name}]", f'datacenter = "{name}"',
                 "brokers = [" + ", ".join(f'"127.0.0.1:{p}"' for p in ports) + "]",
                 f'data_dir = "data/{name}"']
        if controllers:
            lines.append("controllers = [" + ", ".join(f'"127.0.0.1:{p}"' for p in controller_ports) + "]")
        if racks:
            lines.append("racks = [" + ", ".join(f'"{r}"' for r in racks) + "]")
        if config:
            items = ", ".join(f'"{k.replace("_", ".")}" = "{str(v).lower() if isinstance(v, bool) else v}"'
                              for k, v in config.items())
            lines.append(f"config = {{ {items} }}")
        self.topology_path.write_text("\n".join(lines) + "\n")
        self.brokers = {
            i + 1: BrokerProcess(self.root / "data" / name / f"node-{i + 1}", port,
                                 topology=(self.topology_path, name, i + 1))
            for i, port in enumerate(ports)
        }
        # Dedicated controller nodes (ids size+1..): quorum voters that host no partitions.
        self.controllers = {
            size + i + 1: BrokerProcess(self.root / "data" / name / f"node-{size + i + 1}", port,
                                        topology=(self.topology_path, name, size + i + 1))
            for i, port in enumerate(controller_ports)
        }

    def __getitem__(self, node_id: int) -> BrokerProcess:
        return self.brokers[node_id]

    def admin_http_base(self, node_id: int) -> str:
        """http://host:port of a broker's admin HTTP (a cluster made with admin_http=True)."""
        return f"http://127.0.0.1:{self.brokers[node_id].port + 1}"

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def bootstrap_of(self, *node_ids: int) -> str:
        return ",".join(self.brokers[i].bootstrap for i in node_ids)

    def start(self, timeout_s: float = 60.0) -> ClusterProcesses:
        # All first, then wait: no member is ready before a majority of voters runs.
        for c in self.controllers.values():
            c.start(wait_ready=False)
        for b in self.brokers.values():
            b.start(wait_ready=False)
        for b in self.brokers.values():
            b.wait_ready(timeout_s)
        return self

    def alive(self) -> list[int]:
        return [i for i, b in self.brokers.items() if b.alive()]

    def stop(self, grace_s: float = 3.0) -> None:
        """Teardown: SIGTERM every node at once, SIGKILL what is left after `grace_s` (the
        last nodes cannot finish a controlled shutdown without a quorum; tests of controlled
        shutdown stop single brokers themselves)."""
        running = [b for b in (*self.brokers.values(), *self.controllers.values()) if b.alive()]
        for b in running:
            b.resume()
            assert b.proc is not None
            b.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for b in running:
            assert b.proc is not None
            try:
                b.proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                b.proc.kill()
                b.proc.wait()

    def dump_stacks(self) -> None:
        """SIGUSR1 to every running node: each prints its threads' Python stacks into its log
        (faulthandler), so a test that times out shows where a frozen node was stuck."""
        for b in (*self.brokers.values(), *self.controllers.values()):
            if b.alive():
                assert b.proc is not None
                b.proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)

    def logs(self, tail_chars: int = 3000) -> str:
        nodes = {**self.brokers, **self.controllers}
        return "\n".join(f"---- node {i} ----\n{b.log_text()[-tail_chars:]}" for i, b in nodes.items())
