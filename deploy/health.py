"""How healthy a topology cluster is, over the Kafka protocol.

``observe_cluster`` (trio) asks every broker of a cluster, each on its own connection and
within a bound, DescribeCluster (which brokers the controller has registered, unfenced, and
who the controller is) and Metadata (partitions with leader, replicas and ISR).
``assess`` (pure) turns those answers into a :class:`ClusterHealth`: brokers up and
registered, the controller, offline and under-replicated partitions, what is wrong, and
whether the cluster is ready (what ``dcmirror up`` waits for).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.client.connection import BrokerConnection, KafkaConnectionError, UnsupportedApi
from cluster.client.describe import PartitionDescription, describe_cluster, describe_topics
from cluster.client.errors import KafkaError, error_name
from cluster.security.connector import PLAINTEXT, LinkSecurity
from topology.model import ClusterSpec

LISTED_MAX = 5  # partitions named in a problem line; the rest are counted
PartitionView = PartitionDescription


@dataclass(frozen=True)
class BrokerView:
    """One broker's answer (or why there was none)."""

    node_id: int
    address: str
    error: str | None = None
    controller_id: int | None = None
    registered: tuple[int, ...] = ()
    """The brokers it lists as registered and unfenced."""
    partitions: tuple[PartitionView, ...] | None = None


@dataclass(frozen=True)
class ClusterHealth:
    name: str
    datacenter: str
    broker_ids: tuple[int, ...]
    up: tuple[int, ...]
    """Brokers that answered."""
    registered: tuple[int, ...]
    """Brokers the controller's view lists as registered (unfenced)."""
    controller_id: int | None
    """Combined mode: the broker the others name as controller. None with dedicated controllers
    (brokers cannot name them over the Kafka protocol) or when nobody names one."""
    topics: int
    partitions: int
    """Of the topics (internal ones left out; offline and under-replicated count them too)."""
    offline: tuple[str, ...]
    under_replicated: tuple[str, ...]
    problems: tuple[str, ...]
    waiting: tuple[str, ...] = field(default=())
    """Why the cluster is not ready yet (empty: ready)."""
    controller_ids: tuple[int, ...] = ()
    """Dedicated controller nodes (empty: combined mode)."""
    controllers_up: tuple[int, ...] = ()
    """Dedicated controllers that accept connections."""

    @property
    def ready(self) -> bool:
        return not self.waiting

    @property
    def healthy(self) -> bool:
        return not self.problems

    def document(self) -> dict[str, Any]:
        return {"cluster": self.name, "datacenter": self.datacenter, "brokers": list(self.broker_ids),
                "brokers_up": list(self.up), "brokers_registered": list(self.registered),
                "controller": self.controller_id, "controllers": list(self.controller_ids),
                "controllers_up": list(self.controllers_up), "topics": self.topics, "partitions": self.partitions,
                "offline_partitions": list(self.offline), "under_replicated_partitions": list(self.under_replicated),
                "healthy": self.healthy, "ready": self.ready, "problems": list(self.problems)}


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:LISTED_MAX])
    return shown + (f" and {len(names) - LISTED_MAX} more" if len(names) > LISTED_MAX else "")


def assess(spec: ClusterSpec, views: Sequence[BrokerView], controllers: Sequence[BrokerView] = ()) -> ClusterHealth:
    """The cluster's health from its brokers' answers (one view per broker of ``spec``) and,
    with dedicated controllers, whether each accepts connections."""
    ids = tuple(a.node_id for a in spec.brokers)
    answered = [v for v in views if v.error is None]
    problems: list[str] = []
    waiting: list[str] = []
    for v in views:
        if v.error is not None:
            waiting.append(f"broker {v.node_id} does not answer yet")
            if answered:
                problems.append(f"broker {v.node_id} ({v.address}) does not answer: {v.error}")
    if views and not answered:
        problems.append(f"no broker answers ({views[0].address}: {views[0].error})" if len(views) == 1 else
                        f"none of the {len(views)} brokers answers ({views[0].address}: {views[0].error})")
    # The controller the answering brokers name most often; its own view of the brokers
    # counts (it registers them), else the most common view.
    votes = Counter(v.controller_id for v in answered if v.controller_id is not None and v.controller_id >= 0)
    controller_id = votes.most_common(1)[0][0] if votes and spec.combined else None
    by_id = {v.node_id: v for v in answered}
    reference = by_id.get(controller_id) if controller_id is not None else None
    if reference is None and answered:
        common = Counter(v.registered for v in answered).most_common(1)[0][0]
        reference = next(v for v in answered if v.registered == common)
    registered = tuple(sorted(set(reference.registered) & set(ids))) if reference is not None else ()
    controllers_up = tuple(c.node_id for c in controllers if c.error is None)
    if spec.combined:
        if answered and controller_id is None:
            problems.append("no controller: no broker names one")
            waiting.append("no controller yet")
    else:
        for c in controllers:
            if c.error is not None:
                problems.append(f"controller {c.node_id} ({c.address}) does not answer: {c.error}")
        if len(controllers_up) <= len(spec.controllers) // 2:
            problems.append(f"no controller quorum: {len(controllers_up)} of {len(spec.controllers)} "
                            "dedicated controllers answer")
            waiting.append("no controller quorum yet")
    for node_id in ids:
        if node_id in by_id and node_id not in registered:
            problems.append(f"broker {node_id} answers but is not registered with the controller (fenced)")
    for v in answered:
        missing = sorted(set(ids) - set(v.registered))
        if missing:
            waiting.append(f"broker {v.node_id} sees broker(s) {', '.join(map(str, missing))} not registered yet")
    partitions = reference.partitions if reference is not None and reference.partitions is not None else ()
    offline = tuple(p.name for p in partitions if p.leader < 0)
    under = tuple(p.name for p in partitions if len(p.isr) < len(p.replicas))
    if offline:
        problems.append(f"{len(offline)} offline partition(s) (no leader): {_listed(offline)}")
    if under:
        problems.append(f"{len(under)} under-replicated partition(s) (ISR short of the replicas): {_listed(under)}")
    topics = len({p.topic for p in partitions if not p.internal})
    user_partitions = sum(not p.internal for p in partitions)
    return ClusterHealth(spec.name, spec.datacenter, ids, tuple(v.node_id for v in answered), registered,
                         controller_id, topics, user_partitions, offline, under, tuple(problems), tuple(waiting),
                         tuple(a.node_id for a in spec.controllers), controllers_up)


async def _probe(node_id: int, host: str, port: int, timeout_s: float, with_partitions: bool,
                 link: LinkSecurity = PLAINTEXT) -> BrokerView:
    address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    conn = BrokerConnection(host, port, client_id="dcmirror-status", link=link)
    try:
        with trio.fail_after(timeout_s):
            await conn.connect(timeout_s)
            try:
                cluster = await describe_cluster(conn, timeout_s=timeout_s)
            except KafkaError as exc:
                return BrokerView(node_id, address, f"DescribeCluster answered {error_name(exc.code)}")
            partitions = None
            if with_partitions:
                topics = await describe_topics(conn, None, timeout_s=timeout_s)
                partitions = tuple(p for t in topics.values() if t.error_code == 0 for p in t.partitions)
            return BrokerView(node_id, address, None, cluster.controller_id, cluster.brokers, partitions)
    except trio.TooSlowError:
        return BrokerView(node_id, address, f"no answer within {timeout_s:g} s")
    except KafkaConnectionError as exc:
        return BrokerView(node_id, address, exc.reason)  # the address is said beside it
    except (UnsupportedApi, KafkaError, OSError) as exc:
        return BrokerView(node_id, address, str(exc) or type(exc).__name__)
    finally:
        with trio.CancelScope(shield=True):
            await conn.aclose()


async def _connectable(node_id: int, host: str, port: int, timeout_s: float) -> BrokerView:
    """A dedicated controller speaks only the quorum's own APIs: whether it accepts connections."""
    address = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        with trio.fail_after(timeout_s):
            stream = await trio.open_tcp_stream(host, port)
        await stream.aclose()
    except trio.TooSlowError:
        return BrokerView(node_id, address, f"no connection within {timeout_s:g} s")
    except OSError as exc:
        return BrokerView(node_id, address, exc.strerror or str(exc))
    return BrokerView(node_id, address)


async def observe_cluster(spec: ClusterSpec, timeout_s: float = 5.0, *,
                          with_partitions: bool = True) -> tuple[list[BrokerView], list[BrokerView]]:
    """Every node of ``spec`` asked at once, each within ``timeout_s``: (brokers, dedicated
    controllers)."""
    nodes = spec.listener_addresses() + spec.controllers  # brokers on the client listener
    views: list[BrokerView | None] = [None] * len(nodes)
    link = LinkSecurity.from_config(spec.client) if spec.client else PLAINTEXT  # the cluster's `client` table

    async def run(i: int) -> None:
        a = nodes[i]
        if i < len(spec.brokers):
            views[i] = await _probe(a.node_id, a.host, a.port, timeout_s, with_partitions, link)
        else:
            views[i] = await _connectable(a.node_id, a.host, a.port, timeout_s)

    async with trio.open_nursery() as nursery:
        for i in range(len(nodes)):
            nursery.start_soon(run, i)
    done = [v for v in views if v is not None]
    return done[:len(spec.brokers)], done[len(spec.brokers):]


async def cluster_health(spec: ClusterSpec, timeout_s: float = 5.0, *, with_partitions: bool = True) -> ClusterHealth:
    brokers, controllers = await observe_cluster(spec, timeout_s, with_partitions=with_partitions)
    return assess(spec, brokers, controllers)
