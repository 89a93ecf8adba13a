"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219) as a sans-IO core: Kafka's ClientQuotaManager.

A quota is a bound on a rate: bytes a client produces (`producer_byte_rate`), bytes it
fetches (`consumer_byte_rate`), or the share of a request handler's time its requests use
(`request_percentage`, 100 = one handler's whole time). Quotas are set per *entity* — a user
(the principal's name), a client id, or a user and client id — where a null name is the
entity's default (`<default>`). A connection's quota is the most specific one that is set,
in Kafka's order:

    /config/users/<user>/clients/<client-id>
    /config/users/<user>/clients/<default>
    /config/users/<user>
    /config/users/<default>/clients/<client-id>
    /config/users/<default>/clients/<default>
    /config/users/<default>
    /config/clients/<client-id>
    /config/clients/<default>

Usage is measured by Kafka's `Rate` over a `SampledTotal`: `quota.window.num` (11) samples of
`quota.window.size.seconds` (1 s). Every value is recorded first; if the rate is then above
the bound, the client is throttled for the time that brings the rate back to the bound if
nothing more came: X = (O - T) / T * W, O the observed rate, T the bound, W the window the
rate was measured over. Clients sharing a quota entity share its sensor (a user's quota is
shared by every client id of that user; a `<default>` client-id quota is per client id).

No I/O and no clock: every call takes `now_ms`. The broker's request router records and
mutes connections (cluster/broker/apis.py, server.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# ---- vocabulary ----------------------------------------------------------------------------

ENTITY_USER = "user"
ENTITY_CLIENT_ID = "client-id"
ENTITY_IP = "ip"
ENTITY_TYPES = (ENTITY_USER, ENTITY_CLIENT_ID, ENTITY_IP)

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# Quota type (Kafka's QuotaType, the label of the throttle-time metrics) → its config key.
QUOTA_KEYS = {"produce": PRODUCER_BYTE_RATE, "fetch": CONSUMER_BYTE_RATE, "request": REQUEST_PERCENTAGE}
# Kafka's key types: a LONG key takes integral values only.
LONG_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE})

# DescribeClientQuotas match types.
MATCH_EXACT = 0
MATCH_DEFAULT = 1
MATCH_SPECIFIED = 2

DEFAULT_WINDOW_NUM = 11  # quota.window.num
DEFAULT_WINDOW_SIZE_MS = 1000  # quota.window.size.seconds

# Bounds on what clients can make the cluster hold or the broker allocate.
MAX_ENTRIES_PER_REQUEST = 1000  # AlterClientQuotas entries in one request
MAX_OPS_PER_ENTRY = 16  # quota keys changed per entity in one request
MAX_ENTITY_NAME_CHARS = 1024  # user or client-id names in a quota entity
MAX_QUOTA_ENTITIES = 10_000  # entities with a quota in the cluster
MAX_FILTER_COMPONENTS = 8  # DescribeClientQuotas filter components
MAX_SENSORS = 10_000  # per quota type; idle ones are dropped first

# A quota entity: (entity type, name or None for the default) pairs sorted by type.
QuotaEntity = tuple[tuple[str, str | None], ...]


def entity_key(pairs: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    return tuple(sorted(pairs, key=lambda p: p[0]))


def entity_path(entity: QuotaEntity) -> str:
    """Kafka's spelling of an entity, as kafka-configs and its logs show it."""
    d = dict(entity)
    parts = []
    if ENTITY_USER in d:
        parts.append(f"users/{d[ENTITY_USER] if d[ENTITY_USER] is not None else '<default>'}")
    if ENTITY_CLIENT_ID in d:
        parts.append(f"clients/{d[ENTITY_CLIENT_ID] if d[ENTITY_CLIENT_ID] is not None else '<default>'}")
    if ENTITY_IP in d:
        parts.append(f"ips/{d[ENTITY_IP] if d[ENTITY_IP] is not None else '<default>'}")
    return "/config/" + "/".join(parts)


class QuotaRequestError(ValueError):
    """A request Kafka refuses: `code` is the Kafka error code (INVALID_REQUEST, ...)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


INVALID_REQUEST = 42
UNSUPPORTED_VERSION = 35


# ---- validation (AlterClientQuotas, Kafka's ClientQuotaControlManager) -----------------------


def validate_entity(pairs: list[tuple[str, str | None]]) -> QuotaEntity:
    """The entity of an alteration, or QuotaRequestError with Kafka's message."""
    if not pairs:
        raise QuotaRequestError(INVALID_REQUEST, "Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for entity_type, name in pairs:
        if entity_type in seen:
            raise QuotaRequestError(INVALID_REQUEST,
                                    f"Invalid empty client quota entity, duplicate entity entry {entity_type}")
        if entity_type not in ENTITY_TYPES:
            raise QuotaRequestError(INVALID_REQUEST, f"Unhandled client quota entity type: {entity_type}")
        if name is not None and not name:
            raise QuotaRequestError(INVALID_REQUEST, f"Empty {entity_type} not supported")
        if name is not None and len(name) > MAX_ENTITY_NAME_CHARS:
            raise QuotaRequestError(INVALID_REQUEST, f"{entity_type} name of {len(name)} characters is longer than "
                                                     f"the limit of {MAX_ENTITY_NAME_CHARS}")
        seen[entity_type] = name
    if ENTITY_IP in seen:
        if len(seen) > 1:
            raise QuotaRequestError(INVALID_REQUEST, "Invalid empty client quota entity")
        raise QuotaRequestError(INVALID_REQUEST, "ip quotas (connection_creation_rate) are not supported by "
                                                 "dcmirror brokers; set user or client-id quotas")
    return entity_key(seen.items())


def validate_value(key: str, value: float) -> None:
    """A quota key and value Kafka accepts for a user or client-id entity."""
    if key == CONTROLLER_MUTATION_RATE:
        raise QuotaRequestError(INVALID_REQUEST, "controller_mutation_rate (KIP-599) is not enforced by dcmirror "
                                                 "brokers, so it is not stored; use producer_byte_rate, "
                                                 "consumer_byte_rate or request_percentage")
    if key not in (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE):
        raise QuotaRequestError(INVALID_REQUEST, f"Invalid configuration key {key}")
    if key in LONG_KEYS:
        epsilon = 1e-6
        if not math.isfinite(value) or abs(float(int(value + epsilon)) - value) > epsilon:
            raise QuotaRequestError(INVALID_REQUEST, f"Configuration {key} must be a Long value")
    if not math.isfinite(value) or value <= 0:
        # Kafka stores 0 and negative bounds; a client under one would be throttled forever.
        raise QuotaRequestError(INVALID_REQUEST, f"Configuration {key} must be greater than 0, not {value}")


# ---- DescribeClientQuotas filters (Kafka's ClientQuotasImage.describe) -----------------------


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    exact: dict[str, str | None]  # type → name (None: the default entity)
    specified: frozenset[str]  # types that must be present, any name
    strict: bool

    def matches(self, entity: QuotaEntity) -> bool:
        d = dict(entity)
        if self.strict and len(d) != len(self.exact) + len(self.specified):
            return False
        for entity_type, name in self.exact.items():
            if entity_type not in d or d[entity_type] != name:
                return False
        return all(t in d for t in self.specified)


def parse_filter(components: list[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
    if len(components) > MAX_FILTER_COMPONENTS:
        raise QuotaRequestError(INVALID_REQUEST, f"{len(components)} filter components; at most "
                                                 f"{MAX_FILTER_COMPONENTS}")
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for entity_type, match_type, match in components:
        if not entity_type:
            raise QuotaRequestError(INVALID_REQUEST, "Invalid empty entity type.")
        if entity_type in exact or entity_type in specified:
            raise QuotaRequestError(INVALID_REQUEST,
                                    f"Entity type {entity_type} cannot appear more than once in the filter.")
        if entity_type not in ENTITY_TYPES:
            raise QuotaRequestError(UNSUPPORTED_VERSION, f"Unsupported entity type {entity_type}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaRequestError(INVALID_REQUEST,
                                        "Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[entity_type] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaRequestError(INVALID_REQUEST,
                                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[entity_type] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaRequestError(INVALID_REQUEST,
                                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
            specified.add(entity_type)
        else:  # (Kafka answers INVALID_REQUEST, as for any malformed filter)
            raise QuotaRequestError(INVALID_REQUEST, f"Unknown match type {match_type}")
    if (ENTITY_IP in exact or ENTITY_IP in specified) and (set(exact) | specified) - {ENTITY_IP}:
        raise QuotaRequestError(INVALID_REQUEST, "Invalid entity filter component combination. IP filter component "
                                                 "should not be used with user or clientId filter component.")
    return QuotaFilter(exact, frozenset(specified), strict)


# ---- measuring (Kafka's Rate over a SampledTotal) --------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaWindow:
    samples: int = DEFAULT_WINDOW_NUM
    size_ms: int = DEFAULT_WINDOW_SIZE_MS

    def __post_init__(self) -> None:
        if self.samples < 2:
            raise ValueError(f"quota.window.num must be at least 2, not {self.samples}")
        if self.size_ms < 1:
            raise ValueError(f"quota.window.size.seconds must be at least 1, not {self.size_ms / 1000}")


class _Sample:
    __slots__ = ("start_ms", "last_event_ms", "value")

    def __init__(self, now_ms: int) -> None:
        self.start_ms = self.last_event_ms = now_ms
        self.value = 0.0

    def reset(self, now_ms: int) -> None:
        self.start_ms = self.last_event_ms = now_ms
        self.value = 0.0


class SampledRate:
    """A rate per second over `samples` windows of `size_ms`, as Kafka's Rate over a
    SampledTotal measures it (one extra sample is kept: a sample that started before the
    measured span but had events inside it still counts)."""

    __slots__ = ("window", "_samples", "_current", "last_record_ms")

    def __init__(self, window: QuotaWindow) -> None:
        self.window = window
        self._samples: list[_Sample] = []
        self._current = 0
        self.last_record_ms = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._samples:
            self._samples.append(_Sample(now_ms))
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= self.window.size_ms:
            self._current = (self._current + 1) % (self.window.samples + 1)
            if self._current >= len(self._samples):
                sample = _Sample(now_ms)
                self._samples.append(sample)
            else:
                sample = self._samples[self._current]
                sample.reset(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms
        self.last_record_ms = now_ms

    def _purge(self, now_ms: int) -> None:
        expire_ms = self.window.samples * self.window.size_ms
        for s in self._samples:
            if now_ms - s.last_event_ms >= expire_ms:
                s.reset(now_ms)

    def window_ms(self, now_ms: int) -> int:
        """The span the rate is measured over: at least `samples - 1` whole windows."""
        self._purge(now_ms)
        oldest = min((s.start_ms for s in self._samples), default=now_ms)
        elapsed = now_ms - oldest
        full = elapsed // self.window.size_ms
        if full < self.window.samples - 1:
            elapsed += (self.window.samples - 1 - full) * self.window.size_ms
        return max(elapsed, 1)

    def total(self, now_ms: int) -> float:
        self._purge(now_ms)
        return sum(s.value for s in self._samples)

    def rate(self, now_ms: int) -> float:
        """Per second."""
        total = self.total(now_ms)
        return total / (self.window_ms(now_ms) / 1000)


def throttle_time_ms(observed: float, bound: float, window_ms: int) -> int:
    """Kafka's ClientQuotaManager.throttleTime: the delay X with O * W / (W + X) = T."""
    return round((observed - bound) / bound * window_ms)


# ---- one quota type --------------------------------------------------------------------------

_USER_CLIENT = 1
_USER = 2
_CLIENT = 4


@dataclass
class ThrottleStats:
    """Throttle time handed out, for /metrics (Kafka's throttle-time sensors, summed)."""

    throttled: int = 0
    throttle_time_ms: int = 0


class ClientQuotaManager:
    """One quota type (produce, fetch or request): its bounds by entity and its sensors."""

    def __init__(self, quota_type: str, window: QuotaWindow = QuotaWindow(), *,
                 max_throttle_time_ms: int | None = None, max_sensors: int = MAX_SENSORS) -> None:
        assert quota_type in QUOTA_KEYS, quota_type
        self.quota_type = quota_type
        self.key = QUOTA_KEYS[quota_type]
        self.window = window
        # ClientRequestQuotaManager caps a request-time throttle at one window; byte quotas are uncapped.
        self.max_throttle_time_ms = max_throttle_time_ms
        self.max_sensors = max_sensors
        self._bounds: dict[QuotaEntity, float] = {}
        self._enabled = 0
        self._sensors: dict[tuple[str, str], SampledRate] = {}
        self.stats = ThrottleStats()

    # ---- bounds --------------------------------------------------------------------------

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Take every entity's value of this type's key (all quotas of the cluster)."""
        self._bounds = {e: float(v[self.key]) for e, v in quotas.items() if self.key in v}
        enabled = 0
        for entity in self._bounds:
            types = {t for t, _ in entity}
            if types == {ENTITY_USER, ENTITY_CLIENT_ID}:
                enabled |= _USER_CLIENT
            elif types == {ENTITY_USER}:
                enabled |= _USER
            elif types == {ENTITY_CLIENT_ID}:
                enabled |= _CLIENT
        self._enabled = enabled

    @property
    def enabled(self) -> bool:
        return self._enabled != 0

    def quota_limit(self, user: str, client_id: str) -> float | None:
        """The bound that applies to (user, client id), in Kafka's order of precedence."""
        user_tag, client_tag = self.metric_tags(user, client_id)
        return self._limit_for_tags(user_tag, client_tag)

    def _limit_for_tags(self, user: str, client_id: str) -> float | None:
        if user and client_id:
            for u, c in ((user, client_id), (user, None), (None, client_id), (None, None)):
                v = self._bounds.get(entity_key([(ENTITY_USER, u), (ENTITY_CLIENT_ID, c)]))
                if v is not None:
                    return v
            return None
        if user:
            v = self._bounds.get(((ENTITY_USER, user),))
            return v if v is not None else self._bounds.get(((ENTITY_USER, None),))
        if client_id:
            v = self._bounds.get(((ENTITY_CLIENT_ID, client_id),))
            return v if v is not None else self._bounds.get(((ENTITY_CLIENT_ID, None),))
        return None

    def metric_tags(self, user: str, client_id: str) -> tuple[str, str]:
        """(user, client-id) of the sensor a connection's usage goes to: the level whose
        quota applies (Kafka's DefaultQuotaCallback.quotaMetricTags)."""
        enabled = self._enabled
        if enabled in (0, _CLIENT):
            return "", client_id
        if enabled == _USER:
            return user, ""
        if enabled == _USER_CLIENT:
            return user, client_id
        has = self._bounds.__contains__
        uc = ((ENTITY_CLIENT_ID, client_id), (ENTITY_USER, user))
        if has(uc) or has(((ENTITY_CLIENT_ID, None), (ENTITY_USER, user))):
            return user, client_id
        if has(((ENTITY_USER, user),)):
            return user, ""
        if has(((ENTITY_CLIENT_ID, client_id), (ENTITY_USER, None))) or has(((ENTITY_CLIENT_ID, None),
                                                                             (ENTITY_USER, None))):
            return user, client_id
        if has(((ENTITY_USER, None),)):
            return user, ""
        return "", client_id

    # ---- recording -------------------------------------------------------------------------

    def _sensor(self, tags: tuple[str, str], now_ms: int) -> SampledRate:
        sensor = self._sensors.get(tags)
        if sensor is None:
            if len(self._sensors) >= self.max_sensors:
                self._drop_sensors(now_ms)
            sensor = self._sensors[tags] = SampledRate(self.window)
        return sensor

    def _drop_sensors(self, now_ms: int) -> None:
        """Sensors idle for a whole window hold nothing; drop those, else the least recent."""
        idle_ms = self.window.samples * self.window.size_ms
        for tags in [t for t, s in self._sensors.items() if now_ms - s.last_record_ms >= idle_ms]:
            del self._sensors[tags]
        while len(self._sensors) >= self.max_sensors:
            del self._sensors[min(self._sensors, key=lambda t: self._sensors[t].last_record_ms)]

    def record(self, user: str, client_id: str, value: float, now_ms: int) -> int:
        """Record `value` (bytes, or request time as a percentage of a second) and answer
        the throttle time in ms (0: within the quota). Nothing is kept without quotas."""
        if not self._enabled:
            return 0
        tags = self.metric_tags(user, client_id)
        bound = self._limit_for_tags(*tags)
        sensor = self._sensor(tags, now_ms)
        sensor.record(value, now_ms)
        if bound is None:
            return 0
        observed = sensor.rate(now_ms)
        if observed <= bound:
            return 0
        throttle_ms = throttle_time_ms(observed, bound, sensor.window_ms(now_ms))
        if self.max_throttle_time_ms is not None:
            throttle_ms = min(throttle_ms, self.max_throttle_time_ms)
        return max(throttle_ms, 0)

    def unrecord(self, user: str, client_id: str, value: float, now_ms: int) -> None:
        """Take back a recorded value (a throttled fetch answers empty: nothing was sent)."""
        if self._enabled:
            self._sensor(self.metric_tags(user, client_id), now_ms).record(-value, now_ms)

    def max_value_in_window(self, user: str, client_id: str) -> float:
        """The most that can be recorded at once without certain throttling: bounds a
        fetch's max bytes (Kafka's getMaxValueInQuotaWindow)."""
        if not self._enabled:
            return math.inf
        bound = self.quota_limit(user, client_id)
        if bound is None:
            return math.inf
        return bound * (self.window.samples - 1) * self.window.size_ms / 1000

    def throttled(self, throttle_ms: int) -> None:
        if throttle_ms > 0:
            self.stats.throttled += 1
            self.stats.throttle_time_ms += throttle_ms


@dataclass
class ClientQuotas:
    """The broker's three quota managers, fed from the metadata image's quotas."""

    window: QuotaWindow = field(default_factory=QuotaWindow)
    produce: ClientQuotaManager = field(init=False)
    fetch: ClientQuotaManager = field(init=False)
    request: ClientQuotaManager = field(init=False)
    version: int = -1  # the image's quota version last taken
    _source: object = None  # and the image's quota map it came from (a snapshot load replaces it)

    def __post_init__(self) -> None:
        self.produce = ClientQuotaManager("produce", self.window)
        self.fetch = ClientQuotaManager("fetch", self.window)
        self.request = ClientQuotaManager("request", self.window, max_throttle_time_ms=self.window.size_ms)

    def managers(self) -> tuple[ClientQuotaManager, ...]:
        return (self.produce, self.fetch, self.request)

    def update(self, quotas: Mapping[QuotaEntity, Mapping[str, float]], version: int) -> None:
        """Take the image's quotas when they changed (cheap when they did not: every request asks)."""
        if version != self.version or quotas is not self._source:
            for m in self.managers():
                m.update(quotas)
            self.version, self._source = version, quotas
