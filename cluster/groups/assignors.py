"""Server-side partition assignors of KIP-848 consumer groups: `uniform` and `range`.

Kafka's `group.consumer.assignors`: the coordinator computes every member's target
assignment from the members' subscriptions and the subscribed topics' partition counts.
Sans-IO and deterministic (members and partitions are visited in sorted order), so every
coordinator that replays a group computes the same assignment.

- `uniform` (Kafka's UniformAssignor, the default): partitions spread so that no two members
  differ by more than one where their subscriptions allow it, and sticky — a partition
  stays with its current owner unless balance needs it elsewhere.
- `range` (Kafka's server-side RangeAssignor): per topic, the subscribed members in member
  id order get contiguous ranges, the first `partitions % members` one more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

TopicPartitions = dict[str, set[int]]
# member id → the topics it subscribes to (only topics that exist)
Subscriptions = Mapping[str, frozenset[str]]
# (subscriptions, topic → partition count, current target) → new target
Assignor = Callable[[Subscriptions, Mapping[str, int], Mapping[str, TopicPartitions]], dict[str, TopicPartitions]]

UNIFORM = "uniform"
RANGE = "range"


def _partitions(topics: Mapping[str, int], names: set[str]) -> list[tuple[str, int]]:
    return [(t, p) for t in sorted(names) for p in range(topics[t])]


def _as_target(owned: Mapping[str, list[tuple[str, int]] | set[tuple[str, int]]]) -> dict[str, TopicPartitions]:
    out: dict[str, TopicPartitions] = {}
    for member, tps in owned.items():
        by_topic: TopicPartitions = {}
        for t, p in tps:
            by_topic.setdefault(t, set()).add(p)
        out[member] = by_topic
    return out


def range_assignor(subscriptions: Subscriptions, topics: Mapping[str, int],
                   current: Mapping[str, TopicPartitions]) -> dict[str, TopicPartitions]:
    owned: dict[str, list[tuple[str, int]]] = {m: [] for m in subscriptions}
    for topic in sorted({t for s in subscriptions.values() for t in s if t in topics}):
        members = sorted(m for m, s in subscriptions.items() if topic in s)
        count = topics[topic]
        base, extra = divmod(count, len(members))
        start = 0
        for i, m in enumerate(members):
            n = base + (1 if i < extra else 0)
            owned[m].extend((topic, p) for p in range(start, start + n))
            start += n
    return _as_target(owned)


def uniform_assignor(subscriptions: Subscriptions, topics: Mapping[str, int],
                     current: Mapping[str, TopicPartitions]) -> dict[str, TopicPartitions]:
    members = sorted(subscriptions)
    if not members:
        return {}
    subs = {m: {t for t in subscriptions[m] if t in topics} for m in members}
    owned: dict[str, set[tuple[str, int]]] = {m: set() for m in members}
    taken: set[tuple[str, int]] = set()
    # Stickiness: what a member holds and may still hold stays with it.
    for m in members:
        for t, ps in sorted(current.get(m, {}).items()):
            if t not in subs[m]:
                continue
            for p in sorted(ps):
                if p < topics[t] and (t, p) not in taken:
                    owned[m].add((t, p))
                    taken.add((t, p))
    eligible: dict[tuple[str, int], list[str]] = {}
    for tp in _partitions(topics, set().union(*subs.values())):
        eligible[tp] = [m for m in members if tp[0] in subs[m]]
    homogeneous = all(subs[m] == subs[members[0]] for m in members)
    if homogeneous:
        # Quotas: every member floor(n/k), the first n%k (those holding most now) one more.
        base, extra = divmod(len(eligible), len(members))
        order = sorted(members, key=lambda m: (-len(owned[m]), m))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
        for m in members:
            surplus = sorted(owned[m])[quota[m]:]
            for tp in surplus:
                owned[m].discard(tp)
                taken.discard(tp)
        free = [tp for tp in eligible if tp not in taken]
        i = 0
        for m in sorted(members, key=lambda m: (len(owned[m]), m)):
            while len(owned[m]) < quota[m] and i < len(free):
                owned[m].add(free[i])
                i += 1
        return _as_target(owned)
    # Different subscriptions: the partitions with fewest candidates first, each to its
    # least loaded candidate; then moves from a member to one with two fewer, while any.
    for tp in sorted((tp for tp in eligible if tp not in taken), key=lambda tp: (len(eligible[tp]), tp)):
        m = min(eligible[tp], key=lambda c: (len(owned[c]), c))
        owned[m].add(tp)
    for _ in range(len(eligible) * len(members) + 1):
        moved = False
        for tp in sorted(eligible):
            holder = next(m for m in eligible[tp] if tp in owned[m])
            target = min(eligible[tp], key=lambda c: (len(owned[c]), c))
            if len(owned[target]) + 1 < len(owned[holder]):
                owned[holder].discard(tp)
                owned[target].add(tp)
                moved = True
        if not moved:
            break
    return _as_target(owned)


ASSIGNORS: dict[str, Assignor] = {UNIFORM: uniform_assignor, RANGE: range_assignor}
