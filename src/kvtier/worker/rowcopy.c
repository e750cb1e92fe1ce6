/* kvtier's row copy loop, built at install time as the file of the extension module
   kvtier.worker._rowcopy (pyproject.toml declares the build, optional: without a C
   compiler kvtier installs without it and the host copies run on numpy, byte for byte
   the same). A plain C library with no Python API, so that building it needs a C
   compiler and libc only, not Python's headers: rowcopy.py finds the file by the
   module's name and opens it with ctypes; nothing imports it as a module.

   One call copies one job: for each row i, for each fragment f,
       frag_bytes[f] bytes
       from src_base[f] + src_rows[i] * src_stride[f]
       to   dst_base[f] + dst_rows[i] * dst_stride[f].
   Rows are visited in order and, within a row, fragments in order, so a store writes
   each slab page front to back and a load reads it so.

   When every fragment's rows are packed on both sides (stride == frag_bytes), rows
   consecutive on both sides are merged into one longer copy.

   Before copying a row, one cache line in every 4 KiB page of the next row's source
   and destination is prefetched: with scattered rows the hardware prefetchers stop
   at page boundaries and each new page costs a page walk; touching the pages a row
   ahead overlaps that latency with the current copy (8 KiB rows, 4096 scattered,
   cold caches: store 6.8 -> 8.4 GB/s, load 9.5 -> 12.0).

   stream != 0 (the caller asks for it on jobs much larger than the caches): the
   destination is written with non-temporal stores, 16 bytes at a time, as glibc's
   memcpy does for one large copy; the job's destination then does not have to be read
   into the cache before it is overwritten, and it does not evict what is there. An
   sfence at the end orders those stores before anything the caller writes next (the
   lane reporting the job done). Without SSE2 (not x86-64), memmove throughout.

   Streaming, a row's fragments are copied WAYS (4) at a time, interleaved: STEP (256)
   bytes of the first, then of the second, ..., then the next 256 of the first. A
   store reads its fragments from WAYS different tensors, each row a few KiB at a
   random place; copied one after the other, the reads of one fragment wait on memory
   alone, while interleaved the WAYS read streams are in flight together (8 KiB rows,
   4 fragments, 4096 scattered rows, cold caches, CPU time: store 15.8 -> 12.2 ms,
   load 11.2 -> 10.9 ms; WAYS 8 no better). Each fragment's unaligned head and
   sub-64-byte tail are copied once, with memmove, before the interleaved bodies.

   Every row index is checked here, against each side's row count, before anything is
   copied (a wrong index would write out of bounds); the fragment table is checked
   against the tensors by rowcopy.py, which builds it once per route. memmove, not
   memcpy: the same speed here, and no undefined behaviour should a caller ever hand
   it overlapping memory (the streaming loop copies forward; the two sides of a
   kvtier job never overlap).

   One job is one call with three arguments: the route (fragment tables, row counts
   and the route's two row buffers, fixed between jobs), the row count and the store
   kind; ctypes converts each argument on every call, ~0.3 us apiece.

   Called through ctypes.CDLL, which releases the GIL for the call: two handler lanes
   copy at once. Nothing here touches Python. */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define KVTIER_ROWCOPY_ABI 5
#define PAGE 4096
#define WAYS 4   /* fragments streamed at once */
#define STEP 256 /* bytes of one fragment before the next one's */

int64_t kvtier_rowcopy_abi(void) { return KVTIER_ROWCOPY_ABI; }

#if defined(__SSE2__)
static void stream64(char *dst, const char *src, size_t n) { /* n % 64 == 0, dst 16-aligned */
    for (size_t k = 0; k < n; k += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + k));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + k + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + k + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + k + 48));
        _mm_stream_si128((__m128i *)(dst + k), a);
        _mm_stream_si128((__m128i *)(dst + k + 16), b);
        _mm_stream_si128((__m128i *)(dst + k + 32), c);
        _mm_stream_si128((__m128i *)(dst + k + 48), d);
    }
}
#endif

/* Streams WAYS pieces at once: the 16-byte-aligned bodies advance STEP bytes of each
   piece in turn, so WAYS source rows are read concurrently (see the header). */
static void copy_streaming(int64_t ways, char *const *dst, const char *const *src,
                           const size_t *len) {
#if defined(__SSE2__)
    char *to[WAYS];
    const char *from[WAYS];
    size_t body[WAYS], longest = 0;
    for (int64_t w = 0; w < ways; w++) {
        size_t n = len[w], head = (16 - ((uintptr_t)dst[w] & 15)) & 15;
        if (head > n) head = n;
        memmove(dst[w], src[w], head);
        to[w] = dst[w] + head;
        from[w] = src[w] + head;
        body[w] = (n - head) & ~(size_t)63;
        memmove(to[w] + body[w], from[w] + body[w], n - head - body[w]); /* the tail */
        if (body[w] > longest) longest = body[w];
    }
    for (size_t k = 0; k < longest; k += STEP) {
        for (int64_t w = 0; w < ways; w++) {
            if (k < body[w]) {
                stream64(to[w] + k, from[w] + k, body[w] - k < STEP ? body[w] - k : STEP);
            }
        }
    }
#else
    for (int64_t w = 0; w < ways; w++) memmove(dst[w], src[w], len[w]);
#endif
}

/* Everything about one route that is fixed between jobs (rowcopy.py fills it once;
   the row arrays are the route's own buffers, which it refills before each call). */
struct kvtier_route {
    int64_t n_frags;
    const uintptr_t *src_base;
    const int64_t *src_stride;
    const uintptr_t *dst_base;
    const int64_t *dst_stride;
    const int64_t *frag_bytes;
    int64_t src_limit; /* rows of the source side: every src_rows[i] must be below */
    int64_t dst_limit;
    const int64_t *src_rows;
    const int64_t *dst_rows;
};

static void copy_rows(const struct kvtier_route *r, int64_t n_rows, int32_t stream);

/* Copies rows 0..n_rows-1 of the route's row arrays, after checking every one: returns
   -1 when it copied, or, copying nothing, the index of the first row out of range:
   i for src_rows[i] (every source row is checked first), n_rows + i for dst_rows[i]. */
int64_t kvtier_copy_rows(const struct kvtier_route *r, int64_t n_rows, int32_t stream) {
    for (int64_t i = 0; i < n_rows; i++) { /* unsigned: a negative row is above any limit */
        if ((uint64_t)r->src_rows[i] >= (uint64_t)r->src_limit) return i;
    }
    for (int64_t i = 0; i < n_rows; i++) {
        if ((uint64_t)r->dst_rows[i] >= (uint64_t)r->dst_limit) return n_rows + i;
    }
    copy_rows(r, n_rows, stream);
    return -1;
}

static void copy_rows(const struct kvtier_route *r, int64_t n_rows, int32_t stream) {
    const int64_t n_frags = r->n_frags, *src_rows = r->src_rows, *dst_rows = r->dst_rows;
    const uintptr_t *src_base = r->src_base, *dst_base = r->dst_base;
    const int64_t *src_stride = r->src_stride, *dst_stride = r->dst_stride;
    const int64_t *frag_bytes = r->frag_bytes;
    int packed = 1;
    for (int64_t f = 0; f < n_frags; f++) {
        if (src_stride[f] != frag_bytes[f] || dst_stride[f] != frag_bytes[f]) packed = 0;
    }
    int64_t i = 0;
    while (i < n_rows) {
        int64_t s = src_rows[i], d = dst_rows[i], run = 1;
        if (packed) {
            while (i + run < n_rows && src_rows[i + run] == s + run &&
                   dst_rows[i + run] == d + run) {
                run++;
            }
        }
        if (i + run < n_rows) { /* the next row's pages, one line each */
            int64_t ns = src_rows[i + run], nd = dst_rows[i + run];
            for (int64_t f = 0; f < n_frags; f++) {
                const char *from = (const char *)(src_base[f] + (uintptr_t)(ns * src_stride[f]));
                const char *to = (const char *)(dst_base[f] + (uintptr_t)(nd * dst_stride[f]));
                for (int64_t k = 0; k < frag_bytes[f]; k += PAGE) {
                    __builtin_prefetch(from + k, 0, 3);
                    __builtin_prefetch(to + k, 1, 3);
                }
            }
        }
        for (int64_t f0 = 0; f0 < n_frags; f0 += WAYS) { /* fragments WAYS at a time */
            int64_t ways = n_frags - f0 < WAYS ? n_frags - f0 : WAYS;
            char *to[WAYS];
            const char *from[WAYS];
            size_t n[WAYS];
            for (int64_t w = 0; w < ways; w++) {
                int64_t f = f0 + w;
                to[w] = (char *)(dst_base[f] + (uintptr_t)(d * dst_stride[f]));
                from[w] = (const char *)(src_base[f] + (uintptr_t)(s * src_stride[f]));
                n[w] = (size_t)(run * frag_bytes[f]);
            }
            if (stream) {
                copy_streaming(ways, to, from, n);
            } else {
                for (int64_t w = 0; w < ways; w++) memmove(to[w], from[w], n[w]);
            }
        }
        i += run;
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
}
