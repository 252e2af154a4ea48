/* libFuzzer harness: a snapshot's scheduler/scheduler_config.json from arbitrary bytes, read for
 * one sampler and then sampled with.
 *
 * Input: byte 0 picks the sampler (modulo the number of kinds), byte 1 the number of steps
 * (1 + byte % 64), the rest is the file, written to a memfd and read through its /proc name.
 * Invariants (include/sdtrain/sched_config.h):
 *   - a refusal by the reader or by the schedule names the file;
 *   - an accepted file gives a setup within its ranges (steps_offset 1, a known spacing, at most
 *     one sigma schedule, solver order 1-3 for the multistep solvers);
 *   - an accepted schedule has ᾱ in [0, 1], not increasing, the first one positive;
 *   - a sampler the schedule accepts runs every step of a whole sampling loop (a stand-in model,
 *     fixed noise) with finite latents: the schedule either samples or is refused, it never
 *     turns the image into NaN or infinity.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh schedconfig [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/sched_config.h"

#define FUZZ_NAME "fuzz_schedconfig"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_ELEM 8

static int fd_in = -1;
static char path_in[64];

static void refused(const sd_err *err, const char *what)
{
    fuzz_require(strstr(err->msg, path_in) != NULL, what, err->msg);
}

/* A deterministic stand-in for the U-Net: a bounded function of its input and the call. */
static void model(int call, const float *x, float *out)
{
    for (int e = 0; e < N_ELEM; e++) {
        const float v = x[e];
        out[e] = 0.5f * (isfinite(v) ? tanhf(v) : 0.0f) + 0.05f * (float)((e + call) % 5 - 2);
    }
}

static void sample_loop(sd_sampler *s)
{
    float x[N_ELEM], in[N_ELEM], out[N_ELEM], noise[N_ELEM];
    char detail[160];
    sd_sampler_reset(s);
    for (int e = 0; e < N_ELEM; e++)
        x[e] = s->init_noise_sigma * (float)((e * 37 % 11) - 5) / 3.0f;
    for (int e = 0; e < N_ELEM; e++) {
        snprintf(detail, sizeof detail, "init_noise_sigma %g", (double)s->init_noise_sigma);
        fuzz_require(isfinite(x[e]), "finite initial latents", detail);
    }
    for (int i = 0; i < s->n_timesteps; i++) {
        sd_sampler_scale_input(s, i, N_ELEM, x, in);
        model(i, in, out);
        for (int e = 0; e < N_ELEM; e++)
            noise[e] = (float)(((e + 3 * i) * 29 % 13) - 6) / 4.0f;
        sd_sampler_step(s, i, out, x, sd_sampler_step_noise(s, i) ? noise : NULL);
        for (int e = 0; e < N_ELEM; e++) {
            snprintf(detail, sizeof detail, "%s, %d steps, call %d of %d (t %lld): %g",
                     sd_sampler_kind_name(s->kind), s->num_steps, i, s->n_timesteps,
                     (long long)s->timesteps[i], (double)x[e]);
            fuzz_require(isfinite(x[e]), "finite latents after each step", detail);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const sd_sampler_kind kind = (sd_sampler_kind)(data[0] % SD_SAMPLER_N_KINDS);
    const int steps = 1 + data[1] % 64;
    sd_sched_setup ss;
    sd_diffusion d;
    sd_sampler s;
    sd_err err;

    if (fd_in < 0)
        fd_in = fuzz_memfd("scheduler_config.json", path_in, sizeof path_in);
    fuzz_put_fd(fd_in, data + 2, size - 2);

    memset(&err, 0, sizeof err);
    if (sd_sched_read(&ss, kind, path_in, &err) != 0) {
        refused(&err, "a refusal names the file");
        return 0;
    }
    fuzz_require(ss.steps_offset == 1 && !strcmp(ss.source, path_in), "steps_offset 1, source", NULL);
    fuzz_require(ss.spacing == SD_SPACING_LEADING || ss.spacing == SD_SPACING_TRAILING ||
                     ss.spacing == SD_SPACING_LINSPACE, "a known spacing", NULL);
    fuzz_require(ss.karras + ss.expo + ss.beta <= 1, "at most one sigma schedule", NULL);
    if (kind == SD_SAMPLER_DPMPP_2M || kind == SD_SAMPLER_DPMPP_2M_SDE || kind == SD_SAMPLER_UNIPC)
        fuzz_require(ss.dpm_order >= 1 && ss.dpm_order <= 3, "solver order 1 to 3", NULL);

    if (sd_sched_diffusion(&ss, &d, &err) != 0) {
        refused(&err, "a refused schedule names the file");
        return 0;
    }
    fuzz_require(d.alphas_cumprod[0] > 0.0f && d.alphas_cumprod[0] <= 1.0f, "the first abar in (0, 1]",
                 NULL);
    for (int t = 1; t < d.num_train_timesteps; t++)
        fuzz_require(d.alphas_cumprod[t] >= 0.0f && d.alphas_cumprod[t] <= d.alphas_cumprod[t - 1],
                     "abar in [0, 1], not increasing", NULL);
    if (sd_sched_sampler(&s, kind, &d, &ss, steps, N_ELEM, &err) == 0) {
        sample_loop(&s);
        sd_sampler_free(&s);
    }
    sd_diffusion_free(&d);
    return 0;
}
