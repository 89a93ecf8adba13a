"""`dcmirror produce` and `dcmirror consume`: records from stdin into a topic, and from a topic
to stdout, as `rpk topic produce | consume` and kcat do, against a topology cluster by name
(`--config FILE --cluster NAME`, its client listener and security settings) or `--bootstrap`.

    printf 'k1:hello\\nk2:world\\n' | dcmirror produce --config dc.toml --cluster east --topic orders -K:
    dcmirror consume --config dc.toml --cluster east --topic orders -o beginning -e --format json

produce: one record a line (`-K D`: the key before the first D), or with `--format json` one
object a line ({"key", "value", "headers", "partition"}); headers for every record with `-H
K=V`; acks=all and idempotence by default. The summary goes to stderr; `--print-offsets`
prints where each record landed. A line longer than `--max-line-bytes` is refused by number,
and nothing after it is sent.

consume: follows the topic until Ctrl-C (`-e`: exits at the end the partitions had when it
started, as kcat -e; `-n N`: after N records); from `-o beginning|end|stored|N|-N|@MS`
(an offset, N before the end, or the first record at or after a time), all partitions or
`-p` ones, read_committed unless told; in a group with `--group` (committed as it goes).
Values and keys in Confluent's wire format are decoded through the cluster's schema registry
when the topology gives it one (Avro as JSON); other bytes print as UTF-8, or base64 in JSON
when they are not text.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import IO, Any

import trio

from deploy.cluster_cmds import add_target

MAX_LINE_BYTES = 1 << 20
MAX_HEADERS = 100
NUMBER_DIGITS_MAX = 19  # an int64 in ASCII digits


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    produce = sub.add_parser("produce", help="records from stdin into a topic (as rpk topic produce, kcat -P)")
    produce.add_argument("--topic", required=True, help="the topic to write")
    add_target(produce)
    produce.add_argument("-K", "--key-delimiter", help="each line is KEY<D>VALUE, split at the first D")
    produce.add_argument("-p", "--partition", type=_partition, help="every record to this partition "
                                                                    "(default: by key, as Kafka's partitioner)")
    produce.add_argument("-H", "--header", action="append", default=[], metavar="KEY=VALUE",
                         help="a header on every record (repeatable)")
    produce.add_argument("--format", choices=("text", "json"), default="text",
                         help='text: a line is a value (or KEY<D>VALUE with -K); json: a line is {"key", "value", '
                              '"headers", "partition"}')
    produce.add_argument("--acks", choices=("all", "1", "0"), default="all", help="acks (default all)")
    produce.add_argument("--compression", choices=("none", "gzip", "snappy", "lz4", "zstd"), default="none",
                         help="batch codec")
    produce.add_argument("--print-offsets", action="store_true", help="print partition and offset of each record")
    produce.add_argument("--max-line-bytes", type=_positive, default=MAX_LINE_BYTES,
                         help=f"longest line taken (default {MAX_LINE_BYTES})")
    produce.set_defaults(func=cmd_produce)

    consume = sub.add_parser("consume", help="records of a topic to stdout (as rpk topic consume, kcat -C)")
    consume.add_argument("--topic", required=True, help="the topic to read")
    add_target(consume)
    consume.add_argument("-o", "--offset", default="beginning",
                         help="beginning, end, stored (the group's), N, -N (N before the end) or @MS (the first "
                              "record at or after epoch milliseconds); default beginning")
    consume.add_argument("-p", "--partition", type=_partition, action="append", help="only this partition "
                                                                                     "(repeatable)")
    consume.add_argument("-g", "--group", help="read as a member of this consumer group, committing as it goes")
    consume.add_argument("-n", "--num", type=_positive, help="exit after this many records")
    consume.add_argument("-e", "--exit-at-end", action="store_true",
                         help="exit at the end the partitions had when it started (default: follow)")
    consume.add_argument("-K", "--key-delimiter", help="text: print KEY<D>VALUE")
    consume.add_argument("--format", choices=("text", "json"), default="text",
                         help="text: the value a line; json: an object a line with topic, partition, offset, "
                              "timestamp, key, value, headers")
    consume.add_argument("--isolation", choices=("read_committed", "read_uncommitted"), default="read_committed",
                         help="read_committed (default) or read_uncommitted")
    consume.add_argument("--no-decode", action="store_true",
                         help="print wire-format values as bytes, not decoded through the cluster's registry")
    consume.set_defaults(func=cmd_consume)


def _positive(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > NUMBER_DIGITS_MAX or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1 in ASCII digits, not {text!r}")
    return int(text)


def _partition(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 10 or int(text) > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"a partition number (ASCII digits), not {text!r}")
    return int(text)


def _client(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The client settings of the command's cluster, and its schema registry (or None)."""
    from cluster.common.secrets import read_properties_file
    from deploy.cluster_cmds import _bootstrap

    settings: dict[str, Any] = {}
    registry = None
    if not args.bootstrap and args.config and args.target_cluster:
        from topology import load

        spec = load(args.config).cluster(args.target_cluster)
        settings = dict(spec.client)
        registry = spec.registry
    if getattr(args, "command_config", None):
        settings.update(read_properties_file(Path(args.command_config), "--command-config"))
    return {"bootstrap.servers": _bootstrap(args), **settings}, registry


def _headers(pairs: list[str]) -> list[tuple[str, bytes]]:
    if len(pairs) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--header {pair!r} must be KEY=VALUE")
        out.append((key, value.encode()))
    return out


def _fail(command: str, text: str) -> int:
    print(f"dcmirror {command}: {text}", file=sys.stderr)
    return 1


# ---- produce -----------------------------------------------------------------------------


def parse_line(line: bytes, number: int, *, fmt: str, delimiter: bytes | None
               ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int | None]:
    """(key, value, headers, partition) of one input line (without its newline)."""
    if fmt == "json":
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: not a JSON object: {exc}") from None
        if not isinstance(doc, dict) or set(doc) - {"key", "value", "headers", "partition"}:
            raise ValueError(f'line {number}: a JSON object of "key", "value", "headers" and "partition"')
        key, value = doc.get("key"), doc.get("value")
        for name, part in (("key", key), ("value", value)):
            if part is not None and not isinstance(part, str):
                raise ValueError(f"line {number}: {name} must be a string or null")
        headers = doc.get("headers") or {}
        if not isinstance(headers, dict) or len(headers) > MAX_HEADERS or \
                not all(isinstance(v, str) for v in headers.values()):
            raise ValueError(f"line {number}: headers must be an object of at most {MAX_HEADERS} string values")
        partition = doc.get("partition")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool)
                                      or not 0 <= partition < 2**31):
            raise ValueError(f"line {number}: partition must be a whole number from 0")
        return (None if key is None else key.encode(), None if value is None else value.encode(),
                [(k, v.encode()) for k, v in headers.items()], partition)
    if delimiter is not None:
        key, sep, value = line.partition(delimiter)
        if not sep:
            raise ValueError(f"line {number}: no key delimiter {delimiter.decode()!r}")
        return key, value, [], None
    return None, line, [], None


def cmd_produce(args: argparse.Namespace) -> int:
    try:
        config, _ = _client(args)
        headers = _headers(args.header)
    except (ValueError, OSError) as exc:
        return _fail("produce", str(exc))
    delimiter = args.key_delimiter.encode() if args.key_delimiter else None
    try:
        sent, failed = trio.run(_produce, config, args, headers, delimiter, sys.stdin.buffer, sys.stdout)
    except (ValueError, OSError) as exc:
        return _fail("produce", str(exc))
    except KeyboardInterrupt:
        return 130
    print(f"produced {sent} record(s) to {args.topic}" + (f"; {failed} failed" if failed else ""), file=sys.stderr)
    return 1 if failed else 0


async def _produce(config: dict[str, Any], args: argparse.Namespace, headers: list[tuple[str, bytes]],
                   delimiter: bytes | None, stdin: IO[bytes], stdout: IO[str]) -> tuple[int, int]:
    from cluster.client.errors import KafkaError
    from cluster.client.producer import Producer

    acks = {"all": "all", "1": "1", "0": "0"}[args.acks]
    producer_config = {**config, "client.id": "dcmirror-produce", "acks": acks, "enable.idempotence": acks == "all",
                       "compression.type": args.compression}
    sent = failed = 0
    async with Producer(producer_config) as producer:
        futures = []
        number = 0
        while True:
            line = await trio.to_thread.run_sync(stdin.readline, args.max_line_bytes + 2)
            if not line:
                break
            number += 1
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if len(line) > args.max_line_bytes:
                raise ValueError(f"line {number} is longer than --max-line-bytes {args.max_line_bytes}; nothing "
                                 "from it on was sent")
            key, value, own_headers, partition = parse_line(line, number, fmt=args.format, delimiter=delimiter)
            futures.append(await producer.send(args.topic, value, key,
                                               partition=args.partition if partition is None else partition,
                                               headers=tuple(headers + own_headers)))
        for f in futures:
            try:
                meta = await f.wait()
            except KafkaError as exc:
                failed += 1
                print(f"dcmirror produce: a record failed: {exc}", file=sys.stderr)
                continue
            sent += 1
            if args.print_offsets:
                print(f"partition {meta.partition} offset {meta.offset}", file=stdout)
    return sent, failed


# ---- consume -----------------------------------------------------------------------------


def parse_offset(text: str) -> tuple[str, int]:
    """-o: ("beginning"|"end"|"stored", 0), ("offset", N), ("from_end", N) or ("time", MS)."""
    if text in ("beginning", "end", "stored"):
        return text, 0
    digits = text[1:] if text[:1] in "-@" else text
    if not digits or not (digits.isascii() and digits.isdigit()) or len(digits) > NUMBER_DIGITS_MAX \
            or int(digits) > 2**63 - 1:
        raise ValueError(f"-o {text!r}: beginning, end, stored, N, -N or @MS (ASCII digits, at most 2^63-1)")
    return {"-": "from_end", "@": "time"}.get(text[:1], "offset"), int(digits)


def render(r: Any, topic: str, partition: int, fmt: str, delimiter: str | None,
           decoded: dict[str, tuple[str, str]]) -> str:
    """One consumed record as a line of output."""
    def text(part: str, data: bytes | None) -> tuple[str, Any]:
        if part in decoded:
            return part, decoded[part][1]
        if data is None:
            return part, None
        try:
            return part, data.decode("utf-8")
        except UnicodeDecodeError:
            return f"{part}_base64", base64.b64encode(data).decode()

    if fmt == "json":
        doc = {"topic": topic, "partition": partition, "offset": r.offset, "timestamp": r.timestamp}
        doc.update([text("key", r.key), text("value", r.value)])
        doc["headers"] = {k: (v.decode("utf-8", "replace") if v is not None else None) for k, v in r.headers or ()}
        return json.dumps(doc, ensure_ascii=False)
    value = text("value", r.value)[1]
    shown = "" if value is None else str(value)
    if delimiter is not None:
        key = text("key", r.key)[1]
        return f"{'' if key is None else key}{delimiter}{shown}"
    return shown


def cmd_consume(args: argparse.Namespace) -> int:
    try:
        config, registry = _client(args)
        offset = parse_offset(args.offset)
        if offset[0] == "stored" and not args.group:
            raise ValueError("-o stored needs --group (the offsets a group committed)")
    except (ValueError, OSError) as exc:
        return _fail("consume", str(exc))
    try:
        trio.run(_consume, config, registry, args, offset, sys.stdout)
    except (ValueError, OSError) as exc:
        return _fail("consume", str(exc))
    except KeyboardInterrupt:
        return 0
    return 0


async def _consume(config: dict[str, Any], registry: Any, args: argparse.Namespace, offset: tuple[str, int],
                   out: IO[str]) -> None:
    from cluster.client.admin import EARLIEST, LATEST, Admin
    from cluster.client.consumer import Consumer
    from cluster.client.errors import KafkaError
    from cluster.protocol.sentinels import READ_COMMITTED, READ_UNCOMMITTED
    from deploy.console.records import provenance

    decoder = None
    contexts: tuple[tuple[str, str], ...] = ()
    if registry is not None and not args.no_decode:
        from deploy.console.decode import SchemaDecoder, context_of
        from topology import load

        decoder = SchemaDecoder(registry)
        contexts = load(args.config).schema_contexts(args.target_cluster)  # a registry comes from the topology
    admin_config = {k: v for k, v in config.items() if k != "bootstrap.servers"}
    async with Admin(config["bootstrap.servers"], client_id="dcmirror-consume", config=admin_config) as admin:
        meta = await admin.metadata([args.topic])
        found = meta.topics[0] if meta.topics else None
        if found is None or found.error_code:
            raise ValueError(f"no topic {args.topic!r} in the cluster (error {found.error_code if found else '?'})")
        count = len(found.partitions)
        partitions = sorted(set(args.partition or range(count)))
        if any(p >= count for p in partitions):
            raise ValueError(f"{args.topic} has partitions 0..{count - 1}")
        tps = [(args.topic, p) for p in partitions]
        isolation = READ_COMMITTED if args.isolation == "read_committed" else READ_UNCOMMITTED
        ends = await admin.list_offsets(tps, LATEST, isolation_level=isolation)
        starts = await admin.list_offsets(tps, EARLIEST)
        kind, n = offset
        positions: dict[tuple[str, int], int] = {}
        if kind == "time":
            for tp in tps:
                at = (await admin.list_offsets([tp], n)).get(tp, -1)
                positions[tp] = ends[tp] if at < 0 else at
        elif kind == "beginning":
            positions = dict(starts)
        elif kind == "end":
            positions = dict(ends)
        elif kind == "offset":
            positions = {tp: min(max(n, starts[tp]), ends[tp]) for tp in tps}
        elif kind == "from_end":
            positions = {tp: max(starts[tp], ends[tp] - n) for tp in tps}
    # A group's offsets are committed for what was printed, after each round (and at -n).
    consumer_config = {**config, "client.id": "dcmirror-consume", "isolation.level": args.isolation,
                       "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    if args.group:
        consumer_config["group.id"] = args.group
    printed = 0
    left = {tp for tp in tps if (positions.get(tp, 0) if kind != "stored" else -1) < ends[tp]}
    async with Consumer(consumer_config) as consumer:
        if args.group and args.partition is None:
            consumer.subscribe([args.topic])
        else:
            consumer.assign(tps)
        for tp, at in positions.items():
            if kind != "stored":
                consumer.seek(tp, at)
        while True:
            if args.exit_at_end and not left:
                return
            try:
                batch = await consumer.getmany(timeout_s=0.5)
            except KafkaError as exc:
                raise ValueError(str(exc)) from None
            printed_to: dict[tuple[str, int], int] = {}
            for (_, partition), records in batch.items():
                for r in records:
                    decoded: dict[str, tuple[str, str]] = {}
                    if decoder is not None:
                        where = provenance(r)
                        context = context_of(where["cluster"] if where else None, args.target_cluster or "", contexts)
                        for part, data in (("key", r.key), ("value", r.value)):
                            got = await trio.to_thread.run_sync(decoder.decode, data, context)
                            if got is not None:
                                decoded[part] = got
                    out.write(render(r, args.topic, partition, args.format, args.key_delimiter, decoded) + "\n")
                    printed += 1
                    printed_to[(args.topic, partition)] = r.offset + 1
                    if args.num is not None and printed >= args.num:
                        break
                if args.num is not None and printed >= args.num:
                    break
            out.flush()
            if args.group and printed_to:
                await consumer.commit(printed_to)
            if args.num is not None and printed >= args.num:
                return
            for tp in list(left):
                position = consumer.position(tp)
                if position is not None and position >= ends[tp]:
                    left.discard(tp)
