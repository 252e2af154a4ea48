/* libFuzzer harness: the model configurations of a diffusers snapshot (unet/, vae/ and
 * text_encoder/config.json) and its model_index.json from arbitrary bytes.
 *
 * The input is written to a memfd and read through its /proc name by each of the three loaders.
 * Invariants (include/sdtrain/models.h):
 *   - a refusal names the file;
 *   - an accepted configuration gives a parameter table whose tensors have positive sizes that
 *     are the products of their shapes without overflow, start on SD_PARAM_ALIGN boundaries in
 *     order without overlapping, add up to the table's totals, and have distinct names that
 *     sd_param_find finds;
 *   - an accepted U-Net configuration written back as config.json (sd_unet_config_to_json, as
 *     `sdtool export` does) reads back to the same text;
 *   - the bytes as a snapshot's model_index.json, and as a component folder's config.json, are
 *     refused naming the file, or open a snapshot (then each absent component folder is refused
 *     naming it) or a component folder of a known component.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh modelconfig [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sdtrain/models.h"
#include "sdtrain/snapshot.h"

#define FUZZ_NAME "fuzz_modelconfig"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd_in = -1, fd_back = -1;
static char path_in[64], path_back[64];

static void check_table(const sd_param_table *t)
{
    size_t end = 0, numel = 0;
    fuzz_require(t->n > 0, "a model has parameters", NULL);
    for (size_t i = 0; i < t->n; i++) {
        const sd_param *p = &t->params[i];
        size_t prod = 1;
        fuzz_require(p->ndim >= 1 && p->ndim <= 4, "tensor rank", p->name);
        fuzz_require(memchr(p->name, 0, sizeof p->name) != NULL && p->name[0], "name", p->name);
        for (int d = 0; d < p->ndim; d++) {
            fuzz_require(p->shape[d] > 0, "positive dimensions", p->name);
            fuzz_require(!__builtin_mul_overflow(prod, (size_t)p->shape[d], &prod), "size without overflow",
                    p->name);
        }
        fuzz_require(p->numel == prod, "numel is the product of the shape", p->name);
        fuzz_require(p->offset % SD_PARAM_ALIGN == 0 && p->offset >= end, "aligned, in order", p->name);
        fuzz_require(!__builtin_add_overflow(p->offset, p->numel, &end), "offset without overflow", p->name);
        fuzz_require(!__builtin_add_overflow(numel, p->numel, &numel), "total without overflow", p->name);
    }
    fuzz_require(t->total_numel == numel && t->total_floats >= end, "table totals", NULL);
    if (t->n <= 4096)
        for (size_t i = 0; i < t->n; i++)
            fuzz_require(sd_param_find(t, t->params[i].name) == &t->params[i], "distinct names found",
                    t->params[i].name);
}

static void refused(const sd_err *err)
{
    fuzz_require(strncmp(err->msg, path_in, strlen(path_in)) == 0, "a refusal names the file", err->msg);
}

static char snap[96], comp[96], index_path[128], config_path[128];

static void cleanup(void)
{
    unlink(index_path);
    unlink(config_path);
    rmdir(snap);
    rmdir(comp);
}

/* The same bytes as a snapshot's model_index.json, and as a component folder's config.json. */
static void check_snapshot_files(const uint8_t *data, size_t size)
{
    const char *index = index_path, *config = config_path;
    sd_snapshot s;
    sd_err err;
    if (!snap[0]) {
        fuzz_scratch_dir(snap, sizeof snap, "fuzz-snapshot");
        fuzz_scratch_dir(comp, sizeof comp, "fuzz-component");
        snprintf(index_path, sizeof index_path, "%s/model_index.json", snap);
        snprintf(config_path, sizeof config_path, "%s/config.json", comp);
        atexit(cleanup);
    }
    fuzz_put_file(index, data, size);
    memset(&err, 0, sizeof err);
    if (sd_snapshot_open(&s, snap, &err) == 0) {
        fuzz_require(s.has_model_index && !s.is_component, "a snapshot with its model_index.json", NULL);
        for (int c = 0; c < SD_COMPONENT_COUNT; c++) {
            char dir[256];
            fuzz_require(s.listed[c] == 0 || s.listed[c] == 1, "listed is a flag", NULL);
            /* no component folder exists: each is refused, naming the folder */
            fuzz_require(sd_snapshot_component_dir(&s, (sd_component)c, dir, sizeof dir, &err) != 0 &&
                             strstr(err.msg, snap) != NULL,
                         "a missing component named", err.msg);
        }
        sd_snapshot_close(&s);
    } else {
        fuzz_require(strstr(err.msg, index) != NULL, "a refused model_index.json is named", err.msg);
    }
    fuzz_put_file(config, data, size);
    memset(&err, 0, sizeof err);
    if (sd_snapshot_open(&s, comp, &err) == 0) {
        fuzz_require(s.is_component && (unsigned)s.component < SD_COMPONENT_COUNT,
                     "a component folder of a known component", NULL);
        sd_snapshot_close(&s);
    } else {
        fuzz_require(strstr(err.msg, config) != NULL, "a refused config.json is named", err.msg);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_unet_config u;
    sd_vae_config v;
    sd_clip_config c;
    sd_param_table t;
    sd_err err;

    if (fd_in < 0) {
        fd_in = fuzz_memfd("config.json", path_in, sizeof path_in);
        fd_back = fuzz_memfd("written.json", path_back, sizeof path_back);
    }
    fuzz_put_fd(fd_in, data, size);

    memset(&err, 0, sizeof err);
    if (sd_unet_config_load(path_in, &u, &err) == 0) {
        char *json = sd_unet_config_to_json(&u), *again;
        sd_unet_config u2;
        memset(&t, 0, sizeof t);
        sd_unet_params(&u, &t);
        check_table(&t);
        sd_param_table_free(&t);
        fuzz_require(json != NULL, "the configuration is written", NULL);
        fuzz_put_fd(fd_back, json, strlen(json));
        fuzz_require(sd_unet_config_load(path_back, &u2, &err) == 0, "the written config.json reads back",
                err.msg);
        again = sd_unet_config_to_json(&u2);
        if (strcmp(json, again) != 0) {
            fprintf(stderr, "--- written\n%s\n--- read back and written again\n%s\n", json, again);
            fuzz_require(0, "the U-Net configuration survives writing and reading", NULL);
        }
        free(json);
        free(again);
    } else {
        refused(&err);
    }

    memset(&err, 0, sizeof err);
    if (sd_vae_config_load(path_in, &v, &err) == 0) {
        memset(&t, 0, sizeof t);
        sd_vae_params(&v, &t);
        check_table(&t);
        sd_param_table_free(&t);
    } else {
        refused(&err);
    }

    memset(&err, 0, sizeof err);
    if (sd_clip_config_load(path_in, &c, &err) == 0) {
        memset(&t, 0, sizeof t);
        sd_clip_params(&c, &t);
        check_table(&t);
        sd_param_table_free(&t);
    } else {
        refused(&err);
    }

    check_snapshot_files(data, size);
    return 0;
}
