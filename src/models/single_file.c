/* Diffusers names -> the original (CompVis / LDM) names of a Stable Diffusion checkpoint, and
 * the writer of one such file from a snapshot (doc/export.md "One file").
 *
 * The U-Net's LDM layout numbers its blocks flatly: input_blocks.0 is conv_in, then for level b
 * and layer l input_blocks.(1 + b (L + 1) + l) holds resnet (.0) and attention (.1), and
 * input_blocks.(1 + b (L + 1) + L).0.op the level's downsampler (L = layers_per_block);
 * output_blocks.(b (L + 1) + l) likewise for the up path, whose upsampler sits after the
 * attention (.2) or, in a level without attention, after the resnet (.1). The VAE's decoder
 * counts its levels the other way (decoder.up.(n - 1 - i) is diffusers' up_blocks.i). These are
 * the inverse of diffusers' convert_ldm_unet_checkpoint / convert_ldm_vae_checkpoint /
 * convert_open_clip_checkpoint; tests/reference/make_single_file_goldens.py runs those on this
 * writer's output and checks every tensor. */
#include "sdtrain/single_file.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/ops.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/tensor.h"
#include "sdtrain/weights.h"

/* ---- name parsing ------------------------------------------------------------------------- */

/* Consumes `pre` at *p. */
static int take(const char **p, const char *pre)
{
    size_t n = strlen(pre);
    if (strncmp(*p, pre, n) != 0)
        return 0;
    *p += n;
    return 1;
}

/* Consumes "<digits>." at *p into *v. */
static int take_index(const char **p, int *v)
{
    const char *s = *p;
    long x = 0;
    if (*s < '0' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9' && x < 100000)
        x = x * 10 + (*s++ - '0');
    if (*s != '.')
        return 0;
    *v = (int)x;
    *p = s + 1;
    return 1;
}

/* snprintf that reports truncation as failure. */
static int put(char *out, size_t size, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int put(char *out, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, size, fmt, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < size ? 0 : -1;
}

/* A resnet's leaf (norm1.weight, ...) in the U-Net's LDM spelling. */
static const char *unet_resnet_leaf(const char *leaf, const char **rest)
{
    static const char *const map[][2] = {
        {"norm1.", "in_layers.0."},    {"conv1.", "in_layers.2."},
        {"time_emb_proj.", "emb_layers.1."}, {"norm2.", "out_layers.0."},
        {"conv2.", "out_layers.3."},   {"conv_shortcut.", "skip_connection."},
    };
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        const char *p = leaf;
        if (take(&p, map[k][0])) {
            *rest = p;
            return map[k][1];
        }
    }
    return NULL;
}

int sd_ldm_unet_key(const sd_unet_config *c, const char *key, char *out, size_t size)
{
    const int L = c->layers_per_block;
    const char *p = key, *rest, *leaf;
    int b, l;
    if (take(&p, "time_embedding.linear_1."))
        return put(out, size, "time_embed.0.%s", p);
    if (take(&p, "time_embedding.linear_2."))
        return put(out, size, "time_embed.2.%s", p);
    if (take(&p, "conv_in."))
        return put(out, size, "input_blocks.0.0.%s", p);
    if (take(&p, "conv_norm_out."))
        return put(out, size, "out.0.%s", p);
    if (take(&p, "conv_out."))
        return put(out, size, "out.2.%s", p);
    if (take(&p, "down_blocks.")) {
        if (!take_index(&p, &b) || b >= c->n_levels)
            return -1;
        if (take(&p, "resnets.") && take_index(&p, &l) && l < L &&
            (leaf = unet_resnet_leaf(p, &rest)) != NULL)
            return put(out, size, "input_blocks.%d.0.%s%s", 1 + b * (L + 1) + l, leaf, rest);
        if (take(&p, "attentions.") && take_index(&p, &l) && l < L && c->down_cross[b])
            return put(out, size, "input_blocks.%d.1.%s", 1 + b * (L + 1) + l, p);
        if (take(&p, "downsamplers.0.conv.") && b + 1 < c->n_levels)
            return put(out, size, "input_blocks.%d.0.op.%s", 1 + b * (L + 1) + L, p);
        return -1;
    }
    if (take(&p, "mid_block.")) {
        if (take(&p, "resnets.") && take_index(&p, &l) && l < 2 &&
            (leaf = unet_resnet_leaf(p, &rest)) != NULL)
            return put(out, size, "middle_block.%d.%s%s", l == 0 ? 0 : 2, leaf, rest);
        if (take(&p, "attentions.0."))
            return put(out, size, "middle_block.1.%s", p);
        return -1;
    }
    if (take(&p, "up_blocks.")) {
        if (!take_index(&p, &b) || b >= c->n_levels)
            return -1;
        if (take(&p, "resnets.") && take_index(&p, &l) && l <= L &&
            (leaf = unet_resnet_leaf(p, &rest)) != NULL)
            return put(out, size, "output_blocks.%d.0.%s%s", b * (L + 1) + l, leaf, rest);
        if (take(&p, "attentions.") && take_index(&p, &l) && l <= L && c->up_cross[b])
            return put(out, size, "output_blocks.%d.1.%s", b * (L + 1) + l, p);
        if (take(&p, "upsamplers.0.conv.") && b + 1 < c->n_levels)
            return put(out, size, "output_blocks.%d.%d.conv.%s", b * (L + 1) + L,
                       c->up_cross[b] ? 2 : 1, p);
        return -1;
    }
    return -1;
}

/* A VAE resnet's leaf: the same names but conv_shortcut, which LDM calls nin_shortcut. */
static int vae_resnet(char *out, size_t size, const char *head, const char *leaf)
{
    const char *p = leaf;
    if (take(&p, "conv_shortcut."))
        return put(out, size, "%snin_shortcut.%s", head, p);
    if (take(&p, "norm1.") || take(&p, "conv1.") || take(&p, "norm2.") || take(&p, "conv2."))
        return put(out, size, "%s%s", head, leaf);
    return -1;
}

int sd_ldm_vae_key(const sd_vae_config *c, const char *key, char *out, size_t size, int *conv_1x1)
{
    const char *p = key;
    char head[64];
    int i, j;
    *conv_1x1 = 0;
    if (take(&p, "quant_conv.") || take(&p, "post_quant_conv."))
        return put(out, size, "%s", key);
    const int enc = take(&p, "encoder."), dec = !enc && take(&p, "decoder.");
    if (!enc && !dec)
        return -1;
    const char *side = enc ? "encoder" : "decoder";
    if (take(&p, "conv_in.") || take(&p, "conv_out."))
        return put(out, size, "%s", key);
    if (take(&p, "conv_norm_out."))
        return put(out, size, "%s.norm_out.%s", side, p);
    if (take(&p, "mid_block.")) {
        if (take(&p, "resnets.") && take_index(&p, &j) && j < 2) {
            snprintf(head, sizeof head, "%s.mid.block_%d.", side, j + 1);
            return vae_resnet(out, size, head, p);
        }
        if (!take(&p, "attentions.0.") || !c->mid_block_add_attention)
            return -1;
        static const char *const map[][2] = {
            {"group_norm.", "norm."}, {"to_q.", "q."}, {"to_k.", "k."},
            {"to_v.", "v."},          {"to_out.0.", "proj_out."},
        };
        for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
            if (take(&p, map[k][0])) {
                *conv_1x1 = k > 0 && !strcmp(p, "weight");
                return put(out, size, "%s.mid.attn_1.%s%s", side, map[k][1], p);
            }
        return -1;
    }
    if (take(&p, enc ? "down_blocks." : "up_blocks.")) {
        if (!take_index(&p, &i) || i >= c->n_levels)
            return -1;
        const int level = enc ? i : c->n_levels - 1 - i;
        if (take(&p, "resnets.") && take_index(&p, &j)) {
            snprintf(head, sizeof head, "%s.%s.%d.block.%d.", side, enc ? "down" : "up", level, j);
            return vae_resnet(out, size, head, p);
        }
        if (enc && take(&p, "downsamplers.0.conv."))
            return put(out, size, "encoder.down.%d.downsample.conv.%s", level, p);
        if (dec && take(&p, "upsamplers.0.conv."))
            return put(out, size, "decoder.up.%d.upsample.conv.%s", level, p);
        return -1;
    }
    return -1;
}

int sd_ldm_clip_key(const sd_clip_config *c, const char *key, char *out, size_t size, int *part)
{
    const char *p = key;
    int l;
    *part = -1;
    if (c->quick_gelu) /* OpenAI CLIP (SD 1): the transformers names under one prefix */
        return put(out, size, SD_LDM_CLIP_PREFIX "%s", key);
    if (!strcmp(key, "text_model.embeddings.token_embedding.weight"))
        return put(out, size, SD_LDM_OPENCLIP_PREFIX "token_embedding.weight");
    if (!strcmp(key, "text_model.embeddings.position_embedding.weight"))
        return put(out, size, SD_LDM_OPENCLIP_PREFIX "positional_embedding");
    if (take(&p, "text_model.final_layer_norm."))
        return put(out, size, SD_LDM_OPENCLIP_PREFIX "ln_final.%s", p);
    if (!take(&p, "text_model.encoder.layers.") || !take_index(&p, &l) ||
        l >= c->num_hidden_layers)
        return -1;
    static const char *const map[][2] = {
        {"layer_norm1.", "ln_1."},          {"layer_norm2.", "ln_2."},
        {"self_attn.out_proj.", "attn.out_proj."}, {"mlp.fc1.", "mlp.c_fc."},
        {"mlp.fc2.", "mlp.c_proj."},
    };
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++)
        if (take(&p, map[k][0]))
            return put(out, size, SD_LDM_OPENCLIP_PREFIX "transformer.resblocks.%d.%s%s", l,
                       map[k][1], p);
    static const char *const qkv[3] = {"self_attn.q_proj.", "self_attn.k_proj.",
                                       "self_attn.v_proj."};
    for (int k = 0; k < 3; k++)
        if (take(&p, qkv[k]) && (!strcmp(p, "weight") || !strcmp(p, "bias"))) {
            *part = k;
            return put(out, size, SD_LDM_OPENCLIP_PREFIX "transformer.resblocks.%d.attn.in_proj_%s",
                       l, p);
        }
    return -1;
}

/* ---- the writer ----------------------------------------------------------------------------- */

/* A component's tensor under its full original name (prefix included); *conv and *part as
 * sd_ldm_vae_key and sd_ldm_clip_key set them (0 and -1 for the others). */
static int ldm_name(sd_component comp, const void *config, const char *key, char *name,
                    size_t size, int *conv, int *part)
{
    const char *prefix = comp == SD_COMPONENT_UNET ? SD_LDM_UNET_PREFIX
                         : comp == SD_COMPONENT_VAE ? SD_LDM_VAE_PREFIX
                                                    : "";
    const size_t n = strlen(prefix);
    *conv = 0;
    *part = -1;
    if (n >= size)
        return -1;
    memcpy(name, prefix, n + 1);
    if (comp == SD_COMPONENT_UNET)
        return sd_ldm_unet_key(config, key, name + n, size - n);
    if (comp == SD_COMPONENT_VAE)
        return sd_ldm_vae_key(config, key, name + n, size - n, conv);
    return sd_ldm_clip_key(config, key, name, size, part);
}

/* Every buffer the safetensors writer borrows until the file is written. */
typedef struct held {
    void **ptr;
    size_t n, cap;
} held;

static void *hold(held *h, size_t bytes)
{
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        h->ptr = sd_xrealloc(h->ptr, h->cap * sizeof *h->ptr);
    }
    return h->ptr[h->n++] = sd_xcalloc(bytes ? bytes : 1, 1);
}

/* One tensor (fp32, PyTorch layout) as `dtype` in a held buffer. */
static void *convert(held *h, const float *src, size_t n, sd_st_dtype dtype)
{
    if (dtype == SD_ST_F32) {
        float *d = hold(h, n * sizeof *d);
        memcpy(d, src, n * sizeof *d);
        return d;
    }
    uint16_t *d = hold(h, n * sizeof *d);
    if (dtype == SD_ST_F16)
        sd_f32_to_f16_array(src, d, n);
    else
        sd_f32_to_bf16_array(src, d, n);
    return d;
}

/* The fused in_proj tensors of one text-encoder layer being assembled: [3 d, d] and [3 d]. */
typedef struct fused {
    char name[SD_PARAM_NAME_MAX + 64];
    float *data;
    int ndim;
    int64_t shape[2];
    int have; /* bit k: third k copied */
} fused;

static int add_tensor(sd_st_writer *wr, held *h, const char *name, sd_st_dtype dtype, int ndim,
                      const int64_t *shape, const float *torch, size_t numel, sd_err *err)
{
    void *d = convert(h, torch, numel, dtype);
    return sd_st_writer_add(wr, name, dtype, ndim, shape, d, numel * (sd_st_dtype_bits(dtype) / 8),
                            err);
}

/* Adds one component's tensors (w: loaded, our layouts) under LDM names. */
static int add_component(sd_st_writer *wr, held *h, sd_component comp, const void *config,
                         const sd_weights *w, sd_st_dtype dtype, const char *dir, size_t *count,
                         size_t *numel, sd_err *err)
{
    const sd_param_table *t = &w->table;
    size_t most = 1; /* one tensor in PyTorch's layout at a time */
    for (size_t i = 0; i < t->n; i++)
        most = t->params[i].numel > most ? t->params[i].numel : most;
    float *torch = sd_xmalloc(most * sizeof *torch);
    fused *fz = NULL;
    size_t nf = 0;
    int rc = 0;
    for (size_t i = 0; i < t->n && !rc; i++) {
        const sd_param *p = &t->params[i];
        char name[SD_PARAM_NAME_MAX + 64];
        int64_t shape[4];
        int ndim = p->ndim, part = -1, conv = 0, bad;
        memcpy(shape, p->shape, sizeof shape);
        sd_weight_to_torch(p->ndim, p->shape, sizeof(float), w->data + p->offset, torch);
        bad = ldm_name(comp, config, p->name, name, sizeof name, &conv, &part);
        if (bad) {
            rc = sd_err_set(err, "%s: tensor '%s' has no name in the original checkpoint layout",
                            dir, p->name);
            break;
        }
        if (conv) { /* [C, C] -> [C, C, 1, 1] */
            SD_CHECK(ndim == 2, "%s: a 1x1 projection of rank %d", p->name, ndim);
            shape[2] = shape[3] = 1;
            ndim = 4;
        }
        if (part < 0) {
            rc = add_tensor(wr, h, name, dtype, ndim, shape, torch, p->numel, err);
            (*count)++;
            *numel += p->numel;
            continue;
        }
        /* one third of a fused in_proj: q, k, v in this order along the rows */
        fused *f = NULL;
        for (size_t k = 0; k < nf; k++)
            if (!strcmp(fz[k].name, name))
                f = &fz[k];
        if (!f) {
            fz = sd_xrealloc(fz, (nf + 1) * sizeof *fz);
            f = &fz[nf++];
            memset(f, 0, sizeof *f);
            snprintf(f->name, sizeof f->name, "%s", name);
            f->ndim = ndim;
            f->shape[0] = 3 * shape[0];
            f->shape[1] = ndim == 2 ? shape[1] : 0;
            f->data = sd_xmalloc(3 * p->numel * sizeof(float));
        }
        SD_CHECK(f->ndim == ndim && f->shape[0] == 3 * shape[0] &&
                     (ndim == 1 || f->shape[1] == shape[1]) && !(f->have & (1 << part)),
                 "%s: the q, k and v projections differ in shape", name);
        memcpy(f->data + (size_t)part * p->numel, torch, p->numel * sizeof(float));
        f->have |= 1 << part;
        if (f->have == 7) {
            rc = add_tensor(wr, h, f->name, dtype, f->ndim, f->shape, f->data, 3 * p->numel, err);
            (*count)++;
            *numel += 3 * p->numel;
            free(f->data);
            f->data = NULL;
        }
    }
    for (size_t k = 0; k < nf; k++) {
        if (!rc && fz[k].have != 7)
            rc = sd_err_set(err, "%s: %s lacks one of q, k, v", dir, fz[k].name);
        free(fz[k].data);
    }
    free(fz);
    free(torch);
    return rc;
}

int sd_single_file_write(const char *snapshot, const char *path, sd_st_dtype dtype,
                         const char *note, sd_single_file_info *info, sd_err *err)
{
    sd_snapshot snap;
    sd_unet_config uc;
    sd_vae_config vc;
    sd_clip_config cc;
    held h = {0};
    int rc = 0;
    SD_CHECK(dtype == SD_ST_F32 || dtype == SD_ST_F16 || dtype == SD_ST_BF16,
             "single file: dtype %s", sd_st_dtype_name(dtype));
    memset(info, 0, sizeof *info);
    if (sd_snapshot_open(&snap, snapshot, err))
        return -1;
    if (snap.is_component) {
        sd_snapshot_close(&snap);
        return sd_err_set(err, "%s is one component's folder: give the snapshot folder (with "
                               "unet/, vae/ and text_encoder/)", snapshot);
    }
    sd_st_writer *wr = sd_st_writer_new();
    for (int comp = 0; comp < SD_COMPONENT_COUNT && !rc; comp++) {
        sd_weights w;
        char dir[4096];
        const void *config = comp == SD_COMPONENT_UNET ? (const void *)&uc
                             : comp == SD_COMPONENT_VAE ? (const void *)&vc
                                                        : (const void *)&cc;
        if (sd_snapshot_component_dir(&snap, (sd_component)comp, dir, sizeof dir, err)) {
            rc = -1;
            break;
        }
        /* one model's fp32 weights at a time; what the file keeps is `dtype` copies */
        rc = comp == SD_COMPONENT_UNET ? sd_snapshot_load_unet(&snap, NULL, &uc, &w, err)
             : comp == SD_COMPONENT_VAE
                 ? sd_snapshot_load_vae(&snap, NULL, &vc, &w, err)
                 : sd_snapshot_load_text_encoder(&snap, NULL, &cc, NULL, &w, err);
        if (rc)
            break;
        rc = add_component(wr, &h, (sd_component)comp, config, &w, dtype, dir,
                           &info->tensors[comp], &info->numel[comp], err);
        sd_weights_free(&w);
    }
    info->open_clip = !rc && !cc.quick_gelu;
    if (!rc)
        rc = sd_st_writer_set_metadata(wr, "format", "pt", err);
    if (!rc && note)
        rc = sd_st_writer_set_metadata(wr, "sdtrain", note, err);
    if (!rc && sd_st_writer_write(wr, path, err))
        rc = -2;
    sd_st_writer_free(wr);
    for (size_t k = 0; k < h.n; k++)
        free(h.ptr[k]);
    free(h.ptr);
    sd_snapshot_close(&snap);
    return rc;
}

/* ---- the reader ----------------------------------------------------------------------------- */

/* The name of an LDM U-Net tensor in the file's EMA copy: "model_ema." and the name after
 * "model." without its dots (how the original training code names its EMA buffers). */
static void ema_name(const char *ldm, char *out, size_t size)
{
    size_t n = (size_t)snprintf(out, size, "model_ema.");
    for (const char *p = ldm + strlen("model."); *p && n + 1 < size; p++)
        if (*p != '.')
            out[n++] = *p;
    out[n] = '\0';
}

/* Problems met while reading, for one message. */
typedef struct problems {
    size_t missing, shape;
    char text[700];
} problems;

static void note_problem(problems *pr, size_t *count, const char *fmt, const char *a,
                         const char *b)
{
    size_t len = strlen(pr->text);
    if ((*count)++ < 6 && len + 200 < sizeof pr->text)
        snprintf(pr->text + len, sizeof pr->text - len, fmt, len ? "; " : "", a, b);
}

/* One component's tensors from the file into w (its table made from `config`); marks the
 * file's tensors it used in `used`. */
static void read_component(const sd_st_file *f, sd_component comp, const void *config, int ema,
                           sd_weights *w, unsigned char *used, problems *pr)
{
    const sd_param_table *t = &w->table;
    float *tmp = NULL;
    size_t tmp_cap = 0;
    for (size_t i = 0; i < t->n; i++) {
        const sd_param *p = &t->params[i];
        char name[SD_PARAM_NAME_MAX + 64], look[SD_PARAM_NAME_MAX + 64];
        int part = -1, conv = 0, bad;
        bad = ldm_name(comp, config, p->name, name, sizeof name, &conv, &part);
        SD_CHECK(!bad, "single file: the model's tensor %s has no original name", p->name);
        if (comp == SD_COMPONENT_UNET && ema)
            ema_name(name, look, sizeof look);
        else
            snprintf(look, sizeof look, "%s", name);
        const sd_st_tensor *st = sd_st_find(f, look);
        if (!st) {
            note_problem(pr, &pr->missing, "%smissing %s (for %s)", look, p->name);
            continue;
        }
        /* the shape the file must have: the model's, a 1x1 convolution's, or a fused third */
        int64_t want[4] = {0, 0, 0, 0};
        int ndim = p->ndim;
        memcpy(want, p->shape, sizeof want);
        if (conv && st->ndim == 4) {
            want[2] = want[3] = 1;
            ndim = 4;
        }
        if (part >= 0)
            want[0] *= 3;
        int same = st->ndim == ndim;
        for (int d = 0; same && d < ndim; d++)
            same = st->shape[d] == want[d];
        if (!same) {
            char s[160];
            size_t len = 0;
            for (int d = 0; d < st->ndim && len < sizeof s - 24; d++)
                len += (size_t)snprintf(s + len, sizeof s - len, "%s%lld", d ? "x" : "",
                                        (long long)st->shape[d]);
            if (!st->ndim)
                snprintf(s, sizeof s, "scalar");
            note_problem(pr, &pr->shape, "%s%s has shape %s", look, s);
            continue;
        }
        used[st - f->tensors] = 1;
        if ((size_t)st->numel > tmp_cap) {
            tmp_cap = (size_t)st->numel;
            tmp = sd_xrealloc(tmp, tmp_cap * sizeof *tmp);
        }
        sd_err e;
        if (sd_st_tensor_read_f32(st, tmp, (size_t)st->numel, &e)) {
            note_problem(pr, &pr->shape, "%s%s: %s", look, e.msg);
            continue;
        }
        const float *src = tmp + (part > 0 ? (size_t)part * p->numel : 0);
        int64_t ours[4];
        sd_weight_from_torch(p->ndim, p->shape, sizeof(float), src, w->data + p->offset, ours);
    }
    free(tmp);
}

/* Whether an unused tensor of the file is one the SD family never uses (the original OpenCLIP's
 * layers past the ones SD 2 runs, its projection and logit scale; the old position_ids; the
 * VAE training's loss modules, which some LDM checkpoints carry as first_stage_model.loss.*). */
static int ignorable(const char *name, const sd_clip_config *cc)
{
    const char *p = name;
    int l;
    if (!strncmp(name, SD_LDM_VAE_PREFIX "loss.", strlen(SD_LDM_VAE_PREFIX "loss.")))
        return 1;
    if (take(&p, SD_LDM_OPENCLIP_PREFIX)) {
        if (!strcmp(p, "text_projection") || !strcmp(p, "logit_scale") || !strcmp(p, "attn_mask"))
            return 1;
        return take(&p, "transformer.resblocks.") && take_index(&p, &l) &&
               l >= cc->num_hidden_layers;
    }
    return strstr(name, "position_ids") != NULL;
}

int sd_single_file_read(const char *file, const char *config_snapshot, int ema,
                        sd_single_file_models *m, char *notes, size_t notes_size, sd_err *err)
{
    sd_snapshot snap;
    sd_st_file f;
    problems pr;
    int rc = 0;
    memset(m, 0, sizeof *m);
    memset(&pr, 0, sizeof pr);
    if (notes_size)
        notes[0] = '\0';
    if (sd_snapshot_open(&snap, config_snapshot, err))
        return -1;
    if (snap.is_component) {
        sd_snapshot_close(&snap);
        return sd_err_set(err, "%s is one component's folder: give the snapshot folder whose "
                               "unet/, vae/ and text_encoder/ config.json describe the file",
                          config_snapshot);
    }
    void *const configs[SD_COMPONENT_COUNT] = {&m->unet, &m->vae, &m->clip};
    for (int c = 0; c < SD_COMPONENT_COUNT && !rc; c++) {
        sd_param_table table;
        memset(&table, 0, sizeof table);
        rc = sd_snapshot_component_table(&snap, (sd_component)c, configs[c], &table, err);
        if (!rc) {
            sd_weights_init(&m->w[c], &table);
            m->have |= 1 << c;
        }
    }
    sd_snapshot_close(&snap);
    if (rc) {
        sd_single_file_models_free(m);
        return -1;
    }
    if (sd_st_open(file, &f, err)) {
        sd_single_file_models_free(m);
        return -1;
    }
    unsigned char *used = sd_xcalloc(f.n_tensors ? f.n_tensors : 1, 1);
    if (ema) {
        size_t n_ema = 0;
        for (size_t i = 0; i < f.n_tensors; i++)
            n_ema += !strncmp(f.tensors[i].name, "model_ema.", 10);
        if (!n_ema) {
            rc = sd_err_set(err, "%s: the EMA weights were asked for, but the file has no "
                                 "model_ema.* tensors", file);
            goto out;
        }
    }
    read_component(&f, SD_COMPONENT_UNET, &m->unet, ema, &m->w[0], used, &pr);
    read_component(&f, SD_COMPONENT_VAE, &m->vae, 0, &m->w[1], used, &pr);
    read_component(&f, SD_COMPONENT_TEXT_ENCODER, &m->clip, 0, &m->w[2], used, &pr);
    /* the file's tensors of the three models that nothing used: a configuration that does not
     * describe the file (an error), or parts SD never uses (noted) */
    size_t unused = 0, skipped = 0, other = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const char *n = f.tensors[i].name;
        if (used[i])
            continue;
        int ours = !strncmp(n, SD_LDM_UNET_PREFIX, strlen(SD_LDM_UNET_PREFIX)) ||
                   !strncmp(n, SD_LDM_VAE_PREFIX, strlen(SD_LDM_VAE_PREFIX)) ||
                   !strncmp(n, "cond_stage_model.", 17);
        if (!ours || (ema && !strncmp(n, SD_LDM_UNET_PREFIX, strlen(SD_LDM_UNET_PREFIX)))) {
            other++; /* EMA copies, the schedule's buffers, ... */
        } else if (ignorable(n, &m->clip)) {
            skipped++;
        } else {
            note_problem(&pr, &unused, "%s%s is not part of the model %s describes", n,
                         config_snapshot);
        }
    }
    if (pr.missing || pr.shape || unused) {
        rc = sd_err_set(err, "%s: does not fit the configuration of %s (%zu missing, %zu with "
                             "another shape, %zu not used): %s%s", file, config_snapshot,
                        pr.missing, pr.shape, unused, pr.text,
                        pr.missing + pr.shape + unused > 6 ? "; ..." : "");
        goto out;
    }
    if (notes_size)
        snprintf(notes, notes_size, "%zu tensors of the file read, %zu the SD models never use "
                                    "(left out), %zu outside the models%s",
                 f.n_tensors - skipped - other, skipped, other,
                 ema ? " (the U-Net from its EMA copy)" : "");
out:
    free(used);
    sd_st_close(&f);
    if (rc)
        sd_single_file_models_free(m);
    return rc;
}

void sd_single_file_models_free(sd_single_file_models *m)
{
    for (int c = 0; c < SD_COMPONENT_COUNT; c++)
        if (m->have & (1 << c))
            sd_weights_free(&m->w[c]);
    m->have = 0;
}
