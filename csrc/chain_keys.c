/* Chained block keys (DESIGN.md, "Keys"): key[i] = xxh3_128(key[i-1] || tokens of block i), key[-1]
 * the namespace seed, each key in xxhash's canonical form (big-endian high half, then low half).
 *
 * Why native: the chain is sequential, so Python hashes it one block per loop turn, and the loop
 * (a slice, a concatenation and a call per block) is what costs: ~0.24 us a block on the H200's
 * host, 0.06 ms before a 4K-token prompt's lookup and 0.5 ms before a 32K one's. Here the
 * whole chain is one call.
 *
 * The hash itself is not reimplemented: the caller passes XXH3_128bits from the xxhash library
 * that kvstore.keys hashes with in Python (the python-xxhash extension exports it), so both
 * paths run the same code. Called through ctypes, which releases the GIL.
 *
 * Reference: kvstore.keys._chain_reference, same contract.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint64_t low64;
    uint64_t high64;
} kv_hash128;

typedef kv_hash128 (*kv_xxh3_128)(const void *data, size_t len);

#define KV_KEY 16u
#define KV_MAX_STEP 4096u /* kvstore.native_chain.MAX_STEP */

static void put_be64(uint8_t *out, uint64_t v) {
    for (int i = 7; i >= 0; i--) {
        out[i] = (uint8_t)(v & 0xffu);
        v >>= 8;
    }
}

/* Writes n keys of 16 bytes to out; returns 0, or -1 when step is 0 or above KV_MAX_STEP. */
int kv_chain_keys(void *hash_fn, const uint8_t *seed, const uint8_t *data, size_t n, size_t step,
                  uint8_t *out) {
    kv_xxh3_128 hash = (kv_xxh3_128)hash_fn;
    uint8_t buf[KV_KEY + KV_MAX_STEP];
    if (step == 0 || step > KV_MAX_STEP) return -1;
    memcpy(buf, seed, KV_KEY);
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + KV_KEY, data + i * step, step);
        kv_hash128 h = hash(buf, KV_KEY + step);
        uint8_t *key = out + i * KV_KEY;
        put_be64(key, h.high64);
        put_be64(key + 8, h.low64);
        memcpy(buf, key, KV_KEY);
    }
    return 0;
}
