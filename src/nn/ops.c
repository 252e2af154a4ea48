/* The backend-independent half of the op interface: argument checks, dispatch, weight layouts. */
#include "sd_config.h"

#include "sdtrain/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/progress.h"

/* Every wrapper starts here: a backend that lacks the entry is a build/porting gap, and the
 * message says which op and which backend rather than crashing on a NULL call. */
#define SD_OP_ENTRY(be, entry)                                                                \
    do {                                                                                      \
        sd_progress_tick(); /* the stall watchdog's sign of life (sdtrain/progress.h) */      \
        SD_CHECK((be) != NULL && (be)->ops != NULL, "no backend given to %s", #entry);        \
        SD_CHECK((be)->ops->entry != NULL, "op %s is not implemented by the '%s' backend",    \
                 #entry, (be)->name);                                                         \
    } while (0)

/* Op profiling (SDTRAIN_CUDA_PROFILE=1): a mark before each compute op closes the interval of
 * whatever ran between ops (copies, optimizer, host work), the mark after it the op's own. */
#define SD_PROF_MARK(be, label)                                                               \
    do {                                                                                      \
        if ((be)->ops->profile_mark)                                                          \
            (be)->ops->profile_mark((be), (label));                                           \
    } while (0)

#define SD_NOT_NULL(p) SD_CHECK((p) != NULL, "%s must not be NULL", #p)

static void check_scratch(const char *op, sd_scratch ws, size_t need)
{
    SD_CHECK(ws.bytes >= need, "%s needs %zu bytes of scratch, got %zu", op, need, ws.bytes);
    SD_CHECK(need == 0 || ws.ptr != NULL, "%s needs scratch but the pointer is NULL", op);
}

/* ---- descriptors -------------------------------------------------------------------------- */

sd_conv2d_desc sd_conv2d_make_padded(int n, int h, int w, int c_in, int c_out, int kh, int kw,
                                     int stride, int pad_top, int pad_bottom, int pad_left,
                                     int pad_right)
{
    sd_conv2d_desc d;
    d.n = n;
    d.h = h;
    d.w = w;
    d.c_in = c_in;
    d.c_out = c_out;
    d.kh = kh;
    d.kw = kw;
    d.stride = stride;
    d.pad_top = pad_top;
    d.pad_bottom = pad_bottom;
    d.pad_left = pad_left;
    d.pad_right = pad_right;
    d.h_out = stride > 0 ? (h + pad_top + pad_bottom - kh) / stride + 1 : 0;
    d.w_out = stride > 0 ? (w + pad_left + pad_right - kw) / stride + 1 : 0;
    return d;
}

sd_conv2d_desc sd_conv2d_make(int n, int h, int w, int c_in, int c_out, int k, int stride,
                              int pad)
{
    return sd_conv2d_make_padded(n, h, w, c_in, c_out, k, k, stride, pad, pad, pad, pad);
}

sd_attention_desc sd_attention_make(int batch, int heads, int head_dim, int t_q, int t_kv,
                                    int causal)
{
    sd_attention_desc d;
    d.batch = batch;
    d.heads = heads;
    d.head_dim = head_dim;
    d.t_q = t_q;
    d.t_kv = t_kv;
    d.ld_q = d.ld_k = d.ld_v = d.ld_o = heads * head_dim;
    /* Python evaluates dim_head**-0.5 in double; PyTorch rounds it to float in the kernel. */
    d.scale = head_dim > 0 ? (float)pow((double)head_dim, -0.5) : 0.0f;
    d.causal = causal;
    return d;
}

sd_timestep_embedding_desc sd_timestep_embedding_sd2(int dim)
{
    sd_timestep_embedding_desc d;
    d.dim = dim;
    d.flip_sin_to_cos = 1;
    d.downscale_freq_shift = 0.0f;
    d.scale = 1.0f;
    d.max_period = 10000.0f;
    return d;
}

static void check_conv(const sd_conv2d_desc *d)
{
    SD_NOT_NULL(d);
    SD_CHECK(d->n > 0 && d->h > 0 && d->w > 0 && d->c_in > 0 && d->c_out > 0,
             "conv2d sizes n=%d h=%d w=%d c_in=%d c_out=%d must be positive", d->n, d->h, d->w,
             d->c_in, d->c_out);
    SD_CHECK(d->kh > 0 && d->kw > 0 && d->stride > 0, "conv2d kernel %dx%d stride %d", d->kh,
             d->kw, d->stride);
    SD_CHECK(d->pad_top >= 0 && d->pad_bottom >= 0 && d->pad_left >= 0 && d->pad_right >= 0,
             "conv2d padding must not be negative");
    SD_CHECK(d->h + d->pad_top + d->pad_bottom >= d->kh && d->w + d->pad_left + d->pad_right >= d->kw,
             "conv2d kernel %dx%d larger than the padded %dx%d input", d->kh, d->kw, d->h, d->w);
    SD_CHECK(d->h_out == (d->h + d->pad_top + d->pad_bottom - d->kh) / d->stride + 1 &&
                 d->w_out == (d->w + d->pad_left + d->pad_right - d->kw) / d->stride + 1,
             "conv2d output %dx%d does not match the input and kernel (use sd_conv2d_make)",
             d->h_out, d->w_out);
}

static void check_group_norm(const sd_group_norm_desc *d)
{
    SD_NOT_NULL(d);
    SD_CHECK(d->n > 0 && d->hw > 0 && d->c > 0 && d->groups > 0,
             "group norm sizes n=%d hw=%d c=%d groups=%d must be positive", d->n, d->hw, d->c,
             d->groups);
    SD_CHECK(d->c % d->groups == 0, "group norm: %d channels not divisible by %d groups", d->c,
             d->groups);
    SD_CHECK(d->eps >= 0.0f, "group norm eps %g must not be negative", (double)d->eps);
}

static void check_attention(const sd_attention_desc *d)
{
    SD_NOT_NULL(d);
    SD_CHECK(d->batch > 0 && d->heads > 0 && d->head_dim > 0 && d->t_q > 0 && d->t_kv > 0,
             "attention sizes batch=%d heads=%d head_dim=%d t_q=%d t_kv=%d must be positive",
             d->batch, d->heads, d->head_dim, d->t_q, d->t_kv);
    int width = d->heads * d->head_dim;
    SD_CHECK(d->ld_q >= width && d->ld_k >= width && d->ld_v >= width && d->ld_o >= width,
             "attention row strides (%d %d %d %d) must be >= heads*head_dim = %d", d->ld_q,
             d->ld_k, d->ld_v, d->ld_o, width);
    SD_CHECK(!d->causal || d->t_q == d->t_kv, "causal attention needs t_q == t_kv (%d, %d)",
             d->t_q, d->t_kv);
    SD_CHECK(isfinite(d->scale), "attention scale must be finite");
}

/* ---- memory ------------------------------------------------------------------------------- */

void sd_synchronize(const sd_backend *be)
{
    SD_OP_ENTRY(be, synchronize);
    be->ops->synchronize(be);
}

void sd_profile_reset(const sd_backend *be)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend given to sd_profile_reset");
    if (be->ops->profile_reset)
        be->ops->profile_reset(be);
}

void sd_stream_mark(const sd_backend *be, int slot)
{
    SD_OP_ENTRY(be, stream_mark);
    SD_CHECK(slot >= 0 && slot < SD_STREAM_MARKS, "stream mark %d (0 to %d)", slot,
             SD_STREAM_MARKS - 1);
    be->ops->stream_mark(be, slot);
}

double sd_stream_elapsed(const sd_backend *be, int a, int b)
{
    SD_OP_ENTRY(be, stream_elapsed);
    SD_CHECK(a >= 0 && a < SD_STREAM_MARKS && b >= 0 && b < SD_STREAM_MARKS,
             "stream marks %d and %d (0 to %d)", a, b, SD_STREAM_MARKS - 1);
    return be->ops->stream_elapsed(be, a, b);
}

void sd_zero(const sd_backend *be, void *dst, size_t bytes)
{
    SD_OP_ENTRY(be, zero);
    SD_CHECK(bytes == 0 || dst != NULL, "zeroing %zu bytes at NULL", bytes);
    be->ops->zero(be, dst, bytes);
}

void sd_copy(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_OP_ENTRY(be, copy);
    SD_CHECK(bytes == 0 || (dst != NULL && src != NULL), "copying %zu bytes with a NULL pointer",
             bytes);
    be->ops->copy(be, dst, src, bytes);
}

void sd_upload_f32(const sd_backend *be, void *dst, const float *src, int64_t n)
{
    SD_OP_ENTRY(be, upload_f32);
    SD_CHECK(n >= 0 && (n == 0 || (dst != NULL && src != NULL)), "upload of %lld elements",
             (long long)n);
    be->ops->upload_f32(be, dst, src, n);
}

void sd_download_f32(const sd_backend *be, float *dst, const void *src, int64_t n)
{
    SD_OP_ENTRY(be, download_f32);
    SD_CHECK(n >= 0 && (n == 0 || (dst != NULL && src != NULL)), "download of %lld elements",
             (long long)n);
    be->ops->download_f32(be, dst, src, n);
}

void *sd_backend_alloc(const sd_backend *be, size_t bytes)
{
    SD_OP_ENTRY(be, alloc);
    return be->ops->alloc(be, bytes);
}

void sd_backend_free(const sd_backend *be, void *ptr)
{
    SD_OP_ENTRY(be, release);
    if (ptr)
        be->ops->release(be, ptr);
}

/* The byte copies between host and backend: both pointers unless nothing moves. */
#define SD_BYTE_COPY(be, entry, dst, src, bytes)                                              \
    do {                                                                                      \
        SD_OP_ENTRY(be, entry);                                                               \
        SD_CHECK((bytes) == 0 || ((dst) != NULL && (src) != NULL),                            \
                 "%s of %zu bytes with a NULL pointer", #entry, (size_t)(bytes));             \
        if (bytes)                                                                            \
            (be)->ops->entry((be), (dst), (src), (bytes));                                    \
    } while (0)

void sd_upload(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_BYTE_COPY(be, upload, dst, src, bytes);
}

void sd_download(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_BYTE_COPY(be, download, dst, src, bytes);
}

void *sd_host_alloc(const sd_backend *be, size_t bytes)
{
    SD_OP_ENTRY(be, host_alloc);
    return be->ops->host_alloc(be, bytes);
}

void sd_host_free(const sd_backend *be, void *ptr)
{
    SD_OP_ENTRY(be, host_release);
    if (ptr)
        be->ops->host_release(be, ptr);
}

void sd_upload_async(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_BYTE_COPY(be, upload_async, dst, src, bytes);
}

void sd_download_async(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    SD_BYTE_COPY(be, download_async, dst, src, bytes);
}

void sd_download_wait(const sd_backend *be)
{
    SD_OP_ENTRY(be, download_wait);
    be->ops->download_wait(be);
}

/* ---- convolution and linear --------------------------------------------------------------- */

size_t sd_conv2d_forward_scratch_bytes(const sd_backend *be, const sd_conv2d_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_conv(d);
    return be->ops->conv2d_forward_scratch ? be->ops->conv2d_forward_scratch(be, d) : 0;
}

void sd_conv2d_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                       const void *w, const void *b, void *y, sd_scratch ws)
{
    SD_OP_ENTRY(be, conv2d_forward);
    check_conv(d);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(y);
    check_scratch("conv2d_forward", ws, sd_conv2d_forward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->conv2d_forward(be, d, x, w, b, y, ws);
    SD_PROF_MARK(be, "conv2d_forward");
}

void sd_conv2d_forward_add(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                           const void *w, const void *b, const void *z, void *y, sd_scratch ws)
{
    SD_OP_ENTRY(be, conv2d_forward);
    check_conv(d);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(z);
    SD_NOT_NULL(y);
    SD_CHECK(z != y, "conv2d_forward_add: the residual must not alias the output");
    check_scratch("conv2d_forward_add", ws, sd_conv2d_forward_scratch_bytes(be, d));
    if (!be->ops->conv2d_forward_add) {
        sd_conv2d_forward(be, d, x, w, b, y, ws);
        sd_add(be, (int64_t)d->n * d->h_out * d->w_out * d->c_out, y, z, y);
        return;
    }
    SD_PROF_MARK(be, NULL);
    be->ops->conv2d_forward_add(be, d, x, w, b, z, y, ws);
    SD_PROF_MARK(be, "conv2d_forward_add");
}

size_t sd_conv2d_backward_scratch_bytes(const sd_backend *be, const sd_conv2d_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_conv(d);
    return be->ops->conv2d_backward_scratch ? be->ops->conv2d_backward_scratch(be, d) : 0;
}

void sd_conv2d_backward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                        const void *w, const void *dy, void *dx, int accumulate, float *dw,
                        float *db, sd_scratch ws)
{
    SD_OP_ENTRY(be, conv2d_backward);
    check_conv(d);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(dy);
    SD_NOT_NULL(dw);
    check_scratch("conv2d_backward", ws, sd_conv2d_backward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->conv2d_backward(be, d, x, w, dy, dx, accumulate, dw, db, ws);
    SD_PROF_MARK(be, "conv2d_backward");
}

static void check_linear(int64_t rows, int in, int out)
{
    SD_CHECK(rows > 0 && in > 0 && out > 0, "linear sizes rows=%lld in=%d out=%d must be positive",
             (long long)rows, in, out);
}

void sd_linear_forward(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                       const void *w, const void *b, void *y)
{
    SD_OP_ENTRY(be, linear_forward);
    check_linear(rows, in, out);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->linear_forward(be, rows, in, out, x, w, b, y);
    SD_PROF_MARK(be, "linear_forward");
}

void sd_linear_forward_add(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                           const void *w, const void *b, const void *z, void *y)
{
    SD_OP_ENTRY(be, linear_forward);
    check_linear(rows, in, out);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(z);
    SD_NOT_NULL(y);
    SD_CHECK(z != y, "linear_forward_add: the residual must not alias the output");
    if (!be->ops->linear_forward_add) {
        sd_linear_forward(be, rows, in, out, x, w, b, y);
        sd_add(be, rows * out, y, z, y);
        return;
    }
    SD_PROF_MARK(be, NULL);
    be->ops->linear_forward_add(be, rows, in, out, x, w, b, z, y);
    SD_PROF_MARK(be, "linear_forward_add");
}

size_t sd_linear_backward_scratch_bytes(const sd_backend *be, int64_t rows, int in, int out)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_linear(rows, in, out);
    return be->ops->linear_backward_scratch ? be->ops->linear_backward_scratch(be, rows, in, out)
                                            : 0;
}

void sd_linear_backward(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                        const void *w, const void *dy, void *dx, int accumulate, float *dw,
                        float *db, sd_scratch ws)
{
    SD_OP_ENTRY(be, linear_backward);
    check_linear(rows, in, out);
    SD_NOT_NULL(x);
    SD_NOT_NULL(w);
    SD_NOT_NULL(dy);
    SD_NOT_NULL(dw);
    check_scratch("linear_backward", ws, sd_linear_backward_scratch_bytes(be, rows, in, out));
    SD_PROF_MARK(be, NULL);
    be->ops->linear_backward(be, rows, in, out, x, w, dy, dx, accumulate, dw, db, ws);
    SD_PROF_MARK(be, "linear_backward");
}

/* ---- normalization ------------------------------------------------------------------------ */

size_t sd_group_norm_forward_scratch_bytes(const sd_backend *be, const sd_group_norm_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_group_norm(d);
    return be->ops->group_norm_forward_scratch ? be->ops->group_norm_forward_scratch(be, d) : 0;
}

void sd_group_norm_forward(const sd_backend *be, const sd_group_norm_desc *d, const void *x,
                           const void *gamma, const void *beta, void *y, float *mean,
                           float *rstd, sd_scratch ws)
{
    SD_OP_ENTRY(be, group_norm_forward);
    check_group_norm(d);
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    check_scratch("group_norm_forward", ws, sd_group_norm_forward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->group_norm_forward(be, d, x, gamma, beta, y, mean, rstd, ws);
    SD_PROF_MARK(be, "group_norm_forward");
}

size_t sd_group_norm_backward_scratch_bytes(const sd_backend *be, const sd_group_norm_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_group_norm(d);
    return be->ops->group_norm_backward_scratch ? be->ops->group_norm_backward_scratch(be, d)
                                                : 0;
}

void sd_group_norm_backward(const sd_backend *be, const sd_group_norm_desc *d, const void *x,
                            const void *gamma, const void *beta, const float *mean,
                            const float *rstd, const void *dy, void *dx, int accumulate,
                            float *dgamma, float *dbeta, sd_scratch ws)
{
    SD_OP_ENTRY(be, group_norm_backward);
    check_group_norm(d);
    SD_NOT_NULL(x);
    SD_NOT_NULL(mean);
    SD_NOT_NULL(rstd);
    SD_NOT_NULL(dy);
    check_scratch("group_norm_backward", ws, sd_group_norm_backward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->group_norm_backward(be, d, x, gamma, beta, mean, rstd, dy, dx, accumulate, dgamma,
                                 dbeta, ws);
    SD_PROF_MARK(be, "group_norm_backward");
}

void sd_layer_norm_forward(const sd_backend *be, int64_t rows, int c, float eps, const void *x,
                           const void *gamma, const void *beta, void *y, float *mean,
                           float *rstd)
{
    SD_OP_ENTRY(be, layer_norm_forward);
    SD_CHECK(rows > 0 && c > 0, "layer norm sizes rows=%lld c=%d", (long long)rows, c);
    SD_CHECK(eps >= 0.0f, "layer norm eps %g must not be negative", (double)eps);
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->layer_norm_forward(be, rows, c, eps, x, gamma, beta, y, mean, rstd);
    SD_PROF_MARK(be, "layer_norm_forward");
}

size_t sd_layer_norm_backward_scratch_bytes(const sd_backend *be, int64_t rows, int c)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    SD_CHECK(rows > 0 && c > 0, "layer norm sizes rows=%lld c=%d", (long long)rows, c);
    return be->ops->layer_norm_backward_scratch ? be->ops->layer_norm_backward_scratch(be, rows, c)
                                                : 0;
}

void sd_layer_norm_backward(const sd_backend *be, int64_t rows, int c, const void *x,
                            const void *gamma, const float *mean, const float *rstd,
                            const void *dy, void *dx, int accumulate, float *dgamma,
                            float *dbeta, sd_scratch ws)
{
    SD_OP_ENTRY(be, layer_norm_backward);
    SD_CHECK(rows > 0 && c > 0, "layer norm sizes rows=%lld c=%d", (long long)rows, c);
    SD_NOT_NULL(x);
    SD_NOT_NULL(mean);
    SD_NOT_NULL(rstd);
    SD_NOT_NULL(dy);
    check_scratch("layer_norm_backward", ws, sd_layer_norm_backward_scratch_bytes(be, rows, c));
    SD_PROF_MARK(be, NULL);
    be->ops->layer_norm_backward(be, rows, c, x, gamma, mean, rstd, dy, dx, accumulate, dgamma,
                                 dbeta, ws);
    SD_PROF_MARK(be, "layer_norm_backward");
}

/* ---- activations -------------------------------------------------------------------------- */

static void check_elementwise(int64_t n, const void *x, const void *y)
{
    SD_CHECK(n >= 0, "element count %lld must not be negative", (long long)n);
    SD_CHECK(n == 0 || (x != NULL && y != NULL), "NULL tensor for %lld elements", (long long)n);
}

void sd_silu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    SD_OP_ENTRY(be, silu_forward);
    check_elementwise(n, x, y);
    SD_PROF_MARK(be, NULL);
    be->ops->silu_forward(be, n, x, y);
    SD_PROF_MARK(be, "silu_forward");
}

void sd_silu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy, void *dx,
                      int accumulate)
{
    SD_OP_ENTRY(be, silu_backward);
    check_elementwise(n, x, dx);
    check_elementwise(n, dy, dx);
    SD_PROF_MARK(be, NULL);
    be->ops->silu_backward(be, n, x, dy, dx, accumulate);
    SD_PROF_MARK(be, "silu_backward");
}

void sd_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    SD_OP_ENTRY(be, gelu_forward);
    check_elementwise(n, x, y);
    SD_PROF_MARK(be, NULL);
    be->ops->gelu_forward(be, n, x, y);
    SD_PROF_MARK(be, "gelu_forward");
}

void sd_gelu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy, void *dx,
                      int accumulate)
{
    SD_OP_ENTRY(be, gelu_backward);
    check_elementwise(n, x, dx);
    check_elementwise(n, dy, dx);
    SD_PROF_MARK(be, NULL);
    be->ops->gelu_backward(be, n, x, dy, dx, accumulate);
    SD_PROF_MARK(be, "gelu_backward");
}

void sd_quick_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    SD_OP_ENTRY(be, quick_gelu_forward);
    check_elementwise(n, x, y);
    SD_PROF_MARK(be, NULL);
    be->ops->quick_gelu_forward(be, n, x, y);
    SD_PROF_MARK(be, "quick_gelu_forward");
}

void sd_quick_gelu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy,
                            void *dx, int accumulate)
{
    SD_OP_ENTRY(be, quick_gelu_backward);
    check_elementwise(n, x, dx);
    check_elementwise(n, dy, dx);
    SD_PROF_MARK(be, NULL);
    be->ops->quick_gelu_backward(be, n, x, dy, dx, accumulate);
    SD_PROF_MARK(be, "quick_gelu_backward");
}

void sd_geglu_forward(const sd_backend *be, int64_t rows, int inner, const void *x, void *y)
{
    SD_OP_ENTRY(be, geglu_forward);
    SD_CHECK(rows >= 0 && inner > 0, "geglu sizes rows=%lld inner=%d", (long long)rows, inner);
    check_elementwise(rows, x, y);
    SD_PROF_MARK(be, NULL);
    be->ops->geglu_forward(be, rows, inner, x, y);
    SD_PROF_MARK(be, "geglu_forward");
}

void sd_geglu_backward(const sd_backend *be, int64_t rows, int inner, const void *x,
                       const void *dy, void *dx, int accumulate)
{
    SD_OP_ENTRY(be, geglu_backward);
    SD_CHECK(rows >= 0 && inner > 0, "geglu sizes rows=%lld inner=%d", (long long)rows, inner);
    check_elementwise(rows, x, dx);
    check_elementwise(rows, dy, dx);
    SD_PROF_MARK(be, NULL);
    be->ops->geglu_backward(be, rows, inner, x, dy, dx, accumulate);
    SD_PROF_MARK(be, "geglu_backward");
}

/* ---- attention ---------------------------------------------------------------------------- */

size_t sd_attention_forward_scratch_bytes(const sd_backend *be, const sd_attention_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_attention(d);
    return be->ops->attention_forward_scratch ? be->ops->attention_forward_scratch(be, d) : 0;
}

void sd_attention_forward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                          const void *k, const void *v, void *o, float *lse, sd_scratch ws)
{
    SD_OP_ENTRY(be, attention_forward);
    check_attention(d);
    SD_NOT_NULL(q);
    SD_NOT_NULL(k);
    SD_NOT_NULL(v);
    SD_NOT_NULL(o);
    check_scratch("attention_forward", ws, sd_attention_forward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->attention_forward(be, d, q, k, v, o, lse, ws);
    SD_PROF_MARK(be, "attention_forward");
}

size_t sd_attention_backward_scratch_bytes(const sd_backend *be, const sd_attention_desc *d)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    check_attention(d);
    return be->ops->attention_backward_scratch ? be->ops->attention_backward_scratch(be, d) : 0;
}

void sd_attention_backward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                           const void *k, const void *v, const void *o, const float *lse,
                           const void *dout, void *dq, void *dk, void *dv, int accumulate,
                           sd_scratch ws)
{
    SD_OP_ENTRY(be, attention_backward);
    check_attention(d);
    SD_NOT_NULL(q);
    SD_NOT_NULL(k);
    SD_NOT_NULL(v);
    SD_NOT_NULL(o);
    SD_NOT_NULL(lse);
    SD_NOT_NULL(dout);
    check_scratch("attention_backward", ws, sd_attention_backward_scratch_bytes(be, d));
    SD_PROF_MARK(be, NULL);
    be->ops->attention_backward(be, d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, ws);
    SD_PROF_MARK(be, "attention_backward");
}

/* ---- resampling and data movement ---------------------------------------------------------- */

static void check_upsample(int n, int h, int w, int c, int h_out, int w_out)
{
    SD_CHECK(n > 0 && h > 0 && w > 0 && c > 0 && h_out > 0 && w_out > 0,
             "nearest resize sizes n=%d %dx%d -> %dx%d c=%d must be positive", n, h, w, h_out,
             w_out, c);
}

void sd_upsample_nearest_forward(const sd_backend *be, int n, int h, int w, int c, int h_out,
                                 int w_out, const void *x, void *y)
{
    SD_OP_ENTRY(be, upsample_nearest_forward);
    check_upsample(n, h, w, c, h_out, w_out);
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->upsample_nearest_forward(be, n, h, w, c, h_out, w_out, x, y);
    SD_PROF_MARK(be, "upsample_nearest_forward");
}

void sd_upsample_nearest_backward(const sd_backend *be, int n, int h, int w, int c, int h_out,
                                  int w_out, const void *dy, void *dx, int accumulate)
{
    SD_OP_ENTRY(be, upsample_nearest_backward);
    check_upsample(n, h, w, c, h_out, w_out);
    SD_NOT_NULL(dy);
    SD_NOT_NULL(dx);
    SD_PROF_MARK(be, NULL);
    be->ops->upsample_nearest_backward(be, n, h, w, c, h_out, w_out, dy, dx, accumulate);
    SD_PROF_MARK(be, "upsample_nearest_backward");
}

void sd_timestep_embedding(const sd_backend *be, int n, const sd_timestep_embedding_desc *d,
                           const float *t, void *y)
{
    SD_OP_ENTRY(be, timestep_embedding);
    SD_NOT_NULL(d);
    SD_CHECK(n > 0 && d->dim > 0, "timestep embedding sizes n=%d dim=%d", n, d->dim);
    SD_CHECK((float)(d->dim / 2) != d->downscale_freq_shift,
             "timestep embedding: downscale_freq_shift equals dim/2 (division by zero)");
    SD_NOT_NULL(t);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->timestep_embedding(be, n, d, t, y);
    SD_PROF_MARK(be, "timestep_embedding");
}

void sd_embedding_forward(const sd_backend *be, int batch, int t, int c, int vocab,
                          const int32_t *ids, const void *table, const void *pos_table, void *y)
{
    SD_OP_ENTRY(be, embedding_forward);
    SD_CHECK(batch > 0 && t > 0 && c > 0 && vocab > 0,
             "embedding sizes batch=%d t=%d c=%d vocab=%d", batch, t, c, vocab);
    SD_NOT_NULL(ids);
    SD_NOT_NULL(table);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->embedding_forward(be, batch, t, c, vocab, ids, table, pos_table, y);
    SD_PROF_MARK(be, "embedding_forward");
}

void sd_add(const sd_backend *be, int64_t n, const void *a, const void *b, void *y)
{
    sd_add_scaled(be, n, a, b, 1.0f, y);
}

void sd_add_scaled(const sd_backend *be, int64_t n, const void *a, const void *b, float divisor,
                   void *y)
{
    SD_OP_ENTRY(be, add);
    check_elementwise(n, a, y);
    check_elementwise(n, b, y);
    SD_CHECK(divisor != 0.0f, "add: divisor must not be 0");
    SD_PROF_MARK(be, NULL);
    be->ops->add(be, n, a, b, divisor, y);
    SD_PROF_MARK(be, "add");
}

void sd_axpby(const sd_backend *be, int64_t n, float alpha, const void *x, float beta, void *y)
{
    SD_OP_ENTRY(be, axpby);
    check_elementwise(n, x, y);
    SD_PROF_MARK(be, NULL);
    be->ops->axpby(be, n, alpha, x, beta, y);
    SD_PROF_MARK(be, "axpby");
}

void sd_add_bcast_forward(const sd_backend *be, int n, int64_t rows, int c, const void *x,
                          const void *v, void *y)
{
    SD_OP_ENTRY(be, add_bcast_forward);
    SD_CHECK(n > 0 && rows > 0 && c > 0, "add_bcast sizes n=%d rows=%lld c=%d", n,
             (long long)rows, c);
    SD_NOT_NULL(x);
    SD_NOT_NULL(v);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->add_bcast_forward(be, n, rows, c, x, v, y);
    SD_PROF_MARK(be, "add_bcast_forward");
}

size_t sd_add_bcast_backward_scratch_bytes(const sd_backend *be, int n, int64_t rows, int c)
{
    SD_CHECK(be != NULL && be->ops != NULL, "no backend");
    SD_CHECK(n > 0 && rows > 0 && c > 0, "add_bcast sizes n=%d rows=%lld c=%d", n,
             (long long)rows, c);
    return be->ops->add_bcast_backward_scratch
               ? be->ops->add_bcast_backward_scratch(be, n, rows, c)
               : 0;
}

void sd_add_bcast_backward(const sd_backend *be, int n, int64_t rows, int c, const void *dy,
                           void *dv, int accumulate, sd_scratch ws)
{
    SD_OP_ENTRY(be, add_bcast_backward);
    SD_CHECK(n > 0 && rows > 0 && c > 0, "add_bcast sizes n=%d rows=%lld c=%d", n,
             (long long)rows, c);
    SD_NOT_NULL(dy);
    SD_NOT_NULL(dv);
    check_scratch("add_bcast_backward", ws, sd_add_bcast_backward_scratch_bytes(be, n, rows, c));
    SD_PROF_MARK(be, NULL);
    be->ops->add_bcast_backward(be, n, rows, c, dy, dv, accumulate, ws);
    SD_PROF_MARK(be, "add_bcast_backward");
}

void sd_concat_channels(const sd_backend *be, int64_t rows, int c1, int c2, const void *a,
                        const void *b, void *y)
{
    SD_OP_ENTRY(be, concat_channels);
    SD_CHECK(rows > 0 && c1 > 0 && c2 > 0, "concat sizes rows=%lld c1=%d c2=%d",
             (long long)rows, c1, c2);
    SD_NOT_NULL(a);
    SD_NOT_NULL(b);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->concat_channels(be, rows, c1, c2, a, b, y);
    SD_PROF_MARK(be, "concat_channels");
}

void sd_split_channels(const sd_backend *be, int64_t rows, int c1, int c2, const void *x,
                       void *a, void *b, int accumulate)
{
    SD_OP_ENTRY(be, split_channels);
    SD_CHECK(rows > 0 && c1 > 0 && c2 > 0, "split sizes rows=%lld c1=%d c2=%d", (long long)rows,
             c1, c2);
    SD_NOT_NULL(x);
    SD_PROF_MARK(be, NULL);
    be->ops->split_channels(be, rows, c1, c2, x, a, b, accumulate);
    SD_PROF_MARK(be, "split_channels");
}

void sd_nchw_to_nhwc(const sd_backend *be, int n, int c, int h, int w, const void *x, void *y)
{
    SD_OP_ENTRY(be, nchw_to_nhwc);
    SD_CHECK(n > 0 && c > 0 && h > 0 && w > 0, "permute sizes n=%d c=%d h=%d w=%d", n, c, h, w);
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->nchw_to_nhwc(be, n, c, h, w, x, y);
    SD_PROF_MARK(be, "nchw_to_nhwc");
}

void sd_nhwc_to_nchw(const sd_backend *be, int n, int c, int h, int w, const void *x, void *y)
{
    SD_OP_ENTRY(be, nhwc_to_nchw);
    SD_CHECK(n > 0 && c > 0 && h > 0 && w > 0, "permute sizes n=%d c=%d h=%d w=%d", n, c, h, w);
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->nhwc_to_nchw(be, n, c, h, w, x, y);
    SD_PROF_MARK(be, "nhwc_to_nchw");
}

void sd_diag_gaussian_sample(const sd_backend *be, int64_t rows, int c, const void *moments,
                             const void *eps, float scale, void *z)
{
    SD_OP_ENTRY(be, diag_gaussian_sample);
    SD_CHECK(rows > 0 && c > 0, "gaussian sample sizes rows=%lld c=%d", (long long)rows, c);
    SD_NOT_NULL(moments);
    SD_NOT_NULL(z);
    SD_PROF_MARK(be, NULL);
    be->ops->diag_gaussian_sample(be, rows, c, moments, eps, scale, z);
    SD_PROF_MARK(be, "diag_gaussian_sample");
}

void sd_cast_f32(const sd_backend *be, int64_t n, const float *x, void *y)
{
    SD_OP_ENTRY(be, cast_f32);
    SD_CHECK(n >= 0, "cast of %lld elements", (long long)n);
    if (n == 0)
        return;
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->cast_f32(be, n, x, y);
    SD_PROF_MARK(be, "cast_f32");
}

void sd_cast_to_f32(const sd_backend *be, int64_t n, const void *x, float *y)
{
    SD_OP_ENTRY(be, cast_to_f32);
    SD_CHECK(n >= 0, "cast of %lld elements", (long long)n);
    if (n == 0)
        return;
    SD_NOT_NULL(x);
    SD_NOT_NULL(y);
    SD_PROF_MARK(be, NULL);
    be->ops->cast_to_f32(be, n, x, y);
    SD_PROF_MARK(be, "cast_to_f32");
}

void sd_mse_loss(const sd_backend *be, int n, int64_t hw, int c, const void *pred,
                 const float *target, const float *coef, float *mse, void *dy)
{
    SD_OP_ENTRY(be, mse_loss);
    SD_CHECK(n > 0 && hw > 0 && c > 0, "mse loss sizes n=%d hw=%lld c=%d", n, (long long)hw, c);
    SD_NOT_NULL(pred);
    SD_NOT_NULL(target);
    SD_NOT_NULL(mse);
    SD_CHECK(dy == NULL || coef != NULL, "mse loss: a gradient needs the per-sample coefficients");
    SD_CHECK(dy == NULL || dy != pred, "mse loss: dy may not alias pred");
    SD_PROF_MARK(be, NULL);
    be->ops->mse_loss(be, n, hw, c, pred, target, coef, mse, dy);
    SD_PROF_MARK(be, "mse_loss");
}

/* ---- weight layouts ----------------------------------------------------------------------- */

static void check_weight_shape(int ndim, const int64_t *shape, size_t elem_size)
{
    SD_CHECK(ndim >= 0 && ndim <= SD_TENSOR_MAX_DIMS, "weight with %d dimensions", ndim);
    SD_CHECK(ndim == 0 || shape != NULL, "weight shape is NULL");
    SD_CHECK(elem_size > 0, "element size 0");
    for (int i = 0; i < ndim; i++)
        SD_CHECK(shape[i] >= 0, "negative weight dimension %lld", (long long)shape[i]);
}

static int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* Both directions are one loop over the output of [O, A, B] <-> [O, B, A] blocks: OIHW ->
 * OHWI swaps A = I with B = kh*kw, OHWI -> OIHW swaps A = kh*kw with B = I. */
static void swap_inner(int64_t o, int64_t a, int64_t b, size_t es, const unsigned char *src,
                       unsigned char *dst)
{
#pragma omp parallel for schedule(static)
    for (int64_t oi = 0; oi < o; oi++) {
        const unsigned char *s = src + (size_t)(oi * a * b) * es;
        unsigned char *t = dst + (size_t)(oi * a * b) * es;
        /* fp32 in aligned buffers is the common case: plain loads and stores instead of a memcpy
         * call per element (safetensors data may be unaligned, hence the test). */
        if (es == 4 && ((uintptr_t)s | (uintptr_t)t) % 4 == 0) {
            const uint32_t *s4 = (const uint32_t *)(const void *)s;
            uint32_t *t4 = (uint32_t *)(void *)t;
            for (int64_t bi = 0; bi < b; bi++)
                for (int64_t ai = 0; ai < a; ai++)
                    t4[bi * a + ai] = s4[ai * b + bi];
        } else {
            for (int64_t bi = 0; bi < b; bi++)
                for (int64_t ai = 0; ai < a; ai++)
                    memcpy(t + (size_t)(bi * a + ai) * es, s + (size_t)(ai * b + bi) * es, es);
        }
    }
}

void sd_weight_from_torch(int ndim, const int64_t *torch_shape, size_t elem_size,
                          const void *src, void *dst, int64_t *our_shape)
{
    check_weight_shape(ndim, torch_shape, elem_size);
    int64_t numel = shape_numel(ndim, torch_shape);
    SD_CHECK(numel == 0 || (src != NULL && dst != NULL), "NULL weight data");
    if (ndim == 4) {
        swap_inner(torch_shape[0], torch_shape[1], torch_shape[2] * torch_shape[3], elem_size,
                   src, dst);
        if (our_shape) {
            our_shape[0] = torch_shape[0];
            our_shape[1] = torch_shape[2];
            our_shape[2] = torch_shape[3];
            our_shape[3] = torch_shape[1];
        }
        return;
    }
    if (numel > 0)
        memcpy(dst, src, (size_t)numel * elem_size);
    if (our_shape)
        for (int i = 0; i < ndim; i++)
            our_shape[i] = torch_shape[i];
}

void sd_weight_to_torch(int ndim, const int64_t *torch_shape, size_t elem_size, const void *src,
                        void *dst)
{
    check_weight_shape(ndim, torch_shape, elem_size);
    int64_t numel = shape_numel(ndim, torch_shape);
    SD_CHECK(numel == 0 || (src != NULL && dst != NULL), "NULL weight data");
    if (ndim == 4) {
        swap_inner(torch_shape[0], torch_shape[2] * torch_shape[3], torch_shape[1], elem_size,
                   src, dst);
        return;
    }
    if (numel > 0)
        memcpy(dst, src, (size_t)numel * elem_size);
}

#if !defined(SD_HAVE_CUDA)
int sd_backend_cuda_create(int device, sd_dtype dtype, sd_backend **out, sd_err *err)
{
    (void)device;
    (void)dtype;
    *out = NULL;
    return sd_err_set(err, "this build has no CUDA backend: reconfigure with ./configure --with-cuda");
}

void sd_backend_cuda_destroy(sd_backend *be)
{
    (void)be;
}

void *sd_backend_cuda_stream(const sd_backend *be)
{
    (void)be;
    return NULL;
}

void sd_backend_cuda_set_wait_hook(const sd_backend *be, sd_wait_fn fn, void *user)
{
    (void)be;
    (void)fn;
    (void)user;
}

void sd_backend_cuda_wait_stream(const sd_backend *be, void *stream)
{
    (void)be;
    (void)stream;
}

void sd_backend_cuda_after_op(const sd_backend *be, void *stream)
{
    (void)be;
    (void)stream;
}

int sd_backend_cuda_conv_graph_plans(const sd_backend *be, const sd_conv2d_desc *d)
{
    (void)be;
    (void)d;
    return 0;
}

int64_t sd_backend_cuda_conv_graph_runs(const sd_backend *be)
{
    (void)be;
    return 0;
}

int sd_cuda_conv_graph_check(const sd_conv2d_desc *d, sd_dtype dtype, int with_z, char *why,
                             size_t nwhy)
{
    (void)d;
    (void)dtype;
    (void)with_z;
    snprintf(why, nwhy, "this build has no CUDA backend");
    return 1;
}

int sd_cuda_conv_graph_engines(const sd_conv2d_desc *d, sd_dtype dtype, int with_z,
                               const char *device_json, size_t ws_cap, int *usable, int *listed,
                               char *why, size_t nwhy)
{
    (void)d;
    (void)dtype;
    (void)with_z;
    (void)device_json;
    (void)ws_cap;
    *usable = *listed = 0;
    snprintf(why, nwhy, "this build has no CUDA backend");
    return 1;
}
#endif
