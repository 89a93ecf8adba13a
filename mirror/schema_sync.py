"""Schemas follow a record-copying flow (issue 33; docs/design.md principle 10, "Schemas
travel with the data"): every schema the flow's topics use is copied from the source
cluster's registry into the target cluster's registry under a context per source (as
Confluent's Schema Linking does: east's `pageviews-value` is `:.east:pageviews-value` in the
aggregate), with its id and version (the context is in IMPORT mode), references first.
East's id 7 and west's id 7 are different schemas; each resolves in its own context.

- **Rounds** (config `schema.sync.ms`, default 5 s; in the worker holding the flow's first
  topic's partition 0, as mirror/topic_sync.py): the source's versions (live and soft
  deleted) against the target context's; new versions are copied, soft deletes followed,
  versions gone from the source (hard deletes) deleted in the target (soft, then permanent),
  and each copied subject's compatibility level follows the source subject's.
- **The gate**: a record whose key or value is framed (magic byte 0 + 4-byte schema id) with
  an id not yet in the target context is not written before its schema is there: the worker
  calls `SchemaSync.admit(records)` per chunk, which costs a set lookup per distinct 5-byte
  prefix of the chunk when every id is known, and otherwise copies the ids' versions (found
  by `/schemas/ids/{id}/versions` at the source) before returning. An id the source registry
  does not know is not a schema id (a payload that happens to start with 0): it passes and is
  counted.

Which source subjects a flow's topics use: config `schema.subject.name.strategy`,
TopicNameStrategy (`<topic>-key`, `<topic>-value`; the default), TopicRecordNameStrategy
(`<topic>-<record name>`) or RecordNameStrategy (subjects do not name topics: every subject of
the source's default context is copied).

Sans-IO core: `flow_subjects`, `plan` and `framed_ids` take what the registries answered and
return what to do; `SchemaSync` is the trio shell that asks both registries and applies.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.client.registry import (
    AsyncRegistryClient,
    RegistryClientError,
    SchemaEntry,
    context_subject,
)
from cluster.common.clock import SYSTEM_CLOCK, Clock
from topology.model import ClusterSpec, MirrorSpec, RegistrySpec

log = logging.getLogger("dcmirror.mirror.schema_sync")

DEFAULT_SYNC_MS = 5_000
DEFAULT_STRATEGY = "TopicNameStrategy"
UNKNOWN_IDS_MAX = 10_000  # ids the source does not know, remembered so they are not asked again
ERRORS_SHOWN_MAX = 5
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)
# Answers that mean "already done" when a deletion is followed a second time (another worker,
# a round that failed half way): not found, soft deleted already, not soft deleted first.
DELETE_DONE_CODES = frozenset({40401, 40402, 40404, 40406})


@dataclass(frozen=True)
class Version:
    """One version of a subject (subject unqualified, as the source names it)."""

    subject: str
    version: int
    schema_id: int
    schema_type: str
    text: str
    references: tuple[tuple[str, str, int], ...] = ()
    deleted: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.subject, self.version


def versions_from(live: Iterable[SchemaEntry], every: Iterable[SchemaEntry], context: str = ".") -> list[Version]:
    """Versions out of GET /schemas (live) and GET /schemas?deleted=true (all): those only in
    the second are soft deleted. `context` strips the subjects' `:.ctx:` prefix."""
    prefix = "" if context == "." else f":{context}:"
    live_keys = {(e.subject, e.version) for e in live}
    out = []
    for e in every:
        if prefix and not e.subject.startswith(prefix):
            continue
        if not prefix and e.subject.startswith(":."):
            continue  # another context of the source: not the flow's
        out.append(Version(e.subject.removeprefix(prefix), e.version, e.schema_id, e.schema_type, e.text,
                           e.references, deleted=(e.subject, e.version) not in live_keys))
    return out


def flow_subjects(subjects: Iterable[str], topics: Iterable[str], strategy: str = DEFAULT_STRATEGY) -> set[str]:
    """The source subjects that belong to the flow's topics under `strategy`."""
    subjects = set(subjects)
    if strategy == "RecordNameStrategy":
        return {s for s in subjects if not s.startswith(":.")}
    topics = set(topics)
    if strategy == "TopicRecordNameStrategy":
        return {s for s in subjects if any(s.startswith(f"{t}-") for t in topics)}
    return {s for s in subjects if any(s in (f"{t}-key", f"{t}-value") for t in topics)}


def with_references(chosen: Iterable[tuple[str, int]], source: Mapping[tuple[str, int], Version]) -> list[Version]:
    """`chosen` versions and every version they reference (transitively), referenced ones
    first (the order to register them in). References the source lacks are left out (the
    target then refuses the referrer, which is reported)."""
    out: list[Version] = []
    done: set[tuple[str, int]] = set()

    def visit(key: tuple[str, int], depth: int) -> None:
        if key in done or key not in source or depth > 100:
            return
        done.add(key)
        v = source[key]
        for _, subject, version in v.references:
            visit((subject, version), depth + 1)
        out.append(v)

    for key in sorted(chosen):
        visit(key, 0)
    return out


@dataclass(frozen=True)
class Register:
    version: Version


@dataclass(frozen=True)
class Delete:
    subject: str
    version: int
    permanent: bool


@dataclass(frozen=True)
class SetConfig:
    subject: str
    level: str | None
    """None: remove the subject's level (the source has none)."""


Action = Register | Delete | SetConfig


def plan(source: Sequence[Version], target: Sequence[Version], subjects: Iterable[str],
         source_configs: Mapping[str, str | None] | None = None,
         target_configs: Mapping[str, str | None] | None = None) -> list[Action]:
    """What makes the target context follow the source: the versions of `subjects` (with
    their references) registered in dependency order, then soft deletes the source made, then
    versions gone from the source deleted (soft, then permanent; referrers first), then the
    subject compatibility levels that differ. `source` holds the source's versions (live and
    soft deleted), `target` the context's, both with unqualified subjects."""
    by_key = {v.key: v for v in source}
    have = {v.key: v for v in target}
    wanted = {v.key for v in source if v.subject in set(subjects)}
    actions: list[Action] = []
    order = with_references(wanted, by_key)
    registered = {v.key for v in order if v.key not in have}
    actions.extend(Register(v) for v in order if v.key in registered)
    rank = {v.key: i for i, v in enumerate(with_references(list(by_key) + list(have), {**have, **by_key}))}
    # Deletions run referrers first (the reverse of the registration order).
    for v in sorted((x for x in source if x.deleted), key=lambda x: -rank.get(x.key, 0)):
        t = have.get(v.key)
        if (t is not None and not t.deleted) or v.key in registered:
            actions.append(Delete(v.subject, v.version, permanent=False))
    gone = [t for t in target if t.key not in by_key]
    for t in sorted(gone, key=lambda x: -rank.get(x.key, 0)):
        if not t.deleted:
            actions.append(Delete(t.subject, t.version, permanent=False))
    for t in sorted(gone, key=lambda x: -rank.get(x.key, 0)):
        actions.append(Delete(t.subject, t.version, permanent=True))
    if source_configs is not None:
        present = {v.subject for v in target} | {v.version.subject for v in actions if isinstance(v, Register)}
        current = target_configs or {}
        for subject in sorted(present & set(source_configs)):
            level = source_configs[subject]
            if current.get(subject) != level:
                actions.append(SetConfig(subject, level))
    return actions


def framed_ids(records: Iterable[Any]) -> set[int]:
    """The schema ids of the records' framed keys and values (magic byte 0, then the id in 4
    big-endian bytes): one 5-byte prefix per distinct id, decoded once. On the hot path (once
    per chunk): one loop, and a prefix equal to the previous record's is not added again
    (consecutive records mostly carry one id); ~0.5 us per record on a busy 2-core machine."""
    prefixes: set[bytes] = set()
    add = prefixes.add
    last_value = last_key = b""
    for r in records:
        v = r.value
        if v and not v[0]:
            p = v[:5]
            if p != last_value:
                add(p)
                last_value = p
        k = r.key
        if k and not k[0]:
            p = k[:5]
            if p != last_key:
                add(p)
                last_key = p
    return {int.from_bytes(p[1:], "big") for p in prefixes if len(p) == 5}


def missing_ids(records: Iterable[Any], known: set[int] | frozenset[int]) -> set[int]:
    return framed_ids(records) - known


@dataclass
class SyncStats:
    schemas_copied: int = 0
    deletes_followed: int = 0
    configs_followed: int = 0
    rounds: int = 0
    errors: int = 0
    ids_unknown_at_source: int = 0
    records_waited_chunks: int = 0
    waited_ms: int = 0
    last_sync_ms: int | None = None
    last_errors: list[str] = field(default_factory=list)


class SchemaSync:
    """The trio shell of one flow's schema sync: rounds every `sync_ms`, and the gate
    (`admit`) the worker calls per chunk. Writes to the target go through one lock, so the
    gate and a round never race each other inside one worker; across workers every write is
    idempotent (the same version registered again answers its id)."""

    def __init__(self, source: AsyncRegistryClient, target: AsyncRegistryClient, context: str, *,
                 flow_name: str = "", strategy: str = DEFAULT_STRATEGY, sync_ms: int = DEFAULT_SYNC_MS,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self.target = target
        self.context = context
        self.flow_name = flow_name
        self.strategy = strategy
        self.sync_ms = sync_ms
        self.clock = clock
        self.topics: Callable[[], Iterable[str]] = lambda: ()
        """The flow's source topics now (the worker's mapping)."""
        self.leads: Callable[[], bool] = lambda: True
        """Whether this worker runs the rounds (one worker of a flow does; every one gates)."""
        self.known_ids: set[int] = set()
        self.unknown_ids: set[int] = set()
        self.stats = SyncStats()
        self._lock = trio.Lock()
        self._import_mode_set = False
        self._round_wanted = trio.Event()

    # ---- the gate ------------------------------------------------------------------------

    async def admit(self, records: Sequence[Any]) -> None:
        """Return once every schema id the records carry is in the target context (or is not
        a schema id of the source): retried with backoff, so the records wait, never pass
        without their schema."""
        missing = framed_ids(records) - self.known_ids - self.unknown_ids
        if not missing:
            return
        began = self.clock.now_ms()
        self.stats.records_waited_chunks += 1
        attempt = 0
        while missing:
            try:
                await self.ensure_ids(missing)
            except RegistryClientError as exc:
                self._error(f"copying schema ids {sorted(missing)[:10]}: {exc}")
                await trio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1
            missing -= self.known_ids | self.unknown_ids
            if missing:
                await trio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
        self.stats.waited_ms += self.clock.now_ms() - began

    async def ensure_ids(self, ids: Iterable[int]) -> None:
        """Copy every version holding each id (and what they reference) into the target."""
        async with self._lock:
            await self._ensure_import_mode()
            source_versions: dict[tuple[str, int], Version] = {}
            chosen: set[tuple[str, int]] = set()
            for schema_id in sorted(ids):
                if schema_id in self.known_ids:
                    continue
                try:
                    pairs = await self.source.id_versions(schema_id, deleted=True)
                except RegistryClientError as exc:
                    if exc.error_code == 40403:
                        self._unknown(schema_id)
                        continue
                    raise
                pairs = [(s, v) for s, v in pairs if not s.startswith(":.")]
                if not pairs:
                    self._unknown(schema_id)
                    continue
                for subject, number in pairs:
                    await self._fetch_closure(subject, number, source_versions)
                    chosen.add((subject, number))
            have = await self._target_versions()
            for v in with_references(chosen, source_versions):
                if v.key not in have:
                    await self._register(v)
            self.known_ids |= {v.schema_id for v in source_versions.values() if v.key in chosen}

    async def _fetch_closure(self, subject: str, number: int, into: dict[tuple[str, int], Version]) -> None:
        if (subject, number) in into:
            return
        e = await self.source.version(subject, number, deleted=True)
        into[(subject, number)] = Version(e.subject, e.version, e.schema_id, e.schema_type, e.text, e.references)
        for _, ref_subject, ref_version in e.references:
            await self._fetch_closure(ref_subject, ref_version, into)

    def _unknown(self, schema_id: int) -> None:
        if len(self.unknown_ids) < UNKNOWN_IDS_MAX:
            self.unknown_ids.add(schema_id)
        self.stats.ids_unknown_at_source += 1
        log.info("flow %s: schema id %d is not in the source registry; records carrying it pass as they are",
                 self.flow_name, schema_id)

    # ---- rounds --------------------------------------------------------------------------

    async def run(self) -> None:
        """Rounds until cancelled; a failed round is reported and the next one comes as usual."""
        while True:
            try:
                if self.leads():
                    await self.sync_round()
            except RegistryClientError as exc:
                self._error(f"round: {exc}")
            with trio.move_on_after(self.sync_ms / 1000):
                await self._round_wanted.wait()
            self._round_wanted = trio.Event()

    def wake(self) -> None:
        """Run a round now (the flow's topics changed)."""
        self._round_wanted.set()

    async def sync_round(self) -> list[Action]:
        async with self._lock:
            await self._ensure_import_mode()
            every = await self.source.schemas(deleted=True)
            live = await self.source.schemas()
            source = versions_from(live, every)
            target = await self._target_list()
            subjects = flow_subjects({v.subject for v in source}, self.topics(), self.strategy)
            have_subjects = {v.subject for v in target} | subjects
            source_configs = {s: await self._config(self.source, s) for s in sorted(have_subjects)
                              if any(v.subject == s for v in source)}
            target_configs = {s: await self._config(self.target, context_subject(self.context, s))
                              for s in sorted({v.subject for v in target})}
            actions = plan(source, target, subjects, source_configs, target_configs)
            for action in actions:
                await self._apply(action)
            self.known_ids = {v.schema_id for v in target} | {a.version.schema_id for a in actions
                                                              if isinstance(a, Register)} | self.known_ids
            self.stats.rounds += 1
            self.stats.last_sync_ms = self.clock.now_ms()
            return actions

    async def _config(self, client: AsyncRegistryClient, subject: str) -> str | None:
        try:
            return await client.config(subject)
        except RegistryClientError as exc:
            if exc.error_code in (40401, 40408):
                return None
            raise

    async def _apply(self, action: Action) -> None:
        if isinstance(action, Register):
            await self._register(action.version)
        elif isinstance(action, Delete):
            subject = context_subject(self.context, action.subject)
            try:
                await self.target.delete_version(subject, action.version, permanent=action.permanent)
            except RegistryClientError as exc:
                if exc.error_code not in DELETE_DONE_CODES:
                    raise
            self.stats.deletes_followed += 1
            log.info("flow %s: followed a %s delete of %s version %d", self.flow_name,
                     "hard" if action.permanent else "soft", subject, action.version)
        else:
            subject = context_subject(self.context, action.subject)
            if action.level is None:
                try:
                    await self.target.delete_config(subject)
                except RegistryClientError as exc:
                    if exc.error_code not in (40401, 40408):
                        raise
            else:
                await self.target.set_config(action.level, subject)
            self.stats.configs_followed += 1

    async def _register(self, v: Version) -> None:
        subject = context_subject(self.context, v.subject)
        got = await self.target.register(subject, v.text, v.schema_type, v.references,
                                         schema_id=v.schema_id, version=v.version)
        if got != v.schema_id:
            raise RegistryClientError(409, 42207, f"{subject} version {v.version}: the target answered id {got}, "
                                                  f"the source's is {v.schema_id}")
        self.stats.schemas_copied += 1
        self.known_ids.add(v.schema_id)
        log.info("flow %s: copied %s version %d (id %d)", self.flow_name, subject, v.version, v.schema_id)

    async def _ensure_import_mode(self) -> None:
        if not self._import_mode_set:
            scope = f":{self.context}:"
            if await self.target.mode(scope) != "IMPORT":
                await self.target.set_mode("IMPORT", scope, force=True)
            self._import_mode_set = True

    async def _target_list(self) -> list[Version]:
        prefix = f":{self.context}:"
        every = await self.target.schemas(deleted=True, prefix=prefix)
        live = await self.target.schemas(prefix=prefix)
        return versions_from(live, every, self.context)

    async def _target_versions(self) -> dict[tuple[str, int], Version]:
        return {v.key: v for v in await self._target_list()}

    def _error(self, text: str) -> None:
        self.stats.errors += 1
        self.stats.last_errors = [*self.stats.last_errors, text][-ERRORS_SHOWN_MAX:]
        log.warning("flow %s: schema sync: %s", self.flow_name, text)

    # ---- status --------------------------------------------------------------------------

    def prometheus(self, labels: dict[str, str]) -> dict[str, tuple[str, str, list[tuple[dict[str, str], float]]]]:
        s = self.stats
        one = lambda value: [(labels | {"context": self.context}, float(value))]  # noqa: E731
        out = {
            "dcmirror_mirror_schemas_copied_total": ("counter", "Schema versions copied into the target "
                                                     "registry's context", one(s.schemas_copied)),
            "dcmirror_mirror_schema_deletes_followed_total": ("counter", "Source soft and hard deletes followed "
                                                              "in the target context", one(s.deletes_followed)),
            "dcmirror_mirror_schema_sync_errors_total": ("counter", "Failed schema sync requests",
                                                         one(s.errors)),
            "dcmirror_mirror_schema_wait_seconds_total": ("counter", "Time records waited for their schema to be "
                                                          "copied", one(s.waited_ms / 1000)),
        }
        if s.last_sync_ms is not None:
            out["dcmirror_mirror_schema_last_sync_timestamp_seconds"] = (
                "gauge", "When the last schema sync round ended", one(s.last_sync_ms / 1000))
        return out

    def status(self) -> dict[str, Any]:
        s = self.stats
        now_ms = self.clock.now_ms()
        return {"context": self.context, "strategy": self.strategy, "source": self.source.url,
                "target": self.target.url, "schemas_copied": s.schemas_copied,
                "deletes_followed": s.deletes_followed, "configs_followed": s.configs_followed,
                "rounds": s.rounds, "errors": s.errors, "last_errors": s.last_errors,
                "last_sync_ms": s.last_sync_ms,
                "last_sync_age_s": None if s.last_sync_ms is None else (now_ms - s.last_sync_ms) / 1000,
                "known_ids": len(self.known_ids), "ids_unknown_at_source": s.ids_unknown_at_source,
                "chunks_waited": s.records_waited_chunks, "waited_ms": s.waited_ms}


def _client(spec: RegistrySpec, basic_user_info: str | None) -> AsyncRegistryClient:
    # A registry serving HTTPS with its own keystore (self-signed, as the lab's): trust that.
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=spec.keystore) if spec.keystore else True
    return AsyncRegistryClient.for_spec(spec, basic_user_info=basic_user_info, verify=verify)


@asynccontextmanager
async def open_schema_sync(flow: MirrorSpec, source: ClusterSpec, target: ClusterSpec, *,
                           clock: Clock = SYSTEM_CLOCK) -> AsyncIterator[SchemaSync | None]:
    """The flow's SchemaSync with its two registry clients (None: the flow copies no schemas)."""
    if not flow.schemas or source.registry is None or target.registry is None:
        yield None
        return
    async with _client(source.registry, flow.config.get("schema.source.basic.auth.user.info")) as src, \
            _client(target.registry, flow.config.get("schema.target.basic.auth.user.info")) as tgt:
        yield SchemaSync(src, tgt, flow.schema_context, flow_name=flow.name,
                         strategy=flow.config.get("schema.subject.name.strategy", DEFAULT_STRATEGY),
                         sync_ms=int(flow.config.get("schema.sync.ms", DEFAULT_SYNC_MS)), clock=clock)
