/* Helper for loader.sh: writes small latent shards whose every value names its sample, then
 * checks the training loader against an independent model of its order and split (global
 * batches, epochs, seek, prefetch on and off, validation reads) and exercises its errors. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/loader.h"
#include "sdtrain/log.h"
#include "sdtrain/rng.h"
#include "sdtrain/runtime.h"
#include "sdtrain/shards.h"
#include "tap.h"

/* 16 px -> 2x2 latents, D = 8 unless a write asks for another: every code path, little data. */
#define RES 16
#define HS (RES / 8)
#define C2 (2 * SD_SHARD_LATENT_CHANNELS)
#define L SD_SHARD_TEXT_LEN
#define M_EL (C2 * HS * HS)
#define MAX_SHARDS 32

static int g_rank, g_size;
static int64_t g_window; /* check: &data shuffle_window (0: the global order) */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Element j of stream `what` of sample g (g = shard * 1000 + row): a function of (g, what, j)
 * only, so a value read back tells which sample it came from. Random mantissas exercise the
 * fp16 rounding. */
static float value(int64_t g, int what, int64_t j)
{
    uint64_t h = splitmix(((uint64_t)g * 1000003u + (uint64_t)what) * 0x100000001B3ULL ^ (uint64_t)j);
    return (float)(((double)(h >> 11) / 9007199254740992.0 - 0.5) * 40.0);
}

static float stored(float v, sd_dtype dt) { return dt == SD_F16 ? sd_f16_to_f32(sd_f32_to_f16(v)) : v; }

static void make_key(int64_t g, char *buf, size_t size)
{
    snprintf(buf, size, "%05lld/%09lld", (long long)(g / 1000), (long long)g);
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

/* "0:13,1:5,4:11": shard index and sample count, ascending. */
typedef struct spec {
    int n;
    int64_t index[MAX_SHARDS], samples[MAX_SHARDS];
} spec;

static int parse_spec(const char *s, spec *sp)
{
    char *copy = sd_xstrdup(s), *tok, *save = NULL;
    sp->n = 0;
    for (tok = strtok_r(copy, ",", &save); tok && sp->n < MAX_SHARDS; tok = strtok_r(NULL, ",", &save)) {
        long long a, b;
        if (sscanf(tok, "%lld:%lld", &a, &b) != 2) {
            free(copy);
            return -1;
        }
        sp->index[sp->n] = a;
        sp->samples[sp->n++] = b;
    }
    free(copy);
    return 0;
}

/* Writes shard `index` of n samples into dir: every rank of comm contributes a contiguous slice. */
static int write_shard(MPI_Comm comm, const char *dir, const sd_shard_meta *meta, const float *empty,
                       int64_t index, int64_t n)
{
    const int D = meta->embed_dim;
    int rank, size, rc;
    int64_t lo, cnt;
    float *mom, *emb;
    int32_t *ids;
    char **caps, **keys;
    sd_shard_batch b;
    sd_shard_entry e;
    sd_err err;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    lo = n * rank / size;
    cnt = n * (rank + 1) / size - lo;
    mom = sd_xmalloc((size_t)(cnt + 1) * M_EL * sizeof(float));
    emb = sd_xmalloc((size_t)(cnt + 1) * L * D * sizeof(float));
    ids = sd_xcalloc((size_t)(cnt + 1) * L, sizeof(int32_t));
    caps = sd_xcalloc((size_t)cnt + 1, sizeof(char *));
    keys = sd_xcalloc((size_t)cnt + 1, sizeof(char *));
    for (int64_t i = 0; i < cnt; i++) {
        int64_t g = index * 1000 + lo + i;
        char buf[64];
        for (int64_t j = 0; j < M_EL; j++)
            mom[i * M_EL + j] = value(g, 0, j);
        for (int64_t j = 0; j < (int64_t)L * D; j++)
            emb[i * L * D + j] = value(g, 1, j);
        make_key(g, buf, sizeof buf);
        keys[i] = sd_xstrdup(buf);
        caps[i] = sd_xstrdup("a caption");
    }
    memset(&b, 0, sizeof b); /* (no planned range recorded) */
    b.n = cnt;
    b.layout = SD_LATENT_NCHW;
    b.moments = mom;
    b.embeddings = emb;
    b.ids = ids;
    b.captions = (const char *const *)caps;
    b.keys = (const char *const *)keys;
    rc = sd_shard_write(comm, dir, index, meta, empty, &b, &e, &err);
    if (rc)
        fprintf(stderr, "[rank %d] write error: %s\n", g_rank, err.msg);
    else if (rank == 0)
        printf("committed %s: %lld samples\n", e.file, (long long)e.samples);
    fflush(stdout);
    for (int64_t i = 0; i < cnt; i++) {
        free(keys[i]);
        free(caps[i]);
    }
    free(keys);
    free(caps);
    free(ids);
    free(emb);
    free(mom);
    return rc ? 1 : 0;
}

static float *test_meta(sd_shard_meta *meta, sd_dtype dt, int D)
{
    float *empty;
    sd_shard_meta_defaults(meta);
    meta->resolution = RES;
    meta->embed_dim = D;
    meta->float_dtype = dt;
    empty = sd_xmalloc((size_t)L * D * sizeof(float));
    for (int64_t j = 0; j < (int64_t)L * D; j++)
        empty[j] = value(-1, 9, j);
    return empty;
}

/* write DIR f16|f32 SPEC [D [WEIGHTS_HASH]]: every rank of the job contributes a contiguous
 * slice. */
static int cmd_write(int argc, char **argv)
{
    const char *dir = argv[2];
    int D = argc > 5 ? atoi(argv[5]) : 8, rc = 0;
    sd_dtype dt;
    spec sp;
    sd_shard_meta meta;
    float *empty;
    if (parse_dtype(argv[3], &dt) || parse_spec(argv[4], &sp) || D < 1)
        return 2;
    empty = test_meta(&meta, dt, D);
    if (argc > 6)
        snprintf(meta.weights_hash, sizeof meta.weights_hash, "%s", argv[6]);
    for (int k = 0; k < sp.n && rc == 0; k++)
        rc = write_shard(MPI_COMM_WORLD, dir, &meta, empty, sp.index[k], sp.samples[k]);
    free(empty);
    return rc;
}

/* ---- checks: every rank tests, rank 0 reports one TAP line per section -------------------- */

static int local_failures;

static int check(int cond, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int check(int cond, const char *fmt, ...)
{
    if (!cond) {
        va_list ap;
        local_failures++;
        if (local_failures <= 20) {
            printf("# [rank %d] failed: ", g_rank);
            va_start(ap, fmt);
            vprintf(fmt, ap);
            va_end(ap);
            printf("\n");
            fflush(stdout);
        }
    }
    return cond;
}

/* One TAP line on rank 0: ok when no rank failed a check since the last section. */
static void section(const char *what)
{
    int mine = local_failures, any = 0;
    SD_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (g_rank == 0)
        tap_ok(any == 0, "%s (np %d)", what, g_size);
    local_failures = 0;
    SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
}

/* The independent model of the data set: sample ids, keys, the split, the epoch order. */
typedef struct model {
    int64_t n;       /* samples */
    int64_t *gid;    /* ordinal -> shard * 1000 + row */
    int64_t *shard, *row;
    int *is_val;
    int64_t n_val, n_train;
    int64_t *train;  /* ascending ordinals */
    int64_t *val;
    int64_t *order;  /* an epoch's order */
    int64_t n_pos;   /* shards, in index order */
    int64_t *pos_first; /* ordinal of each one's row 0; [n_pos] = n */
} model;

/* The split as loader.h specifies it, written out again here. */
static int key_is_val(const char *key, double fraction)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return (double)(h >> 11) / 9007199254740992.0 < fraction;
}

static void model_build(model *m, const spec *sp, double fraction)
{
    int64_t o = 0;
    memset(m, 0, sizeof *m);
    for (int k = 0; k < sp->n; k++)
        m->n += sp->samples[k];
    m->gid = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->shard = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->row = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->is_val = sd_xcalloc((size_t)m->n, sizeof(int));
    m->train = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->val = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->order = sd_xmalloc((size_t)m->n * sizeof(int64_t));
    m->n_pos = sp->n;
    m->pos_first = sd_xmalloc((size_t)(sp->n + 1) * sizeof(int64_t));
    m->pos_first[0] = 0;
    for (int k = 0; k < sp->n; k++)
        m->pos_first[k + 1] = m->pos_first[k] + sp->samples[k];
    for (int k = 0; k < sp->n; k++)
        for (int64_t r = 0; r < sp->samples[k]; r++, o++) {
            char key[64];
            m->shard[o] = sp->index[k];
            m->row[o] = r;
            m->gid[o] = sp->index[k] * 1000 + r;
            make_key(m->gid[o], key, sizeof key);
            m->is_val[o] = key_is_val(key, fraction);
            if (m->is_val[o])
                m->val[m->n_val++] = o;
            else
                m->train[m->n_train++] = o;
        }
}

/* loader.h "Order" with a shuffle window W: the shards shuffled, windows of W of them, each
 * window's training samples (shard by shard, ascending) shuffled, the windows in turn. */
static void model_window_epoch(model *m, uint64_t seed, int64_t epoch, int64_t W)
{
    const int64_t S = m->n_pos;
    int64_t *pi = sd_xmalloc((size_t)S * sizeof(int64_t)), at = 0;
    for (int64_t k = 0; k < S; k++)
        pi[k] = k;
    for (int64_t i = S - 1; i >= 1; i--) {
        uint32_t j = sd_rng_below(seed, SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 2), (uint64_t)epoch,
                                  (uint64_t)i >> 24, (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
        int64_t t = pi[i];
        pi[i] = pi[j];
        pi[j] = t;
    }
    for (int64_t w = 0; w * W < S; w++) {
        int64_t *win = m->order + at, n = 0;
        for (int64_t q = w * W; q < (w + 1) * W && q < S; q++)
            for (int64_t o = m->pos_first[pi[q]]; o < m->pos_first[pi[q] + 1]; o++)
                if (!m->is_val[o])
                    win[n++] = o;
        for (int64_t i = n - 1; i >= 1; i--) {
            uint32_t j = sd_rng_below(seed, SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 3), (uint64_t)epoch,
                                      (uint64_t)w * 256 + ((uint64_t)i >> 24),
                                      (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
            int64_t t = win[i];
            win[i] = win[j];
            win[j] = t;
        }
        at += n;
    }
    free(pi);
}

static void model_epoch(model *m, uint64_t seed, int64_t epoch)
{
    if (g_window > 0) {
        model_window_epoch(m, seed, epoch, g_window);
        return;
    }
    memcpy(m->order, m->train, (size_t)m->n_train * sizeof(int64_t));
    for (int64_t i = m->n_train - 1; i >= 1; i--) {
        uint32_t j = sd_rng_below(seed, SD_RNG_SHUFFLE, (uint64_t)epoch, (uint64_t)i >> 24,
                                  (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
        int64_t t = m->order[i];
        m->order[i] = m->order[j];
        m->order[j] = t;
    }
}

static void model_free(model *m)
{
    free(m->gid);
    free(m->shard);
    free(m->row);
    free(m->is_val);
    free(m->train);
    free(m->val);
    free(m->order);
    free(m->pos_first);
}

/* The ordinal of a sample id, or -1. */
static int64_t ordinal_of(const model *m, sd_sample_id id)
{
    for (int64_t o = 0; o < m->n; o++)
        if (m->shard[o] == id.shard && m->row[o] == id.row)
            return o;
    return -1;
}

/* Every float of sample i of b is exactly the stored value of sample `id`. */
static int content_ok(const sd_loader_batch *b, int i, sd_sample_id id, int D, sd_dtype dt)
{
    int64_t g = id.shard * 1000 + id.row;
    const float *mo = b->moments + (size_t)i * M_EL, *em = b->embeddings + (size_t)i * L * D;
    for (int64_t j = 0; j < M_EL; j++) {
        float w = stored(value(g, 0, j), dt);
        if (memcmp(&w, &mo[j], sizeof w))
            return 0;
    }
    for (int64_t j = 0; j < (int64_t)L * D; j++) {
        float w = stored(value(g, 1, j), dt);
        if (memcmp(&w, &em[j], sizeof w))
            return 0;
    }
    return 1;
}

/* Checks this rank's batch of `step` against the model; records its ordinals in rec. */
static void check_step_batch(const sd_loader_info *in, const sd_loader_batch *b, int64_t step, uint64_t seed,
                             sd_dtype dt, int64_t *rec, model *scratch)
{
    int64_t spe = in->steps_per_epoch, epoch = step / spe;
    int64_t base = (step % spe) * in->global_batch + (int64_t)g_rank * in->batch_per_rank;
    model_epoch(scratch, seed, epoch);
    check(b->step == step && b->count == in->batch_per_rank, "step %lld: batch of step %lld, %d samples",
          (long long)step, (long long)b->step, b->count);
    for (int j = 0; j < b->count && j < in->batch_per_rank; j++) {
        int64_t want = scratch->order[base + j], got = ordinal_of(scratch, b->ids[j]);
        check(got == want, "step %lld sample %d: id (%lld, %lld) is ordinal %lld, expected %lld",
              (long long)step, j, (long long)b->ids[j].shard, (long long)b->ids[j].row, (long long)got,
              (long long)want);
        check(b->positions[j] == (int64_t)g_rank * in->batch_per_rank + j, "step %lld sample %d: position %lld",
              (long long)step, j, (long long)b->positions[j]);
        check(content_ok(b, j, b->ids[j], in->embed_dim, dt), "step %lld sample %d: data of (%lld, %lld)",
              (long long)step, j, (long long)b->ids[j].shard, (long long)b->ids[j].row);
        if (rec)
            rec[j] = got;
    }
}

static int open_loader(const char *dir, double frac, int B, uint64_t seed, int prefetch, int max_open,
                       sd_loader **l)
{
    sd_loader_options o;
    sd_err err;
    sd_loader_options_defaults(&o);
    o.shard_dir = dir;
    o.val_fraction = frac;
    o.batch_per_rank = B;
    o.seed = seed;
    o.prefetch = prefetch;
    o.max_open_shards = max_open;
    o.shuffle_window = g_window;
    if (sd_loader_open(MPI_COMM_WORLD, &o, l, &err)) {
        check(0, "open %s: %s", dir, err.msg);
        return -1;
    }
    return 0;
}

/* Reads all validation samples in pieces of `piece` and checks them against the model. */
static void check_val(sd_loader *l, const model *m, int D, sd_dtype dt, int piece)
{
    sd_loader_batch vb;
    sd_err err;
    int64_t n = sd_loader_val_count(l);
    check(n == m->n_val, "validation count %lld, expected %lld", (long long)n, (long long)m->n_val);
    sd_loader_batch_alloc(l, piece, &vb);
    for (int64_t first = 0; first < n; first += piece) {
        int cnt = (int)(n - first < piece ? n - first : piece);
        if (!check(sd_loader_read_val(l, first, cnt, &vb, &err) == 0, "read_val %lld+%d: %s", (long long)first,
                   cnt, err.msg))
            break;
        check(vb.count == cnt && vb.step == -1, "read_val count %d step %lld", vb.count, (long long)vb.step);
        for (int i = 0; i < cnt; i++) {
            int64_t o = ordinal_of(m, vb.ids[i]);
            check(o == m->val[first + i], "val %lld: ordinal %lld, expected %lld", (long long)(first + i),
                  (long long)o, (long long)m->val[first + i]);
            check(vb.positions[i] == first + i, "val %lld: position %lld", (long long)(first + i),
                  (long long)vb.positions[i]);
            check(content_ok(&vb, i, vb.ids[i], D, dt), "val %lld: data", (long long)(first + i));
        }
    }
    check(sd_loader_read_val(l, n, 1, &vb, &err) != 0 && strstr(err.msg, "are not in"),
          "reading past the validation set is an error: %s", err.msg);
    sd_loader_batch_free(&vb);
}

/* check DIR f16|f32 SPEC B FRAC SEED K DIGEST */
static int cmd_check(int argc, char **argv)
{
    const char *dir = argv[2], *digest = argv[9];
    int B = atoi(argv[5]), K = atoi(argv[8]);
    double frac = atof(argv[6]);
    uint64_t seed = strtoull(argv[7], NULL, 10);
    sd_dtype dt;
    spec sp;
    model m, scratch;
    sd_loader *l;
    const sd_loader_info *in;
    const sd_loader_batch *b;
    int64_t *rec, *global = NULL;
    sd_err err;
    double wait;
    FILE *dig = NULL;
    int D;
    g_window = argc > 10 ? atoll(argv[10]) : 0;
    if (parse_dtype(argv[3], &dt) || parse_spec(argv[4], &sp) || B < 1 || K < 1 || g_window < 0)
        return 2;
    model_build(&m, &sp, frac);
    model_build(&scratch, &sp, frac);

    /* The split function is fixed forever: golden values (computed outside this code). */
    check(sd_loader_key_hash("") == 0xefd01f60ba992926ULL && sd_loader_key_hash("00000/000000000") ==
                                                                   0x1fe7a4590af88708ULL &&
              sd_loader_key_hash("00012/000123456") == 0x7a65d483faa6d9a5ULL &&
              sd_loader_key_hash("caf\xc3\xa9") == 0xf50b1f8e2c0682e6ULL,
          "sd-keyhash-v1 golden values");
    check(sd_loader_key_is_val("00000/000000000", 0.125) && !sd_loader_key_is_val("00000/000000000", 0.124) &&
              !sd_loader_key_is_val("", 0.0),
          "split decision at the threshold");
    section("the validation key hash is sd-keyhash-v1");

    if (open_loader(dir, frac, B, seed, 1, 0, &l)) {
        section("open");
        return g_rank == 0 ? tap_done() : 1;
    }
    in = sd_loader_get_info(l);
    D = in->embed_dim;
    check(in->resolution == RES && in->latent_channels == 4 && in->latent_size == HS && in->text_len == L &&
              D == 8 && in->scaling_factor == 0.18215 && in->n_shards == sp.n && in->n_samples == m.n &&
              in->n_val == m.n_val && in->n_train == m.n_train && in->batch_per_rank == B &&
              in->rank == g_rank && in->n_ranks == g_size && in->global_batch == (int64_t)B * g_size &&
              in->steps_per_epoch == m.n_train / ((int64_t)B * g_size),
          "info: res %d C %d h %d L %d D %d sf %g shards %lld samples %lld val %lld train %lld G %lld spe %lld",
          in->resolution, in->latent_channels, in->latent_size, in->text_len, D, in->scaling_factor,
          (long long)in->n_shards, (long long)in->n_samples, (long long)in->n_val, (long long)in->n_train,
          (long long)in->global_batch, (long long)in->steps_per_epoch);
    {
        const float *e = sd_loader_empty_embedding(l);
        int ok = 1;
        for (int64_t j = 0; j < (int64_t)L * D; j++) {
            float w = stored(value(-1, 9, j), dt);
            ok &= memcmp(&w, &e[j], sizeof w) == 0;
        }
        check(ok, "empty-caption embedding exact");
    }
    if (g_rank == 0) {
        tap_diag("%lld samples: %lld train, %lld validation; global batch %lld, %lld steps per epoch",
                 (long long)m.n, (long long)m.n_train, (long long)m.n_val, (long long)in->global_batch,
                 (long long)in->steps_per_epoch);
        tap_diag("direct reads: %lld of %lld shards", (long long)in->n_direct, (long long)in->n_shards);
    }
    section("open: shapes, counts, empty-caption embedding");

    /* Validation: exactly the keys that hash below the fraction, disjoint from training. */
    check_val(l, &m, D, dt, 5);
    section("validation samples: the keys below the fraction, in order, exact data");

    /* Training pass with prefetch: every step against the model; rank 0 gathers global batches. */
    rec = sd_xmalloc((size_t)K * B * sizeof(int64_t));
    if (g_rank == 0) {
        global = sd_xmalloc((size_t)g_size * B * sizeof(int64_t));
        dig = fopen(digest, "w");
        check(dig != NULL, "cannot write %s", digest);
    }
    check(sd_loader_tell(l) == 0, "a new loader starts at step 0");
    check(sd_loader_seek(l, 0, &err) == 0, "seek 0: %s", err.msg);
    {
        int64_t spe = in->steps_per_epoch, G = in->global_batch;
        int64_t *seen = sd_xcalloc((size_t)m.n, sizeof(int64_t));
        for (int64_t s = 0; s < K; s++) {
            if (!check(sd_loader_next(l, &b, &wait, &err) == 0, "next at step %lld: %s", (long long)s, err.msg))
                break;
            check(wait >= 0 && isfinite(wait), "wait time %g", wait);
            check_step_batch(in, b, s, seed, dt, rec + s * B, &scratch);
            /* validation reads while the thread reads the next step */
            if (s == 1)
                check_val(l, &m, D, dt, 3);
            SD_MPI_CHECK(MPI_Gather(rec + s * B, B, MPI_INT64_T, global, B, MPI_INT64_T, 0, MPI_COMM_WORLD));
            if (g_rank == 0) {
                if (s % spe == 0)
                    memset(seen, 0, (size_t)m.n * sizeof(int64_t));
                model_epoch(&scratch, seed, s / spe);
                for (int64_t p = 0; p < G; p++) {
                    int64_t o = global[p];
                    check(o == scratch.order[(s % spe) * G + p], "step %lld position %lld: ordinal %lld",
                          (long long)s, (long long)p, (long long)o);
                    if (o >= 0 && o < m.n) {
                        check(!m.is_val[o], "step %lld: validation sample %lld in training", (long long)s,
                              (long long)o);
                        check(seen[o]++ == 0, "step %lld: sample %lld twice in epoch %lld", (long long)s,
                              (long long)o, (long long)(s / spe));
                    }
                }
                if (g_window > 0) {
                    /* a global batch lies in one window, or in two where it straddles them */
                    int64_t distinct = 0;
                    for (int64_t p = 0; p < G; p++) {
                        int fresh = global[p] >= 0 && global[p] < m.n;
                        for (int64_t q = 0; q < p && fresh; q++)
                            fresh = m.shard[global[q]] != m.shard[global[p]];
                        distinct += fresh;
                    }
                    check(distinct <= 2 * g_window, "step %lld: %lld shards in a global batch, "
                          "window %lld", (long long)s, (long long)distinct, (long long)g_window);
                }
                if (dig) {
                    fprintf(dig, "step %lld epoch %lld:", (long long)s, (long long)(s / spe));
                    for (int64_t p = 0; p < G; p++)
                        fprintf(dig, " %lld/%lld", (long long)m.shard[global[p]], (long long)m.row[global[p]]);
                    fprintf(dig, "\n");
                }
                if ((s + 1) % spe == 0) {
                    /* A complete epoch: the batches and the dropped tail cover the train list once. */
                    int64_t used = 0;
                    for (int64_t o = 0; o < m.n; o++)
                        used += seen[o];
                    check(used == spe * G && m.n_train - used == m.n_train % G,
                          "epoch %lld: %lld samples used, %lld dropped", (long long)(s / spe), (long long)used,
                          (long long)(m.n_train - used));
                }
            }
        }
        free(seen);
        check(sd_loader_tell(l) == K, "after %d steps the loader is at %lld", K, (long long)sd_loader_tell(l));
        if (g_rank == 0) {
            /* consecutive epochs are shuffled differently */
            int64_t *e0 = sd_xmalloc((size_t)m.n_train * sizeof(int64_t));
            model_epoch(&scratch, seed, 0);
            memcpy(e0, scratch.order, (size_t)m.n_train * sizeof(int64_t));
            model_epoch(&scratch, seed, 1);
            check(memcmp(e0, scratch.order, (size_t)m.n_train * sizeof(int64_t)) != 0, "epochs 0 and 1 differ");
            free(e0);
        }
    }
    if (dig)
        fclose(dig);
    section("training steps: each rank's slice of the model's global batch, exact data, once per epoch");

    /* Seek: any step, in any order, gives what reading through gave; also right after a next
     * (the thread busy) and twice in a row. */
    {
        int64_t targets[] = {3, 0, K - 1, in->steps_per_epoch, 1, 2, 2};
        for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
            int64_t s = targets[t] < K ? targets[t] : K - 1;
            int64_t got[64];
            if (t == 4)
                check(sd_loader_seek(l, 5, &err) == 0, "seek 5");
            check(sd_loader_seek(l, s, &err) == 0 && sd_loader_tell(l) == s, "seek %lld", (long long)s);
            for (int64_t r = s; r < s + 2 && r < K; r++) {
                if (!check(sd_loader_next(l, &b, NULL, &err) == 0, "next after seek: %s", err.msg))
                    break;
                check_step_batch(in, b, r, seed, dt, got, &scratch);
                check(memcmp(got, rec + r * B, (size_t)B * sizeof(int64_t)) == 0,
                      "step %lld after seek %lld equals reading through", (long long)r, (long long)s);
            }
        }
        check(sd_loader_seek(l, -1, &err) != 0, "seek -1 is an error");
    }
    section("seek gives the same batches as reading through");
    sd_loader_close(l);

    /* Prefetch off (and one open shard at a time): the same batches, synchronously. */
    if (open_loader(dir, frac, B, seed, 0, 1, &l) == 0) {
        int64_t got[64];
        in = sd_loader_get_info(l);
        for (int64_t s = 0; s < K; s++) {
            if (!check(sd_loader_next(l, &b, &wait, &err) == 0, "next (sync) at %lld: %s", (long long)s, err.msg))
                break;
            check(wait >= 0, "wait time %g", wait);
            check_step_batch(in, b, s, seed, dt, got, &scratch);
            check(memcmp(got, rec + s * B, (size_t)B * sizeof(int64_t)) == 0, "sync step %lld equals prefetch",
                  (long long)s);
        }
        check(sd_loader_seek(l, 2, &err) == 0 && sd_loader_next(l, &b, NULL, &err) == 0, "sync seek");
        check_step_batch(in, b, 2, seed, dt, got, &scratch);
        check(memcmp(got, rec + 2 * B, (size_t)B * sizeof(int64_t)) == 0, "sync seek 2");
        check_val(l, &m, in->embed_dim, dt, 64);
        sd_loader_close(l);
    }
    section("prefetch off gives identical batches");

    /* Two loaders at once, both prefetching (they share the HDF5 lock). */
    {
        sd_loader *l2 = NULL;
        if (open_loader(dir, frac, B, seed, 1, 2, &l) == 0 && open_loader(dir, frac, B, seed, 1, 0, &l2) == 0) {
            const sd_loader_batch *b2;
            int64_t got[64];
            in = sd_loader_get_info(l);
            for (int64_t s = 0; s < K; s++) {
                if (!check(sd_loader_next(l, &b, NULL, &err) == 0 && sd_loader_next(l2, &b2, NULL, &err) == 0,
                           "two loaders: %s", err.msg))
                    break;
                check_step_batch(in, b, s, seed, dt, got, &scratch);
                check(memcmp(got, rec + s * B, (size_t)B * sizeof(int64_t)) == 0 &&
                          !memcmp(b->moments, b2->moments, (size_t)B * M_EL * sizeof(float)),
                      "two loaders agree at step %lld", (long long)s);
            }
        }
        sd_loader_close(l2);
        sd_loader_close(l);
    }
    section("two loaders prefetching at once");

    free(rec);
    free(global);
    model_free(&m);
    model_free(&scratch);
    return g_rank == 0 ? tap_done() : 0;
}

/* open DIR B FRAC: opens and closes; a failure prints one line per rank and exits 1. */
static int cmd_open(int argc, char **argv)
{
    sd_loader_options o;
    sd_loader *l;
    sd_err err;
    (void)argc;
    sd_loader_options_defaults(&o);
    o.shard_dir = argv[2];
    o.batch_per_rank = atoi(argv[3]);
    o.val_fraction = atof(argv[4]);
    if (sd_loader_open(MPI_COMM_WORLD, &o, &l, &err)) {
        fprintf(stderr, "[rank %d] loader error: %s\n", g_rank, err.msg);
        return 1;
    }
    if (g_rank == 0)
        printf("opened: %lld train, %lld validation samples\n", (long long)sd_loader_get_info(l)->n_train,
               (long long)sd_loader_val_count(l));
    sd_loader_close(l);
    return 0;
}

/* unreadable DIR B: the shards are truncated after open; every rank's next then fails with a
 * message naming a shard file, again on the next call, and after a seek. */
static int cmd_unreadable(int argc, char **argv)
{
    const char *dir = argv[2];
    int B = atoi(argv[3]);
    sd_loader *l;
    const sd_loader_batch *b;
    sd_err err;
    (void)argc;
    sd_shard_manifest m = {0, NULL, 0};
    char **saved = NULL;
    if (g_rank == 0) {
        check(sd_shards_committed(dir, &m, &err) == 0, "manifest: %s", err.msg);
        saved = sd_xcalloc((size_t)m.n + 1, sizeof *saved);
    }
    for (int prefetch = 1; prefetch >= 0; prefetch--) {
        if (open_loader(dir, 0.0, B, 7, prefetch, 0, &l)) {
            section("open");
            return g_rank == 0 ? tap_done() : 1;
        }
        /* Rank 0 keeps each file's bytes, truncates it, and restores it after the round. */
        for (int64_t k = 0; k < m.n; k++) {
            char path[8192];
            FILE *f;
            snprintf(path, sizeof path, "%s/%s", dir, m.entries[k].file);
            saved[k] = sd_xmalloc((size_t)m.entries[k].bytes);
            f = fopen(path, "rb");
            check(f && fread(saved[k], 1, (size_t)m.entries[k].bytes, f) == (size_t)m.entries[k].bytes,
                  "read %s", path);
            if (f)
                fclose(f);
            check(truncate(path, m.entries[k].bytes / 2) == 0, "truncate %s", path);
        }
        SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        err.msg[0] = '\0';
        check(sd_loader_next(l, &b, NULL, &err) != 0 && b == NULL && strstr(err.msg, "shard-0000") &&
                  strstr(err.msg, "bytes"),
              "prefetch %d: next fails naming the shard: %s", prefetch, err.msg);
        if (g_rank == 0)
            tap_diag("prefetch %d: %s", prefetch, err.msg);
        check(sd_loader_next(l, &b, NULL, &err) != 0 && sd_loader_tell(l) == 0, "the error stays");
        check(sd_loader_seek(l, 1, &err) == 0 && sd_loader_next(l, &b, NULL, &err) != 0, "and after a seek");
        sd_loader_close(l);
        SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        for (int64_t k = 0; k < m.n; k++) {
            char path[8192];
            FILE *f;
            snprintf(path, sizeof path, "%s/%s", dir, m.entries[k].file);
            f = fopen(path, "wb");
            check(f && fwrite(saved[k], 1, (size_t)m.entries[k].bytes, f) == (size_t)m.entries[k].bytes,
                  "restore %s", path);
            if (f)
                fclose(f);
            free(saved[k]);
        }
        section(prefetch ? "a shard unreadable after open: next fails on every rank (prefetch)"
                         : "a shard unreadable after open: next fails on every rank (synchronous)");
    }
    free(saved);
    sd_shard_manifest_free(&m);
    return g_rank == 0 ? tap_done() : 0;
}

/* Follow mode's first pass as loader.h specifies it, written out again: shard by shard, each
 * shard's training ordinals shuffled with the shard index as the counter. */
static void model_stream(const model *m, const spec *sp, uint64_t seed, int64_t *out)
{
    int64_t o = 0, t = 0;
    for (int k = 0; k < sp->n; k++) {
        int64_t first = t;
        for (int64_t r = 0; r < sp->samples[k]; r++, o++)
            if (!m->is_val[o])
                out[t++] = o;
        for (int64_t i = t - first - 1; i >= 1; i--) {
            uint32_t j = sd_rng_below(seed, SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 1), (uint64_t)sp->index[k],
                                      (uint64_t)i >> 24, (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
            int64_t x = out[first + i];
            out[first + i] = out[first + j];
            out[first + j] = x;
        }
    }
}

/* follow DIR f16|f32 SPEC B FRAC SEED K DELAY_MS PREFETCH DIGEST: world rank 0 writes the shards
 * of SPEC (indices 0..P-1) one by one, DELAY_MS before each, after sending the plan; the other
 * ranks train-read K steps with a follow-mode loader and check every batch against the model. */
static int cmd_follow(int argc, char **argv)
{
    const char *dir = argv[2], *digest = argv[11];
    int B = atoi(argv[5]), K = atoi(argv[8]), delay = atoi(argv[9]), prefetch = atoi(argv[10]);
    double frac = atof(argv[6]);
    uint64_t seed = strtoull(argv[7], NULL, 10);
    MPI_Comm sub;
    sd_dtype dt;
    spec sp;
    int rank, size;
    (void)argc;
    if (parse_dtype(argv[3], &dt) || parse_spec(argv[4], &sp) || B < 1 || K < 1 || g_size < 2)
        return 2;
    for (int k = 0; k < sp.n; k++)
        if (sp.index[k] != k)
            return 2;
    SD_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, g_rank == 0 ? 0 : 1, g_rank, &sub));
    SD_MPI_CHECK(MPI_Comm_rank(sub, &rank));
    SD_MPI_CHECK(MPI_Comm_size(sub, &size));
    if (g_rank == 0) {
        sd_shard_meta meta;
        float *empty = test_meta(&meta, dt, 8);
        int64_t plan[2] = {sp.n, 0};
        int rc = 0;
        for (int k = 0; k < sp.n; k++)
            plan[1] += sp.samples[k];
        SD_MPI_CHECK(MPI_Send(plan, 2, MPI_INT64_T, 1, SD_PIPELINE_PLAN_TAG, MPI_COMM_WORLD));
        for (int k = 0; k < sp.n && rc == 0; k++) {
            usleep((useconds_t)delay * 1000);
            rc = write_shard(sub, dir, &meta, empty, sp.index[k], sp.samples[k]);
        }
        check(rc == 0, "writing the shards");
        free(empty);
    } else {
        model m, scratch;
        sd_loader_options o;
        sd_loader *l;
        const sd_loader_info *in;
        const sd_loader_batch *b;
        sd_loader_batch vb;
        sd_err err;
        int64_t *stream, *rec, *global = NULL, n_val0 = 0, G = (int64_t)B * size, spe, vshard = -1;
        FILE *dig = NULL;
        sd_log_set_info_leader(rank == 0);
        model_build(&m, &sp, frac);
        model_build(&scratch, &sp, frac);
        stream = sd_xmalloc((size_t)m.n * sizeof *stream);
        model_stream(&m, &sp, seed, stream);
        spe = m.n_train / G;
        /* the validation set: the held-out samples of the first shard holding samples (shard 0
         * unless it is empty: every sample of its range skipped in preprocessing) */
        for (int k = 0; k < sp.n && vshard < 0; k++)
            if (sp.samples[k] > 0)
                vshard = sp.index[k];
        for (int64_t v = 0; v < m.n_val; v++)
            n_val0 += m.shard[m.val[v]] == vshard;
        sd_loader_options_defaults(&o);
        o.shard_dir = dir;
        o.val_fraction = frac;
        o.batch_per_rank = B;
        o.seed = seed;
        o.prefetch = prefetch;
        o.follow = 1;
        o.plan_comm = MPI_COMM_WORLD;
        o.plan_source = 0;
        o.poll_interval_s = 0.02;
        o.wait_timeout_s = 60;
        if (!check(sd_loader_open(sub, &o, &l, &err) == 0, "open (follow): %s", err.msg))
            goto done;
        in = sd_loader_get_info(l);
        check(in->n_planned == sp.n && in->n_shards >= 1 && in->n_val == n_val0 && in->embed_dim == 8 &&
                  in->global_batch == G && in->rank == rank && in->n_ranks == size &&
                  (in->complete == (in->n_shards == sp.n)),
              "info at open: planned %lld shards %lld val %lld (want %lld) complete %d", (long long)in->n_planned,
              (long long)in->n_shards, (long long)in->n_val, (long long)n_val0, in->complete);
        /* the validation set: that shard's held-out samples, known at open */
        check(vshard < 0 || in->n_shards > vshard, "open returned before shard %lld (the validation "
              "set's) was known: %lld shards", (long long)vshard, (long long)in->n_shards);
        sd_loader_batch_alloc(l, (int)(n_val0 + 1), &vb);
        if (check(sd_loader_read_val(l, 0, (int)n_val0, &vb, &err) == 0, "validation read: %s", err.msg))
            for (int i = 0; i < vb.count; i++)
                check(ordinal_of(&m, vb.ids[i]) == m.val[i] && m.shard[m.val[i]] == vshard &&
                          content_ok(&vb, i, vb.ids[i], 8, dt),
                      "validation sample %d", i);
        sd_loader_batch_free(&vb);
        if (spe == 0) {
            /* no training sample in any shard (all empty): the first step fails on every rank
             * with a clear message, once every planned shard is known */
            check(sd_loader_next(l, &b, NULL, &err) != 0 && strstr(err.msg, "no training samples") &&
                      strstr(err.msg, "all empty") && sd_loader_get_info(l)->complete,
                  "every shard empty: next fails: %s", err.msg);
            if (rank == 0)
                tap_diag("every shard empty: %s", err.msg);
            sd_loader_close(l);
            goto done;
        }
        rec = sd_xmalloc((size_t)B * sizeof *rec);
        if (rank == 0) {
            global = sd_xmalloc((size_t)G * sizeof *global);
            dig = fopen(digest, "w");
            check(dig != NULL, "cannot write %s", digest);
        }
        for (int64_t st = 0; st < K; st++) {
            int64_t e = st / spe, idx = st % spe;
            if (!check(sd_loader_next(l, &b, NULL, &err) == 0, "next at step %lld: %s", (long long)st, err.msg))
                break;
            model_epoch(&scratch, seed, e);
            check(b->step == st && b->epoch == e && b->count == B, "step %lld: batch of step %lld epoch %lld",
                  (long long)st, (long long)b->step, (long long)b->epoch);
            for (int j = 0; j < B; j++) {
                int64_t pos = (int64_t)rank * B + j;
                int64_t want = e == 0 ? stream[idx * G + pos] : scratch.order[idx * G + pos];
                rec[j] = ordinal_of(&m, b->ids[j]);
                check(rec[j] == want && b->positions[j] == pos && content_ok(b, j, b->ids[j], 8, dt),
                      "step %lld sample %d: ordinal %lld, expected %lld", (long long)st, j, (long long)rec[j],
                      (long long)want);
            }
            SD_MPI_CHECK(MPI_Gather(rec, B, MPI_INT64_T, global, B, MPI_INT64_T, 0, sub));
            if (dig) {
                fprintf(dig, "step %lld epoch %lld:", (long long)st, (long long)e);
                for (int64_t p = 0; p < G; p++)
                    fprintf(dig, " %lld/%lld", (long long)m.shard[global[p]], (long long)m.row[global[p]]);
                fprintf(dig, "\n");
            }
        }
        in = sd_loader_get_info(l);
        check(K <= spe || (in->complete && in->n_shards == sp.n && in->n_train == m.n_train &&
                           in->steps_per_epoch == spe),
              "info after epoch 0: complete %d shards %lld train %lld spe %lld", in->complete,
              (long long)in->n_shards, (long long)in->n_train, (long long)in->steps_per_epoch);
        if (rank == 0)
            tap_diag("%lld samples: %lld train (%lld steps per epoch of %lld), %lld validation in shard %lld",
                     (long long)m.n, (long long)m.n_train, (long long)spe, (long long)G, (long long)n_val0,
                     (long long)vshard);
        if (dig)
            fclose(dig);
        free(rec);
        free(global);
        sd_loader_close(l);
    done:
        free(stream);
        model_free(&m);
        model_free(&scratch);
    }
    section("follow mode: the first pass shard by shard, then the epoch permutations; the validation set of "
            "the first shard with samples");
    MPI_Comm_free(&sub);
    return g_rank == 0 ? tap_done() : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int rc = 2, any;
    sd_mpi_start(&argc, &argv);
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_size));
    if (!strcmp(mode, "write") && argc >= 5 && argc <= 7)
        rc = cmd_write(argc, argv);
    else if (!strcmp(mode, "check") && (argc == 10 || argc == 11))
        rc = cmd_check(argc, argv);
    else if (!strcmp(mode, "open") && argc == 5)
        rc = cmd_open(argc, argv);
    else if (!strcmp(mode, "unreadable") && argc == 4)
        rc = cmd_unreadable(argc, argv);
    else if (!strcmp(mode, "follow") && argc == 12)
        rc = cmd_follow(argc, argv);
    else if (g_rank == 0)
        fprintf(stderr, "usage: loader_test write DIR f16|f32 SPEC [D [HASH]] | check DIR f16|f32 SPEC B FRAC SEED K "
                        "DIGEST | open DIR B FRAC | unreadable DIR B | follow DIR f16|f32 SPEC B FRAC SEED K DELAY_MS "
                        "PREFETCH DIGEST\n");
    /* Any rank's failure is the job's (rank 0 alone prints the TAP plan). */
    SD_MPI_CHECK(MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    MPI_Finalize();
    return any;
}
