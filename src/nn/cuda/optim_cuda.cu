/* AdamW, clipping, EMA and checks over flat fp32 device buffers (include/sdtrain/optim_cuda.h). */
#include "cuda_internal.h"
#include "sdtrain/optim_cuda.h"
