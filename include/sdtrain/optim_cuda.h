/* The optimizer-side updates of optim.h (AdamW, clipping, non-finite check, EMA) on a CUDA
 * backend's device memory, with the CPU functions' numerics.
 *
 * Declared only in CUDA builds (SD_HAVE_CUDA from sd_config.h, which the including file
 * includes first, as for device.h). Every pointer is device memory of the CUDA backend `be`
 * (flat fp32 buffers unless said otherwise, any element offset: ranges [begin, end) of the flat
 * buffers are passed as pointers offset by `begin`). The work is enqueued on be's stream in
 * order with its ops; the functions that return a host value (sumsq, nonfinite) wait for it.
 *
 * Results against the CPU (tests/gpu/test_cuda_optim.c):
 *   adamw, scale, ema, f32_to_bf16  bit-identical: the same IEEE operations in the same order
 *                                   (explicitly rounded intrinsics, so nvcc contracts nothing
 *                                   the CPU does not; the one fused multiply-add is the CPU's);
 *   sumsq                           bit-identical: each SD_SUMSQ_BLOCK block is summed in index
 *                                   order by one thread, the block sums in block order;
 *   nonfinite                       the same flag.
 */
#ifndef SDTRAIN_OPTIM_CUDA_H
#define SDTRAIN_OPTIM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/ops.h"
#include "sdtrain/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SD_HAVE_CUDA)

/* sd_adamw_update on n elements of p, g, m, v. When p_lowp is not NULL it also receives the
 * updated parameters rounded to bf16 (n elements, round to nearest even: the compute copy of
 * the weights of a BF16 backend). */
void sd_cuda_adamw_update(const sd_backend *be, const sd_adamw_hparams *h, double lr, int64_t k,
                          float *p, const float *g, float *m, float *v, size_t n,
                          void *p_lowp);

/* sd_sumsq of n elements into *out_host (waits). `scratch` holds sd_cuda_sumsq_scratch(n)
 * bytes of device memory (the block sums and the total). */
size_t sd_cuda_sumsq_scratch(size_t n);
void sd_cuda_sumsq(const sd_backend *be, const float *x, size_t n, double *out_host,
                   void *scratch);

/* x[i] *= s (sd_scale with s = (float)coef; nothing is done for s == 1). */
void sd_cuda_scale(const sd_backend *be, float *x, size_t n, float s);

/* sd_any_nonfinite: 1 when any of the n values is NaN or ±Inf, else 0 (waits). `scratch` holds
 * sd_cuda_nonfinite_scratch() bytes of device memory. */
size_t sd_cuda_nonfinite_scratch(void);
int sd_cuda_nonfinite(const sd_backend *be, const float *x, size_t n, void *scratch);

/* sd_ema_update: ema ← ema − (1 − d)·(ema − p) in fp32 over n elements. */
void sd_cuda_ema_update(const sd_backend *be, float *ema, const float *p, size_t n, double d);

/* dst (n bf16 values) = src (n floats) rounded to nearest even, as sd_f32_to_bf16 for every
 * non-NaN value (a NaN stays a NaN, payload not kept): refreshes the bf16 weight copy. */
void sd_cuda_f32_to_bf16(const sd_backend *be, const float *src, void *dst, size_t n);

#endif /* SD_HAVE_CUDA */

#ifdef __cplusplus
}
#endif
#endif
