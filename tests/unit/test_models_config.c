/* Model configurations and parameter tables: SD2-base tables equal the spec's key lists
 * (names, shapes, totals); config.json parsing, defaults, broadcasts and refusals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/models.h"
#include "sdtrain/weights.h"
#include "tap.h"

static char tmpdir[64];

/* Compares a table with a "<key> [d0, d1, ...]" list: same set, same shapes. */
static void compare_with_key_file(const sd_param_table *t, const char *path, const char *what)
{
    FILE *f = fopen(path, "r");
    char line[512];
    size_t listed = 0, missing = 0, wrong_shape = 0;
    if (!tap_ok(f != NULL, "%s: open %s", what, path))
        return;
    while (fgets(line, sizeof line, f)) {
        char name[256], shape[256], *br;
        const sd_param *p;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        br = strchr(line, '[');
        if (!br || sscanf(line, "%255s", name) != 1)
            continue;
        snprintf(shape, sizeof shape, "%s", br);
        shape[strcspn(shape, "\n")] = '\0';
        listed++;
        p = sd_param_find(t, name);
        if (!p) {
            if (missing++ < 5)
                tap_diag("%s: %s missing from our table", what, name);
            continue;
        }
        {
            char ours[256];
            size_t n = (size_t)snprintf(ours, sizeof ours, "[");
            for (int i = 0; i < p->ndim; i++)
                n += (size_t)snprintf(ours + n, sizeof ours - n, "%s%lld", i ? ", " : "", (long long)p->shape[i]);
            snprintf(ours + n, sizeof ours - n, "]");
            if (strcmp(ours, shape) != 0 && wrong_shape++ < 5)
                tap_diag("%s: %s is %s, list says %s", what, name, ours, shape);
        }
    }
    fclose(f);
    tap_ok(missing == 0, "%s: every listed key is in the table (%zu missing)", what, missing);
    tap_ok(wrong_shape == 0, "%s: shapes match (%zu differ)", what, wrong_shape);
    tap_ok(listed == t->n, "%s: same number of tensors (list %zu, table %zu)", what, listed, t->n);
}

static void test_sd2_tables(const char *srcdir)
{
    sd_unet_config u;
    sd_vae_config v;
    sd_clip_config c;
    sd_param_table t;
    char path[1024];
    int aligned = 1, ordered = 1;

    sd_unet_config_sd2_base(&u);
    sd_unet_params(&u, &t);
    snprintf(path, sizeof path, "%s/tests/data/keys/sd2-keys-unet.txt", srcdir);
    compare_with_key_file(&t, path, "unet");
    tap_ok(t.total_numel == 865910724u, "SD2 U-Net has 865,910,724 parameters (%zu)", t.total_numel);
    tap_ok(t.n == 686, "SD2 U-Net has 686 tensors (%zu)", t.n);
    for (size_t i = 0; i < t.n; i++) {
        aligned &= t.params[i].offset % SD_PARAM_ALIGN == 0;
        ordered &= i == 0 || t.params[i].offset >= t.params[i - 1].offset + t.params[i - 1].numel;
    }
    tap_ok(aligned && ordered, "offsets aligned to %d floats and non-overlapping", SD_PARAM_ALIGN);
    tap_ok(t.total_floats >= t.total_numel && t.total_floats < t.total_numel + t.n * SD_PARAM_ALIGN,
           "flat buffer = parameters + alignment padding");
    tap_ok(sd_param_find(&t, "down_blocks.1.resnets.0.conv_shortcut.weight") != NULL &&
               sd_param_find(&t, "down_blocks.0.resnets.0.conv_shortcut.weight") == NULL,
           "conv_shortcut only where channels change");
    sd_param_table_free(&t);

    sd_vae_config_sd2_base(&v);
    sd_vae_params(&v, &t);
    snprintf(path, sizeof path, "%s/tests/data/keys/sd2-keys-vae.txt", srcdir);
    compare_with_key_file(&t, path, "vae");
    tap_ok(t.total_numel == 83653863u, "SD2 VAE has 83,653,863 parameters (%zu)", t.total_numel);
    sd_param_table_free(&t);

    sd_clip_config_sd2_base(&c);
    sd_clip_params(&c, &t);
    snprintf(path, sizeof path, "%s/tests/data/keys/sd2-keys-text-encoder.txt", srcdir);
    compare_with_key_file(&t, path, "text encoder");
    tap_ok(t.total_numel == 340387840u, "SD2 text encoder has 340,387,840 parameters (%zu)", t.total_numel);
    sd_param_table_free(&t);
}

static const char *write_json(const char *name, const char *text)
{
    static char path[256];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static const char *sd2_unet_json =
    "{\"_class_name\": \"UNet2DConditionModel\", \"_diffusers_version\": \"0.10.0.dev0\","
    " \"act_fn\": \"silu\", \"attention_head_dim\": [5, 10, 20, 20],"
    " \"block_out_channels\": [320, 640, 1280, 1280], \"center_input_sample\": false,"
    " \"cross_attention_dim\": 1024, \"down_block_types\": [\"CrossAttnDownBlock2D\","
    " \"CrossAttnDownBlock2D\", \"CrossAttnDownBlock2D\", \"DownBlock2D\"],"
    " \"downsample_padding\": 1, \"dual_cross_attention\": false, \"flip_sin_to_cos\": true,"
    " \"freq_shift\": 0, \"in_channels\": 4, \"layers_per_block\": 2, \"mid_block_scale_factor\": 1,"
    " \"norm_eps\": 1e-05, \"norm_num_groups\": 32, \"num_class_embeds\": null,"
    " \"only_cross_attention\": false, \"out_channels\": 4, \"sample_size\": 64,"
    " \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\", \"CrossAttnUpBlock2D\","
    " \"CrossAttnUpBlock2D\"], \"use_linear_projection\": true}";

static void test_json(void)
{
    sd_unet_config u, ref;
    sd_vae_config v;
    sd_clip_config c;
    sd_err err;
    const char *p;

    p = write_json("unet.json", sd2_unet_json);
    tap_ok(sd_unet_config_load(p, &u, &err) == 0, "SD2 unet config.json parses (%s)", err.msg);
    sd_unet_config_sd2_base(&ref);
    tap_ok(memcmp(&u, &ref, sizeof u) == 0, "SD2 unet config.json gives the SD2-base configuration");

    p = write_json("tiny.json",
                   "{\"block_out_channels\": [32, 64], \"layers_per_block\": 2, \"sample_size\": 32,"
                   " \"in_channels\": 4, \"out_channels\": 4, \"down_block_types\": [\"DownBlock2D\","
                   " \"CrossAttnDownBlock2D\"], \"up_block_types\": [\"CrossAttnUpBlock2D\", \"UpBlock2D\"],"
                   " \"cross_attention_dim\": 32, \"attention_head_dim\": 8, \"norm_num_groups\": 32}");
    tap_ok(sd_unet_config_load(p, &u, &err) == 0 && u.n_levels == 2 && u.heads[0] == 8 && u.heads[1] == 8 &&
               !u.down_cross[0] && u.down_cross[1] && u.up_cross[0] && !u.up_cross[1] &&
               u.use_linear_projection == 0,
           "tiny config: scalar attention_head_dim broadcast, block types, library defaults");
    p = write_json("heads.json",
                   "{\"block_out_channels\": [32, 64], \"down_block_types\": [\"CrossAttnDownBlock2D\","
                   " \"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\", \"CrossAttnUpBlock2D\"],"
                   " \"attention_head_dim\": [8, 8], \"num_attention_heads\": [2, 4]}");
    tap_ok(sd_unet_config_load(p, &u, &err) == 0 && u.heads[0] == 2 && u.heads[1] == 4,
           "num_attention_heads wins over attention_head_dim");
    p = write_json("class.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                                 " \"up_block_types\": [\"UpBlock2D\"], \"class_embed_type\": \"timestep\"}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "class.json") &&
               strstr(err.msg, "'class_embed_type' is set, but sdtrain does not implement"),
           "an unimplemented feature is refused by name (%s)", err.msg);
    p = write_json("shift.json", "{\"resnet_time_scale_shift\": \"scale_shift\", \"down_block_types\": "
                                 "[\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"], "
                                 "\"block_out_channels\": [32]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "unsupported setting 'resnet_time_scale_shift'"),
           "scale_shift time conditioning refused (%s)", err.msg);
    p = write_json("swish.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                                 " \"up_block_types\": [\"UpBlock2D\"], \"act_fn\": \"swish\","
                                 " \"norm_num_groups\": 8}");
    tap_ok(sd_unet_config_load(p, &u, &err) == 0, "act_fn 'swish' (diffusers' other name of SiLU) "
           "taken (%s)", err.msg);
    p = write_json("outscale.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                                    " \"up_block_types\": [\"UpBlock2D\"], \"mid_block_scale_factor\": 1,"
                                    " \"resnet_out_scale_factor\": 2.0}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 &&
               strstr(err.msg, "'resnet_out_scale_factor' other than 1 is not implemented"),
           "resnet_out_scale_factor refused under its own name (%s)", err.msg);
    p = write_json("nomid.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                                 " \"up_block_types\": [\"UpBlock2D\"], \"mid_block_type\": null}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 &&
               strstr(err.msg, "'mid_block_type' = null (a U-Net without a mid block) is not implemented"),
           "mid_block_type null (no mid block) refused, not read as the default (%s)", err.msg);
    p = write_json("ted.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                               " \"up_block_types\": [\"UpBlock2D\"], \"time_embedding_dim\": 64}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "'time_embedding_dim' = 64"),
           "time_embedding_dim other than 4 x block_out_channels[0] refused (%s)", err.msg);
    p = write_json("ted128.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                                  " \"up_block_types\": [\"UpBlock2D\"], \"time_embedding_dim\": 128,"
                                  " \"norm_num_groups\": 8}");
    tap_ok(sd_unet_config_load(p, &u, &err) == 0, "time_embedding_dim = 4 x block_out_channels[0] "
           "taken (%s)", err.msg);
    p = write_json("eps.json", "{\"block_out_channels\": [32], \"down_block_types\": [\"DownBlock2D\"],"
                               " \"up_block_types\": [\"UpBlock2D\"], \"norm_eps\": -1e-5}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "eps.json") &&
               strstr(err.msg, "'norm_eps' = -1e-05 is outside [0, 1)"),
           "a negative norm_eps refused by name (%s)", err.msg);
    p = write_json("block.json", "{\"block_out_channels\": [32], \"down_block_types\": "
                                 "[\"SimpleCrossAttnDownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "SimpleCrossAttnDownBlock2D"),
           "unknown block type refused (%s)", err.msg);
    p = write_json("groups.json", "{\"block_out_channels\": [48], \"norm_num_groups\": 32, "
                                  "\"down_block_types\": [\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "not a positive multiple of norm_num_groups"),
           "channels not divisible by groups refused (%s)", err.msg);
    p = write_json("bad.json", "{\"block_out_channels\": [32, 64,");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "bad.json") && strstr(err.msg, "invalid JSON"),
           "invalid JSON named (%s)", err.msg);
    tap_ok(sd_unet_config_load("/nonexistent/config.json", &u, &err) != 0 &&
               strstr(err.msg, "/nonexistent/config.json: cannot read"), "missing file named");
    p = write_json("type.json", "{\"layers_per_block\": \"two\"}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "'layers_per_block' must be an integer"),
           "wrong JSON type named (%s)", err.msg);

    p = write_json("vae.json", "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", "
                               "\"block_out_channels\": [128, 256, 512, 512], \"down_block_types\": "
                               "[\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
                               "\"DownEncoderBlock2D\"], \"in_channels\": 3, \"latent_channels\": 4, "
                               "\"layers_per_block\": 2, \"norm_num_groups\": 32, \"out_channels\": 3, "
                               "\"sample_size\": 512, \"up_block_types\": [\"UpDecoderBlock2D\", "
                               "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"]}");
    tap_ok(sd_vae_config_load(p, &v, &err) == 0 && v.n_levels == 4 && v.scaling_factor == 0.18215 &&
               v.use_quant_conv && v.mid_block_add_attention, "SD2 VAE config.json, scaling factor default");
    p = write_json("clip.json", "{\"architectures\": [\"CLIPTextModel\"], \"hidden_act\": \"gelu\", "
                                "\"hidden_size\": 1024, \"intermediate_size\": 4096, \"num_attention_heads\": 16, "
                                "\"num_hidden_layers\": 23, \"max_position_embeddings\": 77, "
                                "\"vocab_size\": 49408, \"layer_norm_eps\": 1e-05, \"projection_dim\": 512}");
    {
        sd_clip_config ref2;
        sd_clip_config_sd2_base(&ref2);
        tap_ok(sd_clip_config_load(p, &c, &err) == 0 && memcmp(&c, &ref2, sizeof c) == 0,
               "SD2 text encoder config.json gives the SD2-base configuration");
    }
    p = write_json("clip_act.json", "{\"hidden_act\": \"relu\"}");
    tap_ok(sd_clip_config_load(p, &c, &err) != 0 && strstr(err.msg, "'hidden_act'"), "unknown activation refused");

    /* Sizes out of range, found by tests/fuzz/fuzz_modelconfig.c: norm_num_groups 0 divided by
     * zero in the VAE loader, latent_channels 0 made empty tensors, huge sizes overflowed. */
    p = write_json("vae_groups.json", "{\"norm_num_groups\": 0}");
    tap_ok(sd_vae_config_load(p, &v, &err) != 0 && strstr(err.msg, "vae_groups.json: 'norm_num_groups' = 0 "
                                                                   "is outside 1 to 1024"),
           "VAE norm_num_groups 0 refused (%s)", err.msg);
    p = write_json("vae_latent.json", "{\"latent_channels\": 0}");
    tap_ok(sd_vae_config_load(p, &v, &err) != 0 && strstr(err.msg, "'latent_channels' = 0"),
           "VAE latent_channels 0 refused (%s)", err.msg);
    p = write_json("unet_groups.json", "{\"norm_num_groups\": 0, \"block_out_channels\": [32], "
                                       "\"down_block_types\": [\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 && strstr(err.msg, "'norm_num_groups' = 0"),
           "U-Net norm_num_groups 0 refused (%s)", err.msg);
    p = write_json("unet_big.json", "{\"block_out_channels\": [999999968], \"down_block_types\": "
                                    "[\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 &&
               strstr(err.msg, "'block_out_channels'[0] = 999999968 is outside 1 to 16384"),
           "U-Net absurd channel count refused (%s)", err.msg);
    /* within the reader's old ranges but beyond the U-Net forward's limits (unet.h): refused
     * by the reader, naming the file, not after the weights of such a model were allocated */
    p = write_json("unet_lpb.json", "{\"layers_per_block\": 9, \"block_out_channels\": [32], "
                                    "\"down_block_types\": [\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 &&
               strstr(err.msg, "unet_lpb.json: 'layers_per_block' = 9 is outside 1 to 8"),
           "U-Net layers_per_block beyond the forward's limit refused (%s)", err.msg);
    p = write_json("unet_temb.json", "{\"block_out_channels\": [8192], \"down_block_types\": "
                                     "[\"DownBlock2D\"], \"up_block_types\": [\"UpBlock2D\"]}");
    tap_ok(sd_unet_config_load(p, &u, &err) != 0 &&
               strstr(err.msg, "unet_temb.json: 'block_out_channels[0]' = 8192 is outside 1 to 4096"),
           "U-Net time embedding wider than the forward's limit refused (%s)", err.msg);
    {
        /* fp32 parameters past the node's memory: a clear error before the allocation */
        sd_param_table big;
        memset(&big, 0, sizeof big);
        big.total_floats = (size_t)1 << 60;
        tap_ok(sd_weights_check_size(&big, "huge.json", &err) != 0 && strstr(err.msg, "huge.json has") &&
                   strstr(err.msg, "more than the"), "parameters past the memory refused (%s)", err.msg);
        big.total_floats = 1000;
        tap_ok(sd_weights_check_size(&big, "small.json", &err) == 0, "small parameter table accepted");
    }
    p = write_json("clip_layers.json", "{\"num_hidden_layers\": 100000}");
    tap_ok(sd_clip_config_load(p, &c, &err) != 0 && strstr(err.msg, "'num_hidden_layers' = 100000"),
           "text encoder absurd layer count refused (%s)", err.msg);
}

static void test_namelist_configs(void)
{
    sd_run_config rc;
    sd_unet_config u;
    sd_vae_config v;
    sd_clip_config c;
    sd_param_table t;
    sd_err err;
    sd_run_config_init(&rc);
    sd_config_apply_set(&rc, "model.block_out_channels=32, 64", 1, &err);
    sd_config_apply_set(&rc, "model.attention_head_dim=8", 2, &err);
    sd_config_apply_set(&rc, "model.cross_attention_dim=64", 3, &err);
    sd_config_apply_set(&rc, "model.text_hidden_size=64", 4, &err);
    sd_config_apply_set(&rc, "model.text_heads=4", 5, &err);
    sd_config_apply_set(&rc, "model.text_layers=2", 6, &err);
    sd_config_apply_set(&rc, "model.vae_block_out_channels=32, 64", 7, &err);
    sd_unet_config_from_namelist(&rc.cfg, &u);
    tap_ok(u.n_levels == 2 && u.heads[1] == 8 && u.down_cross[0] && !u.down_cross[1] && !u.up_cross[0] &&
               u.up_cross[1] && u.cross_attention_dim == 64, "U-Net from the namelist shape keys");
    sd_unet_params(&u, &t);
    tap_ok(sd_param_find(&t, "down_blocks.0.attentions.1.transformer_blocks.0.attn2.to_k.weight") != NULL &&
               sd_param_find(&t, "up_blocks.1.upsamplers.0.conv.weight") == NULL,
           "tiny U-Net table has the expected blocks");
    sd_param_table_free(&t);
    sd_vae_config_from_namelist(&rc.cfg, &v);
    tap_ok(v.n_levels == 2 && v.block_out_channels[1] == 64, "VAE from the namelist");
    sd_clip_config_from_namelist(&rc.cfg, &c);
    tap_ok(c.hidden_size == 64 && c.num_attention_heads == 4 && c.num_hidden_layers == 2 &&
               c.intermediate_size == 256, "text encoder from the namelist");
    sd_run_config_free(&rc);
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sdtrain-models-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    test_sd2_tables(srcdir ? srcdir : ".");
    test_json();
    test_namelist_configs();
    {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
        if (system(cmd) != 0)
            tap_diag("could not remove %s", tmpdir);
    }
    return tap_done();
}
