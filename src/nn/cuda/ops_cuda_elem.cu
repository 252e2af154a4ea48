/* CUDA activations, elementwise arithmetic, data movement, embeddings and resampling. */
#include "cuda_internal.h"

void sd_cuda_fill_elementwise_ops(sd_ops *ops)
{
    (void)ops;
}
