/* CUDA linear layers through cuBLASLt, and attention (the "math" path: scores through memory,
 * cuBLASLt GEMMs around an fp32 softmax). doc/cuda/gemm.md is the long version. */
#include <cstdlib>
#include <cstring>

#include "cuda_internal.h"

/* ---- the GEMM helper -----------------------------------------------------------------------
 * cuBLASLt is column-major: a row-major M [r, c] with row stride ld is a column-major [c, r]
 * matrix with the same ld, so every op below is written on those transposed views.
 * D = alpha op(A) op(B) + beta C with C = D, compute and scale type fp32 in both modes
 * (CUBLAS_COMPUTE_32F: no TF32). A (matmul desc, layouts, algorithm) plan is made once per
 * key (shape, transposes, types, batch, epilogue, pointer alignments) and kept in
 * st->gemm_cache, so the heuristic runs once per shape, not per call. */

/* One matrix operand: pointer, leading dimension, type, and the distance (elements) between
 * the matrices of a strided batch. */
struct gemm_operand {
    const void *ptr;
    int64_t ld;
    cudaDataType_t type;
    int64_t stride;
};

static gemm_operand gemm_op(const void *ptr, int64_t ld, cudaDataType_t type, int64_t stride)
{
    gemm_operand o;
    o.ptr = ptr;
    o.ld = ld;
    o.type = type;
    o.stride = stride;
    return o;
}

/* Compared with memcmp: always memset to zero before filling (padding bytes). */
struct gemm_key {
    int32_t transa, transb;
    int64_t m, n, k;
    int64_t lda, ldb, ldd;
    int32_t type_a, type_b, type_d;
    int32_t batch;
    int64_t stride_a, stride_b, stride_d;
    int32_t bias; /* 1: CUBLASLT_EPILOGUE_BIAS */
    uint32_t align_a, align_b, align_d, align_bias;
    uint32_t align_c; /* a C input apart from D (a residual): its alignment; 0 = C is D */
};

struct gemm_plan {
    gemm_key key;
    int ok; /* 0: the heuristic found no algorithm (only allowed for bias epilogue keys) */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
};

struct sd_cuda_gemm_cache {
    gemm_plan *plans;
    int count, cap;
};

static size_t gemm_type_size(cudaDataType_t t)
{
    SD_CHECK(t == CUDA_R_32F || t == CUDA_R_16BF, "GEMM operand type %d is not fp32 or bf16",
             (int)t);
    return t == CUDA_R_32F ? 4 : 2;
}

/* The alignment (bytes, at most 256) every matrix of the operand keeps: the lowest set bit of
 * the address, of the row stride and of the batch stride in bytes. The heuristic assumes 256
 * unless told, and an attention head or a fused-QKV slice starts anywhere. */
static uint32_t gemm_alignment(const void *p, int64_t ld, int64_t stride, cudaDataType_t t)
{
    const uint64_t es = gemm_type_size(t);
    const uint64_t bits = (uint64_t)(uintptr_t)p | (uint64_t)ld * es | (uint64_t)stride * es | 256u;
    return (uint32_t)(bits & (~bits + 1));
}

static gemm_key gemm_make_key(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
                              int64_t k, gemm_operand a, gemm_operand b, gemm_operand d,
                              int batch, const void *bias)
{
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.transa = (int32_t)ta;
    key.transb = (int32_t)tb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = a.ld;
    key.ldb = b.ld;
    key.ldd = d.ld;
    key.type_a = (int32_t)a.type;
    key.type_b = (int32_t)b.type;
    key.type_d = (int32_t)d.type;
    key.batch = batch;
    if (batch > 1) {
        key.stride_a = a.stride;
        key.stride_b = b.stride;
        key.stride_d = d.stride;
    }
    key.align_a = gemm_alignment(a.ptr, a.ld, key.stride_a, a.type);
    key.align_b = gemm_alignment(b.ptr, b.ld, key.stride_b, b.type);
    key.align_d = gemm_alignment(d.ptr, d.ld, key.stride_d, d.type);
    if (bias) {
        key.bias = 1;
        key.align_bias = gemm_alignment(bias, 0, 0, d.type);
    }
    return key;
}

static cublasLtMatrixLayout_t gemm_layout(cudaDataType_t type, int64_t rows, int64_t cols,
                                          int64_t ld, int batch, int64_t stride)
{
    cublasLtMatrixLayout_t l;
    SD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch > 1) {
        int32_t count = batch;
        int64_t off = stride;
        SD_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count));
        SD_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof off));
    }
    return l;
}

static void gemm_plan_free(gemm_plan *p)
{
    if (p->desc)
        cublasLtMatmulDescDestroy(p->desc);
    if (p->la)
        cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb)
        cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld)
        cublasLtMatrixLayoutDestroy(p->ld);
}

/* The cached plan for `key`, made on first use. `bias` is the bias pointer of this call (the
 * heuristic reads its value for the alignment; the key holds that alignment). */
static const gemm_plan *gemm_plan_get(sd_cuda_state *st, const gemm_key *key, const void *bias)
{
    sd_cuda_gemm_cache *c = st->gemm_cache;
    if (!c) {
        c = (sd_cuda_gemm_cache *)calloc(1, sizeof *c);
        SD_CHECK(c != NULL, "out of host memory for the GEMM plan cache");
        st->gemm_cache = c;
    }
    for (int i = 0; i < c->count; i++)
        if (memcmp(&c->plans[i].key, key, sizeof *key) == 0)
            return &c->plans[i];
    if (c->count == c->cap) {
        int cap = c->cap ? 2 * c->cap : 64;
        gemm_plan *grown = (gemm_plan *)realloc(c->plans, (size_t)cap * sizeof *grown);
        SD_CHECK(grown != NULL, "out of host memory for the GEMM plan cache (%d plans)", cap);
        c->plans = grown;
        c->cap = cap;
    }
    gemm_plan *p = &c->plans[c->count];
    memset(p, 0, sizeof *p);
    p->key = *key;

    SD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = key->transa, tb = key->transb;
    SD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                   sizeof ta));
    SD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb,
                                                   sizeof tb));
    if (key->bias) {
        /* bias type: the default is D's type (bf16 or fp32), which is ours */
        uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
        SD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &epi, sizeof epi));
        SD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    /* stored shapes: op(A) is m x k, op(B) is k x n, D is m x n */
    const int n_a = key->transa == CUBLAS_OP_N;
    const int n_b = key->transb == CUBLAS_OP_N;
    p->la = gemm_layout((cudaDataType_t)key->type_a, n_a ? key->m : key->k, n_a ? key->k : key->m,
                        key->lda, key->batch, key->stride_a);
    p->lb = gemm_layout((cudaDataType_t)key->type_b, n_b ? key->k : key->n, n_b ? key->n : key->k,
                        key->ldb, key->batch, key->stride_b);
    p->ld = gemm_layout((cudaDataType_t)key->type_d, key->m, key->n, key->ldd, key->batch,
                        key->stride_d);

    cublasLtMatmulPreference_t pref;
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = SD_CUDA_LT_WORKSPACE;
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    uint32_t al_a = key->align_a, al_b = key->align_b, al_d = key->align_d;
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    uint32_t al_c = key->align_c ? key->align_c : al_d;
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));

    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(st->lt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                      pref, 1, &res, &found);
    SD_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    p->ok = s == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS &&
            res.workspaceSize <= SD_CUDA_LT_WORKSPACE;
    /* without the epilogue the caller has a fallback; a plain GEMM must have an algorithm */
    SD_CHECK(p->ok || key->bias || key->align_c,
             "cuBLASLt heuristic: no algorithm (%s, %d found) for m=%lld n=%lld k=%lld "
             "trans=%d%d lda=%lld ldb=%lld ldd=%lld types=%d,%d,%d batch=%d strides=%lld,%lld,%lld "
             "align=%u,%u,%u",
             cublasGetStatusString(s), found, (long long)key->m, (long long)key->n,
             (long long)key->k, key->transa, key->transb, (long long)key->lda,
             (long long)key->ldb, (long long)key->ldd, key->type_a, key->type_b, key->type_d,
             key->batch, (long long)key->stride_a, (long long)key->stride_b,
             (long long)key->stride_d, key->align_a, key->align_b, key->align_d);
    if (p->ok) {
        p->algo = res.algo;
        p->workspace = res.workspaceSize;
    }
    c->count++;
    return p;
}

/* D = alpha op(A) op(B) + beta C (+ bias), C = D unless c is given (same layout as D) */
static void gemm_run_c(const sd_backend *be, const gemm_plan *p, float alpha, gemm_operand a,
                       gemm_operand b, float beta, const void *c, gemm_operand d,
                       const void *bias)
{
    sd_cuda_state *st = sd_cuda(be);
    if (p->key.bias) /* the pointer of this call (same alignment as when the plan was made) */
        SD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    SD_CUBLAS_CHECK(cublasLtMatmul(st->lt, p->desc, &alpha, a.ptr, p->la, b.ptr, p->lb, &beta,
                                   c ? c : d.ptr, p->ld, (void *)d.ptr, p->ld, &p->algo,
                                   st->lt_workspace, SD_CUDA_LT_WORKSPACE, st->stream));
    if (st->sync_each_op)
        sd_cuda_stream_wait(st, st->stream);
}

static void gemm_run(const sd_backend *be, const gemm_plan *p, float alpha, gemm_operand a,
                     gemm_operand b, float beta, gemm_operand d, const void *bias)
{
    gemm_run_c(be, p, alpha, a, b, beta, NULL, d, bias);
}

/* D = alpha op(A) op(B) + beta D, `batch` times with the operands' strides. beta = 0 does not
 * read D (it may hold NaN). */
static void gemm(const sd_backend *be, cublasOperation_t ta, cublasOperation_t tb, int64_t m,
                 int64_t n, int64_t k, float alpha, gemm_operand a, gemm_operand b, float beta,
                 gemm_operand d, int batch)
{
    SD_CHECK(m > 0 && n > 0 && k > 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX &&
                 batch >= 1,
             "GEMM sizes m=%lld n=%lld k=%lld batch=%d out of range", (long long)m, (long long)n,
             (long long)k, batch);
    gemm_key key = gemm_make_key(ta, tb, m, n, k, a, b, d, batch, NULL);
    const gemm_plan *p = gemm_plan_get(sd_cuda(be), &key, NULL);
    gemm_run(be, p, alpha, a, b, beta, d, NULL);
}

static const void *elem_at(const void *p, int64_t i, size_t elem)
{
    return (const char *)p + i * (int64_t)elem;
}

/* ---- linear --------------------------------------------------------------------------------
 * In column-major terms the W buffer is Wc [in, out] (ld in), x is Xc [in, rows] (ld in), dy
 * is dYc [out, rows] (ld out), y and dx are Y' [out, rows] and dX' [in, rows], dw is dWc [in, out]:
 *   forward  Y' = Wc^T Xc          m = out, n = rows, k = in   (A = W, T; B = x, N)
 *   dx       dX' = Wc dYc          m = in,  n = rows, k = out  (A = W, N; B = dy, N)
 *   dw       dWc += Xc dYc^T       m = in,  n = out,  k = rows (A = x, N; B = dy, T), fp32 D */

/* y = x w^T + b (+ z: the residual goes in as cuBLASLt's C with beta 1, else an add after) */
static void linear_forward(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                           const void *w, const void *b, const void *z, void *y)
{
    const cudaDataType_t t = sd_cuda_data_type(be);
    const gemm_operand A = gemm_op(w, in, t, 0), B = gemm_op(x, in, t, 0), D = gemm_op(y, out, t, 0);
    SD_CHECK(rows <= INT32_MAX, "linear rows %lld out of range", (long long)rows);
    if (z && (!b || (uintptr_t)b % 16 == 0)) {
        gemm_key key = gemm_make_key(CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, A, B, D, 1, b);
        key.align_c = gemm_alignment(z, out, 0, t);
        const gemm_plan *p = gemm_plan_get(sd_cuda(be), &key, b);
        if (p->ok) {
            gemm_run_c(be, p, 1.0f, A, B, 1.0f, z, D, b);
            return;
        }
    }
    if (z) { /* no fused plan: the plain linear, then the add in the unfused order */
        linear_forward(be, rows, in, out, x, w, b, NULL, y);
        sd_cuda(be)->ops.add(be, rows * out, y, z, 1.0f, y);
        return;
    }
    /* Bias in the cuBLASLt epilogue (D type, added in fp32 before the rounding to D) when the
     * bias is 16-byte aligned and an algorithm exists; otherwise a plain GEMM and a kernel. */
    if (b && (uintptr_t)b % 16 == 0) {
        gemm_key key = gemm_make_key(CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, A, B, D, 1, b);
        const gemm_plan *p = gemm_plan_get(sd_cuda(be), &key, b);
        if (p->ok) {
            gemm_run(be, p, 1.0f, A, B, 0.0f, D, b);
            return;
        }
    }
    gemm(be, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, 1.0f, A, B, 0.0f, D, 1);
    if (b)
        sd_cuda_bias_rows(be, rows, out, b, y);
}

static void cuda_linear_forward(const sd_backend *be, int64_t rows, int in, int out,
                                const void *x, const void *w, const void *b, void *y)
{
    linear_forward(be, rows, in, out, x, w, b, NULL, y);
}

static void cuda_linear_forward_add(const sd_backend *be, int64_t rows, int in, int out,
                                    const void *x, const void *w, const void *b, const void *z,
                                    void *y)
{
    linear_forward(be, rows, in, out, x, w, b, z, y);
}

static size_t cuda_linear_backward_scratch(const sd_backend *be, int64_t rows, int in, int out)
{
    (void)be;
    (void)in;
    return sd_cuda_colsum_scratch(rows, out);
}

static void cuda_linear_backward(const sd_backend *be, int64_t rows, int in, int out,
                                 const void *x, const void *w, const void *dy, void *dx,
                                 int accumulate, float *dw, float *db, sd_scratch ws)
{
    const cudaDataType_t t = sd_cuda_data_type(be);
    SD_CHECK(rows <= INT32_MAX, "linear rows %lld out of range", (long long)rows);
    if (dx) {
        gemm(be, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, 1.0f, gemm_op(w, in, t, 0),
             gemm_op(dy, out, t, 0), accumulate ? 1.0f : 0.0f, gemm_op(dx, in, t, 0), 1);
        SD_CUDA_SUBMARK(be, "linear_backward:dx");
    }
    gemm(be, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, 1.0f, gemm_op(x, in, t, 0),
         gemm_op(dy, out, t, 0), 1.0f, gemm_op(dw, in, CUDA_R_32F, 0), 1);
    SD_CUDA_SUBMARK(be, "linear_backward:dw");
    if (db) {
        SD_CHECK(ws.bytes >= sd_cuda_colsum_scratch(rows, out), "linear backward scratch");
        sd_cuda_colsum(be, rows, out, dy, db, 1, ws.ptr);
    }
}

/* ---- attention -----------------------------------------------------------------------------
 * Per batch element, heads h0..h0+hn and query rows q0..q0+qn at a time (a "chunk"), each GEMM
 * strided-batched over the hn heads (head stride head_dim in q/k/v/o, row stride ld_*):
 *   S' [t_kv, qn]  = scale Kc^T Qc        fp32 scores into scratch, row-major S [qn, t_kv]
 *                                         with row stride ldp (t_kv rounded up to 8)
 *   P              = softmax rows of S    fp32 math, stored in the backend's dtype
 *   O' [hd, qn]    = Vc P'
 * Backward rebuilds P = exp(S - lse) and with D = rowsum(dO o O):
 *   dV' += dOc P'^T,  dP' = Vc^T dOc (fp32, over S),  dS = P (dP - D) (over P),
 *   dQ' = scale Kc dS',  dK' += scale Qc dS'^T.
 * The chunk is the whole batch element when its S and P fit in ATTN_CAP bytes, else fewer
 * heads, else (one head) fewer query rows; it depends on the descriptor and dtype only. */
#define ATTN_CAP ((size_t)512 << 20)
#define ATTN_THREADS 128

struct attn_chunks {
    int bc;            /* batch elements per chunk: 1, or more for a single head (forward) */
    int hc, qc;        /* heads and query rows per chunk */
    int ldp;           /* row stride of S and P: t_kv rounded up to 8 (16-byte rows in bf16) */
    size_t s_bytes;    /* fp32 scores (and dP) of one chunk */
    size_t p_bytes;    /* probabilities (and dS) of one chunk, backend dtype */
    size_t dd_bytes;   /* backward: D = rowsum(dO o O), [batch, heads, t_q] fp32 */
};

static attn_chunks attn_make_chunks(const sd_backend *be, const sd_attention_desc *d, int backward)
{
    attn_chunks c;
    const size_t elem = sd_cuda_elem(be);
    c.ldp = (d->t_kv + 7) / 8 * 8;
    const size_t per_row = (size_t)c.ldp * (sizeof(float) + elem);
    const size_t per_head = (size_t)d->t_q * per_row;
    if ((size_t)d->heads * per_head <= ATTN_CAP) {
        c.hc = d->heads;
        c.qc = d->t_q;
    } else if (per_head <= ATTN_CAP) {
        c.hc = (int)(ATTN_CAP / per_head);
        c.qc = d->t_q;
    } else {
        c.hc = 1;
        size_t q = ATTN_CAP / per_row;
        c.qc = q < 1 ? 1 : (int)q;
    }
    /* One head (the VAE's mid-block attention, 512 wide): the batch elements are as uniform as
     * heads, so the forward folds as many as fit into one strided-batched GEMM instead of a
     * loop over the batch (32 small GEMM pairs at 256 px, each too small to fill the GPU). */
    c.bc = 1;
    if (!backward && d->heads == 1 && c.qc == d->t_q) {
        const size_t fit = ATTN_CAP / per_head;
        c.bc = fit >= (size_t)d->batch ? d->batch : (int)fit;
    }
    const size_t elems = (size_t)c.bc * c.hc * (size_t)c.qc * (size_t)c.ldp;
    c.s_bytes = sd_cuda_align(elems * sizeof(float));
    c.p_bytes = sd_cuda_align(elems * elem);
    c.dd_bytes = backward ? sd_cuda_align((size_t)d->batch * d->heads * d->t_q * sizeof(float))
                          : 0;
    return c;
}

static size_t cuda_attention_forward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    attn_chunks c = attn_make_chunks(be, d, 0);
    return c.s_bytes + c.p_bytes;
}

static size_t cuda_attention_backward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    attn_chunks c = attn_make_chunks(be, d, 1);
    return c.s_bytes + c.p_bytes + c.dd_bytes;
}

/* Fixed-pattern block reductions (deterministic). `sh` holds blockDim.x / 32 floats; every
 * thread gets the result. */
static __device__ float block_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0)
        sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < (int)(blockDim.x / 32); w++)
        r = fmaxf(r, sh[w]);
    __syncthreads();
    return r;
}

static __device__ float block_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0)
        sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = sh[0];
    for (int w = 1; w < (int)(blockDim.x / 32); w++)
        r += sh[w];
    __syncthreads();
    return r;
}

/* One block per score row (row = head-in-chunk * qc + i, query q0 + i): P = softmax over the
 * visible keys (causal: j <= q0 + i), 0 elsewhere; lse (offset to the chunk's first head and
 * row, head stride t_q) = max + log(sum exp(s - max)), or NULL. */
template <typename T>
static __global__ void attn_softmax_kernel(int qc, int q0, int t_q, int t_kv, int ldp, int causal,
                                           const float *s, T *p, float *lse)
{
    __shared__ float sh[ATTN_THREADS / 32];
    const int64_t row = blockIdx.x;
    const int hh = (int)(row / qc), i = (int)(row % qc);
    const int visible = causal && q0 + i + 1 < t_kv ? q0 + i + 1 : t_kv;
    const float *sr = s + row * ldp;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < visible; j += blockDim.x)
        mx = fmaxf(mx, sr[j]);
    mx = block_max(mx, sh);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < visible; j += blockDim.x)
        sum += expf(sr[j] - mx);
    sum = block_sum(sum, sh);
    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < t_kv; j += blockDim.x)
        sd_st(p, row * ldp + j, j < visible ? expf(sr[j] - mx) * inv : 0.0f);
    if (lse && threadIdx.x == 0)
        lse[(int64_t)hh * t_q + i] = mx + logf(sum);
}

/* Backward: P = exp(S - lse) over the visible keys, 0 elsewhere (elementwise over a chunk). */
template <typename T>
static __global__ void attn_probs_kernel(int64_t n, int qc, int q0, int t_q, int t_kv, int ldp,
                                         int causal, const float *s, const float *lse, T *p)
{
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / t_kv;
        const int j = (int)(idx % t_kv);
        const int64_t at = row * ldp + j;
        const int hh = (int)(row / qc), i = (int)(row % qc);
        const int visible = causal ? q0 + i + 1 : t_kv;
        sd_st(p, at, j < visible ? expf(s[at] - lse[(int64_t)hh * t_q + i]) : 0.0f);
    }
}

/* Backward: dS = P (dP - D) written over P (each element read and written by one thread). */
template <typename T>
static __global__ void attn_dscores_kernel(int64_t n, int qc, int t_q, int t_kv, int ldp,
                                           const float *dp, const float *dd, T *p)
{
    for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < n;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = idx / t_kv;
        const int64_t at = row * ldp + idx % t_kv;
        const int hh = (int)(row / qc), i = (int)(row % qc);
        sd_st(p, at, sd_ld(p, at) * (dp[at] - dd[(int64_t)hh * t_q + i]));
    }
}

/* D [batch, heads, t_q] = rowsum(dO o O) per head, one warp per row (fixed shuffle order). */
template <typename T>
static __global__ void attn_rowdot_kernel(int64_t rows, int heads, int head_dim, int t_q,
                                          int ld_o, const T *o, const T *dout, float *dd)
{
    const int lane = threadIdx.x % 32;
    const int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += nwarps) {
        const int i = (int)(r % t_q);
        const int64_t bh = r / t_q;
        const int h = (int)(bh % heads);
        const int64_t b = bh / heads;
        const int64_t base = (b * t_q + i) * ld_o + (int64_t)h * head_dim;
        float acc = 0.0f;
        for (int e = lane; e < head_dim; e += 32)
            acc += sd_ld(o, base + e) * sd_ld(dout, base + e);
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0)
            dd[r] = acc;
    }
}

/* The per-chunk pointers of q, k, v, o (and their gradients, same strides). */
struct attn_at {
    const sd_attention_desc *d;
    size_t elem;
    int b, h0, q0;
    const void *q(const void *p) const
    {
        return p ? elem_at(p, ((int64_t)b * d->t_q + q0) * d->ld_q + (int64_t)h0 * d->head_dim, elem)
                 : NULL;
    }
    const void *k(const void *p) const
    {
        return p ? elem_at(p, (int64_t)b * d->t_kv * d->ld_k + (int64_t)h0 * d->head_dim, elem)
                 : NULL;
    }
    const void *v(const void *p) const
    {
        return p ? elem_at(p, (int64_t)b * d->t_kv * d->ld_v + (int64_t)h0 * d->head_dim, elem)
                 : NULL;
    }
    const void *o(const void *p) const
    {
        return p ? elem_at(p, ((int64_t)b * d->t_q + q0) * d->ld_o + (int64_t)h0 * d->head_dim, elem)
                 : NULL;
    }
    /* lse and D: [batch, heads, t_q] */
    int64_t row_index() const
    {
        return ((int64_t)b * d->heads + h0) * d->t_q + q0;
    }
};

/* S' [t_kv, qn] per head = scale Kc^T Qc, fp32, row stride ldp, head stride qn * ldp. With
 * bn > 1 (one head, bn batch elements folded) the GEMM batch runs over batch elements instead. */
static void attn_scores(const sd_backend *be, const sd_attention_desc *d, const attn_at &at,
                        const void *q, const void *k, int bn, int hn, int qn, int ldp, float *s)
{
    const cudaDataType_t t = sd_cuda_data_type(be);
    const int hd = d->head_dim;
    const int64_t sk = bn > 1 ? (int64_t)d->t_kv * d->ld_k : hd;
    const int64_t sq = bn > 1 ? (int64_t)d->t_q * d->ld_q : hd;
    gemm(be, CUBLAS_OP_T, CUBLAS_OP_N, d->t_kv, qn, hd, d->scale, gemm_op(at.k(k), d->ld_k, t, sk),
         gemm_op(at.q(q), d->ld_q, t, sq), 0.0f,
         gemm_op(s, ldp, CUDA_R_32F, (int64_t)qn * ldp), bn > 1 ? bn : hn);
}

static void cuda_attention_forward(const sd_backend *be, const sd_attention_desc *d,
                                   const void *q, const void *k, const void *v, void *o,
                                   float *lse, sd_scratch ws)
{
    const attn_chunks c = attn_make_chunks(be, d, 0);
    SD_CHECK(ws.bytes >= c.s_bytes + c.p_bytes, "attention forward scratch %zu < %zu", ws.bytes,
             c.s_bytes + c.p_bytes);
    float *s = (float *)ws.ptr;
    void *p = (char *)ws.ptr + c.s_bytes;
    const cudaDataType_t t = sd_cuda_data_type(be);
    const int hd = d->head_dim;
    cudaStream_t stream = sd_cuda_stream(be);
    attn_at at;
    at.d = d;
    at.elem = sd_cuda_elem(be);
    for (at.b = 0; at.b < d->batch; at.b += c.bc)
        for (at.h0 = 0; at.h0 < d->heads; at.h0 += c.hc)
            for (at.q0 = 0; at.q0 < d->t_q; at.q0 += c.qc) {
                const int bn = d->batch - at.b < c.bc ? d->batch - at.b : c.bc;
                const int hn = d->heads - at.h0 < c.hc ? d->heads - at.h0 : c.hc;
                const int qn = d->t_q - at.q0 < c.qc ? d->t_q - at.q0 : c.qc;
                attn_scores(be, d, at, q, k, bn, hn, qn, c.ldp, s);
                SD_CUDA_SUBMARK(be, "attention_forward:math scores");
                float *lse_at = lse ? lse + at.row_index() : NULL;
                const int q0 = at.q0;
                SD_CUDA_DISPATCH(be, T, {
                    attn_softmax_kernel<T><<<(unsigned)((int64_t)bn * hn * qn), ATTN_THREADS, 0,
                                             stream>>>(qn, q0, d->t_q, d->t_kv, c.ldp, d->causal,
                                                       s, (T *)p, lse_at);
                });
                SD_CUDA_LAUNCHED(be);
                SD_CUDA_SUBMARK(be, "attention_forward:math softmax");
                /* O' [hd, qn] = Vc [hd, t_kv] P' [t_kv, qn] */
                gemm(be, CUBLAS_OP_N, CUBLAS_OP_N, hd, qn, d->t_kv, 1.0f,
                     gemm_op(at.v(v), d->ld_v, t, bn > 1 ? (int64_t)d->t_kv * d->ld_v : hd),
                     gemm_op(p, c.ldp, t, (int64_t)qn * c.ldp), 0.0f,
                     gemm_op(at.o(o), d->ld_o, t, bn > 1 ? (int64_t)d->t_q * d->ld_o : hd),
                     bn > 1 ? bn : hn);
            }
}

static void cuda_attention_backward(const sd_backend *be, const sd_attention_desc *d,
                                    const void *q, const void *k, const void *v, const void *o,
                                    const float *lse, const void *dout, void *dq, void *dk,
                                    void *dv, int accumulate, sd_scratch ws)
{
    const attn_chunks c = attn_make_chunks(be, d, 1);
    SD_CHECK(ws.bytes >= c.s_bytes + c.p_bytes + c.dd_bytes,
             "attention backward scratch %zu < %zu", ws.bytes, c.s_bytes + c.p_bytes + c.dd_bytes);
    if (!dq && !dk && !dv)
        return;
    float *s = (float *)ws.ptr;
    void *p = (char *)ws.ptr + c.s_bytes;
    float *dd = (float *)((char *)ws.ptr + c.s_bytes + c.p_bytes);
    const cudaDataType_t t = sd_cuda_data_type(be);
    const int hd = d->head_dim;
    const float beta_q = accumulate ? 1.0f : 0.0f;
    cudaStream_t stream = sd_cuda_stream(be);

    if (dq || dk) {
        const int64_t rows = (int64_t)d->batch * d->heads * d->t_q;
        SD_CUDA_DISPATCH(be, T, {
            attn_rowdot_kernel<T><<<sd_cuda_grid(be, rows * 32, 256), 256, 0, stream>>>(
                rows, d->heads, hd, d->t_q, d->ld_o, (const T *)o, (const T *)dout, dd);
        });
        SD_CUDA_LAUNCHED(be);
    }

    attn_at at;
    at.d = d;
    at.elem = sd_cuda_elem(be);
    for (at.b = 0; at.b < d->batch; at.b++)
        for (at.h0 = 0; at.h0 < d->heads; at.h0 += c.hc)
            for (at.q0 = 0; at.q0 < d->t_q; at.q0 += c.qc) {
                const int hn = d->heads - at.h0 < c.hc ? d->heads - at.h0 : c.hc;
                const int qn = d->t_q - at.q0 < c.qc ? d->t_q - at.q0 : c.qc;
                const int64_t n = (int64_t)hn * qn * d->t_kv;
                const int64_t pstride = (int64_t)qn * c.ldp;
                const int q0 = at.q0;
                /* dk, dv sum over query chunks: the first one writes (or adds), later ones add */
                const float beta_kv = (at.q0 == 0 && !accumulate) ? 0.0f : 1.0f;
                const float *lse_at = lse + at.row_index();
                const float *dd_at = dd + at.row_index();

                attn_scores(be, d, at, q, k, 1, hn, qn, c.ldp, s);
                SD_CUDA_DISPATCH(be, T, {
                    attn_probs_kernel<T><<<sd_cuda_grid(be, n, 256), 256, 0, stream>>>(
                        n, qn, q0, d->t_q, d->t_kv, c.ldp, d->causal, s, lse_at, (T *)p);
                });
                SD_CUDA_LAUNCHED(be);
                if (dv) /* dV' [hd, t_kv] (+)= dOc [hd, qn] P'^T */
                    gemm(be, CUBLAS_OP_N, CUBLAS_OP_T, hd, d->t_kv, qn, 1.0f,
                         gemm_op(at.o(dout), d->ld_o, t, hd), gemm_op(p, c.ldp, t, pstride),
                         beta_kv, gemm_op(at.v(dv), d->ld_v, t, hd), hn);
                if (!dq && !dk)
                    continue;
                /* dP' [t_kv, qn] = Vc^T dOc, fp32 over the scores */
                gemm(be, CUBLAS_OP_T, CUBLAS_OP_N, d->t_kv, qn, hd, 1.0f,
                     gemm_op(at.v(v), d->ld_v, t, hd), gemm_op(at.o(dout), d->ld_o, t, hd), 0.0f,
                     gemm_op(s, c.ldp, CUDA_R_32F, pstride), hn);
                SD_CUDA_DISPATCH(be, T, {
                    attn_dscores_kernel<T><<<sd_cuda_grid(be, n, 256), 256, 0, stream>>>(
                        n, qn, d->t_q, d->t_kv, c.ldp, s, dd_at, (T *)p);
                });
                SD_CUDA_LAUNCHED(be);
                if (dq) /* dQ' [hd, qn] = scale Kc [hd, t_kv] dS' [t_kv, qn] */
                    gemm(be, CUBLAS_OP_N, CUBLAS_OP_N, hd, qn, d->t_kv, d->scale,
                         gemm_op(at.k(k), d->ld_k, t, hd), gemm_op(p, c.ldp, t, pstride), beta_q,
                         gemm_op(at.q(dq), d->ld_q, t, hd), hn);
                if (dk) /* dK' [hd, t_kv] (+)= scale Qc [hd, qn] dS'^T */
                    gemm(be, CUBLAS_OP_N, CUBLAS_OP_T, hd, d->t_kv, qn, d->scale,
                         gemm_op(at.q(q), d->ld_q, t, hd), gemm_op(p, c.ldp, t, pstride),
                         beta_kv, gemm_op(at.k(dk), d->ld_k, t, hd), hn);
            }
}

/* ---- the table -------------------------------------------------------------------------- */

void sd_cuda_fill_gemm_ops(sd_ops *ops)
{
    ops->linear_forward = cuda_linear_forward;
    ops->linear_forward_add = cuda_linear_forward_add;
    ops->linear_backward_scratch = cuda_linear_backward_scratch;
    ops->linear_backward = cuda_linear_backward;
    ops->attention_forward_scratch = cuda_attention_forward_scratch;
    ops->attention_forward = cuda_attention_forward;
    ops->attention_backward_scratch = cuda_attention_backward_scratch;
    ops->attention_backward = cuda_attention_backward;
}

void sd_cuda_gemm_cache_destroy(sd_cuda_state *st)
{
    sd_cuda_gemm_cache *c = st->gemm_cache;
    if (!c)
        return;
    for (int i = 0; i < c->count; i++)
        gemm_plan_free(&c->plans[i]);
    free(c->plans);
    free(c);
    st->gemm_cache = NULL;
}
