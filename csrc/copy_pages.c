/* Large host-memory copies for the host tier (page slots <-> caller buffers).
 *
 * Why native: glibc's memcpy uses non-temporal stores only above a threshold derived from the
 * last-level cache (hundreds of MiB on big server parts), so copies of one page (2 MiB) or of a
 * batch (tens of MiB) run with ordinary stores: each destination line is read first (RFO).
 * Measured on the 2-core CPU machine: memcpy of one 2 MiB page ~5.5 GB/s, one 512 MiB memcpy
 * ~9 GB/s, this kernel per 2 MiB page ~7.4 GB/s.
 *
 * How: streaming (non-temporal) stores of the widest vectors the CPU has (AVX-512, AVX2, else
 * SSE2; chosen at run time), four streams interleaved 4 KiB at a time over the four quarters of
 * the copy (the pattern glibc uses for its own huge copies: it keeps several DRAM pages open).
 * Measured per 2 MiB page: AVX-512 ~8.7-10 GB/s, i.e. on par with one 512 MiB memcpy. Spans
 * under 64 KiB, the bytes before the first 64-byte aligned destination address and the tail go
 * through memcpy. Called through ctypes, which releases the GIL.
 *
 * Reference: kvstore.ops.copy_spans_reference (numpy), same contract.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define KV_SSE2 1
#endif

#define KV_CHUNK 4096u
#define KV_MIN (64u * 1024u)

#ifdef KV_SSE2
#include <immintrin.h>

/* One body, three vector widths: 4 streams over the copy's quarters, 4 KiB at a time. */
#define KV_STREAM4(NAME, ATTR, VEC, LOAD, STORE, W)                                         \
    ATTR static size_t NAME(uint8_t *dst, const uint8_t *src, size_t n) {                   \
        size_t quarter = (n / (4 * KV_CHUNK)) * KV_CHUNK;                                   \
        for (size_t off = 0; off < quarter; off += KV_CHUNK) {                              \
            for (int k = 0; k < 4; k++) {                                                   \
                const uint8_t *s = src + k * quarter + off;                                 \
                uint8_t *d = dst + k * quarter + off;                                       \
                for (size_t i = 0; i < KV_CHUNK; i += 4 * (W)) {                            \
                    VEC a = LOAD((const void *)(s + i));                                    \
                    VEC b = LOAD((const void *)(s + i + (W)));                              \
                    VEC c = LOAD((const void *)(s + i + 2 * (W)));                          \
                    VEC e = LOAD((const void *)(s + i + 3 * (W)));                          \
                    STORE((void *)(d + i), a);                                              \
                    STORE((void *)(d + i + (W)), b);                                        \
                    STORE((void *)(d + i + 2 * (W)), c);                                    \
                    STORE((void *)(d + i + 3 * (W)), e);                                    \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
        return 4 * quarter;                                                                 \
    }

#define KV_LD128(p) _mm_loadu_si128((const __m128i *)(p))
#define KV_ST128(p, v) _mm_stream_si128((__m128i *)(p), v)
#define KV_LD256(p) _mm256_loadu_si256((const __m256i *)(p))
#define KV_ST256(p, v) _mm256_stream_si256((__m256i *)(p), v)
#define KV_LD512(p) _mm512_loadu_si512(p)
#define KV_ST512(p, v) _mm512_stream_si512((void *)(p), v)

KV_STREAM4(stream4_sse2, , __m128i, KV_LD128, KV_ST128, 16)
KV_STREAM4(stream4_avx2, __attribute__((target("avx2"))), __m256i, KV_LD256, KV_ST256, 32)
KV_STREAM4(stream4_avx512, __attribute__((target("avx512f"))), __m512i, KV_LD512, KV_ST512, 64)

typedef size_t (*stream_fn)(uint8_t *, const uint8_t *, size_t);

static stream_fn pick(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return stream4_avx512;
    if (__builtin_cpu_supports("avx2")) return stream4_avx2;
    return stream4_sse2;
}
#endif

/* dst[i][0:sizes[i]] <- src[i][0:sizes[i]] for i < count. Spans must not overlap. */
void kv_copy_spans(uint8_t **dst, uint8_t **src, const size_t *sizes, size_t count) {
    int streamed = 0;
#ifdef KV_SSE2
    static stream_fn stream4 = 0;
    if (!stream4) stream4 = pick();
#endif
    for (size_t i = 0; i < count; i++) {
        size_t n = sizes[i], done = 0;
#ifdef KV_SSE2
        if (n >= KV_MIN) {
            /* ordinary copy up to a 64-byte aligned destination, then stream */
            size_t head = (64 - ((uintptr_t)dst[i] & 63)) & 63;
            memcpy(dst[i], src[i], head);
            done = head + stream4(dst[i] + head, src[i] + head, n - head);
            streamed = 1;
        }
#endif
        memcpy(dst[i] + done, src[i] + done, n - done);
    }
#ifdef KV_SSE2
    if (streamed) _mm_sfence(); /* streaming stores are weakly ordered: publish before return */
#endif
}
