/* The CUDA backend object: creation (stream, cuBLASLt and cuDNN handles, workspace), the op
 * table assembled from the per-file parts, and the memory entries. */
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include <sched.h>

#include "cuda_internal.h"
#include "sdtrain/progress.h"

/* ---- op profile (SDTRAIN_CUDA_PROFILE=1) -----------------------------------------------------
 * The sd_* wrappers put a mark (a CUDA event on the backend's stream) before and after every
 * compute op; the GPU time between two consecutive marks goes to the label of the later one, so
 * each op gets its own kernels and "(between ops)" what ran in between: copies, the optimizer,
 * the objective, and idle time while the host had nothing queued (first calls of a shape, which
 * make cuDNN / cuBLASLt plans on the host, count that way too). Events are read back in
 * batches, so profiling costs two event records per op and a synchronization per batch. The
 * table goes to stderr when the backend is destroyed; it covers every op since creation or the
 * last sd_profile_reset (bench/models_cuda resets after its warm-up runs). */
#define PROF_BATCH 1024
#define PROF_ROWS 256 /* the convolutions' forward rows are per shape */

typedef struct {
    const char *label;
    double ms;
    long calls;
} prof_row;

struct sd_cuda_prof {
    cudaEvent_t ev[PROF_BATCH];
    const char *lab[PROF_BATCH];
    int n; /* pending marks; ev[0] opens the first interval */
    prof_row rows[PROF_ROWS];
    int nrows;
};

static prof_row *prof_row_for(sd_cuda_prof *p, const char *label)
{
    if (!label)
        label = "(between ops)";
    for (int i = 0; i < p->nrows; i++)
        if (p->rows[i].label == label || strcmp(p->rows[i].label, label) == 0)
            return &p->rows[i];
    if (p->nrows == PROF_ROWS)
        return &p->rows[PROF_ROWS - 1]; /* more labels than rows: the last row takes the rest */
    prof_row *r = &p->rows[p->nrows++];
    r->label = label;
    return r;
}

/* Reads back every pending interval; the last mark opens the next one. */
static void prof_flush(sd_cuda_prof *p)
{
    if (p->n < 2)
        return;
    SD_CUDA_CHECK(cudaEventSynchronize(p->ev[p->n - 1]));
    for (int i = 1; i < p->n; i++) {
        float ms = 0.0f;
        SD_CUDA_CHECK(cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]));
        prof_row *r = prof_row_for(p, p->lab[i]);
        r->ms += ms;
        r->calls += p->lab[i] != NULL;
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0];
    p->ev[0] = last;
    p->lab[0] = NULL;
    p->n = 1;
}

void sd_cuda_profile_mark(const sd_backend *be, const char *label)
{
    sd_cuda_state *st = sd_cuda(be);
    sd_cuda_prof *p = st->prof;
    if (p->n == PROF_BATCH)
        prof_flush(p);
    SD_CUDA_CHECK(cudaEventRecord(p->ev[p->n], st->stream));
    p->lab[p->n++] = label;
}

static void cuda_profile_reset(const sd_backend *be)
{
    sd_cuda_prof *p = sd_cuda(be)->prof;
    prof_flush(p);
    p->nrows = 0;
    memset(p->rows, 0, sizeof p->rows);
}

static int prof_row_cmp(const void *a, const void *b)
{
    const double x = ((const prof_row *)a)->ms, y = ((const prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void prof_report(sd_cuda_state *st)
{
    sd_cuda_prof *p = st->prof;
    prof_flush(p);
    double total = 0.0;
    for (int i = 0; i < p->nrows; i++)
        total += p->rows[i].ms;
    qsort(p->rows, (size_t)p->nrows, sizeof p->rows[0], prof_row_cmp);
    fprintf(stderr, "# sdtrain CUDA op profile (%s, GPU %d): %.3f ms of GPU time from the first "
                    "to the last op\n",
            st->dtype == SD_BF16 ? "bf16" : "fp32", st->device, total);
    fprintf(stderr, "%-44s %8s %12s %10s %7s\n", "op", "calls", "total ms", "ms/call", "%");
    for (int i = 0; i < p->nrows; i++) {
        const prof_row *r = &p->rows[i];
        fprintf(stderr, "%-44s %8ld %12.3f %10.4f %6.1f%%\n", r->label, r->calls, r->ms,
                r->calls ? r->ms / (double)r->calls : 0.0, total > 0 ? 100.0 * r->ms / total : 0.0);
    }
}

static void prof_destroy(sd_cuda_state *st)
{
    if (!st->prof)
        return;
    prof_report(st);
    for (int i = 0; i < PROF_BATCH; i++)
        cudaEventDestroy(st->prof->ev[i]);
    free(st->prof);
    st->prof = nullptr;
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void sd_cuda_stream_wait(const sd_cuda_state *st, cudaStream_t s)
{
    if (!st->wait_fn) {
        SD_CUDA_CHECK(cudaStreamSynchronize(s));
        return;
    }
    const double t0 = wall_seconds();
    /* with NCCL work queued this waits for the other ranks, as a collective does: the stall
     * watchdog (sdtrain/progress.h) gives it the grace of a rank inside MPI */
    sd_progress_mpi_enter("cudaStreamQuery, polled with NCCL collectives queued", __FILE__,
                          __LINE__);
    for (;;) {
        const cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess) {
            sd_progress_mpi_leave();
            return;
        }
        if (e != cudaErrorNotReady)
            SD_CUDA_CHECK(e);
        const double now = wall_seconds();
        st->wait_fn(st->wait_user, now - t0);
        /* the first 2 ms yield between polls (the read-backs of a step return within
         * microseconds of the GPU, as cudaStreamSynchronize's spin would), then poll every
         * 20 us so that the loader's threads keep their cores during a long backward */
        if (now - t0 < 2e-3) {
            sched_yield();
        } else {
            const struct timespec nap = {0, 20000};
            nanosleep(&nap, nullptr);
        }
    }
}

extern "C" void sd_backend_cuda_set_wait_hook(const sd_backend *be, sd_wait_fn fn, void *user)
{
    if (!be || be->device != SD_DEV_CUDA)
        return;
    sd_cuda_state *st = sd_cuda(be);
    st->wait_fn = fn;
    st->wait_user = user;
}

extern "C" void sd_backend_cuda_wait_stream(const sd_backend *be, void *stream)
{
    SD_CHECK(be && be->device == SD_DEV_CUDA, "sd_backend_cuda_wait_stream: not a CUDA backend");
    sd_cuda_stream_wait(sd_cuda(be), (cudaStream_t)stream);
}

extern "C" void sd_backend_cuda_after_op(const sd_backend *be, void *stream)
{
    SD_CHECK(be && be->device == SD_DEV_CUDA, "sd_backend_cuda_after_op: not a CUDA backend");
    cudaError_t e = cudaGetLastError();
    /* a library that enables peer access itself (NCCL connecting GPUs of one node lazily) may
     * leave this one behind: nothing failed */
    if (e == cudaErrorPeerAccessAlreadyEnabled)
        e = cudaSuccess;
    SD_CUDA_CHECK(e);
    if (sd_cuda(be)->sync_each_op)
        sd_cuda_stream_wait(sd_cuda(be), (cudaStream_t)stream);
}

static void cuda_synchronize(const sd_backend *be)
{
    sd_cuda_stream_wait(sd_cuda(be), sd_cuda_stream(be));
}

static void cuda_stream_mark(const sd_backend *be, int slot)
{
    sd_cuda_state *st = sd_cuda(be);
    SD_CUDA_CHECK(cudaEventRecord(st->marks[slot], st->stream));
    st->marks_set |= 1u << slot;
}

/* Does not wait: a mark the GPU has not reached yet gives NAN. A query's "not ready" is not left
 * behind as the thread's last error (sd_cuda_stream_wait's polls rely on that too). */
static double cuda_stream_elapsed(const sd_backend *be, int a, int b)
{
    sd_cuda_state *st = sd_cuda(be);
    float ms = 0.0f;
    if (!(st->marks_set >> a & 1u) || !(st->marks_set >> b & 1u))
        return NAN;
    for (int slot : {a, b}) {
        const cudaError_t e = cudaEventQuery(st->marks[slot]);
        if (e == cudaErrorNotReady)
            return NAN;
        SD_CUDA_CHECK(e);
    }
    SD_CUDA_CHECK(cudaEventElapsedTime(&ms, st->marks[a], st->marks[b]));
    return ms * 1e-3;
}

static void cuda_zero(const sd_backend *be, void *dst, size_t bytes)
{
    SD_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, sd_cuda_stream(be)));
    if (sd_cuda(be)->sync_each_op) /* SDTRAIN_CUDA_SYNC=1: its errors reported here */
        sd_cuda_stream_wait(sd_cuda(be), sd_cuda_stream(be));
}

static void cuda_copy(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, sd_cuda_stream(be)));
    if (sd_cuda(be)->sync_each_op) /* SDTRAIN_CUDA_SYNC=1: its errors reported here */
        sd_cuda_stream_wait(sd_cuda(be), sd_cuda_stream(be));
}

/* Device memory, or page-locked host memory with `pinned`; NULL when it cannot be had (out of
 * memory is reported by the caller, not sticky). */
static void *cuda_alloc_on(const sd_backend *be, size_t bytes, int pinned)
{
    void *p = nullptr;
    SD_CUDA_CHECK(cudaSetDevice(sd_cuda(be)->device));
    cudaError_t e = pinned ? cudaMallocHost(&p, bytes ? bytes : 256)
                           : cudaMalloc(&p, bytes ? bytes : 256);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}

static void *cuda_alloc(const sd_backend *be, size_t bytes)
{
    return cuda_alloc_on(be, bytes, 0);
}

static void cuda_release(const sd_backend *be, void *ptr)
{
    (void)be;
    SD_CUDA_CHECK(cudaFree(ptr));
}

/* A copy between the device and pageable host memory blocks inside the driver until the work
 * queued before it is done (device to host always; host to device may), where the wait hook
 * cannot watch NCCL: while a hook is set, wait for the stream (watched) first. */
void sd_cuda_wait_before_copy(const sd_cuda_state *st, cudaStream_t s)
{
    if (st->wait_fn)
        sd_cuda_stream_wait(st, s);
}

static void cuda_upload(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd_cuda_wait_before_copy(sd_cuda(be), sd_cuda_stream(be));
    SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, sd_cuda_stream(be)));
    sd_cuda_stream_wait(sd_cuda(be), sd_cuda_stream(be));
}

static void cuda_download(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd_cuda_wait_before_copy(sd_cuda(be), sd_cuda_stream(be));
    SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, sd_cuda_stream(be)));
    sd_cuda_stream_wait(sd_cuda(be), sd_cuda_stream(be));
}

static void *cuda_host_alloc(const sd_backend *be, size_t bytes)
{
    return cuda_alloc_on(be, bytes, 1);
}

static void cuda_host_release(const sd_backend *be, void *ptr)
{
    (void)be;
    SD_CUDA_CHECK(cudaFreeHost(ptr));
}

/* On the copy stream, then the compute stream waits for it: ops issued later see the data,
 * ops issued earlier run meanwhile (the copy engine works beside the SMs). */
static void cuda_upload_async(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd_cuda_state *st = sd_cuda(be);
    if (!st->copy_stream_on) { /* SDTRAIN_CUDA_COPY_STREAM=off: in order on the compute stream */
        SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream));
        return;
    }
    SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->copy_stream));
    SD_CUDA_CHECK(cudaEventRecord(st->copy_done, st->copy_stream));
    SD_CUDA_CHECK(cudaStreamWaitEvent(st->stream, st->copy_done, 0));
}

/* On the copy stream after the ops issued so far (an event on the compute stream). */
static void cuda_download_async(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    sd_cuda_state *st = sd_cuda(be);
    if (!st->copy_stream_on) {
        SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
        return;
    }
    SD_CUDA_CHECK(cudaEventRecord(st->compute_mark, st->stream));
    SD_CUDA_CHECK(cudaStreamWaitEvent(st->copy_stream, st->compute_mark, 0));
    SD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->copy_stream));
}

static void cuda_download_wait(const sd_backend *be)
{
    sd_cuda_state *st = sd_cuda(be);
    sd_cuda_stream_wait(st, st->copy_stream_on ? st->copy_stream : st->stream);
}

/* The backend's pinned staging buffer for bf16 conversions (SD_CUDA_STAGE_ELEMS halves), made on
 * first use and kept until the backend is destroyed. The copies through it are synchronous, so
 * one buffer serves every call. */
static uint16_t *cuda_stage(const sd_backend *be)
{
    sd_cuda_state *st = sd_cuda(be);
    if (!st->stage)
        SD_CUDA_CHECK(cudaMallocHost(&st->stage, (size_t)SD_CUDA_STAGE_ELEMS * 2));
    return (uint16_t *)st->stage;
}

/* fp32 host <-> backend dtype: fp32 goes straight; bf16 converts in chunks through the pinned
 * staging buffer (rounding to nearest even, as sd_f32_to_bf16 does). */
static void cuda_upload_f32(const sd_backend *be, void *dst, const float *src, int64_t n)
{
    if (sd_cuda(be)->dtype == SD_F32) {
        cuda_upload(be, dst, src, (size_t)n * sizeof(float));
        return;
    }
    const int64_t chunk = SD_CUDA_STAGE_ELEMS;
    uint16_t *stage = cuda_stage(be);
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        for (int64_t j = 0; j < m; j++)
            stage[j] = sd_f32_to_bf16(src[i + j]);
        cuda_upload(be, (uint16_t *)dst + i, stage, (size_t)m * 2);
    }
}

static void cuda_download_f32(const sd_backend *be, float *dst, const void *src, int64_t n)
{
    if (sd_cuda(be)->dtype == SD_F32) {
        cuda_download(be, dst, src, (size_t)n * sizeof(float));
        return;
    }
    const int64_t chunk = SD_CUDA_STAGE_ELEMS;
    uint16_t *stage = cuda_stage(be);
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        cuda_download(be, stage, (const uint16_t *)src + i, (size_t)m * 2);
        for (int64_t j = 0; j < m; j++)
            dst[i + j] = sd_bf16_to_f32(stage[j]);
    }
}

/* The index of environment variable `name`'s value in `values` (NULL-terminated, the default
 * first): 0 when unset or empty, -1 with err set (listing the values) when it is none of them. */
static int env_choice(const char *name, const char *const *values, sd_err *err)
{
    const char *v = getenv(name);
    char list[160] = "";
    size_t used = 0;
    if (!v || !*v)
        return 0;
    for (int i = 0; values[i]; i++) {
        if (strcmp(v, values[i]) == 0)
            return i;
        used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0, "%s%s",
                                 i ? ", " : "", values[i]);
    }
    sd_err_set(err, "CUDA backend: %s=%s is not one of %s", name, v, list);
    return -1;
}

extern "C" int sd_backend_cuda_create(int device, sd_dtype dtype, sd_backend **out, sd_err *err)
{
    *out = nullptr;
    if (dtype != SD_F32 && dtype != SD_BF16)
        return sd_err_set(err, "CUDA backend: dtype %s is not supported (F32 or BF16)",
                          sd_dtype_name(dtype));
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return sd_err_set(err, "CUDA backend: no usable GPU (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports none");
    }
    if (device < 0 || device >= count)
        return sd_err_set(err, "CUDA backend: device %d does not exist (%d visible)", device, count);
    e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return sd_err_set(err, "CUDA backend: cudaSetDevice(%d): %s", device, cudaGetErrorString(e));

    /* The switches (doc/cuda/README.md), each a list of values, the default first:
     *   SDTRAIN_CUDA_ATTENTION  flash (= auto: the fused kernels where they apply; passed
     *                           tests/gpu on an H100 on 2026-11-22) | math
     *   SDTRAIN_CUDA_GN_STATS   wide (onepass with 4 channels a thread) | onepass | twopass
     *   SDTRAIN_CUDA_GN_APPLY   auto (fast for bf16, regs for fp32) | loads | regs | fast
     *   SDTRAIN_CUDA_CONV_ALGO  heuristic | find
     *   SDTRAIN_CUDA_CONV_API   graph | legacy | graph-rtc (conv forward through cuDNN's graph
     *                           API, ops_cuda_conv_graph.cu, where it has a plan; the default
     *                           since 2026-11-27, when the tests passed with it on an H100 and
     *                           the VAE encode ran 4% faster than legacy, doc/performance.md)
     *   SDTRAIN_CUDA_CONV_BIAS  fused (in cuDNN's epilogue where it takes it) | separate
     *   SDTRAIN_CUDA_COPY_STREAM on | off (asynchronous copies in order on the compute stream:
     *                           no overlap, for telling a copy-stream problem apart)
     * wide and auto became the defaults on 2026-11-26 after the op tests passed on an H200 and
     * bench/gpu-check.sh --parts variants timed them (doc/performance.md). */
    static const char *const attention_values[] = {"flash", "auto", "math", nullptr};
    static const char *const stats_values[] = {"wide", "onepass", "twopass", nullptr};
    static const char *const apply_values[] = {"auto", "loads", "regs", "fast", nullptr};
    static const char *const algo_values[] = {"heuristic", "find", nullptr};
    static const char *const copy_values[] = {"on", "off", nullptr};
    static const char *const api_values[] = {"graph", "legacy", "graph-rtc", nullptr};
    static const char *const bias_values[] = {"fused", "separate", nullptr};
    const int attention = env_choice("SDTRAIN_CUDA_ATTENTION", attention_values, err);
    const int stats = env_choice("SDTRAIN_CUDA_GN_STATS", stats_values, err);
    const int apply = env_choice("SDTRAIN_CUDA_GN_APPLY", apply_values, err);
    const int algo = env_choice("SDTRAIN_CUDA_CONV_ALGO", algo_values, err);
    const int copy = env_choice("SDTRAIN_CUDA_COPY_STREAM", copy_values, err);
    const int api = env_choice("SDTRAIN_CUDA_CONV_API", api_values, err);
    const int bias = env_choice("SDTRAIN_CUDA_CONV_BIAS", bias_values, err);
    if (attention < 0 || stats < 0 || apply < 0 || algo < 0 || copy < 0 || api < 0 || bias < 0)
        return -1;

    sd_cuda_state *st = (sd_cuda_state *)calloc(1, sizeof *st);
    if (!st)
        return sd_err_set(err, "CUDA backend: out of host memory");
    st->device = device;
    st->dtype = dtype;
    st->attention_mode = attention == 2 ? SD_CUDA_ATTENTION_MATH : SD_CUDA_ATTENTION_FLASH;
    st->gn_onepass = stats == 0 ? 2 : stats == 1 ? 1 : 0;
    st->gn_apply = apply == 0 ? SD_CUDA_GN_APPLY_AUTO : apply - 1;
    st->conv_find = algo;
    st->conv_api = api; /* the list's order is the SD_CUDA_CONV_API_* values' */
    st->conv_bias_separate = bias == 1;
    st->copy_stream_on = copy == 0;
    const char *sync = getenv("SDTRAIN_CUDA_SYNC");
    st->sync_each_op = sync && strcmp(sync, "1") == 0;
    SD_CUDA_CHECK(cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, device));
    SD_CUDA_CHECK(cudaStreamCreateWithFlags(&st->stream, cudaStreamNonBlocking));
    SD_CUDA_CHECK(cudaStreamCreateWithFlags(&st->copy_stream, cudaStreamNonBlocking));
    SD_CUDA_CHECK(cudaEventCreateWithFlags(&st->copy_done, cudaEventDisableTiming));
    SD_CUDA_CHECK(cudaEventCreateWithFlags(&st->compute_mark, cudaEventDisableTiming));
    for (int i = 0; i < SD_STREAM_MARKS; i++)
        SD_CUDA_CHECK(cudaEventCreate(&st->marks[i]));
    SD_CUBLAS_CHECK(cublasLtCreate(&st->lt));
    SD_CUDNN_CHECK(cudnnCreate(&st->dnn));
    SD_CUDNN_CHECK(cudnnSetStream(st->dnn, st->stream));
    e = cudaMalloc(&st->lt_workspace, SD_CUDA_LT_WORKSPACE);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudnnDestroy(st->dnn);
        cublasLtDestroy(st->lt);
        for (int i = 0; i < SD_STREAM_MARKS; i++)
            cudaEventDestroy(st->marks[i]);
        cudaEventDestroy(st->compute_mark);
        cudaEventDestroy(st->copy_done);
        cudaStreamDestroy(st->copy_stream);
        cudaStreamDestroy(st->stream);
        free(st);
        return sd_err_set(err, "CUDA backend: cannot allocate the %u MiB cuBLASLt workspace: %s",
                          SD_CUDA_LT_WORKSPACE >> 20, cudaGetErrorString(e));
    }

    sd_ops *ops = &st->ops;
    ops->synchronize = cuda_synchronize;
    ops->zero = cuda_zero;
    ops->copy = cuda_copy;
    ops->upload_f32 = cuda_upload_f32;
    ops->download_f32 = cuda_download_f32;
    ops->alloc = cuda_alloc;
    ops->release = cuda_release;
    ops->upload = cuda_upload;
    ops->download = cuda_download;
    ops->host_alloc = cuda_host_alloc;
    ops->host_release = cuda_host_release;
    ops->upload_async = cuda_upload_async;
    ops->download_async = cuda_download_async;
    ops->download_wait = cuda_download_wait;
    ops->stream_mark = cuda_stream_mark;
    ops->stream_elapsed = cuda_stream_elapsed;
    sd_cuda_fill_elementwise_ops(ops);
    sd_cuda_fill_norm_ops(ops);
    sd_cuda_fill_conv_ops(ops);
    sd_cuda_fill_gemm_ops(ops);
    sd_cuda_fill_attention_ops(ops); /* after the math path it falls back on */
    const char *profile = getenv("SDTRAIN_CUDA_PROFILE");
    if (profile && strcmp(profile, "1") == 0) {
        st->prof = (sd_cuda_prof *)calloc(1, sizeof *st->prof);
        SD_CHECK(st->prof != nullptr, "CUDA backend: out of host memory for the op profile");
        for (int i = 0; i < PROF_BATCH; i++)
            SD_CUDA_CHECK(cudaEventCreate(&st->prof->ev[i]));
        ops->profile_mark = sd_cuda_profile_mark;
        ops->profile_reset = cuda_profile_reset;
    }

    st->backend.name = "cuda";
    st->backend.device = SD_DEV_CUDA;
    st->backend.dtype = dtype;
    st->backend.ops = &st->ops;
    st->backend.impl = st;
    *out = &st->backend;
    return 0;
}

extern "C" void *sd_backend_cuda_stream(const sd_backend *be)
{
    SD_CHECK(be && be->device == SD_DEV_CUDA, "sd_backend_cuda_stream: not a CUDA backend");
    return (void *)sd_cuda_stream(be);
}

extern "C" void sd_backend_cuda_destroy(sd_backend *be)
{
    if (!be)
        return;
    sd_cuda_state *st = sd_cuda(be);
    cudaStreamSynchronize(st->copy_stream);
    cudaStreamSynchronize(st->stream);
    prof_destroy(st);
    sd_cuda_conv_cache_destroy(st);
    sd_cuda_gemm_cache_destroy(st);
    if (st->stage)
        cudaFreeHost(st->stage);
    cudaFree(st->lt_workspace);
    cudnnDestroy(st->dnn);
    cublasLtDestroy(st->lt);
    for (int i = 0; i < SD_STREAM_MARKS; i++)
        cudaEventDestroy(st->marks[i]);
    cudaEventDestroy(st->compute_mark);
    cudaEventDestroy(st->copy_done);
    cudaStreamDestroy(st->copy_stream);
    cudaStreamDestroy(st->stream);
    free(st);
}
