"""Protobuf record values in typed tables (docs/typed_tables.md): Confluent's wire format is
magic byte 0, a 4-byte big-endian schema id, the message indexes (a zigzag varint count, then
that many zigzag varints: the path of the message type in its .proto file, first message
written as the single count 0), then the message in protobuf's binary encoding.

A schema comes from the registry as its serialized FileDescriptorProto (`?format=serialized`,
as confluent-kafka's deserializer asks for it) with its references; the files clients treat
as built in (google/protobuf/, google/type/) come from the protobuf and googleapis packages.
The descriptors are built in a private DescriptorPool per schema id, the message read with
protobuf's own parser, and turned into a plain row by a converter compiled once per message
type. No I/O here: the caller fetches the files.

Types map as: int32/sint32/sfixed32 -> int, int64/sint64/sfixed64/uint32/fixed32 -> bigint,
uint64/fixed64 -> decimal(20, 0), float, double, bool, string, bytes -> binary, enum ->
string (the value's name, its number for a value the schema does not name), message ->
struct, repeated -> array, map -> map<string, _> (keys as text), google.protobuf.Timestamp ->
timestamp, google.type.Date -> date, the google.protobuf wrappers (Int64Value, StringValue,
...) -> their nullable scalar. A field without presence (a proto3 scalar) reads as its
default when unset, as protobuf does; a field with presence (a message, `optional`, a oneof
member, proto2) is NULL when unset. A recursive message is refused.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool, message, message_factory

from spark_aggregate.columns import TIMESTAMP_TYPE

MAX_MESSAGE_INDEXES = 64
"""Message indexes a payload may carry (nesting depth); more is a poison record."""
MAX_REFERENCE_FILES = 256

_FD = descriptor.FieldDescriptor
_SCALARS: dict[int, pa.DataType] = {
    _FD.TYPE_INT32: pa.int32(), _FD.TYPE_SINT32: pa.int32(), _FD.TYPE_SFIXED32: pa.int32(),
    _FD.TYPE_INT64: pa.int64(), _FD.TYPE_SINT64: pa.int64(), _FD.TYPE_SFIXED64: pa.int64(),
    _FD.TYPE_UINT32: pa.int64(), _FD.TYPE_FIXED32: pa.int64(),
    _FD.TYPE_UINT64: pa.decimal128(20, 0), _FD.TYPE_FIXED64: pa.decimal128(20, 0),
    _FD.TYPE_FLOAT: pa.float32(), _FD.TYPE_DOUBLE: pa.float64(), _FD.TYPE_BOOL: pa.bool_(),
    _FD.TYPE_STRING: pa.string(), _FD.TYPE_BYTES: pa.binary(), _FD.TYPE_ENUM: pa.string(),
}
_UNSIGNED_64 = frozenset({_FD.TYPE_UINT64, _FD.TYPE_FIXED64})
_WRAPPERS = frozenset(f"google.protobuf.{n}Value" for n in
                      ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String", "Bytes"))
_TIMESTAMP = "google.protobuf.Timestamp"
_DATE = "google.type.Date"
_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()


class ProtobufSchemaError(Exception):
    """A Protobuf schema the warehouse cannot turn into columns."""


class PoisonPayload(Exception):
    """A payload that does not decode with its own schema (the reason is the message)."""


# ---- the wire format ----------------------------------------------------------------------------


def _zigzag_varint(data: memoryview, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(data):
            raise PoisonPayload("message indexes run past the end of the payload")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
        if shift > 63:
            raise PoisonPayload("a message index varint is longer than 10 bytes")
    return (value >> 1) ^ -(value & 1), pos


def message_indexes(data: memoryview, pos: int) -> tuple[tuple[int, ...], int]:
    """The message indexes at `pos` (after the 5-byte header) and where the message starts."""
    count, pos = _zigzag_varint(data, pos)
    if count == 0:
        return (0,), pos
    if not 0 < count <= MAX_MESSAGE_INDEXES:
        raise PoisonPayload(f"{count} message indexes (at most {MAX_MESSAGE_INDEXES})")
    out = []
    for _ in range(count):
        index, pos = _zigzag_varint(data, pos)
        if index < 0:
            raise PoisonPayload(f"message index {index} is negative")
        out.append(index)
    return tuple(out), pos


# ---- schemas ------------------------------------------------------------------------------------


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto | None:
    """A file clients treat as built in, from the Python package that ships it."""
    import importlib

    if not name.startswith(("google/protobuf/", "google/type/")) or not name.endswith(".proto"):
        return None
    module = name[:-len(".proto")].replace("/", ".") + "_pb2"
    try:
        compiled = importlib.import_module(module)
    except ImportError:
        return None
    fdp = descriptor_pb2.FileDescriptorProto()
    compiled.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def file_proto(serialized: str, name: str) -> descriptor_pb2.FileDescriptorProto:
    """A schema's `?format=serialized` text (base64 FileDescriptorProto) under file `name`."""
    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized, validate=True))
    except (ValueError, message.DecodeError) as exc:
        raise ProtobufSchemaError(f"not a serialized FileDescriptorProto: {exc}") from None
    fdp.name = name
    return fdp


class ProtobufFile:
    """One registered Protobuf schema (its main file and referenced files) built in a pool."""

    def __init__(self, main: descriptor_pb2.FileDescriptorProto,
                 references: Mapping[str, descriptor_pb2.FileDescriptorProto]) -> None:
        if len(references) > MAX_REFERENCE_FILES:
            raise ProtobufSchemaError(f"{len(references)} referenced files (at most {MAX_REFERENCE_FILES})")
        self.pool = descriptor_pool.DescriptorPool()
        files = {**references, main.name: main}
        added: set[str] = set()

        def add(name: str, path: tuple[str, ...]) -> None:
            if name in added:
                return
            if name in path:
                raise ProtobufSchemaError(f"import cycle {' -> '.join((*path, name))}")
            fdp = files.get(name) or _well_known(name)
            if fdp is None:
                raise ProtobufSchemaError(f"{path[-1] if path else main.name} imports {name!r}, which is "
                                          "neither a reference of the schema nor a well-known file")
            for dep in fdp.dependency:
                add(dep, (*path, name))
            try:
                self.pool.Add(fdp)
            except (TypeError, ValueError) as exc:
                raise ProtobufSchemaError(f"{name}: {exc}") from None
            added.add(name)

        add(main.name, ())
        prefix = f"{main.package}." if main.package else ""
        # The message types in declaration order (the order message indexes count in).
        self._top = [self.pool.FindMessageTypeByName(prefix + m.name) for m in main.message_type]
        self._converters: dict[tuple[int, ...], tuple[Any, Callable[[Any], dict[str, Any]]]] = {}

    def message_type(self, indexes: tuple[int, ...] = (0,)) -> descriptor.Descriptor:
        """The message type the indexes name (the first of the file by default)."""
        ordered = self._top
        desc: descriptor.Descriptor | None = None
        for index in indexes:
            if index >= len(ordered):
                raise PoisonPayload(f"message index {index} names no message type of the schema "
                                    f"({len(ordered)} there)")
            desc = ordered[index]
            ordered = list(desc.nested_types)
        if desc is None:
            raise ProtobufSchemaError("the schema declares no message type")
        return desc

    def columns(self) -> list[tuple[str, pa.DataType]]:
        """The first message type's fields as (column, Arrow type). google/protobuf/wrappers.proto
        itself (what ProtobufSerializer registers for a StringValue or Int64Value key) is refused:
        its records name one of nine message types, each `value` of another type."""
        first = self.message_type()
        if first.full_name == "google.protobuf.DoubleValue" and len(self._top) > 1:
            raise ProtobufSchemaError("the schema is google/protobuf/wrappers.proto (records written as wrapper "
                                      "types, StringValue, Int64Value...): each record may name another of its "
                                      "message types, so no one set of columns fits; leave it untyped (for a "
                                      "key: key = false)")
        return [(f.name, f.type) for f in message_arrow_type(first)]

    def decode(self, payload: memoryview) -> dict[str, Any]:
        """A payload after the 5-byte header (message indexes, then the message) as a row."""
        indexes, pos = message_indexes(payload, 0)
        got = self._converters.get(indexes)
        if got is None:
            desc = self.message_type(indexes)
            message_arrow_type(desc)  # refuses a recursive message before converters are built for it
            got = self._converters[indexes] = (message_factory.GetMessageClass(desc), _message_converter(desc))
        cls, convert = got
        msg = cls()
        try:
            msg.ParseFromString(payload[pos:].tobytes())
        except message.DecodeError as exc:
            raise PoisonPayload(f"the message does not decode as {cls.DESCRIPTOR.full_name}: {exc}") from None
        return convert(msg)


# ---- Arrow types --------------------------------------------------------------------------------


def message_arrow_type(desc: descriptor.Descriptor, stack: tuple[str, ...] = ()) -> pa.DataType:
    if desc.full_name in stack:
        raise ProtobufSchemaError(f"message {desc.full_name} is recursive ({' -> '.join((*stack, desc.full_name))});"
                                  " a recursive message does not become columns")
    return pa.struct([pa.field(f.name, _field_arrow_type(f, (*stack, desc.full_name))) for f in desc.fields])


def _is_map(fd: descriptor.FieldDescriptor) -> bool:
    return fd.type == _FD.TYPE_MESSAGE and fd.message_type.GetOptions().map_entry


def _single_arrow_type(fd: descriptor.FieldDescriptor, stack: tuple[str, ...]) -> pa.DataType:
    if fd.type in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
        name = fd.message_type.full_name
        if name == _TIMESTAMP:
            return TIMESTAMP_TYPE
        if name == _DATE:
            return pa.date32()
        if name in _WRAPPERS:
            return _single_arrow_type(fd.message_type.fields_by_name["value"], stack)
        return message_arrow_type(fd.message_type, stack)
    return _SCALARS[fd.type]


def _field_arrow_type(fd: descriptor.FieldDescriptor, stack: tuple[str, ...]) -> pa.DataType:
    if _is_map(fd):
        value = fd.message_type.fields_by_name["value"]
        return pa.map_(pa.string(), _single_arrow_type(value, stack))
    kind = _single_arrow_type(fd, stack)
    return pa.list_(kind) if fd.is_repeated else kind


# ---- messages as rows ---------------------------------------------------------------------------


def _scalar_converter(fd: descriptor.FieldDescriptor) -> Callable[[Any], Any] | None:
    """How one value of the field becomes a row value (None: as it is)."""
    if fd.type in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
        name = fd.message_type.full_name
        if name == _TIMESTAMP:
            return lambda m: m.seconds * 1_000_000 + m.nanos // 1000
        if name == _DATE:
            return _date_days
        if name in _WRAPPERS:
            inner = _scalar_converter(fd.message_type.fields_by_name["value"])
            return (lambda m: m.value) if inner is None else (lambda m: inner(m.value))
        return _message_converter(fd.message_type)
    if fd.type == _FD.TYPE_ENUM:
        names = {v.number: v.name for v in fd.enum_type.values}
        return lambda v: names.get(v, str(v))
    if fd.type in _UNSIGNED_64:
        return decimal.Decimal
    return None


def _date_days(m: Any) -> int | None:
    try:
        return datetime.date(m.year, m.month, m.day).toordinal() - _EPOCH_ORDINAL
    except ValueError as exc:
        raise PoisonPayload(f"google.type.Date {m.year}-{m.month}-{m.day}: {exc}") from None


def _message_converter(desc: descriptor.Descriptor) -> Callable[[Any], dict[str, Any]]:
    """A function from a message of `desc` to its row (a dict by field name), built once."""
    getters: list[tuple[str, Callable[[Any], Any]]] = []
    for fd in desc.fields:
        getters.append((fd.name, _field_getter(fd)))

    def convert(msg: Any) -> dict[str, Any]:
        return {name: get(msg) for name, get in getters}

    return convert


def _field_getter(fd: descriptor.FieldDescriptor) -> Callable[[Any], Any]:
    name = fd.name
    if _is_map(fd):
        value_fd = fd.message_type.fields_by_name["value"]
        inner = _scalar_converter(value_fd)
        if inner is None:
            return lambda m: [(str(k), v) for k, v in getattr(m, name).items()]
        return lambda m: [(str(k), inner(v)) for k, v in getattr(m, name).items()]
    convert = _scalar_converter(fd)
    if fd.is_repeated:
        if convert is None:
            return lambda m: list(getattr(m, name))
        return lambda m: [convert(v) for v in getattr(m, name)]
    if fd.has_presence:
        if convert is None:
            return lambda m: getattr(m, name) if m.HasField(name) else None
        return lambda m: convert(getattr(m, name)) if m.HasField(name) else None
    if convert is None:
        return lambda m: getattr(m, name)
    return lambda m: convert(getattr(m, name))


# ---- from the registry --------------------------------------------------------------------------

RegistryGet = Callable[[str, "dict[str, str] | None"], Any]
"""GET a registry path with query parameters: the JSON answer, None for 404."""


def _qualified(subject: str, context: str) -> str:
    return subject if not context or subject.startswith(":.") else f":{context}:{subject}"


def referenced_bodies(get: RegistryGet, schema_id: int, context: str, references: list[Any],
                      params: dict[str, str] | None, max_files: int) -> dict[str, Any]:
    """Every schema `references` names, and those they name in turn (reference name -> the
    registry's answer for that subject version, in `context`). Raises LookupError naming a
    reference the registry does not have, or more than `max_files` of them."""
    import urllib.parse

    found: dict[str, Any] = {}
    pending = list(references or ())
    while pending:
        ref = pending.pop()
        name = ref["name"]
        if name in found:
            continue
        if len(found) >= max_files:
            raise LookupError(f"schema id {schema_id} references more than {max_files} schemas")
        subject = urllib.parse.quote(_qualified(ref["subject"], context), safe="")
        got = get(f"/subjects/{subject}/versions/{int(ref['version'])}", params)
        if got is None:
            raise LookupError(f"schema id {schema_id} references {name!r} (subject {ref['subject']!r} "
                              f"version {ref['version']}), which the registry does not have")
        found[name] = got
        pending.extend(got.get("references") or ())
    return found


def fetch_protobuf(get: RegistryGet, schema_id: int, context: str) -> ProtobufFile | None:
    """Schema id `schema_id` of registry context `context` ("" for the default) with every file
    it references, built; None if the id is unknown there."""
    params = {"format": "serialized"}
    body = get(f"/schemas/ids/{schema_id}", params | ({"subject": f":{context}:"} if context else {}))
    if body is None:
        return None
    if body.get("schemaType") != "PROTOBUF":
        raise ProtobufSchemaError(f"schema id {schema_id} is a {body.get('schemaType', 'AVRO')} schema")
    main = file_proto(body["schema"], f"__dcmirror_schema_{schema_id}.proto")
    try:
        bodies = referenced_bodies(get, schema_id, context, body.get("references") or [], params,
                                   MAX_REFERENCE_FILES)
    except LookupError as exc:
        raise ProtobufSchemaError(str(exc)) from None
    return ProtobufFile(main, {name: file_proto(got["schema"], name) for name, got in bodies.items()})
