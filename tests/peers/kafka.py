"""Apache Kafka beside dcmirror: a real Kafka broker, or a KRaft cluster of them, started the
way tests/harness.py starts dcmirror's (free loopback ports, a data directory, a log file,
kill -9), and Kafka's command-line tools run by main class (the bin/ scripts are not in
Maven; `KAFKA_TOOLS` maps each script's name to the class it runs).

    with KafkaCluster(tmp_path / "kafka", size=1).start() as kafka:
        kafka.bootstrap                      # "127.0.0.1:PORT,..."
        kafka.tool("kafka-topics", "--bootstrap-server", kafka.bootstrap, "--list")

Every node is combined (process.roles=broker,controller), the controllers a static quorum
of all nodes (controller.quorum.voters), formatted with one cluster id. The jars come from
`make peers` (tests/peers/fetch.py).
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.harness import ChildProcess, free_port
from tests.peers.fetch import classpath, load_sets, version_of

KAFKA_VERSION = version_of(load_sets()["kafka"], "org.apache.kafka:kafka_2.13")
# bin/ script -> main class (Kafka 4.x)
KAFKA_TOOLS = {
    "kafka-storage": "kafka.tools.StorageTool",
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "kafka.admin.ConfigCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-console-share-consumer": "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
    "connect-mirror-maker": "org.apache.kafka.connect.mirror.MirrorMaker",
}
# A JVM that starts fast and stays small: tools and tests, not the benchmarks' brokers.
TOOL_JVM = ("-Xss1m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
BROKER_JVM = ("-Xmx768m", "-Xms256m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
TOOL_TIMEOUT_S = 180.0
LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
TOOL_LOG4J2 = """status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
"""


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise RuntimeError("no java on the PATH: `make sysdeps` installs Java 17")
    return found


def new_cluster_id() -> str:
    """Kafka's text form of a random Uuid (22 characters, URL-safe base64), never one that
    starts with "-": as Kafka's Uuid.randomUuid, since a tool would take it for an option
    (`kafka-storage format -t -abc...` fails with "--cluster-id: expected one argument",
    one format in 64)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def tool_log_config(directory: Path) -> Path:
    path = directory / "tools-log4j2.properties"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(TOOL_LOG4J2)
    return path


def run_tool(name_or_class: str, *args: str, cwd: Path | None = None, timeout_s: float = TOOL_TIMEOUT_S,
             env: Mapping[str, str] | None = None, jvm: tuple[str, ...] = TOOL_JVM,
             input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """One of Kafka's tools (by bin/ script name or main class), to completion."""
    main = KAFKA_TOOLS.get(name_or_class, name_or_class)
    logs = Path(cwd or Path.cwd())
    cmd = [java(), *jvm, f"-Dlog4j2.configurationFile={tool_log_config(logs / '.kafka-tools')}",
           "-cp", classpath("kafka"), main, *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s, input=input_text,
                          env={**os.environ, **(env or {})})


class KafkaNode(ChildProcess):
    """One combined broker + controller process (its log: logs-N/server.log)."""

    def __init__(self, root: Path, node_id: int, port: int, controller_port: int) -> None:
        self.root = root
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.data_dir = root / f"node-{node_id}"
        self.log_dir = root / f"logs-{node_id}"
        self.config_path = root / f"server-{node_id}.properties"
        self.log_path = self.log_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, jvm: tuple[str, ...] = BROKER_JVM) -> KafkaNode:
        assert not self.alive(), f"Kafka node {self.node_id} runs already"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "log4j2.properties").write_text(LOG4J2)
        out = open(self.log_dir / "stdout.log", "ab")
        try:
            self.proc = subprocess.Popen(
                [java(), *jvm, f"-Dkafka.logs.dir={self.log_dir}",
                 f"-Dlog4j2.configurationFile={self.log_dir / 'log4j2.properties'}",
                 "-cp", classpath("kafka"), "kafka.Kafka", str(self.config_path)],
                stdout=out, stderr=subprocess.STDOUT, cwd=self.root)
        finally:
            out.close()
        return self

    def wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"Kafka node {self.node_id} exited with {self.proc.returncode}:\n"
                                   + (self.log_dir / "stdout.log").read_text(errors="replace")[-3000:]
                                   + self.log_text()[-3000:])
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"Kafka node {self.node_id} did not listen within {timeout_s:.0f} s:\n"
                           + self.log_text()[-3000:])

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL past `timeout_s` (a JVM that hangs in shutdown is not a test failure)."""
        try:
            return super().stop(timeout_s)
        except subprocess.TimeoutExpired:
            return -9


class KafkaCluster:
    """`size` combined Kafka nodes in one KRaft cluster on loopback; `config` adds broker
    configs (Kafka names) to every node's server.properties."""

    def __init__(self, root: Path, size: int = 1, *, config: Mapping[str, Any] | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cluster_id = new_cluster_id()
        self.nodes = {i: KafkaNode(self.root, i, free_port(), free_port()) for i in range(1, size + 1)}
        self.config = dict(config or {})
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes.values())
        replicas = min(3, size)
        for n in self.nodes.values():
            props = {
                "process.roles": "broker,controller", "node.id": n.node_id,
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{n.port},CONTROLLER://127.0.0.1:{n.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{n.port}",
                "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": str(n.data_dir), "num.partitions": 1,
                "offsets.topic.replication.factor": replicas, "offsets.topic.num.partitions": 50,
                "transaction.state.log.replication.factor": replicas, "transaction.state.log.min.isr": 1,
                "share.coordinator.state.topic.replication.factor": replicas,
                "share.coordinator.state.topic.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0, "auto.create.topics.enable": "false",
                **self.config,
            }
            n.config_path.write_text("".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}\n"
                                             for k, v in props.items()))

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes.values() if n.alive()) or \
            ",".join(n.bootstrap for n in self.nodes.values())

    def __getitem__(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id]

    def format(self) -> None:
        for n in self.nodes.values():
            if (n.data_dir / "meta.properties").exists():
                continue
            proc = run_tool("kafka-storage", "format", "-t", self.cluster_id, "-c", str(n.config_path),
                            cwd=self.root)
            if proc.returncode != 0:
                raise RuntimeError(f"kafka-storage format of node {n.node_id}: {proc.stdout}\n{proc.stderr}")

    def start(self, timeout_s: float = 90.0) -> KafkaCluster:
        """Format (once), start every node, wait until all brokers are registered and unfenced."""
        self.format()
        for n in self.nodes.values():
            if not n.alive():
                n.start()
        for n in self.nodes.values():
            n.wait_listening(timeout_s)
        self.wait_brokers(len(self.nodes), timeout_s)
        return self

    def wait_brokers(self, count: int, timeout_s: float = 90.0) -> None:
        """Until a Metadata answer lists `count` brokers (Kafka lists only unfenced ones)."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                client = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 2})
                md = client.list_topics(timeout=5)
                if len(md.brokers) >= count and md.controller_id >= 0:
                    return
                last = f"{len(md.brokers)} brokers, controller {md.controller_id}"
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            time.sleep(0.2)
        raise TimeoutError(f"Kafka: {count} brokers not registered within {timeout_s:.0f} s (last: {last})\n"
                           + next(iter(self.nodes.values())).log_text()[-3000:])

    def tool(self, name: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return run_tool(name, *args, cwd=self.root, **kwargs)

    def stop(self) -> None:
        for n in self.nodes.values():
            if n.alive():
                assert n.proc is not None
                n.resume()
                n.proc.send_signal(signal.SIGTERM)
        for n in self.nodes.values():
            if n.proc is not None:
                try:
                    n.proc.wait(20)
                except subprocess.TimeoutExpired:
                    n.kill9()

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def kafka_version() -> str:
    return KAFKA_VERSION
