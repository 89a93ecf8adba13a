/* Fetched record batches -> Arrow column buffers, in C: the per-record loop of the Spark
 * data source (spark_aggregate/columns.py has the reference Python builder; the tests keep
 * both equal). One call handles a whole fetched chunk: it walks the batch headers, skips
 * control batches and records outside [start, end), inflates compressed batches through
 * the `decompress(codec, bytes)` callable it is given, and appends every wanted record to
 * growable buffers laid out as Arrow expects (int32 offsets, LSB-first validity bitmaps).
 *
 * Every length read from the input is checked against the bytes that remain before use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BATCH_HEADER_SIZE 61
#define LOG_OVERHEAD 12
#define CONTROL_MASK 0x20
#define TIMESTAMP_TYPE_MASK 0x08
#define COMPRESSION_MASK 0x07
#define WANT_HEADERS 1
#define WANT_PROVENANCE 2
#define MAX_BUFFER_BYTES ((Py_ssize_t)1 << 30) /* int32 offsets must not overflow */

static PyObject *InvalidRecordBatch = NULL;

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int fail(const char *msg) {
    PyErr_SetString(InvalidRecordBatch ? InvalidRecordBatch : PyExc_ValueError, msg);
    return -1;
}

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (b->len + more <= b->cap) return 0;
    if (b->len + more > MAX_BUFFER_BYTES) return fail("a fetched chunk decodes to more than 1 GiB of one column");
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (!data) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static int put_i32(Buf *b, int32_t v) { return buf_put(b, &v, 4); }
static int put_i64(Buf *b, int64_t v) { return buf_put(b, &v, 8); }

/* A validity bitmap: bit i set when row i is valid. */
typedef struct {
    Buf bits;
    Py_ssize_t n;
    Py_ssize_t nulls;
} Bitmap;

static int bitmap_put(Bitmap *m, int valid) {
    if ((m->n & 7) == 0) {
        char zero = 0;
        if (buf_put(&m->bits, &zero, 1) < 0) return -1;
    }
    if (valid) m->bits.data[m->n >> 3] |= (char)(1 << (m->n & 7));
    else m->nulls++;
    m->n++;
    return 0;
}

/* A fixed-width column that may hold nulls: values, validity. */
typedef struct {
    Buf values;
    Bitmap valid;
} Fixed;

static int fixed_put_i32(Fixed *c, int valid, int32_t v) {
    if (put_i32(&c->values, valid ? v : 0) < 0) return -1;
    return bitmap_put(&c->valid, valid);
}

static int fixed_put_i64(Fixed *c, int valid, int64_t v) {
    if (put_i64(&c->values, valid ? v : 0) < 0) return -1;
    return bitmap_put(&c->valid, valid);
}

/* A binary/string column: offsets (n + 1 int32), data, validity. */
typedef struct {
    Buf offsets;
    Buf data;
    Bitmap valid;
} Binary;

static int binary_init(Binary *c) { return put_i32(&c->offsets, 0); }

static int binary_put(Binary *c, const unsigned char *src, int64_t n) {
    if (n < 0) {
        if (bitmap_put(&c->valid, 0) < 0) return -1;
    } else {
        if (bitmap_put(&c->valid, 1) < 0) return -1;
        if (buf_put(&c->data, src, (Py_ssize_t)n) < 0) return -1;
    }
    return put_i32(&c->offsets, (int32_t)c->data.len);
}

typedef struct {
    Buf offset, timestamp, type;
    Binary key, value;
    Buf header_list; /* n + 1 int32 */
    Binary header_key, header_value;
    Binary cluster, src_topic_id;
    Fixed src_partition, src_offset, src_leader_epoch;
    Bitmap fence;
    Py_ssize_t rows;
    Py_ssize_t size_bytes;
} Columns;

static void buf_free(Buf *b) { PyMem_Free(b->data); b->data = NULL; }

static void fixed_free(Fixed *c) {
    buf_free(&c->values);
    buf_free(&c->valid.bits);
}

static void binary_free(Binary *c) {
    buf_free(&c->offsets);
    buf_free(&c->data);
    buf_free(&c->valid.bits);
}

static void columns_free(Columns *c) {
    buf_free(&c->offset); buf_free(&c->timestamp); buf_free(&c->type);
    binary_free(&c->key); binary_free(&c->value);
    buf_free(&c->header_list); binary_free(&c->header_key); binary_free(&c->header_value);
    binary_free(&c->cluster); binary_free(&c->src_topic_id);
    fixed_free(&c->src_partition); fixed_free(&c->src_offset); fixed_free(&c->src_leader_epoch);
    buf_free(&c->fence.bits);
}

#include "../cluster/protocol/varint.h"

/* A length-prefixed field at *pos: its start and length (-1 for null). */
static int read_field(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos, const unsigned char **start,
                      int64_t *len) {
    if (read_varint(buf, end, pos, len) < 0) return -1;
    if (*len < 0) { *len = -1; *start = NULL; return 0; }
    if (*len > end - *pos) return fail("record field runs past the end of the records");
    *start = buf + *pos;
    *pos += (Py_ssize_t)*len;
    return 0;
}

/* Text the reference decoder reads with errors="replace": invalid UTF-8 becomes U+FFFD. */
static int text_put(Binary *c, const unsigned char *src, int64_t n) {
    int ascii = 1;
    for (int64_t i = 0; i < n; i++) {
        if (src[i] & 0x80) { ascii = 0; break; }
    }
    if (ascii || n < 0) return binary_put(c, src, n);
    PyObject *text = PyUnicode_DecodeUTF8((const char *)src, (Py_ssize_t)n, "replace");
    if (!text) return -1;
    Py_ssize_t len;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
    int rc = utf8 ? binary_put(c, (const unsigned char *)utf8, len) : -1;
    Py_DECREF(text);
    return rc;
}

static int key_is(const unsigned char *k, int64_t n, const char *name) {
    size_t len = strlen(name);
    return n == (int64_t)len && memcmp(k, name, len) == 0;
}

/* Decimal text -> integer in [low, high]; 0 when it is not a plain (optionally negative)
 * number of at most 19 characters in that range (columns.py's _decimal_or_none). */
static int parse_decimal(const unsigned char *s, int64_t n, int64_t low, int64_t high, int64_t *out) {
    if (!s || n <= 0 || n > 19) return 0;
    int neg = 0;
    int64_t i = 0;
    uint64_t v = 0; /* at most 19 digits: below 10^19 < 2^64, no overflow */
    if (s[0] == '-') { neg = 1; i = 1; if (n == 1) return 0; }
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (neg) {
        /* at most 18 digits after the sign: v < 10^18 fits int64 */
        int64_t r = -(int64_t)v;
        if (r < low || r > high) return 0;
        *out = r;
    } else {
        if (v > (uint64_t)INT64_MAX || (int64_t)v > high) return 0;
        *out = (int64_t)v;
    }
    return 1;
}

static int decode_records(Columns *c, const unsigned char *buf, Py_ssize_t size, int64_t count, int64_t base_offset,
                          int64_t base_timestamp, int64_t log_append_time, int64_t start, int64_t end, int flags) {
    Py_ssize_t p = 0;
    int32_t ts_type = log_append_time >= 0 ? 1 : 0;
    if (count < 0 || count > size) return fail("record count does not fit the batch");
    for (int64_t i = 0; i < count; i++) {
        int64_t length, ts_delta, off_delta, n_headers;
        if (read_varint(buf, size, &p, &length) < 0) return -1;
        if (length < 0 || length > size - p) return fail("record length runs past the end of the batch");
        Py_ssize_t rec_end = p + (Py_ssize_t)length;
        if (p >= rec_end) return fail("record is empty");
        p += 1; /* attributes */
        if (read_varint(buf, rec_end, &p, &ts_delta) < 0) return -1;
        if (read_varint(buf, rec_end, &p, &off_delta) < 0) return -1;
        int64_t offset = base_offset + off_delta;
        if (offset < start || offset >= end) { p = rec_end; continue; }
        const unsigned char *key, *value;
        int64_t key_len, value_len;
        if (read_field(buf, rec_end, &p, &key, &key_len) < 0) return -1;
        if (read_field(buf, rec_end, &p, &value, &value_len) < 0) return -1;
        if (read_varint(buf, rec_end, &p, &n_headers) < 0) return -1;
        if (n_headers < 0 || n_headers > rec_end - p) return fail("record declares more headers than it has bytes");
        int64_t ts = log_append_time >= 0 ? log_append_time : base_timestamp + ts_delta;
        if (put_i64(&c->offset, offset) < 0 || put_i64(&c->timestamp, ts * 1000) < 0 || put_i32(&c->type, ts_type) < 0)
            return -1;
        if (binary_put(&c->key, key, key_len) < 0 || binary_put(&c->value, value, value_len) < 0) return -1;
        c->size_bytes += (key_len > 0 ? key_len : 0) + (value_len > 0 ? value_len : 0);
        const unsigned char *cluster = NULL, *topic_id = NULL;
        int64_t cluster_len = -1, topic_id_len = -1, src_partition = 0, src_offset = 0, src_epoch = 0;
        int has_partition = 0, has_offset = 0, has_epoch = 0, fence = 0;
        for (int64_t h = 0; h < n_headers; h++) {
            const unsigned char *hk, *hv;
            int64_t hk_len, hv_len;
            if (read_field(buf, rec_end, &p, &hk, &hk_len) < 0) return -1;
            if (read_field(buf, rec_end, &p, &hv, &hv_len) < 0) return -1;
            if (hk_len < 0) { hk = (const unsigned char *)""; hk_len = 0; }
            if (flags & WANT_PROVENANCE) {
                if (key_is(hk, hk_len, "dcmirror.source.cluster")) { cluster = hv; cluster_len = hv_len; continue; }
                if (key_is(hk, hk_len, "dcmirror.source.partition")) {
                    has_partition = parse_decimal(hv, hv_len, INT32_MIN, INT32_MAX, &src_partition);
                    continue;
                }
                if (key_is(hk, hk_len, "dcmirror.source.offset")) {
                    has_offset = parse_decimal(hv, hv_len, INT64_MIN, INT64_MAX, &src_offset);
                    continue;
                }
                if (key_is(hk, hk_len, "dcmirror.source.topic.id")) { topic_id = hv; topic_id_len = hv_len; continue; }
                if (key_is(hk, hk_len, "dcmirror.source.leader.epoch")) {
                    has_epoch = parse_decimal(hv, hv_len, INT32_MIN, INT32_MAX, &src_epoch);
                    continue;
                }
                if (key_is(hk, hk_len, "dcmirror.path")) continue;
                if (key_is(hk, hk_len, "dcmirror.fence")) fence = 1;
            }
            if (flags & WANT_HEADERS) {
                if (text_put(&c->header_key, hk, hk_len) < 0 || binary_put(&c->header_value, hv, hv_len) < 0)
                    return -1;
            }
        }
        if (p != rec_end) return fail("record length does not match its fields");
        if (flags & WANT_HEADERS) {
            int64_t entries = (int64_t)(c->header_key.offsets.len / 4) - 1;
            if (put_i32(&c->header_list, (int32_t)entries) < 0) return -1;
        }
        if (flags & WANT_PROVENANCE) {
            if (text_put(&c->cluster, cluster, cluster_len) < 0) return -1;
            if (fixed_put_i32(&c->src_partition, has_partition, (int32_t)src_partition) < 0) return -1;
            if (fixed_put_i64(&c->src_offset, has_offset, src_offset) < 0) return -1;
            if (text_put(&c->src_topic_id, topic_id, topic_id_len) < 0) return -1;
            if (fixed_put_i32(&c->src_leader_epoch, has_epoch, (int32_t)src_epoch) < 0) return -1;
            if (bitmap_put(&c->fence, 0) < 0) return -1;
            if (fence) c->fence.bits.data[(c->fence.n - 1) >> 3] |= (char)(1 << ((c->fence.n - 1) & 7));
        }
        c->rows++;
    }
    return 0;
}

static int64_t be64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | b[i];
    return (int64_t)v;
}

static int32_t be32(const unsigned char *b) {
    return (int32_t)(((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | (uint32_t)b[3]);
}

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len); }

static PyObject *bitmap_of(Bitmap *m) {
    if (m->nulls == 0) Py_RETURN_NONE;
    return bytes_of(&m->bits);
}

static PyObject *fixed_tuple(Fixed *c) {
    return Py_BuildValue("(NNn)", bytes_of(&c->values), bitmap_of(&c->valid), c->valid.nulls);
}

static PyObject *binary_tuple(Binary *c) {
    return Py_BuildValue("(NNNn)", bytes_of(&c->offsets), bytes_of(&c->data), bitmap_of(&c->valid), c->valid.nulls);
}

/* decode_chunk(data, start, end, flags, decompress) -> dict of column buffers */
static PyObject *decode_chunk(PyObject *self, PyObject *args) {
    Py_buffer view;
    long long start, end;
    int flags;
    PyObject *decompress;
    if (!PyArg_ParseTuple(args, "y*LLiO", &view, &start, &end, &flags, &decompress)) return NULL;
    Columns c;
    memset(&c, 0, sizeof(c));
    PyObject *result = NULL;
    const unsigned char *data = view.buf;
    Py_ssize_t size = view.len, pos = 0;
    if (binary_init(&c.key) < 0 || binary_init(&c.value) < 0 || put_i32(&c.header_list, 0) < 0
        || binary_init(&c.header_key) < 0 || binary_init(&c.header_value) < 0 || binary_init(&c.cluster) < 0
        || binary_init(&c.src_topic_id) < 0)
        goto done;
    while (pos + BATCH_HEADER_SIZE <= size) {
        const unsigned char *h = data + pos;
        int64_t base_offset = be64(h);
        int32_t batch_length = be32(h + 8);
        if (batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD) { fail("record batch length is too small"); goto done; }
        Py_ssize_t batch_end = pos + LOG_OVERHEAD + (Py_ssize_t)batch_length;
        if (batch_end > size) break; /* a partial batch at the end of a fetch */
        if (h[16] != 2) { fail("record batch magic is not 2"); goto done; }
        if (base_offset >= end) break;
        int attributes = (h[21] << 8) | h[22];
        int64_t last_offset = base_offset + be32(h + 23);
        int64_t base_timestamp = be64(h + 27), max_timestamp = be64(h + 35);
        int32_t count = be32(h + 57);
        if (last_offset >= start && !(attributes & CONTROL_MASK)) {
            int64_t log_append = (attributes & TIMESTAMP_TYPE_MASK) ? max_timestamp : -1;
            const unsigned char *body = h + BATCH_HEADER_SIZE;
            Py_ssize_t body_size = batch_end - pos - BATCH_HEADER_SIZE;
            int codec = attributes & COMPRESSION_MASK;
            if (codec) {
                PyObject *raw = PyBytes_FromStringAndSize((const char *)body, body_size);
                if (!raw) goto done;
                PyObject *inflated = PyObject_CallFunction(decompress, "iN", codec, raw);
                if (!inflated) goto done;
                if (!PyBytes_Check(inflated)) {
                    Py_DECREF(inflated);
                    PyErr_SetString(PyExc_TypeError, "decompress must return bytes");
                    goto done;
                }
                int rc = decode_records(&c, (const unsigned char *)PyBytes_AS_STRING(inflated), PyBytes_GET_SIZE(inflated),
                                        count, base_offset, base_timestamp, log_append, start, end, flags);
                Py_DECREF(inflated);
                if (rc < 0) goto done;
            } else if (decode_records(&c, body, body_size, count, base_offset, base_timestamp, log_append, start, end,
                                      flags) < 0) {
                goto done;
            }
        }
        pos = batch_end;
    }
    result = Py_BuildValue(
        "{s:n,s:n,s:N,s:N,s:N,s:N,s:N}",
        "rows", c.rows, "size_bytes", c.size_bytes,
        "offset", bytes_of(&c.offset), "timestamp", bytes_of(&c.timestamp), "type", bytes_of(&c.type),
        "key", binary_tuple(&c.key), "value", binary_tuple(&c.value));
    if (result && (flags & WANT_HEADERS)) {
        PyObject *headers = Py_BuildValue("(NNN)", bytes_of(&c.header_list), binary_tuple(&c.header_key),
                                          binary_tuple(&c.header_value));
        if (!headers || PyDict_SetItemString(result, "headers", headers) < 0) Py_CLEAR(result);
        Py_XDECREF(headers);
    }
    if (result && (flags & WANT_PROVENANCE)) {
        PyObject *prov = Py_BuildValue(
            "(NNNNNN)", binary_tuple(&c.cluster), fixed_tuple(&c.src_partition), fixed_tuple(&c.src_offset),
            binary_tuple(&c.src_topic_id), fixed_tuple(&c.src_leader_epoch), bytes_of(&c.fence.bits));
        if (!prov || PyDict_SetItemString(result, "provenance", prov) < 0) Py_CLEAR(result);
        Py_XDECREF(prov);
    }
done:
    columns_free(&c);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *set_error_class(PyObject *self, PyObject *cls) {
    Py_XSETREF(InvalidRecordBatch, Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_chunk", decode_chunk, METH_VARARGS,
     "decode_chunk(data, start, end, flags, decompress) -> column buffers of the records in [start, end)"},
    {"set_error_class", set_error_class, METH_O, "the exception raised for malformed records"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_columns", "Record batches to Arrow buffers in C", -1,
                                    methods};

PyMODINIT_FUNC PyInit__columns(void) { return PyModule_Create(&module); }
