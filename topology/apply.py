"""The I/O of ``dcmirror topology plan|apply``: read each cluster the topology file declares
topics for, plan with :mod:`topology.plan`, and carry the plan out with the admin client.

Every cluster is handled in its own task with its own :class:`Admin`, and everything a
cluster is asked is bounded by ``timeout_s``, so one unreachable or silent cluster costs
at most that long and does not hold up the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.client.admin import Admin
from cluster.client.connection import KafkaConnectionError, UnsupportedApi
from cluster.client.describe import describe_topic_configs, describe_topics
from cluster.client.errors import KafkaError, error_name
from cluster.common.backoff import Backoff
from cluster.common.secrets import resolve
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import CONFIG_SOURCE_TOPIC
from topology.model import ClusterSpec, TopicSpec, Topology
from topology.plan import (
    NO_CHANGES,
    AddPartitions,
    AlterConfigs,
    Change,
    ClusterPlan,
    CreateTopic,
    CreateUser,
    ObservedCluster,
    ObservedTopic,
    Problem,
    UnreachableCluster,
    cluster_line,
    config_values_equal,
    plan_cluster,
)

__all__ = [
    "ClusterApply",
    "DEFAULT_TIMEOUT_S",
    "Outcome",
    "apply_exit_code",
    "apply_topology",
    "format_apply",
    "observe",
    "plan_topology",
    "selected_clusters",
]

DEFAULT_TIMEOUT_S = 30.0
POLL_FIRST_S = 0.05
POLL_MAX_S = 1.0
# What a cluster can answer or fail with: reported per cluster or per change, never raised.
CLIENT_ERRORS = (KafkaError, KafkaConnectionError, UnsupportedApi, OSError)


def _admin_settings(timeout_s: float) -> dict[str, Any]:
    timeout_ms = max(1, int(timeout_s * 1000))
    return {"default.api.timeout.ms": timeout_ms, "request.timeout.ms": timeout_ms,
            "socket.connection.setup.timeout.ms": min(10_000, timeout_ms)}


def selected_clusters(topology: Topology, only: Sequence[str] | None = None) -> list[ClusterSpec]:
    """The clusters to plan: ``only`` (unknown names raise TopologyError), else every cluster
    the file declares topics for, in file order."""
    if only:
        wanted = {topology.cluster(name).name for name in only}
        return [c for c in topology.clusters.values() if c.name in wanted]
    return [c for c in topology.clusters.values() if topology.topics_of(c.name)]


# ---- reading a cluster -------------------------------------------------------------------------


async def observe(admin: Admin, spec: ClusterSpec, topics: Sequence[TopicSpec]) -> ObservedCluster:
    """What the cluster holds of ``topics``: partitions, replica counts, and the effective
    values of the configs the file sets (asked only of topics that set some)."""
    meta = await admin.metadata([t.name for t in topics])
    observed: dict[str, ObservedTopic] = {}
    wanted_configs = {t.name: t.config for t in topics}
    for t in meta.topics:
        if t.error_code == ErrorCode.unknown_topic_or_partition or t.name not in wanted_configs:
            continue
        partitions = sorted(t.partitions, key=lambda p: p.partition_index)
        replica_counts = tuple(len(p.replica_nodes) for p in partitions)
        if t.error_code not in (ErrorCode.none, ErrorCode.leader_not_available) or not partitions:
            observed[t.name] = ObservedTopic(t.name, len(partitions), replica_counts,
                                             error=f"the cluster answers {error_name(t.error_code)} for it")
            continue
        configs: dict[str, str | None] = {}
        overrides: set[str] = set()
        if wanted_configs[t.name]:
            for entry in await admin.topic_configs(t.name):
                configs[entry.name] = entry.value
                if getattr(entry, "config_source", -1) == CONFIG_SOURCE_TOPIC:
                    overrides.add(entry.name)
        observed[t.name] = ObservedTopic(t.name, len(partitions), replica_counts, configs, frozenset(overrides))
    users: frozenset[str] | None = None
    users_error = None
    if spec.users:
        try:
            users = frozenset(await admin.describe_scram_credentials())
        except CLIENT_ERRORS as exc:
            users_error = str(exc)
    return ObservedCluster(spec.name, spec.bootstrap(), tuple(sorted(b.node_id for b in meta.brokers)), observed,
                           users, users_error)


def _unreachable(spec: ClusterSpec, exc: BaseException | None, timeout_s: float) -> UnreachableCluster:
    error = f"no answer within {timeout_s:g} s" if exc is None else str(exc)
    return UnreachableCluster(spec.name, spec.bootstrap(), error)


async def _plan_one(topology: Topology, spec: ClusterSpec, timeout_s: float) -> ClusterPlan:
    topics = topology.topics_of(spec.name)
    observed: ObservedCluster | UnreachableCluster = _unreachable(spec, None, timeout_s)
    with trio.move_on_after(timeout_s):
        try:
            async with Admin(spec.bootstrap(), client_id="dcmirror-topology",
                             config={**spec.client, **_admin_settings(timeout_s)}) as admin:
                observed = await observe(admin, spec, topics)
        except CLIENT_ERRORS as exc:
            observed = _unreachable(spec, exc, timeout_s)
    return ClusterPlan(spec, observed, plan_cluster(topics, observed, spec.users))


async def _each(specs: Sequence[ClusterSpec], work: Callable[[ClusterSpec], Any]) -> list[Any]:
    """``work(spec)`` for every cluster at once; results in ``specs`` order."""
    results: list[Any] = [None] * len(specs)

    async def run(i: int, spec: ClusterSpec) -> None:
        results[i] = await work(spec)

    async with trio.open_nursery() as nursery:
        for i, spec in enumerate(specs):
            nursery.start_soon(run, i, spec)
    return results


async def plan_topology(topology: Topology, clusters: Sequence[str] | None = None, *,
                        timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ClusterPlan]:
    """Read every selected cluster (concurrently, each within ``timeout_s``) and plan it."""
    specs = selected_clusters(topology, clusters)
    return await _each(specs, lambda spec: _plan_one(topology, spec, timeout_s))


# ---- applying -------------------------------------------------------------------------------


@dataclass
class Outcome:
    change: Change
    status: str
    """done, refused (a problem apply does not touch) or failed."""
    error: str | None = None


@dataclass
class ClusterApply:
    plan: ClusterPlan
    outcomes: list[Outcome] = field(default_factory=list)
    visible_after_s: float | None = None
    """How long until every broker showed the changes (None: nothing to wait for, or not in time)."""
    wait_error: str | None = None
    """What was still not visible when the wait ran out."""

    @property
    def ok(self) -> bool:
        return self.wait_error is None and all(o.status == "done" for o in self.outcomes)


async def _execute(admin: Admin, change: Change, timeout_s: float) -> Outcome:
    if isinstance(change, Problem):
        return Outcome(change, "refused")
    with trio.move_on_after(timeout_s):
        try:
            if isinstance(change, CreateTopic):
                try:
                    await admin.create_topic(change.topic, change.partitions, change.replication_factor,
                                             dict(change.configs))
                except KafkaError as exc:
                    # A retry after a lost answer finds the topic made by the first attempt;
                    # the wait below checks it has the file's partitions and configs.
                    if exc.code != ErrorCode.topic_already_exists:
                        raise
            elif isinstance(change, AddPartitions):
                await admin.create_partitions(change.topic, change.desired)
            elif isinstance(change, AlterConfigs):
                await admin.alter_topic_configs(change.topic, change.set_configs, [])
            elif isinstance(change, CreateUser):
                try:
                    password = resolve(change.password_reference, f"users.{change.user}")
                except ValueError as exc:  # a missing file or variable: named, the secret never shown
                    return Outcome(change, "failed", str(exc))
                failed = {u: r for u, r in (await admin.set_scram_password(change.user, password.encode())).items()
                          if r[0] != ErrorCode.none}
                if failed:
                    return Outcome(change, "failed", "; ".join(f"{m or error_name(c)}" for c, m in failed.values()))
            return Outcome(change, "done")
        except CLIENT_ERRORS as exc:
            return Outcome(change, "failed", str(exc))
    return Outcome(change, "failed", f"no answer within {timeout_s:g} s; the change may still take effect "
                                     "(run plan again)")


@dataclass(frozen=True)
class _Expectation:
    """What every broker must show of one topic once apply is done."""

    topic: str
    partitions: int | None
    """At least this many partitions, each with a leader (None: partitions were not touched)."""
    configs: Mapping[str, str]


def _expectations(outcomes: Sequence[Outcome]) -> list[_Expectation]:
    partitions: dict[str, int | None] = {}
    configs: dict[str, dict[str, str]] = {}
    for o in outcomes:
        c = o.change
        if o.status != "done" or isinstance(c, Problem | CreateUser):
            continue
        partitions.setdefault(c.topic, None)
        configs.setdefault(c.topic, {})
        if isinstance(c, CreateTopic):
            partitions[c.topic] = c.partitions
            configs[c.topic].update(c.configs)
        elif isinstance(c, AddPartitions):
            partitions[c.topic] = c.desired
        elif isinstance(c, AlterConfigs):
            configs[c.topic].update(c.set_configs)
    return [_Expectation(topic, partitions[topic], configs[topic]) for topic in partitions]


async def _lagging(admin: Admin, expected: Sequence[_Expectation], timeout_s: float) -> list[str]:
    """What some broker does not show yet (empty: every broker shows everything)."""
    meta = await admin.cluster.refresh(set())
    names = [e.topic for e in expected]
    missing: list[str] = []
    for node_id in sorted(meta.brokers):
        conn = await admin.cluster.connection(node_id)
        seen = await describe_topics(conn, names, timeout_s=timeout_s)
        for e in expected:
            t = seen.get(e.topic)
            if t is None or t.error_code != 0:
                missing.append(f"broker {node_id} does not list topic {e.topic} yet")
                continue
            leaders = [p.leader for p in t.partitions]
            if e.partitions is None:
                continue
            if len(leaders) < e.partitions or any(leader < 0 for leader in leaders):
                missing.append(f"broker {node_id} shows {sum(leader >= 0 for leader in leaders)} of "
                               f"{e.partitions} partitions of {e.topic} with a leader")
        for e in expected:
            if not e.configs:
                continue
            try:
                live = await describe_topic_configs(conn, e.topic, sorted(e.configs), timeout_s=timeout_s)
            except KafkaError:
                live = {}
            stale = [k for k, v in sorted(e.configs.items()) if not config_values_equal(v, live.get(k))]
            if stale:
                missing.append(f"broker {node_id} shows old values of {', '.join(stale)} for {e.topic}")
    return missing


async def _wait_visible(admin: Admin, expected: Sequence[_Expectation], timeout_s: float) -> tuple[float | None, str | None]:
    """Poll every broker until each shows the expected topics, partitions (with leaders) and
    configs, so that the next command, whichever broker it asks, sees them."""
    started = time.monotonic()
    missing = ["no broker answered"]
    poll = Backoff(POLL_FIRST_S, POLL_MAX_S, jitter_s=0)
    with trio.move_on_after(timeout_s):
        while True:
            try:
                missing = await _lagging(admin, expected, timeout_s)
            except CLIENT_ERRORS as exc:
                missing = [str(exc)]
            if not missing:
                return time.monotonic() - started, None
            await poll.sleep()
    return None, f"not visible on every broker within {timeout_s:g} s: " + "; ".join(missing[:5])


async def _apply_one(topology: Topology, spec: ClusterSpec, timeout_s: float) -> ClusterApply:
    topics = topology.topics_of(spec.name)
    observed: ObservedCluster | UnreachableCluster = _unreachable(spec, None, timeout_s)
    async with AsyncExitStack() as stack:
        with trio.move_on_after(timeout_s):
            try:
                admin = await stack.enter_async_context(
                    Admin(spec.bootstrap(), client_id="dcmirror-topology",
                          config={**spec.client, **_admin_settings(timeout_s)}))
                observed = await observe(admin, spec, topics)
            except CLIENT_ERRORS as exc:
                observed = _unreachable(spec, exc, timeout_s)
        result = ClusterApply(ClusterPlan(spec, observed, plan_cluster(topics, observed, spec.users)))
        if isinstance(observed, UnreachableCluster):
            result.outcomes = [Outcome(c, "refused") for c in result.plan.changes]
            return result
        # In plan order: per topic, creation or partitions before configs.
        for change in result.plan.changes:
            result.outcomes.append(await _execute(admin, change, timeout_s))
        expected = _expectations(result.outcomes)
        if expected:
            result.visible_after_s, result.wait_error = await _wait_visible(admin, expected, timeout_s)
        return result
    raise AssertionError("unreachable")


async def apply_topology(topology: Topology, clusters: Sequence[str] | None = None, *,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> list[ClusterApply]:
    """Make every selected cluster hold the file's topics: create, add partitions, set
    configs (never delete). Problems are refused, the rest applied; then wait (bounded)
    until every broker shows the result."""
    specs = selected_clusters(topology, clusters)
    return await _each(specs, lambda spec: _apply_one(topology, spec, timeout_s))


# ---- presenting what apply did --------------------------------------------------------------

def _outcome_line(o: Outcome) -> str:
    c = o.change
    if o.status == "done":
        return f"{c.symbol} {c.describe()} ... done"
    if o.status == "refused":
        return f"! {c.describe()}"
    return f"x {c.describe()} ... FAILED: {o.error}"


def format_apply(results: Sequence[ClusterApply], topology: Topology) -> str:
    """The text ``topology apply`` prints: what was read, what was done, the summary."""
    lines = [cluster_line(r.plan, len(topology.topics_of(r.plan.spec.name))) for r in results]
    lines.append("")
    outcomes = [o for r in results for o in r.outcomes]
    if not outcomes:
        lines.append(NO_CHANGES)
    for r in results:
        lines += [_outcome_line(o) for o in r.outcomes]
        if r.visible_after_s is not None:
            lines.append(f"  cluster {r.plan.spec.name}: every broker shows the changes "
                         f"(after {r.visible_after_s:.1f} s)")
        if r.wait_error is not None:
            lines.append(f"x cluster {r.plan.spec.name}: changes {r.wait_error}")
    done = [o.change for o in outcomes if o.status == "done"]
    created = sum(isinstance(c, CreateTopic) for c in done)
    failed = sum(o.status == "failed" for o in outcomes)
    refused = sum(o.status == "refused" for o in outcomes)
    lines += ["", f"Apply: {created} created, {len(done) - created} changed, {failed} failed, "
                  f"{refused} problems (not applied)."]
    return "\n".join(lines)


def apply_exit_code(results: Sequence[ClusterApply]) -> int:
    """0 when everything the file asks for holds now, else 1."""
    return 0 if all(r.ok for r in results) else 1
