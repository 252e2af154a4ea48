/* sdtool's --device / --precision: one backend per command, and host <-> backend moves; the
 * commands' option parsing. */
#include "sdtrain/cmd_backend.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

int sd_cmd_backend_open(const char *device, int gpu, const char *precision, sd_cmd_backend *out,
                        sd_err *err)
{
    sd_dtype dtype = SD_F32;
    memset(out, 0, sizeof *out);
    if (!device)
        device = "cpu";
    if (!precision)
        precision = "fp32";
    if (!strcmp(precision, "bf16"))
        dtype = SD_BF16;
    else if (strcmp(precision, "fp32"))
        return sd_err_set(err, "--precision '%s': expected fp32 or bf16", precision);
    if (!strcmp(device, "cpu")) {
        if (dtype != SD_F32)
            return sd_err_set(err, "--precision bf16 needs --device cuda (the CPU backend "
                                   "computes in fp32)");
        out->be = sd_backend_cpu();
        out->host = 1;
        return 0;
    }
    if (strcmp(device, "cuda"))
        return sd_err_set(err, "--device '%s': expected cpu or cuda", device);
    if (sd_backend_cuda_create(gpu, dtype, &out->owned, err))
        return -1;
    out->be = out->owned;
    return 0;
}

void sd_cmd_backend_close(sd_cmd_backend *b)
{
    if (b->owned)
        sd_backend_cuda_destroy(b->owned);
    memset(b, 0, sizeof *b);
}

void *sd_cmd_alloc(const sd_cmd_backend *b, size_t bytes)
{
    if (b->host)
        return malloc(bytes ? bytes : 1);
    return sd_backend_alloc(b->be, bytes);
}

void *sd_cmd_put(const sd_cmd_backend *b, const float *host, int64_t n)
{
    void *d;
    if (b->host)
        return (void *)host;
    d = sd_backend_alloc(b->be, (size_t)(n > 0 ? n : 1) * sd_dtype_size(b->be->dtype));
    if (d && n)
        sd_upload_f32(b->be, d, host, n);
    return d;
}

void sd_cmd_release(const sd_cmd_backend *b, void *p, const void *host_src)
{
    if (!p || p == host_src)
        return;
    if (b->host)
        free(p);
    else
        sd_backend_free(b->be, p);
}

float *sd_cmd_get(const sd_cmd_backend *b, const void *x, int64_t n)
{
    float *h = sd_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *h);
    sd_synchronize(b->be);
    if (b->host)
        memcpy(h, x, (size_t)n * sizeof *h);
    else if (n)
        sd_download_f32(b->be, h, x, n);
    return h;
}

int sd_cmd_arena(const sd_cmd_backend *b, size_t bytes, sd_arena *a)
{
    void *base;
    if (b->host)
        return sd_arena_init(a, bytes, 0);
    base = sd_backend_alloc(b->be, bytes ? bytes : 256);
    if (!base)
        return -1;
    if (sd_arena_init_external(a, base, bytes, 0)) {
        sd_backend_free(b->be, base);
        return -1;
    }
    return 0;
}

void sd_cmd_arena_free(const sd_cmd_backend *b, sd_arena *a)
{
    if (!b->host && a->base)
        sd_backend_free(b->be, a->base);
    sd_arena_free(a);
}

int sd_cmd_parse_opts(int argc, char **argv, const char *cmd, const sd_cmd_opt *opts, int n,
                      sd_err *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const sd_cmd_opt *o = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        for (int k = 0; k < n && !o; k++)
            if (!strcmp(a, opts[k].name))
                o = &opts[k];
        if (!o)
            return sd_err_set(err, "unknown argument '%s' (see sdtool %s --help)", a, cmd);
        if (o->num && o->lo == 0 && o->hi == 0) {
            *o->num = 1;
            continue;
        }
        if (i + 1 >= argc)
            return sd_err_set(err, "%s needs a value (see sdtool %s --help)", a, cmd);
        i++;
        if (o->str) {
            *o->str = argv[i];
        } else {
            char *end;
            long v;
            errno = 0;
            v = strtol(argv[i], &end, 10);
            if (errno || *end || end == argv[i] || v < o->lo || v > o->hi)
                return sd_err_set(err, "%s '%s': expected a whole number from %d to %d", a,
                                  argv[i], o->lo, o->hi);
            *o->num = (int)v;
        }
    }
    return 0;
}
