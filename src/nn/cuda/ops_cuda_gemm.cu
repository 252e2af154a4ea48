/* CUDA linear layers through cuBLASLt, and attention. */
#include "cuda_internal.h"

void sd_cuda_fill_gemm_ops(sd_ops *ops)
{
    (void)ops;
}

void sd_cuda_gemm_cache_destroy(sd_cuda_state *st)
{
    (void)st;
}
