/* CUDA conv2d forward and backward through cuDNN's convolution API, NHWC tensors and KRSC
 * (= [c_out, kh, kw, c_in]) filters. doc/cuda/conv.md is the long version of these comments.
 *
 * - One cache entry per (shape, dtype) holds the cuDNN descriptors and the three algorithms
 *   (forward, backward data, backward filter), chosen once from cuDNN's heuristics: the first
 *   result that succeeded, is deterministic, is a GEMM-type algorithm (no FFT / Winograd, whose
 *   transforms round differently from a direct sum), has an allowed math type (F32: FMA or
 *   default, and the descriptor stays FMA so TF32 is never used; results reported with the
 *   descriptor's own math type are preferred), runs with our descriptors
 *   (its workspace query succeeds) and needs at most CONV_WORKSPACE_CAP bytes of workspace.
 * - Asymmetric padding (VAE Downsample2D) is done explicitly: x is copied into a zero-bordered
 *   scratch tensor and cuDNN convolves with padding 0; backward computes dx of the padded
 *   tensor in scratch and crops it. Symmetric padding goes to cuDNN as it is.
 * - With SDTRAIN_CUDA_CONV_API=graph (the default) or graph-rtc, a BF16 entry also holds
 *   graph-API plans for conv + bias and conv + bias + residual (ops_cuda_conv_graph.cu, which takes asymmetric
 *   padding itself); a forward call that fits one runs it, every other call (and every shape
 *   cuDNN has no such plan for) runs the legacy calls below.
 * - Weight gradients are fp32: F32 mode lets cuDNN add into dw (beta 1); BF16 mode computes a
 *   bf16 dw in scratch (cuDNN's tensors share one data type) and a kernel adds it into dw.
 * - Scratch is carved in a fixed order of 256-aligned pieces (conv_layout), so the size query
 *   and the op agree exactly. */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_internal.h"

/* The largest cuDNN workspace an algorithm may ask for. */
#define CONV_WORKSPACE_CAP ((size_t)1 << 30)

/* ---- the algorithm cache ------------------------------------------------------------------ */

typedef struct conv_entry {
    sd_conv2d_desc key;
    sd_dtype dtype;
    int explicit_pad;  /* asymmetric padding: cuDNN sees the padded input with padding 0 */
    int hp, wp;        /* height and width of the input cuDNN sees */
    cudnnTensorDescriptor_t x_desc; /* [n, hp, wp, c_in] NHWC; also dx (of the padded input) */
    cudnnTensorDescriptor_t y_desc; /* [n, h_out, w_out, c_out] NHWC; also dy */
    cudnnFilterDescriptor_t w_desc; /* [c_out, kh, kw, c_in] (KRSC); also dw */
    cudnnConvolutionDescriptor_t conv_desc;
    cudnnConvolutionFwdAlgo_t fwd_algo;
    cudnnConvolutionBwdDataAlgo_t bwd_data_algo;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo;
    size_t fwd_ws, bwd_data_ws, bwd_filter_ws; /* workspace bytes of each algorithm */
    int bwd_data_ok;   /* 0: cuDNN has no usable backward-data algorithm for this shape (the
                        * error is raised only if a backward pass asks for dx) */
    /* Bias in cuDNN's epilogue (cudnnConvolutionBiasActivationForward, identity activation: only
     * with the IMPLICIT_PRECOMP_GEMM algorithm) instead of a separate pass over y: 0 not tried
     * yet, 1 works, -1 refused by cuDNN for this shape (then the separate kernel). */
    int fused_bias;
    cudnnTensorDescriptor_t b_desc; /* [1, c_out, 1, 1] */
    cudnnActivationDescriptor_t act; /* identity */
    /* graph-API forward plans (SDTRAIN_CUDA_CONV_API=graph): [0] conv + bias, [1] conv + bias
     * + residual; NULL where cuDNN offers none (or the legacy API is chosen) */
    sd_conv_graph *graph[2];
    /* op-profile labels of this shape's forward (SDTRAIN_CUDA_PROFILE=1): [0] legacy, [1]
     * graph API; the profile's rows point at them, and it reports before the cache is freed */
    char prof_fwd[2][96];
} conv_entry;

struct sd_cuda_conv_cache {
    conv_entry **entries; /* pointers, so an entry never moves when the array grows */
    int count, capacity;
};

static int conv_same_shape(const sd_conv2d_desc *a, const sd_conv2d_desc *b)
{
    return a->n == b->n && a->h == b->h && a->w == b->w && a->c_in == b->c_in &&
           a->c_out == b->c_out && a->kh == b->kh && a->kw == b->kw && a->stride == b->stride &&
           a->pad_top == b->pad_top && a->pad_bottom == b->pad_bottom &&
           a->pad_left == b->pad_left && a->pad_right == b->pad_right && a->h_out == b->h_out &&
           a->w_out == b->w_out;
}

/* The math type every call executes with (set on the convolution descriptor). */
static cudnnMathType_t conv_exec_math(sd_dtype dtype)
{
    return dtype == SD_BF16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

/* Whether a heuristics result's math type is acceptable: pass 0 takes only results reported with
 * the execution math type itself, pass 1 any allowed one. F32 must not use TF32 tensor ops (and
 * the descriptor stays FMA regardless); BF16 takes any (TENSOR_OP_MATH permits, not forces). */
static int conv_math_ok(sd_dtype dtype, cudnnMathType_t math, int pass)
{
    if (pass == 0)
        return math == conv_exec_math(dtype);
    if (dtype == SD_F32)
        return math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH;
    return 1;
}

/* GEMM-type algorithms only: FFT and Winograd transform the data and round differently. */
static int fwd_algo_is_gemm(cudnnConvolutionFwdAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
static int bwd_data_algo_is_gemm(cudnnConvolutionBwdDataAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
static int bwd_filter_algo_is_gemm(cudnnConvolutionBwdFilterAlgo_t a)
{
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/* Workspace of an algorithm with the entry's descriptors; 0 when cuDNN cannot run it so
 * (the query fails) or it needs more than the cap. */
static int fwd_algo_runs(cudnnHandle_t h, const conv_entry *e, cudnnConvolutionFwdAlgo_t algo,
                         size_t *bytes)
{
    size_t b = 0;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, e->x_desc, e->w_desc, e->conv_desc, e->y_desc,
                                                algo, &b) != CUDNN_STATUS_SUCCESS)
        return 0;
    *bytes = b;
    return b <= CONV_WORKSPACE_CAP;
}
static int bwd_data_algo_runs(cudnnHandle_t h, const conv_entry *e,
                              cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes)
{
    size_t b = 0;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, e->w_desc, e->y_desc, e->conv_desc,
                                                     e->x_desc, algo, &b) != CUDNN_STATUS_SUCCESS)
        return 0;
    *bytes = b;
    return b <= CONV_WORKSPACE_CAP;
}
static int bwd_filter_algo_runs(cudnnHandle_t h, const conv_entry *e,
                                cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes)
{
    size_t b = 0;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, e->x_desc, e->y_desc, e->conv_desc,
                                                       e->w_desc, algo,
                                                       &b) != CUDNN_STATUS_SUCCESS)
        return 0;
    *bytes = b;
    return b <= CONV_WORKSPACE_CAP;
}

static void conv_shape_text(const sd_conv2d_desc *d, sd_dtype dtype, char *buf, size_t size)
{
    snprintf(buf, size,
             "%s n=%d h=%d w=%d c_in=%d -> c_out=%d, %dx%d stride %d pad t%d b%d l%d r%d",
             sd_dtype_name(dtype), d->n, d->h, d->w, d->c_in, d->c_out, d->kh, d->kw, d->stride,
             d->pad_top, d->pad_bottom, d->pad_left, d->pad_right);
}

/* ---- choosing an algorithm per direction -------------------------------------------------
 * The candidates, best first: cuDNN's heuristics (no runs), or with `find`
 * (SDTRAIN_CUDA_CONV_ALGO=find) cuDNN's timed runs of every algorithm on memory it allocates
 * itself (once per shape, when the entry is made: normally in a model's dry run). The three
 * directions' perf structs differ only in the algorithm's enum, so each list is copied into one
 * neutral form and goes through the same filters (determinism, GEMM type, math type,
 * workspace). */
enum conv_dir { CONV_FWD, CONV_BWD_DATA, CONV_BWD_FILTER };

struct conv_cand {
    int algo;
    cudnnStatus_t status;
    cudnnDeterminism_t determinism;
    cudnnMathType_t math;
    size_t memory;
};

static constexpr int CONV_MAX_CANDS = 16;
static_assert((int)CUDNN_CONVOLUTION_FWD_ALGO_COUNT <= CONV_MAX_CANDS &&
                  (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT <= CONV_MAX_CANDS &&
                  (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT <= CONV_MAX_CANDS,
              "more cuDNN algorithms than CONV_MAX_CANDS");

template <typename Perf> static int conv_cands_from(const Perf *perf, int got, conv_cand *c)
{
    for (int i = 0; i < got; i++) {
        c[i].algo = (int)perf[i].algo;
        c[i].status = perf[i].status;
        c[i].determinism = perf[i].determinism;
        c[i].math = perf[i].mathType;
        c[i].memory = perf[i].memory;
    }
    return got;
}

static int conv_candidates(cudnnHandle_t h, const conv_entry *e, conv_dir dir, int find,
                           conv_cand *c)
{
    int got = 0;
    switch (dir) {
    case CONV_FWD: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        const int cap = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
        if (find)
            SD_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(
                h, e->x_desc, e->w_desc, e->conv_desc, e->y_desc, cap, &got, perf));
        else
            SD_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
                h, e->x_desc, e->w_desc, e->conv_desc, e->y_desc, cap, &got, perf));
        return conv_cands_from(perf, got, c);
    }
    case CONV_BWD_DATA: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        const int cap = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
        if (find)
            SD_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(
                h, e->w_desc, e->y_desc, e->conv_desc, e->x_desc, cap, &got, perf));
        else
            SD_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                h, e->w_desc, e->y_desc, e->conv_desc, e->x_desc, cap, &got, perf));
        return conv_cands_from(perf, got, c);
    }
    case CONV_BWD_FILTER: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        const int cap = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
        if (find)
            SD_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(
                h, e->x_desc, e->y_desc, e->conv_desc, e->w_desc, cap, &got, perf));
        else
            SD_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                h, e->x_desc, e->y_desc, e->conv_desc, e->w_desc, cap, &got, perf));
        return conv_cands_from(perf, got, c);
    }
    }
    return 0;
}

static int conv_algo_is_gemm(conv_dir dir, int algo)
{
    switch (dir) {
    case CONV_FWD: return fwd_algo_is_gemm((cudnnConvolutionFwdAlgo_t)algo);
    case CONV_BWD_DATA: return bwd_data_algo_is_gemm((cudnnConvolutionBwdDataAlgo_t)algo);
    case CONV_BWD_FILTER: return bwd_filter_algo_is_gemm((cudnnConvolutionBwdFilterAlgo_t)algo);
    }
    return 0;
}

static int conv_algo_runs(cudnnHandle_t h, const conv_entry *e, conv_dir dir, int algo,
                          size_t *bytes)
{
    switch (dir) {
    case CONV_FWD: return fwd_algo_runs(h, e, (cudnnConvolutionFwdAlgo_t)algo, bytes);
    case CONV_BWD_DATA:
        return bwd_data_algo_runs(h, e, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    case CONV_BWD_FILTER:
        return bwd_filter_algo_runs(h, e, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
    }
    return 0;
}

/* The first candidate that passes the filters, preferring (pass 0) those reported with the
 * execution math type, and its workspace in *ws; else `fallback` if it runs; else -1 (*ws
 * untouched). */
static int conv_choose(cudnnHandle_t h, const conv_entry *e, conv_dir dir, int find, int fallback,
                       size_t *ws)
{
    conv_cand c[CONV_MAX_CANDS];
    const int got = conv_candidates(h, e, dir, find, c);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < got; i++) {
            size_t b = 0;
            if (c[i].status == CUDNN_STATUS_SUCCESS && c[i].determinism == CUDNN_DETERMINISTIC &&
                conv_algo_is_gemm(dir, c[i].algo) && conv_math_ok(e->dtype, c[i].math, pass) &&
                c[i].memory <= CONV_WORKSPACE_CAP && conv_algo_runs(h, e, dir, c[i].algo, &b)) {
                *ws = b > c[i].memory ? b : c[i].memory;
                return c[i].algo;
            }
        }
    {
        size_t b = 0;
        if (!conv_algo_runs(h, e, dir, fallback, &b))
            return -1;
        *ws = b;
        return fallback;
    }
}

static void conv_choose_forward(cudnnHandle_t h, conv_entry *e, const char *shape, int find)
{
    int algo = conv_choose(h, e, CONV_FWD, find, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                           &e->fwd_ws);
    SD_CHECK(algo >= 0, "cuDNN offers no usable forward convolution algorithm for %s", shape);
    e->fwd_algo = (cudnnConvolutionFwdAlgo_t)algo;
}

static void conv_choose_backward_data(cudnnHandle_t h, conv_entry *e, int find)
{
    /* None may exist: cuDNN 9.14 has no deterministic GEMM-type backward-data kernel for an F32
     * NHWC input of 3 channels (the VAE's conv_in). Nothing ever asks for the gradient of the
     * images, so the shape stays usable and only a backward pass that wants dx fails. */
    int algo = conv_choose(h, e, CONV_BWD_DATA, find, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
                           &e->bwd_data_ws);
    e->bwd_data_ok = algo >= 0;
    if (algo >= 0)
        e->bwd_data_algo = (cudnnConvolutionBwdDataAlgo_t)algo;
}

static void conv_choose_backward_filter(cudnnHandle_t h, conv_entry *e, const char *shape,
                                        int find)
{
    int algo = conv_choose(h, e, CONV_BWD_FILTER, find, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                           &e->bwd_filter_ws);
    SD_CHECK(algo >= 0, "cuDNN offers no usable deterministic backward-filter algorithm for %s",
             shape);
    e->bwd_filter_algo = (cudnnConvolutionBwdFilterAlgo_t)algo;
}

/* The graph-API forward plans of an entry. A shape without one says so on stderr (every shape
 * with SDTRAIN_CUDA_CONV_LOG=1, else the first of the process), since its forward then runs
 * through the legacy API whatever SDTRAIN_CUDA_CONV_API says. */
static void conv_graph_plans(sd_cuda_state *st, conv_entry *e, const char *shape, int logging)
{
    static int told; /* a backend belongs to one thread; a lost race only repeats a line */
    static const char *const what[2] = {"conv + bias", "conv + bias + residual"};
    for (int z = 0; z < 2; z++) {
        char why[384];
        e->graph[z] = sd_cuda_conv_graph_build(st, &e->key, z, CONV_WORKSPACE_CAP, why,
                                               sizeof why);
        if (e->graph[z] && logging) {
            char desc[160];
            sd_cuda_conv_graph_describe(e->graph[z], desc, sizeof desc);
            fprintf(stderr, "sdtrain conv %s: graph API %s: %s\n", shape, what[z], desc);
        } else if (!e->graph[z] && (logging || !told)) {
            fprintf(stderr,
                    "sdtrain conv %s: the cuDNN graph API has no plan for %s (%s); the legacy "
                    "API runs it%s\n",
                    shape, what[z], why, logging ? "" : " (SDTRAIN_CUDA_CONV_LOG=1 lists every shape)");
            told = 1;
        }
    }
}

static void conv_keep_faster(const sd_backend *be, conv_entry *e, const char *shape,
                             int logging);

static conv_entry *conv_entry_create(const sd_backend *be, const sd_conv2d_desc *d)
{
    sd_cuda_state *st = sd_cuda(be);
    char shape[256];
    conv_shape_text(d, st->dtype, shape, sizeof shape);

    conv_entry *e = (conv_entry *)sd_xcalloc(1, sizeof *e);
    e->key = *d;
    e->dtype = st->dtype;
    e->explicit_pad = d->pad_top != d->pad_bottom || d->pad_left != d->pad_right;
    e->hp = e->explicit_pad ? d->h + d->pad_top + d->pad_bottom : d->h;
    e->wp = e->explicit_pad ? d->w + d->pad_left + d->pad_right : d->w;
    for (int g = 0; g < 2; g++)
        snprintf(e->prof_fwd[g], sizeof e->prof_fwd[g], "conv fwd %s %dx%dx%d>%d k%d s%d%s",
                 g ? "graph" : "cudnn", d->h, d->w, d->c_in, d->c_out, d->kh, d->stride,
                 e->explicit_pad ? " padded" : "");
    const int pad_h = e->explicit_pad ? 0 : d->pad_top;
    const int pad_w = e->explicit_pad ? 0 : d->pad_left;
    const cudnnDataType_t dt = st->dtype == SD_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;

    SD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->x_desc));
    SD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->y_desc));
    SD_CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->w_desc));
    SD_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&e->conv_desc));
    /* cudnnSetTensor4dDescriptor takes (n, c, h, w) whatever the memory format */
    SD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->x_desc, CUDNN_TENSOR_NHWC, dt, d->n, d->c_in,
                                              e->hp, e->wp));
    SD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->y_desc, CUDNN_TENSOR_NHWC, dt, d->n, d->c_out,
                                              d->h_out, d->w_out));
    /* (k, c, h, w) in NHWC format is the memory order [k, h, w, c] = [c_out, kh, kw, c_in] */
    SD_CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->w_desc, dt, CUDNN_TENSOR_NHWC, d->c_out, d->c_in,
                                              d->kh, d->kw));
    SD_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(e->conv_desc, pad_h, pad_w, d->stride,
                                                   d->stride, 1, 1, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));
    SD_CUDNN_CHECK(cudnnSetConvolutionMathType(e->conv_desc, conv_exec_math(st->dtype)));
    SD_CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->b_desc));
    SD_CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->b_desc, CUDNN_TENSOR_NHWC, dt, 1, d->c_out, 1, 1));
    SD_CUDNN_CHECK(cudnnCreateActivationDescriptor(&e->act));
    SD_CUDNN_CHECK(cudnnSetActivationDescriptor(e->act, CUDNN_ACTIVATION_IDENTITY,
                                                CUDNN_NOT_PROPAGATE_NAN, 0.0));
    if (st->conv_bias_separate)
        e->fused_bias = -1;

    /* cuDNN's idea of the output must be ours (floor division, as PyTorch). */
    int on = 0, oc = 0, oh = 0, ow = 0;
    SD_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->conv_desc, e->x_desc, e->w_desc, &on,
                                                         &oc, &oh, &ow));
    SD_CHECK(on == d->n && oc == d->c_out && oh == d->h_out && ow == d->w_out,
             "cuDNN computes output [%d, %d, %d, %d] for %s, expected [%d, %d, %d, %d]", on, oh,
             ow, oc, shape, d->n, d->h_out, d->w_out, d->c_out);

    conv_choose_forward(st->dnn, e, shape, st->conv_find);
    conv_choose_backward_data(st->dnn, e, st->conv_find);
    conv_choose_backward_filter(st->dnn, e, shape, st->conv_find);

    const char *log = getenv("SDTRAIN_CUDA_CONV_LOG");
    const int logging = log && strcmp(log, "1") == 0;
    if (logging)
        fprintf(stderr,
                "sdtrain conv %s: forward algo %d (%zu B), backward data algo %d (%zu B), "
                "backward filter algo %d (%zu B)%s\n",
                shape, (int)e->fwd_algo, e->fwd_ws, (int)e->bwd_data_algo, e->bwd_data_ws,
                (int)e->bwd_filter_algo, e->bwd_filter_ws,
                e->explicit_pad ? ", explicit padding" : "");
    /* fp32 keeps the legacy API whatever SDTRAIN_CUDA_CONV_API says (ops_cuda_conv_graph.cu):
     * with graph the default, that is no news for stderr */
    if (st->conv_api != SD_CUDA_CONV_API_LEGACY && st->dtype == SD_BF16) {
        conv_graph_plans(st, e, shape, logging);
        if (st->conv_find)
            conv_keep_faster(be, e, shape, logging);
    }
    return e;
}

static void conv_entry_free(conv_entry *e)
{
    sd_cuda_conv_graph_free(e->graph[0]);
    sd_cuda_conv_graph_free(e->graph[1]);
    SD_CUDNN_CHECK(cudnnDestroyActivationDescriptor(e->act));
    SD_CUDNN_CHECK(cudnnDestroyTensorDescriptor(e->b_desc));
    SD_CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(e->conv_desc));
    SD_CUDNN_CHECK(cudnnDestroyFilterDescriptor(e->w_desc));
    SD_CUDNN_CHECK(cudnnDestroyTensorDescriptor(e->y_desc));
    SD_CUDNN_CHECK(cudnnDestroyTensorDescriptor(e->x_desc));
    free(e);
}

/* The entry for a shape, created (algorithms chosen) on first use. Not thread-safe: a backend
 * belongs to one thread. */
static conv_entry *conv_entry_get(const sd_backend *be, const sd_conv2d_desc *d)
{
    sd_cuda_state *st = sd_cuda(be);
    if (!st->conv_cache)
        st->conv_cache = (sd_cuda_conv_cache *)sd_xcalloc(1, sizeof *st->conv_cache);
    sd_cuda_conv_cache *c = st->conv_cache;
    for (int i = 0; i < c->count; i++)
        if (c->entries[i]->dtype == st->dtype && conv_same_shape(&c->entries[i]->key, d))
            return c->entries[i];
    if (c->count == c->capacity) {
        c->capacity = c->capacity ? 2 * c->capacity : 16;
        c->entries =
            (conv_entry **)sd_xrealloc(c->entries, (size_t)c->capacity * sizeof *c->entries);
    }
    conv_entry *e = conv_entry_create(be, d);
    c->entries[c->count++] = e;
    return e;
}

void sd_cuda_conv_cache_destroy(sd_cuda_state *st)
{
    if (!st || !st->conv_cache)
        return;
    sd_cuda_conv_cache *c = st->conv_cache;
    for (int i = 0; i < c->count; i++)
        conv_entry_free(c->entries[i]);
    free(c->entries);
    free(c);
    st->conv_cache = nullptr;
}

/* ---- scratch layout ------------------------------------------------------------------------ */

/* Byte offsets of the scratch pieces (each 256-aligned; an absent piece has size 0). */
typedef struct conv_layout {
    size_t xpad;     /* padded input (explicit padding) */
    size_t dxpad;    /* gradient of the padded input (explicit padding, backward) */
    size_t ws;       /* cuDNN workspace (backward: data and filter use it one after the other) */
    size_t dw16;     /* bf16 weight gradient (BF16 mode, backward) */
    size_t colsum;   /* partial column sums for db (backward) */
    size_t total;
} conv_layout;

static size_t conv_padded_bytes(const sd_backend *be, const conv_entry *e)
{
    const sd_conv2d_desc *d = &e->key;
    if (!e->explicit_pad)
        return 0;
    return sd_cuda_align((size_t)d->n * e->hp * e->wp * d->c_in * sd_cuda_elem(be));
}

static conv_layout conv_forward_layout(const sd_backend *be, const conv_entry *e)
{
    conv_layout L;
    memset(&L, 0, sizeof L);
    size_t off = 0;
    L.xpad = off;
    off += conv_padded_bytes(be, e);
    L.ws = off;
    size_t ws = e->fwd_ws;
    for (int z = 0; z < 2; z++)
        if (sd_cuda_conv_graph_ws(e->graph[z]) > ws)
            ws = sd_cuda_conv_graph_ws(e->graph[z]);
    off += sd_cuda_align(ws);
    L.dxpad = L.dw16 = L.colsum = off; /* unused */
    L.total = off;
    return L;
}

static conv_layout conv_backward_layout(const sd_backend *be, const conv_entry *e)
{
    const sd_conv2d_desc *d = &e->key;
    conv_layout L;
    memset(&L, 0, sizeof L);
    size_t off = 0;
    L.xpad = off;
    off += conv_padded_bytes(be, e);
    L.dxpad = off;
    off += conv_padded_bytes(be, e);
    L.ws = off;
    off += sd_cuda_align(e->bwd_data_ws > e->bwd_filter_ws ? e->bwd_data_ws : e->bwd_filter_ws);
    L.dw16 = off;
    if (e->dtype == SD_BF16)
        off += sd_cuda_align((size_t)d->c_out * d->kh * d->kw * d->c_in * sizeof(__nv_bfloat16));
    L.colsum = off;
    off += sd_cuda_colsum_scratch((int64_t)d->n * d->h_out * d->w_out, d->c_out);
    L.total = off;
    return L;
}

/* ---- kernels -------------------------------------------------------------------------------- */

/* xp [n, hp, wp, c] = x [n, h, w, c] placed at (pt, pl), zeros elsewhere (all elements
 * written): a pure copy in chunks of U (cu chunks a pixel). Row-wise (cuda_internal.h): padded
 * row py of image z on grid y, the row's chunks on x. */
template <typename U>
static __global__ void conv_pad_kernel(int h, int w, int hp, int wp, int cu, int pt, int pl,
                                       const U *x, U *xp)
{
    const int j = SD_COL_INDEX();
    if (j >= wp * cu)
        return;
    const int px = j / cu, k = j - px * cu, sx = px - pl;
    const int64_t b = blockIdx.z;
    SD_ROW_LOOP(py, hp)
    {
        const int sy = (int)py - pt;
        U v{};
        if (sy >= 0 && sy < h && sx >= 0 && sx < w)
            v = x[((b * h + sy) * w + sx) * cu + k];
        xp[(b * hp + py) * wp * cu + j] = v;
    }
}

/* dx [n, h, w, c] (+)= the window at (pt, pl) of dxp [n, hp, wp, c]; row y of image z on grid
 * y, the row's w * c elements on x. */
template <typename T>
static __global__ void conv_crop_kernel(int h, int w, int c, int hp, int wp, int pt, int pl,
                                        const T *dxp, T *dx, int accumulate)
{
    const int j = SD_COL_INDEX();
    if (j >= w * c)
        return;
    const int x = j / c, ch = j - x * c;
    const int64_t b = blockIdx.z;
    SD_ROW_LOOP(y, h)
    {
        const int64_t o = (b * h + y) * w * c + j;
        float v = sd_ld(dxp, ((b * hp + y + pt) * wp + x + pl) * c + ch);
        if (accumulate)
            v += sd_ld(dx, o);
        sd_st(dx, o, v);
    }
}

/* dw (fp32) += g (bf16) */
static __global__ void conv_dw_add_kernel(int64_t total, const __nv_bfloat16 *g, float *dw)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        dw[i] += __bfloat162float(g[i]);
}

static void conv_pad_input(const sd_backend *be, const conv_entry *e, const void *x, void *xp)
{
    const sd_conv2d_desc *d = &e->key;
    const size_t pixel = (size_t)d->c_in * sd_cuda_elem(be);
    const int u = sd_cuda_chunk_bytes(pixel, x, xp), cu = (int)(pixel / (size_t)u);
    const int threads = sd_cuda_row_threads((int64_t)e->wp * cu);
    const dim3 grid = sd_cuda_row_grid(e->hp, (int64_t)e->wp * cu, threads, d->n, SD_GRID_Y_MAX);
    cudaStream_t s = sd_cuda_stream(be);
    SD_CHECK(d->n < 65536 && (int64_t)e->wp * cu < INT32_MAX, "conv2d padding: %d images of "
             "%d x %d x %d: out of the kernel's range", d->n, e->hp, e->wp, d->c_in);
    SD_CUDA_CHUNK_DISPATCH(u, U, {
        conv_pad_kernel<U><<<grid, threads, 0, s>>>(d->h, d->w, e->hp, e->wp, cu, d->pad_top,
                                                    d->pad_left, (const U *)x, (U *)xp);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- ops ------------------------------------------------------------------------------------ */

static size_t cuda_conv2d_forward_scratch(const sd_backend *be, const sd_conv2d_desc *d)
{
    return conv_forward_layout(be, conv_entry_get(be, d)).total;
}

/* y = conv(x) + b (+ z when z is not NULL) through the legacy calls; base: the scratch, laid
 * out as L. */
static void conv_forward_legacy(const sd_backend *be, conv_entry *e, const void *x,
                                const void *w, const void *b, const void *z, void *y, char *base,
                                const conv_layout &L)
{
    sd_cuda_state *st = sd_cuda(be);
    const sd_conv2d_desc *d = &e->key;
    const void *xin = x;
    if (e->explicit_pad) {
        conv_pad_input(be, e, x, base + L.xpad);
        xin = base + L.xpad;
        SD_CUDA_SUBMARK(be, "conv2d_forward:pad");
    }
    const float one = 1.0f, zero = 0.0f; /* float scaling factors for float and bf16 data */
    if (b && e->fused_bias >= 0 &&
        e->fwd_algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) {
        /* y = conv(x) + bias (+ z), rounded once; without a residual z = y with alpha2 = 0
         * (cuDNN allows z == y) */
        const cudnnStatus_t r = cudnnConvolutionBiasActivationForward(
            st->dnn, &one, e->x_desc, xin, e->w_desc, w, e->conv_desc, e->fwd_algo,
            e->fwd_ws ? base + L.ws : nullptr, e->fwd_ws, z ? &one : &zero, e->y_desc,
            z ? z : y, e->b_desc, b, e->act, e->y_desc, y);
        if (r == CUDNN_STATUS_SUCCESS) {
            e->fused_bias = 1;
            SD_CUDA_LIB_DONE(be, e->prof_fwd[0]);
            return;
        }
        /* refused on first use: this shape takes the separate bias pass from now on */
        SD_CHECK(e->fused_bias == 0, "cudnnConvolutionBiasActivationForward: %s",
                 cudnnGetErrorString(r));
        e->fused_bias = -1;
    }
    SD_CUDNN_CHECK(cudnnConvolutionForward(st->dnn, &one, e->x_desc, xin, e->w_desc, w,
                                           e->conv_desc, e->fwd_algo,
                                           e->fwd_ws ? base + L.ws : nullptr, e->fwd_ws, &zero,
                                           e->y_desc, y));
    SD_CUDA_LIB_DONE(be, e->prof_fwd[0]);
    if (b) {
        sd_cuda_bias_rows(be, (int64_t)d->n * d->h_out * d->w_out, d->c_out, b, y);
    }
    if (z) /* the order of the unfused ops: (conv + b) + z, as sd_conv2d_forward then sd_add */
        st->ops.add(be, (int64_t)d->n * d->h_out * d->w_out * d->c_out, y, z, 1.0f, y);
}

/* ---- graph plan or legacy calls, whichever is faster (SDTRAIN_CUDA_CONV_ALGO=find) ------ */

enum { CT_X, CT_W, CT_B, CT_Z, CT_Y, CT_SCRATCH, CT_N };

/* Milliseconds of one forward of e's shape with a bias (and the residual when with_z): the best
 * of 3 runs after a first one, through `graph` when it is not NULL, else through the legacy
 * calls; -1 when it could not be timed. */
static float conv_time_forward(const sd_backend *be, conv_entry *e, int with_z,
                               const sd_conv_graph *graph, void *const *buf, const conv_layout &L)
{
    sd_cuda_state *st = sd_cuda(be);
    char *base = (char *)buf[CT_SCRATCH];
    const void *z = with_z ? buf[CT_Z] : nullptr;
    cudaEvent_t a, b;
    float best = -1.0f;
    if (cudaEventCreate(&a) != cudaSuccess) {
        cudaGetLastError();
        return -1.0f;
    }
    if (cudaEventCreate(&b) != cudaSuccess) {
        cudaGetLastError();
        cudaEventDestroy(a);
        return -1.0f;
    }
    for (int r = 0; r < 4; r++) {
        SD_CUDA_CHECK(cudaEventRecord(a, st->stream));
        if (graph) {
            char why[160];
            if (sd_cuda_conv_graph_run(st, graph, buf[CT_X], buf[CT_W], buf[CT_B], z, buf[CT_Y],
                                       base + L.ws, why, sizeof why) <= 0) {
                best = -1.0f; /* refused: the first real call will drop the plan and say so */
                break;
            }
            st->conv_graph_runs--; /* counts the op's calls, not these */
        } else {
            conv_forward_legacy(be, e, buf[CT_X], buf[CT_W], buf[CT_B], z, buf[CT_Y], base, L);
        }
        SD_CUDA_CHECK(cudaEventRecord(b, st->stream));
        float ms = 0.0f;
        SD_CUDA_CHECK(cudaEventSynchronize(b));
        SD_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        if (r > 0 && (best < 0.0f || ms < best))
            best = ms;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
}

/* With timed choices (SDTRAIN_CUDA_CONV_ALGO=find) a shape's graph-API plans must also beat the
 * legacy calls with the algorithm cuDNN's timed runs chose: each plan and the legacy forward
 * (bias in cuDNN's epilogue where it takes it, the VAE's padded copy included) are timed on the
 * same zeroed buffers, and a plan that is not faster is dropped, so that shape runs legacy. No
 * device memory for the buffers: the plans stay, untimed against legacy. */
static void conv_keep_faster(const sd_backend *be, conv_entry *e, const char *shape, int logging)
{
    static const char *const what[2] = {"conv + bias", "conv + bias + residual"};
    sd_cuda_state *st = sd_cuda(be);
    if (!e->graph[0] && !e->graph[1])
        return;
    const sd_conv2d_desc *d = &e->key;
    const size_t el = sd_cuda_elem(be);
    const size_t ybytes = (size_t)d->n * d->h_out * d->w_out * d->c_out * el;
    const conv_layout L = conv_forward_layout(be, e); /* the larger workspace of both paths */
    const size_t bytes[CT_N] = {(size_t)d->n * d->h * d->w * d->c_in * el,
                                (size_t)d->c_out * d->kh * d->kw * d->c_in * el,
                                (size_t)d->c_out * el, ybytes, ybytes, L.total};
    void *buf[CT_N] = {};
    int have = 1;
    for (int i = 0; i < CT_N && have; i++)
        if (bytes[i] && (cudaMalloc(&buf[i], bytes[i]) != cudaSuccess ||
                         cudaMemsetAsync(buf[i], 0, bytes[i], st->stream) != cudaSuccess))
            have = 0;
    if (!have) {
        cudaGetLastError();
        if (logging)
            fprintf(stderr, "sdtrain conv %s: no device memory to time the graph API against the "
                    "legacy calls; the graph plans stay\n", shape);
    }
    /* the timing runs are not the op's: keep them out of the op profile */
    struct sd_cuda_prof *prof = st->prof;
    st->prof = nullptr;
    for (int z = 0; z < 2 && have; z++) {
        if (!e->graph[z])
            continue;
        const float tg = conv_time_forward(be, e, z, e->graph[z], buf, L);
        const float tl = conv_time_forward(be, e, z, nullptr, buf, L);
        if (tg < 0.0f || tl < 0.0f)
            continue;
        const int legacy = tl <= tg;
        if (logging)
            fprintf(stderr, "sdtrain conv %s: %s timed: graph API %.3f ms, legacy algo %d %.3f "
                    "ms: the %s runs it\n", shape, what[z], tg, (int)e->fwd_algo, tl,
                    legacy ? "legacy API" : "graph API");
        if (legacy) {
            sd_cuda_conv_graph_free(e->graph[z]);
            e->graph[z] = nullptr;
        }
    }
    st->prof = prof;
    for (int i = 0; i < CT_N; i++)
        cudaFree(buf[i]); /* NULL: nothing */
}

/* y = conv(x) + b (+ z when z is not NULL). */
static void conv_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                         const void *w, const void *b, const void *z, void *y, sd_scratch ws)
{
    sd_cuda_state *st = sd_cuda(be);
    conv_entry *e = conv_entry_get(be, d);
    const conv_layout L = conv_forward_layout(be, e);
    SD_CHECK(ws.bytes >= L.total && (L.total == 0 || ws.ptr != nullptr),
             "conv2d forward needs %zu bytes of scratch, got %zu", L.total, ws.bytes);
    char *base = (char *)ws.ptr;

    /* the graph API's plan where the call fits it (bias, residual as built, aligned pointers) */
    {
        char why[160];
        const int g = sd_cuda_conv_graph_run(st, e->graph[z != nullptr], x, w, b, z, y,
                                             base + L.ws, why, sizeof why);
        if (g > 0) {
            SD_CUDA_LIB_DONE(be, e->prof_fwd[1]);
            return;
        }
        if (g < 0) { /* refused at run time: this shape takes the legacy calls from now on */
            char shape[256];
            conv_shape_text(d, e->dtype, shape, sizeof shape);
            fprintf(stderr, "sdtrain conv %s: the graph API's plan did not run (%s); the legacy "
                    "API runs it from now on\n", shape, why);
            sd_cuda_conv_graph_free(e->graph[z != nullptr]);
            e->graph[z != nullptr] = nullptr;
        }
    }
    conv_forward_legacy(be, e, x, w, b, z, y, base, L);
}

static void cuda_conv2d_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                                const void *w, const void *b, void *y, sd_scratch ws)
{
    conv_forward(be, d, x, w, b, nullptr, y, ws);
}

static void cuda_conv2d_forward_add(const sd_backend *be, const sd_conv2d_desc *d,
                                    const void *x, const void *w, const void *b, const void *z,
                                    void *y, sd_scratch ws)
{
    conv_forward(be, d, x, w, b, z, y, ws);
}

static size_t cuda_conv2d_backward_scratch(const sd_backend *be, const sd_conv2d_desc *d)
{
    return conv_backward_layout(be, conv_entry_get(be, d)).total;
}

/* dx, dw and db may each be NULL (the sd_* wrapper insists on dw; the entry does not). */
static void cuda_conv2d_backward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                                 const void *w, const void *dy, void *dx, int accumulate,
                                 float *dw, float *db, sd_scratch ws)
{
    sd_cuda_state *st = sd_cuda(be);
    const conv_entry *e = conv_entry_get(be, d);
    const conv_layout L = conv_backward_layout(be, e);
    SD_CHECK(ws.bytes >= L.total && (L.total == 0 || ws.ptr != nullptr),
             "conv2d backward needs %zu bytes of scratch, got %zu", L.total, ws.bytes);
    char *base = (char *)ws.ptr;
    cudaStream_t s = st->stream;
    const float one = 1.0f, zero = 0.0f;

    if (dx) {
        if (!e->bwd_data_ok) {
            char shape[256];
            conv_shape_text(d, e->dtype, shape, sizeof shape);
            SD_CHECK(0, "cuDNN offers no usable deterministic backward-data algorithm for %s",
                     shape);
        }
        if (e->explicit_pad) {
            /* gradient of the whole padded input, then its interior into dx */
            void *dxp = base + L.dxpad;
            SD_CUDNN_CHECK(cudnnConvolutionBackwardData(
                st->dnn, &one, e->w_desc, w, e->y_desc, dy, e->conv_desc, e->bwd_data_algo,
                e->bwd_data_ws ? base + L.ws : nullptr, e->bwd_data_ws, &zero, e->x_desc, dxp));
            const int64_t cols = (int64_t)d->w * d->c_in;
            const int threads = sd_cuda_row_threads(cols);
            const dim3 grid = sd_cuda_row_grid(d->h, cols, threads, d->n, SD_GRID_Y_MAX);
            SD_CHECK(d->n < 65536 && cols < INT32_MAX, "conv2d padding: %d images of %d x %d x "
                     "%d: out of the kernel's range", d->n, d->h, d->w, d->c_in);
            SD_CUDA_DISPATCH(be, T, {
                conv_crop_kernel<T><<<grid, threads, 0, s>>>(d->h, d->w, d->c_in, e->hp, e->wp,
                                                             d->pad_top, d->pad_left,
                                                             (const T *)dxp, (T *)dx, accumulate);
            });
            SD_CUDA_LAUNCHED(be);
        } else {
            const float beta = accumulate ? 1.0f : 0.0f;
            SD_CUDNN_CHECK(cudnnConvolutionBackwardData(
                st->dnn, &one, e->w_desc, w, e->y_desc, dy, e->conv_desc, e->bwd_data_algo,
                e->bwd_data_ws ? base + L.ws : nullptr, e->bwd_data_ws, &beta, e->x_desc, dx));
        }
    }

    SD_CUDA_LIB_DONE(be, "conv2d_backward:dx");
    if (dw) {
        const void *xin = x;
        if (e->explicit_pad) {
            conv_pad_input(be, e, x, base + L.xpad);
            xin = base + L.xpad;
        }
        void *wsp = e->bwd_filter_ws ? base + L.ws : nullptr;
        if (e->dtype == SD_F32) {
            SD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
                st->dnn, &one, e->x_desc, xin, e->y_desc, dy, e->conv_desc, e->bwd_filter_algo,
                wsp, e->bwd_filter_ws, &one, e->w_desc, dw));
        } else {
            /* cuDNN's dw has the tensors' type: bf16 into scratch, then added to the fp32 dw */
            __nv_bfloat16 *g = (__nv_bfloat16 *)(base + L.dw16);
            SD_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
                st->dnn, &one, e->x_desc, xin, e->y_desc, dy, e->conv_desc, e->bwd_filter_algo,
                wsp, e->bwd_filter_ws, &zero, e->w_desc, g));
            const int64_t total = (int64_t)d->c_out * d->kh * d->kw * d->c_in;
            conv_dw_add_kernel<<<sd_cuda_grid(be, total, 256), 256, 0, s>>>(total, g, dw);
            SD_CUDA_LAUNCHED(be);
        }
    }

    SD_CUDA_LIB_DONE(be, "conv2d_backward:dw");
    if (db)
        sd_cuda_colsum(be, (int64_t)d->n * d->h_out * d->w_out, d->c_out, dy, db, 1,
                       base + L.colsum);
}

extern "C" int64_t sd_backend_cuda_conv_graph_runs(const sd_backend *be)
{
    return be && be->device == SD_DEV_CUDA ? sd_cuda(be)->conv_graph_runs : 0;
}

extern "C" int sd_backend_cuda_conv_graph_plans(const sd_backend *be, const sd_conv2d_desc *d)
{
    if (!be || be->device != SD_DEV_CUDA)
        return 0;
    const conv_entry *e = conv_entry_get(be, d);
    return (e->graph[0] ? 1 : 0) | (e->graph[1] ? 2 : 0);
}

void sd_cuda_fill_conv_ops(sd_ops *ops)
{
    ops->conv2d_forward_scratch = cuda_conv2d_forward_scratch;
    ops->conv2d_forward = cuda_conv2d_forward;
    ops->conv2d_forward_add = cuda_conv2d_forward_add;
    ops->conv2d_backward_scratch = cuda_conv2d_backward_scratch;
    ops->conv2d_backward = cuda_conv2d_backward;
}
