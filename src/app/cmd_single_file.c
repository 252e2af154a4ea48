/* sdtool single-file: a diffusers snapshot (a pretrained one, or what `sdtool export` wrote) as
 * one checkpoint in the original Stable Diffusion layout (doc/export.md "One file"). */
#include "sd_config.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "sdtrain/commands.h"
#include "sdtrain/error.h"
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
            "  --force         replace an existing FILE\n"
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

    for (int i = 1; i < argc; i++) {
        const char **slot = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            single_file_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--snapshot")) {
            slot = &snapshot;
        } else if (!strcmp(argv[i], "--out")) {
            slot = &out;
        } else if (!strcmp(argv[i], "--dtype")) {
            slot = &dtype_name;
        } else {
            fprintf(stderr, "sdtool single-file: unknown argument '%s'\n", argv[i]);
            single_file_usage(stderr);
            return SD_EXIT_USAGE;
        }
        if (slot) {
            if (i + 1 >= argc || !argv[i + 1][0]) {
                fprintf(stderr, "sdtool single-file: %s needs a value\n", argv[i]);
                return SD_EXIT_USAGE;
            }
            *slot = argv[++i];
        }
    }
    if (!snapshot || !out) {
        fprintf(stderr, "sdtool single-file: --snapshot and --out are required\n");
        single_file_usage(stderr);
        return SD_EXIT_USAGE;
    }
    if (sd_st_dtype_from_name(dtype_name, &dtype) != 0 ||
        (dtype != SD_ST_F32 && dtype != SD_ST_F16 && dtype != SD_ST_BF16)) {
        fprintf(stderr, "sdtool single-file: --dtype %s: expected F32, F16 or BF16\n", dtype_name);
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
