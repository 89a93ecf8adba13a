"""The load ledger `dcmirror.loads` and load planning (sans-IO).

Every load is an append-only story in the ledger, one row per partition and step:

    planned    written before any data: the load id and each partition's [start, end)
    gap        (failOnDataLoss=false) offsets deleted before they were loaded, written
               with the plan
    committed  written after the load's data is in its tables: the rows it added

A *reload* is a load whose ranges are dead letters of schema ids the registry did not know
when they were loaded and knows now (their `planned` rows carry the note RELOAD_NOTE): the
same records read again from the topic, decoded into the table, exactly once like any load;
an offset a reload planned is never planned again (plan_reload).

A load commits topic by topic: a topic of a load is committed when its `committed` rows
exist (a topic that cannot load, e.g. a typed topic whose records name a schema id the
registry does not know, holds no other topic back). A topic of a load with `planned` rows
and no `committed` ones was interrupted or failed; the next run finishes it with the same
load id and the same ranges, and plans nothing new for that topic until then, so its data is
written exactly once (the data write is idempotent per load id, see spark_aggregate/load.py).
A partition's next offset is the highest end offset of its committed loads; partitions never
loaded start at their log start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from spark_aggregate.ranges import (
    DataLossError,
    Gap,
    OffsetRange,
    PartitionOffsets,
    data_loss_message,
)

PLANNED = "planned"
GAP = "gap"
COMMITTED = "committed"
STATUSES = (PLANNED, GAP, COMMITTED)
RELOAD_NOTE = "reload of dead letters"
RELOAD_OFFSETS_MAX = 100_000
"""Dead letters one reload takes at most (the rest: the next load)."""
TopicPartition = tuple[str, int]

LEDGER_COLUMNS = (
    ("load_id", "STRING"), ("topic", "STRING"), ("partition", "INT"), ("start_offset", "BIGINT"),
    ("end_offset", "BIGINT"), ("rows", "BIGINT"), ("status", "STRING"), ("planned_at", "TIMESTAMP"),
    ("finished_at", "TIMESTAMP"), ("note", "STRING"),
)


@dataclass(frozen=True)
class LedgerRow:
    load_id: str
    topic: str
    partition: int
    start_offset: int
    end_offset: int
    rows: int | None
    status: str
    planned_at_ms: int
    finished_at_ms: int | None = None
    note: str | None = None


@dataclass(frozen=True)
class LoadPlan:
    load_id: str
    ranges: tuple[OffsetRange, ...]
    """Non-empty ranges, sorted."""
    gaps: tuple[Gap, ...]
    planned_at_ms: int
    resumed: bool = False
    reload: bool = False
    """Its ranges are dead letters read again (plan_reload): planned with RELOAD_NOTE."""

    def topics(self) -> list[str]:
        return sorted({r.topic for r in self.ranges})

    def ranges_of(self, topic: str) -> list[OffsetRange]:
        return [r for r in self.ranges if r.topic == topic]

    @property
    def offsets(self) -> int:
        return sum(r.size for r in self.ranges)

    def planned_rows(self) -> list[LedgerRow]:
        note = RELOAD_NOTE if self.reload else None
        rows = [LedgerRow(self.load_id, r.topic, r.partition, r.start, r.end, None, PLANNED, self.planned_at_ms,
                          None, note) for r in self.ranges]
        rows += [LedgerRow(self.load_id, g.topic, g.partition, g.start, g.end, 0, GAP, self.planned_at_ms,
                           self.planned_at_ms, g.describe()) for g in self.gaps]
        return rows

    def all_topics(self) -> list[str]:
        """The topics of its ranges and of its gaps (a topic may have gaps alone)."""
        return sorted({r.topic for r in self.ranges} | {g.topic for g in self.gaps})

    def of_topics(self, topics: Iterable[str]) -> LoadPlan:
        """The same load narrowed to `topics`."""
        keep = set(topics)
        return LoadPlan(self.load_id, tuple(r for r in self.ranges if r.topic in keep),
                        tuple(g for g in self.gaps if g.topic in keep), self.planned_at_ms, self.resumed,
                        self.reload)

    def committed_rows(self, rows_by_partition: Mapping[TopicPartition, int], now_ms: int,
                       read_gaps: Iterable[Gap] = ()) -> list[LedgerRow]:
        """The commit mark of every topic of the plan (narrow it with of_topics to commit
        some); `read_gaps`: offsets retention deleted while the load read them
        (failOnDataLoss=false), recorded with the commit."""
        rows = [LedgerRow(self.load_id, r.topic, r.partition, r.start, r.end,
                          rows_by_partition.get((r.topic, r.partition), 0), COMMITTED, self.planned_at_ms, now_ms)
                for r in self.ranges]
        # A load of gaps alone still needs its commit mark.
        rows += [LedgerRow(self.load_id, g.topic, g.partition, g.start, g.end, 0, COMMITTED, self.planned_at_ms,
                           now_ms, "gap: " + g.describe()) for g in self.gaps]
        rows += [LedgerRow(self.load_id, g.topic, g.partition, g.start, g.end, 0, COMMITTED, self.planned_at_ms,
                           now_ms, "gap while reading: " + g.describe()) for g in read_gaps]
        return rows


class LedgerError(Exception):
    """The ledger and the cluster disagree in a way a load cannot fix by itself."""


def committed_topics(rows: Iterable[LedgerRow]) -> set[tuple[str, str]]:
    """(load id, topic) of every committed topic of a load."""
    return {(r.load_id, r.topic) for r in rows if r.status == COMMITTED}


def finished_load_ids(rows: Iterable[LedgerRow]) -> set[str]:
    """Loads every topic of which is committed."""
    rows = list(rows)
    done = committed_topics(rows)
    out = {r.load_id for r in rows}
    for r in rows:
        if r.status in (PLANNED, GAP) and (r.load_id, r.topic) not in done:
            out.discard(r.load_id)
    return out


def pending_topics(rows: Iterable[LedgerRow]) -> set[str]:
    """Topics with a planned range (or gap) some load has not committed yet."""
    rows = list(rows)
    done = committed_topics(rows)
    return {r.topic for r in rows if r.status in (PLANNED, GAP) and (r.load_id, r.topic) not in done}


def pending_plans(rows: Iterable[LedgerRow]) -> list[LoadPlan]:
    """The topics of loads that were planned and never committed, oldest load first, as
    they were planned (each plan holds only its uncommitted topics)."""
    rows = list(rows)
    done = committed_topics(rows)
    ranges: dict[str, list[OffsetRange]] = {}
    gaps: dict[str, list[Gap]] = {}
    planned_at: dict[str, int] = {}
    reloads = {r.load_id for r in rows if r.status == PLANNED and r.note == RELOAD_NOTE}
    for r in rows:
        if (r.load_id, r.topic) in done:
            continue
        if r.status == PLANNED:
            ranges.setdefault(r.load_id, []).append(OffsetRange(r.topic, r.partition, r.start_offset, r.end_offset))
        elif r.status == GAP:
            gaps.setdefault(r.load_id, []).append(Gap(r.topic, r.partition, r.start_offset, r.end_offset,
                                                      r.end_offset))
        else:
            continue
        planned_at[r.load_id] = r.planned_at_ms
    return [LoadPlan(load_id, tuple(sorted(ranges.get(load_id, []))), tuple(gaps.get(load_id, [])),
                     planned_at[load_id], resumed=True, reload=load_id in reloads)
            for load_id in sorted(planned_at, key=lambda i: (planned_at[i], i))]


def next_offsets(rows: Iterable[LedgerRow]) -> dict[TopicPartition, int]:
    """Per partition, the offset after the last one a committed load covered."""
    rows = list(rows)
    done = committed_topics(rows)
    out: dict[TopicPartition, int] = {}
    for r in rows:
        if (r.load_id, r.topic) in done and r.status in (COMMITTED, GAP):
            tp = (r.topic, r.partition)
            out[tp] = max(out.get(tp, r.end_offset), r.end_offset)
    return out


def limit_offsets(available: Mapping[TopicPartition, int], limit: int | None) -> dict[TopicPartition, int]:
    """How many offsets each partition may load when a load takes at most `limit`: shares
    proportional to what each has (rounded down), the rest handed out one by one in
    partition order, so the total is exactly min(limit, available)."""
    total = sum(available.values())
    if limit is None or total <= limit:
        return dict(available)
    take = {tp: n * limit // total for tp, n in available.items()}
    left = limit - sum(take.values())
    for tp in sorted(available):
        if left == 0:
            break
        if take[tp] < available[tp]:
            take[tp] += 1
            left -= 1
    return take


def plan_load(rows: Iterable[LedgerRow], offsets: Mapping[TopicPartition, PartitionOffsets], *, load_id: str,
              now_ms: int, fail_on_data_loss: bool, max_offsets: int | None = None) -> LoadPlan | None:
    """The next load: from each partition's next offset to its high watermark (at most
    `max_offsets` in all); None when there is nothing new.

    A next offset below the log start offset is data loss (DataLossError naming the
    partition and the gap, or with fail_on_data_loss=False a gap in the plan). A next
    offset above the high watermark means the partition lost records the warehouse
    already has (the topic was deleted and re-created, or an unclean leader election):
    a LedgerError either way.
    """
    rows = list(rows)
    loaded = next_offsets(rows)
    waiting = pending_topics(rows)  # their planned ranges come first (a new plan would overlap them)
    starts: dict[TopicPartition, int] = {}
    available: dict[TopicPartition, int] = {}
    gaps: list[Gap] = []
    for tp in sorted(offsets):
        if tp[0] in waiting:
            continue
        log = offsets[tp]
        start = loaded.get(tp, log.log_start)
        if start > log.high_watermark:
            raise LedgerError(
                f"{tp[0]}-{tp[1]}: the warehouse has loaded offsets up to {start - 1}, but the partition's high "
                f"watermark is {log.high_watermark}; the topic was deleted and re-created, or an unclean leader "
                "election lost records. Load it under another name, or remove its rows from dcmirror.loads and "
                "its table to load it again from the start")
        if start < log.log_start:
            gap = Gap(tp[0], tp[1], start, log.log_start, log.log_start)
            if fail_on_data_loss:
                raise DataLossError(data_loss_message(gap))
            gaps.append(gap)
            start = log.log_start
        starts[tp] = start
        available[tp] = log.high_watermark - start
    take = limit_offsets(available, max_offsets)
    ranges = tuple(OffsetRange(tp[0], tp[1], starts[tp], starts[tp] + n) for tp, n in sorted(take.items()) if n > 0)
    if not ranges and not gaps:
        return None
    return LoadPlan(load_id, ranges, tuple(gaps), now_ms)


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter whose schema id was unknown: where its record is, and the id."""

    topic: str
    partition: int
    offset: int
    schema_id: int
    context: str
    """The registry context the id is in (its source's)."""
    key: bool = False
    """The key's schema id was the unknown one (reason "key: ...")."""


def reloaded_offsets(rows: Iterable[LedgerRow]) -> set[tuple[str, int, int]]:
    """(topic, partition, offset) of every dead letter a reload planned (committed or not)."""
    out: set[tuple[str, int, int]] = set()
    for r in rows:
        if r.status == PLANNED and r.note == RELOAD_NOTE:
            out.update((r.topic, r.partition, o) for o in range(r.start_offset, r.end_offset))
    return out


def plan_reload(rows: Iterable[LedgerRow], dead: Iterable[DeadLetter], known: Callable[[DeadLetter], bool],
                log_starts: Mapping[TopicPartition, int], *, load_id: str, now_ms: int,
                max_offsets: int = RELOAD_OFFSETS_MAX) -> tuple[LoadPlan | None, list[DeadLetter]]:
    """The reload of the dead letters whose schema id the registry knows now (`known`), never
    planned before, whose records the topic still holds (each offset a range of its own, or
    runs of consecutive ones joined), and the dead letters that cannot be reloaded any more
    (their records deleted from the topic: their values stay in the dead-letter table). A
    topic with a load pending is left for later, as plan_load leaves it."""
    rows = list(rows)
    done = reloaded_offsets(rows)
    waiting = pending_topics(rows)
    offsets: dict[TopicPartition, set[int]] = {}
    gone: list[DeadLetter] = []
    verdicts: dict[tuple[str, int, bool], bool] = {}
    taken = 0
    for d in sorted(dead, key=lambda d: (d.topic, d.partition, d.offset)):
        if (d.topic, d.partition, d.offset) in done or d.topic in waiting or taken >= max_offsets:
            continue
        tp = (d.topic, d.partition)
        if tp not in log_starts:
            continue  # the topic is not loaded any more: left alone
        verdict = verdicts.get((d.context, d.schema_id, d.key))
        if verdict is None:
            verdict = verdicts[(d.context, d.schema_id, d.key)] = known(d)
        if not verdict:
            continue
        if d.offset < log_starts[tp]:
            gone.append(d)
            continue
        if d.offset not in offsets.setdefault(tp, set()):
            offsets[tp].add(d.offset)
            taken += 1
    ranges: list[OffsetRange] = []
    for (topic, partition), found in sorted(offsets.items()):
        run_start = prev = None
        for o in sorted(found):
            if prev is not None and o == prev + 1:
                prev = o
                continue
            if run_start is not None and prev is not None:
                ranges.append(OffsetRange(topic, partition, run_start, prev + 1))
            run_start = prev = o
        if run_start is not None and prev is not None:
            ranges.append(OffsetRange(topic, partition, run_start, prev + 1))
    plan = LoadPlan(load_id, tuple(sorted(ranges)), (), now_ms, reload=True) if ranges else None
    return plan, gone
