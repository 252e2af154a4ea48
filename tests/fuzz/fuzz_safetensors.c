/* libFuzzer harness: safetensors files, shard indexes and writer names from arbitrary bytes.
 *
 * Each input is tried two ways:
 *   1. as a .safetensors file, through the real open path (a memfd opened by its /proc name, so
 *      open/fstat/mmap run as for a file on disk). When it opens, the harness touches every byte
 *      of every tensor, converts what converts, checks the layout invariants the reader promises
 *      (tensors tile the data buffer exactly, lookups find each tensor), then writes all tensors
 *      and the metadata back with the writer and requires the reopened copy to be identical;
 *   2. as a *.safetensors.index.json in a folder that holds one valid shard, "a.safetensors"
 *      (tensors "t" and "u"), so inputs that name it can get past the shard checks;
 *   3. as up to 16 tensor names and one metadata entry for the writer (split at '\n' and NUL):
 *      whatever the writer accepts must read back with exactly these names and strings, which
 *      checks its JSON escaping against json-c's decoding.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh safetensors [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sdtrain/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char memfd_path[64];
static char work[256];

static void require(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_safetensors: invariant broken: %s\n", what);
        abort();
    }
}

static void cleanup(void)
{
    char p[512];
    static const char *const names[] = {"a.safetensors", "x.safetensors.index.json",
                                        "rt.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", work, names[i]);
        unlink(p);
    }
    rmdir(work);
}

static void setup(void)
{
    sd_err err;
    memfd = memfd_create("fuzz_safetensors", MFD_CLOEXEC);
    require(memfd >= 0, "memfd_create");
    snprintf(memfd_path, sizeof memfd_path, "/proc/self/fd/%d", memfd);
    /* tmpfs when there is one: the writer's fsyncs then cost nothing. */
    snprintf(work, sizeof work, "%s/fuzz-st-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    require(mkdtemp(work) != NULL, "mkdtemp");
    atexit(cleanup);

    char p[512];
    float t[2] = {1.0f, 2.0f};
    uint16_t u = 0x3c00;
    int64_t s2 = 2;
    sd_st_writer *w = sd_st_writer_new();
    require(sd_st_writer_add(w, "t", SD_ST_F32, 1, &s2, t, sizeof t, &err) == 0, "add t");
    require(sd_st_writer_add(w, "u", SD_ST_F16, 0, NULL, &u, sizeof u, &err) == 0, "add u");
    snprintf(p, sizeof p, "%s/a.safetensors", work);
    require(sd_st_writer_write(w, p, &err) == 0, "write the shard");
    sd_st_writer_free(w);
}

static void put_bytes(int fd, const uint8_t *data, size_t size)
{
    require(ftruncate(fd, 0) == 0, "ftruncate");
    size_t done = 0;
    while (done < size) {
        ssize_t r = pwrite(fd, data + done, size - done, (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        require(r > 0, "pwrite");
        done += (size_t)r;
    }
}

static int same_tensor(const sd_st_tensor *a, const sd_st_tensor *b)
{
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->numel != b->numel || a->nbytes != b->nbytes)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d])
            return 0;
    return a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0;
}

static void exercise_file(const sd_st_file *f)
{
    sd_err err;
    uint64_t pos = 8 + f->header_len;
    for (size_t i = 0; i < sd_st_count(f); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(f, i);
        require(t->file_offset == pos, "tensors tile the data buffer");
        pos += t->nbytes;
        require(sd_st_find(f, t->name) == t, "find returns the tensor");
        require(strlen(t->name) < f->header_len, "name lies within the header");
        unsigned char *copy = malloc(t->nbytes ? t->nbytes : 1);
        require(sd_st_tensor_read_raw(t, copy, t->nbytes, &err) == 0, "read_raw");
        require(t->nbytes == 0 || memcmp(copy, t->data, t->nbytes) == 0, "read_raw copies");
        free(copy);
        size_t n = (size_t)t->numel;
        if (n <= (1u << 20)) {
            float *buf = malloc((n ? n : 1) * sizeof *buf);
            int rc = sd_st_tensor_read_f32(t, buf, n, &err);
            require(rc == 0 || (t->dtype != SD_ST_F32 && t->dtype != SD_ST_F16 &&
                                t->dtype != SD_ST_BF16 && t->dtype != SD_ST_F64),
                    "float dtypes convert");
            free(buf);
        }
    }
    require(pos == f->size, "tensors end at the end of the file");
    for (size_t i = 0; i < sd_st_metadata_count(f); i++) {
        const sd_st_meta *m = sd_st_metadata_at(f, i);
        require(sd_st_metadata(f, m->key) == m->value, "metadata lookup");
    }

    /* Whatever the reader accepts, the writer must write and the reader read back the same. */
    char p[512];
    snprintf(p, sizeof p, "%s/rt.safetensors", work);
    sd_st_writer *w = sd_st_writer_new();
    for (size_t i = 0; i < sd_st_count(f); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(f, i);
        require(sd_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes,
                                 &err) == 0, err.msg);
    }
    for (size_t i = 0; i < sd_st_metadata_count(f); i++) {
        const sd_st_meta *m = sd_st_metadata_at(f, i);
        require(sd_st_writer_set_metadata(w, m->key, m->value, &err) == 0, err.msg);
    }
    require(sd_st_writer_write(w, p, &err) == 0, err.msg);
    sd_st_writer_free(w);
    sd_st_file g;
    require(sd_st_open(p, &g, &err) == 0, err.msg);
    require(sd_st_count(&g) == sd_st_count(f) &&
                sd_st_metadata_count(&g) == sd_st_metadata_count(f),
            "round trip keeps the counts");
    for (size_t i = 0; i < sd_st_count(f); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(f, i);
        const sd_st_tensor *u = sd_st_find(&g, t->name);
        require(u && same_tensor(t, u), "round trip keeps every tensor");
    }
    for (size_t i = 0; i < sd_st_metadata_count(f); i++) {
        const sd_st_meta *m = sd_st_metadata_at(f, i);
        const char *v = sd_st_metadata(&g, m->key);
        require(v && strcmp(v, m->value) == 0, "round trip keeps the metadata");
    }
    require(g.header_len % 8 == 0, "written header is padded");
    sd_st_close(&g);
}

static void names_round_trip(const uint8_t *data, size_t size)
{
    enum { MAX_NAMES = 16 };
    char *text = malloc(size + 1);
    char *names[MAX_NAMES + 1];
    size_t n = 0;
    memcpy(text, data, size);
    text[size] = '\0';
    for (size_t i = 0, start = 0; i <= size && n <= MAX_NAMES; i++) {
        if (i == size || text[i] == '\n' || text[i] == '\0') {
            text[i] = '\0';
            names[n++] = text + start;
            start = i + 1;
        }
    }
    sd_err err;
    sd_st_writer *w = sd_st_writer_new();
    unsigned char byte[MAX_NAMES];
    int ok = 1;
    size_t n_tensors = n > MAX_NAMES ? MAX_NAMES : n;
    for (size_t i = 0; i < n_tensors && ok; i++) {
        byte[i] = (unsigned char)i;
        ok = sd_st_writer_add(w, names[i], SD_ST_U8, 0, NULL, &byte[i], 1, &err) == 0;
    }
    const char *mkey = names[0], *mval = n > 1 ? names[n - 1] : "";
    ok = ok && sd_st_writer_set_metadata(w, mkey, mval, &err) == 0;
    char p[512];
    snprintf(p, sizeof p, "%s/rt.safetensors", work);
    if (ok) {
        require(sd_st_writer_write(w, p, &err) == 0, err.msg);
        sd_st_file f;
        require(sd_st_open(p, &f, &err) == 0, err.msg);
        require(sd_st_count(&f) == n_tensors, "every written name reads back");
        for (size_t i = 0; i < n_tensors; i++) {
            const sd_st_tensor *t = sd_st_find(&f, names[i]);
            require(t && *(const unsigned char *)t->data == byte[i], "name maps to its data");
        }
        const char *v = sd_st_metadata(&f, mkey);
        require(v && strcmp(v, mval) == 0 && sd_st_metadata_count(&f) == 1, "metadata string");
        sd_st_close(&f);
    }
    sd_st_writer_free(w);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_err err;
    if (memfd < 0)
        setup();

    /* 1. as a safetensors file */
    put_bytes(memfd, data, size);
    sd_st_file f;
    memset(&err, 0, sizeof err);
    if (sd_st_open(memfd_path, &f, &err) == 0) {
        exercise_file(&f);
        sd_st_close(&f);
    } else {
        require(strncmp(err.msg, memfd_path, strlen(memfd_path)) == 0, "message names the file");
        require(f.map == NULL && f.tensors == NULL, "a failed open leaves nothing behind");
    }

    /* 2. as a shard index beside a.safetensors */
    char p[512];
    snprintf(p, sizeof p, "%s/x.safetensors.index.json", work);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    require(fd >= 0, "create the index file");
    put_bytes(fd, data, size);
    close(fd);
    sd_st_set s;
    if (sd_st_set_open_dir(&s, work, "x.safetensors", &err) == 0) {
        require(sd_st_set_count(&s) <= 2, "at most the shard's two tensors");
        for (size_t i = 0; i < sd_st_set_count(&s); i++) {
            const sd_st_tensor *t = sd_st_set_tensor_at(&s, i);
            require(sd_st_set_find(&s, t->name) == t, "set lookup");
        }
        sd_st_set_close(&s);
    } else {
        require(strlen(err.msg) > 0, "a failed index open says why");
    }

    /* 3. as names for the writer */
    names_round_trip(data, size);
    return 0;
}
