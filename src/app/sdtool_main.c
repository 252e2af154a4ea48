/* sdtool: single-process utilities around sdtrain (no MPI launcher needed). */
#include "sd_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/commands.h"
#include "sdtrain/config.h"
#include "sdtrain/device.h"
#include "sdtrain/error.h"
#include "sdtrain/version.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const char *pending; /* not NULL: not implemented yet, and what it waits for */
} subcommand;

static int cmd_namelist_doc(int argc, char **argv)
{
    const char *out = NULL;
    char *md;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: sdtool namelist-doc [--out FILE]\n"
                   "\n"
                   "Writes the namelist reference (Markdown, doc/namelist.md) generated from the schema,\n"
                   "to FILE or stdout.\n"
                   "\n"
                   "exit status: 0 written, 1 FILE cannot be written, 2 bad usage.\n");
            return SD_EXIT_OK;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else {
            fprintf(stderr, "sdtool namelist-doc: unknown argument '%s' (usage: sdtool namelist-doc [--out FILE])\n",
                    argv[i]);
            return SD_EXIT_USAGE;
        }
    }
    md = sd_config_reference_markdown();
    if (out) {
        FILE *f = fopen(out, "w");
        if (!f || fputs(md, f) < 0 || fclose(f) != 0) {
            fprintf(stderr, "sdtool namelist-doc: cannot write '%s': %s\n", out, strerror(errno));
            free(md);
            return SD_EXIT_FAILURE;
        }
    } else {
        fputs(md, stdout);
    }
    free(md);
    return SD_EXIT_OK;
}

static int cmd_device(int argc, char **argv)
{
    sd_device_info d;
    sd_err err;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: sdtool device\n"
                   "\n"
                   "Shows the features compiled in and the GPUs this process can use.\n"
                   "\n"
                   "exit status: 0 a GPU is usable, 1 none (the reason is printed), 2 bad usage.\n");
            return SD_EXIT_OK;
        }
        fprintf(stderr, "sdtool device: unknown argument '%s' (usage: sdtool device)\n", argv[i]);
        return SD_EXIT_USAGE;
    }
    printf("build: %s\n", sd_build_features());
    if (sd_device_resolve("auto", 0, &d, &err) != 0) {
        printf("gpus: error: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    if (!d.use_cuda) {
        printf("gpus: 0 (%s)\n", d.notice);
        return SD_EXIT_FAILURE; /* scripts read this as "no GPU" */
    }
    printf("gpus: %d, device 0: %s\n", d.n_devices, d.name);
#if defined(SD_HAVE_CUDA)
    {
        char v[256];
        sd_cuda_runtime_versions(v, sizeof v);
        printf("runtime: %s\n", v);
    }
#endif
    return SD_EXIT_OK;
}

static const subcommand commands[] = {
    {"tokenize", sd_cmd_tokenize, "print the 77 CLIP token ids of a caption", NULL},
    {"transform", sd_cmd_transform, "run the preprocessing image path on one file and write the 8-bit result",
     NULL},
    {"inspect", sd_cmd_inspect, "describe a latent shard, a shard directory or any HDF5 file", NULL},
    {"forward", sd_cmd_forward, "run one model module of a snapshot on named input tensors", NULL},
    {"grad", sd_cmd_grad, "loss and every U-Net parameter gradient for one batch", NULL},
    {"export", sd_cmd_export, "export a checkpoint or a training output as a diffusers snapshot",
     NULL},
    {"single-file", sd_cmd_single_file,
     "write a diffusers snapshot as one checkpoint in the original SD layout", NULL},
    {"import-single-file", sd_cmd_import_single_file,
     "write a checkpoint in the original SD layout as a diffusers snapshot", NULL},
    {"make-demo-data", sd_cmd_make_demo_data, "write a small synthetic captioned image dataset", NULL},
    {"filter", sd_cmd_filter, "count what a &data filter would keep of a dataset, by its .json metadata",
     NULL},
    {"plot", sd_cmd_plot, "plot metrics.jsonl curves as a PNG, or summarize them as text (--text)",
     NULL},
    {"score-demo", sd_cmd_score_demo,
     "score generated images against their demo captions (colours, shape; with chance levels)", NULL},
    {"namelist-doc", cmd_namelist_doc, "write the namelist reference (doc/namelist.md) from the schema", NULL},
    {"device", cmd_device, "show the build's features and the GPUs this process can use (exit 1: none)", NULL},
};

static void print_help(void)
{
    printf("usage: sdtool COMMAND [ARGS...]\n       sdtool --help | --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        printf("  %-15s %s%s\n", commands[i].name, commands[i].summary,
               commands[i].pending ? " [not implemented yet]" : "");
    printf("\nexit status: 0 success, 1 failure, 2 bad usage, 3 not implemented in this build.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_help();
        return SD_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_help();
        return SD_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        sd_print_version("sdtool");
        return SD_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const subcommand *c = &commands[i];
        if (strcmp(argv[1], c->name) != 0)
            continue;
        if (!c->run) {
            fprintf(stderr, "sdtool %s: not implemented in this build yet; it comes with %s\n", c->name,
                    c->pending);
            return SD_EXIT_NOT_IMPLEMENTED;
        }
        return c->run(argc - 1, argv + 1);
    }
    fprintf(stderr, "sdtool: unknown command '%s' (see sdtool --help)\n", argv[1]);
    return SD_EXIT_USAGE;
}
