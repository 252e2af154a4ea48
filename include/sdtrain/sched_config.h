/* The noise schedule and scheduler options sampling uses: from the namelist's &diffusion, or read
 * from a diffusers snapshot's scheduler/scheduler_config.json as <Kind>Scheduler.from_config reads
 * it and StableDiffusionPipeline adjusts it (doc/sampling.md). */
#ifndef SDTRAIN_SCHED_CONFIG_H
#define SDTRAIN_SCHED_CONFIG_H

#include <stdint.h>

#include "sdtrain/config.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/error.h"
#include "sdtrain/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_sched_setup {
    char source[SD_PATH_MAX + 64]; /* the scheduler_config.json read, or "&diffusion" (for messages) */
    char schedule[32], prediction[32];
    char adjusted[160];    /* what the pipeline's fix-ups changed, for the log, or "" */
    double beta_start, beta_end;
    int T, steps_offset, set_alpha_to_one;
    int karras;            /* use_karras_sigmas (sd_sampler_takes_sigma_schedule kinds) */
    int expo;              /* use_exponential_sigmas (the same) */
    int beta;              /* use_beta_sigmas (the same) */
    int pndm_prk;          /* PNDM's skip_prk_steps false: the Runge-Kutta warm-up */
    int sigma_min;         /* final_sigmas_type 'sigma_min' (sd_sampler_takes_final_sigma_min) */
    int sigma_bounds;      /* the file sets sigma_min or sigma_max (a number): refused with a
                            * Karras, exponential or beta schedule, whose ends they would be */
    int zero_snr;          /* rescale_betas_zero_snr */
    int dpm_order, dpm_heun, lower_order_final, euler_at_final; /* DPMSolverMultistep's */
    int unipc_bh1;         /* UniPC's solver_type 'bh1' */
    int unipc_eps;         /* UniPC's predict_x0 false */
    unsigned char unipc_nocorr[SD_SAMPLER_MAX_DISABLE / 8]; /* its disable_corrector */
    sd_spacing spacing;
} sd_sched_setup;

/* A schedule as &diffusion describes it, with SD's scheduler conventions (steps_offset 1,
 * set_alpha_to_one false, 'leading' spacing, DPM-Solver++ of order 2). */
void sd_sched_from_diffusion(sd_sched_setup *ss, const char *schedule, const char *prediction,
                             double beta_start, double beta_end, int64_t num_train_timesteps,
                             int zero_snr);

/* Reads `path` (a scheduler_config.json) for a `kind` sampler: absent keys take that diffusers
 * class's defaults, keys the class does not have are ignored, then the pipeline's fix-ups
 * (steps_offset 1, clip_sample false; noted in `adjusted`). Returns 0, or -1 with a message
 * naming the file (and key) for an unreadable file, a key of the wrong JSON type, a value
 * outside what diffusers accepts, or an option sdtrain does not implement. */
int sd_sched_read(sd_sched_setup *ss, sd_sampler_kind kind, const char *path, sd_err *err);

/* The training schedule: sd_diffusion_init, then the zero-SNR rescaling (refused for an epsilon
 * model). Errors are prefixed by ss->source. */
int sd_sched_diffusion(const sd_sched_setup *ss, sd_diffusion *d, sd_err *err);

/* A `kind` sampler of num_steps over d for latents of n elements with the setup's options
 * (sigma schedule, final sigma, PNDM warm-up, solver order and type, set_alpha_to_one), checked
 * with sd_sampler_check_options. Returns 0, or -1 with a message (nothing to free). */
int sd_sched_sampler(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d,
                     const sd_sched_setup *ss, int num_steps, int64_t n, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
