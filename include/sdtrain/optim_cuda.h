/* The optimizer-side updates of optim.h on a CUDA backend's device memory (flat fp32 buffers).
 * Declared for every build; without CUDA they end the job with a message. */
#ifndef SDTRAIN_OPTIM_CUDA_H
#define SDTRAIN_OPTIM_CUDA_H

#include "sdtrain/ops.h"
#include "sdtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
