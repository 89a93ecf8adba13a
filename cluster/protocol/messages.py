"""Kafka request/response codec on top of kio's generated schemas.

Handlers answer with plain dicts whose keys are the schema's field names; `build` turns a
dict into the kio dataclass of whichever version the client speaks, filling fields the
version lacks from their defaults. That keeps one handler per API, not one per version.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import typing
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from cluster.protocol.answer_writers import (
    FETCH_API_KEY,
    fetch_body_parts,
    metadata_topic_entry,
    uvarint_bytes,
)
from cluster.protocol.api_keys import api_name
from cluster.protocol.errors import ProtocolError

_REQUEST_HEADER = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_UTC = datetime.UTC
# librdkafka ends AlterUserScramCredentials with a second empty tag buffer; Kafka reads past
# it without noticing, so an extra empty tag buffer (one zero byte) is accepted there only.
_EXTRA_TAG_BUFFER_APIS = frozenset({51})
# librdkafka (2.16; confluentinc/librdkafka#5049) writes the empty topic list of its
# "brokers only" Metadata request (v9+) as a 4-byte int32 where a compact array belongs:
# Kafka reads a null list (all topics) and two false flags and never looks at the 3 bytes
# left, so Metadata alone is read as Kafka reads it, whatever follows its fields.
_TRAILING_BYTES_IGNORED_APIS = frozenset({3})



@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int


def parse_request_header(frame: bytes | bytearray, *, flexible: bool) -> RequestHeader:
    """Header v1 (api key, version, correlation id, client id); v2 adds tagged fields."""
    if len(frame) < 10:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _REQUEST_HEADER.unpack_from(frame, 0)
    (client_len,) = _I16.unpack_from(frame, 8)
    pos = 10
    client_id = None
    if client_len >= 0:
        if pos + client_len > len(frame):
            raise ProtocolError("client id runs past the end of the request")
        client_id = bytes(frame[pos : pos + client_len]).decode("utf-8", "replace")
        pos += client_len
    elif client_len != -1:
        raise ProtocolError(f"client id has negative length {client_len}")
    if flexible:
        pos = skip_tagged_fields(frame, pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def peek_api(frame: bytes | bytearray) -> tuple[int, int, int]:
    """(api key, version, correlation id) of a frame, without validating the rest."""
    if len(frame) < 8:
        raise ProtocolError(f"request of {len(frame)} bytes is shorter than a request header")
    return _REQUEST_HEADER.unpack_from(frame, 0)


def _uvarint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ProtocolError("varint runs past the end of the request")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise ProtocolError("varint is too long")


def skip_tagged_fields(buf: bytes | bytearray, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    if count > len(buf) - pos:
        raise ProtocolError(f"{count} tagged fields cannot fit in the request")
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if pos + size > len(buf):
            raise ProtocolError("tagged field runs past the end of the request")
        pos += size
    return pos


# ---- schemas ---------------------------------------------------------------------------


@cache
def request_schema(api_key: int, version: int) -> Any:
    return load_request_schema(api_key, version)


@cache
def response_schema(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_request(api_key: int, version: int, frame: bytes | bytearray, offset: int) -> Any:
    cls = request_schema(api_key, version)
    buf = memoryview(frame).toreadonly() if isinstance(frame, bytearray) else frame
    if cls.__flexible__:
        # kio's native reader reserves memory for a compact array's declared length before
        # reading it: a forged length aborts the process. Check every length first.
        try:
            _check_lengths(cls, frame, offset, len(frame))
        except IndexError:
            raise ProtocolError(f"{api_name(api_key)} v{version} request is truncated") from None
    try:
        value, size = _reader(cls)(buf, offset)
    except Exception as exc:  # kio raises several types for malformed input
        raise ProtocolError(f"{api_name(api_key)} v{version} request is malformed: {exc}") from None
    if offset + size != len(frame) and api_key not in _TRAILING_BYTES_IGNORED_APIS and not (
            api_key in _EXTRA_TAG_BUFFER_APIS and len(frame) - offset - size == 1 and frame[-1] == 0):
        raise ProtocolError(
            f"{api_name(api_key)} v{version} request has {len(frame) - offset - size} trailing bytes"
        )
    missing = _null_field(cls, value)
    if missing is not None:
        raise ProtocolError(f"{api_name(api_key)} v{version} request: non-nullable field {missing} is null")
    return value


_FIXED_BYTES = {"int8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "timedelta_i32": 4,
                "int64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8, "uuid": 16}
_VARIABLE = frozenset({"string", "bytes", "records"})


_FIXED, _VARIABLE_BYTES, _STRUCT, _NULLABLE_STRUCT = 0, 1, 2, 3


@cache
def _length_plan(cls: type) -> tuple[tuple[bool, int, Any, str], ...]:
    """A flexible entity's fields in wire order (tagged fields live in the tag buffer), as
    (is array, kind, fixed size or nested class, name)."""
    tagged = {f.name for f in dataclasses.fields(cls) if "tag" in f.metadata}
    out = []
    for p in _plan(cls):
        if p.name in tagged:
            continue
        arg: Any
        if p.nested is not None:
            kind, arg = (_NULLABLE_STRUCT if p.nullable and not p.is_tuple else _STRUCT), p.nested
        elif p.kafka_type in _VARIABLE:
            kind, arg = _VARIABLE_BYTES, None
        elif p.kafka_type in _FIXED_BYTES:
            kind, arg = _FIXED, _FIXED_BYTES[p.kafka_type]
        else:
            raise ProtocolError(f"field {p.name} has a type ({p.kafka_type}) this broker does not check")
        out.append((p.is_tuple, kind, arg, p.name))
    return tuple(out)


@cache
def _fixed_size(cls: type) -> int | None:
    """The bytes of an entity whose fields are all fixed-size scalars (a Fetch request's
    partition), before its tag buffer; None for any other."""
    plan = _length_plan(cls)
    if any(is_array or kind != _FIXED for is_array, kind, _, _ in plan):
        return None
    return sum(arg for _, _, arg, _ in plan)


def _check_lengths(cls: type, buf: bytes | bytearray, pos: int, end: int) -> int:
    """Walk a flexible (compact) encoding of `cls` checking that no declared length or
    count exceeds the bytes left; returns the end position. Raises ProtocolError, or
    IndexError when the frame ends early."""
    fixed = _fixed_size(cls)
    if fixed is not None:
        pos += fixed
        if pos < end and buf[pos] == 0:
            return pos + 1  # no tagged fields (the common case: one per partition of a Fetch)
        if pos >= end:
            raise IndexError
        return _check_tags(buf, pos, end)
    for is_array, kind, arg, name in _length_plan(cls):
        count = 1
        if is_array:
            count, pos = _uvarint(buf, pos)
            count -= 1  # compact: length + 1, 0 is null
            if count > end - pos:
                raise ProtocolError(f"field {name} declares {count} elements in {end - pos} bytes")
            if kind == _FIXED:
                pos += max(count, 0) * arg
                continue
        for _ in range(count):
            if kind == _FIXED:
                pos += arg
            elif kind == _VARIABLE_BYTES:
                n, pos = _uvarint(buf, pos)
                if n - 1 > end - pos:
                    raise ProtocolError(f"field {name} declares {n - 1} bytes in {end - pos}")
                if n > 1:
                    pos += n - 1
            elif kind == _NULLABLE_STRUCT and buf[pos] == 0xFF:
                pos += 1
            else:
                pos = _check_lengths(arg, buf, pos + (kind == _NULLABLE_STRUCT), end)
        if pos > end:
            raise IndexError
    return _check_tags(buf, pos, end)


def _check_tags(buf: bytes | bytearray, pos: int, end: int) -> int:
    n_tags, pos = _uvarint(buf, pos)
    if n_tags > end - pos:
        raise ProtocolError(f"{n_tags} tagged fields declared in {end - pos} bytes")
    for _ in range(n_tags):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if size > end - pos:
            raise ProtocolError(f"a tagged field declares {size} bytes in {end - pos}")
        pos += size
    return pos


@cache
def _may_hold_null(cls: type) -> bool:
    """Whether kio can decode a None into some field of `cls` (arrays, strings, bytes and
    structs can be null on the wire; fixed-size scalars cannot)."""
    for plan in _plan(cls):
        if plan.is_tuple or plan.kafka_type in _VARIABLE or plan.kafka_type not in _FIXED_BYTES:
            return True
        if plan.nested is not None and _may_hold_null(plan.nested):
            return True
    return False


def _null_field(cls: type, value: Any) -> str | None:
    """The first non-nullable field holding None (kio decodes a -1 array count as None)."""
    if not _may_hold_null(cls):
        return None
    for plan in _plan(cls):
        v = getattr(value, plan.name)
        if v is None:
            if not plan.nullable:
                return plan.name
            continue
        if plan.nested is not None:
            for item in v if plan.is_tuple else (v,):
                missing = _null_field(plan.nested, item)
                if missing is not None:
                    return f"{plan.name}.{missing}"
    return None


def is_flexible_request(api_key: int, version: int) -> bool:
    try:
        return bool(request_schema(api_key, version).__flexible__)
    except Exception:
        return False


class EncodedBody(bytes):
    """A response body already encoded in its version (a cached answer, `encode_body`):
    `encode_response` puts it after the header as it is."""

    def with_throttle_time(self, api_key: int, version: int, throttle_ms: int) -> EncodedBody:
        """The same answer saying `throttle_ms` (every response with the field has it first)."""
        fields = [f for f in response_schema(api_key, version).__dataclass_fields__ if not f.startswith("__")]
        if not fields or fields[0] != "throttle_time":
            return self
        return EncodedBody(_I32.pack(throttle_ms) + self[4:])


def encode_body(api_key: int, version: int, body: Mapping[str, Any]) -> EncodedBody:
    cls = response_schema(api_key, version)
    out = io.BytesIO()
    _writer(cls)(out, build(cls, body))
    return EncodedBody(out.getvalue())


def _array_item_class(api_key: int, version: int, field_name: str) -> type:
    return typing.get_args(typing.get_type_hints(response_schema(api_key, version))[field_name])[0]


@cache
def _item_writer(api_key: int, version: int, field_name: str) -> tuple[type, Any]:
    cls = _array_item_class(api_key, version, field_name)
    return cls, entity_writer(cls)


def encode_item(api_key: int, version: int, field_name: str, item: Mapping[str, Any]) -> bytes:
    """One element of a response's top-level array, as it sits inside the encoded array
    (kept encoded by a handler, given back to `encode_metadata_body`)."""
    if api_key == METADATA_API_KEY and field_name == "topics":
        written = metadata_topic_entry(version, item)
        if written is not None:
            return written
    cls, write = _item_writer(api_key, version, field_name)
    out = io.BytesIO()
    write(out, build(cls, item))
    return out.getvalue()


METADATA_API_KEY = 3


def encode_metadata_body(version: int, body: Mapping[str, Any], topics: list[bytes]) -> EncodedBody:
    """A Metadata answer whose topics are already encoded (`encode_item`): the rest is encoded
    with an empty topic list and the topics go where it was. Only cluster authorized
    operations (v8-10) and the tag buffer (v9+) follow the topics in every version."""
    cls = response_schema(METADATA_API_KEY, version)
    empty = encode_body(METADATA_API_KEY, version, {**body, "topics": []})
    flexible = bool(cls.__flexible__)
    after = (4 if 8 <= version <= 10 else 0) + flexible
    array_start = len(empty) - after - (1 if flexible else 4)
    count = uvarint_bytes(len(topics) + 1) if flexible else _I32.pack(len(topics))
    return EncodedBody(b"".join([empty[:array_start], count, *topics, empty[len(empty) - after:]]))


def encode_response(api_key: int, version: int, correlation_id: int, body: Mapping[str, Any] | Any) -> bytes:
    """Size-prefixed response: header v0 (v1 for flexible versions, never for ApiVersions).
    A Fetch answer given as a dict is written by answer_writers.fetch_body_parts (the same
    bytes; `encode_body` always takes kio's way)."""
    cls = response_schema(api_key, version)
    if api_key == FETCH_API_KEY and isinstance(body, Mapping):
        parts = fetch_body_parts(version, body)
        if parts is not None:
            size = sum(map(len, parts)) + 4 + cls.__flexible__
            return b"".join([_I32.pack(size), _I32.pack(correlation_id), b"\x00" if cls.__flexible__ else b"", *parts])
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(_I32.pack(correlation_id))
    if cls.__flexible__ and api_key != 18:
        out.write(b"\x00")
    if isinstance(body, EncodedBody):
        out.write(body)
    else:
        _writer(cls)(out, body if isinstance(body, cls) else build(cls, body))
    buf = out.getbuffer()
    _I32.pack_into(buf, 0, len(buf) - 4)
    del buf
    return out.getvalue()


def encode_request(api_key: int, version: int, correlation_id: int, client_id: bytes,
                   body: Mapping[str, Any] | Any) -> bytes:
    """Size-prefixed request: header v1 (v2 with tagged fields for flexible versions)."""
    cls = request_schema(api_key, version)
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(_I16.pack(api_key) + _I16.pack(version) + _I32.pack(correlation_id))
    out.write(_I16.pack(len(client_id)) + client_id)
    if cls.__flexible__:
        out.write(b"\x00")
    _writer(cls)(out, body if isinstance(body, cls) else build(cls, body))
    buf = out.getbuffer()
    _I32.pack_into(buf, 0, len(buf) - 4)
    del buf
    return out.getvalue()


def decode_response(api_key: int, version: int, frame: bytes | bytearray) -> Any:
    """A response frame without its size prefix (correlation id first)."""
    cls = response_schema(api_key, version)
    offset = 4 + (1 if cls.__flexible__ and api_key != 18 else 0)
    value, _ = _reader(cls)(bytes(frame), offset)
    return value


# ---- building kio dataclasses from dicts ------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    kafka_type: str | None
    nested: type | None
    is_tuple: bool
    nullable: bool
    default: Any


def _is_entity(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


@cache
def _plan(cls: type) -> tuple[_FieldPlan, ...]:
    hints = typing.get_type_hints(cls)
    plans = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        nullable = False
        args = typing.get_args(tp)
        if type(None) in args:
            nullable = True
            non_none = [a for a in args if a is not type(None)]
            tp = non_none[0] if len(non_none) == 1 else tp
        nested = None
        is_tuple = False
        if typing.get_origin(tp) is tuple:
            is_tuple = True
            inner = typing.get_args(tp)[0]
            if _is_entity(inner):
                nested = inner
        elif _is_entity(tp):
            nested = tp
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        plans.append(_FieldPlan(f.name, f.metadata.get("kafka_type"), nested, is_tuple, nullable, default))
    return tuple(plans)


def _zero(plan: _FieldPlan) -> Any:
    if plan.nullable:
        return None
    if plan.is_tuple:
        return ()
    kt = plan.kafka_type
    if kt in ("int8", "int16", "int32", "int64", "uint16", "float64"):
        return 0
    if kt == "error_code":
        return ErrorCode.none
    if kt == "string":
        return ""
    if kt in ("bytes", "records"):
        return b""
    if kt == "bool":
        return False
    if kt == "uuid":
        return uuid.UUID(int=0)
    if kt in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if plan.nested is not None:
        return build(plan.nested, {})
    raise TypeError(f"no default for field {plan.name} ({kt})")


def _convert(plan: _FieldPlan, value: Any) -> Any:
    if value is None:
        return None if plan.nullable else _zero(plan)
    if plan.nested is not None:
        if plan.is_tuple:
            return tuple(v if isinstance(v, plan.nested) else build(plan.nested, v) for v in value)
        return value if isinstance(value, plan.nested) else build(plan.nested, value)
    kt = plan.kafka_type
    if plan.is_tuple:
        return tuple(value)
    if kt == "error_code":
        return ErrorCode(int(value))
    if kt in ("timedelta_i32", "timedelta_i64") and not isinstance(value, datetime.timedelta):
        return datetime.timedelta(milliseconds=int(value))
    if kt == "datetime_i64" and not isinstance(value, datetime.datetime):
        if int(value) < 0:
            return None
        return datetime.datetime.fromtimestamp(int(value) / 1000, tz=_UTC)
    return value


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """Instantiate a kio entity from a dict; fields the dict lacks get their defaults."""
    kwargs = {}
    for plan in _plan(cls):
        if plan.name in values:
            kwargs[plan.name] = _convert(plan, values[plan.name])
        elif plan.default is not dataclasses.MISSING:
            kwargs[plan.name] = plan.default
        else:
            kwargs[plan.name] = _zero(plan)
    return cls(**kwargs)
