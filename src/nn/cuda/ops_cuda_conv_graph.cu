/* conv2d forward through cuDNN's graph (backend) API: conv -> + bias, or conv -> + residual ->
 * + bias, as one operation graph, fp32 intermediates, rounded once into y (BF16; F32 keeps the
 * legacy API). SDTRAIN_CUDA_CONV_API=graph, the default since it ran on an H100 on 2026-11-27
 * (graph-rtc also admits engines that compile their kernel at run time; legacy turns it off);
 * the legacy API (ops_cuda_conv.cu) is the fallback for every shape, call or pointer the graph
 * path does not take. doc/cuda/conv.md, "Graph API".
 *
 * Why: the legacy API's heuristics pick IMPLICIT_PRECOMP_GEMM for every SD2 shape (470-680
 * TFLOP/s bf16 on an H100), while the graph API's heuristics also list the engines written for
 * the card itself; and the graph API takes asymmetric padding (pre / post paddings), so the VAE's
 * Downsample2D needs no padded copy of its input.
 *
 * Plans are built once per (shape, dtype, residual or not) when the conv's cache entry is made:
 * cuDNN's heuristics (mode A) list engine configurations best first; the first whose engine is
 * deterministic, does no FFT / Winograd / reduced-precision reduction / input down-conversion
 * (F32 additionally: no tensor cores, so no TF32), finalizes into an execution plan and needs at
 * most the workspace cap is taken; with SDTRAIN_CUDA_CONV_ALGO=find up to 8 such plans are timed
 * on scratch buffers and the fastest is taken. Nothing here aborts: any refusal returns NULL with
 * the reason, and the caller keeps the legacy path. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_internal.h"

/* The deprecated-in-9.19 handle attributes that cuDNN 9.14 (the lent machines' run time) still
 * wants on the operation graph and the execution plan; spelled as numbers so the newer headers'
 * deprecation does not warn. */
static const cudnnBackendAttributeName_t ATTR_OPGRAPH_HANDLE = (cudnnBackendAttributeName_t)800;
static const cudnnBackendAttributeName_t ATTR_PLAN_HANDLE = (cudnnBackendAttributeName_t)400;

enum { UID_X = 1, UID_W, UID_B, UID_Z, UID_Y, UID_CONV, UID_BIASED };

/* Every descriptor a plan was built from stays alive with it (cudnn-frontend keeps them too). */
#define GRAPH_KEEP_MAX 24
struct sd_conv_graph {
    cudnnBackendDescriptor_t plan;
    cudnnBackendDescriptor_t keep[GRAPH_KEEP_MAX];
    int nkeep;
    int64_t ws;       /* workspace bytes */
    int64_t engine;   /* cuDNN's global engine index */
    int rtc;          /* the engine compiles at run time */
    int with_z;       /* the residual input is part of the graph */
    float ms;         /* timed (find), or -1 */
    int candidates;   /* configurations cuDNN listed */
};

/* ---- building ------------------------------------------------------------------------------ */

typedef struct gbuild {
    sd_conv_graph *g;
    char *why;
    size_t nwhy;
} gbuild;

/* 0 on success; else the reason in b->why and -1 */
static int gfail(gbuild *b, const char *what, cudnnStatus_t s)
{
    snprintf(b->why, b->nwhy, "%s: %s", what, cudnnGetErrorString(s));
    return -1;
}
#define GTRY(b, call)                                                                            \
    do {                                                                                         \
        cudnnStatus_t gs_ = (call);                                                              \
        if (gs_ != CUDNN_STATUS_SUCCESS)                                                         \
            return gfail((b), #call, gs_);                                                       \
    } while (0)

static int gcreate(gbuild *b, cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t *d)
{
    if (b->g->nkeep == GRAPH_KEEP_MAX) {
        snprintf(b->why, b->nwhy, "more than %d cuDNN descriptors", GRAPH_KEEP_MAX);
        return -1;
    }
    GTRY(b, cudnnBackendCreateDescriptor(type, d));
    b->g->keep[b->g->nkeep++] = *d;
    return 0;
}

/* A 4-D tensor [n, c, h, w] (cuDNN's order of dimensions) laid out NHWC in memory; virtual ones
 * (fp32 intermediates) never reach memory. */
static int gtensor(gbuild *b, int64_t uid, cudnnDataType_t dt, int64_t n, int64_t c, int64_t h,
                   int64_t w, bool is_virtual, cudnnBackendDescriptor_t *out)
{
    const int64_t dims[4] = {n, c, h, w};
    const int64_t strides[4] = {h * w * c, 1, w * c, c};
    const int64_t align = 16;
    cudnnBackendDescriptor_t t;
    if (gcreate(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, &t))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt));
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1,
                                     &align));
    GTRY(b, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                     &is_virtual));
    GTRY(b, cudnnBackendFinalize(t));
    *out = t;
    return 0;
}

/* out = in + other (a broadcast [1, c, 1, 1] bias or a full residual), fp32 arithmetic */
static int gadd(gbuild *b, cudnnBackendDescriptor_t in, cudnnBackendDescriptor_t other,
                cudnnBackendDescriptor_t out, cudnnBackendDescriptor_t *op)
{
    cudnnBackendDescriptor_t pw;
    const cudnnPointwiseMode_t mode = CUDNN_POINTWISE_ADD;
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    if (gcreate(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                     &mode));
    GTRY(b, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1,
                                     &prec));
    GTRY(b, cudnnBackendFinalize(pw));
    if (gcreate(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw));
    GTRY(b, cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &in));
    GTRY(b, cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &other));
    GTRY(b, cudnnBackendSetAttribute(*op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out));
    GTRY(b, cudnnBackendFinalize(*op));
    return 0;
}

/* The finalized operation graph: conv -> + bias -> y, or conv -> + z -> + bias -> y. */
static int gops(gbuild *b, cudnnHandle_t h, const sd_conv2d_desc *d, sd_dtype dtype, int with_z,
                cudnnBackendDescriptor_t *graph)
{
    const cudnnDataType_t dt = dtype == SD_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t x, w, bias, z = nullptr, y, conv_out, biased = nullptr;
    if (gtensor(b, UID_X, dt, d->n, d->c_in, d->h, d->w, false, &x) ||
        gtensor(b, UID_W, dt, d->c_out, d->c_in, d->kh, d->kw, false, &w) ||
        gtensor(b, UID_B, dt, 1, d->c_out, 1, 1, false, &bias) ||
        gtensor(b, UID_Y, dt, d->n, d->c_out, d->h_out, d->w_out, false, &y) ||
        gtensor(b, UID_CONV, f32, d->n, d->c_out, d->h_out, d->w_out, true, &conv_out))
        return -1;
    if (with_z && (gtensor(b, UID_Z, dt, d->n, d->c_out, d->h_out, d->w_out, false, &z) ||
                   gtensor(b, UID_BIASED, f32, d->n, d->c_out, d->h_out, d->w_out, true, &biased)))
        return -1;

    cudnnBackendDescriptor_t cd;
    const int64_t spatial = 2;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dil[2] = {1, 1}, str[2] = {d->stride, d->stride};
    const int64_t pre[2] = {d->pad_top, d->pad_left}, post[2] = {d->pad_bottom, d->pad_right};
    if (gcreate(b, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &cd))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1,
                                     &spatial));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                     &f32));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                     CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64,
                                     2, str));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2,
                                     pre));
    GTRY(b, cudnnBackendSetAttribute(cd, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2,
                                     post));
    GTRY(b, cudnnBackendFinalize(cd));

    cudnnBackendDescriptor_t ops[3];
    const float one = 1.0f, zero = 0.0f;
    if (gcreate(b, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, &ops[0]))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv_out));
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd));
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                     CUDNN_TYPE_FLOAT, 1, &one));
    GTRY(b, cudnnBackendSetAttribute(ops[0], CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                     CUDNN_TYPE_FLOAT, 1, &zero));
    GTRY(b, cudnnBackendFinalize(ops[0]));
    /* (conv + z) + b, the legacy fused call's y = conv + z + bias: cuDNN's precompiled engines
     * take this pattern, while (conv + b) + z gets none (its heuristics for an H100 list 0
     * configurations for every SD2 shape; tests/gpu/test_cuda_conv_graph) */
    if (with_z) {
        if (gadd(b, conv_out, z, biased, &ops[1]) || gadd(b, biased, bias, y, &ops[2]))
            return -1;
    } else if (gadd(b, conv_out, bias, y, &ops[1])) {
        return -1;
    }

    const int64_t nops = with_z ? 3 : 2;
    if (gcreate(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, graph))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops));
    /* NULL: sd_cuda_conv_graph_check, no device (cuDNN >= 9.8 finalizes without). A version
     * that no longer takes the handle may refuse it: the finalize below then says whether it
     * was needed */
    if (h)
        (void)cudnnBackendSetAttribute(*graph, ATTR_OPGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    GTRY(b, cudnnBackendFinalize(*graph));
    return 0;
}

/* Whether an engine configuration's notes allow it: 1 yes, 0 no; *rtc set from its notes. */
static int gengine_ok(cudnnBackendDescriptor_t cfg, sd_dtype dtype, int allow_rtc,
                      int64_t *engine, int *rtc)
{
    cudnnBackendDescriptor_t eng;
    int ok = 1;
    *engine = -1;
    *rtc = 0;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) != CUDNN_STATUS_SUCCESS)
        return 0;
    int64_t got = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &got, &eng) != CUDNN_STATUS_SUCCESS || got != 1) {
        cudnnBackendDestroyDescriptor(eng);
        return 0;
    }
    cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, engine);

    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    int64_t nn = 0;
    if (cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                 CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) != CUDNN_STATUS_SUCCESS)
        ok = 0;
    for (int64_t i = 0; ok && i < nn; i++)
        switch (notes[i]) {
        case CUDNN_NUMERICAL_NOTE_TENSOR_CORE: ok = dtype == SD_BF16; break; /* F32: no TF32 */
        case CUDNN_NUMERICAL_NOTE_STRICT_NAN_PROP: break;
        default: ok = 0; /* nondeterministic, FFT, Winograd, reduced precision, down-conversion */
        }

    cudnnBackendBehaviorNote_t bnotes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
    int64_t nb = 0;
    if (ok && cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                       CUDNN_TYPE_BEHAVIOR_NOTE, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT,
                                       &nb, bnotes) == CUDNN_STATUS_SUCCESS) {
        for (int64_t i = 0; i < nb; i++)
            if (bnotes[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)
                *rtc = 1;
    } else if (ok) {
        *rtc = 1; /* unknown: only where run-time compilation is allowed */
    }
    if (*rtc && !allow_rtc)
        ok = 0;
    cudnnBackendDestroyDescriptor(eng);
    return ok;
}

/* An execution plan for cfg, or NULL (its workspace in *ws): for the handle's device, or for
 * the device devprop describes (h NULL: sd_cuda_conv_graph_engines, no GPU). */
static cudnnBackendDescriptor_t gplan(cudnnHandle_t h, cudnnBackendDescriptor_t devprop,
                                      cudnnBackendDescriptor_t cfg, int64_t *ws)
{
    cudnnBackendDescriptor_t plan;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) !=
        CUDNN_STATUS_SUCCESS)
        return nullptr;
    int64_t got = 0;
    *ws = 0;
    /* the handle as on the graph: refused by a version that no longer takes it */
    if (h)
        (void)cudnnBackendSetAttribute(plan, ATTR_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    else if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &devprop) != CUDNN_STATUS_SUCCESS) {
        cudnnBackendDestroyDescriptor(plan);
        return nullptr;
    }
    if (cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                 1, &got, ws) != CUDNN_STATUS_SUCCESS ||
        *ws < 0) {
        cudnnBackendDestroyDescriptor(plan);
        return nullptr;
    }
    return plan;
}

static cudnnStatus_t gexecute(cudnnHandle_t h, cudnnBackendDescriptor_t plan, int with_z,
                              const void *x, const void *w, const void *b, const void *z, void *y,
                              void *ws)
{
    int64_t uids[5] = {UID_X, UID_W, UID_B, UID_Y, UID_Z};
    void *ptrs[5] = {(void *)x, (void *)w, (void *)b, y, (void *)z};
    cudnnBackendDescriptor_t vp;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s != CUDNN_STATUS_SUCCESS)
        return s;
    const int64_t n = with_z ? 5 : 4;
    if ((s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids)) == CUDNN_STATUS_SUCCESS &&
        (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, n, ptrs)) == CUDNN_STATUS_SUCCESS &&
        (s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                      &ws)) == CUDNN_STATUS_SUCCESS &&
        (s = cudnnBackendFinalize(vp)) == CUDNN_STATUS_SUCCESS)
        s = cudnnBackendExecute(h, plan, vp);
    cudnnBackendDestroyDescriptor(vp);
    return s;
}

/* The timing buffers' slots (gtime_buffers). */
enum { TB_X, TB_W, TB_B, TB_Y, TB_Z, TB_WS, TB_N };

/* Median-free timing: the best of 3 runs after one warm-up, in ms; < 0 when a run fails. */
static float gtime(sd_cuda_state *st, cudnnBackendDescriptor_t plan, int with_z, void *const *buf)
{
    cudaEvent_t a, b;
    float best = -1.0f;
    if (cudaEventCreate(&a) != cudaSuccess)
        return -1.0f;
    if (cudaEventCreate(&b) != cudaSuccess) {
        cudaEventDestroy(a);
        return -1.0f;
    }
    for (int r = 0; r < 4; r++) {
        cudaEventRecord(a, st->stream);
        if (gexecute(st->dnn, plan, with_z, buf[TB_X], buf[TB_W], buf[TB_B], buf[TB_Z], buf[TB_Y],
                     buf[TB_WS]) != CUDNN_STATUS_SUCCESS) {
            best = -1.0f;
            break;
        }
        cudaEventRecord(b, st->stream);
        float ms = 0.0f;
        if (cudaEventSynchronize(b) != cudaSuccess || cudaEventElapsedTime(&ms, a, b) != cudaSuccess) {
            best = -1.0f;
            break;
        }
        if (r > 0 && (best < 0.0f || ms < best))
            best = ms;
    }
    cudaGetLastError();
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

/* Device buffers for timing plans of this shape, zeroed: buf[TB_X..TB_Z] and the largest
 * workspace in buf[TB_WS]; 0 when they cannot be had (then no timing, nothing held). */

static void gtime_buffers_free(void **buf)
{
    for (int i = 0; i < TB_N; i++) {
        cudaFree(buf[i]); /* NULL: nothing */
        buf[i] = nullptr;
    }
}

static int gtime_buffers(const sd_conv2d_desc *d, sd_dtype dtype, int64_t ws_max,
                         cudaStream_t stream, void **buf)
{
    const size_t e = dtype == SD_BF16 ? 2 : 4;
    const size_t y = (size_t)d->n * d->h_out * d->w_out * d->c_out * e;
    const size_t bytes[TB_N] = {(size_t)d->n * d->h * d->w * d->c_in * e,
                                (size_t)d->c_out * d->kh * d->kw * d->c_in * e,
                                (size_t)d->c_out * e, y, y, (size_t)ws_max};
    for (int i = 0; i < TB_N; i++)
        buf[i] = nullptr;
    for (int i = 0; i < TB_N; i++)
        if (bytes[i] && (cudaMalloc(&buf[i], bytes[i]) != cudaSuccess ||
                         cudaMemsetAsync(buf[i], 0, bytes[i], stream) != cudaSuccess)) {
            cudaGetLastError();
            gtime_buffers_free(buf);
            return 0;
        }
    return 1;
}

#define GRAPH_FIND_MAX 8

/* cuDNN's engine configurations for the finalized graph, heuristics mode A, best first: *count
 * descriptors made in *cfgs (the caller destroys them), *got of them filled. For the handle's
 * device, or for the device devprop describes (sd_cuda_conv_graph_engines, no GPU). 0, or -1
 * with the reason. */
static int gheur(gbuild *b, cudnnBackendDescriptor_t graph, cudnnBackendDescriptor_t devprop,
                 cudnnBackendDescriptor_t **cfgs, int64_t *count, int64_t *got)
{
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur;
    *cfgs = nullptr;
    *count = *got = 0;
    if (gcreate(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur))
        return -1;
    GTRY(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph));
    GTRY(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                     &mode));
    if (devprop)
        GTRY(b, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop));
    {
        const cudnnStatus_t s = cudnnBackendFinalize(heur);
        if (s != CUDNN_STATUS_SUCCESS)
            return gfail(b, "heuristics (mode A) for the graph", s);
    }
    int64_t n = 0;
    if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 0, &n, nullptr) != CUDNN_STATUS_SUCCESS ||
        n <= 0) {
        snprintf(b->why, b->nwhy, "cuDNN's heuristics list no engine for the graph");
        return -1;
    }
    *cfgs = (cudnnBackendDescriptor_t *)sd_xcalloc((size_t)n, sizeof **cfgs);
    for (int64_t i = 0; i < n; i++, ++*count)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &(*cfgs)[i]) !=
            CUDNN_STATUS_SUCCESS)
            break;
    /* asking for 0 would return the total again, not fill anything */
    if (*count == 0 ||
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 *count, got, *cfgs) != CUDNN_STATUS_SUCCESS)
        *got = 0;
    if (*got > *count)
        *got = *count;
    return 0;
}

sd_conv_graph *sd_cuda_conv_graph_build(sd_cuda_state *st, const sd_conv2d_desc *d, int with_z,
                                        size_t ws_cap, char *why, size_t nwhy)
{
    sd_conv_graph *g = (sd_conv_graph *)sd_xcalloc(1, sizeof *g);
    g->with_z = with_z;
    g->ms = -1.0f;
    gbuild b = {g, why, nwhy};
    cudnnBackendDescriptor_t graph;
    cudnnBackendDescriptor_t *cfgs = nullptr;
    int64_t count = 0, got = 0;
    const int allow_rtc = st->conv_api == SD_CUDA_CONV_API_GRAPH_RTC;
    /* the passing candidates, in cuDNN's order */
    cudnnBackendDescriptor_t plans[GRAPH_FIND_MAX];
    int64_t wss[GRAPH_FIND_MAX], engines[GRAPH_FIND_MAX];
    int rtcs[GRAPH_FIND_MAX], cfg_of[GRAPH_FIND_MAX], np = 0;
    /* timed: up to 8 plans, 3 where each may compile its kernel first (seconds apiece) */
    const int want = !st->conv_find ? 1 : allow_rtc ? 3 : GRAPH_FIND_MAX;
    int best = -1;

    /* The plans declare 16-byte aligned tensors; a call whose pointers are not falls back to
     * the legacy API. Per-image calls (batch-invariant mode) at offsets of whole images would
     * then alternate between the two paths unless an image's bytes are a multiple of 16: such
     * shapes get no plan, so every call of a shape takes the same path. */
    {
        const size_t e = st->dtype == SD_BF16 ? 2 : 4;
        if (((size_t)d->h * d->w * d->c_in * e) % 16 != 0 ||
            ((size_t)d->h_out * d->w_out * d->c_out * e) % 16 != 0) {
            snprintf(why, nwhy, "an image's input or output is not a whole number of 16-byte "
                     "units");
            goto fail;
        }
    }
    if (st->dtype != SD_BF16) {
        /* without tensor cores (no TF32) the heuristics for an H100 offer generic engines only
         * (44, needing over 1 GiB of workspace at 256 px, and 11), which nothing has shown to
         * beat the legacy IMPLICIT_PRECOMP_GEMM; fp32 is the mode of the comparisons */
        snprintf(why, nwhy, "fp32 keeps the legacy API");
        goto fail;
    }
    if (gops(&b, st->dnn, d, st->dtype, with_z, &graph) ||
        gheur(&b, graph, nullptr, &cfgs, &count, &got))
        goto fail;
    g->candidates = (int)got;
    for (int64_t i = 0; i < got && np < want; i++) {
        int64_t engine = -1, ws = 0;
        int rtc = 0;
        if (!gengine_ok(cfgs[i], st->dtype, allow_rtc, &engine, &rtc))
            continue;
        cudnnBackendDescriptor_t p = gplan(st->dnn, nullptr, cfgs[i], &ws);
        if (!p)
            continue;
        if ((uint64_t)ws > ws_cap) {
            cudnnBackendDestroyDescriptor(p);
            continue;
        }
        plans[np] = p;
        wss[np] = ws;
        engines[np] = engine;
        rtcs[np] = rtc;
        cfg_of[np] = (int)i;
        np++;
    }
    if (np == 0) {
        snprintf(why, nwhy, "none of the %lld engine configurations cuDNN listed is usable "
                 "(deterministic, no FFT / Winograd / reduced precision%s%s, a finalized plan, "
                 "workspace <= %zu B)", (long long)got,
                 st->dtype == SD_F32 ? ", no tensor cores" : "",
                 allow_rtc ? "" : ", no run-time compilation", ws_cap);
        goto fail;
    }
    best = 0;
    if (np > 1) {
        int64_t ws_max = 0;
        for (int i = 0; i < np; i++)
            ws_max = wss[i] > ws_max ? wss[i] : ws_max;
        void *buf[TB_N];
        if (gtime_buffers(d, st->dtype, ws_max, st->stream, buf)) {
            float best_ms = -1.0f;
            for (int i = 0; i < np; i++) {
                const float ms = gtime(st, plans[i], with_z, buf);
                if (ms >= 0.0f && (best_ms < 0.0f || ms < best_ms)) {
                    best_ms = ms;
                    best = i;
                }
            }
            g->ms = best_ms;
            gtime_buffers_free(buf);
        }
    }
    for (int i = 0; i < np; i++)
        if (i != best)
            cudnnBackendDestroyDescriptor(plans[i]);
    g->plan = plans[best];
    g->ws = wss[best];
    g->engine = engines[best];
    g->rtc = rtcs[best];
    for (int64_t i = 0; i < count; i++)
        if (i != cfg_of[best])
            cudnnBackendDestroyDescriptor(cfgs[i]);
    if (g->nkeep < GRAPH_KEEP_MAX)
        g->keep[g->nkeep++] = cfgs[cfg_of[best]];
    else /* unreachable: gops leaves room; the plan does not need the config after finalizing */
        cudnnBackendDestroyDescriptor(cfgs[cfg_of[best]]);
    free(cfgs);
    return g;

fail:
    for (int64_t i = 0; i < count && cfgs; i++)
        cudnnBackendDestroyDescriptor(cfgs[i]);
    free(cfgs);
    sd_cuda_conv_graph_free(g);
    return nullptr;
}

/* 1 (why says so) when this cuDNN cannot finalize an operation graph without a device */
static int gneeds_device(char *why, size_t nwhy)
{
    why[0] = '\0';
    if (cudnnGetVersion() >= 90800)
        return 0;
    snprintf(why, nwhy, "cuDNN %zu finalizes an operation graph only with a handle (a GPU)",
             cudnnGetVersion());
    return 1;
}

extern "C" int sd_cuda_conv_graph_check(const sd_conv2d_desc *d, sd_dtype dtype, int with_z,
                                        char *why, size_t nwhy)
{
    if (gneeds_device(why, nwhy))
        return 1;
    sd_conv_graph *g = (sd_conv_graph *)sd_xcalloc(1, sizeof *g);
    gbuild b = {g, why, nwhy};
    cudnnBackendDescriptor_t graph;
    const int r = gops(&b, nullptr, d, dtype, with_z, &graph);
    sd_cuda_conv_graph_free(g);
    return r;
}

extern "C" int sd_cuda_conv_graph_engines(const sd_conv2d_desc *d, sd_dtype dtype, int with_z,
                                          const char *device_json, size_t ws_cap, int *usable,
                                          int *listed, char *why, size_t nwhy)
{
    *usable = *listed = 0;
    if (gneeds_device(why, nwhy))
        return 1;
    sd_conv_graph *g = (sd_conv_graph *)sd_xcalloc(1, sizeof *g);
    gbuild b = {g, why, nwhy};
    cudnnBackendDescriptor_t graph, devprop;
    cudnnBackendDescriptor_t *cfgs = nullptr;
    int64_t count = 0, got = 0;
    int r = gops(&b, nullptr, d, dtype, with_z, &graph);
    if (r == 0) {
        /* a version without device descriptions cannot be asked: not checkable (1) */
        if (gcreate(&b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &devprop) ||
            cudnnBackendSetAttribute(devprop, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
                                     CUDNN_TYPE_CHAR, (int64_t)strlen(device_json),
                                     device_json) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendFinalize(devprop) != CUDNN_STATUS_SUCCESS) {
            snprintf(why, nwhy, "cuDNN %zu does not take this device description",
                     cudnnGetVersion());
            r = 1;
        }
    }
    if (r == 0)
        r = gheur(&b, graph, devprop, &cfgs, &count, &got);
    for (int64_t i = 0; r == 0 && i < got; i++) {
        int64_t engine = -1, ws = 0;
        int rtc = 0;
        if (!gengine_ok(cfgs[i], dtype, 0, &engine, &rtc))
            continue;
        cudnnBackendDescriptor_t p = gplan(nullptr, devprop, cfgs[i], &ws);
        if (!p)
            continue;
        cudnnBackendDestroyDescriptor(p);
        if ((uint64_t)ws > ws_cap)
            continue;
        if (++*usable == 1) /* what the path would take without timing */
            snprintf(why, nwhy, "the first: engine %lld, %lld B of workspace", (long long)engine,
                     (long long)ws);
    }
    *listed = (int)got;
    for (int64_t i = 0; i < count; i++)
        cudnnBackendDestroyDescriptor(cfgs[i]);
    free(cfgs);
    sd_cuda_conv_graph_free(g);
    return r;
}

void sd_cuda_conv_graph_free(sd_conv_graph *g)
{
    if (!g)
        return;
    if (g->plan)
        cudnnBackendDestroyDescriptor(g->plan);
    for (int i = g->nkeep - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(g->keep[i]);
    free(g);
}

size_t sd_cuda_conv_graph_ws(const sd_conv_graph *g)
{
    return g ? (size_t)g->ws : 0;
}

void sd_cuda_conv_graph_describe(const sd_conv_graph *g, char *buf, size_t n)
{
    if (!g) {
        snprintf(buf, n, "none");
        return;
    }
    if (g->ms >= 0.0f)
        snprintf(buf, n, "engine %lld%s (%lld B, %.3f ms timed, %d listed)", (long long)g->engine,
                 g->rtc ? " run-time compiled" : "", (long long)g->ws, g->ms, g->candidates);
    else
        snprintf(buf, n, "engine %lld%s (%lld B, %d listed)", (long long)g->engine,
                 g->rtc ? " run-time compiled" : "", (long long)g->ws, g->candidates);
}

/* 16-byte alignment of every pointer the plan was declared with */
static int galigned(const void *p)
{
    return p == nullptr || ((uintptr_t)p & 15) == 0;
}

int sd_cuda_conv_graph_run(sd_cuda_state *st, const sd_conv_graph *g, const void *x,
                           const void *w, const void *b, const void *z, void *y, void *ws,
                           char *why, size_t nwhy)
{
    if (!g || !b || (z != nullptr) != (g->with_z != 0) || !galigned(x) || !galigned(w) ||
        !galigned(b) || !galigned(z) || !galigned(y) || (g->ws && !galigned(ws)))
        return 0;
    const cudnnStatus_t s = gexecute(st->dnn, g->plan, g->with_z, x, w, b, z, y, ws);
    if (s != CUDNN_STATUS_SUCCESS) {
        snprintf(why, nwhy, "cudnnBackendExecute: %s", cudnnGetErrorString(s));
        return -1;
    }
    st->conv_graph_runs++;
    return 1;
}
