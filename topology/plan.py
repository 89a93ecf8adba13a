"""What ``dcmirror topology plan|apply`` would change: the topology file against what the
clusters report, as a list of changes (sans-IO).

The shell (``topology.apply``) reads each cluster into an :class:`ObservedCluster` (or an
:class:`UnreachableCluster`); :func:`plan` compares that with the file's ``[[topics]]`` and
returns :data:`Change` objects. Nothing here talks to a broker or reads a clock.

Only additions and config settings are planned: topics and configs the file does not
mention are never deleted, partitions are never removed (Kafka cannot), and a replication
factor is never changed here (that moves data: ``dcmirror reassign``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from topology.model import ClusterSpec, TopicSpec, Topology

__all__ = [
    "AddPartitions",
    "AlterConfigs",
    "Change",
    "ClusterPlan",
    "ConfigChange",
    "CreateTopic",
    "CreateUser",
    "ObservedCluster",
    "ObservedTopic",
    "Problem",
    "UnreachableCluster",
    "config_values_equal",
    "cluster_line",
    "format_plan",
    "plan",
    "plan_cluster",
    "plan_document",
    "plan_exit_code",
    "summary_counts",
    "summary_line",
]

# Problem kinds (stable names: they appear in `plan --json`).
SHRINK = "shrink"
REPLICATION_FACTOR = "replication-factor"
UNREACHABLE = "unreachable"
TOO_FEW_BROKERS = "too-few-brokers"
TOPIC_ERROR = "topic-error"
USERS_UNKNOWN = "users-unknown"

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


# ---- what the clusters report ---------------------------------------------------------------


@dataclass(frozen=True)
class ObservedTopic:
    name: str
    partitions: int
    replica_counts: tuple[int, ...]
    """Replicas of each partition, in partition order (all equal to the RF when healthy)."""
    configs: Mapping[str, str | None] = field(default_factory=dict, hash=False)
    """Effective values as DescribeConfigs reports them (None: sensitive, value hidden).
    May hold only the keys the file sets."""
    overrides: frozenset[str] = frozenset()
    """Keys set on the topic itself (the rest are broker or Kafka defaults)."""
    error: str | None = None
    """Why the topic cannot be planned (e.g. it is being deleted); None when it can."""

    @property
    def replication_factors(self) -> tuple[int, ...]:
        """The distinct replica counts of the partitions, smallest first."""
        return tuple(sorted(set(self.replica_counts)))


@dataclass(frozen=True)
class ObservedCluster:
    name: str
    bootstrap: str
    broker_ids: tuple[int, ...]
    """Brokers the cluster's metadata lists (registered and unfenced)."""
    topics: Mapping[str, ObservedTopic] = field(default_factory=dict, hash=False)
    """The topics that exist, by name (at least every topic the file declares that exists)."""
    users: frozenset[str] | None = None
    """SCRAM users that exist (None: not asked, or the cluster would not tell)."""
    users_error: str | None = None
    """Why the users could not be listed."""


@dataclass(frozen=True)
class UnreachableCluster:
    name: str
    bootstrap: str
    error: str


# ---- changes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateTopic:
    cluster: str
    topic: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)

    symbol = "+"
    action = "create"

    def describe(self) -> str:
        configs = "".join(f" {k}={v}" for k, v in sorted(self.configs.items()))
        return (f"create topic {self.cluster}/{self.topic} partitions={self.partitions} "
                f"rf={self.replication_factor}{configs}")

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "cluster": self.cluster, "topic": self.topic,
                "partitions": self.partitions, "replication_factor": self.replication_factor,
                "configs": dict(sorted(self.configs.items()))}


@dataclass(frozen=True)
class AddPartitions:
    cluster: str
    topic: str
    current: int
    desired: int

    symbol = "~"
    action = "add-partitions"

    def describe(self) -> str:
        return f"add partitions to {self.cluster}/{self.topic}: {self.current} -> {self.desired}"

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "cluster": self.cluster, "topic": self.topic,
                "from": self.current, "to": self.desired}


@dataclass(frozen=True)
class ConfigChange:
    key: str
    old: str | None
    """The live value (None: not reported by the cluster, or hidden as sensitive)."""
    new: str
    old_is_default: bool = False
    """The live value is a broker or Kafka default, not set on the topic."""

    def describe(self) -> str:
        old = "(unset)" if self.old is None else self.old + (" (default)" if self.old_is_default else "")
        return f"{self.key} {old} -> {self.new}"


@dataclass(frozen=True)
class AlterConfigs:
    cluster: str
    topic: str
    configs: tuple[ConfigChange, ...]

    symbol = "~"
    action = "alter-configs"

    @property
    def set_configs(self) -> dict[str, str]:
        """What an incremental AlterConfigs sets (only these keys)."""
        return {c.key: c.new for c in self.configs}

    def describe(self) -> str:
        return f"alter topic {self.cluster}/{self.topic} " + ", ".join(c.describe() for c in self.configs)

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "cluster": self.cluster, "topic": self.topic,
                "configs": {c.key: {"from": c.old, "to": c.new, "from_default": c.old_is_default}
                            for c in self.configs}}


@dataclass(frozen=True)
class CreateUser:
    """A SCRAM user of the file's `users` table the cluster does not have (it formed before
    the user was added); its password is read from the reference when applied."""

    cluster: str
    user: str
    password_reference: str = field(repr=False)

    symbol = "+"
    action = "create-user"

    def describe(self) -> str:
        return f"create SCRAM user {self.cluster}/{self.user} (SCRAM-SHA-256, SCRAM-SHA-512)"

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "cluster": self.cluster, "user": self.user}


@dataclass(frozen=True)
class Problem:
    """Something the file asks for that apply will not do; ``hint`` says what would."""

    kind: str
    cluster: str
    topic: str | None
    message: str
    hint: str = ""

    symbol = "!"
    action = "problem"

    def describe(self) -> str:
        return self.message + (f"; {self.hint}" if self.hint else "")

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "kind": self.kind, "cluster": self.cluster, "topic": self.topic,
                "message": self.message, "hint": self.hint}


Change = CreateTopic | AddPartitions | AlterConfigs | CreateUser | Problem


# ---- config values ------------------------------------------------------------------------------


def _number(value: str) -> Decimal | None:
    try:
        number = Decimal(value)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def config_values_equal(desired: str, live: str | None) -> bool:
    """Whether the file's value means what the cluster reports.

    Brokers report a parsed value: booleans as ``true``/``false``, numbers without signs or
    leading zeros (and Kafka doubles as ``0.5``), lists as given. So ``"TRUE"`` equals
    ``true`` (``"yes"``/``"1"`` too when the live value is a boolean), ``"007"`` equals
    ``7``, ``"0.50"`` equals ``0.5`` and ``"compact, delete"`` equals ``compact,delete``.
    """
    if live is None:
        return False
    want, have = desired.strip(), live.strip()
    if want == have:
        return True
    if have.lower() in ("true", "false"):
        word = want.lower()
        if word in _TRUE or word in _FALSE:
            return (word in _TRUE) == (have.lower() == "true")
        return False
    a, b = _number(want), _number(have)
    if a is not None and b is not None:
        return a == b
    if "," in want or "," in have:
        return [p.strip() for p in want.split(",")] == [p.strip() for p in have.split(",")]
    return False


# ---- planning ---------------------------------------------------------------------------------


def _rf_text(counts: tuple[int, ...]) -> str:
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"


def _plan_topic(spec: TopicSpec, observed: ObservedCluster) -> list[Change]:
    cluster, name = spec.cluster, spec.name
    where = f"{cluster}/{name}"
    live = observed.topics.get(name)
    if live is None:
        live_brokers = len(observed.broker_ids)
        if spec.replication_factor > live_brokers:
            return [Problem(TOO_FEW_BROKERS, cluster, name,
                            f"cannot create topic {where} with rf={spec.replication_factor}: cluster {cluster} "
                            f"has {live_brokers} live broker(s) ({', '.join(map(str, observed.broker_ids)) or 'none'})",
                            "start the missing brokers, then apply again")]
        return [CreateTopic(cluster, name, spec.partitions, spec.replication_factor, dict(spec.config))]
    if live.error is not None:
        return [Problem(TOPIC_ERROR, cluster, name, f"cannot plan topic {where}: {live.error}",
                        "run plan again once the topic is settled")]

    changes: list[Change] = []
    if spec.partitions > live.partitions:
        changes.append(AddPartitions(cluster, name, live.partitions, spec.partitions))
    elif spec.partitions < live.partitions:
        changes.append(Problem(SHRINK, cluster, name,
                               f"cannot shrink topic {where} from {live.partitions} to {spec.partitions} partitions",
                               f"Kafka cannot remove partitions: set partitions = {live.partitions} in the file, "
                               "or delete and recreate the topic (its records are lost)"))
    rfs = live.replication_factors
    if rfs and rfs != (spec.replication_factor,):
        broker_ids = ",".join(map(str, observed.broker_ids))
        changes.append(Problem(REPLICATION_FACTOR, cluster, name,
                               f"cannot change the replication factor of topic {where} from {_rf_text(rfs)} to "
                               f"{spec.replication_factor} here",
                               f"move replicas with `dcmirror reassign generate --topics {name} --brokers {broker_ids} "
                               f"--replication-factor {spec.replication_factor} --output moves.json --config FILE "
                               f"--cluster {cluster}`, then `dcmirror reassign execute --reassignment-json-file "
                               f"moves.json --config FILE --cluster {cluster}`"))
    configs = tuple(
        ConfigChange(key, live.configs.get(key), value,
                     old_is_default=key in live.configs and key not in live.overrides)
        for key, value in sorted(spec.config.items())
        if not config_values_equal(value, live.configs.get(key))
    )
    if configs:
        changes.append(AlterConfigs(cluster, name, configs))
    return changes


def plan_cluster(topics: Sequence[TopicSpec], observed: ObservedCluster | UnreachableCluster,
                 users: Mapping[str, str] | None = None) -> list[Change]:
    """The changes that make one cluster hold ``topics`` (the file's topics of that cluster)
    and ``users`` (its `users` table: name -> password reference)."""
    if isinstance(observed, UnreachableCluster):
        return [Problem(UNREACHABLE, observed.name, None,
                        f"cannot reach cluster {observed.name} at {observed.bootstrap}: {observed.error}",
                        "start its brokers or fix `brokers` in the file")]
    for spec in topics:
        assert spec.cluster == observed.name, (spec.cluster, observed.name)
    changes: list[Change] = [change for spec in topics for change in _plan_topic(spec, observed)]
    if users:
        if observed.users is None:
            changes.append(Problem(USERS_UNKNOWN, observed.name, None,
                                   f"cannot list the SCRAM users of cluster {observed.name}: "
                                   f"{observed.users_error or 'not asked'}",
                                   "give the cluster's `client` a principal allowed to DESCRIBE the cluster"))
        else:
            changes += [CreateUser(observed.name, u, ref) for u, ref in users.items() if u not in observed.users]
    return changes


def plan(topology: Topology, observed: Mapping[str, ObservedCluster | UnreachableCluster]) -> list[Change]:
    """Changes for every cluster in ``observed``, in file order: per topic, creation or
    partitions before configs; problems where they arise."""
    changes: list[Change] = []
    for name in topology.clusters:
        if name in observed:
            changes += plan_cluster(topology.topics_of(name), observed[name], topology.cluster(name).users)
    return changes


def summary_counts(changes: Sequence[Change]) -> tuple[int, int, int]:
    """(to create, to change, problems): one count per line of the plan."""
    create = sum(isinstance(c, CreateTopic | CreateUser) for c in changes)
    problems = sum(isinstance(c, Problem) for c in changes)
    return create, len(changes) - create - problems, problems


# ---- presenting a plan ------------------------------------------------------------------------

NO_CHANGES = "No changes. The clusters match the topology file."
EXIT_NO_CHANGES = 0
EXIT_PROBLEMS = 1
EXIT_CHANGES = 2  # as `terraform plan -detailed-exitcode`


@dataclass
class ClusterPlan:
    """One cluster: what was read of it and what it needs."""

    spec: ClusterSpec
    observed: ObservedCluster | UnreachableCluster
    changes: list[Change]


def cluster_line(p: ClusterPlan, topics: int) -> str:
    """``cluster east at HOST:PORT,...: brokers 1,2,3; 2 of 3 declared topics exist``"""
    where = f"cluster {p.spec.name} at {p.spec.bootstrap()}"
    if isinstance(p.observed, UnreachableCluster):
        return f"{where}: unreachable"
    brokers = ",".join(map(str, p.observed.broker_ids)) or "none"
    return f"{where}: brokers {brokers}; {len(p.observed.topics)} of {topics} declared topic(s) exist"


def summary_line(changes: Sequence[Change]) -> str:
    create, change, problems = summary_counts(changes)
    return f"Plan: {create} to create, {change} to change, {problems} problems."


def format_plan(plans: Sequence[ClusterPlan], topology: Topology) -> str:
    """The text ``topology plan`` prints: a line per cluster read, a line per change
    (``+`` create, ``~`` change, ``!`` cannot), and the summary line."""
    lines = [cluster_line(p, len(topology.topics_of(p.spec.name))) for p in plans]
    changes = [c for p in plans for c in p.changes]
    lines.append("")
    if changes:
        lines += [f"{c.symbol} {c.describe()}" for c in changes]
    else:
        lines.append(NO_CHANGES)
    lines += ["", summary_line(changes)]
    return "\n".join(lines)


def plan_document(plans: Sequence[ClusterPlan], topology: Topology) -> dict[str, Any]:
    """The JSON document ``topology plan --json`` prints."""
    clusters = []
    for p in plans:
        entry: dict[str, Any] = {"name": p.spec.name, "bootstrap": p.spec.bootstrap()}
        if isinstance(p.observed, UnreachableCluster):
            entry.update(reachable=False, error=p.observed.error, brokers=[], existing_topics=[])
        else:
            entry.update(reachable=True, error=None, brokers=list(p.observed.broker_ids),
                         existing_topics=sorted(p.observed.topics))
        clusters.append(entry)
    changes = [c for p in plans for c in p.changes]
    create, change, problems = summary_counts(changes)
    return {"file": str(topology.path) if topology.path else None, "clusters": clusters,
            "changes": [c.to_json() for c in changes],
            "summary": {"create": create, "change": change, "problems": problems},
            "exit_code": plan_exit_code(changes)}


def plan_exit_code(changes: Sequence[Change]) -> int:
    """1 with problems (they win), else 2 with changes, else 0."""
    if any(isinstance(c, Problem) for c in changes):
        return EXIT_PROBLEMS
    return EXIT_CHANGES if changes else EXIT_NO_CHANGES
