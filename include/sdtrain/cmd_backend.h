/* The compute backend of an sdtool command (--device cpu|cuda, --precision fp32|bf16) and the
 * moves of host fp32 data in and out of it. */
#ifndef SDTRAIN_CMD_BACKEND_H
#define SDTRAIN_CMD_BACKEND_H

#include <stdint.h>

#include "sdtrain/arena.h"
#include "sdtrain/error.h"
#include "sdtrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_cmd_backend {
    const sd_backend *be;
    sd_backend *owned; /* a CUDA backend to destroy, or NULL */
    int host;          /* 1: the CPU fp32 backend (host pointers are used in place) */
} sd_cmd_backend;

/* device "cpu" (default when NULL) or "cuda" (CUDA ordinal `gpu`: 0 for sdtool, the node-local
 * choice of sd_device_resolve for sdtrain's ranks); precision "fp32" (default when NULL) or
 * "bf16" (CUDA only). Returns 0, or -1 with a message naming the option. */
int sd_cmd_backend_open(const char *device, int gpu, const char *precision, sd_cmd_backend *out,
                        sd_err *err);
void sd_cmd_backend_close(sd_cmd_backend *b);

/* n host fp32 values as a tensor of the backend (converted to its dtype). On the host backend
 * the host pointer itself is returned (no copy). NULL when device memory runs out. Release
 * with sd_cmd_release. */
void *sd_cmd_put(const sd_cmd_backend *b, const float *host, int64_t n);
/* Backend memory of `bytes` (host: malloc'ed), NULL when it cannot be had. */
void *sd_cmd_alloc(const sd_cmd_backend *b, size_t bytes);
/* Frees what sd_cmd_put / sd_cmd_alloc returned; `host_src` is the host pointer given to
 * sd_cmd_put (so that nothing is freed twice on the host backend), or NULL. */
void sd_cmd_release(const sd_cmd_backend *b, void *p, const void *host_src);
/* n values of a backend tensor as host fp32 (malloc'ed; on the host backend a copy). */
float *sd_cmd_get(const sd_cmd_backend *b, const void *x, int64_t n);

/* An activation arena of `bytes` in the backend's memory (owning on the host; on a GPU over
 * one device allocation that sd_cmd_arena_free releases). Returns 0 or -1. */
int sd_cmd_arena(const sd_cmd_backend *b, size_t bytes, sd_arena *a);
void sd_cmd_arena_free(const sd_cmd_backend *b, sd_arena *a);

/* ---- options of an sdtool command ------------------------------------------------------- */

/* One option: "--name VALUE" into *str, "--name N" (an integer in [lo, hi]) into *num, or a
 * flag "--name" setting *num to 1. Exactly one of str / num is given; lo = hi = 0 marks a flag. */
typedef struct sd_cmd_opt {
    const char *name;
    const char **str;
    int *num;
    int lo, hi;
} sd_cmd_opt;

/* Parses argv[1..] against `opts` (n entries) for "sdtool CMD". Returns 1 for --help / -h (the
 * caller prints its usage), 0 when everything parsed, -1 with a message in err naming the
 * argument ("unknown argument '--x' (see sdtool CMD --help)", "--n needs a value ...",
 * "--n 'v': expected a whole number from lo to hi"). */
int sd_cmd_parse_opts(int argc, char **argv, const char *cmd, const sd_cmd_opt *opts, int n,
                      sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
