/* GPU self-test kernels: the counter-based RNG evaluated on the device, for comparison with
 * the host implementation (same header, same counters). */
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#include "sdtrain/rng.h"

extern "C" int sd_cuda_rng_selftest(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                                    uint32_t *words, float *normals, size_t n_blocks, char *msg,
                                    size_t cap);

static __global__ void rng_kernel(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                                  uint32_t *words, float *normals, size_t n_blocks)
{
    size_t b = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks)
        return;
    uint32_t w[4];
    float z[4];
    sd_rng_block(seed, purpose, step, sample, (uint32_t)b, w);
    sd_rng_normal4(seed, purpose, step, sample, (uint32_t)b, z);
    for (int i = 0; i < 4; i++) {
        words[4 * b + i] = w[i];
        normals[4 * b + i] = z[i];
    }
}

/* Fills words[4*n_blocks] and normals[4*n_blocks] on the GPU; returns a cudaError_t code. */
extern "C" int sd_cuda_rng_selftest(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                                    uint32_t *words, float *normals, size_t n_blocks, char *msg,
                                    size_t cap)
{
    uint32_t *dw = nullptr;
    float *dn = nullptr;
    size_t n = 4 * n_blocks;
    cudaError_t e = cudaMalloc(&dw, n * sizeof *dw);
    if (e == cudaSuccess)
        e = cudaMalloc(&dn, n * sizeof *dn);
    if (e == cudaSuccess) {
        unsigned threads = 256, grid = (unsigned)((n_blocks + threads - 1) / threads);
        rng_kernel<<<grid, threads>>>(seed, purpose, step, sample, dw, dn, n_blocks);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpy(words, dw, n * sizeof *dw, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess)
        e = cudaMemcpy(normals, dn, n * sizeof *dn, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess)
        snprintf(msg, cap, "CUDA error %d: %s", (int)e, cudaGetErrorString(e));
    cudaFree(dw);
    cudaFree(dn);
    return (int)e;
}
