// The subset of CUDA that the emulated kernels use, for the host emulations
// (tests/gpu/*_emulate.cpp): launch coordinates as globals the emulator sets before it calls a
// kernel as a plain function for each thread (thread_local, for emulators that run a block's
// threads as OS threads), the vector types, bf16 with round-to-nearest-even conversions, and
// the backend's sd_ld / sd_st.
#ifndef SDTRAIN_EMULATE_CUDA_H
#define SDTRAIN_EMULATE_CUDA_H
#include <cstdint>
#include <cstring>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
thread_local dim3 threadIdx, blockIdx;
dim3 gridDim, blockDim;
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
struct uint4 {
    unsigned x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
struct float4 {
    float x, y, z, w;
};
struct __nv_bfloat16 {
    uint16_t r;
};
static float __bfloat162float(__nv_bfloat16 b)
{
    uint32_t u = (uint32_t)b.r << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.r = (uint16_t)((u >> 16) | 0x40); // quiet NaN
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    b.r = (uint16_t)(u >> 16);
    return b;
}
static float sd_ld(const float *p, int64_t i) { return p[i]; }
static float sd_ld(const __nv_bfloat16 *p, int64_t i) { return __bfloat162float(p[i]); }
static void sd_st(float *p, int64_t i, float v) { p[i] = v; }
static void sd_st(__nv_bfloat16 *p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
#endif
