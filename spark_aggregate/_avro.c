/* Confluent wire-format Avro values -> Arrow column buffers, a batch at a time, in C: the typed
 * tables' decoder (spark_aggregate/avro_batch.py compiles the programs and wraps the buffers;
 * spark_aggregate/typed.py keeps the per-record fastavro path, which the tests compare against).
 *
 * A "program" is the writer -> reader schema resolution of one writer schema, computed once in
 * Python as a tree of tuples (op, out, a, b, kids, const). Each reading node appends exactly one
 * value to its output ("out"), an Arrow array under construction laid out as Arrow expects
 * (LSB-first validity bitmaps, int32 offsets, little-endian values). The outputs form the
 * table's struct type, shared by every program, so records of several writers interleave in
 * one batch.
 *
 * A record the program cannot read exactly as fastavro would (truncated, bytes left over, a bad
 * union or enum index, a negative or too long length, invalid UTF-8, a value its column cannot
 * hold, a schema resolution error) is reported by row and the outputs of that call are not
 * used: the caller asks fastavro about those rows and decodes the others again without them.
 * Every length read from the input is checked against the bytes that remain before use; every
 * output buffer is bounded before it grows.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_BUFFER_BYTES ((Py_ssize_t)1 << 30) /* int32 offsets must not overflow */
#define MAX_OUT_LENGTH ((Py_ssize_t)1 << 28)   /* values per output array in one call */
#define MAX_DEPTH 64                            /* program nesting (schemas nest this deep at most) */
#define MAX_NODES 100000
#define MAX_OUTS 10000
#define MAX_ZERO_WIDTH_ITEMS 65536 /* items of an array/map block that take no bytes (nulls) */
#define WIRE_HEADER_BYTES 5

/* output kinds (avro_batch.py: OUT_*) */
enum { K_BOOL = 1, K_I32, K_I64, K_F32, K_F64, K_DEC128, K_BIN, K_LIST, K_MAP, K_STRUCT, K_LAST };

/* ops (avro_batch.py: OP_*) */
enum {
    OP_NUL = 1, OP_BOOL, OP_LONG_I32, OP_LONG_I64, OP_LONG_F32, OP_LONG_F64, OP_LONG_DATE, OP_LONG_TS_MILLIS,
    OP_LONG_TS_MICROS, OP_FLOAT_F32, OP_FLOAT_F64, OP_DOUBLE, OP_STRING, OP_BYTES, OP_FIXED, OP_DEC_BYTES,
    OP_DEC_FIXED, OP_ENUM, OP_ARRAY, OP_MAP, OP_RECORD, OP_UNION, OP_ERR, OP_CONST, OP_CONST_STRUCT,
    OP_CONST_LIST, OP_CONST_MAP,
    /* skips: writer-only data, no output */
    OP_SK_LONG, OP_SK_FIXED, OP_SK_BYTES, OP_SK_ARRAY, OP_SK_MAP, OP_SK_UNION, OP_SK_RECORD,
    OP_LAST
};

/* Python's datetime range (year 1 to 9999) in microseconds since 1970, and date's in days. */
#define MIN_MICROS INT64_C(-62135596800000000)
#define MAX_MICROS INT64_C(253402300799999999)
#define MIN_DAYS (1 - 719163)
#define MAX_DAYS (3652059 - 719163)

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

typedef struct {
    Buf bits;
    Py_ssize_t n;
    Py_ssize_t nulls;
} Bitmap;

typedef struct {
    int kind;
    int nkids;
    int *kids;
    int width;     /* fixed-width kinds: bytes per value */
    Py_ssize_t length;
    Bitmap valid;
    Bitmap bools;  /* K_BOOL values */
    Buf values;    /* fixed-width values */
    Buf offsets;   /* K_BIN, K_LIST, K_MAP: length + 1 int32 */
    Buf data;      /* K_BIN bytes */
} Out;

typedef struct Node {
    int op;
    int out;
    int64_t a, b;
    int nkids;
    struct Node **kids;
    const char *cdata; /* OP_CONST value bytes, OP_ENUM symbols */
    Py_ssize_t clen;
    Py_ssize_t *sym_off; /* OP_ENUM: (start, end) in cdata per symbol; end < start: not readable */
    int min_width;       /* bytes the node reads at least (0: may read nothing) */
} Node;

typedef struct {
    Out *outs;
    int nouts;
    Node *nodes;
    int nnodes, node_cap;
    Node **kid_slots;
    int nkid_slots, kid_cap;
    Py_ssize_t *sym_slots;
    Py_ssize_t nsym_slots, sym_cap;
    const char *why; /* why the current record was rejected */
    Py_ssize_t *scratch; /* map key duplicate check */
    Py_ssize_t scratch_cap;
} Ctx;

static int py_fail(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
}

/* ---- growable buffers ---------------------------------------------------------------------- */

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (more <= b->cap - b->len) return 0;
    if (more > MAX_BUFFER_BYTES - b->len) return py_fail("a batch decodes to more than 1 GiB of one column");
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more) cap *= 2;
    char *data = PyMem_Realloc(b->data, (size_t)cap);
    if (!data) { PyErr_NoMemory(); return -1; }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (n > b->cap - b->len && buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static inline int bitmap_put(Bitmap *m, int bit) {
    if ((m->n & 7) == 0) {
        char zero = 0;
        if (buf_put(&m->bits, &zero, 1) < 0) return -1;
    }
    if (bit) m->bits.data[m->n >> 3] |= (char)(1 << (m->n & 7));
    else m->nulls++;
    m->n++;
    return 0;
}

static void buf_free(Buf *b) { PyMem_Free(b->data); b->data = NULL; b->len = b->cap = 0; }

/* ---- outputs ------------------------------------------------------------------------------- */

static inline int out_grow(Out *o) {
    if (o->length >= MAX_OUT_LENGTH) return py_fail("a batch decodes to too many values in one column");
    o->length++;
    return 0;
}

static inline int put_offset(Out *o, Py_ssize_t end) {
    int32_t v = (int32_t)end;
    return buf_put(&o->offsets, &v, 4);
}

/* A value that is there but empty (pyarrow appends these to the children of a null struct):
 * 0, "", [], {} or a struct of those; `valid` 0 makes it null instead. */
static int out_empty(Ctx *c, Out *o, int valid) {
    static const char zeros[32] = {0};
    if (out_grow(o) < 0 || bitmap_put(&o->valid, valid) < 0) return -1;
    switch (o->kind) {
    case K_BOOL: return bitmap_put(&o->bools, 0);
    case K_BIN: return put_offset(o, o->data.len);
    case K_LIST: case K_MAP: {
        int32_t last;
        memcpy(&last, o->offsets.data + o->offsets.len - 4, 4);
        return put_offset(o, last);
    }
    case K_STRUCT:
        for (int i = 0; i < o->nkids; i++)
            if (out_empty(c, &c->outs[o->kids[i]], 1) < 0) return -1;
        return 0;
    default: return buf_put(&o->values, zeros, o->width);
    }
}

static inline int out_fixed(Out *o, const void *v) {
    if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0) return -1;
    return buf_put(&o->values, v, o->width);
}

static inline int out_bytes(Out *o, const unsigned char *src, Py_ssize_t n) {
    if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0 || buf_put(&o->data, src, n) < 0) return -1;
    return put_offset(o, o->data.len);
}

/* ---- reading ------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p, *end;
} Rd;

#define REJECT(ctx, msg) do { (ctx)->why = (msg); return 1; } while (0)
#define TRY(x) do { int rc_ = (x); if (rc_) return rc_; } while (0)

/* zigzag varint as fastavro reads it (bits past 64 dropped); longer than 10 bytes is rejected */
static inline int rd_long(Ctx *c, Rd *r, int64_t *out) {
    uint64_t n = 0;
    int shift = 0;
    const unsigned char *p = r->p;
    for (;;) {
        if (p >= r->end) REJECT(c, "varint runs past the end");
        unsigned char b = *p++;
        n |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
        if (shift > 63) REJECT(c, "varint longer than 10 bytes");
    }
    r->p = p;
    *out = (int64_t)((n >> 1) ^ (0 - (n & 1)));
    return 0;
}

static inline int rd_len(Ctx *c, Rd *r, Py_ssize_t *out) {
    int64_t n;
    TRY(rd_long(c, r, &n));
    if (n < 0) REJECT(c, "negative length");
    if (n > r->end - r->p) REJECT(c, "length runs past the end");
    *out = (Py_ssize_t)n;
    return 0;
}

/* Python's strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF. */
static int utf8_valid(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & UINT64_C(0x8080808080808080))) { i += 8; continue; }
        }
        unsigned char ch = s[i];
        if (ch < 0x80) { i++; continue; }
        if (ch < 0xC2) return 0;
        if (ch < 0xE0) {
            if (n - i < 2 || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
            continue;
        }
        if (ch < 0xF0) {
            if (n - i < 3) return 0;
            unsigned char c1 = s[i + 1];
            if ((ch == 0xE0 && c1 < 0xA0) || (ch == 0xED && c1 > 0x9F)) return 0;
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
            continue;
        }
        if (ch < 0xF5) {
            if (n - i < 4) return 0;
            unsigned char c1 = s[i + 1];
            if ((ch == 0xF0 && c1 < 0x90) || (ch == 0xF4 && c1 > 0x8F)) return 0;
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            i += 4;
            continue;
        }
        return 0;
    }
    return 1;
}

typedef __int128 i128;
typedef unsigned __int128 u128;

static u128 POW10[39];

/* Big-endian two's complement bytes -> Arrow decimal128, when they fit `precision` digits. */
static int put_decimal(Ctx *c, Out *o, const unsigned char *s, Py_ssize_t n, int64_t precision) {
    i128 v = 0;
    if (n > 0) {
        unsigned char sign = (s[0] & 0x80) ? 0xFF : 0x00;
        Py_ssize_t skip = n > 16 ? n - 16 : 0;
        for (Py_ssize_t i = 0; i < skip; i++)
            if (s[i] != sign) REJECT(c, "decimal wider than 128 bits");
        if (skip && ((s[skip] & 0x80) ? 0xFF : 0x00) != sign) REJECT(c, "decimal wider than 128 bits");
        u128 u = sign ? ~(u128)0 : 0;
        for (Py_ssize_t i = skip; i < n; i++) u = (u << 8) | s[i];
        v = (i128)u;
    }
    u128 mag = v < 0 ? (u128)0 - (u128)v : (u128)v;
    if (mag >= POW10[precision]) REJECT(c, "decimal has more digits than its precision");
    unsigned char le[16];
    u128 u = (u128)v;
    for (int i = 0; i < 16; i++) { le[i] = (unsigned char)(u & 0xFF); u >>= 8; }
    return out_fixed(o, le);
}

static int skip_node(Ctx *c, const Node *n, Rd *r);
static int read_node(Ctx *c, const Node *n, Rd *r);

/* An array or map block count; `items_width` 0 means items may take no bytes. */
static inline int block_count(Ctx *c, Rd *r, int items_width, int64_t *count, int skip_bytes, int *skipped) {
    int64_t n;
    *skipped = 0;
    TRY(rd_long(c, r, &n));
    if (n < 0) {
        if (n == INT64_MIN) REJECT(c, "block count out of range");
        n = -n;
        if (skip_bytes) {
            Py_ssize_t size;
            TRY(rd_len(c, r, &size));
            r->p += size;
            *skipped = 1;
            *count = n;
            return 0;
        }
        int64_t size_unused;
        TRY(rd_long(c, r, &size_unused));
    }
    if (items_width > 0 ? n > r->end - r->p : n > MAX_ZERO_WIDTH_ITEMS) REJECT(c, "block count runs past the end");
    *count = n;
    return 0;
}

/* Map keys within one map must differ: a dict keeps the last value of a repeated key, an
 * Arrow map would keep both (fastavro decides those records). */
static int keys_distinct(Ctx *c, Out *keys, Py_ssize_t first, Py_ssize_t end) {
    Py_ssize_t n = end - first;
    if (n < 2) return 1;
    const int32_t *off = (const int32_t *)keys->offsets.data;
    if (n <= 16) {
        for (Py_ssize_t i = first; i < end; i++)
            for (Py_ssize_t j = i + 1; j < end; j++) {
                int32_t li = off[i + 1] - off[i], lj = off[j + 1] - off[j];
                if (li == lj && memcmp(keys->data.data + off[i], keys->data.data + off[j], (size_t)li) == 0) return 0;
            }
        return 1;
    }
    Py_ssize_t cap = 64;
    while (cap < 2 * n) cap *= 2;
    if (cap > c->scratch_cap) {
        Py_ssize_t *s = PyMem_Realloc(c->scratch, (size_t)cap * sizeof(Py_ssize_t));
        if (!s) { PyErr_NoMemory(); return -1; }
        c->scratch = s;
        c->scratch_cap = cap;
    }
    for (Py_ssize_t i = 0; i < cap; i++) c->scratch[i] = -1;
    for (Py_ssize_t i = first; i < end; i++) {
        const unsigned char *k = (const unsigned char *)keys->data.data + off[i];
        int32_t len = off[i + 1] - off[i];
        uint64_t h = 1469598103934665603ULL;
        for (int32_t b = 0; b < len; b++) h = (h ^ k[b]) * 1099511628211ULL;
        Py_ssize_t slot = (Py_ssize_t)(h & (uint64_t)(cap - 1));
        while (c->scratch[slot] >= 0) {
            Py_ssize_t j = c->scratch[slot];
            if (off[j + 1] - off[j] == len && memcmp(keys->data.data + off[j], k, (size_t)len) == 0) return 0;
            slot = (slot + 1) & (cap - 1);
        }
        c->scratch[slot] = i;
    }
    return 1;
}

static int read_node(Ctx *c, const Node *n, Rd *r) {
    Out *o = n->out >= 0 ? &c->outs[n->out] : NULL;
    int64_t v;
    switch (n->op) {
    case OP_NUL:
        return out_empty(c, o, 0) < 0 ? -1 : 0;
    case OP_ERR:
        REJECT(c, "schema resolution error or a construct left to fastavro");
    case OP_BOOL: {
        if (r->p >= r->end) REJECT(c, "boolean runs past the end");
        int bit = *r->p++ != 0;
        if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0 || bitmap_put(&o->bools, bit) < 0) return -1;
        return 0;
    }
    case OP_LONG_I32: {
        TRY(rd_long(c, r, &v));
        if (v < INT32_MIN || v > INT32_MAX) REJECT(c, "int out of the int32 range");
        int32_t x = (int32_t)v;
        return out_fixed(o, &x) < 0 ? -1 : 0;
    }
    case OP_LONG_I64:
        TRY(rd_long(c, r, &v));
        return out_fixed(o, &v) < 0 ? -1 : 0;
    case OP_LONG_F32: {
        TRY(rd_long(c, r, &v));
        volatile double d = (double)v; /* Python: float(int), then Arrow casts the double */
        float x = (float)d;
        return out_fixed(o, &x) < 0 ? -1 : 0;
    }
    case OP_LONG_F64: {
        TRY(rd_long(c, r, &v));
        double x = (double)v;
        return out_fixed(o, &x) < 0 ? -1 : 0;
    }
    case OP_LONG_DATE: {
        TRY(rd_long(c, r, &v));
        if (v < MIN_DAYS || v > MAX_DAYS) REJECT(c, "date out of Python's range");
        int32_t x = (int32_t)v;
        return out_fixed(o, &x) < 0 ? -1 : 0;
    }
    case OP_LONG_TS_MILLIS:
        TRY(rd_long(c, r, &v));
        if (v < MIN_MICROS / 1000 || v > MAX_MICROS / 1000) REJECT(c, "timestamp out of Python's range");
        v *= 1000;
        return out_fixed(o, &v) < 0 ? -1 : 0;
    case OP_LONG_TS_MICROS:
        TRY(rd_long(c, r, &v));
        if (v < MIN_MICROS || v > MAX_MICROS) REJECT(c, "timestamp out of Python's range");
        return out_fixed(o, &v) < 0 ? -1 : 0;
    case OP_FLOAT_F32: case OP_FLOAT_F64: {
        if (r->end - r->p < 4) REJECT(c, "float runs past the end");
        uint32_t bits = (uint32_t)r->p[0] | ((uint32_t)r->p[1] << 8) | ((uint32_t)r->p[2] << 16)
                        | ((uint32_t)r->p[3] << 24);
        r->p += 4;
        float f;
        if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu)) bits |= 0x00400000u; /* NaN, quieted */
        memcpy(&f, &bits, 4);
        if (n->op == OP_FLOAT_F32) return out_fixed(o, &f) < 0 ? -1 : 0;
        double d = (double)f;
        return out_fixed(o, &d) < 0 ? -1 : 0;
    }
    case OP_DOUBLE: {
        if (r->end - r->p < 8) REJECT(c, "double runs past the end");
        uint64_t bits = 0;
        for (int i = 7; i >= 0; i--) bits = (bits << 8) | r->p[i];
        r->p += 8;
        return out_fixed(o, &bits) < 0 ? -1 : 0;
    }
    case OP_STRING: case OP_BYTES: {
        Py_ssize_t len;
        TRY(rd_len(c, r, &len));
        if (n->op == OP_STRING && !utf8_valid(r->p, len)) REJECT(c, "string is not UTF-8");
        if (out_bytes(o, r->p, len) < 0) return -1;
        r->p += len;
        return 0;
    }
    case OP_FIXED:
        if (n->a > r->end - r->p) REJECT(c, "fixed runs past the end");
        if (out_bytes(o, r->p, (Py_ssize_t)n->a) < 0) return -1;
        r->p += n->a;
        return 0;
    case OP_DEC_BYTES: {
        Py_ssize_t len;
        TRY(rd_len(c, r, &len));
        const unsigned char *s = r->p;
        r->p += len;
        return put_decimal(c, o, s, len, n->a);
    }
    case OP_DEC_FIXED: {
        if (n->b > r->end - r->p) REJECT(c, "fixed runs past the end");
        const unsigned char *s = r->p;
        r->p += n->b;
        return put_decimal(c, o, s, (Py_ssize_t)n->b, n->a);
    }
    case OP_ENUM: {
        TRY(rd_long(c, r, &v));
        if (v < 0 || v >= n->a) REJECT(c, "enum index out of range");
        Py_ssize_t start = n->sym_off[2 * v], end = n->sym_off[2 * v + 1];
        if (end < start) REJECT(c, "enum symbol not in the reader's symbols");
        return out_bytes(o, (const unsigned char *)n->cdata + start, end - start) < 0 ? -1 : 0;
    }
    case OP_ARRAY: case OP_MAP: {
        Out *child = &c->outs[o->kids[0]];
        Out *keys = n->op == OP_MAP ? &c->outs[child->kids[0]] : NULL;
        Py_ssize_t first = child->length;
        int64_t count;
        int skipped;
        for (;;) {
            TRY(block_count(c, r, n->kids[0]->min_width + (keys != NULL), &count, 0, &skipped));
            if (count == 0) break;
            for (int64_t i = 0; i < count; i++) {
                if (keys) {
                    Py_ssize_t len;
                    TRY(rd_len(c, r, &len));
                    if (!utf8_valid(r->p, len)) REJECT(c, "map key is not UTF-8");
                    if (out_bytes(keys, r->p, len) < 0) return -1;
                    r->p += len;
                    if (out_grow(child) < 0 || bitmap_put(&child->valid, 1) < 0) return -1;
                }
                TRY(read_node(c, n->kids[0], r));
            }
        }
        if (keys) {
            int d = keys_distinct(c, keys, first, child->length);
            if (d < 0) return -1;
            if (!d) REJECT(c, "map key repeated");
        }
        if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0) return -1;
        return put_offset(o, child->length);
    }
    case OP_RECORD: case OP_CONST_STRUCT:
        for (int i = 0; i < n->nkids; i++) {
            const Node *k = n->kids[i];
            TRY(k->out >= 0 ? read_node(c, k, r) : skip_node(c, k, r));
        }
        if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0) return -1;
        return 0;
    case OP_UNION:
        TRY(rd_long(c, r, &v));
        if (v < 0 || v >= n->nkids) REJECT(c, "union index out of range");
        return read_node(c, n->kids[v], r);
    case OP_CONST:
        if (o->kind == K_BOOL) {
            int bit = n->clen > 0 && n->cdata[0] != 0;
            if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0 || bitmap_put(&o->bools, bit) < 0) return -1;
            return 0;
        }
        if (o->kind == K_BIN) return out_bytes(o, (const unsigned char *)n->cdata, n->clen) < 0 ? -1 : 0;
        return out_fixed(o, n->cdata) < 0 ? -1 : 0;
    case OP_CONST_LIST: case OP_CONST_MAP: {
        Out *child = &c->outs[o->kids[0]];
        for (int i = 0; i < n->nkids; i++) {
            TRY(read_node(c, n->kids[i], r));
            if (n->op == OP_CONST_MAP && i % 2 == 1 && (out_grow(child) < 0 || bitmap_put(&child->valid, 1) < 0))
                return -1;
        }
        if (out_grow(o) < 0 || bitmap_put(&o->valid, 1) < 0) return -1;
        return put_offset(o, child->length);
    }
    default:
        return py_fail("avro program: unknown op");
    }
}

static int skip_node(Ctx *c, const Node *n, Rd *r) {
    int64_t v;
    Py_ssize_t len;
    switch (n->op) {
    case OP_SK_LONG:
        return rd_long(c, r, &v);
    case OP_SK_FIXED:
        if (n->a > r->end - r->p) REJECT(c, "skipped value runs past the end");
        r->p += n->a;
        return 0;
    case OP_SK_BYTES:
        TRY(rd_len(c, r, &len));
        r->p += len;
        return 0;
    case OP_SK_ARRAY: case OP_SK_MAP: {
        int64_t count;
        int skipped;
        for (;;) {
            TRY(block_count(c, r, n->kids[0]->min_width + (n->op == OP_SK_MAP), &count, 1, &skipped));
            if (count == 0) break;
            if (skipped) continue;
            for (int64_t i = 0; i < count; i++) {
                if (n->op == OP_SK_MAP) {
                    TRY(rd_len(c, r, &len));
                    r->p += len;
                }
                TRY(skip_node(c, n->kids[0], r));
            }
        }
        return 0;
    }
    case OP_SK_UNION:
        TRY(rd_long(c, r, &v));
        if (v < 0 || v >= n->nkids) REJECT(c, "union index out of range");
        return skip_node(c, n->kids[v], r);
    case OP_SK_RECORD:
        for (int i = 0; i < n->nkids; i++) TRY(skip_node(c, n->kids[i], r));
        return 0;
    default:
        return py_fail("avro program: unknown skip op");
    }
}

/* ---- programs from Python ------------------------------------------------------------------- */

static void ctx_free(Ctx *c) {
    if (c->outs) {
        for (int i = 0; i < c->nouts; i++) {
            Out *o = &c->outs[i];
            buf_free(&o->valid.bits); buf_free(&o->bools.bits); buf_free(&o->values);
            buf_free(&o->offsets); buf_free(&o->data);
            PyMem_Free(o->kids);
        }
    }
    PyMem_Free(c->outs);
    PyMem_Free(c->nodes);
    PyMem_Free(c->kid_slots);
    PyMem_Free(c->sym_slots);
    PyMem_Free(c->scratch);
    memset(c, 0, sizeof(*c));
}

static int kind_width(int kind) {
    switch (kind) {
    case K_I32: case K_F32: return 4;
    case K_I64: case K_F64: return 8;
    case K_DEC128: return 16;
    default: return 0;
    }
}

/* outs: tuple of (kind, (kid index, ...)); a tree in pre-order, root 0 a struct. */
static int parse_outs(Ctx *c, PyObject *outs) {
    if (!PyTuple_Check(outs)) return py_fail("outs must be a tuple");
    Py_ssize_t n = PyTuple_GET_SIZE(outs);
    if (n < 1 || n > MAX_OUTS) return py_fail("outs: 1 to 10,000 arrays");
    c->outs = PyMem_Calloc((size_t)n, sizeof(Out));
    if (!c->outs) { PyErr_NoMemory(); return -1; }
    c->nouts = (int)n;
    char *parented = PyMem_Calloc((size_t)n, 1);
    if (!parented) { PyErr_NoMemory(); return -1; }
    int rc = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind;
        PyObject *kids;
        PyObject *item = PyTuple_GET_ITEM(outs, i);
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "iO!", &kind, &PyTuple_Type, &kids)) {
            if (!PyErr_Occurred()) py_fail("outs: (kind, kids) tuples");
            goto done;
        }
        if (kind < K_BOOL || kind >= K_LAST) { py_fail("outs: unknown kind"); goto done; }
        Out *o = &c->outs[i];
        o->kind = kind;
        o->width = kind_width(kind);
        Py_ssize_t nk = PyTuple_GET_SIZE(kids);
        int want = kind == K_LIST || kind == K_MAP ? 1 : kind == K_STRUCT ? -1 : 0;
        if ((want >= 0 && nk != want) || nk > MAX_OUTS) { py_fail("outs: wrong number of children"); goto done; }
        o->nkids = (int)nk;
        o->kids = PyMem_Calloc((size_t)(nk ? nk : 1), sizeof(int));
        if (!o->kids) { PyErr_NoMemory(); goto done; }
        for (Py_ssize_t k = 0; k < nk; k++) {
            long idx = PyLong_AsLong(PyTuple_GET_ITEM(kids, k));
            if (idx == -1 && PyErr_Occurred()) goto done;
            if (idx <= i || idx >= n || parented[idx]) { py_fail("outs: children must follow their parent, once"); goto done; }
            parented[idx] = 1;
            o->kids[k] = (int)idx;
        }
        if (kind == K_BIN || kind == K_LIST || kind == K_MAP) {
            int32_t zero = 0;
            if (buf_put(&o->offsets, &zero, 4) < 0) goto done;
        }
    }
    if (c->outs[0].kind != K_STRUCT) { py_fail("outs: the root must be a struct"); goto done; }
    for (int i = 0; i < c->nouts; i++) {
        Out *o = &c->outs[i];
        if (o->kind == K_MAP) {
            Out *e = &c->outs[o->kids[0]];
            if (e->kind != K_STRUCT || e->nkids != 2 || c->outs[e->kids[0]].kind != K_BIN) {
                py_fail("outs: a map's child is a struct of a binary key and a value");
                goto done;
            }
        }
    }
    rc = 0;
done:
    PyMem_Free(parented);
    return rc;
}

static int is_child(const Ctx *c, int parent, int kid) {
    const Out *o = &c->outs[parent];
    for (int i = 0; i < o->nkids; i++)
        if (o->kids[i] == kid) return 1;
    return 0;
}

static Node *parse_node(Ctx *c, PyObject *t, int depth);

static int is_skip(int op) { return op >= OP_SK_LONG && op < OP_LAST; }

/* Which output kinds an op writes; 0: any. */
static int op_kind_ok(int op, int kind) {
    switch (op) {
    case OP_NUL: case OP_ERR: case OP_UNION: return 1;
    case OP_BOOL: return kind == K_BOOL;
    case OP_LONG_I32: case OP_LONG_DATE: return kind == K_I32;
    case OP_LONG_I64: case OP_LONG_TS_MILLIS: case OP_LONG_TS_MICROS: return kind == K_I64;
    case OP_LONG_F32: case OP_FLOAT_F32: return kind == K_F32;
    case OP_LONG_F64: case OP_FLOAT_F64: case OP_DOUBLE: return kind == K_F64;
    case OP_STRING: case OP_BYTES: case OP_FIXED: case OP_ENUM: return kind == K_BIN;
    case OP_DEC_BYTES: case OP_DEC_FIXED: return kind == K_DEC128;
    case OP_ARRAY: case OP_CONST_LIST: return kind == K_LIST;
    case OP_MAP: case OP_CONST_MAP: return kind == K_MAP;
    case OP_RECORD: case OP_CONST_STRUCT: return kind == K_STRUCT;
    case OP_CONST: return kind != K_LIST && kind != K_MAP && kind != K_STRUCT;
    default: return 0;
    }
}

static Node *parse_node(Ctx *c, PyObject *t, int depth) {
    if (depth > MAX_DEPTH) { py_fail("avro program nests too deep"); return NULL; }
    if (c->nnodes >= c->node_cap) { py_fail("avro program has too many nodes"); return NULL; }
    int op, out;
    long long a, b;
    PyObject *kids, *cst;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "iiLLO!O", &op, &out, &a, &b, &PyTuple_Type, &kids, &cst)) {
        if (!PyErr_Occurred()) py_fail("avro program: (op, out, a, b, kids, const) tuples");
        return NULL;
    }
    if (op < OP_NUL || op >= OP_LAST) { py_fail("avro program: unknown op"); return NULL; }
    if (is_skip(op) ? out != -1 : (out < 0 || out >= c->nouts || !op_kind_ok(op, c->outs[out].kind))) {
        py_fail("avro program: an op's output does not fit it");
        return NULL;
    }
    Node *n = &c->nodes[c->nnodes++];
    n->op = op;
    n->out = out;
    n->a = a;
    n->b = b;
    Py_ssize_t nk = PyTuple_GET_SIZE(kids);
    if (nk > MAX_NODES) { py_fail("avro program: too many children"); return NULL; }
    if (c->nkid_slots + nk > c->kid_cap) { py_fail("avro program: node table full"); return NULL; }
    n->kids = c->kid_slots + c->nkid_slots;
    n->nkids = (int)nk;
    c->nkid_slots += (int)nk;
    for (Py_ssize_t i = 0; i < nk; i++) {
        n->kids[i] = parse_node(c, PyTuple_GET_ITEM(kids, i), depth + 1);
        if (!n->kids[i]) return NULL;
    }
    const Out *o = out >= 0 ? &c->outs[out] : NULL;
    /* Every reading node writes one value to its output, so the kids must write the children. */
    switch (op) {
    case OP_FIXED: case OP_SK_FIXED:
        if (a < 0 || a > MAX_BUFFER_BYTES) { py_fail("avro program: fixed size out of range"); return NULL; }
        break;
    case OP_DEC_BYTES: case OP_DEC_FIXED:
        if (a < 1 || a > 38 || (op == OP_DEC_FIXED && (b < 0 || b > MAX_BUFFER_BYTES))) {
            py_fail("avro program: decimal precision or size out of range");
            return NULL;
        }
        break;
    case OP_ARRAY: case OP_MAP: {
        int want = o->kind == K_LIST ? o->kids[0] : c->outs[o->kids[0]].kids[1];
        if (nk != 1 || n->kids[0]->out != want) { py_fail("avro program: items must write the child"); return NULL; }
        break;
    }
    case OP_CONST_LIST: case OP_CONST_MAP:
        for (Py_ssize_t i = 0; i < nk; i++) {
            const Node *k = n->kids[i];
            int want = o->kind == K_LIST ? o->kids[0] : c->outs[o->kids[0]].kids[i % 2];
            if (k->out != want || is_skip(k->op)) { py_fail("avro program: items must write the child"); return NULL; }
        }
        if (op == OP_CONST_MAP && nk % 2) { py_fail("avro program: a map constant of key/value pairs"); return NULL; }
        break;
    case OP_RECORD: case OP_CONST_STRUCT: {
        char seen[MAX_OUTS / 8 + 1];
        memset(seen, 0, sizeof(seen));
        int written = 0;
        for (Py_ssize_t i = 0; i < nk; i++) {
            const Node *k = n->kids[i];
            if (k->out < 0) {
                if (op == OP_CONST_STRUCT) { py_fail("avro program: skip in a constant"); return NULL; }
                continue;
            }
            if (!is_child(c, out, k->out) || (seen[k->out >> 3] & (1 << (k->out & 7)))) {
                py_fail("avro program: a record must write each field of its struct once");
                return NULL;
            }
            seen[k->out >> 3] |= (char)(1 << (k->out & 7));
            written++;
        }
        if (written != o->nkids) { py_fail("avro program: a record must write each field of its struct once"); return NULL; }
        break;
    }
    case OP_UNION:
        for (Py_ssize_t i = 0; i < nk; i++)
            if (n->kids[i]->out != out) { py_fail("avro program: union branches write the union's output"); return NULL; }
        break;
    case OP_SK_ARRAY: case OP_SK_MAP:
        if (nk != 1) { py_fail("avro program: skipped items"); return NULL; }
        /* fall through */
    case OP_SK_UNION: case OP_SK_RECORD:
        for (Py_ssize_t i = 0; i < nk; i++)
            if (!is_skip(n->kids[i]->op)) { py_fail("avro program: a skip skips its children"); return NULL; }
        break;
    case OP_CONST:
        if (!PyBytes_Check(cst)) { py_fail("avro program: a constant's value is bytes"); return NULL; }
        n->cdata = PyBytes_AS_STRING(cst);
        n->clen = PyBytes_GET_SIZE(cst);
        if (o->width && n->clen != o->width) { py_fail("avro program: constant of the wrong width"); return NULL; }
        break;
    case OP_ENUM: {
        /* cst: tuple of bytes (the symbol) or None (not readable) per writer index */
        if (!PyTuple_Check(cst)) { py_fail("avro program: enum symbols"); return NULL; }
        Py_ssize_t ns = PyTuple_GET_SIZE(cst);
        if (ns != a || 2 * ns > c->sym_cap - c->nsym_slots) { py_fail("avro program: enum symbols"); return NULL; }
        n->sym_off = c->sym_slots + c->nsym_slots; /* filled by fill_enums */
        c->nsym_slots += 2 * ns;
        break;
    }
    default:
        if (nk) { py_fail("avro program: unexpected children"); return NULL; }
    }
    /* the fewest bytes the node can read: zero-width items are bounded separately */
    switch (op) {
    case OP_NUL: case OP_ERR: case OP_CONST: case OP_CONST_STRUCT: case OP_CONST_LIST: case OP_CONST_MAP:
        n->min_width = 0;
        break;
    case OP_FIXED: case OP_SK_FIXED: n->min_width = a > 0; break;
    case OP_DEC_FIXED: n->min_width = b > 0; break;
    case OP_RECORD: case OP_SK_RECORD:
        n->min_width = 0;
        for (int i = 0; i < n->nkids; i++) n->min_width |= n->kids[i]->min_width;
        break;
    default: n->min_width = 1;
    }
    return n;
}

/* Enum symbols: one bytes object holding them end to end, offsets beside. */
static int enum_symbols(Ctx *c, Node *n, PyObject *cst, PyObject **joined) {
    Py_ssize_t ns = PyTuple_GET_SIZE(cst), total = 0;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *s = PyTuple_GET_ITEM(cst, i);
        if (s == Py_None) continue;
        if (!PyBytes_Check(s)) return py_fail("avro program: an enum symbol is bytes or None");
        total += PyBytes_GET_SIZE(s);
    }
    *joined = PyBytes_FromStringAndSize(NULL, total);
    if (!*joined) return -1;
    char *dst = PyBytes_AS_STRING(*joined);
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *s = PyTuple_GET_ITEM(cst, i);
        if (s == Py_None) { /* end before start: not readable */
            n->sym_off[2 * i] = 0;
            n->sym_off[2 * i + 1] = -1;
            continue;
        }
        memcpy(dst + pos, PyBytes_AS_STRING(s), (size_t)PyBytes_GET_SIZE(s));
        n->sym_off[2 * i] = pos;
        pos += PyBytes_GET_SIZE(s);
        n->sym_off[2 * i + 1] = pos;
    }
    n->cdata = dst;
    n->clen = total;
    return 0;
}

/* The enum nodes' symbol tables, after parsing (walks the tuples again in the same order). */
static int fill_enums(Ctx *c, PyObject *t, int *next, PyObject *keep) {
    Node *n = &c->nodes[(*next)++];
    PyObject *kids = PyTuple_GET_ITEM(t, 4);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kids); i++)
        if (fill_enums(c, PyTuple_GET_ITEM(kids, i), next, keep) < 0) return -1;
    if (n->op == OP_ENUM) {
        PyObject *joined;
        if (enum_symbols(c, n, PyTuple_GET_ITEM(t, 5), &joined) < 0) return -1;
        int rc = PyList_Append(keep, joined);
        Py_DECREF(joined);
        if (rc < 0) return -1;
    }
    return 0;
}

static Py_ssize_t count_nodes(PyObject *t, int depth, Py_ssize_t *kids_total, Py_ssize_t *syms_total) {
    if (depth > MAX_DEPTH) return py_fail("avro program nests too deep");
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 6 || !PyTuple_Check(PyTuple_GET_ITEM(t, 4)))
        return py_fail("avro program: (op, out, a, b, kids, const) tuples");
    PyObject *kids = PyTuple_GET_ITEM(t, 4), *cst = PyTuple_GET_ITEM(t, 5);
    Py_ssize_t n = 1;
    *kids_total += PyTuple_GET_SIZE(kids);
    if (PyTuple_Check(cst)) *syms_total += 2 * PyTuple_GET_SIZE(cst);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kids); i++) {
        Py_ssize_t k = count_nodes(PyTuple_GET_ITEM(kids, i), depth + 1, kids_total, syms_total);
        if (k < 0) return -1;
        n += k;
        if (n > MAX_NODES) return py_fail("avro program has too many nodes");
    }
    return n;
}

/* ---- the module's functions ----------------------------------------------------------------- */

static PyObject *bytes_of(Buf *b) { return PyBytes_FromStringAndSize(b->data ? b->data : "", b->len); }

static int view_of(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

/* wire_ids(offsets, data, validity or None, first, n) -> bytes of n int64: the schema id of each
 * value in the wire format, or -1 (no value), -2 (shorter than the 5-byte header), -3 (a magic
 * byte other than 0). `offsets`/`data`/`validity` are an Arrow binary array's buffers. */
static PyObject *wire_ids(PyObject *self, PyObject *args) {
    PyObject *o_obj, *d_obj, *v_obj;
    Py_ssize_t first, n;
    if (!PyArg_ParseTuple(args, "OOOnn", &o_obj, &d_obj, &v_obj, &first, &n)) return NULL;
    Py_buffer ov = {0}, dv = {0}, vv = {0};
    PyObject *result = NULL;
    if (view_of(o_obj, &ov) < 0) return NULL;
    if (view_of(d_obj, &dv) < 0) goto done;
    if (v_obj != Py_None && view_of(v_obj, &vv) < 0) goto done;
    if (first < 0 || n < 0 || first > PY_SSIZE_T_MAX / 4 - n - 1 || (first + n + 1) * 4 > ov.len
        || (vv.buf && (first + n + 7) / 8 > vv.len)) {
        py_fail("wire_ids: buffers shorter than the rows");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, n * 8);
    if (!result) goto done;
    int64_t *ids = (int64_t *)PyBytes_AS_STRING(result);
    const int32_t *off = (const int32_t *)ov.buf + first;
    const unsigned char *data = dv.buf;
    const unsigned char *valid = vv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t bit = first + i;
        if (valid && !(valid[bit >> 3] & (1 << (bit & 7)))) { ids[i] = -1; continue; }
        int32_t s = off[i], e = off[i + 1];
        if (s < 0 || e < s || e > dv.len) { Py_CLEAR(result); py_fail("wire_ids: offsets out of range"); goto done; }
        if (e - s < WIRE_HEADER_BYTES) { ids[i] = -2; continue; }
        const unsigned char *v = data + s;
        if (v[0] != 0) { ids[i] = -3; continue; }
        ids[i] = ((int64_t)v[1] << 24) | ((int64_t)v[2] << 16) | ((int64_t)v[3] << 8) | (int64_t)v[4];
    }
done:
    PyBuffer_Release(&ov);
    if (dv.obj) PyBuffer_Release(&dv);
    if (vv.obj) PyBuffer_Release(&vv);
    return result;
}

static PyObject *out_tuple(Out *o) {
    PyObject *valid = o->valid.nulls ? bytes_of(&o->valid.bits) : Py_NewRef(Py_None);
    PyObject *values = o->kind == K_BOOL ? bytes_of(&o->bools.bits)
                     : o->width ? bytes_of(&o->values) : Py_NewRef(Py_None);
    PyObject *offsets = (o->kind == K_BIN || o->kind == K_LIST || o->kind == K_MAP) ? bytes_of(&o->offsets)
                      : Py_NewRef(Py_None);
    PyObject *data = o->kind == K_BIN ? bytes_of(&o->data) : Py_NewRef(Py_None);
    if (!valid || !values || !offsets || !data) {
        Py_XDECREF(valid); Py_XDECREF(values); Py_XDECREF(offsets); Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(nnNNNN)", o->length, o->valid.nulls, valid, values, offsets, data);
}

/* The outputs hang together (every child as long as its parent says): checked after decoding,
 * before Python wraps the buffers. */
static int outs_consistent(Ctx *c) {
    for (int i = 0; i < c->nouts; i++) {
        Out *o = &c->outs[i];
        if (o->valid.n != o->length) return py_fail("avro decoder: validity length differs");
        if (o->kind == K_STRUCT)
            for (int k = 0; k < o->nkids; k++)
                if (c->outs[o->kids[k]].length != o->length) return py_fail("avro decoder: struct child length differs");
        if (o->kind == K_LIST || o->kind == K_MAP) {
            int32_t last;
            if (o->offsets.len != (o->length + 1) * 4) return py_fail("avro decoder: offsets length differs");
            memcpy(&last, o->offsets.data + o->offsets.len - 4, 4);
            if (last != c->outs[o->kids[0]].length) return py_fail("avro decoder: list child length differs");
        }
        if (o->kind == K_BIN && o->offsets.len != (o->length + 1) * 4) return py_fail("avro decoder: offsets length differs");
        if (o->width && o->values.len != o->length * o->width) return py_fail("avro decoder: values length differs");
        if (o->kind == K_BOOL && o->bools.n != o->length) return py_fail("avro decoder: values length differs");
    }
    return 0;
}

/* decode(outs, programs, offsets, data, first, program_of_row)
 *   -> (list of (length, nulls, validity, values, offsets, data) per output, [(row, why), ...])
 * program_of_row: bytes of n int32, the program of each row or -1 (not decoded). */
static PyObject *decode(PyObject *self, PyObject *args) {
    PyObject *outs, *programs, *o_obj, *d_obj, *p_obj;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "OO!OOnO", &outs, &PyTuple_Type, &programs, &o_obj, &d_obj, &first, &p_obj))
        return NULL;
    Ctx c;
    memset(&c, 0, sizeof(c));
    Py_buffer ov = {0}, dv = {0}, pv = {0};
    PyObject *result = NULL, *rejected = NULL, *keep = NULL, *out_list = NULL;
    Node **roots = NULL;
    if (view_of(o_obj, &ov) < 0) return NULL;
    if (view_of(d_obj, &dv) < 0 || view_of(p_obj, &pv) < 0) goto done;
    Py_ssize_t n = pv.len / 4;
    if (pv.len % 4 || first < 0 || first > PY_SSIZE_T_MAX / 4 - n - 1 || (first + n + 1) * 4 > ov.len) {
        py_fail("decode: buffers shorter than the rows");
        goto done;
    }
    if (parse_outs(&c, outs) < 0) goto done;
    Py_ssize_t np = PyTuple_GET_SIZE(programs), nodes = 0, kids = 0, syms = 0;
    for (Py_ssize_t i = 0; i < np; i++) {
        Py_ssize_t k = count_nodes(PyTuple_GET_ITEM(programs, i), 0, &kids, &syms);
        if (k < 0) goto done;
        nodes += k;
        if (nodes > MAX_NODES) { py_fail("avro programs have too many nodes"); goto done; }
    }
    c.nodes = PyMem_Calloc((size_t)(nodes ? nodes : 1), sizeof(Node));
    c.kid_slots = PyMem_Calloc((size_t)(kids ? kids : 1), sizeof(Node *));
    c.sym_slots = PyMem_Calloc((size_t)(syms ? syms : 1), sizeof(Py_ssize_t));
    roots = PyMem_Calloc((size_t)(np ? np : 1), sizeof(Node *));
    keep = PyList_New(0);
    if (!c.nodes || !c.kid_slots || !c.sym_slots || !roots) { PyErr_NoMemory(); goto done; }
    if (!keep) goto done;
    c.kid_cap = (int)kids;
    c.node_cap = (int)nodes;
    c.sym_cap = syms;
    for (Py_ssize_t i = 0; i < np; i++) {
        int start = c.nnodes;
        roots[i] = parse_node(&c, PyTuple_GET_ITEM(programs, i), 0);
        if (!roots[i]) goto done;
        if (roots[i]->op != OP_RECORD || roots[i]->out != 0) { py_fail("decode: a program reads a record into the root"); goto done; }
        int next = start;
        if (fill_enums(&c, PyTuple_GET_ITEM(programs, i), &next, keep) < 0) goto done;
    }
    rejected = PyList_New(0);
    if (!rejected) goto done;
    const int32_t *off = (const int32_t *)ov.buf + first;
    const int32_t *prog = pv.buf;
    const unsigned char *data = dv.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t p = prog[i];
        if (p < 0) continue;
        if (p >= np) { py_fail("decode: program index out of range"); goto done; }
        int32_t s = off[i], e = off[i + 1];
        if (s < 0 || e < s || e > dv.len || e - s < WIRE_HEADER_BYTES) { py_fail("decode: a row's value is not a wire-format value"); goto done; }
        Rd r = {data + s + WIRE_HEADER_BYTES, data + e};
        c.why = NULL;
        int rc = read_node(&c, roots[p], &r);
        if (rc < 0) goto done;
        if (rc == 0 && r.p != r.end) { rc = 1; c.why = "bytes left after the record"; }
        if (rc) {
            PyObject *item = Py_BuildValue("(ns)", i, c.why ? c.why : "rejected");
            if (!item || PyList_Append(rejected, item) < 0) { Py_XDECREF(item); goto done; }
            Py_DECREF(item);
        }
    }
    if (PyList_GET_SIZE(rejected) == 0 && outs_consistent(&c) < 0) goto done;
    out_list = PyList_New(c.nouts);
    if (!out_list) goto done;
    for (int i = 0; i < c.nouts; i++) {
        PyObject *t = PyList_GET_SIZE(rejected) ? Py_NewRef(Py_None) : out_tuple(&c.outs[i]);
        if (!t) goto done;
        PyList_SET_ITEM(out_list, i, t);
    }
    result = Py_BuildValue("(OO)", out_list, rejected);
done:
    Py_XDECREF(out_list);
    Py_XDECREF(rejected);
    Py_XDECREF(keep);
    PyMem_Free(roots);
    ctx_free(&c);
    PyBuffer_Release(&ov);
    if (dv.obj) PyBuffer_Release(&dv);
    if (pv.obj) PyBuffer_Release(&pv);
    return result;
}

static PyMethodDef methods[] = {
    {"wire_ids", wire_ids, METH_VARARGS, "wire_ids(offsets, data, validity, first, n) -> int64 schema ids or codes"},
    {"decode", decode, METH_VARARGS,
     "decode(outs, programs, offsets, data, first, program_of_row) -> (output buffers, rejected rows)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro", "Wire-format Avro values to Arrow buffers in C",
                                    -1, methods};

PyMODINIT_FUNC PyInit__avro(void) {
    POW10[0] = 1;
    for (int i = 1; i < 39; i++) POW10[i] = POW10[i - 1] * 10;
    return PyModule_Create(&module);
}
