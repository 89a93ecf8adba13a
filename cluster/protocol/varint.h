/* Kafka's zigzag varint reader, shared by the optional C extensions (cluster/protocol/_speedups.c,
 * spark_aggregate/_columns.c). The including file defines `static int fail(const char *msg)`
 * (sets its exception, returns -1) before including this header. */
#ifndef DCMIRROR_VARINT_H
#define DCMIRROR_VARINT_H

#include <Python.h>
#include <stdint.h>

/* zigzag varint (up to 64 bits) at *pos, bounded by size; 0, or -1 with an exception set */
static int read_varint(const unsigned char *buf, Py_ssize_t size, Py_ssize_t *pos, int64_t *out) {
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t p = *pos;
    for (;;) {
        if (p >= size) return fail("varint runs past the end of the records");
        unsigned char b = buf[p++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) break;
        shift += 7;
        if (shift > 63) return fail("varint is too long");
    }
    *pos = p;
    *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
    return 0;
}

#endif
