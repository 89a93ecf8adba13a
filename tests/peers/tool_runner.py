"""Kafka's command-line tools in one warm JVM (tests/peers/ToolRunner.java), for modules that
run dozens of them: a JVM start costs 1-3 s on two cores (more under load), a tool in a warm
JVM a fraction of that. Same answer as `run_tool` (exit code, stdout, stderr), the tool given
by its bin/ script name or main class:

    with KafkaTools(tmp_path) as tools:
        tools.run("kafka-topics", "--bootstrap-server", bootstrap, "--list").stdout

A tool's Exit.exit or System.exit ends its own run, not the JVM. Tools run one at a time.
The runner is compiled once per source and Kafka classpath into the peers cache.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType

from tests.peers.fetch import classpath
from tests.peers.kafka import KAFKA_TOOLS, TOOL_JVM, TOOL_TIMEOUT_S, java

SOURCE = Path(__file__).with_name("ToolRunner.java")
CACHE = Path(os.environ.get("DCMIRROR_PEERS_CACHE", Path.home() / ".cache" / "dcmirror" / "peers"))
# The tools' log4j2 on their own stderr (`follow`: the runner swaps System.err per run).
LOG4J2 = """status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.follow = true
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""


def compiled_runner() -> Path:
    """The directory holding ToolRunner.class, compiled on first use (atomically: workers of
    one test run may race)."""
    cp = classpath("kafka")
    key = hashlib.sha256(SOURCE.read_bytes() + cp.encode()).hexdigest()[:16]
    target = CACHE / f"tool-runner-{key}"
    if (target / "ToolRunner.class").exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="tool-runner-", dir=CACHE))
    try:
        proc = subprocess.run(["javac", "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC", "-nowarn",
                               "-d", str(work), "-cp", cp, str(SOURCE)], capture_output=True, text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"javac of {SOURCE.name} failed:\n{proc.stdout}\n{proc.stderr}")
        try:
            work.rename(target)
        except OSError:  # another worker was first
            if not (target / "ToolRunner.class").exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


class KafkaTools:
    """One ToolRunner JVM; `run` is `run_tool` without the JVM start."""

    def __init__(self, workdir: Path, jvm: tuple[str, ...] = TOOL_JVM) -> None:
        self.workdir = Path(workdir)
        self.jvm = jvm
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = self.workdir / "tool-runner.log"

    def _start(self) -> subprocess.Popen[str]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_config = self.workdir / "tool-runner-log4j2.properties"
        log_config.write_text(LOG4J2)
        log = open(self.log_path, "a")
        try:
            self.proc = subprocess.Popen(
                [java(), *self.jvm, "-Djava.security.manager=allow", f"-Dlog4j2.configurationFile={log_config}",
                 "-cp", f"{compiled_runner()}{os.pathsep}{classpath('kafka')}", "ToolRunner"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.workdir, bufsize=1)
        finally:
            log.close()
        return self.proc

    def run(self, name_or_class: str, *args: str, input_text: str | None = None,
            timeout_s: float = TOOL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        main = KAFKA_TOOLS.get(name_or_class, name_or_class)
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        fields = [(input_text or "").encode(), main.encode(), *(a.encode() for a in args)]
        proc.stdin.write("\t".join(base64.b64encode(f).decode() for f in fields) + "\n")
        proc.stdin.flush()
        answer: list[str] = []
        reader = threading.Thread(target=lambda: answer.append(proc.stdout.readline() if proc.stdout else ""),
                                  daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive() or not answer or not answer[0].startswith("@@@ "):
            self.close()
            what = "did not finish" if reader.is_alive() else "ended the runner"
            raise RuntimeError(f"{name_or_class} {' '.join(args)} {what} within {timeout_s:.0f} s; runner log:\n"
                               + (self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""))
        _, code, out, err = answer[0].split(" ")
        return subprocess.CompletedProcess([name_or_class, *args], int(code),
                                           base64.b64decode(out).decode(errors="replace"),
                                           base64.b64decode(err).decode(errors="replace"))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> KafkaTools:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
