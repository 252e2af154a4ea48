/* CUDA optimizer updates vs the CPU ones (optim.h). */
#include "cuda_compare.h"

int main(void)
{
    sd_backend *gpu[2];
    int n = gpu_backends(gpu);
    gpu_seed_from_env();
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    return tap_done();
}
