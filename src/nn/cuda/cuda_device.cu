/* CUDA device discovery and runtime library versions (compiled by nvcc, called from C). */
#include <cstdio>
#include <cstring>

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "sdtrain/cuda_check.h"
#include "sdtrain/device.h"

extern "C" int sd_cuda_device_count(int *count, char *msg, size_t cap)
{
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        *count = 0;
        snprintf(msg, cap, "cudaGetDeviceCount failed with error %d (%s: %s)", (int)e,
                 cudaGetErrorName(e), cudaGetErrorString(e));
        cudaGetLastError(); /* clear the sticky error so later calls report their own */
    } else if (msg && cap) {
        msg[0] = '\0';
    }
    return (int)e;
}

extern "C" int sd_cuda_device_name(int device, char *name, size_t cap)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    if (e != cudaSuccess) {
        snprintf(name, cap, "device %d (unknown: %s)", device, cudaGetErrorString(e));
        return (int)e;
    }
    snprintf(name, cap, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

extern "C" int sd_cuda_device_uuid(int device, unsigned char uuid[16])
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, device);
    memset(uuid, 0, 16);
    if (e != cudaSuccess)
        return (int)e;
    static_assert(sizeof p.uuid.bytes == 16, "cudaUUID_t is 16 bytes");
    memcpy(uuid, p.uuid.bytes, 16);
    return 0;
}

extern "C" int sd_cuda_set_device(int device, char *msg, size_t cap)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        snprintf(msg, cap, "cudaSetDevice(%d) failed: %s", device, cudaGetErrorString(e));
    return (int)e;
}

extern "C" void sd_cuda_runtime_versions(char *buf, size_t cap)
{
    int rt = 0, drv = 0, nccl = 0;
    SD_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    SD_CUDA_CHECK(cudaDriverGetVersion(&drv));
    SD_NCCL_CHECK(ncclGetVersion(&nccl));
    snprintf(buf, cap, "cudart %d.%d, driver %d.%d, cuBLASLt %zu, cuDNN %zu, NCCL %d", rt / 1000,
             (rt % 1000) / 10, drv / 1000, (drv % 1000) / 10, cublasLtGetVersion(),
             cudnnGetVersion(), nccl);
}
