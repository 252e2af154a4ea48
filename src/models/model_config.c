/* Model configurations from diffusers/transformers config.json files, the namelist, or the
 * SD2-base defaults; anything sdtrain does not implement is refused by name. */
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/json_file.h"
#include "sdtrain/models.h"
#include "sdtrain/unet.h"

/* ---- JSON access with errors that name the file and key (json_file.h) ------------------- */


/* An integer list (or a single integer, broadcast to n entries when n > 0). Returns count. */
static int jint_list(sd_jconf *j, const char *key, int *out, int cap, int broadcast_n)
{
    json_object *v = sd_jconf_get(j, key);
    if (!v || json_object_is_type(v, json_type_null))
        return -1;
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);
        if (n == 0 || n > (size_t)cap) {
            sd_jconf_fail(j, "%s: '%s' must list 1 to 8 values%s", key, NULL);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            if (sd_jconf_int_value(j, key, json_object_array_get_idx(v, i), &out[i]))
                return -1;
        return (int)n;
    }
    if (broadcast_n > 0) {
        int x;
        if (sd_jconf_int_value(j, key, v, &x))
            return -1;
        for (int i = 0; i < broadcast_n; i++)
            out[i] = x;
        return broadcast_n;
    }
    sd_jconf_fail(j, "%s: '%s' must be a list%s", key, NULL);
    return -1;
}

/* A list of block type names; each must be one of the two accepted spellings. */
static int jblock_types(sd_jconf *j, const char *key, const char *plain, const char *cross, int *is_cross,
                        int n_expected)
{
    json_object *v = sd_jconf_get(j, key);
    size_t n;
    if (!v)
        return sd_jconf_fail(j, "%s: missing '%s'%s", key, NULL);
    if (!json_object_is_type(v, json_type_array))
        return sd_jconf_fail(j, "%s: '%s' must be a list%s", key, NULL);
    n = json_object_array_length(v);
    if ((int)n != n_expected)
        return sd_jconf_fail(j, "%s: '%s' must have one entry per block_out_channels entry%s", key, NULL);
    for (size_t i = 0; i < n; i++) {
        const char *s = json_object_get_string(json_object_array_get_idx(v, i));
        if (s && !strcmp(s, plain))
            is_cross[i] = 0;
        else if (s && cross && !strcmp(s, cross))
            is_cross[i] = 1;
        else {
            char detail[256];
            snprintf(detail, sizeof detail, " (entry '%.60s'; sdtrain implements %s%s%s)", s ? s : "?",
                     plain, cross ? " and " : "", cross ? cross : "");
            return sd_jconf_fail(j, "%s: unsupported block type in '%s'%s", key, detail);
        }
    }
    return 0;
}

/* A size read from the file must lie in [lo, hi]: zero would divide by zero or make empty
 * tensors, and absurd sizes would overflow the parameter arithmetic or ask for terabytes.
 * The bounds are those of the namelist's shape keys, or wider. */
static void jrange(sd_jconf *j, const char *key, int v, int lo, int hi)
{
    if (!j->failed && (v < lo || v > hi)) {
        char detail[96];
        snprintf(detail, sizeof detail, " = %d is outside %d to %d", v, lo, hi);
        sd_jconf_fail(j, "%s: '%s'%s", key, detail);
    }
}

/* A normalization epsilon: finite and >= 0 (and below 1: a larger one is no epsilon). */
static void jeps(sd_jconf *j, const char *key, double v)
{
    if (!j->failed && !(v >= 0.0 && v < 1.0)) {
        char detail[96];
        snprintf(detail, sizeof detail, " = %g is outside [0, 1)", v);
        sd_jconf_fail(j, "%s: '%s'%s", key, detail);
    }
}

static void jrange_list(sd_jconf *j, const char *key, const int *v, int n, int lo, int hi)
{
    for (int i = 0; i < n && !j->failed; i++)
        if (v[i] < lo || v[i] > hi) {
            char detail[96];
            snprintf(detail, sizeof detail, "[%d] = %d is outside %d to %d", i, v[i], lo, hi);
            sd_jconf_fail(j, "%s: '%s'%s", key, detail);
        }
}

/* ---- defaults --------------------------------------------------------------------------- */

void sd_unet_config_sd2_base(sd_unet_config *c)
{
    static const int boc[4] = {320, 640, 1280, 1280}, heads[4] = {5, 10, 20, 20};
    memset(c, 0, sizeof *c);
    c->in_channels = c->out_channels = 4;
    c->n_levels = 4;
    for (int i = 0; i < 4; i++) {
        c->block_out_channels[i] = boc[i];
        c->heads[i] = heads[i];
        c->transformer_layers[i] = 1;
        c->down_cross[i] = i < 3;
        c->up_cross[i] = i > 0;
    }
    c->layers_per_block = 2;
    c->cross_attention_dim = 1024;
    c->norm_num_groups = 32;
    c->norm_eps = 1e-5;
    c->flip_sin_to_cos = 1;
    c->freq_shift = 0;
    c->use_linear_projection = 1;
    c->downsample_padding = 1;
    c->conv_in_kernel = c->conv_out_kernel = 3;
    c->sample_size = 64;
}

void sd_vae_config_sd2_base(sd_vae_config *c)
{
    static const int boc[4] = {128, 256, 512, 512};
    memset(c, 0, sizeof *c);
    c->in_channels = c->out_channels = 3;
    c->n_levels = 4;
    memcpy(c->block_out_channels, boc, sizeof boc);
    c->layers_per_block = 2;
    c->latent_channels = 4;
    c->norm_num_groups = 32;
    c->scaling_factor = 0.18215;
    c->use_quant_conv = c->use_post_quant_conv = 1;
    c->mid_block_add_attention = 1;
    c->sample_size = 512;
}

void sd_clip_config_sd2_base(sd_clip_config *c)
{
    memset(c, 0, sizeof *c);
    c->vocab_size = 49408;
    c->hidden_size = 1024;
    c->intermediate_size = 4096;
    c->num_attention_heads = 16;
    c->num_hidden_layers = 23;
    c->max_position_embeddings = 77;
    c->quick_gelu = 0;
    c->layer_norm_eps = 1e-5;
}

/* ---- config.json readers ---------------------------------------------------------------- */

/* Library defaults of UNet2DConditionModel where the file omits a key. */
static void unet_library_defaults(sd_unet_config *c)
{
    static const int boc[4] = {320, 640, 1280, 1280};
    memset(c, 0, sizeof *c);
    c->in_channels = c->out_channels = 4;
    c->n_levels = 4;
    memcpy(c->block_out_channels, boc, sizeof boc);
    for (int i = 0; i < 4; i++) {
        c->heads[i] = 8;
        c->transformer_layers[i] = 1;
    }
    c->layers_per_block = 2;
    c->cross_attention_dim = 1280;
    c->norm_num_groups = 32;
    c->norm_eps = 1e-5;
    c->flip_sin_to_cos = 1;
    c->freq_shift = 0;
    c->use_linear_projection = 0;
    c->downsample_padding = 1;
    c->conv_in_kernel = c->conv_out_kernel = 3;
}

int sd_unet_config_load(const char *path, sd_unet_config *c, sd_err *err)
{
    sd_jconf j;
    int n, idx = 0, nh;
    if (sd_jconf_open(&j, path, err))
        return -1;
    unet_library_defaults(c);
    sd_jconf_int(&j, "in_channels", &c->in_channels);
    sd_jconf_int(&j, "out_channels", &c->out_channels);
    sd_jconf_int(&j, "sample_size", &c->sample_size);
    n = jint_list(&j, "block_out_channels", c->block_out_channels, SD_MODEL_MAX_LEVELS, 0);
    if (n > 0)
        c->n_levels = n;
    sd_jconf_int(&j, "layers_per_block", &c->layers_per_block);
    sd_jconf_int(&j, "cross_attention_dim", &c->cross_attention_dim);
    sd_jconf_int(&j, "norm_num_groups", &c->norm_num_groups);
    sd_jconf_double(&j, "norm_eps", &c->norm_eps);
    sd_jconf_bool(&j, "flip_sin_to_cos", &c->flip_sin_to_cos);
    sd_jconf_double(&j, "freq_shift", &c->freq_shift);
    sd_jconf_bool(&j, "use_linear_projection", &c->use_linear_projection);
    sd_jconf_int(&j, "downsample_padding", &c->downsample_padding);
    sd_jconf_int(&j, "conv_in_kernel", &c->conv_in_kernel);
    sd_jconf_int(&j, "conv_out_kernel", &c->conv_out_kernel);
    sd_jconf_bool(&j, "upcast_attention", &c->upcast_attention);
    /* diffusers passes attention_head_dim on as the head COUNT unless num_attention_heads is
     * given (a naming accident kept for compatibility). */
    nh = jint_list(&j, "num_attention_heads", c->heads, SD_MODEL_MAX_LEVELS, c->n_levels);
    if (nh < 0 && !j.failed)
        nh = jint_list(&j, "attention_head_dim", c->heads, SD_MODEL_MAX_LEVELS, c->n_levels);
    if (nh < 0 && !j.failed)
        for (int i = 0; i < c->n_levels; i++)
            c->heads[i] = 8;
    else if (nh >= 0 && nh != c->n_levels && !j.failed)
        sd_jconf_fail(&j, "%s: '%s' must have one entry per block_out_channels entry%s", "attention_head_dim", NULL);
    n = jint_list(&j, "transformer_layers_per_block", c->transformer_layers, SD_MODEL_MAX_LEVELS, c->n_levels);
    if (n < 0 && !j.failed)
        for (int i = 0; i < c->n_levels; i++)
            c->transformer_layers[i] = 1;
    if (!j.failed)
        jblock_types(&j, "down_block_types", "DownBlock2D", "CrossAttnDownBlock2D", c->down_cross, c->n_levels);
    if (!j.failed)
        jblock_types(&j, "up_block_types", "UpBlock2D", "CrossAttnUpBlock2D", c->up_cross, c->n_levels);
    sd_jconf_choice(&j, "mid_block_type", "UNetMidBlock2DCrossAttn", &idx);
    sd_jconf_choice(&j, "act_fn", "silu|swish", &idx); /* diffusers: the same function */
    sd_jconf_choice(&j, "resnet_time_scale_shift", "default", &idx);
    sd_jconf_choice(&j, "time_embedding_type", "positional", &idx);
    sd_jconf_choice(&j, "attention_type", "default", &idx);
    sd_jconf_absent(&j, "class_embed_type");
    sd_jconf_absent(&j, "num_class_embeds");
    sd_jconf_absent(&j, "addition_embed_type");
    sd_jconf_absent(&j, "encoder_hid_dim");
    sd_jconf_absent(&j, "time_cond_proj_dim");
    sd_jconf_absent(&j, "time_embedding_act_fn");
    sd_jconf_absent(&j, "timestep_post_act");
    sd_jconf_absent(&j, "dual_cross_attention");
    sd_jconf_absent(&j, "only_cross_attention");
    sd_jconf_absent(&j, "center_input_sample");
    sd_jconf_absent(&j, "cross_attention_norm");
    sd_jconf_absent(&j, "resnet_skip_time_act");
    {
        double mid_scale = 1.0, out_scale = 1.0;
        sd_jconf_double(&j, "mid_block_scale_factor", &mid_scale);
        sd_jconf_double(&j, "resnet_out_scale_factor", &out_scale);
        if (mid_scale != 1.0)
            sd_jconf_fail(&j, "%s: '%s' other than 1 is not implemented%s", "mid_block_scale_factor", NULL);
        else if (out_scale != 1.0)
            sd_jconf_fail(&j, "%s: '%s' other than 1 is not implemented%s", "resnet_out_scale_factor", NULL);
    }
    /* null is diffusers' "no mid block", not the default one (sd_jconf_choice reads null as
     * absent) */
    {
        json_object *mb = sd_jconf_get(&j, "mid_block_type");
        if (!j.failed && mb == NULL && json_object_object_get_ex(j.root, "mid_block_type", NULL))
            sd_jconf_fail(&j, "%s: '%s' = null (a U-Net without a mid block) is not implemented%s",
                          "mid_block_type", NULL);
    }
    /* the time embedding's width is 4 x block_out_channels[0] here */
    {
        /* 64-bit: block_out_channels is range-checked below, after this */
        const long long want = 4LL * c->block_out_channels[0];
        int ted = INT_MIN; /* absent */
        sd_jconf_int(&j, "time_embedding_dim", &ted);
        if (!j.failed && ted != INT_MIN && (long long)ted != want) {
            char detail[128];
            snprintf(detail, sizeof detail, " = %d (other than 4 x block_out_channels[0] = %lld) "
                     "is not implemented", ted, want);
            sd_jconf_fail(&j, "%s: '%s'%s", "time_embedding_dim", detail);
        }
    }
    jeps(&j, "norm_eps", c->norm_eps);
    jrange(&j, "in_channels", c->in_channels, 1, 1024);
    jrange(&j, "out_channels", c->out_channels, 1, 1024);
    jrange(&j, "norm_num_groups", c->norm_num_groups, 1, 1024);
    jrange_list(&j, "block_out_channels", c->block_out_channels, c->n_levels, 1, 16384);
    /* the U-Net forward's limits (unet.h): refused here, naming the file, before the weights
     * of such a model are allocated */
    jrange(&j, "layers_per_block", c->layers_per_block, 1, SD_UNET_MAX_LAYERS_PER_BLOCK);
    jrange(&j, "block_out_channels[0]", c->block_out_channels[0], 1, SD_UNET_MAX_TIME_PROJ_DIM);
    jrange(&j, "cross_attention_dim", c->cross_attention_dim, 1, 65536);
    jrange_list(&j, "transformer_layers_per_block", c->transformer_layers, c->n_levels, 1, 64);
    jrange(&j, "conv_in_kernel", c->conv_in_kernel, 1, 15);
    jrange(&j, "conv_out_kernel", c->conv_out_kernel, 1, 15);
    jrange(&j, "downsample_padding", c->downsample_padding, 0, 1);
    if (!j.failed) {
        char why[160] = "";
        if (c->n_levels < 1)
            snprintf(why, sizeof why, "block_out_channels is empty");
        for (int i = 0; i < c->n_levels && !why[0]; i++) {
            if (c->block_out_channels[i] <= 0 || c->block_out_channels[i] % c->norm_num_groups)
                snprintf(why, sizeof why, "block_out_channels[%d] = %d is not a positive multiple of "
                         "norm_num_groups = %d", i, c->block_out_channels[i], c->norm_num_groups);
            else if (c->heads[i] <= 0 || c->heads[i] > c->block_out_channels[i])
                snprintf(why, sizeof why, "block_out_channels[%d] = %d cannot hold %d attention heads",
                         i, c->block_out_channels[i], c->heads[i]);
            else if (c->transformer_layers[i] < 1)
                snprintf(why, sizeof why, "transformer_layers_per_block[%d] < 1", i);
        }
        if (!why[0] && (c->conv_in_kernel % 2 == 0 || c->conv_out_kernel % 2 == 0))
            snprintf(why, sizeof why, "conv_in_kernel and conv_out_kernel must be odd");
        if (!why[0] && (c->layers_per_block < 1 || c->in_channels < 1 || c->out_channels < 1 ||
                        c->cross_attention_dim < 1))
            snprintf(why, sizeof why, "layers_per_block, in/out_channels and cross_attention_dim "
                     "must be positive");
        if (why[0])
            sd_jconf_fail(&j, "%s: inconsistent configuration%s%s", ": ", why);
    }
    return sd_jconf_close(&j);
}

int sd_vae_config_load(const char *path, sd_vae_config *c, sd_err *err)
{
    sd_jconf j;
    int n, idx = 0, dummy[SD_MODEL_MAX_LEVELS];
    if (sd_jconf_open(&j, path, err))
        return -1;
    sd_vae_config_sd2_base(c);
    /* library defaults differ from SD2 for block_out_channels (64,) and layers_per_block 1 */
    c->n_levels = 1;
    c->block_out_channels[0] = 64;
    c->layers_per_block = 1;
    c->sample_size = 32;
    sd_jconf_int(&j, "in_channels", &c->in_channels);
    sd_jconf_int(&j, "out_channels", &c->out_channels);
    n = jint_list(&j, "block_out_channels", c->block_out_channels, SD_MODEL_MAX_LEVELS, 0);
    if (n > 0)
        c->n_levels = n;
    sd_jconf_int(&j, "layers_per_block", &c->layers_per_block);
    sd_jconf_int(&j, "latent_channels", &c->latent_channels);
    sd_jconf_int(&j, "norm_num_groups", &c->norm_num_groups);
    sd_jconf_int(&j, "sample_size", &c->sample_size);
    sd_jconf_double(&j, "scaling_factor", &c->scaling_factor);
    sd_jconf_bool(&j, "use_quant_conv", &c->use_quant_conv);
    sd_jconf_bool(&j, "use_post_quant_conv", &c->use_post_quant_conv);
    sd_jconf_bool(&j, "mid_block_add_attention", &c->mid_block_add_attention);
    sd_jconf_choice(&j, "act_fn", "silu|swish", &idx); /* diffusers: the same function */
    sd_jconf_absent(&j, "shift_factor");
    if (!j.failed && !(c->scaling_factor > 0.0 && isfinite(c->scaling_factor))) {
        char detail[96];
        snprintf(detail, sizeof detail, " = %g must be a positive number", c->scaling_factor);
        sd_jconf_fail(&j, "%s: '%s'%s", "scaling_factor", detail);
    }
    sd_jconf_absent(&j, "latents_mean");
    sd_jconf_absent(&j, "latents_std");
    if (!j.failed && sd_jconf_get(&j, "down_block_types"))
        jblock_types(&j, "down_block_types", "DownEncoderBlock2D", NULL, dummy, c->n_levels);
    if (!j.failed && sd_jconf_get(&j, "up_block_types"))
        jblock_types(&j, "up_block_types", "UpDecoderBlock2D", NULL, dummy, c->n_levels);
    jrange(&j, "in_channels", c->in_channels, 1, 1024);
    jrange(&j, "out_channels", c->out_channels, 1, 1024);
    jrange(&j, "latent_channels", c->latent_channels, 1, 1024);
    jrange(&j, "norm_num_groups", c->norm_num_groups, 1, 1024);
    jrange_list(&j, "block_out_channels", c->block_out_channels, c->n_levels, 1, 16384);
    jrange(&j, "layers_per_block", c->layers_per_block, 1, 16);
    for (int i = 0; i < c->n_levels && !j.failed; i++)
        if (c->block_out_channels[i] <= 0 || c->block_out_channels[i] % c->norm_num_groups)
            sd_jconf_fail(&j, "%s: inconsistent configuration: %s%s", "block_out_channels",
                  " (each entry must be a positive multiple of norm_num_groups)");
    return sd_jconf_close(&j);
}

int sd_clip_config_load(const char *path, sd_clip_config *c, sd_err *err)
{
    sd_jconf j;
    int act = 0;
    json_object *arch;
    if (sd_jconf_open(&j, path, err))
        return -1;
    /* transformers' CLIPTextConfig defaults (the OpenAI ViT-B/32 text tower) */
    memset(c, 0, sizeof *c);
    c->vocab_size = 49408;
    c->hidden_size = 512;
    c->intermediate_size = 2048;
    c->num_attention_heads = 8;
    c->num_hidden_layers = 12;
    c->max_position_embeddings = 77;
    c->quick_gelu = 1;
    c->layer_norm_eps = 1e-5;
    arch = sd_jconf_get(&j, "architectures");
    if (arch && json_object_is_type(arch, json_type_array) && json_object_array_length(arch) > 0) {
        const char *a = json_object_get_string(json_object_array_get_idx(arch, 0));
        if (a && strcmp(a, "CLIPTextModel") != 0 && strcmp(a, "CLIPTextModelWithProjection") != 0)
            sd_jconf_fail(&j, "%s: '%s' names an unsupported model%s", "architectures", NULL);
    }
    sd_jconf_int(&j, "vocab_size", &c->vocab_size);
    sd_jconf_int(&j, "hidden_size", &c->hidden_size);
    sd_jconf_int(&j, "intermediate_size", &c->intermediate_size);
    sd_jconf_int(&j, "num_attention_heads", &c->num_attention_heads);
    sd_jconf_int(&j, "num_hidden_layers", &c->num_hidden_layers);
    sd_jconf_int(&j, "max_position_embeddings", &c->max_position_embeddings);
    sd_jconf_double(&j, "layer_norm_eps", &c->layer_norm_eps);
    jeps(&j, "layer_norm_eps", c->layer_norm_eps);
    act = c->quick_gelu;
    sd_jconf_choice(&j, "hidden_act", "gelu|quick_gelu", &act);
    c->quick_gelu = act;
    jrange(&j, "vocab_size", c->vocab_size, 1, 10000000);
    jrange(&j, "hidden_size", c->hidden_size, 1, 65536);
    jrange(&j, "intermediate_size", c->intermediate_size, 1, 262144);
    jrange(&j, "num_attention_heads", c->num_attention_heads, 1, 1024);
    jrange(&j, "num_hidden_layers", c->num_hidden_layers, 1, 256);
    jrange(&j, "max_position_embeddings", c->max_position_embeddings, 1, 65536);
    if (!j.failed && (c->num_attention_heads <= 0 || c->hidden_size % c->num_attention_heads != 0))
        sd_jconf_fail(&j, "%s: inconsistent configuration: %s%s", "hidden_size",
              " (hidden_size must be divisible by num_attention_heads)");
    if (!j.failed && (c->vocab_size <= 0 || c->num_hidden_layers <= 0 || c->intermediate_size <= 0 ||
                      c->max_position_embeddings <= 0))
        sd_jconf_fail(&j, "%s: inconsistent configuration: %s%s", "vocab_size",
              " (sizes must be positive)");
    return sd_jconf_close(&j);
}

/* ---- from the namelist ------------------------------------------------------------------ */

void sd_unet_config_from_namelist(const sd_config *cfg, sd_unet_config *c)
{
    sd_unet_config_sd2_base(c);
    c->in_channels = c->out_channels = (int)cfg->model.latent_channels;
    c->n_levels = cfg->model.n_block_out_channels;
    for (int i = 0; i < c->n_levels; i++) {
        c->block_out_channels[i] = (int)cfg->model.block_out_channels[i];
        c->heads[i] = (int)cfg->model.attention_head_dim[cfg->model.n_attention_head_dim == 1 ? 0 : i];
        c->transformer_layers[i] = 1;
        c->down_cross[i] = i < c->n_levels - 1 || c->n_levels == 1;
        c->up_cross[i] = i > 0 || c->n_levels == 1;
    }
    c->layers_per_block = (int)cfg->model.layers_per_block;
    c->cross_attention_dim = (int)cfg->model.cross_attention_dim;
    c->norm_num_groups = (int)cfg->model.norm_num_groups;
    c->sample_size = (int)(cfg->model.resolution / 8);
}

void sd_vae_config_from_namelist(const sd_config *cfg, sd_vae_config *c)
{
    sd_vae_config_sd2_base(c);
    c->n_levels = cfg->model.n_vae_block_out_channels;
    for (int i = 0; i < c->n_levels; i++)
        c->block_out_channels[i] = (int)cfg->model.vae_block_out_channels[i];
    c->latent_channels = (int)cfg->model.latent_channels;
    c->norm_num_groups = (int)cfg->model.norm_num_groups;
    c->sample_size = (int)cfg->model.resolution;
}

void sd_clip_config_from_namelist(const sd_config *cfg, sd_clip_config *c)
{
    sd_clip_config_sd2_base(c);
    c->hidden_size = (int)cfg->model.text_hidden_size;
    c->intermediate_size = 4 * c->hidden_size;
    c->num_attention_heads = (int)cfg->model.text_heads;
    c->num_hidden_layers = (int)cfg->model.text_layers;
}

/* ---- config.json writer -------------------------------------------------------------------- */

static json_object *int_array(const int *v, int n)
{
    json_object *a = json_object_new_array();
    for (int i = 0; i < n; i++)
        json_object_array_add(a, json_object_new_int(v[i]));
    return a;
}

static json_object *number(double x)
{
    if (x == floor(x) && fabs(x) < 1e9)
        return json_object_new_int((int)x);
    return json_object_new_double(x);
}

char *sd_unet_config_to_json(const sd_unet_config *c)
{
    json_object *o = json_object_new_object(), *down = json_object_new_array(),
                *up = json_object_new_array();
    char *text;
    for (int i = 0; i < c->n_levels; i++) {
        json_object_array_add(down, json_object_new_string(c->down_cross[i] ? "CrossAttnDownBlock2D"
                                                                            : "DownBlock2D"));
        json_object_array_add(up, json_object_new_string(c->up_cross[i] ? "CrossAttnUpBlock2D"
                                                                        : "UpBlock2D"));
    }
    json_object_object_add(o, "_class_name", json_object_new_string("UNet2DConditionModel"));
    json_object_object_add(o, "_diffusers_version", json_object_new_string("0.42.1"));
    json_object_object_add(o, "act_fn", json_object_new_string("silu"));
    /* diffusers reads attention_head_dim as the head COUNT when num_attention_heads is absent */
    json_object_object_add(o, "attention_head_dim", int_array(c->heads, c->n_levels));
    json_object_object_add(o, "block_out_channels", int_array(c->block_out_channels, c->n_levels));
    json_object_object_add(o, "center_input_sample", json_object_new_boolean(0));
    json_object_object_add(o, "conv_in_kernel", json_object_new_int(c->conv_in_kernel));
    json_object_object_add(o, "conv_out_kernel", json_object_new_int(c->conv_out_kernel));
    json_object_object_add(o, "cross_attention_dim", json_object_new_int(c->cross_attention_dim));
    json_object_object_add(o, "down_block_types", down);
    json_object_object_add(o, "downsample_padding", json_object_new_int(c->downsample_padding));
    json_object_object_add(o, "dual_cross_attention", json_object_new_boolean(0));
    json_object_object_add(o, "flip_sin_to_cos", json_object_new_boolean(c->flip_sin_to_cos));
    json_object_object_add(o, "freq_shift", number(c->freq_shift));
    json_object_object_add(o, "in_channels", json_object_new_int(c->in_channels));
    json_object_object_add(o, "layers_per_block", json_object_new_int(c->layers_per_block));
    json_object_object_add(o, "mid_block_type", json_object_new_string("UNetMidBlock2DCrossAttn"));
    json_object_object_add(o, "norm_eps", number(c->norm_eps));
    json_object_object_add(o, "norm_num_groups", json_object_new_int(c->norm_num_groups));
    json_object_object_add(o, "only_cross_attention", json_object_new_boolean(0));
    json_object_object_add(o, "out_channels", json_object_new_int(c->out_channels));
    json_object_object_add(o, "resnet_time_scale_shift", json_object_new_string("default"));
    json_object_object_add(o, "sample_size", json_object_new_int(c->sample_size));
    json_object_object_add(o, "time_embedding_type", json_object_new_string("positional"));
    json_object_object_add(o, "transformer_layers_per_block",
                           int_array(c->transformer_layers, c->n_levels));
    json_object_object_add(o, "up_block_types", up);
    json_object_object_add(o, "upcast_attention", json_object_new_boolean(c->upcast_attention));
    json_object_object_add(o, "use_linear_projection",
                           json_object_new_boolean(c->use_linear_projection));
    text = sd_xstrdup(json_object_to_json_string_ext(
        o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
    return text;
}
