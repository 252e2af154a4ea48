/* Helpers for the CUDA op tests: random host data, device copies, comparison with the CPU
 * backend. Each test runs an op on the CPU backend (the reference, fp32) and on the CUDA
 * backend in F32 and BF16 mode on the same inputs (rounded to bf16 first in BF16 mode), and
 * compares by ||got - ref|| / ||ref||. Outputs are poisoned with NaN before the CUDA op so an
 * element the op forgot to write fails the comparison. */
#ifndef SDTRAIN_TESTS_CUDA_COMPARE_H
#define SDTRAIN_TESTS_CUDA_COMPARE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/ops.h"
#include "sdtrain/tensor.h"
#include "tap.h"

/* The tolerances of issue 6: fp32 mode (no TF32) and bf16 mode. */
#define GPU_TOL_F32 1e-5
#define GPU_TOL_BF16 1e-2

static uint64_t gpu_rng_state_ = 0x9e3779b97f4a7c15ULL;

/* SDTRAIN_TEST_SEED overrides the fixed default, to draw other inputs. */
static inline void gpu_seed_from_env(void)
{
    const char *s = getenv("SDTRAIN_TEST_SEED");
    if (s && *s)
        gpu_rng_state_ = strtoull(s, NULL, 0) * 0x9e3779b97f4a7c15ULL + 1;
    tap_diag("random inputs: SDTRAIN_TEST_SEED=%s", s && *s ? s : "(default)");
}

static inline double gpu_uniform(void)
{
    /* splitmix64 */
    uint64_t z = (gpu_rng_state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

/* n normals times `scale` plus `shift` (host memory, caller frees). */
static inline float *hrand(int64_t n, float scale, float shift)
{
    float *h = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        double u1 = gpu_uniform(), u2 = gpu_uniform();
        h[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)) * scale + shift;
    }
    return h;
}

static inline float *hcopy(const float *src, int64_t n)
{
    float *h = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(h, src, (size_t)n * sizeof(float));
    return h;
}

/* Rounds host data to what the backend's dtype can hold, so both backends see equal inputs. */
static inline void hround(const sd_backend *be, float *h, int64_t n)
{
    if (be->dtype == SD_BF16)
        for (int64_t i = 0; i < n; i++)
            h[i] = sd_bf16_to_f32(sd_f32_to_bf16(h[i]));
}

/* A device tensor of the backend's dtype holding h (converted). */
static inline void *dput(const sd_backend *be, const float *h, int64_t n)
{
    void *d = sd_backend_alloc(be, (size_t)(n > 0 ? n : 1) * sd_dtype_size(be->dtype));
    if (!d) {
        fprintf(stderr, "device allocation of %lld elements failed\n", (long long)n);
        exit(1);
    }
    if (h && n)
        sd_upload_f32(be, d, h, n);
    return d;
}

/* A device tensor of n elements filled with NaN (an output to be written). */
static inline void *dnan(const sd_backend *be, int64_t n)
{
    float *h = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        h[i] = NAN;
    void *d = dput(be, h, n);
    free(h);
    return d;
}

/* fp32 device memory (the `float *` arguments: statistics, lse, weight gradients, timesteps);
 * h may be NULL for NaN-filled memory. */
static inline float *dput32(const sd_backend *be, const float *h, int64_t n)
{
    float *d = (float *)sd_backend_alloc(be, (size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!d) {
        fprintf(stderr, "device allocation of %lld floats failed\n", (long long)n);
        exit(1);
    }
    float *tmp = NULL;
    if (!h) {
        tmp = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            tmp[i] = NAN;
        h = tmp;
    }
    if (n)
        sd_upload(be, d, h, (size_t)n * sizeof(float));
    free(tmp);
    return d;
}

/* Host copies of device data (caller frees). */
static inline float *dget(const sd_backend *be, const void *d, int64_t n)
{
    float *h = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    sd_synchronize(be);
    if (n)
        sd_download_f32(be, h, d, n);
    return h;
}

static inline float *dget32(const sd_backend *be, const float *d, int64_t n)
{
    float *h = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    sd_synchronize(be);
    if (n)
        sd_download(be, h, d, (size_t)n * sizeof(float));
    return h;
}

/* A scratch block for an op on the CUDA backend (NULL/0 when none is needed). */
static inline sd_scratch dscratch(const sd_backend *be, size_t bytes)
{
    sd_scratch s = {NULL, bytes};
    if (bytes) {
        s.ptr = sd_backend_alloc(be, bytes);
        if (!s.ptr) {
            fprintf(stderr, "scratch allocation of %zu bytes failed\n", bytes);
            exit(1);
        }
    }
    return s;
}

static inline sd_scratch hscratch(size_t bytes)
{
    sd_scratch s = {NULL, bytes};
    if (bytes)
        s.ptr = aligned_alloc(256, (bytes + 255) / 256 * 256);
    return s;
}

/* ||got - ref|| / ||ref|| (plain norm of the difference when ref is all zeros); infinity when
 * got holds a NaN or an infinity that ref does not. */
static inline double rel_err(const float *got, const float *ref, int64_t n)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) && !(isnan(got[i]) && isnan(ref[i])) && got[i] != ref[i])
            return INFINITY;
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static inline double gpu_tol(const sd_backend *be)
{
    return be->dtype == SD_BF16 ? GPU_TOL_BF16 : GPU_TOL_F32;
}

/* One TAP point: "<what> [F32|BF16]: rel err <e> (tol <t>)". Returns the verdict. */
static inline int check_close(const sd_backend *be, const char *what, const float *got,
                              const float *ref, int64_t n, double tol)
{
    double e = rel_err(got, ref, n);
    return tap_ok(e <= tol, "%s [%s]: rel err %.3g (tol %.0e, %lld values)", what,
                  sd_dtype_name(be->dtype), e, tol, (long long)n);
}

/* The CUDA backends to test (F32 and BF16), or a skip of the whole program without a GPU. */
static inline int gpu_backends(sd_backend *out[2])
{
    sd_err err;
    if (sd_backend_cuda_create(0, SD_F32, &out[0], &err) != 0)
        tap_skip_all(err.msg);
    if (sd_backend_cuda_create(0, SD_BF16, &out[1], &err) != 0) {
        tap_ok(0, "BF16 backend: %s", err.msg);
        return 1;
    }
    return 2;
}

#endif
