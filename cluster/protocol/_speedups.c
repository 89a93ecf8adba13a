/* Record (de)serialization for RecordBatch v2 in C: the per-record loops of every consumer
 * and producer. Semantics are exactly those of the pure-Python versions in records.py,
 * which remain the reference (tests run both on the same inputs); this module is optional
 * and only makes them faster.
 *
 * Every length read from the input is checked against the bytes that remain before use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *InvalidRecordBatch = NULL; /* set by records.py at import */

static int fail(const char *msg) {
    PyErr_SetString(InvalidRecordBatch ? InvalidRecordBatch : PyExc_ValueError, msg);
    return -1;
}

#include "varint.h"

/* a length-prefixed field: NULL-free result, Py_None for length -1 */
static PyObject *read_field(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos) {
    int64_t n;
    if (read_varint(buf, end, pos, &n) < 0) return NULL;
    if (n < 0) Py_RETURN_NONE;
    if (n > end - *pos) {
        fail("record field runs past the end of the records");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)buf + *pos, (Py_ssize_t)n);
    *pos += (Py_ssize_t)n;
    return out;
}

static PyObject *decode_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    long long base_offset, base_timestamp;
    PyTypeObject *record_type;
    if (!PyArg_ParseTuple(args, "O!y*nLL", &PyType_Type, &record_type, &view, &count, &base_offset,
                          &base_timestamp))
        return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    if (count < 0 || count > size) { /* every record takes at least one byte */
        PyBuffer_Release(&view);
        fail("record count does not fit the batch");
        return NULL;
    }
    PyObject *list = PyList_New(count);
    if (!list) goto error_view;
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, off_delta, n_headers;
        if (read_varint(buf, size, &p, &length) < 0) goto error;
        if (length < 0 || length > size - p) { fail("record length runs past the end of the batch"); goto error; }
        Py_ssize_t end = p + (Py_ssize_t)length;
        if (p >= end) { fail("record is empty"); goto error; }
        p += 1; /* attributes */
        if (read_varint(buf, end, &p, &ts_delta) < 0) goto error;
        if (read_varint(buf, end, &p, &off_delta) < 0) goto error;
        PyObject *key = read_field(buf, end, &p);
        if (!key) goto error;
        PyObject *value = read_field(buf, end, &p);
        if (!value) { Py_DECREF(key); goto error; }
        if (read_varint(buf, end, &p, &n_headers) < 0) { Py_DECREF(key); Py_DECREF(value); goto error; }
        if (n_headers < 0 || n_headers > end - p) {
            Py_DECREF(key); Py_DECREF(value);
            fail("record declares more headers than it has bytes");
            goto error;
        }
        PyObject *headers = PyTuple_New((Py_ssize_t)n_headers);
        if (!headers) { Py_DECREF(key); Py_DECREF(value); goto error; }
        for (Py_ssize_t h = 0; h < (Py_ssize_t)n_headers; h++) {
            int64_t klen;
            if (read_varint(buf, end, &p, &klen) < 0) goto error_record;
            PyObject *hk;
            if (klen < 0) {
                hk = PyUnicode_FromStringAndSize("", 0);
            } else {
                if (klen > end - p) { fail("record field runs past the end of the records"); goto error_record; }
                hk = PyUnicode_DecodeUTF8((const char *)buf + p, (Py_ssize_t)klen, "replace");
                p += (Py_ssize_t)klen;
            }
            if (!hk) goto error_record;
            PyObject *hv = read_field(buf, end, &p);
            if (!hv) { Py_DECREF(hk); goto error_record; }
            PyObject *pair = PyTuple_Pack(2, hk, hv);
            Py_DECREF(hk);
            Py_DECREF(hv);
            if (!pair) goto error_record;
            PyTuple_SET_ITEM(headers, h, pair);
        }
        if (p != end) { fail("record length does not match its fields"); goto error_record; }
        PyObject *record = record_type->tp_alloc(record_type, 5);
        if (!record) goto error_record;
        PyObject *offset = PyLong_FromLongLong(base_offset + off_delta);
        PyObject *timestamp = PyLong_FromLongLong(base_timestamp + ts_delta);
        if (!offset || !timestamp) {
            Py_XDECREF(offset); Py_XDECREF(timestamp); Py_DECREF(record);
            goto error_record;
        }
        PyTuple_SET_ITEM(record, 0, offset);
        PyTuple_SET_ITEM(record, 1, timestamp);
        PyTuple_SET_ITEM(record, 2, key);
        PyTuple_SET_ITEM(record, 3, value);
        PyTuple_SET_ITEM(record, 4, headers);
        PyList_SET_ITEM(list, i, record);
        continue;
    error_record:
        Py_DECREF(key);
        Py_DECREF(value);
        Py_DECREF(headers);
        goto error;
    }
    PyBuffer_Release(&view);
    return list;
error:
    Py_DECREF(list);
error_view:
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- encoding ---------------------------------------------------------------------- */

static Py_ssize_t put_varint(unsigned char *out, int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t n = 0;
    while (v & ~(uint64_t)0x7F) {
        out[n++] = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[n++] = (unsigned char)v;
    return n;
}

static Py_ssize_t varint_size(int64_t value) {
    uint64_t v = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    Py_ssize_t n = 1;
    while (v & ~(uint64_t)0x7F) { v >>= 7; n++; }
    return n;
}

/* bytes-like or None -> (pointer, length or -1); 0 ok, -1 error */
static int field_of(PyObject *obj, Py_buffer *view, const char *what) {
    if (obj == Py_None) { view->buf = NULL; view->len = -1; view->obj = NULL; return 0; }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "record %s must be bytes or None, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static Py_ssize_t field_size(Py_buffer *v) {
    return v->len < 0 ? 1 : varint_size(v->len) + v->len;
}

static unsigned char *put_field(unsigned char *out, Py_buffer *v) {
    if (v->len < 0) return out + put_varint(out, -1);
    out += put_varint(out, v->len);
    memcpy(out, v->buf, (size_t)v->len);
    return out + v->len;
}

#define MAX_HEADERS 65536

static PyObject *append_record(PyObject *self, PyObject *args) {
    PyObject *body, *key_obj, *value_obj, *headers_obj = NULL;
    long long offset_delta, timestamp_delta;
    if (!PyArg_ParseTuple(args, "O!LLOO|O", &PyByteArray_Type, &body, &offset_delta, &timestamp_delta, &key_obj,
                          &value_obj, &headers_obj))
        return NULL;
    Py_buffer key, value;
    if (field_of(key_obj, &key, "key") < 0) return NULL;
    if (field_of(value_obj, &value, "value") < 0) { PyBuffer_Release(&key); return NULL; }
    if (headers_obj == NULL) headers_obj = PyTuple_New(0); else Py_INCREF(headers_obj);
    if (headers_obj == NULL) { PyBuffer_Release(&key); PyBuffer_Release(&value); return NULL; }
    PyObject *hseq = PySequence_Fast(headers_obj, "record headers must be a sequence of (str, bytes) pairs");
    Py_DECREF(headers_obj);
    if (!hseq) { PyBuffer_Release(&key); PyBuffer_Release(&value); return NULL; }
    Py_ssize_t nh = PySequence_Fast_GET_SIZE(hseq);
    PyObject *result = NULL;
    Py_buffer *hviews = NULL;
    PyObject **hkeys = NULL;
    Py_ssize_t filled = 0;
    if (nh > MAX_HEADERS) { PyErr_SetString(PyExc_ValueError, "a record has at most 65536 headers"); goto done; }
    if (nh) {
        hviews = PyMem_Calloc((size_t)nh, sizeof(Py_buffer));
        hkeys = PyMem_Calloc((size_t)nh, sizeof(PyObject *));
        if (!hviews || !hkeys) { PyErr_NoMemory(); goto done; }
    }
    Py_ssize_t size = 1 + varint_size(timestamp_delta) + varint_size(offset_delta) + field_size(&key) +
                      field_size(&value) + varint_size(nh);
    for (; filled < nh; filled++) {
        PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(hseq, filled), "a record header must be a pair");
        if (!pair) goto done;
        if (PySequence_Fast_GET_SIZE(pair) != 2 || !PyUnicode_Check(PySequence_Fast_GET_ITEM(pair, 0))) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_TypeError, "record headers must be (str, bytes or None) pairs");
            goto done;
        }
        hkeys[filled] = PyUnicode_AsUTF8String(PySequence_Fast_GET_ITEM(pair, 0));
        if (!hkeys[filled]) { Py_DECREF(pair); goto done; }
        if (field_of(PySequence_Fast_GET_ITEM(pair, 1), &hviews[filled], "header value") < 0) {
            Py_CLEAR(hkeys[filled]);
            Py_DECREF(pair);
            goto done;
        }
        Py_DECREF(pair);
        Py_ssize_t klen = PyBytes_GET_SIZE(hkeys[filled]);
        size += varint_size(klen) + klen + field_size(&hviews[filled]);
    }
    Py_ssize_t old = PyByteArray_GET_SIZE(body);
    Py_ssize_t total = varint_size(size) + size;
    if (PyByteArray_Resize(body, old + total) < 0) goto done;
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(body) + old;
    out += put_varint(out, size);
    *out++ = 0; /* attributes */
    out += put_varint(out, timestamp_delta);
    out += put_varint(out, offset_delta);
    out = put_field(out, &key);
    out = put_field(out, &value);
    out += put_varint(out, nh);
    for (Py_ssize_t h = 0; h < nh; h++) {
        Py_ssize_t klen = PyBytes_GET_SIZE(hkeys[h]);
        out += put_varint(out, klen);
        memcpy(out, PyBytes_AS_STRING(hkeys[h]), (size_t)klen);
        out += klen;
        out = put_field(out, &hviews[h]);
    }
    result = PyLong_FromSsize_t(total);
done:
    for (Py_ssize_t h = 0; h < filled; h++) {
        Py_XDECREF(hkeys[h]);
        if (hviews[h].obj) PyBuffer_Release(&hviews[h]);
    }
    PyMem_Free(hviews);
    PyMem_Free(hkeys);
    Py_DECREF(hseq);
    if (key.obj) PyBuffer_Release(&key);
    if (value.obj) PyBuffer_Release(&value);
    return result;
}

/* pre-encoded headers: each varint(key length) key field(value); returns 0 or -1 */
static int encode_headers(PyObject *headers, PyObject **out, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(headers, "headers must be a sequence of (str, bytes) pairs");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), size = 0;
    PyObject *keys = PyList_New(n);
    if (!keys) { Py_DECREF(seq); return -1; }
    for (Py_ssize_t h = 0; h < n; h++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, h);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_SetString(PyExc_TypeError, "tag headers must be (str, bytes) tuples");
            goto error;
        }
        PyObject *k = PyUnicode_AsUTF8String(PyTuple_GET_ITEM(pair, 0));
        if (!k) goto error;
        PyList_SET_ITEM(keys, h, k);
        Py_ssize_t vlen = PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1));
        size += varint_size(PyBytes_GET_SIZE(k)) + PyBytes_GET_SIZE(k) + varint_size(vlen) + vlen;
    }
    *out = PyBytes_FromStringAndSize(NULL, size);
    if (!*out) goto error;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(*out);
    for (Py_ssize_t h = 0; h < n; h++) {
        PyObject *k = PyList_GET_ITEM(keys, h), *v = PyTuple_GET_ITEM(PySequence_Fast_GET_ITEM(seq, h), 1);
        p += put_varint(p, PyBytes_GET_SIZE(k));
        memcpy(p, PyBytes_AS_STRING(k), (size_t)PyBytes_GET_SIZE(k));
        p += PyBytes_GET_SIZE(k);
        p += put_varint(p, PyBytes_GET_SIZE(v));
        memcpy(p, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v));
        p += PyBytes_GET_SIZE(v);
    }
    *count = n;
    Py_DECREF(keys);
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(keys);
    Py_DECREF(seq);
    return -1;
}

/* The mirror's hot loop: see _append_tagged_py in records.py (the reference). */
static PyObject *append_tagged(PyObject *self, PyObject *args) {
    PyObject *body, *records, *prefix_obj, *suffix_obj, *offset_key_obj;
    Py_ssize_t start;
    long long offset_delta, base_timestamp, batch_size, max_record_bytes;
    if (!PyArg_ParseTuple(args, "O!OnLLLOUOL", &PyByteArray_Type, &body, &records, &start, &offset_delta,
                          &base_timestamp, &batch_size, &prefix_obj, &offset_key_obj, &suffix_obj, &max_record_bytes))
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (!seq) return NULL;
    PyObject *prefix = NULL, *suffix = NULL, *offset_key = NULL, *result = NULL;
    Py_ssize_t nprefix = 0, nsuffix = 0;
    if (encode_headers(prefix_obj, &prefix, &nprefix) < 0 || encode_headers(suffix_obj, &suffix, &nsuffix) < 0)
        goto done;
    offset_key = PyUnicode_AsUTF8String(offset_key_obj);
    if (!offset_key) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), i = start, appended = 0, nbytes = 0, value_bytes = 0;
    long long max_ts = -1;
    int full = 0;
    Py_ssize_t klen = PyBytes_GET_SIZE(offset_key);
    Py_ssize_t fixed = PyBytes_GET_SIZE(prefix) + PyBytes_GET_SIZE(suffix) + varint_size(klen) + klen +
                       varint_size(nprefix + nsuffix + 1);
    if (start < 0) start = i = 0;
    for (; i < n; i++) {
        PyObject *rec = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 5) {
            PyErr_SetString(PyExc_TypeError, "records must be (offset, timestamp, key, value, headers) tuples");
            goto done;
        }
        PyObject *headers = PyTuple_GET_ITEM(rec, 4);
        int has = PyObject_IsTrue(headers);
        if (has < 0) goto done;
        if (has) break;
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 0));
        long long timestamp = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1));
        if (PyErr_Occurred()) goto done;
        Py_buffer key, value;
        if (field_of(PyTuple_GET_ITEM(rec, 2), &key, "key") < 0) goto done;
        if (field_of(PyTuple_GET_ITEM(rec, 3), &value, "value") < 0) { if (key.obj) PyBuffer_Release(&key); goto done; }
        if ((key.len > 0 ? key.len : 0) + (value.len > 0 ? value.len : 0) > max_record_bytes) {
            if (key.obj) PyBuffer_Release(&key);
            if (value.obj) PyBuffer_Release(&value);
            break; /* the caller's slow path reports it */
        }
        char digits[24];
        int dlen = snprintf(digits, sizeof digits, "%lld", offset);
        long long delta = offset_delta + appended;
        Py_ssize_t size = 1 + varint_size(timestamp - base_timestamp) + varint_size(delta) + field_size(&key) +
                          field_size(&value) + fixed + varint_size(dlen) + dlen;
        Py_ssize_t total = varint_size(size) + size;
        Py_ssize_t old = PyByteArray_GET_SIZE(body);
        if (delta > 0 && (old >= batch_size || old + total > batch_size)) {
            full = 1;
            if (key.obj) PyBuffer_Release(&key);
            if (value.obj) PyBuffer_Release(&value);
            break;
        }
        if (PyByteArray_Resize(body, old + total) < 0) {
            if (key.obj) PyBuffer_Release(&key);
            if (value.obj) PyBuffer_Release(&value);
            goto done;
        }
        unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(body) + old;
        out += put_varint(out, size);
        *out++ = 0; /* attributes */
        out += put_varint(out, timestamp - base_timestamp);
        out += put_varint(out, delta);
        out = put_field(out, &key);
        out = put_field(out, &value);
        out += put_varint(out, nprefix + nsuffix + 1);
        memcpy(out, PyBytes_AS_STRING(prefix), (size_t)PyBytes_GET_SIZE(prefix));
        out += PyBytes_GET_SIZE(prefix);
        out += put_varint(out, klen);
        memcpy(out, PyBytes_AS_STRING(offset_key), (size_t)klen);
        out += klen;
        out += put_varint(out, dlen);
        memcpy(out, digits, (size_t)dlen);
        out += dlen;
        memcpy(out, PyBytes_AS_STRING(suffix), (size_t)PyBytes_GET_SIZE(suffix));
        if (value.len > 0) value_bytes += value.len;
        if (key.obj) PyBuffer_Release(&key);
        if (value.obj) PyBuffer_Release(&value);
        appended++;
        nbytes += total;
        if (timestamp > max_ts) max_ts = timestamp;
    }
    result = Py_BuildValue("(nnnLnO)", i, appended, nbytes, max_ts, value_bytes, full ? Py_True : Py_False);
done:
    Py_XDECREF(prefix);
    Py_XDECREF(suffix);
    Py_XDECREF(offset_key);
    Py_DECREF(seq);
    return result;
}

static PyObject *set_error_class(PyObject *self, PyObject *cls) {
    Py_XINCREF(cls);
    Py_XSETREF(InvalidRecordBatch, cls);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_records", decode_records, METH_VARARGS,
     "decode_records(record_type, body, count, base_offset, base_timestamp) -> list of records"},
    {"append_record", append_record, METH_VARARGS,
     "append_record(body, offset_delta, timestamp_delta, key, value, headers=()) -> bytes appended"},
    {"append_tagged", append_tagged, METH_VARARGS,
     "append_tagged(body, records, start, offset_delta, base_timestamp, batch_size, prefix, offset_key, suffix, "
     "max_record_bytes)"
     " -> (next index, appended, bytes, max timestamp, value bytes, full)"},
    {"set_error_class", set_error_class, METH_O, "the exception raised for malformed records"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_speedups", "RecordBatch v2 record codec in C", -1,
                                    methods};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
