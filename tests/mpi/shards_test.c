/* Helper for shards.sh: writes latent shards with known data from any number of ranks, verifies
 * them exactly, hashes their data arrays, and exercises the error paths. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/commands.h"
#include "sdtrain/fault.h"
#include "sdtrain/h5check.h"
#include "sdtrain/log.h"
#include "sdtrain/runtime.h"
#include "sdtrain/shards.h"
#include "tap.h"

/* Small shapes keep the test fast while every code path runs: 16 px -> 2x2 latents, D = 8. */
#define RES 16
#define HS (RES / 8)
#define C2 (2 * SD_SHARD_LATENT_CHANNELS)
#define L SD_SHARD_TEXT_LEN
#define D 8
#define M_EL (C2 * HS * HS)
#define E_EL (L * D)

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* The value of element j of stream `what` of global sample g: a function of (g, what, j) only,
 * so any split over ranks writes the same shard. Mostly values in [-20, 20) with random
 * mantissas (they exercise fp16 rounding), some fp16 subnormals and exact zeros. */
static float value(int64_t g, int what, int64_t j)
{
    uint64_t h = splitmix(((uint64_t)g * 1000003u + (uint64_t)what) * 0x100000001B3ULL ^ (uint64_t)j);
    double u = (double)(h >> 11) / 9007199254740992.0;
    switch (h & 15) {
    case 0: return (float)((u - 0.5) * 1e-6);  /* fp16 subnormal range */
    case 1: return 0.0f;
    default: return (float)((u - 0.5) * 40.0);
    }
}

static int64_t global_id(int64_t shard, int64_t i) { return shard * 1000 + i; }

static int64_t shard_samples(int64_t shard, int64_t n) { return n + shard; }

static void make_caption(int64_t g, char *buf, size_t size)
{
    int reps = (int)(g % 5);
    size_t off;
    if (g % 7 == 3) { /* dropped captions are empty strings */
        buf[0] = '\0';
        return;
    }
    off = (size_t)snprintf(buf, size, "a photo of thing %lld \xc3\xbc", (long long)g);
    for (int r = 0; r < reps && off + 8 < size; r++)
        off += (size_t)snprintf(buf + off, size - off, " \xe2\x9c\x93 long");
}

static void make_key(int64_t g, char *buf, size_t size)
{
    snprintf(buf, size, "%05lld/%09lld", (long long)(g / 1000), (long long)g);
}

/* Rank r's part of n samples: proportional to r + 1, except that `empty_rank` gets none. */
static void split(int64_t n, int size, int rank, int empty_rank, int64_t *lo, int64_t *cnt)
{
    int64_t wsum = 0, wbefore = 0;
    for (int r = 0; r < size; r++) {
        int64_t wr = (r == empty_rank && size > 1) ? 0 : r + 1;
        if (r < rank)
            wbefore += wr;
        wsum += wr;
    }
    {
        int64_t wr = (rank == empty_rank && size > 1) ? 0 : rank + 1;
        *lo = n * wbefore / wsum;
        *cnt = n * (wbefore + wr) / wsum - *lo;
    }
}

static void fill_meta(sd_shard_meta *m, sd_dtype dt)
{
    sd_shard_meta_defaults(m);
    m->resolution = RES;
    m->embed_dim = D;
    m->float_dtype = dt;
    snprintf(m->weights_path, sizeof m->weights_path, "/models/stable-diffusion-2-base");
    snprintf(m->weights_hash, sizeof m->weights_hash, "sha256:0123abcd");
}

static float empty_value(int64_t j) { return value(-1, 9, j); }

typedef struct slice {
    int64_t lo, n;
    float *moments, *emb, *empty;
    int32_t *ids;
    char **caps, **keys;
    sd_shard_batch b;
} slice;

static void make_slice(slice *s, int64_t shard, int64_t lo, int64_t n, sd_latent_layout layout)
{
    memset(s, 0, sizeof *s);
    s->lo = lo;
    s->n = n;
    s->moments = sd_xmalloc((size_t)(n + 1) * M_EL * sizeof(float));
    s->emb = sd_xmalloc((size_t)(n + 1) * E_EL * sizeof(float));
    s->ids = sd_xmalloc((size_t)(n + 1) * L * sizeof(int32_t));
    s->caps = sd_xcalloc((size_t)n + 1, sizeof(char *));
    s->keys = sd_xcalloc((size_t)n + 1, sizeof(char *));
    s->empty = sd_xmalloc(E_EL * sizeof(float));
    for (int64_t j = 0; j < E_EL; j++)
        s->empty[j] = empty_value(j);
    for (int64_t i = 0; i < n; i++) {
        int64_t g = global_id(shard, lo + i);
        char buf[256];
        for (int c = 0; c < C2; c++)
            for (int p = 0; p < HS * HS; p++) {
                float v = value(g, 0, c * HS * HS + p);
                if (layout == SD_LATENT_NCHW)
                    s->moments[i * M_EL + c * HS * HS + p] = v;
                else
                    s->moments[i * M_EL + p * C2 + c] = v;
            }
        for (int64_t j = 0; j < E_EL; j++)
            s->emb[i * E_EL + j] = value(g, 1, j);
        for (int64_t j = 0; j < L; j++)
            s->ids[i * L + j] = (int32_t)((g * 31 + j * 7) % 49408);
        make_caption(g, buf, sizeof buf);
        s->caps[i] = sd_xstrdup(buf);
        make_key(g, buf, sizeof buf);
        s->keys[i] = sd_xstrdup(buf);
    }
    s->b.n = n;
    s->b.layout = layout;
    s->b.moments = s->moments;
    s->b.embeddings = s->emb;
    s->b.ids = s->ids;
    s->b.captions = (const char *const *)s->caps;
    s->b.keys = (const char *const *)s->keys;
}

static void free_slice(slice *s)
{
    for (int64_t i = 0; i < s->n; i++) {
        free(s->caps[i]);
        free(s->keys[i]);
    }
    free(s->caps);
    free(s->keys);
    free(s->moments);
    free(s->emb);
    free(s->ids);
    free(s->empty);
}

static int parse_dtype(const char *s, sd_dtype *dt)
{
    if (!strcmp(s, "f16"))
        *dt = SD_F16;
    else if (!strcmp(s, "f32"))
        *dt = SD_F32;
    else
        return -1;
    return 0;
}

/* write DIR SHARDS N f16|f32 [--empty-rank R] [--nhwc] */
static int cmd_write(int argc, char **argv)
{
    const char *dir = argv[2];
    char *list = sd_xstrdup(argv[3]), *tok, *save = NULL;
    int64_t n = atoll(argv[4]);
    int empty_rank = -1, rank, size, failed = 0;
    sd_latent_layout layout = SD_LATENT_NCHW;
    sd_dtype dt;
    sd_shard_meta meta;
    sd_shard_manifest m;
    sd_err err;
    int64_t committed[64];
    int n_committed = 0;

    if (parse_dtype(argv[5], &dt))
        return 2;
    for (int i = 6; i < argc; i++) {
        if (!strcmp(argv[i], "--empty-rank") && i + 1 < argc)
            empty_rank = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nhwc"))
            layout = SD_LATENT_NHWC;
    }
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    fill_meta(&meta, dt);

    /* Resuming: rank 0 asks the manifest what is committed and tells the others. */
    if (rank == 0) {
        if (sd_shards_committed(dir, &m, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            n_committed = -1;
        } else {
            for (int64_t k = 0; k < m.n && k < 64; k++)
                committed[n_committed++] = m.entries[k].index;
            sd_shard_manifest_free(&m);
        }
    }
    SD_MPI_CHECK(MPI_Bcast(&n_committed, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (n_committed < 0) {
        free(list);
        return 1;
    }
    SD_MPI_CHECK(MPI_Bcast(committed, n_committed, MPI_INT64_T, 0, MPI_COMM_WORLD));

    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t shard = atoll(tok), lo, cnt, skip = 0;
        slice s;
        sd_shard_entry e;
        for (int k = 0; k < n_committed; k++)
            skip |= committed[k] == shard;
        if (skip) {
            if (rank == 0)
                printf("skip shard %lld (committed)\n", (long long)shard);
            continue;
        }
        split(shard_samples(shard, n), size, rank, empty_rank, &lo, &cnt);
        make_slice(&s, shard, lo, cnt, layout);
        if (sd_shard_write(MPI_COMM_WORLD, dir, shard, &meta, s.empty, &s.b, &e, &err)) {
            printf("rank %d error: %s\n", rank, err.msg);
            failed = 1;
        } else if (rank == 0) {
            printf("committed shard %lld: %s, %lld samples, %lld bytes, checksum %016llx\n",
                   (long long)e.index, e.file, (long long)e.samples, (long long)e.bytes,
                   (unsigned long long)e.checksum);
        }
        fflush(stdout);
        free_slice(&s);
        if (failed)
            break;
    }
    free(list);
    return failed;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Expected stored value read back as fp32. */
static float stored(float v, sd_dtype dt)
{
    return dt == SD_F16 ? sd_f16_to_f32(sd_f32_to_f16(v)) : v;
}

/* verify DIR f16|f32 N SHARDS: reads every committed shard back and compares exactly. */
static int cmd_verify(int argc, char **argv)
{
    const char *dir = argv[2];
    int64_t n = atoll(argv[4]);
    char *list = sd_xstrdup(argv[5]), *tok, *save = NULL;
    sd_dtype dt;
    sd_shard_manifest m;
    sd_err err;
    (void)argc;
    if (parse_dtype(argv[3], &dt))
        return 2;
    if (!tap_ok(sd_shards_committed(dir, &m, &err) == 0, "manifest of %s is readable", dir)) {
        tap_diag("%s", err.msg);
        free(list);
        return tap_done();
    }
    for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t shard = atoll(tok), N = shard_samples(shard, n);
        const sd_shard_entry *e = sd_shard_manifest_find(&m, shard);
        const sd_shard_info *in;
        sd_shard *sh;
        slice ref;
        float *got, *want;
        int32_t *ids;
        char *rows;
        uint64_t sum;
        int ok;
        if (!tap_ok(e != NULL, "shard %lld is committed", (long long)shard))
            continue;
        tap_ok(e->samples == N, "manifest: shard %lld has %lld samples (want %lld)", (long long)shard,
               (long long)e->samples, (long long)N);
        if (!tap_ok(sd_shard_open_entry(dir, e, &sh, &err) == 0, "open %s", e->file)) {
            tap_diag("%s", err.msg);
            continue;
        }
        in = sd_shard_get_info(sh);
        tap_ok(in->n_samples == N && in->resolution == RES && in->latent_size == HS &&
                   in->latent_channels == 4 && in->text_len == L && in->embed_dim == D &&
                   in->float_dtype == dt && in->scaling_factor == 0.18215 && in->format_version == 1 &&
                   !strcmp(in->weights_path, "/models/stable-diffusion-2-base") &&
                   !strcmp(in->weights_hash, "sha256:0123abcd") &&
                   !strcmp(in->latents_name, "image_latents_16"),
               "%s: attributes (N %lld, res %d, dtype %s, created %s)", e->file, (long long)in->n_samples,
               in->resolution, sd_dtype_name(in->float_dtype), in->created);
        {
            /* the room check's estimate (sd_shard_data_bytes + 1 % + 1 MiB) bounds the file */
            sd_shard_meta fm;
            fill_meta(&fm, dt);
            const double data = sd_shard_data_bytes(&fm, N, in->caption_width, in->key_width);
            tap_ok(data <= (double)e->bytes && (double)e->bytes <= 1.01 * data + 1048576.0,
                   "%s: %lld bytes, %.0f of data: within the room check's bound", e->file,
                   (long long)e->bytes, data);
        }
        make_slice(&ref, shard, 0, N, SD_LATENT_NCHW);
        got = sd_xmalloc((size_t)N * (M_EL > E_EL ? M_EL : E_EL) * sizeof(float));
        want = sd_xmalloc((size_t)N * (M_EL > E_EL ? M_EL : E_EL) * sizeof(float));

        for (int64_t j = 0; j < N * M_EL; j++)
            want[j] = stored(ref.moments[j], dt);
        ok = sd_shard_read_moments(sh, 0, N, 1, SD_LATENT_NCHW, got, &err) == 0;
        tap_ok(ok && same_bits(got, want, (size_t)N * M_EL), "%s: moments NCHW exact", e->file);
#ifdef __FLT16_MAX__
        if (dt == SD_F16) {
            /* An independent check of round-to-nearest-even: the compiler's own conversion. */
            int rne = 1;
            for (int64_t j = 0; j < N * M_EL; j++) {
                float c = (float)(_Float16)ref.moments[j];
                rne &= memcmp(&c, &got[j], sizeof c) == 0;
            }
            tap_ok(rne, "%s: fp16 values equal the compiler's _Float16 rounding", e->file);
        }
#endif
        /* strided subset, channels-last */
        {
            int64_t start = 1, stride = 3, cnt = (N - 1 + stride - 1) / stride;
            int good;
            ok = sd_shard_read_moments(sh, start, cnt, stride, SD_LATENT_NHWC, got, &err) == 0;
            good = ok;
            for (int64_t i = 0; good && i < cnt; i++)
                for (int c = 0; c < C2; c++)
                    for (int p = 0; p < HS * HS; p++) {
                        float a = got[i * M_EL + p * C2 + c];
                        float b = want[(start + i * stride) * M_EL + c * HS * HS + p];
                        good &= memcmp(&a, &b, sizeof a) == 0;
                    }
            tap_ok(good, "%s: moments NHWC, samples %lld:%lld:%lld exact", e->file, (long long)start,
                   (long long)N, (long long)stride);
        }
        for (int64_t j = 0; j < N * E_EL; j++)
            want[j] = stored(ref.emb[j], dt);
        ok = sd_shard_read_embeddings(sh, 0, N, 1, got, &err) == 0;
        tap_ok(ok && same_bits(got, want, (size_t)N * E_EL), "%s: caption embeddings exact", e->file);
        ok = sd_shard_read_embeddings(sh, N - 1, 1, 5, got, &err) == 0;
        tap_ok(ok && same_bits(got, want + (N - 1) * E_EL, E_EL), "%s: last embedding alone", e->file);
        ids = sd_xmalloc((size_t)N * L * sizeof(int32_t));
        ok = sd_shard_read_ids(sh, 0, N, 1, ids, &err) == 0;
        tap_ok(ok && !memcmp(ids, ref.ids, (size_t)N * L * sizeof(int32_t)), "%s: caption ids exact",
               e->file);
        free(ids);
        rows = sd_xmalloc((size_t)N * 512);
        ok = sd_shard_read_captions(sh, 0, N, 1, rows, 512, &err) == 0;
        for (int64_t i = 0; ok && i < N; i++)
            ok &= !strcmp(rows + i * 512, ref.caps[i]);
        tap_ok(ok, "%s: captions exact (UTF-8, empty ones included; width %zu)", e->file, in->caption_width);
        ok = sd_shard_read_keys(sh, 0, N, 1, rows, 512, &err) == 0;
        for (int64_t i = 0; ok && i < N; i++)
            ok &= !strcmp(rows + i * 512, ref.keys[i]);
        tap_ok(ok, "%s: keys exact", e->file);
        free(rows);
        for (int64_t j = 0; j < E_EL; j++)
            want[j] = stored(ref.empty[j], dt);
        ok = sd_shard_read_empty_embedding(sh, got, &err) == 0;
        tap_ok(ok && same_bits(got, want, E_EL), "%s: empty-caption embedding exact", e->file);
        ok = sd_shard_checksum(sh, &sum, &err) == 0;
        tap_ok(ok && sum == e->checksum, "%s: content checksum %016llx matches the manifest", e->file,
               (unsigned long long)sum);
        /* out-of-range reads are errors naming the file, not crashes */
        ok = sd_shard_read_ids(sh, N - 1, 2, 1, (int32_t *)got, &err) != 0 && strstr(err.msg, e->file) &&
             strstr(err.msg, "caption_ids");
        tap_ok(ok, "%s: reading past the end is an error: %s", e->file, err.msg);
        free(got);
        free(want);
        free_slice(&ref);
        sd_shard_close(sh);
    }
    tap_diag("manifest lists %lld shards, %lld samples", (long long)m.n, (long long)m.total_samples);
    sd_shard_manifest_free(&m);
    free(list);
    return tap_done();
}

/* hash DIR: FNV-1a of every dataset's raw bytes, read with plain HDF5 (not the shard reader). */
static herr_t hash_one(hid_t loc, const char *name, const H5L_info_t *info, void *data)
{
    hid_t d = H5Dopen2(loc, name, H5P_DEFAULT), t = H5Dget_type(d), s = H5Dget_space(d);
    size_t bytes = (size_t)H5Sget_simple_extent_npoints(s) * H5Tget_size(t);
    unsigned char *buf = sd_xmalloc(bytes + 1);
    uint64_t h = 0xcbf29ce484222325ULL;
    (void)info;
    (void)data;
    H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ buf[i]) * 0x100000001b3ULL;
    printf("%s %zu bytes %016llx\n", name, bytes, (unsigned long long)h);
    free(buf);
    H5Sclose(s);
    H5Tclose(t);
    H5Dclose(d);
    return 0;
}

static int cmd_hash(int argc, char **argv)
{
    sd_shard_manifest m;
    sd_err err;
    (void)argc;
    if (sd_shards_committed(argv[2], &m, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    for (int64_t k = 0; k < m.n; k++) {
        char path[8192];
        hid_t f;
        snprintf(path, sizeof path, "%s/%s", argv[2], m.entries[k].file);
        printf("%s samples %lld checksum %016llx\n", m.entries[k].file, (long long)m.entries[k].samples,
               (unsigned long long)m.entries[k].checksum);
        f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (f < 0)
            return 1;
        H5Literate(f, H5_INDEX_NAME, H5_ITER_INC, NULL, hash_one, NULL);
        H5Fclose(f);
    }
    sd_shard_manifest_free(&m);
    return 0;
}

/* committed DIR: the indices a resuming writer would skip. */
static int cmd_committed(int argc, char **argv)
{
    sd_shard_manifest m;
    sd_err err;
    (void)argc;
    if (sd_shards_committed(argv[2], &m, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    printf("committed:");
    for (int64_t k = 0; k < m.n; k++)
        printf(" %lld", (long long)m.entries[k].index);
    printf("\n");
    sd_shard_manifest_free(&m);
    return 0;
}

/* Every rank of the job must report the same error: compares a hash of the message. */
static int all_same(const char *msg)
{
    uint64_t h = 0xcbf29ce484222325ULL, lo, hi;
    for (const char *p = msg; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    h >>= 1;
    {
        int64_t v = (int64_t)h, mn, mx;
        SD_MPI_CHECK(MPI_Allreduce(&v, &mn, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD));
        SD_MPI_CHECK(MPI_Allreduce(&v, &mx, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
        lo = (uint64_t)mn;
        hi = (uint64_t)mx;
    }
    return lo == hi;
}

static int no_temp_files(const char *dir)
{
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "ls -a '%s' 2>/dev/null | grep -q '\\.tmp$'", dir);
    return system(cmd) != 0;
}

/* One failing write: every rank returns -1 with the same message containing `want`. */
static void expect_write_error(const char *what, const char *dir, int64_t index, const sd_shard_meta *meta,
                               const slice *s, const char *want, int check_tmp)
{
    sd_err err;
    int rank, rc = sd_shard_write(MPI_COMM_WORLD, dir, index, meta, s->empty, &s->b, NULL, &err);
    int fail_all, failed = rc != 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    SD_MPI_CHECK(MPI_Allreduce(&failed, &fail_all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
    failed = all_same(rc ? err.msg : "");
    if (rank == 0) {
        tap_ok(fail_all && failed && strstr(err.msg, want) != NULL, "%s: every rank fails with '%s'", what,
               want);
        tap_diag("message: %s", rc ? err.msg : "(none)");
        if (check_tmp)
            tap_ok(no_temp_files(dir), "%s: no temporary file left in %s", what, dir);
    }
}

/* errors DIR: the failure paths, each on every rank at once, none hanging. */
static int cmd_errors(int argc, char **argv)
{
    const char *dir = argv[2];
    char d1[4096], d2[4096], d3[4096], path[8192];
    int rank, size;
    sd_shard_meta meta, other;
    slice s;
    int64_t lo, cnt;
    sd_err err;
    (void)argc;
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    snprintf(d1, sizeof d1, "%s/ok", dir);
    snprintf(d2, sizeof d2, "%s/corrupt", dir);
    fill_meta(&meta, SD_F16);
    split(6, size, rank, -1, &lo, &cnt);
    make_slice(&s, 0, lo, cnt, SD_LATENT_NCHW);

    if (rank == 0) { /* what mode 'process' drops before writing: values not finite as stored */
        const float fine[] = {0.0f, -65504.0f, 65519.99f, 1e-30f}, big[] = {1.0f, 65520.0f};
        const float nan[] = {1.0f, NAN}, inf[] = {-INFINITY}, huge[] = {3e38f};
        tap_ok(sd_shard_storable(fine, 4, SD_F16) && !sd_shard_storable(big, 2, SD_F16) &&
                   !sd_shard_storable(nan, 2, SD_F16) && !sd_shard_storable(inf, 1, SD_F16) &&
                   sd_shard_storable(huge, 1, SD_F32) && !sd_shard_storable(nan, 2, SD_F32) &&
                   !sd_shard_storable(inf, 1, SD_F32) && sd_shard_storable(nan, 0, SD_F16),
               "storable: fp16 below 65520 (what RNE keeps finite), fp32 finite, never NaN");
    }

    {
        sd_shard_entry e;
        int rc = sd_shard_write(MPI_COMM_WORLD, d1, 0, &meta, s.empty, &s.b, &e, &err);
        if (rank == 0)
            tap_ok(rc == 0 && e.samples == 6, "a good shard commits");
    }
    expect_write_error("committed shard", d1, 0, &meta, &s, "is already committed", 1);

    other = meta;
    if (rank == size - 1)
        other.resolution = 32;
    if (size > 1)
        expect_write_error("metadata differs across ranks", d1, 1, &other, &s, "different shard metadata", 1);
    other = meta;
    other.resolution = 12;
    expect_write_error("bad resolution", d1, 1, &other, &s, "resolution 12 is not a positive multiple of 8",
                       1);
    other = meta;
    other.float_dtype = SD_BF16;
    expect_write_error("bf16 storage", d1, 1, &other, &s, "F16 or F32, not BF16", 1);

    {
        /* bad UTF-8 on the last rank only: the others learn it and return too */
        char *saved = NULL;
        char bad[] = "caf\xe9";
        if (rank == size - 1 && s.n > 0) {
            saved = s.caps[0];
            s.caps[0] = bad;
        }
        expect_write_error("invalid UTF-8 caption on one rank", d1, 1, &meta, &s, "is not valid UTF-8", 1);
        if (saved)
            s.caps[0] = saved;
    }
    {
        /* no rank has a sample (every sample of the shard's range was skipped): the shard is
         * committed empty, zero rows in every per-sample dataset, and reads back as such */
        slice none;
        sd_shard_entry e;
        int rc;
        make_slice(&none, 1, 0, 0, SD_LATENT_NCHW);
        rc = sd_shard_write(MPI_COMM_WORLD, d1, 1, &meta, none.empty, &none.b, &e, &err);
        rc = all_same(rc ? err.msg : "") && rc == 0;
        if (rank == 0) {
            sd_shard_manifest m;
            sd_shard *sh = NULL;
            float *got = sd_xmalloc(E_EL * sizeof(float)), want[E_EL];
            char keys[16];
            uint64_t sum = 0;
            const sd_shard_entry *me;
            tap_ok(rc && e.samples == 0 && e.index == 1, "no samples at all: every rank commits an "
                   "empty shard (%s)", rc ? "ok" : err.msg);
            tap_ok(no_temp_files(d1), "empty shard: no temporary file left in %s", d1);
            tap_ok(sd_shards_committed(d1, &m, &err) == 0 && (me = sd_shard_manifest_find(&m, 1)) &&
                       me->samples == 0 && me->checksum == e.checksum && m.total_samples == 6,
                   "empty shard: in the manifest with 0 samples (total 6)");
            rc = sd_shard_open_entry(d1, &e, &sh, &err);
            tap_ok(rc == 0, "empty shard opens: %s", rc ? err.msg : "ok");
            if (sh) {
                const sd_shard_info *in = sd_shard_get_info(sh);
                tap_ok(in->n_samples == 0 && in->shard_index == 1 && in->resolution == RES && in->embed_dim == D &&
                           in->caption_width >= 1 && in->key_width >= 1,
                       "empty shard: 0 samples, the shapes of the others");
                tap_ok(sd_shard_read_moments(sh, 0, 0, 1, SD_LATENT_NHWC, got, &err) == 0 &&
                           sd_shard_read_keys(sh, 0, 0, 1, keys, sizeof keys, &err) == 0 &&
                           sd_shard_read_moments(sh, 0, 1, 1, SD_LATENT_NCHW, got, &err) != 0 &&
                           strstr(err.msg, "the shard has 0"),
                       "empty shard: reads of nothing succeed, of a sample fail: %s", err.msg);
                for (int64_t j = 0; j < E_EL; j++)
                    want[j] = stored(none.empty[j], SD_F16);
                tap_ok(sd_shard_read_empty_embedding(sh, got, &err) == 0 && same_bits(got, want, E_EL),
                       "empty shard: empty-caption embedding exact");
                tap_ok(sd_shard_checksum(sh, &sum, &err) == 0 && sum == e.checksum,
                       "empty shard: checksum %016llx matches the manifest's", (unsigned long long)sum);
                sd_shard_close(sh);
            }
            sd_shard_manifest_free(&m);
            free(got);
        }
        free_slice(&none);
    }
    /* the temporary file cannot be created (a directory holds its name): H5Fcreate fails on every
     * rank together, and every rank returns the error */
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/.shard-000005.h5.tmp", d1);
        mkdir(path, 0777);
    }
    SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    expect_write_error("temporary file cannot be created", d1, 5, &meta, &s, "cannot create '", 0);
    if (rank == 0)
        rmdir(path);
    expect_write_error("directory that cannot be created", "/proc/sdtrain-no-such/x", 0, &meta, &s,
                       "cannot create shard directory '/proc/sdtrain-no-such'", 1);

    /* the writer remembers the manifest it wrote rather than parse it again at each commit
     * (slow past tens of thousands of shards); one changed on disk since is read again, else its
     * new shard would be dropped by the next commit and committed twice */
    snprintf(d3, sizeof d3, "%s/replaced", dir);
    {
        int rc = sd_shard_write(MPI_COMM_WORLD, d3, 0, &meta, s.empty, &s.b, NULL, &err);
        if (rank == 0 && tap_ok(rc == 0, "replaced manifest: shard 0 commits (%s)", rc ? err.msg : "ok")) {
            sd_shard_manifest m;
            FILE *f;
            tap_ok(sd_shard_manifest_read(d3, &m, &err) == 0 && m.n == 1, "replaced manifest: shard 0 listed");
            snprintf(path, sizeof path, "%s/manifest.json", d3);
            f = fopen(path, "w"); /* in place: the same file, another size */
            fprintf(f, "{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": [{\"index\": "
                       "0, \"file\": \"%s\", \"samples\": %lld, \"bytes\": %lld, \"resolution\": %d, "
                       "\"checksum\": \"%016llx\"}, {\"index\": 7, \"file\": \"shard-000007.h5\", "
                       "\"samples\": 1, \"bytes\": 1, \"resolution\": 16, \"checksum\": "
                       "\"0000000000000000\"}]}", m.entries[0].file, (long long)m.entries[0].samples,
                    (long long)m.entries[0].bytes, m.entries[0].resolution,
                    (unsigned long long)m.entries[0].checksum);
            fclose(f);
            sd_shard_manifest_free(&m);
        }
        SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        rc = sd_shard_write(MPI_COMM_WORLD, d3, 1, &meta, s.empty, &s.b, NULL, &err);
        if (rank == 0) {
            sd_shard_manifest m;
            tap_ok(rc == 0 && sd_shard_manifest_read(d3, &m, &err) == 0 && m.n == 3 &&
                       sd_shard_manifest_find(&m, 7) && sd_shard_manifest_find(&m, 1) &&
                       m.total_samples == 13,
                   "replaced manifest: read again, the next commit keeps the other writer's shard 7");
            sd_shard_manifest_free(&m);
        }
        expect_write_error("replaced manifest", d3, 7, &meta, &s, "shard-000007.h5 is already committed", 1);
    }

    /* a corrupt manifest stops the writer (it would otherwise drop committed shards) */
    if (rank == 0) {
        FILE *f;
        mkdir(d2, 0777);
        snprintf(path, sizeof path, "%s/manifest.json", d2);
        f = fopen(path, "w");
        fputs("{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": [\n", f);
        fclose(f);
    }
    SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    expect_write_error("truncated manifest", d2, 0, &meta, &s, "manifest.json: not a valid shard manifest",
                       1);

    if (rank == 0) {
        sd_shard_manifest m;
        sd_shard *sh;
        FILE *f;
        const char *bad_manifests[][2] = {
            {"[1, 2]", "'format' must be"},
            {"{\"format\": \"sdtrain-shard-manifest\", \"version\": 7, \"shards\": []}",
             "manifest version 7"},
            {"{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": [{\"index\": 0, \"file\": "
             "\"../../etc/passwd\", \"samples\": 1, \"bytes\": 1, \"resolution\": 16, \"checksum\": "
             "\"0000000000000000\"}]}", "'file' must be \"shard-000000.h5\""},
            {"{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": [{\"index\": 0, \"file\": "
             "\"shard-000000.h5\", \"bytes\": 1, \"resolution\": 16, \"checksum\": \"0000000000000000\"}]}",
             "shard entry 0 has no 'samples'"},
            {"{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": []} x",
             "unexpected data after"},
            {"", "the file is empty"},
        };
        for (size_t k = 0; k < sizeof bad_manifests / sizeof bad_manifests[0]; k++) {
            f = fopen(path, "w");
            fputs(bad_manifests[k][0], f);
            fclose(f);
            tap_ok(sd_shards_committed(d2, &m, &err) != 0 && strstr(err.msg, bad_manifests[k][1]) &&
                       strstr(err.msg, "corrupt/manifest.json"),
                   "bad manifest %zu: %s", k, err.msg);
        }
        /* a manifest listing a file that is gone, or has changed size */
        f = fopen(path, "w");
        fputs("{\"format\": \"sdtrain-shard-manifest\", \"version\": 1, \"shards\": [{\"index\": 3, "
              "\"file\": "
              "\"shard-000003.h5\", \"samples\": 1, \"bytes\": 10, \"resolution\": 16, \"checksum\": "
              "\"0000000000000000\"}]}", f);
        fclose(f);
        tap_ok(sd_shards_committed(d2, &m, &err) != 0 && strstr(err.msg, "shard-000003.h5") &&
                   strstr(err.msg, "cannot be read"), "missing committed file: %s", err.msg);
        snprintf(path, sizeof path, "%s/shard-000003.h5", d2);
        f = fopen(path, "w");
        fputs("not hdf5", f);
        fclose(f);
        tap_ok(sd_shards_committed(d2, &m, &err) != 0 && strstr(err.msg, "with 10 bytes, but the file has 8"),
               "changed committed file: %s", err.msg);
        tap_ok(sd_shard_open(path, &sh, &err) != 0 && strstr(err.msg, "is not an HDF5 file"),
               "a non-HDF5 file: %s", err.msg);
        {
            hid_t fid = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
            H5Fclose(fid);
        }
        tap_ok(sd_shard_open(path, &sh, &err) != 0 && strstr(err.msg, "not an sdtrain latent shard"),
               "an HDF5 file that is no shard: %s", err.msg);
        snprintf(path, sizeof path, "%s/nonexistent.h5", d2);
        tap_ok(sd_shard_open(path, &sh, &err) != 0 && strstr(err.msg, "No such file"),
               "a missing file: %s", err.msg);
        /* no manifest at all: nothing committed */
        tap_ok(sd_shards_committed(dir, &m, &err) == 0 && m.n == 0, "no manifest: nothing committed");
    }
    free_slice(&s);
    if (rank == 0)
        return tap_done();
    return 0;
}

/* h5fatal: the last rank meets an HDF5 failure no input explains while the others wait in a
 * barrier; SD_H5_CHECK must print the HDF5 stack and take the whole job down. */
static int cmd_h5fatal(void)
{
    int rank, size;
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    /* as inside the library: automatic printing off, the check prints the stack itself */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    if (rank == size - 1)
        SD_H5_CHECK(H5Dopen2(H5I_INVALID_HID, "image_latents_512", H5P_DEFAULT));
    SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    printf("rank %d passed the barrier\n", rank);
    return 0;
}

/* An HDF5 file whose chunked datasets declare far more values than they store (and than any
 * reader could hold), beside a small one: `sdtool inspect` must describe it without reading
 * them. */
static int cmd_huge(const char *path)
{
    static const struct {
        const char *name;
        int nd;
        hsize_t dims[3];
    } sets[] = {{"wraps", 3, {2, (hsize_t)1 << 33, ((hsize_t)1 << 31) + 1}},
                {"long_row", 2, {1, (hsize_t)1 << 30, 0}},
                {"many", 1, {(hsize_t)1 << 35, 0, 0}},
                {"small", 2, {3, 4, 0}}};
    const float small[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return 1;
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        hsize_t chunk[3] = {1, 1, 1};
        hid_t space = H5Screate_simple(sets[k].nd, sets[k].dims, NULL);
        hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), d;
        H5Pset_chunk(dcpl, sets[k].nd, chunk);
        d = H5Dcreate2(f, sets[k].name, H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
        if (d >= 0 && !strcmp(sets[k].name, "small"))
            H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, small);
        if (d >= 0)
            H5Dclose(d);
        H5Pclose(dcpl);
        H5Sclose(space);
    }
    return H5Fclose(f) < 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int rc = 2;
    sd_err err;
    if (!strcmp(mode, "inspect"))
        return sd_cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(mode, "verify") && argc == 6)
        return cmd_verify(argc, argv);
    if (!strcmp(mode, "hash") && argc == 3)
        return cmd_hash(argc, argv);
    if (!strcmp(mode, "committed") && argc == 3)
        return cmd_committed(argc, argv);
    if (!strcmp(mode, "huge") && argc == 3)
        return cmd_huge(argv[2]);
    if (sd_fault_init_from_env(&err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    sd_mpi_start(&argc, &argv);
    if (!strcmp(mode, "write") && argc >= 6)
        rc = cmd_write(argc, argv);
    else if (!strcmp(mode, "errors") && argc == 3)
        rc = cmd_errors(argc, argv);
    else if (!strcmp(mode, "h5fatal"))
        rc = cmd_h5fatal();
    else
        fprintf(stderr, "usage: shards_test write DIR SHARDS N f16|f32 [--empty-rank R] [--nhwc] | "
                        "verify DIR f16|f32 N SHARDS | hash DIR | committed DIR | errors DIR | h5fatal | "
                        "huge FILE | inspect ARGS\n");
    MPI_Finalize();
    return rc;
}
