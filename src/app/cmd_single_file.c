/* sdtool single-file: a diffusers snapshot (a pretrained one, or what `sdtool export` wrote) as
 * one checkpoint in the original Stable Diffusion layout, and sdtool import-single-file, the way
 * back (doc/export.md "One file"). */
#include "sd_config.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/cmd_backend.h"
#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/single_file.h"

static void single_file_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool single-file --snapshot DIR --out FILE.safetensors [--dtype T] [--force]\n"
            "\n"
            "Writes the U-Net, VAE and text encoder of a diffusers snapshot as one safetensors\n"
            "file with the original (CompVis / LDM) key names: model.diffusion_model.*,\n"
            "first_stage_model.* and cond_stage_model.model.* (SD 2's OpenCLIP text encoder,\n"
            "q/k/v fused into in_proj) or cond_stage_model.transformer.* (SD 1's CLIP): the\n"
            "layout of the original checkpoints, which diffusers' from_single_file reads.\n"
            "\n"
            "  --snapshot DIR  a snapshot folder: unet/, vae/, text_encoder/ with config.json\n"
            "                  (e.g. what `sdtool export` wrote)\n"
            "  --out FILE      the file to write (atomically: a temporary name, then a rename)\n"
            "  --dtype T       F32 (default), F16 or BF16: every tensor in that type\n"
            "  --force         replace an existing FILE (never one inside DIR)\n"
            "\n"
            "exit status: 0 done, 1 FILE cannot be written, 2 bad usage or input.\n");
}

int sd_cmd_single_file(int argc, char **argv)
{
    const char *snapshot = NULL, *out = NULL, *dtype_name = "F32";
    int force = 0;
    sd_st_dtype dtype;
    sd_err err;
    sd_single_file_info info;
    struct stat st;

    const sd_cmd_opt opts[] = {
        {"--force", NULL, &force, 0, 0},
        {"--snapshot", &snapshot, NULL, 0, 0},
        {"--out", &out, NULL, 0, 0},
        {"--dtype", &dtype_name, NULL, 0, 0},
    };
    const int parsed = sd_cmd_parse_opts(argc, argv, "single-file", opts,
                                         (int)(sizeof opts / sizeof opts[0]), &err);
    if (parsed == 1) {
        single_file_usage(stdout);
        return SD_EXIT_OK;
    }
    if (parsed < 0) {
        fprintf(stderr, "sdtool single-file: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    if (!snapshot || !out || !snapshot[0] || !out[0]) {
        fprintf(stderr, "sdtool single-file: --snapshot and --out are required\n");
        single_file_usage(stderr);
        return SD_EXIT_USAGE;
    }
    if (sd_st_dtype_from_name(dtype_name, &dtype) != 0 ||
        (dtype != SD_ST_F32 && dtype != SD_ST_F16 && dtype != SD_ST_BF16)) {
        fprintf(stderr, "sdtool single-file: --dtype %s: expected F32, F16 or BF16\n", dtype_name);
        return SD_EXIT_USAGE;
    }
    /* with --force a file of the snapshot (its unet weights) would be replaced by what is
     * written from it; export --single-file refuses the same */
    if (sd_path_within(out, snapshot)) {
        fprintf(stderr, "sdtool single-file: --out %s lies in the snapshot %s that it is written "
                        "from: give a file outside it\n", out, snapshot);
        return SD_EXIT_USAGE;
    }
    if (stat(out, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, "sdtool single-file: %s is a directory (--out names a file)\n", out);
            return SD_EXIT_USAGE;
        }
        if (!force) {
            fprintf(stderr, "sdtool single-file: %s already exists (give --force to replace it)\n",
                    out);
            return SD_EXIT_USAGE;
        }
    }
    char note[4200];
    snprintf(note, sizeof note, "written by sdtool single-file from the snapshot %s", snapshot);
    int rc = sd_single_file_write(snapshot, out, dtype, note, &info, &err);
    if (rc) {
        fprintf(stderr, "sdtool single-file: %s\n", err.msg);
        return rc == -2 ? SD_EXIT_FAILURE : SD_EXIT_USAGE;
    }
    printf("wrote %s (%s): unet %zu tensors (%zu parameters), vae %zu (%zu), text encoder %zu "
           "(%zu, %s)\n",
           out, sd_st_dtype_name(dtype), info.tensors[0], info.numel[0], info.tensors[1],
           info.numel[1], info.tensors[2], info.numel[2],
           info.open_clip ? "OpenCLIP names, q/k/v fused" : "CLIP names");
    return SD_EXIT_OK;
}

/* ---- sdtool import-single-file ------------------------------------------------------------- */

static void import_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool import-single-file --file FILE.safetensors --config SNAPSHOT --out DIR\n"
            "                                 [--ema] [--force]\n"
            "\n"
            "Writes a checkpoint in the original (CompVis / LDM) layout, e.g. one that\n"
            "`sdtool single-file` wrote or v2-1_512-ema-pruned.safetensors, as a diffusers\n"
            "snapshot that &model pretrained, &sample checkpoint and diffusers read.\n"
            "\n"
            "  --file FILE      the single file (safetensors; a pickled .ckpt must be converted\n"
            "                   to safetensors first)\n"
            "  --config SNAP    a diffusers snapshot of the same model: its unet/, vae/ and\n"
            "                   text_encoder/ config.json describe the file; its other parts\n"
            "                   (model_index.json, scheduler/, tokenizer/, ...) are copied\n"
            "  --out DIR        the snapshot to write (built in DIR.tmp, then renamed); not\n"
            "                   FILE or SNAP nor a folder holding them\n"
            "  --ema            the U-Net from the file's EMA copy (model_ema.*)\n"
            "  --force          replace an existing DIR\n"
            "\n"
            "exit status: 0 done, 1 DIR cannot be written, 2 bad usage or input.\n");
}

/* DIR.tmp: the config snapshot's other parts, the three components' config.json and the
 * weights read from the file (F32, diffusers names). */
static int write_imported(const char *tmp, const char *config, sd_single_file_models *m,
                          sd_err *err)
{
    static const char *const comp[3] = {"unet", "vae", "text_encoder"};
    static const char *const weights[3] = {"diffusion_pytorch_model.safetensors",
                                           "diffusion_pytorch_model.safetensors",
                                           "model.safetensors"};
    char a[4400], b[4400];
    if (sd_remove_tree(tmp, err) || sd_mkdir_p(tmp, "directory", err))
        return -1;
    DIR *d = opendir(config);
    if (!d)
        return sd_err_set(err, "cannot read folder '%s': %s", config, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "unet") ||
            !strcmp(e->d_name, "vae") || !strcmp(e->d_name, "text_encoder"))
            continue;
        if (snprintf(a, sizeof a, "%s/%s", config, e->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", tmp, e->d_name) >= (int)sizeof b)
            rc = sd_err_set(err, "path too long under %s", config);
        else
            rc = sd_copy_tree(a, b, err);
    }
    closedir(d);
    for (int c = 0; c < 3 && !rc; c++) {
        snprintf(b, sizeof b, "%s/%s", tmp, comp[c]);
        if ((rc = sd_mkdir_p(b, "directory", err)) != 0)
            break;
        snprintf(a, sizeof a, "%s/%s/config.json", config, comp[c]);
        snprintf(b, sizeof b, "%s/%s/config.json", tmp, comp[c]);
        if ((rc = sd_copy_tree(a, b, err)) != 0)
            break;
        snprintf(b, sizeof b, "%s/%s/%s", tmp, comp[c], weights[c]);
        rc = sd_weights_save_torch(&m->w[c].table, m->w[c].data, b, err);
    }
    if (!rc)
        rc = sd_fsync_path(tmp, err);
    return rc;
}

int sd_cmd_import_single_file(int argc, char **argv)
{
    const char *file = NULL, *config = NULL, *out = NULL;
    int ema = 0, force = 0, code;
    sd_err err;
    sd_single_file_models m;
    char tmp[4200], notes[512];
    struct stat st;

    const sd_cmd_opt opts[] = {
        {"--ema", NULL, &ema, 0, 0},
        {"--force", NULL, &force, 0, 0},
        {"--file", &file, NULL, 0, 0},
        {"--config", &config, NULL, 0, 0},
        {"--out", &out, NULL, 0, 0},
    };
    const int parsed = sd_cmd_parse_opts(argc, argv, "import-single-file", opts,
                                         (int)(sizeof opts / sizeof opts[0]), &err);
    if (parsed == 1) {
        import_usage(stdout);
        return SD_EXIT_OK;
    }
    if (parsed < 0) {
        fprintf(stderr, "sdtool import-single-file: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    if (!file || !config || !out || !file[0] || !config[0] || !out[0]) {
        fprintf(stderr, "sdtool import-single-file: --file, --config and --out are required\n");
        import_usage(stderr);
        return SD_EXIT_USAGE;
    }
    {
        size_t n = strlen(out);
        while (n > 1 && out[n - 1] == '/')
            n--;
        if (snprintf(tmp, sizeof tmp, "%.*s.tmp", (int)n, out) >= (int)sizeof tmp) {
            fprintf(stderr, "sdtool import-single-file: --out path too long\n");
            return SD_EXIT_USAGE;
        }
    }
    /* DIR.tmp is removed and DIR replaced: neither may be or hold what is read (as for export) */
    {
        const char *inputs[2] = {file, config};
        for (int i = 0; i < 2; i++)
            if (sd_path_within(inputs[i], out) || sd_path_within(inputs[i], tmp)) {
                fprintf(stderr, "sdtool import-single-file: --out %s would replace %s %s (or a "
                                "folder holding it): give another folder\n", out,
                        i ? "--config" : "--file", inputs[i]);
                return SD_EXIT_USAGE;
            }
    }
    if (stat(out, &st) == 0 && !force) {
        fprintf(stderr, "sdtool import-single-file: %s already exists (give --force to replace "
                        "it)\n", out);
        return SD_EXIT_USAGE;
    }
    if (sd_single_file_read(file, config, ema, &m, notes, sizeof notes, &err)) {
        fprintf(stderr, "sdtool import-single-file: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    code = SD_EXIT_FAILURE;
    if (write_imported(tmp, config, &m, &err))
        goto fail;
    if (sd_commit_dir(tmp, out, "sdtool import-single-file", &err))
        goto fail;
    printf("imported %s\n  to %s: unet %zu tensors, vae %zu, text encoder %zu (configs and other "
           "parts from %s); %s\n",
           file, out, m.w[0].table.n, m.w[1].table.n, m.w[2].table.n, config, notes);
    sd_single_file_models_free(&m);
    return SD_EXIT_OK;
fail:
    fprintf(stderr, "sdtool import-single-file: %s\n", err.msg);
    if (err.input) /* a part of the configuration snapshot is at fault, not DIR */
        code = SD_EXIT_USAGE;
    {
        sd_err e2;
        sd_remove_tree(tmp, &e2);
    }
    sd_single_file_models_free(&m);
    return code;
}
