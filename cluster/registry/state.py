"""The schema registry's state machine (sans-IO): subjects, versions, schema ids,
compatibility configs and modes, per context, as Confluent Schema Registry keeps them.

Every change is a record of Confluent's `_schemas` topic (key and value JSON as its
KafkaStore writes them). A write is planned in two steps: a `plan_*` method checks the
request against the current state and returns the records to append plus the answer;
the shell (store.py) appends them to the topic and waits until `apply` has seen them come
back. `apply` is the only code that changes the state, for records written here and for
records read back at start, so the state is always what the topic says.

Contexts: a subject `:.east:orders-value` lives in context `.east`; an unqualified subject
lives in the default context `.`. Schema ids are per context (id 7 in `.east` and id 7 in
`.` are different schemas), as Confluent's are.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cluster.registry import formats
from cluster.registry.formats import (
    COMPATIBILITY_LEVELS,
    SCHEMA_TYPES,
    InvalidSchema,
    ParsedSchema,
    Reference,
)

DEFAULT_CONTEXT = "."
DEFAULT_COMPATIBILITY = "BACKWARD"
DEFAULT_MODE = "READWRITE"
MODES = ("READWRITE", "READONLY", "READONLY_OVERRIDE", "IMPORT")
VERSION_MAX = 2**31 - 1
SCHEMA_BYTES_MAX = 1024 * 1024
"""Largest schema text accepted (Confluent Cloud's default limit is 1 MB)."""
SUBJECT_BYTES_MAX = 4096
REFERENCES_MAX = 1000
FENCED_OFFSETS_KEPT = 4096
"""Offsets of fenced records a state remembers (a stale primary asks about its own writes)."""
"""References of one schema, transitively."""

Record = tuple[bytes, bytes | None]
"""One `_schemas` record: key JSON, value JSON (None = tombstone)."""

Parser = Callable[..., ParsedSchema]
Checker = Callable[[str, ParsedSchema, Sequence[ParsedSchema]], list[str]]


class RegistryError(Exception):
    """An answer other than success, as Confluent gives it: HTTP status, error code and
    message ({"error_code": N, "message": "..."} on the wire)."""

    def __init__(self, http_status: int, error_code: int, message: str) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.error_code = error_code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error_code": self.error_code, "message": self.message}


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(version: int | str) -> RegistryError:
    return RegistryError(404, 40402, f"Version {version} not found.")


def schema_not_found(schema_id: int | None = None) -> RegistryError:
    return RegistryError(404, 40403, "Schema not found" if schema_id is None else f"Schema {schema_id} not found")


def invalid_version(version: object) -> RegistryError:
    return RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id. "
                                     "Allowed values are between [1, 2^31-1] and the string \"latest\"")


def invalid_schema(detail: str) -> RegistryError:
    return RegistryError(422, 42201, detail if detail.startswith("Invalid schema") else f"Invalid schema {detail}")


def invalid_compatibility() -> RegistryError:
    return RegistryError(422, 42203, "Invalid compatibility level. Valid values are none, backward, forward, "
                                     "full, backward_transitive, forward_transitive, and full_transitive")


def invalid_mode(mode: object) -> RegistryError:
    return RegistryError(422, 42204, f"Invalid mode {mode}. Valid values are READWRITE, READONLY, "
                                     "READONLY_OVERRIDE and IMPORT")


def not_permitted(message: str = "Operation not permitted") -> RegistryError:
    return RegistryError(422, 42205, message)


def store_error(message: str = "Error in the backend data store") -> RegistryError:
    return RegistryError(500, 50001, message)


def split_context(subject: str) -> tuple[str, str]:
    """`:.ctx:name` -> (".ctx", "name"); `name` -> (".", "name")."""
    if subject.startswith(":."):
        end = subject.find(":", 2)
        if end > 0:
            return subject[1:end], subject[end + 1:]
    return DEFAULT_CONTEXT, subject


def qualify(context: str, name: str) -> str:
    return name if context == DEFAULT_CONTEXT else f":{context}:{name}"


_CONTEXT_RE = re.compile(r"^\.[^:]*$")


@dataclass(frozen=True)
class SchemaVersion:
    """One version of a subject (a SCHEMA record): `subject` is qualified (`:.ctx:s`)."""

    subject: str
    version: int
    schema_id: int
    schema_type: str
    text: str
    references: tuple[Reference, ...] = ()
    deleted: bool = False

    @property
    def context(self) -> str:
        return split_context(self.subject)[0]

    def body(self, *, with_subject: bool = True) -> dict[str, Any]:
        """The JSON of GET /subjects/{s}/versions/{v}: schemaType only when not AVRO,
        references only when there are some (as Confluent answers)."""
        out: dict[str, Any] = {}
        if with_subject:
            out.update(subject=self.subject, version=self.version, id=self.schema_id)
        if self.schema_type != formats.AVRO:
            out["schemaType"] = self.schema_type
        if self.references:
            out["references"] = references_json(self.references)
        out["schema"] = self.text
        return out


def references_json(references: Iterable[Reference]) -> list[dict[str, Any]]:
    return [{"name": r.name, "subject": r.subject, "version": r.version} for r in references]


@dataclass
class _Subject:
    versions: dict[int, SchemaVersion] = field(default_factory=dict)

    def live(self) -> list[SchemaVersion]:
        return [v for _, v in sorted(self.versions.items()) if not v.deleted]

    def all(self) -> list[SchemaVersion]:
        return [v for _, v in sorted(self.versions.items())]


# -- record encoding (Confluent's KafkaStore JSON) ---------------------------------------

def _dumps(obj: Mapping[str, Any]) -> bytes:
    # One fixed serialization per key, so compaction sees the same bytes for the same key.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def schema_key(subject: str, version: int) -> bytes:
    return _dumps({"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1})


def config_key(subject: str | None) -> bytes:
    return _dumps({"keytype": "CONFIG", "subject": subject, "magic": 0})


def mode_key(subject: str | None) -> bytes:
    return _dumps({"keytype": "MODE", "subject": subject, "magic": 0})


def delete_subject_key(subject: str) -> bytes:
    return _dumps({"keytype": "DELETE_SUBJECT", "subject": subject, "magic": 0})


def max_id_key(context: str) -> bytes:
    """A NOOP record (Confluent's readers skip NOOP keys) that keeps a context's largest id
    once the records that held it are compacted away: ids are never reused."""
    return _dumps({"keytype": "NOOP", "context": context, "magic": 0})


PRIMARY_HEADER = "dcmirror.registry.generation"
"""The header that carries, on every record a primary writes, the election generation it
was elected in (Confluent's readers ignore headers)."""


def primary_key(generation: int) -> bytes:
    """A NOOP record (skipped by Confluent's readers) a newly elected primary writes before its
    first write: records of older generations after it are fenced. One key per generation, so
    compaction never removes a marker that fences records after it."""
    return _dumps({"keytype": "NOOP", "primary_generation": generation, "magic": 0})


def primary_record(generation: int, url: str) -> Record:
    return primary_key(generation), _dumps({"primary_generation": generation, "url": url})


def generation_of(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    """The PRIMARY_HEADER generation of a record, None if it has none (or not a number)."""
    for name, value in headers:
        if name == PRIMARY_HEADER and value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def schema_record(v: SchemaVersion) -> Record:
    value: dict[str, Any] = {"subject": v.subject, "version": v.version, "id": v.schema_id}
    if v.schema_type != formats.AVRO:
        value["schemaType"] = v.schema_type
    value["schema"] = v.text
    value["references"] = references_json(v.references)
    value["deleted"] = v.deleted
    return schema_key(v.subject, v.version), _dumps(value)


def _scope_subject(context: str, subject: str | None) -> str | None:
    """The key subject of a config/mode: None = the default context's global one; a
    context's global one is `:.ctx:` (Confluent's form)."""
    if subject is None:
        return None if context == DEFAULT_CONTEXT else f":{context}:"
    return subject


# -- the state ----------------------------------------------------------------------------

class RegistryState:
    """The whole registry: rebuilt by `apply`ing `_schemas` records in order."""

    def __init__(self, *, parse: Parser | None = None, check: Checker | None = None,
                 schema_bytes_max: int = SCHEMA_BYTES_MAX) -> None:
        self._parse: Parser = parse if parse is not None else formats.parse
        self._check: Checker = check if check is not None else formats.check
        self.schema_bytes_max = schema_bytes_max
        self._subjects: dict[str, _Subject] = {}
        self._configs: dict[str | None, str] = {}          # key subject -> compatibility level
        self._modes: dict[str | None, str] = {}            # key subject -> mode
        self._max_id: dict[str, int] = {}                  # context -> largest id ever seen
        self._holders: dict[tuple[str, int], set[tuple[str, int]]] = {}  # (ctx, id) -> {(subject, version)}
        self._parsed: dict[tuple[str, int, bool], ParsedSchema] = {}
        self.records_applied = 0
        self.records_skipped = 0
        self.records_fenced = 0
        self.applied_offset = -1
        self.primary_generation = -1
        """The newest primary's generation the log has announced (primary_record)."""
        self._fenced_offsets: collections.deque[int] = collections.deque(maxlen=FENCED_OFFSETS_KEPT)

    # -- applying records ------------------------------------------------------------------

    def apply(self, key: bytes | None, value: bytes | None, offset: int | None = None,
              generation: int | None = None) -> None:
        """Apply one `_schemas` record. Records this registry does not understand (other
        key types, bad JSON) are counted and skipped, as Confluent skips them. A record written
        by a primary of an older `generation` than the newest the log has announced before it
        is fenced: skipped, by every instance alike (the log's order decides, so a replay
        decides the same)."""
        if offset is not None:
            self.applied_offset = max(self.applied_offset, offset)
        if generation is not None and generation < self.primary_generation:
            self.records_fenced += 1
            if offset is not None:
                self._fenced_offsets.append(offset)
            return
        try:
            k = json.loads(key) if key else None
            v = json.loads(value) if value is not None else None
            if not isinstance(k, dict):
                raise ValueError("key is not an object")
            keytype = k.get("keytype")
            if keytype == "SCHEMA":
                self._apply_schema(str(k["subject"]), int(k["version"]), v)
            elif keytype == "CONFIG":
                subject = k.get("subject")
                if v is None:
                    self._configs.pop(subject, None)
                else:
                    level = str(v["compatibilityLevel"]).upper()
                    if level not in COMPATIBILITY_LEVELS:
                        raise ValueError(f"compatibility level {level}")
                    self._configs[subject] = level
            elif keytype == "MODE":
                subject = k.get("subject")
                if v is None:
                    self._modes.pop(subject, None)
                else:
                    mode = str(v["mode"]).upper()
                    if mode not in MODES:
                        raise ValueError(f"mode {mode}")
                    self._modes[subject] = mode
            elif keytype == "DELETE_SUBJECT":
                if v is not None:
                    self._apply_delete_subject(str(v.get("subject", k["subject"])), int(v["version"]))
            elif keytype == "NOOP":
                if isinstance(v, dict) and "primary_generation" in v:
                    self.primary_generation = max(self.primary_generation, int(v["primary_generation"]))
                elif isinstance(v, dict) and "max_id" in v:
                    context = str(k.get("context", DEFAULT_CONTEXT))
                    self._max_id[context] = max(self._max_id.get(context, 0), int(v["max_id"]))
            elif keytype == "CLEAR_SUBJECT":
                pass
            else:
                raise ValueError(f"key type {keytype!r}")
        except (ValueError, KeyError, TypeError):
            self.records_skipped += 1
            return
        self.records_applied += 1

    def _apply_schema(self, subject: str, version: int, v: dict[str, Any] | None) -> None:
        context = split_context(subject)[0]
        entry = self._subjects.get(subject)
        old = entry.versions.get(version) if entry is not None else None
        if old is not None:
            self._release(old)
        if v is None:                                     # tombstone: hard delete
            if entry is not None:
                entry.versions.pop(version, None)
                if not entry.versions:
                    del self._subjects[subject]
            return
        schema_type = str(v.get("schemaType") or formats.AVRO).upper()
        if schema_type not in SCHEMA_TYPES:
            raise ValueError(f"schema type {schema_type}")
        refs = tuple(Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
                     for r in (v.get("references") or ()))
        schema_id = int(v["id"])
        sv = SchemaVersion(subject=subject, version=version, schema_id=schema_id, schema_type=schema_type,
                           text=str(v["schema"]), references=refs, deleted=bool(v.get("deleted", False)))
        if old is not None and (old.schema_id != schema_id or old.text != sv.text):
            self._forget_parsed(context, old.schema_id)
        self._subjects.setdefault(subject, _Subject()).versions[version] = sv
        self._holders.setdefault((context, schema_id), set()).add((subject, version))
        self._max_id[context] = max(self._max_id.get(context, 0), schema_id)

    def _release(self, old: SchemaVersion) -> None:
        key = (old.context, old.schema_id)
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard((old.subject, old.version))
            if not holders:
                del self._holders[key]
                self._forget_parsed(old.context, old.schema_id)

    def _forget_parsed(self, context: str, schema_id: int) -> None:
        for normalize in (False, True):
            self._parsed.pop((context, schema_id, normalize), None)

    def _apply_delete_subject(self, subject: str, up_to_version: int) -> None:
        entry = self._subjects.get(subject)
        if entry is None:
            return
        for number, sv in list(entry.versions.items()):
            if number <= up_to_version and not sv.deleted:
                entry.versions[number] = replace(sv, deleted=True)

    # -- reads --------------------------------------------------------------------------------

    def contexts(self) -> list[str]:
        found = {DEFAULT_CONTEXT} | {split_context(s)[0] for s in self._subjects}
        return sorted(found)

    def subjects(self, *, deleted: bool = False, deleted_only: bool = False, prefix: str = "") -> list[str]:
        """GET /subjects: subjects with a live version; `deleted` adds those whose every version
        is soft-deleted, `deleted_only` lists only those (Confluent's LookupFilter)."""
        out = []
        for name, entry in self._subjects.items():
            if not name.startswith(prefix) or not entry.versions:
                continue
            live = bool(entry.live())
            if (not live) if deleted_only else (live or deleted):
                out.append(name)
        return sorted(out)

    def _subject(self, subject: str, *, deleted: bool = False) -> _Subject:
        entry = self._subjects.get(subject)
        if entry is None or not entry.versions or (not deleted and not entry.live()):
            raise subject_not_found(subject)
        return entry

    def versions(self, subject: str, *, deleted: bool = False, deleted_only: bool = False,
                 deleted_as_negative: bool = False) -> list[int]:
        """GET /subjects/{s}/versions: the live versions; `deleted` adds the soft-deleted ones,
        `deleted_only` answers only those, `deleted_as_negative` all with the deleted negated."""
        entry = self._subject(subject, deleted=deleted or deleted_only)
        if deleted_as_negative:
            return [-v.version if v.deleted else v.version for v in entry.all()]
        if deleted_only:
            return [v.version for v in entry.all() if v.deleted]
        return [v.version for v in (entry.all() if deleted else entry.live())]

    def version(self, subject: str, version: str | int, *, deleted: bool = False) -> SchemaVersion:
        """GET /subjects/{s}/versions/{v}: `latest` or -1 is the latest live version."""
        number = parse_version(version)
        entry = self._subject(subject, deleted=deleted)
        candidates = entry.all() if deleted else entry.live()
        if number == -1:
            if not candidates:
                raise subject_not_found(subject)
            return candidates[-1]
        sv = entry.versions.get(number)
        if sv is None or (sv.deleted and not deleted):
            raise version_not_found(number)
        return sv

    def schema_by_id(self, schema_id: int, *, subject: str | None = None) -> SchemaVersion:
        """GET /schemas/ids/{id}: the context is the one of `subject` (default `.`)."""
        context = split_context(subject)[0] if subject else DEFAULT_CONTEXT
        holders = self._holders.get((context, schema_id))
        if not holders:
            raise schema_not_found(schema_id)
        subject_name, number = min(holders, key=lambda h: (h[0] != subject, h))
        return self._subjects[subject_name].versions[number]

    def id_versions(self, schema_id: int, *, subject: str | None = None,
                    deleted: bool = False) -> list[tuple[str, int]]:
        """GET /schemas/ids/{id}/versions: (subject, version) pairs holding the id."""
        context = split_context(subject)[0] if subject else DEFAULT_CONTEXT
        holders = self._holders.get((context, schema_id))
        if not holders:
            raise schema_not_found(schema_id)
        out = sorted(h for h in holders if deleted or not self._subjects[h[0]].versions[h[1]].deleted)
        return out

    def referenced_by(self, subject: str, version: str | int) -> list[int]:
        """Ids of live schemas that reference `subject` at `version`."""
        sv = self.version(subject, version, deleted=True)
        return sorted({ref.schema_id for ref in self._referrers(sv.subject, sv.version)})

    def _referrers(self, subject: str, version: int) -> list[SchemaVersion]:
        out = []
        for entry in self._subjects.values():
            for sv in entry.live():
                if any(self._resolve_ref_subject(sv.context, r.subject) == subject and r.version == version
                       for r in sv.references):
                    out.append(sv)
        return out

    def latest_schemas(self, *, prefix: str = "", latest_only: bool = False,
                       deleted: bool = False) -> list[SchemaVersion]:
        """GET /schemas."""
        out: list[SchemaVersion] = []
        for name in self.subjects(deleted=deleted, prefix=prefix):
            entry = self._subjects[name]
            vs = entry.all() if deleted else entry.live()
            out.extend(vs[-1:] if latest_only else vs)
        return out

    def schema_types(self) -> list[str]:
        return list(SCHEMA_TYPES)

    # -- config and mode ----------------------------------------------------------------------

    def config(self, subject: str | None = None, *, default_to_global: bool = False) -> str:
        """GET /config and GET /config/{s}: a subject without its own level answers 40408
        unless `default_to_global`."""
        if subject is not None:
            level = self._configs.get(subject)
            if level is not None:
                return level
            if not default_to_global:
                raise RegistryError(404, 40408,
                                    f"Subject '{subject}' does not have subject-level compatibility configured")
        return self._global(self._configs, subject, DEFAULT_COMPATIBILITY)

    def effective_config(self, subject: str) -> str:
        return self.config(subject, default_to_global=True)

    def mode(self, subject: str | None = None, *, default_to_global: bool = False) -> str:
        if subject is not None:
            mode = self._modes.get(subject)
            if mode is not None:
                return mode
            if not default_to_global:
                raise RegistryError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")
        return self._global(self._modes, subject, DEFAULT_MODE)

    def _global(self, table: Mapping[str | None, str], subject: str | None, default: str) -> str:
        if subject is not None:
            context = split_context(subject)[0]
            if context != DEFAULT_CONTEXT and f":{context}:" in table:
                return table[f":{context}:"]
        return table.get(None, default)

    def plan_config(self, level: object, subject: str | None = None) -> tuple[list[Record], str]:
        if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
            raise invalid_compatibility()
        level = level.upper()
        return [(config_key(subject), _dumps({"compatibilityLevel": level}))], level

    def plan_delete_config(self, subject: str | None = None) -> tuple[list[Record], str]:
        """DELETE /config/{s} answers the level it removed; DELETE /config resets the global
        level to the default."""
        if subject is not None:
            if subject not in self._configs:
                raise subject_not_found(subject) if subject not in self._subjects else RegistryError(
                    404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
            return [(config_key(subject), None)], self._configs[subject]
        return [(config_key(None), None)], self._configs.get(None, DEFAULT_COMPATIBILITY)

    def plan_mode(self, mode: object, subject: str | None = None, *, force: bool = False) -> tuple[list[Record], str]:
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise invalid_mode(mode)
        mode = mode.upper()
        if mode == "IMPORT" and not force:
            scope = self.subjects() if subject is None else [s for s in self.subjects() if s == subject]
            if scope:
                raise not_permitted("Cannot import since found existing subjects")
        return [(mode_key(subject), _dumps({"mode": mode}))], mode

    def plan_delete_mode(self, subject: str | None = None) -> tuple[list[Record], str]:
        if subject is not None and subject not in self._modes:
            raise RegistryError(404, 40409, f"Subject '{subject}' does not have subject-level mode configured")
        return [(mode_key(subject), None)], self._modes.get(subject, DEFAULT_MODE)

    def _check_writable(self, subject: str, *, importing: bool = False) -> str:
        mode = self.mode(subject, default_to_global=True)
        if mode in ("READONLY", "READONLY_OVERRIDE"):
            raise not_permitted(f"Subject {subject} is in read-only mode")
        if importing and mode != "IMPORT":
            raise not_permitted(f"Subject {subject} is not in import mode")
        return mode

    # -- parsing ------------------------------------------------------------------------------

    @staticmethod
    def _resolve_ref_subject(context: str, ref_subject: str) -> str:
        """A reference's subject, unqualified, is in the referring schema's context."""
        if ref_subject.startswith(":."):
            return ref_subject
        return qualify(context, ref_subject)

    def _referenced_texts(self, context: str, references: Sequence[Reference]) -> dict[str, str]:
        """Reference name -> schema text, transitively; each must exist (42201 otherwise)."""
        out: dict[str, str] = {}
        pending = list(references)
        seen: set[tuple[str, int]] = set()
        while pending:
            ref = pending.pop()
            subject = self._resolve_ref_subject(context, ref.subject)
            if (subject, ref.version) in seen:
                continue
            seen.add((subject, ref.version))
            if len(seen) > REFERENCES_MAX:
                raise invalid_schema(f"Invalid schema: more than {REFERENCES_MAX} references")
            entry = self._subjects.get(subject)
            sv = entry.versions.get(ref.version) if entry is not None else None
            if sv is None or sv.deleted:
                raise invalid_schema(f"Invalid schema: reference {ref.name} (subject {ref.subject}, "
                                     f"version {ref.version}) not found")
            out.setdefault(ref.name, sv.text)
            pending.extend(sv.references)
        return out

    def parse(self, schema_type: str, text: str, references: Sequence[Reference], context: str,
              *, normalize: bool = False) -> ParsedSchema:
        if not isinstance(text, str):
            raise invalid_schema("Invalid schema: schema is not a string")
        if len(text.encode()) > self.schema_bytes_max:
            raise RegistryError(422, 42209, f"Schema too large: more than {self.schema_bytes_max} bytes")
        schema_type = (schema_type or formats.AVRO).upper()
        if schema_type not in SCHEMA_TYPES:
            raise RegistryError(422, 42201, f"Invalid schema type {schema_type}")
        referenced = self._referenced_texts(context, references)
        try:
            return self._parse(schema_type, text, referenced, normalize=normalize, references=tuple(references))
        except InvalidSchema as exc:
            raise invalid_schema(str(exc)) from exc

    def _parsed_version(self, sv: SchemaVersion, *, normalize: bool = False) -> ParsedSchema | None:
        key = (sv.context, sv.schema_id, normalize)
        parsed = self._parsed.get(key)
        if parsed is None:
            try:
                parsed = self.parse(sv.schema_type, sv.text, sv.references, sv.context, normalize=normalize)
            except (RegistryError, NotImplementedError):
                return None
            self._parsed[key] = parsed
        return parsed

    def fenced(self, offset: int) -> bool:
        """Whether the record at `offset` (one of the last FENCED_OFFSETS_KEPT fenced) was fenced."""
        return offset in self._fenced_offsets

    def serialized_text(self, sv: SchemaVersion) -> str:
        """The schema as `?format=serialized` asks for it: a Protobuf schema as the base64
        FileDescriptorProto (whichever form it was registered in), the others as registered."""
        if sv.schema_type != formats.PROTOBUF:
            return sv.text
        parsed = self._parsed_version(sv)
        return sv.text if parsed is None else str(parsed.parsed.serialized)

    def _same(self, a: ParsedSchema, b: ParsedSchema) -> bool:
        return (a.schema_type == b.schema_type and a.canonical == b.canonical
                and tuple(a.references) == tuple(b.references))

    def _find_id(self, context: str, parsed: ParsedSchema, *, normalize: bool) -> int | None:
        for (ctx, schema_id), holders in sorted(self._holders.items()):
            if ctx != context or not holders:
                continue
            subject, number = min(holders)
            other = self._parsed_version(self._subjects[subject].versions[number], normalize=normalize)
            if other is not None and self._same(parsed, other):
                return schema_id
        return None

    # -- lookup and compatibility -------------------------------------------------------------

    def lookup(self, subject: str, schema_type: str, text: str, references: Sequence[Reference] = (), *,
               normalize: bool = False, deleted: bool = False) -> SchemaVersion:
        """POST /subjects/{s}: the version of `subject` holding this schema."""
        entry = self._subject(subject, deleted=deleted)
        parsed = self.parse(schema_type, text, references, split_context(subject)[0], normalize=normalize)
        for sv in reversed(entry.all() if deleted else entry.live()):
            other = self._parsed_version(sv, normalize=normalize)
            if other is not None and self._same(parsed, other):
                return sv
        raise schema_not_found()

    def compatibility(self, subject: str, version: str | int | None, schema_type: str, text: str,
                      references: Sequence[Reference] = (), *, normalize: bool = False) -> list[str]:
        """POST /compatibility/subjects/{s}/versions[/{v}]: the reasons `text` is not
        compatible ([] = compatible). Without a version: with the versions the subject's
        level compares against (all of them for the _TRANSITIVE levels)."""
        context = split_context(subject)[0]
        parsed = self.parse(schema_type, text, references, context, normalize=normalize)
        level = self.effective_config(subject)
        entry = self._subjects.get(subject)
        if version is None:
            previous = entry.live() if entry is not None else []
        else:
            previous = [self.version(subject, version)]
        return self._check_against(level, parsed, previous)

    def _check_against(self, level: str, parsed: ParsedSchema, previous: Sequence[SchemaVersion]) -> list[str]:
        """The reasons `parsed` is not compatible with `previous` (oldest first) under
        `level`, with Confluent's trailer naming the version that failed (the transitive
        levels compare newest first and stop at the first failure, as Confluent does)."""
        if level == "NONE" or not previous:
            return []
        transitive = level.endswith("_TRANSITIVE")
        base = level.removesuffix("_TRANSITIVE")
        for sv in reversed(previous if transitive else previous[-1:]):
            if sv.schema_type != parsed.schema_type:
                messages = ["Incompatible because of different schema type"]
            else:
                old = self._parsed_version(sv)
                if old is None:
                    raise store_error(f"Stored schema {sv.schema_id} (subject {sv.subject} version "
                                      f"{sv.version}) does not parse")
                messages = self._check(base, parsed, [old])
            if messages:
                return [*messages, f"{{oldSchemaVersion: {sv.version}}}", f"{{oldSchema: '{sv.text}'}}",
                        f"{{compatibility: '{level}'}}"]
        return []

    # -- register and delete ------------------------------------------------------------------

    def plan_register(self, subject: str, schema_type: str | None, text: str,
                      references: Sequence[Reference] = (), *, normalize: bool = False,
                      schema_id: int | None = None, version: int | None = None) -> tuple[list[Record], int]:
        """POST /subjects/{s}/versions: the records to append and the schema id to answer.
        An identical schema already live in the subject answers its id and writes nothing;
        an identical schema elsewhere in the context gets that id; otherwise a new id.
        `schema_id` and `version` are only accepted in IMPORT mode."""
        context, name = split_context(subject)
        if (not name or len(subject.encode()) > SUBJECT_BYTES_MAX or any(ord(c) < 32 for c in subject)
                or (context != DEFAULT_CONTEXT and not _CONTEXT_RE.match(context))):
            raise RegistryError(422, 42208, f"The specified subject '{subject[:200]}' is not a valid.")
        importing = schema_id is not None or version is not None
        mode = self._check_writable(subject, importing=importing)
        if schema_id is not None and not 1 <= schema_id <= VERSION_MAX:
            raise invalid_schema(f"Invalid schema: id {schema_id} is not between 1 and 2^31-1")
        if version is not None and not 1 <= version <= VERSION_MAX:
            raise invalid_version(version)
        parsed = self.parse(schema_type or formats.AVRO, text, references, context, normalize=normalize)
        entry = self._subjects.get(subject)
        live = entry.live() if entry is not None else []
        for sv in reversed(live):
            other = self._parsed_version(sv, normalize=normalize)
            if other is not None and self._same(parsed, other):
                if schema_id is not None and schema_id != sv.schema_id:
                    raise RegistryError(422, 42207, f"Schema already registered with id {sv.schema_id} "
                                                    f"instead of input id {schema_id}")
                if version is not None and version != sv.version:
                    break
                return [], sv.schema_id
        if mode != "IMPORT":
            messages = self._check_against(self.effective_config(subject), parsed, live)
            if messages:
                raise RegistryError(409, 409, f"Schema being registered is incompatible with an earlier schema "
                                              f"for subject \"{subject}\", details: [{', '.join(messages)}]")
        if schema_id is not None:
            # IMPORT: the id given, as long as it holds nothing else (the same schema may
            # have several ids across subjects, as in the registry it is imported from)
            holders = self._holders.get((context, schema_id))
            if holders:
                holder_subject, holder_version = min(holders)
                other = self._parsed_version(self._subjects[holder_subject].versions[holder_version],
                                             normalize=normalize)
                if other is None or not self._same(parsed, other):
                    raise not_permitted(f"Overwrite new schema with id {schema_id} is not permitted.")
            new_id = schema_id
        elif (existing_id := self._find_id(context, parsed, normalize=normalize)) is not None:
            new_id = existing_id
        else:
            new_id = self._max_id.get(context, 0) + 1
        if version is not None:
            if entry is not None and version in entry.versions:
                raise not_permitted(f"Overwrite new schema with version {version} is not permitted.")
            new_version = version
        else:
            new_version = max(entry.versions, default=0) + 1 if entry is not None else 1
        if new_version > VERSION_MAX:
            raise invalid_version(new_version)
        text_out = parsed.text if normalize else text
        sv = SchemaVersion(subject=subject, version=new_version, schema_id=new_id, schema_type=parsed.schema_type,
                           text=text_out, references=tuple(references))
        # As Confluent: soft-deleted versions of this subject with the same id are tombstoned
        # (the schema lives on under its new version only).
        tombstones: list[Record] = [(schema_key(subject, old.version), None) for old in (entry.all() if entry else ())
                                    if old.deleted and old.schema_id == new_id and old.version < new_version]
        return [*tombstones, schema_record(sv)], new_id

    def plan_delete_version(self, subject: str, version: str | int, *,
                            permanent: bool = False) -> tuple[list[Record], int]:
        """DELETE /subjects/{s}/versions/{v}: soft (deleted=true) or, after a soft delete,
        permanent (a tombstone). A version live schemas reference cannot be deleted (42206)."""
        self._check_writable(subject)
        number = parse_version(version)
        entry = self._subject(subject, deleted=permanent)
        if number == -1:
            live = entry.live()
            if not live:
                raise subject_not_found(subject)
            sv = live[-1]
        else:
            found = entry.versions.get(number)
            if found is None:
                raise version_not_found(number)
            sv = found
        if permanent and not sv.deleted:
            raise RegistryError(404, 40407, f"Subject '{subject}' Version {sv.version} was not deleted "
                                            "first before being permanently deleted")
        if not permanent and sv.deleted:
            raise RegistryError(404, 40406, f"Subject '{subject}' Version {sv.version} was soft deleted."
                                            "Set permanent=true to delete permanently")
        if self._referrers(sv.subject, sv.version):
            raise RegistryError(422, 42206, "One or more references exist to the schema "
                                            f"{{magic=1,keytype=SCHEMA,subject={subject},version={sv.version}}}.")
        if permanent:
            return [(schema_key(subject, sv.version), None), *self._keep_max_id([sv])], sv.version
        return [schema_record(replace(sv, deleted=True))], sv.version

    def plan_delete_subject(self, subject: str, *, permanent: bool = False) -> tuple[list[Record], list[int]]:
        """DELETE /subjects/{s}: soft (a DELETE_SUBJECT record) or, after a soft delete,
        permanent (a tombstone per version, and the subject's config and mode removed)."""
        self._check_writable(subject)
        entry = self._subject(subject, deleted=True)
        live = entry.live()
        if permanent and live:
            raise RegistryError(404, 40405, f"Subject '{subject}' was not deleted first before being "
                                            "permanently deleted")
        if not permanent and not live:
            raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted."
                                            "Set permanent=true to delete permanently")
        for sv in (entry.all() if permanent else live):
            if self._referrers(sv.subject, sv.version):
                raise RegistryError(422, 42206, "One or more references exist to the schema "
                                                f"{{magic=1,keytype=SCHEMA,subject={subject},version={sv.version}}}.")
        if permanent:
            records: list[Record] = [(schema_key(subject, sv.version), None) for sv in entry.all()]
            records.extend(self._keep_max_id(entry.all()))
            if subject in self._configs:
                records.append((config_key(subject), None))
            if subject in self._modes:
                records.append((mode_key(subject), None))
            return records, [sv.version for sv in entry.all()]
        latest = live[-1].version
        value = _dumps({"subject": subject, "version": latest})
        return [(delete_subject_key(subject), value)], [sv.version for sv in live]

    def _keep_max_id(self, removed: Sequence[SchemaVersion]) -> list[Record]:
        """The NOOP max-id record when a hard delete removes the last holder of its
        context's largest id (else compaction could let that id be given again)."""
        out: list[Record] = []
        gone = {(sv.subject, sv.version) for sv in removed}
        for context in sorted({sv.context for sv in removed}):
            top = self._max_id.get(context, 0)
            holders = self._holders.get((context, top), set())
            if any(sv.context == context and sv.schema_id == top for sv in removed) and holders <= gone:
                out.append((max_id_key(context), _dumps({"context": context, "max_id": top})))
        return out


def parse_version(version: str | int) -> int:
    """A version path segment: 1..2^31-1, or `latest` / -1 (answered as -1)."""
    if isinstance(version, str):
        if version == "latest":
            return -1
        try:
            number = int(version)
        except ValueError:
            raise invalid_version(version) from None
    else:
        number = version
    if number == -1:
        return -1
    if not 1 <= number <= VERSION_MAX:
        raise invalid_version(version)
    return number


def references_from_json(raw: object) -> tuple[Reference, ...]:
    """The `references` of a request body; 422/42201 when malformed."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > REFERENCES_MAX:
        raise invalid_schema("Invalid schema: references must be a list")
    out = []
    for item in raw:
        try:
            out.append(Reference(str(item["name"]), str(item["subject"]), int(item["version"])))
        except (KeyError, TypeError, ValueError):
            raise invalid_schema("Invalid schema: a reference needs name, subject and version") from None
    return tuple(out)
