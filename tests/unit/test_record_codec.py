"""The C record codec (cluster/protocol/_speedups.c) against the pure-Python reference:
same bytes out, same records back, same refusals of malformed input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.protocol import records
from cluster.protocol.record_batch import InvalidRecordBatch

pytestmark = pytest.mark.skipif(records.CODEC_BACKEND != "c", reason="C codec not built (no compiler at install)")

if records.CODEC_BACKEND == "c":
    from cluster.protocol import _speedups  # type: ignore[attr-defined]

blobs = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=20), blobs), max_size=4)
record_args = st.tuples(st.integers(0, 2**31 - 1), st.integers(-(2**40), 2**40), blobs, blobs, headers)


def test_make_test_builds_the_c_codec() -> None:
    # make test installs with a compiler present: the fast path must be what runs.
    assert records.decode_records is not records._decode_records_py
    assert records.append_record is _speedups.append_record


@settings(max_examples=300, deadline=None)
@given(st.lists(record_args, min_size=1, max_size=20), st.integers(0, 2**40), st.integers(-(2**40), 2**40))
def test_c_and_python_encode_and_decode_identically(recs, base_offset, base_ts) -> None:  # type: ignore[no-untyped-def]
    c_body, py_body = bytearray(), bytearray()
    for od, tsd, key, value, hs in recs:
        assert _speedups.append_record(c_body, od, tsd, key, value, hs) == \
            records._append_record_py(py_body, od, tsd, key, value, hs)
    assert c_body == py_body
    decoded = records.decode_records(bytes(c_body), len(recs), base_offset, base_ts)
    assert decoded == records._decode_records_py(bytes(py_body), len(recs), base_offset, base_ts)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == \
        [(base_offset + od, base_ts + tsd, k, v, tuple(hs)) for od, tsd, k, v, hs in recs]
    assert all(type(r) is records.Record for r in decoded)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 50))
def test_malformed_records_are_refused_alike(data, count) -> None:  # type: ignore[no-untyped-def]
    try:
        expected = records._decode_records_py(data, count, 0, 0)
    except InvalidRecordBatch:
        expected = None
    if expected is None:
        with pytest.raises(InvalidRecordBatch):
            records.decode_records(data, count, 0, 0)
    else:
        assert records.decode_records(data, count, 0, 0) == expected


def test_truncations_of_a_real_section_never_crash() -> None:
    body = bytearray()
    for i in range(5):
        records.append_record(body, i, i * 1000, b"key%d" % i, b"v" * (i * 50), [(f"h{i}", b"x" * i)])
    for cut in range(len(body)):
        with pytest.raises(InvalidRecordBatch):
            records.decode_records(bytes(body[:cut]), 5, 0, 0)
    with pytest.raises(InvalidRecordBatch, match="record count"):
        records.decode_records(bytes(body), 10**9, 0, 0)


def test_bad_argument_types_get_clear_errors() -> None:
    with pytest.raises(TypeError, match="value must be bytes or None"):
        records.append_record(bytearray(), 0, 0, None, "text")
    with pytest.raises(TypeError, match=r"\(str, bytes or None\) pairs"):
        records.append_record(bytearray(), 0, 0, None, b"v", [(b"bytes-key", b"v")])


tag_pairs = st.lists(st.tuples(st.text(max_size=12), st.binary(max_size=12)), max_size=3).map(tuple)
fetched = st.tuples(st.integers(0, 2**40), st.integers(-(2**40), 2**40), blobs, blobs,
                    st.one_of(st.just(()), st.lists(st.tuples(st.text(max_size=5), blobs), min_size=1,
                                                    max_size=2).map(tuple)))


@settings(max_examples=300, deadline=None)
@given(st.lists(fetched, max_size=30), st.integers(0, 5), st.integers(0, 3), st.integers(-(2**40), 2**40),
       st.integers(0, 3000), tag_pairs, st.text(max_size=20), tag_pairs, st.integers(0, 400))
def test_append_tagged_c_and_python_agree(recs, start, offset_delta, base_ts, batch_size, prefix, offset_key,
                                          suffix, max_record_bytes) -> None:  # type: ignore[no-untyped-def]
    """The mirror's tagging loop: identical bytes and stopping points, and what it wrote decodes
    to the records with the tags (own offset included) appended."""
    rs = [records.Record(*r) for r in recs]
    c_body, py_body = bytearray(b"x" * offset_delta), bytearray(b"x" * offset_delta)
    args = (rs, start, offset_delta, base_ts, batch_size, prefix, offset_key, suffix, max_record_bytes)
    got = _speedups.append_tagged(c_body, *args)
    assert got == records._append_tagged_py(py_body, *args)
    assert c_body == py_body
    end, appended, nbytes, max_ts, value_bytes, full = got
    written = rs[min(start, len(rs)):end]
    assert appended == len(written) and nbytes == len(c_body) - offset_delta
    assert value_bytes == sum(len(r.value or b"") for r in written)
    assert max_ts == max([-1, *(r.timestamp for r in written)])  # -1: none (Kafka's "no timestamp")
    assert all(not r.headers for r in written)
    if end < len(rs) and not full:  # stopped at a record it leaves to the caller
        r = rs[end]
        assert r.headers or len(r.key or b"") + len(r.value or b"") > max_record_bytes
    decoded = records.decode_records(bytes(c_body[offset_delta:]), appended, 7, base_ts)
    assert [(d.timestamp, d.key, d.value, d.headers) for d in decoded] == [
        (r.timestamp, r.key, r.value, (*prefix, (offset_key, b"%d" % r.offset), *suffix)) for r in written]
    assert [d.offset for d in decoded] == [7 + offset_delta + k for k in range(appended)]
