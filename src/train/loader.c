/* The training data loader: rank 0 scans the committed shards and splits train/val by key hash,
 * every rank derives the seeded epoch order and reads its slice of each global batch, a
 * background thread reading the next step while the caller uses the current one. */
#include "sdtrain/loader.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/config.h"
#include "sdtrain/hash.h"
#include "sdtrain/log.h"
#include "sdtrain/progress.h"
#include "sdtrain/rng.h"
#include "sdtrain/runtime.h"
#include "sdtrain/shards.h"
#include "sdtrain/timer.h"

#define SHUFFLE_PURPOSE SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 0)
/* Follow mode: each shard's training samples in the first pass (loader.h). */
#define STREAM_PURPOSE SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 1)
/* shuffle_window > 0: the shards' order of an epoch, and each window's samples (loader.h) */
#define WINDOW_SHARDS_PURPOSE SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 2)
#define WINDOW_PURPOSE SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 3)
/* Follow mode: how often rank 0 repeats the "waiting for shard K" line. */
#define WAIT_INFO_EVERY_S 60.0
/* Validation samples read per round: the run-finding scratch lives on the stack. */
#define VAL_CHUNK 64

/* Every HDF5 call of every loader in the process runs under this lock (HDF5 is not built
 * thread-safe), and so does the shard cache, which only those calls touch. */
static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER;


void sd_loader_h5_lock(void) { SD_CHECK(pthread_mutex_lock(&h5_lock) == 0, "HDF5 lock"); }

void sd_loader_h5_unlock(void) { SD_CHECK(pthread_mutex_unlock(&h5_lock) == 0, "HDF5 unlock"); }

void sd_loader_options_defaults(sd_loader_options *o)
{
    memset(o, 0, sizeof *o);
    o->val_fraction = 0.01;
    o->batch_per_rank = 8;
    o->seed = 1234;
    o->prefetch = 1;
    o->plan_comm = MPI_COMM_WORLD;
    o->wait_timeout_s = 3600;
}

/* ---- the validation split (sd-keyhash-v1: loader.h; never change it) ------------------------- */

uint64_t sd_loader_key_hash(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    /* FNV-1a's top bits barely move when only the last bytes differ (keys count up); the
     * finalizer spreads every input bit over the bits that decide the split. */
    return sd_fmix64(h);
}

int sd_loader_key_is_val(const char *key, double val_fraction)
{
    double u = (double)(sd_loader_key_hash(key) >> 11) * 1.1102230246251565404e-16; /* 2^-53 */
    return u < val_fraction;
}

/* ---- state ---------------------------------------------------------------------------------- */

enum { SLOT_EMPTY, SLOT_REQUESTED, SLOT_READING, SLOT_READY };

/* Where a step's samples come from: decided on the caller's thread (in follow mode from the
 * shards known at that call) and handed to the reader with the request. */
typedef struct step_plan {
    int64_t step, epoch, idx; /* idx: the step's place in its epoch */
    int64_t n_shards;         /* shards the reader may look up (follow mode adds more later) */
} step_plan;

/* One of the two step buffers: the caller holds one while the thread fills the other. */
typedef struct slot {
    sd_loader_batch batch;
    int state;
    int64_t step;
    step_plan plan;
    int rc;
    sd_err err;
} slot;

typedef struct open_shard {
    int64_t pos;    /* manifest position, -1 when free */
    sd_shard *shard; /* read through HDF5; or NULL and: */
    int fd;         /* read directly (sd_shard_direct), -1 when not */
    uint64_t used;  /* LRU tick of the last read */
} open_shard;

/* A sample to read: its ordinal and the batch row it goes to. */
typedef struct read_item {
    uint32_t ord;
    int32_t dst;
} read_item;

struct sd_loader {
    sd_loader_info info;
    uint64_t seed;
    int64_t window;          /* &data shuffle_window: 0 global order, else shards a window */
    double val_fraction;
    char dir[SD_PATH_MAX];
    sd_shard_entry *entries; /* the manifest, n_shards (follow mode: room for n_planned) */
    sd_shard_direct *direct; /* per shard: where its rows lie, for reads without HDF5 */
    int hdf5_only;           /* SDTRAIN_TEST_LOADER_HDF5: every read through HDF5 */
    int64_t *first;          /* ordinal of each shard's row 0; first[n_shards] = n_samples */
    uint32_t *val;           /* validation ordinals, ascending (n_val) */
    uint32_t *heldout;       /* every held-out ordinal, ascending: the train list is the rest
                              * (val itself, except in follow mode where val is its prefix) */
    int64_t n_heldout;
    float *empty;            /* [L, D] */
    size_t m_el, e_el;       /* floats per sample: moments, embedding */

    /* The reader: the prefetch thread, or the caller when prefetch is off (never both). */
    uint32_t *order;         /* the epoch's order of the train list */
    int64_t order_epoch;     /* -1 before the first */
    read_item *items;        /* [batch_per_rank] */
    float *stage_m, *stage_e; /* [batch_per_rank] samples, for runs whose rows are scattered */

    /* Follow mode (loader.h). The caller's thread appends shards; the reader only looks at
     * shards below the n_shards of the plan it was handed, which were complete before. */
    int follow;
    MPI_Comm comm;
    double timeout, poll;
    int (*stop_poll)(void *ctx); /* rank 0: asked while it waits (loader.h) */
    void *stop_ctx;
    int stopped;             /* a wait ended for stop_poll: only close is left */
    struct stat man_seen;    /* rank 0: the manifest as last read (unchanged: no new shards) */
    int man_seen_valid;
    uint32_t **seg;          /* [n_planned]: shard k's training ordinals, shuffled (epoch 0) */
    int64_t val_shard;       /* position of the validation shard: the first holding samples
                              * (shard 0 unless it is empty); -1 until one is known */
    int64_t *tfirst;         /* stream position of seg[k][0]; tfirst[n_shards] = n_train */
    size_t heldout_cap;

    /* Under h5_lock. */
    open_shard *cache;
    int n_cache;
    uint64_t tick;
    uint16_t *scratch;       /* [batch_per_rank x max(m_el, e_el)] fp16 of a direct read */

    /* Under mu. */
    slot slots[2];
    int n_slots;
    int held;                /* slot the caller holds, or -1 */
    int64_t next_step;
    int stop;
    int prefetch, thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void batch_init(sd_loader_batch *b, int capacity, size_t m_el, size_t e_el)
{
    memset(b, 0, sizeof *b);
    b->step = -1;
    b->capacity = capacity;
    b->moments = sd_xmalloc((size_t)capacity * m_el * sizeof(float));
    b->embeddings = sd_xmalloc((size_t)capacity * e_el * sizeof(float));
    b->positions = sd_xmalloc((size_t)capacity * sizeof(int64_t));
    b->ids = sd_xmalloc((size_t)capacity * sizeof(sd_sample_id));
}

void sd_loader_batch_free(sd_loader_batch *b)
{
    if (!b)
        return;
    free(b->moments);
    free(b->embeddings);
    free(b->positions);
    free(b->ids);
    memset(b, 0, sizeof *b);
}

void sd_loader_batch_alloc(const sd_loader *l, int capacity, sd_loader_batch *b)
{
    SD_CHECK(capacity >= 1, "validation batch capacity %d", capacity);
    batch_init(b, capacity, l->m_el, l->e_el);
}

const sd_loader_info *sd_loader_get_info(const sd_loader *l) { return &l->info; }

const float *sd_loader_empty_embedding(const sd_loader *l) { return l->empty; }

int64_t sd_loader_val_count(const sd_loader *l) { return l->info.n_val; }

int64_t sd_loader_tell(const sd_loader *l) { return l->next_step; }

/* ---- shards: the cache and the reads -------------------------------------------------------- */

/* Position (among the first n_shards) of the shard holding ordinal `ord`. */
static int64_t shard_of(const sd_loader *l, int64_t n_shards, uint32_t ord)
{
    int64_t lo = 0, hi = n_shards - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (l->first[mid] <= (int64_t)ord)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static sd_sample_id id_of(const sd_loader *l, int64_t n_shards, uint32_t ord)
{
    int64_t pos = shard_of(l, n_shards, ord);
    sd_sample_id id = {l->entries[pos].index, (int64_t)ord - l->first[pos]};
    return id;
}

/* A shard whose shapes differ from those of the shards scanned at open (the file was replaced
 * by another of the same size) would be read into buffers of the wrong size. */
static int check_shape(const sd_loader_info *want, const sd_shard_info *in, sd_err *err)
{
    /* latents and embeddings of other encoder weights live in other spaces: training on a mix
     * would be silently wrong (a shard directory topped up by a run with another snapshot) */
    if (strcmp(in->weights_hash, want->weights_hash) != 0)
        return sd_err_set(err, "%s was encoded by other weights (%s, %s) than the shards before it "
                               "(%s): all shards of a training set must come from the same VAE "
                               "and text encoder", in->path, in->weights_hash[0] ? in->weights_hash : "no hash",
                          in->weights_path, want->weights_hash[0] ? want->weights_hash : "no hash");
    if (in->resolution != want->resolution || in->latent_channels != want->latent_channels ||
        in->latent_size != want->latent_size || in->text_len != want->text_len ||
        in->embed_dim != want->embed_dim || in->scaling_factor != want->scaling_factor)
        return sd_err_set(err, "%s: resolution %d, latent channels %d, latent size %d, text_len %d, "
                               "embed_dim %d, scaling factor %g; the other shards have %d, %d, %d, %d, "
                               "%d, %g (all shards of a training set must agree)", in->path,
                          in->resolution, in->latent_channels, in->latent_size, in->text_len,
                          in->embed_dim, in->scaling_factor, want->resolution, want->latent_channels,
                          want->latent_size, want->text_len, want->embed_dim, want->scaling_factor);
    return 0;
}

static int direct_ok(const sd_loader *l, int64_t pos)
{
    return !l->hdf5_only && l->direct && l->direct[pos].ok;
}

/* Opens shard `pos` for direct reads: a plain descriptor, the file's size checked against the
 * manifest (as sd_shard_open_entry does). */
static int open_direct(const sd_loader *l, int64_t pos, const char *path, int *fd, sd_err *err)
{
    struct stat st;
    const int f = sd_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (f < 0 || sd_fstat(f, &st) != 0) {
        const int e = errno;
        if (f >= 0)
            close(f);
        if (sd_storage_errno(e))
            return sd_err_set_storage(err, "cannot open shard '%s': %s (a storage error, not "
                                      "damage: the shard may be intact)", path, strerror(e));
        return sd_err_set(err, "cannot open shard '%s': %s", path, strerror(e));
    }
    if ((int64_t)st.st_size != l->entries[pos].bytes) {
        close(f);
        return sd_err_set(err, "%s: %lld bytes, the manifest says %lld (changed after its commit?)",
                          path, (long long)st.st_size, (long long)l->entries[pos].bytes);
    }
    *fd = f;
    return 0;
}

/* The open shard at manifest position `pos` (an HDF5 shard in *out, or a descriptor in *fd for
 * direct reads), opening it (and closing the least recently used one) when needed. Caller holds
 * h5_lock. */
static int shard_get(sd_loader *l, int64_t pos, sd_shard **out, int *fd, sd_err *err)
{
    open_shard *victim = &l->cache[0];
    sd_shard *s = NULL;
    int f = -1;
    for (int c = 0; c < l->n_cache; c++) {
        open_shard *o = &l->cache[c];
        if (o->pos == pos) {
            o->used = ++l->tick;
            *out = o->shard;
            *fd = o->fd;
            return 0;
        }
        if (o->used < victim->used)
            victim = o;
    }
    if (victim->pos >= 0) {
        if (victim->shard)
            sd_shard_close(victim->shard);
        if (victim->fd >= 0)
            close(victim->fd);
        victim->pos = -1;
        victim->shard = NULL;
        victim->fd = -1;
        victim->used = 0;
    }
    if (direct_ok(l, pos)) {
        char path[SD_PATH_MAX + 80];
        snprintf(path, sizeof path, "%s/%s", l->dir, l->entries[pos].file);
        if (open_direct(l, pos, path, &f, err))
            return -1;
    } else {
        /* HDF5's reads at the open, marked as one call on the file (sdtrain/progress.h) */
        char path[SD_PATH_MAX + 80];
        int bad;
        snprintf(path, sizeof path, "%s/%s", l->dir, l->entries[pos].file);
        sd_progress_io_enter_path("HDF5 read", path);
        bad = sd_shard_open_entry(l->dir, &l->entries[pos], &s, err) != 0;
        if (!bad && check_shape(&l->info, sd_shard_get_info(s), err)) {
            sd_shard_close(s);
            bad = 1;
        }
        sd_progress_io_leave();
        if (bad)
            return -1;
    }
    victim->pos = pos;
    victim->shard = s;
    victim->fd = f;
    victim->used = ++l->tick;
    *out = s;
    *fd = f;
    return 0;
}

/* Reads rows [row, row + n) of shard `pos` into m (n x 2C x h x w) and e (n x L x D). */
static int read_rows(sd_loader *l, int64_t pos, int64_t row, int64_t n, float *m, float *e, sd_err *err)
{
    sd_shard *s;
    int rc, fd;
    sd_loader_h5_lock();
    char path[SD_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", l->dir, l->entries[pos].file);
    rc = shard_get(l, pos, &s, &fd, err);
    if (rc == 0 && !s) {
        /* direct: the same floats as the HDF5 reads below, without HDF5 (sd_shard_direct) */
        const sd_shard_direct *d = &l->direct[pos];
        uint16_t *scratch = n <= l->info.batch_per_rank ? l->scratch : NULL;
        if (row < 0 || n < 0 || row + n > l->entries[pos].samples)
            rc = sd_err_set(err, "%s: rows %lld to %lld of a shard of %lld", path, (long long)row,
                            (long long)(row + n - 1), (long long)l->entries[pos].samples);
        if (rc == 0)
            rc = sd_shard_direct_read(fd, path, d->moments, d->f16, l->m_el, row, n, m, scratch, err);
        if (rc == 0)
            rc = sd_shard_direct_read(fd, path, d->embeddings, d->f16, l->e_el, row, n, e, scratch, err);
    } else if (rc == 0) {
        sd_progress_io_enter_path("HDF5 read", path); /* HDF5's reads of the rows, as one call */
        rc = sd_shard_read_moments(s, row, n, 1, SD_LATENT_NCHW, m, err);
        if (rc == 0)
            rc = sd_shard_read_embeddings(s, row, n, 1, e, err);
        sd_progress_io_leave();
        sd_progress_tick();
    }
    sd_loader_h5_unlock();
    return rc ? -1 : 0;
}

/* Reads items (ascending ordinals) into their rows of b. Consecutive ordinals of one shard are
 * one read: straight into b when their rows are consecutive too, else through the staging
 * buffers (which runs of scattered rows need, so only the training reader may meet them). */
static int read_items(sd_loader *l, int64_t n_shards, const read_item *items, int n,
                      sd_loader_batch *b, float *stage_m, float *stage_e, sd_err *err)
{
    int end;
    for (int i = 0; i < n; i = end) {
        int64_t pos = shard_of(l, n_shards, items[i].ord), row = (int64_t)items[i].ord - l->first[pos];
        int contiguous = 1, cnt;
        for (end = i + 1; end < n && items[end].ord == items[end - 1].ord + 1 &&
                          (int64_t)items[end].ord < l->first[pos + 1]; end++)
            contiguous &= items[end].dst == items[end - 1].dst + 1;
        cnt = end - i;
        if (contiguous) {
            if (read_rows(l, pos, row, cnt, b->moments + (size_t)items[i].dst * l->m_el,
                          b->embeddings + (size_t)items[i].dst * l->e_el, err))
                return -1;
            continue;
        }
        SD_CHECK(stage_m && stage_e, "scattered run of %d rows without staging buffers", cnt);
        if (read_rows(l, pos, row, cnt, stage_m, stage_e, err))
            return -1;
        for (int k = 0; k < cnt; k++) {
            memcpy(b->moments + (size_t)items[i + k].dst * l->m_el, stage_m + (size_t)k * l->m_el,
                   l->m_el * sizeof(float));
            memcpy(b->embeddings + (size_t)items[i + k].dst * l->e_el, stage_e + (size_t)k * l->e_el,
                   l->e_el * sizeof(float));
        }
    }
    return 0;
}

/* Insertion sort by ordinal: batches are small, and glibc's qsort may allocate a merge buffer,
 * which a step must not. */
static void sort_items(read_item *it, int n)
{
    for (int i = 1; i < n; i++) {
        read_item x = it[i];
        int j = i;
        for (; j > 0 && it[j - 1].ord > x.ord; j--)
            it[j] = it[j - 1];
        it[j] = x;
    }
}

/* ---- the order ------------------------------------------------------------------------------ */

/* Fisher-Yates over o[0, n) with the draws of loader.h: stream (purpose, step), sample
 * hi * 2^8 + (i >> 24), draw i mod 2^24, bound i + 1. */
static void shuffle_u32(uint32_t *o, int64_t n, uint64_t seed, uint32_t purpose, int64_t step,
                        uint64_t hi)
{
    for (int64_t i = n - 1; i >= 1; i--) {
        uint32_t j = sd_rng_below(seed, purpose, (uint64_t)step, hi << 8 | (uint64_t)i >> 24,
                                  (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
        uint32_t t = o[i];
        o[i] = o[j];
        o[j] = t;
    }
}

/* The first index of the ascending a[0, n) holding a value >= x (n when none). */
static int64_t lower_bound_u32(const uint32_t *a, int64_t n, int64_t x)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if ((int64_t)a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* shuffle_window = W > 0 (loader.h "Order"): the shards in a seeded order of the epoch, cut into
 * windows of W; each window's training samples (shard by shard, each ascending) shuffled among
 * themselves; the windows one after the other. */
static void window_order(sd_loader *l, int64_t epoch, uint32_t *o)
{
    const int64_t S = l->info.n_shards, W = l->window;
    uint32_t *pi = sd_xmalloc((size_t)(S + 1) * sizeof *pi);
    int64_t at = 0;
    for (int64_t k = 0; k < S; k++)
        pi[k] = (uint32_t)k;
    shuffle_u32(pi, S, l->seed, WINDOW_SHARDS_PURPOSE, epoch, 0);
    for (int64_t w0 = 0; w0 < S; w0 += W) {
        const int64_t start = at;
        for (int64_t q = w0; q < w0 + W && q < S; q++) {
            const int64_t k = pi[q];
            int64_t v = lower_bound_u32(l->heldout, l->n_heldout, l->first[k]);
            for (int64_t g = l->first[k]; g < l->first[k + 1]; g++) {
                if (v < l->n_heldout && (int64_t)l->heldout[v] == g) {
                    v++;
                    continue;
                }
                o[at++] = (uint32_t)g;
            }
        }
        shuffle_u32(o + start, at - start, l->seed, WINDOW_PURPOSE, epoch, (uint64_t)(w0 / W));
    }
    SD_CHECK(at == l->info.n_train, "window order of %lld samples, expected %lld", (long long)at,
             (long long)l->info.n_train);
    free(pi);
}

/* order = the train list (all ordinals but the validation ones, ascending), shuffled by the
 * Fisher-Yates of loader.h for `epoch` (or, with a shuffle window, window by window): a pure
 * function of (seed, epoch, window) and the split. */
static int build_order(sd_loader *l, int64_t epoch, sd_err *err)
{
    const int64_t n = l->info.n_train, n_val = l->n_heldout;
    int64_t k = 0, v = 0;
    uint32_t *o = l->order;
    if (epoch > (int64_t)SD_RNG_MAX_STEP)
        return sd_err_set(err, "epoch %lld is beyond the shuffle stream's limit %llu", (long long)epoch,
                          (unsigned long long)SD_RNG_MAX_STEP);
    if (l->window > 0) {
        window_order(l, epoch, o);
        l->order_epoch = epoch;
        return 0;
    }
    for (int64_t g = 0; g < l->info.n_samples; g++) {
        if (v < n_val && (int64_t)l->heldout[v] == g) {
            v++;
            continue;
        }
        o[k++] = (uint32_t)g;
    }
    SD_CHECK(k == n, "train list of %lld samples, expected %lld", (long long)k, (long long)n);
    shuffle_u32(o, n, l->seed, SHUFFLE_PURPOSE, epoch, 0);
    l->order_epoch = epoch;
    return 0;
}

/* Follow mode: the shard (of the first n_shards) whose part of the stream holds position p. */
static int64_t segment_of(const sd_loader *l, int64_t n_shards, int64_t p)
{
    int64_t lo = 0, hi = n_shards - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (l->tfirst[mid] <= p)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* This rank's samples of the planned step into b. Runs in the reader (thread or caller). */
static int read_step(sd_loader *l, const step_plan *p, sd_loader_batch *b, sd_err *err)
{
    const sd_loader_info *in = &l->info; /* only the fields fixed at open */
    int64_t mine = (int64_t)in->rank * in->batch_per_rank;
    int64_t base = p->idx * in->global_batch + mine;
    int64_t k = l->follow && p->epoch == 0 ? segment_of(l, p->n_shards, base) : 0;
    if (!(l->follow && p->epoch == 0) && p->epoch != l->order_epoch && build_order(l, p->epoch, err))
        return -1;
    b->step = p->step;
    b->epoch = p->epoch;
    b->count = in->batch_per_rank;
    for (int j = 0; j < in->batch_per_rank; j++) {
        uint32_t ord;
        if (l->follow && p->epoch == 0) {
            /* the stream: shard k's shuffled training samples at [tfirst[k], tfirst[k + 1]) */
            while (l->tfirst[k + 1] <= base + j)
                k++;
            ord = l->seg[k][base + j - l->tfirst[k]];
        } else {
            ord = l->order[base + j];
        }
        l->items[j].ord = ord;
        l->items[j].dst = j;
        b->positions[j] = mine + j;
        b->ids[j] = id_of(l, p->n_shards, ord);
    }
    /* Sorted by ordinal, neighbouring rows of a shard become one read. */
    sort_items(l->items, in->batch_per_rank);
    return read_items(l, p->n_shards, l->items, in->batch_per_rank, b, l->stage_m, l->stage_e, err);
}

/* The error of a data set whose every shard is empty (each sample of their ranges was skipped
 * when they were preprocessed): nothing to train on. -1. */
static int no_samples(sd_err *err, const char *dir, int64_t n_shards)
{
    return sd_err_set(err, "%s: no training samples: the %lld committed shard(s) are all empty "
                      "(each sample of their ranges was skipped when they were preprocessed; "
                      "preprocess_summary.json there counts why)", dir, (long long)n_shards);
}

/* Where `step` comes from, on the caller's thread: 0 with *p set; 1 in follow mode when the
 * shards known so far do not reach it yet (poll, then ask again); -1 with err (may be NULL)
 * when it cannot be read. */
static int locate(const sd_loader *l, int64_t step, step_plan *p, sd_err *err)
{
    const sd_loader_info *in = &l->info;
    if (step < 0)
        return sd_err_set(err, "cannot seek the data loader to step %lld", (long long)step);
    p->step = step;
    p->n_shards = in->n_shards;
    if (l->follow && !in->complete) {
        /* step s of the first pass takes stream positions [s G, (s + 1) G) */
        if (step < in->n_train / in->global_batch) {
            p->epoch = 0;
            p->idx = step;
            return 0;
        }
        return 1;
    }
    if (in->steps_per_epoch < 1 && in->n_samples == 0)
        return no_samples(err, l->dir, in->n_shards);
    if (in->steps_per_epoch < 1)
        return sd_err_set(err, "%s: the %lld shards hold %lld training samples (of %lld; %lld held "
                               "out for validation), fewer than one global batch of %lld (%d ranks x %d)",
                          l->dir, (long long)in->n_shards, (long long)in->n_train,
                          (long long)in->n_samples, (long long)l->n_heldout,
                          (long long)in->global_batch, in->n_ranks, in->batch_per_rank);
    p->epoch = step / in->steps_per_epoch;
    p->idx = step % in->steps_per_epoch;
    if (p->epoch > (int64_t)SD_RNG_MAX_STEP)
        return sd_err_set(err, "step %lld is in epoch %lld, beyond the shuffle stream's limit %llu",
                          (long long)step, (long long)p->epoch, (unsigned long long)SD_RNG_MAX_STEP);
    return 0;
}

/* ---- follow mode: the shards as they are committed (loader.h) ----------------------------- */

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

static void push_u32(uint32_t **a, int64_t *n, size_t *cap, uint32_t v)
{
    if ((size_t)*n == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        *a = sd_xrealloc(*a, *cap * sizeof **a);
    }
    (*a)[(*n)++] = v;
}

/* Rank 0: opens shard `e` of dir and checks it against *want; with *have_want == 0 the shard's
 * shapes become *want instead and its empty-caption embedding is read into *empty. Appends
 * base + row to (*rows, *n_rows, *cap) for every row whose key is held out for validation;
 * *direct is where its rows lie for reads without HDF5. */
static int scan_shard(const char *dir, const sd_shard_entry *e, double val_fraction, sd_loader_info *want,
                      int *have_want, float **empty, uint32_t base, uint32_t **rows, int64_t *n_rows,
                      size_t *cap, sd_shard_direct *direct, sd_err *err)
{
    const sd_shard_info *in;
    sd_shard *s;
    char *keys = NULL;
    size_t kw;
    int r;
    char path[SD_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, e->file);
    sd_loader_h5_lock();
    /* HDF5's own reads of the header, the empty caption's embedding and the keys, marked as one
     * call on the file (follow mode makes them inside a bounded wait: sdtrain/progress.h) */
    sd_progress_io_enter_path("HDF5 read", path);
    if (sd_shard_open_entry(dir, e, &s, err)) {
        sd_progress_io_leave();
        sd_loader_h5_unlock();
        return -1;
    }
    in = sd_shard_get_info(s);
    r = 0;
    if (!*have_want) {
        want->resolution = in->resolution;
        want->latent_channels = in->latent_channels;
        want->latent_size = in->latent_size;
        want->text_len = in->text_len;
        want->embed_dim = in->embed_dim;
        want->scaling_factor = in->scaling_factor;
        snprintf(want->weights_hash, sizeof want->weights_hash, "%s", in->weights_hash);
        *empty = sd_xmalloc((size_t)in->text_len * (size_t)in->embed_dim * sizeof(float));
        r = sd_shard_read_empty_embedding(s, *empty, err);
        *have_want = r == 0;
    }
    if (r == 0)
        r = check_shape(want, in, err);
    kw = in->key_width + 1;
    if (r == 0) {
        keys = sd_xmalloc((size_t)in->n_samples * kw);
        r = sd_shard_read_keys(s, 0, in->n_samples, 1, keys, kw, err);
    }
    sd_shard_get_direct(s, direct);
    sd_shard_close(s);
    sd_progress_io_leave();
    sd_loader_h5_unlock();
    if (r == 0)
        for (int64_t i = 0; i < e->samples; i++)
            if (sd_loader_key_is_val(keys + (size_t)i * kw, val_fraction))
                push_u32(rows, n_rows, cap, base + (uint32_t)i);
    free(keys);
    return r ? -1 : 0;
}

/* What rank 0 found since the last poll, as broadcast: the shards that follow the loader's
 * known ones in index order. With shard 0 come the shapes and the empty-caption embedding. */
typedef struct follow_head {
    int32_t status;           /* 0, -1 failed (msg), 1 stopped by stop_poll (msg: where) */
    int32_t storage;          /* the failure was the storage's (sd_err.storage) */
    char msg[sizeof(((sd_err *)0)->msg)];
    int64_t n, n_rows;
    int32_t resolution, latent_channels, latent_size, text_len, embed_dim;
    double scaling_factor;
    char weights_hash[128];
} follow_head;

typedef struct follow_delta {
    follow_head h;
    sd_shard_entry *entries;  /* [n] */
    sd_shard_direct *direct;  /* [n] */
    int64_t *n_held;          /* [n] held-out rows of each shard */
    uint32_t *rows;           /* [n_rows] those rows, shard by shard, ascending */
    size_t cap_shards, cap_rows;
    float *empty;             /* [L, D], with shard 0 */
    int64_t samples, train;   /* of the n shards */
} follow_delta;

static void delta_free(follow_delta *d)
{
    free(d->entries);
    free(d->direct);
    free(d->n_held);
    free(d->rows);
    free(d->empty);
}

/* Rank 0: adds to d the shards of the manifest that come next in index order. */
static int follow_collect(sd_loader *l, follow_delta *d, sd_err *err)
{
    const sd_loader_info *in = &l->info;
    sd_shard_manifest m;
    char path[SD_PATH_MAX + 32];
    struct stat st;
    int rc = 0;
    /* Polls are frequent and a manifest of many shards is large: reread it only when it was
     * replaced (every commit renames a new file over it) */
    snprintf(path, sizeof path, "%s/%s", l->dir, SD_SHARD_MANIFEST);
    if (sd_stat(path, &st) != 0) {
        if (errno == ENOENT)
            return 0; /* nothing committed yet */
        memset(&st, 0, sizeof st);
    } else if (l->man_seen_valid && st.st_ino == l->man_seen.st_ino && st.st_dev == l->man_seen.st_dev &&
               st.st_size == l->man_seen.st_size && st.st_mtim.tv_sec == l->man_seen.st_mtim.tv_sec &&
               st.st_mtim.tv_nsec == l->man_seen.st_mtim.tv_nsec) {
        return 0;
    }
    if (sd_shard_manifest_read(l->dir, &m, err))
        return -1;
    for (int64_t k = in->n_shards + d->h.n; k < in->n_planned && rc == 0; k++) {
        const sd_shard_entry *e = sd_shard_manifest_find(&m, k);
        sd_loader_info want;
        int have = 1;
        int64_t before = d->h.n_rows;
        if (!e)
            break;
        if (in->n_samples + d->samples + e->samples >= (int64_t)UINT32_MAX) {
            rc = sd_err_set(err, "%s: more than %llu samples; the loader takes at most that many",
                            l->dir, (unsigned long long)UINT32_MAX - 1);
            break;
        }
        memset(&want, 0, sizeof want);
        if (in->n_shards > 0) {
            want = *in;
        } else if (d->h.n > 0) {
            want.resolution = d->h.resolution;
            want.latent_channels = d->h.latent_channels;
            want.latent_size = d->h.latent_size;
            want.text_len = d->h.text_len;
            want.embed_dim = d->h.embed_dim;
            want.scaling_factor = d->h.scaling_factor;
            memcpy(want.weights_hash, d->h.weights_hash, sizeof want.weights_hash);
        } else {
            have = 0;
        }
        if ((size_t)d->h.n == d->cap_shards) {
            d->cap_shards = d->cap_shards ? 2 * d->cap_shards : 16;
            d->entries = sd_xrealloc(d->entries, d->cap_shards * sizeof *d->entries);
            d->direct = sd_xrealloc(d->direct, d->cap_shards * sizeof *d->direct);
            d->n_held = sd_xrealloc(d->n_held, d->cap_shards * sizeof *d->n_held);
        }
        if (scan_shard(l->dir, e, l->val_fraction, &want, &have, &d->empty, 0, &d->rows, &d->h.n_rows,
                       &d->cap_rows, &d->direct[d->h.n], err)) {
            rc = -1;
            break;
        }
        if (in->n_shards == 0 && d->h.n == 0) {
            d->h.resolution = want.resolution;
            d->h.latent_channels = want.latent_channels;
            d->h.latent_size = want.latent_size;
            d->h.text_len = want.text_len;
            d->h.embed_dim = want.embed_dim;
            d->h.scaling_factor = want.scaling_factor;
            memcpy(d->h.weights_hash, want.weights_hash, sizeof d->h.weights_hash);
        }
        d->entries[d->h.n] = *e;
        d->n_held[d->h.n] = d->h.n_rows - before;
        d->samples += e->samples;
        d->train += e->samples - (d->h.n_rows - before);
        d->h.n++;
    }
    sd_shard_manifest_free(&m);
    /* only a manifest taken in full counts as seen (a shard scanned with an error is retried) */
    l->man_seen = st;
    l->man_seen_valid = rc == 0 && st.st_ino != 0;
    return rc;
}

/* Rank 0: polls until the known shards and those in d reach need_shards shards and need_train
 * training samples, or every planned shard is known, or the timeout passes (d->h.status -1), or
 * stop_poll asks to stop (d->h.status 1; asked after each poll that found too few, so a signal
 * stop ends the wait within one poll interval). Zero needs poll once. */
static void follow_wait(sd_loader *l, follow_delta *d, int64_t need_shards, int64_t need_train)
{
    const sd_loader_info *in = &l->info;
    const double t0 = sd_time_now();
    double next_info = 0;
    sd_err e = {.storage = 0};
    int stopping = 0;
    for (;;) {
        int64_t known, train;
        double waited;
        if (follow_collect(l, d, &e)) {
            d->h.status = -1;
            d->h.storage = e.storage;
            snprintf(d->h.msg, sizeof d->h.msg, "%s", e.msg);
            return;
        }
        known = in->n_shards + d->h.n;
        train = in->n_train + d->train;
        if (known == in->n_planned || (known >= need_shards && train >= need_train))
            return;
        if (stopping) {
            d->h.status = 1;
            snprintf(d->h.msg, sizeof d->h.msg, "stopped while waiting for shard %lld of %lld in "
                     "%.512s", (long long)known, (long long)in->n_planned, l->dir);
            return;
        }
        waited = sd_time_now() - t0;
        if (waited >= l->timeout) {
            d->h.status = -1;
            snprintf(d->h.msg, sizeof d->h.msg,
                     "no shard %lld committed in %.512s after waiting %.0f s (&data shard_wait_timeout): "
                     "%lld of the %lld planned shards are known; is the preprocessing half stuck?",
                     (long long)known, l->dir, waited, (long long)known, (long long)in->n_planned);
            return;
        }
        if (waited >= next_info) {
            char name[64];
            sd_shard_file_name(known, name, sizeof name);
            if (next_info == 0)
                sd_info("waiting for shard %lld (%s) to be committed in %s: %lld of %lld shards "
                        "known, %lld training samples so far", (long long)known, name, l->dir,
                        (long long)known, (long long)in->n_planned, (long long)train);
            else
                sd_info("still waiting for shard %lld (%s): %.0f s so far, the limit is %.0f s "
                        "(&data shard_wait_timeout)", (long long)known, name, waited, l->timeout);
            next_info = waited + WAIT_INFO_EVERY_S;
        }
        /* a stop is taken after one more poll at once: what was committed before the stop
         * was asked for (before the preprocessing half sent its stop word) counts */
        if (l->stop_poll && l->stop_poll(l->stop_ctx)) {
            stopping = 1;
            continue;
        }
        sleep_s(l->poll);
    }
}

/* Every rank: adds the shards of d (identical on every rank) to the loader. Caller's thread. */
static void follow_apply(sd_loader *l, follow_delta *d)
{
    sd_loader_info *in = &l->info;
    const uint32_t *rows = d->rows;
    for (int64_t j = 0; j < d->h.n; j++) {
        const int64_t k = in->n_shards, n = d->entries[j].samples, nh = d->n_held[j];
        int64_t t = 0, h = 0;
        uint32_t *seg = sd_xmalloc((size_t)(n - nh + 1) * sizeof *seg);
        l->entries[k] = d->entries[j];
        l->direct[k] = d->direct[j];
        in->n_direct += direct_ok(l, k);
        l->first[k + 1] = l->first[k] + n;
        for (int64_t r = 0; r < n; r++) {
            uint32_t ord = (uint32_t)(l->first[k] + r);
            if (h < nh && (int64_t)rows[h] == r) {
                push_u32(&l->heldout, &l->n_heldout, &l->heldout_cap, ord);
                h++;
            } else {
                seg[t++] = ord;
            }
        }
        /* the shard's training samples in a seeded order of their own (loader.h) */
        shuffle_u32(seg, t, l->seed, STREAM_PURPOSE, k, 0);
        l->seg[k] = seg;
        l->tfirst[k + 1] = l->tfirst[k] + t;
        if (l->val_shard < 0 && n > 0) {
            /* the validation set: the held-out samples of the first shard holding samples
             * (shard 0, unless every sample of its range was skipped in preprocessing) */
            l->val_shard = k;
            in->n_val = nh;
        }
        rows += nh;
        in->n_shards = k + 1;
    }
    l->val = l->heldout;
    in->n_samples = l->first[in->n_shards];
    in->n_train = l->tfirst[in->n_shards];
    in->steps_per_epoch = in->n_train / in->global_batch;
    in->complete = in->n_shards == in->n_planned;
    if (in->complete && !l->order) {
        l->order = sd_xmalloc((size_t)(in->n_train + 1) * sizeof *l->order);
        if (l->val_shard >= 0)
            sd_info("all %lld planned shards are committed: %lld samples, %lld for training, "
                    "%lld held out (%lld of them in shard %lld, the validation set); %lld steps "
                    "per epoch",
                    (long long)in->n_shards, (long long)in->n_samples, (long long)in->n_train,
                    (long long)l->n_heldout, (long long)in->n_val,
                    (long long)l->entries[l->val_shard].index, (long long)in->steps_per_epoch);
        else
            sd_info("all %lld planned shards are committed, and every one is empty: no samples",
                    (long long)in->n_shards);
    }
}

/* Collective over the training ranks: rank 0 polls (waiting as follow_wait says), the others
 * wait for its broadcast without spinning, and every rank adds the same shards. 0, or -1 with
 * the same message on every rank (l->stopped set on every rank when stop_poll ended the wait). */
static int follow_sync(sd_loader *l, int64_t need_shards, int64_t need_train, sd_err *err)
{
    follow_delta d;
    MPI_Request req;
    int rank;
    memset(&d, 0, sizeof d);
    SD_MPI_CHECK(MPI_Comm_rank(l->comm, &rank));
    /* bounded by &data shard_wait_timeout, not by the stall watchdog */
    sd_progress_wait_begin("waiting for the preprocessing half's shards");
    if (rank == 0)
        follow_wait(l, &d, need_shards, need_train);
    SD_MPI_CHECK(MPI_Ibcast(&d.h, (int)sizeof d.h, MPI_BYTE, 0, l->comm, &req));
    sd_mpi_wait_idle(&req);
    sd_progress_wait_end();
    if (d.h.status) {
        sd_err_set(err, "%s", d.h.msg);
        err->storage = d.h.storage;
        l->stopped = d.h.status > 0;
        delta_free(&d);
        return -1;
    }
    if (d.h.n > 0) {
        if (rank != 0) {
            d.entries = sd_xmalloc((size_t)d.h.n * sizeof *d.entries);
            d.direct = sd_xmalloc((size_t)d.h.n * sizeof *d.direct);
            d.n_held = sd_xmalloc((size_t)d.h.n * sizeof *d.n_held);
            d.rows = sd_xmalloc(((size_t)d.h.n_rows + 1) * sizeof *d.rows);
        }
        sd_bcast_bytes(d.entries, (size_t)d.h.n * sizeof *d.entries, l->comm);
        sd_bcast_bytes(d.direct, (size_t)d.h.n * sizeof *d.direct, l->comm);
        sd_bcast_bytes(d.n_held, (size_t)d.h.n * sizeof *d.n_held, l->comm);
        sd_bcast_bytes(d.rows, (size_t)d.h.n_rows * sizeof *d.rows, l->comm);
        if (l->info.n_shards == 0) {
            sd_loader_info *in = &l->info;
            in->resolution = d.h.resolution;
            in->latent_channels = d.h.latent_channels;
            in->latent_size = d.h.latent_size;
            in->text_len = d.h.text_len;
            in->embed_dim = d.h.embed_dim;
            in->scaling_factor = d.h.scaling_factor;
            memcpy(in->weights_hash, d.h.weights_hash, sizeof in->weights_hash);
            l->m_el = (size_t)(2 * in->latent_channels) * (size_t)in->latent_size * (size_t)in->latent_size;
            l->e_el = (size_t)in->text_len * (size_t)in->embed_dim;
            if (rank != 0)
                d.empty = sd_xmalloc(l->e_el * sizeof *d.empty);
            sd_bcast_bytes(d.empty, l->e_el * sizeof *d.empty, l->comm);
            l->empty = d.empty;
            d.empty = NULL;
        }
        follow_apply(l, &d);
    }
    delta_free(&d);
    return 0;
}

/* Rank 0: the preprocessing half's plan (sd_pipeline_plan), waiting at most the timeout. */
static int receive_plan(const sd_loader_options *o, int64_t plan[2], sd_err *err)
{
    const double t0 = sd_time_now(), limit = o->wait_timeout_s > 0 ? o->wait_timeout_s : 3600;
    MPI_Request req;
    long ns = 1000000;
    SD_MPI_CHECK(MPI_Irecv(plan, 2, MPI_INT64_T, o->plan_source, SD_PIPELINE_PLAN_TAG, o->plan_comm, &req));
    for (;;) {
        int done = 0;
        struct timespec ts = {0, 0};
        SD_MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done)
            return 0;
        if (sd_time_now() - t0 >= limit) {
            SD_MPI_CHECK(MPI_Cancel(&req));
            SD_MPI_CHECK(MPI_Wait(&req, MPI_STATUS_IGNORE));
            return sd_err_set(err, "the preprocessing half sent no plan (how many shards it writes) "
                                   "within %.0f s (&data shard_wait_timeout)", limit);
        }
        ts.tv_nsec = ns;
        nanosleep(&ts, NULL);
        if (ns < 50000000)
            ns *= 2;
    }
}

/* ---- prefetch ------------------------------------------------------------------------------- */

static void request(sd_loader *l, int k, const step_plan *p)
{
    l->slots[k].state = SLOT_REQUESTED;
    l->slots[k].step = p->step;
    l->slots[k].plan = *p;
    SD_CHECK(pthread_cond_broadcast(&l->cv) == 0, "signal the prefetch thread");
}

static void *prefetch_main(void *arg)
{
    sd_loader *l = arg;
    SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "prefetch lock");
    for (;;) {
        int k = -1;
        step_plan p;
        sd_err e = {.storage = 0};
        int rc;
        for (int s = 0; s < l->n_slots; s++)
            if (l->slots[s].state == SLOT_REQUESTED)
                k = s;
        if (l->stop)
            break;
        if (k < 0) {
            SD_CHECK(pthread_cond_wait(&l->cv, &l->mu) == 0, "prefetch wait");
            continue;
        }
        l->slots[k].state = SLOT_READING;
        p = l->slots[k].plan;
        SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "prefetch unlock");
        e.msg[0] = '\0';
        rc = read_step(l, &p, &l->slots[k].batch, &e);
        SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "prefetch lock");
        l->slots[k].rc = rc;
        l->slots[k].err = e;
        l->slots[k].state = SLOT_READY;
        SD_CHECK(pthread_cond_broadcast(&l->cv) == 0, "prefetch signal");
    }
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "prefetch unlock");
    return NULL;
}

/* locate, and in follow mode when the known shards do not reach the step, a poll of every rank
 * together (collective then; every rank decides alike, the state it depends on being the
 * same); with `block` it waits until they do. 0 with *p set, 1 (not yet; only without block),
 * -1 (the step cannot be read) or -2 (the poll failed) with err. */
static int plan_step(sd_loader *l, int64_t step, int block, step_plan *p, sd_err *err)
{
    int rc = locate(l, step, p, err);
    if (rc != 1)
        return rc;
    if (follow_sync(l, 0, block ? (step + 1) * l->info.global_batch : 0, err))
        return -2;
    return locate(l, step, p, err);
}

/* 1 when a slot holds or reads `step` (prefetch on). */
static int requested(sd_loader *l, int64_t step)
{
    int found = 0;
    SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "loader lock");
    for (int i = 0; i < l->n_slots; i++)
        found |= l->slots[i].state != SLOT_EMPTY && l->slots[i].step == step;
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
    return found;
}

int sd_loader_seek(sd_loader *l, int64_t step, sd_err *err)
{
    step_plan p;
    int rc = locate(l, step, &p, err);
    if (rc < 0)
        return -1;
    if (!l->prefetch) {
        l->slots[0].state = SLOT_EMPTY;
        l->next_step = step;
        return 0;
    }
    SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "loader lock");
    /* A read in flight finishes first: its slot's buffers are the thread's until then. */
    for (;;) {
        int reading = 0;
        for (int s = 0; s < l->n_slots; s++)
            reading |= l->slots[s].state == SLOT_READING;
        if (!reading)
            break;
        SD_CHECK(pthread_cond_wait(&l->cv, &l->mu) == 0, "loader wait");
    }
    for (int s = 0; s < l->n_slots; s++)
        l->slots[s].state = SLOT_EMPTY;
    l->held = -1;
    l->next_step = step;
    if (rc == 0) /* follow mode: a step the known shards do not reach is read by the next call */
        request(l, 0, &p);
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
    return 0;
}

int sd_loader_next(sd_loader *l, const sd_loader_batch **batch, double *wait_seconds, sd_err *err)
{
    double t0 = sd_time_now();
    const int64_t step = l->next_step;
    step_plan cur, nxt;
    sd_err scratch = {.storage = 0};
    slot *s;
    int k = -1, have_nxt = 0, rc;
    *batch = NULL;
    if (wait_seconds)
        *wait_seconds = 0;
    /* Follow mode makes this collective (plan_step): every rank polls here, before anything
     * local can fail. */
    if (!l->prefetch || !requested(l, step))
        if (plan_step(l, step, 1, &cur, err))
            return l->stopped ? SD_LOADER_STOPPED : -1;
    if (l->prefetch) {
        rc = plan_step(l, step + 1, 0, &nxt, &scratch);
        if (rc == -2) {
            *err = scratch;
            return -1;
        }
        have_nxt = rc == 0;
    }
    if (!l->prefetch) {
        s = &l->slots[0];
        /* A failed step stays failed until a seek (as with prefetch). */
        if (!(s->state == SLOT_READY && s->step == step && s->rc)) {
            s->step = step;
            s->err.msg[0] = '\0';
            s->rc = read_step(l, &cur, &s->batch, &s->err);
            s->state = SLOT_READY;
        }
        if (wait_seconds)
            *wait_seconds = sd_time_now() - t0;
        if (s->rc) {
            *err = s->err;
            return -1;
        }
        l->next_step = step + 1;
        *batch = &s->batch;
        return 0;
    }

    SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "loader lock");
    if (l->held >= 0) {
        l->slots[l->held].state = SLOT_EMPTY;
        l->held = -1;
    }
    for (int i = 0; i < l->n_slots; i++)
        if (l->slots[i].state != SLOT_EMPTY && l->slots[i].step == step)
            k = i;
    if (k < 0) {
        /* Not requested yet (the first call without a seek): the thread reads it now. */
        for (int i = 0; i < l->n_slots && k < 0; i++)
            if (l->slots[i].state == SLOT_EMPTY)
                k = i;
        SD_CHECK(k >= 0, "no free slot for step %lld", (long long)step);
        request(l, k, &cur);
    }
    s = &l->slots[k];
    while (s->state != SLOT_READY)
        SD_CHECK(pthread_cond_wait(&l->cv, &l->mu) == 0, "loader wait");
    if (wait_seconds)
        *wait_seconds = sd_time_now() - t0;
    if (s->rc) {
        *err = s->err;
        SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
        return -1;
    }
    l->held = k;
    l->next_step = step + 1;
    /* Double buffering: the other slot takes the next step while the caller uses this one. */
    for (int i = 0; i < l->n_slots && have_nxt; i++)
        if (i != k && l->slots[i].state == SLOT_EMPTY) {
            request(l, i, &nxt);
            break;
        }
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
    *batch = &s->batch;
    return 0;
}

int sd_loader_read_val(sd_loader *l, int64_t first, int count, sd_loader_batch *b, sd_err *err)
{
    read_item items[VAL_CHUNK];
    if (first < 0 || count < 0 || first > l->info.n_val || count > l->info.n_val - first)
        return sd_err_set(err, "validation samples [%lld, %lld) are not in [0, %lld)", (long long)first,
                          (long long)first + count, (long long)l->info.n_val);
    if (count > b->capacity)
        return sd_err_set(err, "%d validation samples do not fit a batch of capacity %d", count,
                          b->capacity);
    b->step = -1;
    b->epoch = -1;
    b->count = 0;
    for (int i = 0; i < count; i += VAL_CHUNK) {
        int n = count - i < VAL_CHUNK ? count - i : VAL_CHUNK;
        for (int k = 0; k < n; k++) {
            uint32_t ord = l->val[first + i + k];
            items[k].ord = ord;
            items[k].dst = i + k;
            b->positions[i + k] = first + i + k;
            b->ids[i + k] = id_of(l, l->info.n_shards, ord);
        }
        /* The list is ascending, so runs land on consecutive rows: no staging needed. */
        if (read_items(l, l->info.n_shards, items, n, b, NULL, NULL, err))
            return -1;
    }
    b->count = count;
    return 0;
}

/* ---- open and close ------------------------------------------------------------------------- */

/* What rank 0 learns from the shards and broadcasts (plain data: every rank runs the same
 * binary), with the options it was given so that the other ranks can check theirs. */
typedef struct open_header {
    int32_t status;
    int32_t storage;        /* the failure was the storage's (sd_err.storage) */
    char msg[sizeof(((sd_err *)0)->msg)];
    int32_t resolution, latent_channels, latent_size, text_len, embed_dim;
    double scaling_factor;
    char weights_hash[128];
    int64_t n_shards, n_samples, n_val;
    int32_t batch_per_rank;
    uint64_t seed;
    int64_t window;
    double val_fraction;
    int32_t follow;
    int64_t n_planned;      /* follow mode: the preprocessing half's shards */
} open_header;

static int check_options(const sd_loader_options *o, sd_err *err)
{
    if (!o->shard_dir || !o->shard_dir[0])
        return sd_err_set(err, "the data loader needs a shard directory (&data shard_dir)");
    if (strlen(o->shard_dir) >= SD_PATH_MAX)
        return sd_err_set(err, "shard directory path too long: '%.64s...'", o->shard_dir);
    if (!(o->val_fraction >= 0 && o->val_fraction < 1))
        return sd_err_set(err, "validation fraction %g is not in [0, 1)", o->val_fraction);
    if (o->batch_per_rank < 1)
        return sd_err_set(err, "batch size per rank %d is not positive", o->batch_per_rank);
    if (o->max_open_shards < 0)
        return sd_err_set(err, "max_open_shards %d is negative", o->max_open_shards);
    if (o->shuffle_window < 0 || o->shuffle_window > SD_LOADER_MAX_SHUFFLE_WINDOW)
        return sd_err_set(err, "shuffle window %lld is not in [0, %d]",
                          (long long)o->shuffle_window, SD_LOADER_MAX_SHUFFLE_WINDOW);
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Collective over comm (every rank, not in follow mode): the committed shards of o->shard_dir,
 * checked and scanned (scan_shard), into the header's shape and counts, *m, the held-out
 * ordinals (ascending), shard 0's empty-caption embedding and each shard's direct layout, on
 * every rank. Rank 0 reads the manifest and shard 0 (whose shapes the others must match); the
 * other shards are scanned by rank k mod size, so a job of many ranks opens each shard once at
 * start-up, not every shard on one rank while the rest wait (at tens of thousands of shards on a
 * parallel file system that took minutes). A failure is everyone's: the one of the lowest shard,
 * else rank 0's; -1 on every rank with the same message. */
static int scan_shards(MPI_Comm comm, const sd_loader_options *o, open_header *h,
                       sd_shard_manifest *m, uint32_t **val_out, float **empty_out,
                       sd_shard_direct **direct_out, sd_err *err)
{
    const char *dir = o->shard_dir;
    sd_loader_info want;
    uint32_t *val = NULL;
    size_t val_cap = 0;
    float *empty = NULL;
    sd_shard_direct *direct = NULL;
    int64_t n_val = 0, n_train, global, *first = NULL, bad_shard, mine_bad = INT64_MAX;
    int rank, size, rc = 0;
    struct {
        char msg[sizeof(((sd_err *)0)->msg)];
        int32_t storage;
        int32_t want[5];
        double scaling_factor;
        char weights_hash[128];
        int64_t n;
    } head;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    memset(&want, 0, sizeof want);
    memset(&head, 0, sizeof head);
    memset(m, 0, sizeof *m);
    *val_out = NULL;
    *empty_out = NULL;
    *direct_out = NULL;

    /* rank 0: the manifest and shard 0 */
    if (rank == 0) {
        struct stat st;
        if (sd_stat(dir, &st) != 0)
            rc = sd_err_errno(err, errno, "cannot read shard directory '%s'", dir);
        else if (!S_ISDIR(st.st_mode))
            rc = sd_err_set(err, "shard directory '%s' is not a directory", dir);
        else if (sd_shards_committed(dir, m, err))
            rc = -1;
        else if (m->n == 0)
            rc = sd_err_set(err, "no committed shards in '%s' (no %s listing any; preprocess "
                                 "first: mode 'process')", dir, SD_SHARD_MANIFEST);
        else if (m->total_samples >= (int64_t)UINT32_MAX)
            rc = sd_err_set(err, "%s: %lld samples; the loader takes at most %llu", dir,
                            (long long)m->total_samples, (unsigned long long)UINT32_MAX - 1);
        if (rc == 0) {
            int have = 0;
            direct = sd_xcalloc((size_t)m->n, sizeof *direct);
            rc = scan_shard(dir, &m->entries[0], o->val_fraction, &want, &have, &empty, 0, &val,
                            &n_val, &val_cap, &direct[0], err);
        }
        if (rc) {
            snprintf(head.msg, sizeof head.msg, "%s", err->msg);
            head.storage = err->storage;
            head.n = -1;
        } else {
            head.n = m->n;
            head.want[0] = want.resolution;
            head.want[1] = want.latent_channels;
            head.want[2] = want.latent_size;
            head.want[3] = want.text_len;
            head.want[4] = want.embed_dim;
            head.scaling_factor = want.scaling_factor;
            memcpy(head.weights_hash, want.weights_hash, sizeof head.weights_hash);
        }
    }
    SD_MPI_CHECK(MPI_Bcast(&head, (int)sizeof head, MPI_BYTE, 0, comm));
    if (head.n < 0) {
        if (rank != 0) {
            sd_err_set(err, "%s", head.msg);
            err->storage = head.storage;
        }
        goto out;
    }
    want.resolution = head.want[0];
    want.latent_channels = head.want[1];
    want.latent_size = head.want[2];
    want.text_len = head.want[3];
    want.embed_dim = head.want[4];
    want.scaling_factor = head.scaling_factor;
    memcpy(want.weights_hash, head.weights_hash, sizeof want.weights_hash);
    if (rank != 0) {
        m->n = head.n;
        m->entries = sd_xmalloc((size_t)m->n * sizeof *m->entries);
        direct = sd_xcalloc((size_t)m->n, sizeof *direct);
        empty = sd_xmalloc((size_t)want.text_len * (size_t)want.embed_dim * sizeof *empty);
    }
    sd_bcast_bytes(m->entries, (size_t)m->n * sizeof *m->entries, comm);
    sd_bcast_bytes(empty, (size_t)want.text_len * (size_t)want.embed_dim * sizeof *empty, comm);
    first = sd_xmalloc((size_t)(m->n + 1) * sizeof *first);
    first[0] = 0;
    for (int64_t k = 0; k < m->n; k++)
        first[k + 1] = first[k] + m->entries[k].samples;
    m->total_samples = first[m->n];

    /* the other shards, shard k on rank k mod size; the first failure of each rank */
    for (int64_t k = rank == 0 ? size : rank; k < m->n; k += size) {
        int have = 1;
        if (scan_shard(dir, &m->entries[k], o->val_fraction, &want, &have, &empty,
                       (uint32_t)first[k], &val, &n_val, &val_cap, &direct[k], err)) {
            mine_bad = k;
            break;
        }
    }
    SD_MPI_CHECK(MPI_Allreduce(&mine_bad, &bad_shard, 1, MPI_INT64_T, MPI_MIN, comm));
    if (bad_shard != INT64_MAX) {
        const int owner = (int)(bad_shard % size);
        if (rank == owner) {
            snprintf(head.msg, sizeof head.msg, "%s", err->msg);
            head.storage = err->storage;
        }
        SD_MPI_CHECK(MPI_Bcast(&head, (int)sizeof head, MPI_BYTE, owner, comm));
        sd_err_set(err, "%s", head.msg);
        err->storage = head.storage;
        goto out;
    }
    {
        /* every rank's held-out ordinals and layouts, to every rank */
        int n_mine = (int)n_val, *counts = sd_xmalloc((size_t)size * sizeof *counts);
        int *displs = sd_xmalloc((size_t)size * sizeof *displs);
        int64_t total = 0;
        uint32_t *all;
        SD_CHECK(n_val <= INT32_MAX, "%lld held-out samples on one rank", (long long)n_val);
        SD_MPI_CHECK(MPI_Allgather(&n_mine, 1, MPI_INT, counts, 1, MPI_INT, comm));
        for (int r = 0; r < size; r++) {
            SD_CHECK(total <= INT32_MAX, "held-out samples past an MPI count");
            displs[r] = (int)total;
            total += counts[r];
        }
        all = sd_xmalloc(((size_t)total + 1) * sizeof *all);
        SD_MPI_CHECK(MPI_Allgatherv(val, n_mine, MPI_UINT32_T, all, counts, displs, MPI_UINT32_T,
                                    comm));
        qsort(all, (size_t)total, sizeof *all, cmp_u32);
        free(val);
        val = all;
        n_val = total;
        free(counts);
        free(displs);
        /* each shard's layout comes from one rank, zeros from the others */
        SD_CHECK(sizeof *direct == 3 * sizeof(uint64_t), "sd_shard_direct of %zu bytes", sizeof *direct);
        for (int64_t k0 = 0; k0 < m->n; k0 += (int64_t)1 << 24) {
            const int64_t cnt = m->n - k0 < ((int64_t)1 << 24) ? m->n - k0 : ((int64_t)1 << 24);
            SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, direct + k0, (int)(3 * cnt), MPI_UINT64_T,
                                       MPI_BOR, comm));
        }
    }
    h->n_val = n_val;
    n_train = m->total_samples - h->n_val;
    global = (int64_t)size * o->batch_per_rank;
    if (m->total_samples == 0) {
        no_samples(err, dir, m->n);
        goto out;
    }
    if (n_train < global) {
        sd_err_set(err, "%s: %lld training samples (of %lld; %lld held out for validation) are fewer "
                        "than one global batch of %lld (%d ranks x %d)", dir, (long long)n_train,
                   (long long)m->total_samples, (long long)h->n_val, (long long)global, size,
                   o->batch_per_rank);
        goto out;
    }
    h->resolution = want.resolution;
    h->latent_channels = want.latent_channels;
    h->latent_size = want.latent_size;
    h->text_len = want.text_len;
    h->embed_dim = want.embed_dim;
    h->scaling_factor = want.scaling_factor;
    memcpy(h->weights_hash, want.weights_hash, sizeof h->weights_hash);
    h->n_shards = m->n;
    h->n_samples = m->total_samples;
    free(first);
    *val_out = val;
    *empty_out = empty;
    *direct_out = direct;
    return 0;
out:
    free(first);
    free(val);
    free(empty);
    free(direct);
    sd_shard_manifest_free(m);
    return -1;
}

/* Starts the prefetch thread with every signal blocked in it, so that signals (a stop request,
 * Slurm's warning before the time limit) reach the main thread. */
static int start_thread(sd_loader *l, sd_err *err)
{
    sigset_t all, old;
    int rc;
    sigfillset(&all);
    SD_CHECK(pthread_sigmask(SIG_SETMASK, &all, &old) == 0, "block signals");
    rc = pthread_create(&l->thread, NULL, prefetch_main, l);
    SD_CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0, "restore signals");
    if (rc != 0)
        return sd_err_set(err, "cannot start the data prefetch thread: %s", strerror(rc));
    l->thread_started = 1;
    return 0;
}

/* How many of `n` shards the loader may keep open: each takes a file descriptor, so the soft
 * limit is raised (towards the hard one) to n plus a reserve for everything else the process
 * opens (MPI, checkpoints, logs, the other loader); n when that fits, else what does. */
static int fit_open_shards(int n)
{
    const rlim_t reserve = 256, want = (rlim_t)n + reserve;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= want)
        return n;
    {
        struct rlimit raised = lim;
        raised.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max >= want ? want : lim.rlim_max;
        if (raised.rlim_cur > lim.rlim_cur && setrlimit(RLIMIT_NOFILE, &raised) == 0)
            lim.rlim_cur = raised.rlim_cur;
    }
    if (lim.rlim_cur >= want)
        return n;
    return lim.rlim_cur > reserve + 1 ? (int)(lim.rlim_cur - reserve) : 1;
}

int sd_loader_open(MPI_Comm comm, const sd_loader_options *opt, sd_loader **out, sd_err *err)
{
    open_header h;
    sd_shard_manifest m = {0, NULL, 0};
    uint32_t *val = NULL;
    float *empty = NULL;
    sd_shard_direct *direct = NULL;
    sd_loader *l;
    int rank, size, failed;
    *out = NULL;
    err->msg[0] = '\0';
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));

    memset(&h, 0, sizeof h);
    if (opt->follow) /* bounded by &data shard_wait_timeout, not by the stall watchdog */
        sd_progress_wait_begin("waiting for the preprocessing half's plan");
    if (rank == 0) {
        int64_t plan[2] = {0, 0};
        int rc = check_options(opt, err);
        if (rc == 0 && opt->follow) {
            /* follow mode: the shards come later (follow_sync below), the plan now */
            rc = receive_plan(opt, plan, err);
            if (rc == 0 && plan[0] < 1)
                rc = sd_err_set(err, "the preprocessing half has no shards to write (its dataset "
                                     "has %lld samples)", (long long)plan[1]);
            if (rc == 0 && plan[1] >= (int64_t)UINT32_MAX)
                rc = sd_err_set(err, "the preprocessing half plans %lld samples; the loader takes at "
                                     "most %llu", (long long)plan[1], (unsigned long long)UINT32_MAX - 1);
            h.follow = 1;
            h.n_planned = plan[0];
        }
        if (rc == 0) {
            h.batch_per_rank = opt->batch_per_rank;
            h.seed = opt->seed;
            h.window = opt->shuffle_window;
            h.val_fraction = opt->val_fraction;
        } else {
            h.status = -1;
            h.storage = err->storage;
            snprintf(h.msg, sizeof h.msg, "%s", err->msg);
        }
    }
    {
        /* follow mode: rank 0 may wait long for the plan; the others wait without spinning */
        MPI_Request req;
        SD_MPI_CHECK(MPI_Ibcast(&h, (int)sizeof h, MPI_BYTE, 0, comm, &req));
        sd_mpi_wait_idle(&req);
        if (opt->follow)
            sd_progress_wait_end();
    }
    if (h.status) {
        sd_err_set(err, "%s", h.msg);
        err->storage = h.storage;
        return -1;
    }
    /* the committed shards, scanned by all ranks together (every rank gets the results) */
    if (!h.follow && scan_shards(comm, opt, &h, &m, &val, &empty, &direct, err) != 0)
        return -1;

    l = sd_xcalloc(1, sizeof *l);
    {
        /* Test hook: every read through HDF5, as for shards without the direct layout */
        const char *hook = getenv("SDTRAIN_TEST_LOADER_HDF5");
        l->hdf5_only = hook && *hook && strcmp(hook, "0") != 0;
    }
    l->info.resolution = h.resolution;
    l->info.latent_channels = h.latent_channels;
    l->info.latent_size = h.latent_size;
    l->info.text_len = h.text_len;
    l->info.embed_dim = h.embed_dim;
    l->info.scaling_factor = h.scaling_factor;
    memcpy(l->info.weights_hash, h.weights_hash, sizeof l->info.weights_hash);
    l->info.n_shards = h.n_shards;
    l->info.n_samples = h.n_samples;
    l->info.n_val = h.n_val;
    l->info.n_train = h.n_samples - h.n_val;
    l->info.batch_per_rank = h.batch_per_rank;
    l->info.rank = rank;
    l->info.n_ranks = size;
    l->info.global_batch = (int64_t)size * h.batch_per_rank;
    l->info.steps_per_epoch = l->info.n_train / l->info.global_batch;
    l->info.complete = !h.follow;
    l->info.n_planned = h.follow ? h.n_planned : h.n_shards;
    l->seed = h.seed;
    l->window = h.window;
    l->val_fraction = h.val_fraction;
    l->follow = h.follow;
    l->val_shard = -1;
    l->comm = comm;
    l->timeout = opt->wait_timeout_s > 0 ? opt->wait_timeout_s : 3600;
    l->poll = opt->poll_interval_s > 0 ? opt->poll_interval_s : 0.2;
    l->stop_poll = opt->stop_poll;
    l->stop_ctx = opt->stop_ctx;
    snprintf(l->dir, sizeof l->dir, "%s", opt->shard_dir ? opt->shard_dir : "");
    l->m_el = (size_t)(2 * h.latent_channels) * (size_t)h.latent_size * (size_t)h.latent_size;
    l->e_el = (size_t)h.text_len * (size_t)h.embed_dim;

    if (l->follow) {
        /* room for every planned shard: the reader thread looks at these arrays while the
         * caller's thread appends shards, so they never move */
        l->entries = sd_xcalloc((size_t)h.n_planned, sizeof *l->entries);
        l->direct = sd_xcalloc((size_t)h.n_planned, sizeof *l->direct);
        l->first = sd_xcalloc((size_t)h.n_planned + 1, sizeof *l->first);
        l->seg = sd_xcalloc((size_t)h.n_planned, sizeof *l->seg);
        l->tfirst = sd_xcalloc((size_t)h.n_planned + 1, sizeof *l->tfirst);
    } else {
        l->entries = m.entries;
        l->direct = direct;
        l->val = val;
        l->empty = empty;
        m.entries = NULL;
        l->heldout = l->val;
        l->n_heldout = h.n_val;
    }

    /* Every rank checks its own options against rank 0's; the first failure is everyone's. */
    failed = check_options(opt, err) != 0;
    if (!failed && (opt->batch_per_rank != h.batch_per_rank || opt->seed != h.seed ||
                    opt->val_fraction != h.val_fraction))
        failed = sd_err_set(err, "rank %d was given other loader options than rank 0 (batch per rank %d, "
                                 "seed %llu, validation fraction %g)", rank, opt->batch_per_rank,
                            (unsigned long long)opt->seed, opt->val_fraction) != 0;
    if (l->follow) {
        /* every rank agrees on the options before the first poll (collective) */
        if (sd_agree(comm, failed, err) == 0) {
            if (rank == 0)
                sd_info("data: following the shards of %s as the preprocessing half commits them "
                        "(%lld planned; the first pass takes them in index order)", l->dir,
                        (long long)h.n_planned);
            failed = follow_sync(l, 1, 0, err) != 0 ? -1 : 0;
            /* the validation set is fixed at open: wait past empty shards for the first one
             * holding samples (every rank decides alike: the state is the broadcast one) */
            while (!failed && l->val_shard < 0 && !l->info.complete)
                failed = follow_sync(l, l->info.n_shards + 1, 0, err) != 0 ? -1 : 0;
            if (!failed && l->val_shard > 0 && rank == 0) {
                char empties[64] = "shard 0 is";
                if (l->val_shard > 1)
                    snprintf(empties, sizeof empties, "shards 0 to %lld are",
                             (long long)l->val_shard - 1);
                sd_info("validation: %s empty (each sample was skipped in preprocessing); the "
                        "validation set is the held-out samples of shard %lld, the first holding "
                        "samples", empties, (long long)l->entries[l->val_shard].index);
            }
        } else {
            failed = -1;
        }
        if (failed) {
            const int stopped = l->stopped;
            sd_loader_close(l);
            return stopped ? SD_LOADER_STOPPED : -1; /* the same on every rank */
        }
    }
    if (!failed && !l->follow) {
        l->first = sd_xmalloc(((size_t)h.n_shards + 1) * sizeof *l->first);
        l->first[0] = 0;
        for (int64_t k = 0; k < h.n_shards; k++)
            l->first[k + 1] = l->first[k] + l->entries[k].samples;
        SD_CHECK(l->first[h.n_shards] == h.n_samples, "manifest of %lld samples, expected %lld",
                 (long long)l->first[h.n_shards], (long long)h.n_samples);
        l->order = sd_xmalloc((size_t)l->info.n_train * sizeof *l->order);
    }
    if (!failed) {
        l->order_epoch = -1;
        l->items = sd_xmalloc((size_t)h.batch_per_rank * sizeof *l->items);
        l->stage_m = sd_xmalloc((size_t)h.batch_per_rank * l->m_el * sizeof(float));
        l->stage_e = sd_xmalloc((size_t)h.batch_per_rank * l->e_el * sizeof(float));
        const int want = opt->max_open_shards ? opt->max_open_shards : SD_LOADER_MAX_OPEN_SHARDS;
        l->n_cache = fit_open_shards(want);
        if (l->n_cache < want && rank == 0)
            sd_warn("the loader keeps %d shards open instead of %d (&data open_shards): the "
                    "limit of open files (ulimit -n) leaves no room for more", l->n_cache, want);
        l->cache = sd_xcalloc((size_t)l->n_cache, sizeof *l->cache);
        for (int c = 0; c < l->n_cache; c++) {
            l->cache[c].pos = -1;
            l->cache[c].fd = -1;
        }
        l->scratch = sd_xmalloc((size_t)h.batch_per_rank * (l->m_el > l->e_el ? l->m_el : l->e_el) *
                                sizeof *l->scratch);
        if (!l->follow)
            for (int64_t k = 0; k < h.n_shards; k++)
                l->info.n_direct += direct_ok(l, k);
        l->prefetch = opt->prefetch != 0;
        l->n_slots = l->prefetch ? 2 : 1;
        for (int s = 0; s < l->n_slots; s++)
            batch_init(&l->slots[s].batch, h.batch_per_rank, l->m_el, l->e_el);
        l->held = -1;
        SD_CHECK(pthread_mutex_init(&l->mu, NULL) == 0, "loader mutex");
        SD_CHECK(pthread_cond_init(&l->cv, NULL) == 0, "loader condition");
        if (l->prefetch)
            failed = start_thread(l, err) != 0;
    }
    if (sd_agree(comm, failed, err)) {
        sd_loader_close(l);
        return -1;
    }
    *out = l;
    return 0;
}

void sd_loader_close(sd_loader *l)
{
    if (!l)
        return;
    if (l->thread_started) {
        SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "loader lock");
        l->stop = 1;
        SD_CHECK(pthread_cond_broadcast(&l->cv) == 0, "loader signal");
        SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
        SD_CHECK(pthread_join(l->thread, NULL) == 0, "join the prefetch thread");
    }
    if (l->cache) {
        sd_loader_h5_lock();
        for (int c = 0; c < l->n_cache; c++) {
            if (l->cache[c].pos >= 0 && l->cache[c].shard)
                sd_shard_close(l->cache[c].shard);
            if (l->cache[c].pos >= 0 && l->cache[c].fd >= 0)
                close(l->cache[c].fd);
        }
        sd_loader_h5_unlock();
    }
    if (l->n_slots) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    for (int s = 0; s < l->n_slots; s++)
        sd_loader_batch_free(&l->slots[s].batch);
    free(l->cache);
    free(l->scratch);
    free(l->stage_m);
    free(l->stage_e);
    free(l->items);
    free(l->order);
    free(l->first);
    free(l->empty);
    if (l->heldout != l->val)
        free(l->heldout);
    free(l->val);
    free(l->entries);
    free(l->direct);
    if (l->seg)
        for (int64_t k = 0; k < l->info.n_shards; k++)
            free(l->seg[k]);
    free(l->seg);
    free(l->tfirst);
    free(l);
}
