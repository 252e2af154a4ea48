/* sdtool single-file's writer (src/models/single_file.c): the bundled snapshots against the
 * goldens that tests/reference/make_single_file_goldens.py verified with diffusers' own
 * single-file conversion (every tensor's name, dtype, shape and bytes), F16 / BF16 output, the
 * SD2-base name mapping (unique names, landmarks of the original checkpoint), and bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/models.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/single_file.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/tensor.h"
#include "tap.h"

static uint64_t fnv1a64(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

/* The file against the golden listing: same tensors, dtypes, shapes and bytes. */
static void against_golden(const char *srcdir, const char *model, const char *path)
{
    char golden[4096], line[1024];
    snprintf(golden, sizeof golden, "%s/tests/data/single_file/%s.tsv", srcdir, model);
    FILE *g = fopen(golden, "r");
    if (!tap_ok(g != NULL, "%s: golden %s readable", model, golden))
        return;
    sd_st_file f;
    sd_err err;
    int opened = sd_st_open(path, &f, &err) == 0;
    if (!tap_ok(opened, "%s: written file opens: %s", model, opened ? "ok" : err.msg)) {
        fclose(g);
        return;
    }
    size_t n = 0, wrong = 0;
    char first[1200] = "";
    while (fgets(line, sizeof line, g)) {
        if (line[0] == '#')
            continue;
        char name[600], dtype[16], shape[128];
        unsigned long long hash;
        if (sscanf(line, "%599[^\t]\t%15[^\t]\t%127[^\t]\t%llx", name, dtype, shape, &hash) != 4)
            continue;
        n++;
        const sd_st_tensor *t = sd_st_find(&f, name);
        char have[128] = "";
        size_t len = 0;
        if (t) {
            for (int d = 0; d < t->ndim; d++)
                len += (size_t)snprintf(have + len, sizeof have - len, "%s%lld", d ? "x" : "",
                                        (long long)t->shape[d]);
            if (t->ndim == 0)
                snprintf(have, sizeof have, "scalar");
        }
        if (!t || strcmp(sd_st_dtype_name(t->dtype), dtype) || strcmp(have, shape) ||
            fnv1a64(t->data, t->nbytes) != hash) {
            if (!wrong++)
                snprintf(first, sizeof first, "%s: %s", name,
                         !t ? "missing" : strcmp(have, shape) ? "shape" : "dtype or bytes");
        }
    }
    fclose(g);
    tap_ok(n > 0 && n == sd_st_count(&f), "%s: %zu tensors, as the golden (%zu)", model,
           sd_st_count(&f), n);
    tap_ok(wrong == 0, "%s: every tensor's name, dtype, shape and bytes as verified with "
                       "diffusers (%zu differ%s%s)", model, wrong, wrong ? "; first " : "", first);
    sd_st_close(&f);
}

/* F16 / BF16 output: every tensor the F32 file's values, rounded. */
static void rounded(const char *snap, const char *dir)
{
    char p32[4096], p16[4096];
    sd_err err;
    sd_single_file_info info;
    snprintf(p32, sizeof p32, "%s/f32.safetensors", dir);
    SD_CHECK(sd_single_file_write(snap, p32, SD_ST_F32, NULL, &info, &err) == 0, "%s", err.msg);
    for (int k = 0; k < 2; k++) {
        const sd_st_dtype dt = k ? SD_ST_BF16 : SD_ST_F16;
        snprintf(p16, sizeof p16, "%s/half.safetensors", dir);
        int rc = sd_single_file_write(snap, p16, dt, NULL, &info, &err);
        if (!tap_ok(rc == 0, "%s written: %s", sd_st_dtype_name(dt), rc ? err.msg : "ok"))
            continue;
        sd_st_file a, b;
        SD_CHECK(sd_st_open(p32, &a, &err) == 0 && sd_st_open(p16, &b, &err) == 0, "%s", err.msg);
        size_t bad = 0;
        for (size_t i = 0; i < sd_st_count(&a); i++) {
            const sd_st_tensor *ta = sd_st_tensor_at(&a, i), *tb = sd_st_find(&b, ta->name);
            if (!tb || tb->dtype != dt || tb->numel != ta->numel) {
                bad++;
                continue;
            }
            const float *x = ta->data;
            const uint16_t *y = tb->data;
            for (int64_t j = 0; j < ta->numel; j++) {
                float v;
                memcpy(&v, x + j, sizeof v);
                uint16_t want = k ? sd_f32_to_bf16(v) : sd_f32_to_f16(v), got;
                memcpy(&got, y + j, sizeof got);
                if (got != want) {
                    bad++;
                    break;
                }
            }
        }
        tap_ok(bad == 0 && sd_st_count(&a) == sd_st_count(&b),
               "--dtype %s: every tensor the F32 file's values rounded (%zu differ)",
               sd_st_dtype_name(dt), bad);
        sd_st_close(&a);
        sd_st_close(&b);
    }
}

/* The mapping over SD2-base's full tables: every name maps, no two to the same name, and the
 * landmarks of the original checkpoint's layout. */
static void sd2_names(void)
{
    sd_unet_config uc;
    sd_vae_config vc;
    sd_clip_config cc;
    sd_param_table t[3];
    sd_unet_config_sd2_base(&uc);
    sd_vae_config_sd2_base(&vc);
    sd_clip_config_sd2_base(&cc);
    memset(t, 0, sizeof t);
    sd_unet_params(&uc, &t[0]);
    sd_vae_params(&vc, &t[1]);
    sd_clip_params(&cc, &t[2]);
    size_t total = 0, unmapped = 0, fused = 0;
    char **names = NULL;
    for (int m = 0; m < 3; m++)
        for (size_t i = 0; i < t[m].n; i++) {
            char out[256], full[300];
            int rc, conv = 0, part = -1;
            if (m == 0)
                rc = sd_ldm_unet_key(&uc, t[m].params[i].name, out, sizeof out);
            else if (m == 1)
                rc = sd_ldm_vae_key(&vc, t[m].params[i].name, out, sizeof out, &conv);
            else
                rc = sd_ldm_clip_key(&cc, t[m].params[i].name, out, sizeof out, &part);
            if (rc) {
                unmapped++;
                continue;
            }
            if (part > 0) { /* k and v share q's fused name */
                fused++;
                continue;
            }
            snprintf(full, sizeof full, "%s%s",
                     m == 0 ? SD_LDM_UNET_PREFIX : m == 1 ? SD_LDM_VAE_PREFIX : "", out);
            names = sd_xrealloc(names, (total + 1) * sizeof *names);
            names[total++] = sd_xstrdup(full);
        }
    size_t dup = 0;
    for (size_t i = 0; i < total; i++)
        for (size_t j = i + 1; j < total; j++)
            dup += !strcmp(names[i], names[j]);
    tap_ok(unmapped == 0, "SD2-base: every U-Net, VAE and text-encoder tensor has an original "
                          "name (%zu without)", unmapped);
    tap_ok(dup == 0, "SD2-base: %zu original names, none twice (%zu)", total, dup);
    tap_ok(fused == 2 * 2 * (size_t)cc.num_hidden_layers,
           "SD2-base: the k and v projections of %d layers fuse into q's in_proj (%zu)",
           cc.num_hidden_layers, fused);
    tap_ok(total == t[0].n + t[1].n + t[2].n - fused, "SD2-base: %zu tensors in the file", total);
    for (size_t i = 0; i < total; i++)
        free(names[i]);
    free(names);

    static const char *const unet[][2] = {
        {"conv_in.weight", "input_blocks.0.0.weight"},
        {"time_embedding.linear_2.bias", "time_embed.2.bias"},
        {"down_blocks.0.resnets.1.norm1.weight", "input_blocks.2.0.in_layers.0.weight"},
        {"down_blocks.0.downsamplers.0.conv.weight", "input_blocks.3.0.op.weight"},
        {"down_blocks.1.resnets.0.conv_shortcut.weight", "input_blocks.4.0.skip_connection.weight"},
        {"down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight",
         "input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight"},
        {"down_blocks.3.resnets.1.time_emb_proj.weight", "input_blocks.11.0.emb_layers.1.weight"},
        {"mid_block.attentions.0.proj_in.weight", "middle_block.1.proj_in.weight"},
        {"mid_block.resnets.1.conv2.bias", "middle_block.2.out_layers.3.bias"},
        {"up_blocks.0.resnets.2.conv1.weight", "output_blocks.2.0.in_layers.2.weight"},
        {"up_blocks.0.upsamplers.0.conv.weight", "output_blocks.2.1.conv.weight"},
        {"up_blocks.1.upsamplers.0.conv.bias", "output_blocks.5.2.conv.bias"},
        {"up_blocks.3.attentions.2.proj_out.weight", "output_blocks.11.1.proj_out.weight"},
        {"conv_norm_out.weight", "out.0.weight"},
        {"conv_out.bias", "out.2.bias"},
    };
    for (size_t k = 0; k < sizeof unet / sizeof unet[0]; k++) {
        char out[256];
        int rc = sd_ldm_unet_key(&uc, unet[k][0], out, sizeof out);
        tap_ok(rc == 0 && !strcmp(out, unet[k][1]), "U-Net %s -> %s (%s)", unet[k][0], unet[k][1],
               rc ? "unmapped" : out);
    }
    static const char *const vae[][2] = {
        {"encoder.conv_norm_out.bias", "encoder.norm_out.bias"},
        {"encoder.down_blocks.1.resnets.0.conv_shortcut.weight",
         "encoder.down.1.block.0.nin_shortcut.weight"},
        {"encoder.down_blocks.2.downsamplers.0.conv.weight", "encoder.down.2.downsample.conv.weight"},
        {"encoder.mid_block.resnets.1.norm2.weight", "encoder.mid.block_2.norm2.weight"},
        {"decoder.mid_block.attentions.0.to_out.0.weight", "decoder.mid.attn_1.proj_out.weight"},
        {"decoder.up_blocks.0.resnets.2.conv1.weight", "decoder.up.3.block.2.conv1.weight"},
        {"decoder.up_blocks.2.upsamplers.0.conv.bias", "decoder.up.1.upsample.conv.bias"},
        {"post_quant_conv.weight", "post_quant_conv.weight"},
    };
    for (size_t k = 0; k < sizeof vae / sizeof vae[0]; k++) {
        char out[256];
        int conv;
        int rc = sd_ldm_vae_key(&vc, vae[k][0], out, sizeof out, &conv);
        tap_ok(rc == 0 && !strcmp(out, vae[k][1]), "VAE %s -> %s (%s)", vae[k][0], vae[k][1],
               rc ? "unmapped" : out);
    }
    {
        char out[256];
        int conv = 0, part = -1;
        tap_ok(sd_ldm_vae_key(&vc, "encoder.mid_block.attentions.0.to_q.weight", out, sizeof out,
                              &conv) == 0 && conv == 1 && !strcmp(out, "encoder.mid.attn_1.q.weight"),
               "VAE attention q weight: a 1x1 convolution in the original");
        tap_ok(sd_ldm_vae_key(&vc, "encoder.mid_block.attentions.0.to_q.bias", out, sizeof out,
                              &conv) == 0 && conv == 0, "its bias stays a vector");
        tap_ok(sd_ldm_clip_key(&cc, "text_model.encoder.layers.22.self_attn.v_proj.weight", out,
                               sizeof out, &part) == 0 && part == 2 &&
                   !strcmp(out, SD_LDM_OPENCLIP_PREFIX "transformer.resblocks.22.attn.in_proj_weight"),
               "OpenCLIP: layer 22's v projection is the last third of in_proj_weight");
        tap_ok(sd_ldm_clip_key(&cc, "text_model.embeddings.position_embedding.weight", out,
                               sizeof out, &part) == 0 &&
                   !strcmp(out, SD_LDM_OPENCLIP_PREFIX "positional_embedding"),
               "OpenCLIP: positional_embedding");
        /* names the layout has no place for */
        tap_ok(sd_ldm_unet_key(&uc, "up_blocks.0.attentions.0.norm.weight", out, sizeof out) != 0,
               "U-Net: an attention in SD2's UpBlock2D level is refused");
        tap_ok(sd_ldm_unet_key(&uc, "down_blocks.3.downsamplers.0.conv.weight", out, sizeof out) != 0,
               "U-Net: a downsampler in the last level is refused");
        tap_ok(sd_ldm_unet_key(&uc, "down_blocks.9.resnets.0.norm1.weight", out, sizeof out) != 0 &&
                   sd_ldm_unet_key(&uc, "foo.weight", out, sizeof out) != 0 &&
                   sd_ldm_vae_key(&vc, "encoder.down_blocks.0.resnets.0.bogus.weight", out,
                                  sizeof out, &conv) != 0 &&
                   sd_ldm_clip_key(&cc, "text_model.encoder.layers.23.mlp.fc1.weight", out,
                                   sizeof out, &part) != 0,
               "unknown names and out-of-range levels are refused");
        tap_ok(sd_ldm_unet_key(&uc, "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight",
                               out, 20) != 0, "a name longer than the buffer is refused");
    }
    for (int m = 0; m < 3; m++)
        sd_param_table_free(&t[m]);
}

/* Bad input: a component folder, a snapshot without a VAE, a folder that cannot be written. */
static void bad_input(const char *srcdir, const char *dir)
{
    char snap[4096], path[4096], cmd[12000];
    sd_err err;
    sd_single_file_info info;
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    snprintf(snap, sizeof snap, "%s/tests/data/models/tiny-sd2/unet", srcdir);
    int rc = sd_single_file_write(snap, path, SD_ST_F32, NULL, &info, &err);
    tap_ok(rc == -1 && strstr(err.msg, "one component's folder"), "a component folder: %s",
           rc ? err.msg : "accepted");
    snprintf(snap, sizeof snap, "%s/novae", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -R '%s/tests/data/models/tiny-sd2/unet' "
                              "'%s/tests/data/models/tiny-sd2/text_encoder' '%s/'",
             snap, srcdir, srcdir, snap);
    SD_CHECK(system(cmd) == 0, "%s", cmd);
    rc = sd_single_file_write(snap, path, SD_ST_F32, NULL, &info, &err);
    tap_ok(rc == -1 && strstr(err.msg, "vae"), "a snapshot without vae/: %s",
           rc ? err.msg : "accepted");
    tap_ok(access(path, F_OK) != 0, "nothing written");
    snprintf(snap, sizeof snap, "%s/tests/data/models/tiny-sd2", srcdir);
    snprintf(path, sizeof path, "%s/no/such/folder/x.safetensors", dir);
    rc = sd_single_file_write(snap, path, SD_ST_F32, NULL, &info, &err);
    tap_ok(rc == -2, "an unwritable path: %s", rc ? err.msg : "accepted");
}

/* The weights of a snapshot and of a read-back file: the same floats (our layouts). */
static int same_weights(const sd_weights *a, const sd_weights *b)
{
    return a->table.n == b->table.n && a->table.total_floats == b->table.total_floats &&
           memcmp(a->data, b->data, a->table.total_floats * sizeof(float)) == 0;
}

/* A copy of `src` (an original-layout file) with changes: `extra` tensors added (name, F32
 * vector of 4 values), names starting with `drop` left out, and, when ema, every U-Net tensor
 * also as its model_ema.* copy with the values negated. */
static void rewrite(const char *src, const char *dst, const char *const *extra, const char *drop,
                    int ema)
{
    sd_st_file f;
    sd_err err;
    SD_CHECK(sd_st_open(src, &f, &err) == 0, "%s", err.msg);
    sd_st_writer *w = sd_st_writer_new();
    float four[4] = {1, 2, 3, 4};
    void **keep = calloc(2 * f.n_tensors + 1, sizeof *keep);
    char **names = calloc(f.n_tensors + 1, sizeof *names);
    size_t nk = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const sd_st_tensor *t = &f.tensors[i];
        if (drop && !strncmp(t->name, drop, strlen(drop)))
            continue;
        SD_CHECK(sd_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes,
                                  &err) == 0, "%s", err.msg);
        if (ema && !strncmp(t->name, "model.", 6) && t->dtype == SD_ST_F32) {
            char e[700];
            size_t n = (size_t)snprintf(e, sizeof e, "model_ema.");
            for (const char *p = t->name + 6; *p; p++)
                if (*p != '.')
                    e[n++] = *p;
            e[n] = '\0';
            float *neg = malloc(t->nbytes ? t->nbytes : 1);
            memcpy(neg, t->data, t->nbytes);
            for (int64_t j = 0; j < t->numel; j++)
                neg[j] = -neg[j];
            keep[nk++] = neg;
            names[i] = strdup(e);
            SD_CHECK(sd_st_writer_add(w, names[i], SD_ST_F32, t->ndim, t->shape, neg, t->nbytes,
                                      &err) == 0, "%s", err.msg);
        }
    }
    for (int k = 0; extra && extra[k]; k++) {
        int64_t shape[1] = {4};
        SD_CHECK(sd_st_writer_add(w, extra[k], SD_ST_F32, 1, shape, four, sizeof four, &err) == 0,
                 "%s", err.msg);
    }
    SD_CHECK(sd_st_writer_write(w, dst, &err) == 0, "%s", err.msg);
    sd_st_writer_free(w);
    for (size_t k = 0; k < nk; k++)
        free(keep[k]);
    for (size_t i = 0; i < f.n_tensors; i++)
        free(names[i]);
    free(keep);
    free(names);
    sd_st_close(&f);
}

/* sd_single_file_read: the written file read back is the snapshot bit for bit (each model,
 * each bundled snapshot); the EMA copy; the parts SD never uses; bad files. */
static void read_back(const char *top, const char *dir)
{
    static const char *const models[] = {"tiny-sd2", "tiny-sd1", "odd"};
    char snap[4200], path[4200], path2[4200], notes[512];
    sd_err err;
    for (size_t k = 0; k < 3; k++) {
        sd_single_file_models m;
        sd_single_file_info info;
        sd_snapshot s;
        snprintf(snap, sizeof snap, "%s/tests/data/models/%s", top, models[k]);
        snprintf(path, sizeof path, "%s/rt-%s.safetensors", dir, models[k]);
        SD_CHECK(sd_single_file_write(snap, path, k == 1 ? SD_ST_BF16 : SD_ST_F32, NULL, &info,
                                      &err) == 0, "%s", err.msg);
        int rc = sd_single_file_read(path, snap, 0, &m, notes, sizeof notes, &err);
        if (!tap_ok(rc == 0, "%s: the written file reads back: %s", models[k], rc ? err.msg : notes))
            continue;
        SD_CHECK(sd_snapshot_open(&s, snap, &err) == 0, "%s", err.msg);
        sd_weights ref[3];
        sd_unet_config uc;
        sd_vae_config vc;
        sd_clip_config cc;
        SD_CHECK(sd_snapshot_load_unet(&s, NULL, &uc, &ref[0], &err) == 0 &&
                     sd_snapshot_load_vae(&s, NULL, &vc, &ref[1], &err) == 0 &&
                     sd_snapshot_load_text_encoder(&s, NULL, &cc, NULL, &ref[2], &err) == 0,
                 "%s", err.msg);
        tap_ok(same_weights(&m.w[0], &ref[0]) && same_weights(&m.w[1], &ref[1]) &&
                   same_weights(&m.w[2], &ref[2]),
               "%s: U-Net, VAE and text encoder read back bit for bit (%s)", models[k],
               k == 1 ? "BF16 file, as its snapshot" : "F32 file");
        if (k == 0) {
            /* the EMA copy, and the parts SD never uses (OpenCLIP's layers past the config's,
             * its projection and logit scale), plus the schedule's buffers */
            static const char *const extra[] = {
                "cond_stage_model.model.transformer.resblocks.3.ln_1.weight",
                "cond_stage_model.model.text_projection", "cond_stage_model.model.logit_scale",
                "first_stage_model.loss.logvar", "alphas_cumprod", "betas", NULL};
            sd_single_file_models e;
            snprintf(path2, sizeof path2, "%s/ema.safetensors", dir);
            rewrite(path, path2, extra, NULL, 1);
            rc = sd_single_file_read(path2, snap, 1, &e, notes, sizeof notes, &err);
            int neg = rc == 0;
            for (size_t i = 0; neg && i < e.w[0].table.total_floats; i++)
                neg = e.w[0].data[i] == -ref[0].data[i];
            tap_ok(neg && same_weights(&e.w[1], &ref[1]),
                   "--ema: the U-Net from model_ema.* (negated here), the rest as before: %s",
                   rc ? err.msg : notes);
            tap_ok(rc == 0 && strstr(notes, "4 the SD models never use"),
                   "the unused OpenCLIP parts and the VAE's loss module are left out and counted");
            if (rc == 0)
                sd_single_file_models_free(&e);
            rc = sd_single_file_read(path2, snap, 0, &e, notes, sizeof notes, &err);
            neg = rc == 0 && same_weights(&e.w[0], &ref[0]);
            tap_ok(neg, "without --ema the same file gives the U-Net itself: %s",
                   rc ? err.msg : notes);
            if (rc == 0)
                sd_single_file_models_free(&e);
            rc = sd_single_file_read(path, snap, 1, &e, notes, sizeof notes, &err);
            tap_ok(rc != 0 && strstr(err.msg, "no model_ema.* tensors"),
                   "--ema on a file without an EMA copy: %s", rc ? err.msg : "accepted");
            /* a tensor of the U-Net the configuration does not know */
            static const char *const stray[] = {"model.diffusion_model.input_blocks.99.0.x", NULL};
            rewrite(path, path2, stray, NULL, 0);
            rc = sd_single_file_read(path2, snap, 0, &e, notes, sizeof notes, &err);
            tap_ok(rc != 0 && strstr(err.msg, "1 not used") &&
                       strstr(err.msg, "input_blocks.99.0.x is not part of the model"),
                   "a U-Net tensor the configuration has no place for: %s",
                   rc ? err.msg : "accepted");
            /* the VAE left out */
            rewrite(path, path2, NULL, "first_stage_model.", 0);
            rc = sd_single_file_read(path2, snap, 0, &e, notes, sizeof notes, &err);
            tap_ok(rc != 0 && strstr(err.msg, "missing first_stage_model."),
                   "a file without the VAE: %s", rc ? err.msg : "accepted");
            /* another model's configuration */
            snprintf(path2, sizeof path2, "%s/tests/data/models/tiny-sd1", top);
            rc = sd_single_file_read(path, path2, 0, &e, notes, sizeof notes, &err);
            tap_ok(rc != 0 && strstr(err.msg, "does not fit the configuration"),
                   "tiny-sd2's file with tiny-sd1's configuration: %s", rc ? err.msg : "accepted");
            rc = sd_single_file_read("/nonexistent.safetensors", snap, 0, &e, notes, sizeof notes,
                                     &err);
            tap_ok(rc != 0 && strstr(err.msg, "/nonexistent.safetensors"), "a missing file: %s",
                   rc ? err.msg : "accepted");
        }
        for (int c = 0; c < 3; c++)
            sd_weights_free(&ref[c]);
        sd_snapshot_close(&s);
        sd_single_file_models_free(&m);
    }
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    const char *top = srcdir ? srcdir : ".";
    char dir[] = "/tmp/sdtrain-test-single-file-XXXXXX", path[4200], snap[4200];
    SD_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    static const char *const models[] = {"tiny-sd2", "tiny-sd1", "odd"};
    for (size_t m = 0; m < 3; m++) {
        sd_err err;
        sd_single_file_info info;
        snprintf(snap, sizeof snap, "%s/tests/data/models/%s", top, models[m]);
        snprintf(path, sizeof path, "%s/%s.safetensors", dir, models[m]);
        int rc = sd_single_file_write(snap, path, SD_ST_F32, "test", &info, &err);
        if (tap_ok(rc == 0, "%s: written: %s", models[m], rc ? err.msg : "ok"))
            against_golden(top, models[m], path);
    }
    snprintf(snap, sizeof snap, "%s/tests/data/models/tiny-sd2", top);
    rounded(snap, dir);
    sd2_names();
    bad_input(top, dir);
    read_back(top, dir);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", dir);
    return tap_done();
}
