/* Gather/scatter of many equal-sized rows between the engine's KV cache and host pages, in one
 * launch (used once per layer: a page's layer-l slice is one row).
 *
 * Why native: one layer of one page is only 2*block_size*heads*dim elements (64 KiB for a
 * Llama-3-8B page). One cudaMemcpyAsync per such slice runs at ~3 GB/s on an H200 (per-call
 * cost), against ~55 GB/s for the PCIe link. Here thread blocks stride over the rows, reading
 * or writing pinned host memory directly through unified virtual addressing (a pinned host
 * pointer is a valid device pointer), so one launch moves all of a layer's rows at link speed
 * without a staging buffer.
 *
 * Few thread blocks on purpose (max_blocks, a quarter of the SMs by default): a copy over PCIe
 * is bound by the link, not by the SMs, and a few dozen blocks keep enough 16-byte loads in
 * flight to fill it (bandwidth x latency is ~100 KB). The compute kernels the copy overlaps with
 * keep the other SMs. One block per row (thousands) would hold every SM until the copy drains,
 * so the engine's layer kernels would queue behind the copies instead of running beside them.
 *
 * Contract (same as kvstore.ops.copy_rows_reference):
 *   for i in [0, n): dst + dst_idx[i] * dst_stride  <-  src + src_idx[i] * src_stride,  nbytes each
 * dst, src, strides and nbytes must be multiples of 16 bytes (checked by the caller); the index
 * arrays are int64 in device-accessible memory (pinned host memory is). Rows must not overlap.
 * The launch goes on `stream` (a cudaStream_t; NULL is the legacy default stream).
 */
#include <cuda_runtime.h>
#include <stdint.h>

#define KV_THREADS 512
#define KV_UNROLL 4

__global__ void __launch_bounds__(KV_THREADS)
kv_copy_rows_kernel(uint8_t *__restrict__ dst, const uint8_t *__restrict__ src,
                    const int64_t *__restrict__ dst_idx, const int64_t *__restrict__ src_idx,
                    int64_t n, int64_t dst_stride, int64_t src_stride, int64_t nvec) {
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const int4 *s = reinterpret_cast<const int4 *>(src + src_idx[row] * src_stride);
        int4 *d = reinterpret_cast<int4 *>(dst + dst_idx[row] * dst_stride);
        // Several independent 16-byte loads in flight per thread before the stores: reads over
        // PCIe have microseconds of latency, so parallelism, not instruction count, sets speed.
        const int64_t step = (int64_t)KV_THREADS * KV_UNROLL;
        int64_t j = threadIdx.x;
        for (; j + (KV_UNROLL - 1) * KV_THREADS < nvec; j += step) {
            int4 v[KV_UNROLL];
#pragma unroll
            for (int u = 0; u < KV_UNROLL; u++) v[u] = s[j + u * KV_THREADS];
#pragma unroll
            for (int u = 0; u < KV_UNROLL; u++) d[j + u * KV_THREADS] = v[u];
        }
        for (; j < nvec; j += KV_THREADS) d[j] = s[j];
    }
}

extern "C" int kv_copy_rows(void *dst, const void *src, const int64_t *dst_idx,
                            const int64_t *src_idx, int64_t n, int64_t dst_stride,
                            int64_t src_stride, int64_t nbytes, int64_t max_blocks,
                            void *stream) {
    if (n <= 0 || nbytes <= 0) return 0;
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    int64_t blocks = n < max_blocks ? n : max_blocks;  // thread blocks stride over the rows
    if (blocks < 1) blocks = 1;
    kv_copy_rows_kernel<<<(unsigned)blocks, KV_THREADS, 0, s>>>(
        static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), dst_idx, src_idx, n,
        dst_stride, src_stride, nbytes / 16);
    return (int)cudaGetLastError();
}

/* A strided block copy by the copy (DMA) engines: `height` rows of `width` bytes, row pitches
 * `dpitch`/`spitch`, any direction (cudaMemcpyDefault; pinned host memory for async). Saves use
 * it to move a gathered layer from GPU scratch into the layer's slice of consecutive pinned
 * staging pages without taking SMs from the compute the save overlaps with. */
extern "C" int kv_copy_2d(void *dst, int64_t dpitch, const void *src, int64_t spitch,
                          int64_t width, int64_t height, void *stream) {
    if (height <= 0 || width <= 0) return 0;
    return (int)cudaMemcpy2DAsync(dst, (size_t)dpitch, src, (size_t)spitch, (size_t)width,
                                  (size_t)height, cudaMemcpyDefault,
                                  reinterpret_cast<cudaStream_t>(stream));
}

extern "C" const char *kv_error_string(int code) {
    return cudaGetErrorString(static_cast<cudaError_t>(code));
}
