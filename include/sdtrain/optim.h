/* AdamW, learning-rate schedules, global-norm clipping helpers, a non-finite check and the EMA
 * update (sd2-model-spec.md §6.4), on the CPU, over ranges of flat fp32 buffers.
 *
 * Buffers: parameters, gradients, AdamW moments and EMA weights are flat fp32 buffers with the
 * tensors at aligned offsets and zeros between them (weights.h). Every update below is
 * elementwise, so it works on any contiguous range [begin, end): pass pointers offset by
 * `begin` and n = end - begin. A ZeRO-2 rank passes its shard of the parameters together with
 * shard-only gradients and moments. Padding stays zero under every update (a zero parameter
 * with a zero gradient keeps zero moments and gets a zero step).
 *
 * Numerics follow PyTorch's for-loop AdamW (torch.optim.AdamW(foreach=False), the
 * `_single_tensor_adam` path; CPU, fp32), operation by operation and in fp32 where torch works
 * in fp32; the scalars (bias corrections, step size) are computed in double as torch computes
 * them in Python, then rounded to fp32 as torch's kernels do. The foreach and fused variants
 * differ from it at the ulp level. OpenMP-parallel; results do not depend on the thread count
 * (elementwise updates; sums are taken over fixed blocks, see sd_sumsq).
 */
#ifndef SDTRAIN_OPTIM_H
#define SDTRAIN_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Learning-rate schedule ------------------------------------------------------------ */

/* &train lr_schedule: what follows the linear warmup. */
typedef enum {
    SD_LR_CONSTANT = 0, /* diffusers constant_with_warmup */
    SD_LR_LINEAR,       /* diffusers linear: to 0 at max_steps */
    SD_LR_COSINE,       /* diffusers cosine (num_cycles 0.5): to 0 at max_steps */
    SD_LR_COSINE_RESTARTS, /* diffusers cosine_with_restarts: num_cycles hard restarts */
    SD_LR_POLYNOMIAL    /* diffusers polynomial: (lr - lr_end) (1 - progress)^power + lr_end */
} sd_lr_schedule;

/* diffusers' polynomial schedule ends at this learning rate (get_scheduler's default). */
#define SD_LR_POLYNOMIAL_END 1e-7

/* "constant" | "linear" | "cosine" | "cosine_with_restarts" | "polynomial" -> 0 and *out; else
 * -1 with a message. */
int sd_lr_schedule_from_name(const char *name, sd_lr_schedule *out, sd_err *err);
const char *sd_lr_schedule_name(sd_lr_schedule s);

/* The LambdaLR factor after k >= 0 optimizer steps (the factor used by update k+1), with the
 * diffusers formulas evaluated in the same order (so bit-identical to them):
 *   k < warmup:  k / max(1, warmup)                       (the very first update uses 0)
 *   constant:    1
 *   linear:      max(0, (T - k) / max(1, T - warmup))
 *   cosine:      max(0, 0.5 (1 + cos(pi · (k - warmup) / max(1, T - warmup))))
 * with T = max_steps. Unlike diffusers' cosine (which rises again after T), linear and cosine
 * are 0 for k >= T. A pure function. */
double sd_lr_factor(sd_lr_schedule s, int64_t k, int64_t warmup, int64_t max_steps);
/* base_lr · sd_lr_factor(...), the multiplication LambdaLR does. */
double sd_lr_at(double base_lr, sd_lr_schedule s, int64_t k, int64_t warmup, int64_t max_steps);

/* A schedule with all of its parameters (the two above take num_cycles 1, power 1). */
typedef struct sd_lr_params {
    sd_lr_schedule schedule;
    int64_t warmup, max_steps;
    int64_t num_cycles; /* cosine_with_restarts (>= 1) */
    double power;       /* polynomial (> 0) */
    double base_lr;     /* polynomial: lr_end / base_lr after max_steps */
} sd_lr_params;
/* The factor of update k + 1, in diffusers' order of operations (bit-identical to its LambdaLR):
 *   cosine_with_restarts: k >= T: 0, else max(0, 0.5 (1 + cos(pi ((cycles · p) mod 1)))), p =
 *                         (k - warmup) / max(1, T - warmup);
 *   polynomial:           k > T: lr_end / lr, else ((lr - lr_end) (1 - (k - warmup) / (T -
 *                         warmup))^power + lr_end) / lr, lr_end = SD_LR_POLYNOMIAL_END;
 * the others as sd_lr_factor. */
double sd_lr_factor_params(const sd_lr_params *p, int64_t k);

/* ---- AdamW ----------------------------------------------------------------------------- */

typedef struct sd_adamw_hparams {
    double beta1, beta2, eps, weight_decay;
} sd_adamw_hparams;

/* One AdamW update of n elements, step number k >= 1 (the global count of updates including
 * this one; bias corrections 1 - beta^k), learning rate lr (from sd_lr_at(.., k - 1, ..)):
 *   p ← p·(1 − lr·wd);  m ← lerp(m, g, 1 − β1);  v ← β2·v + (1 − β2)·g·g;
 *   p ← p − (lr/(1 − β1^k))·m / (sqrt(v)/sqrt(1 − β2^k) + eps)
 * p, m, v are updated in place; g is read only (already clipped). */
void sd_adamw_update(const sd_adamw_hparams *h, double lr, int64_t k, float *p, const float *g,
                     float *m, float *v, size_t n);

/* ---- Gradient-norm clipping ------------------------------------------------------------ */

/* Elements per block of sd_sumsq. */
#define SD_SUMSQ_BLOCK 4096

/* Σ x² over n elements, thread-count independent: consecutive blocks of SD_SUMSQ_BLOCK
 * elements (from x[0]) are each summed in double in index order, then the block sums are
 * added in block order. Ranks all-reduce their partial sums (the result then depends on how
 * the buffer is split among ranks, at the rounding level of a double, not on threads). */
double sd_sumsq(const float *x, size_t n);

/* The block sums themselves (ceil(n / SD_SUMSQ_BLOCK) of them, written to out), for a caller
 * that wants a result independent of the split too (gather the blocks, add them in order).
 * Returns the number of blocks. */
size_t sd_sumsq_blocks(const float *x, size_t n, double *out);

/* clip_grad_norm_'s coefficient for a total sum of squares: min(1, max_norm / (sqrt(sumsq) +
 * 1e-6)), evaluated as torch does on its fp32 total norm (norm rounded to fp32, then
 * fp32 reciprocal(norm + 1e-6) · max_norm); 1 when max_norm <= 0 (clipping off). */
double sd_clip_coef(double sumsq, double max_norm);

/* x[i] *= (float)coef, as torch's g.mul_(clip_coef_clamped) (a no-op for coef == 1). */
void sd_scale(float *x, size_t n, double coef);

/* ---- Non-finite check ------------------------------------------------------------------ */

/* True when any of the n values is NaN or ±Inf. The caller reduces the flag over ranks (with
 * the loss) and then skips the step on every rank. */
bool sd_any_nonfinite(const float *x, size_t n);

/* ---- EMA (diffusers EMAModel, no warmup, min_decay 0) ------------------------------------ */

/* The decay at optimisation step n >= 1 (the count of updates including this one), with
 * update_after_step = start_step (&train ema_start_step):
 *   n' = n − start_step − 1;  d = 0 if n' <= 0, else min(decay, (1 + n')/(10 + n')).
 * d = 0 makes the EMA a copy of the parameters (so start the EMA buffer anywhere). */
double sd_ema_decay(int64_t n, double decay, int64_t start_step);

/* ema ← ema − (1 − d)·(ema − p) over n elements, in fp32 as diffusers' s.sub_((1-d)*(s-p)). */
void sd_ema_update(float *ema, const float *p, size_t n, double d);

#ifdef __cplusplus
}
#endif
#endif
