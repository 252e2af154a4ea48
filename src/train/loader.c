/* The training data loader: rank 0 scans the committed shards and splits train/val by key hash,
 * every rank derives the seeded epoch order and reads its slice of each global batch, a
 * background thread reading the next step while the caller uses the current one. */
#include "sdtrain/loader.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/rng.h"
#include "sdtrain/runtime.h"
#include "sdtrain/shards.h"
#include "sdtrain/timer.h"

#define SHUFFLE_PURPOSE SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 0)
/* Validation samples read per round: the run-finding scratch lives on the stack. */
#define VAL_CHUNK 64
/* Largest broadcast message; MPI counts are int. */
#define BCAST_CHUNK ((size_t)1 << 30)

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
}

/* ---- the validation split (sd-keyhash-v1: loader.h; never change it) ------------------------- */

static uint64_t fmix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t sd_loader_key_hash(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    /* FNV-1a's top bits barely move when only the last bytes differ (keys count up); the
     * finalizer spreads every input bit over the bits that decide the split. */
    return fmix64(h);
}

int sd_loader_key_is_val(const char *key, double val_fraction)
{
    double u = (double)(sd_loader_key_hash(key) >> 11) * 1.1102230246251565404e-16; /* 2^-53 */
    return u < val_fraction;
}

/* ---- state ---------------------------------------------------------------------------------- */

enum { SLOT_EMPTY, SLOT_REQUESTED, SLOT_READING, SLOT_READY };

/* One of the two step buffers: the caller holds one while the thread fills the other. */
typedef struct slot {
    sd_loader_batch batch;
    int state;
    int64_t step;
    int rc;
    sd_err err;
} slot;

typedef struct open_shard {
    int64_t pos;    /* manifest position, -1 when free */
    sd_shard *shard;
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
    char dir[SD_PATH_MAX];
    sd_shard_entry *entries; /* the manifest, n_shards */
    int64_t *first;          /* ordinal of each shard's row 0; first[n_shards] = n_samples */
    uint32_t *val;           /* validation ordinals, ascending */
    float *empty;            /* [L, D] */
    size_t m_el, e_el;       /* floats per sample: moments, embedding */

    /* The reader: the prefetch thread, or the caller when prefetch is off (never both). */
    uint32_t *order;         /* the epoch's order of the train list */
    int64_t order_epoch;     /* -1 before the first */
    read_item *items;        /* [batch_per_rank] */
    float *stage_m, *stage_e; /* [batch_per_rank] samples, for runs whose rows are scattered */

    /* Under h5_lock. */
    open_shard *cache;
    int n_cache;
    uint64_t tick;

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

/* Manifest position of the shard holding ordinal `ord`. */
static int64_t shard_of(const sd_loader *l, uint32_t ord)
{
    int64_t lo = 0, hi = l->info.n_shards - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (l->first[mid] <= (int64_t)ord)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static sd_sample_id id_of(const sd_loader *l, uint32_t ord)
{
    int64_t pos = shard_of(l, ord);
    sd_sample_id id = {l->entries[pos].index, (int64_t)ord - l->first[pos]};
    return id;
}

/* A shard whose shapes differ from those of the shards scanned at open (the file was replaced
 * by another of the same size) would be read into buffers of the wrong size. */
static int check_shape(const sd_loader_info *want, const sd_shard_info *in, sd_err *err)
{
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

/* The open shard at manifest position `pos`, opening it (and closing the least recently used
 * one) when needed. Caller holds h5_lock. */
static int shard_get(sd_loader *l, int64_t pos, sd_shard **out, sd_err *err)
{
    open_shard *victim = &l->cache[0];
    sd_shard *s;
    for (int c = 0; c < l->n_cache; c++) {
        open_shard *o = &l->cache[c];
        if (o->pos == pos) {
            o->used = ++l->tick;
            *out = o->shard;
            return 0;
        }
        if (o->used < victim->used)
            victim = o;
    }
    if (victim->pos >= 0) {
        sd_shard_close(victim->shard);
        victim->pos = -1;
        victim->shard = NULL;
        victim->used = 0;
    }
    if (sd_shard_open_entry(l->dir, &l->entries[pos], &s, err))
        return -1;
    if (check_shape(&l->info, sd_shard_get_info(s), err)) {
        sd_shard_close(s);
        return -1;
    }
    victim->pos = pos;
    victim->shard = s;
    victim->used = ++l->tick;
    *out = s;
    return 0;
}

/* Reads rows [row, row + n) of shard `pos` into m (n x 2C x h x w) and e (n x L x D). */
static int read_rows(sd_loader *l, int64_t pos, int64_t row, int64_t n, float *m, float *e, sd_err *err)
{
    sd_shard *s;
    int rc;
    sd_loader_h5_lock();
    rc = shard_get(l, pos, &s, err);
    if (rc == 0)
        rc = sd_shard_read_moments(s, row, n, 1, SD_LATENT_NCHW, m, err);
    if (rc == 0)
        rc = sd_shard_read_embeddings(s, row, n, 1, e, err);
    sd_loader_h5_unlock();
    return rc ? -1 : 0;
}

/* Reads items (ascending ordinals) into their rows of b. Consecutive ordinals of one shard are
 * one read: straight into b when their rows are consecutive too, else through the staging
 * buffers (which runs of scattered rows need, so only the training reader may meet them). */
static int read_items(sd_loader *l, const read_item *items, int n, sd_loader_batch *b, float *stage_m,
                      float *stage_e, sd_err *err)
{
    int end;
    for (int i = 0; i < n; i = end) {
        int64_t pos = shard_of(l, items[i].ord), row = (int64_t)items[i].ord - l->first[pos];
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

/* order = the train list (all ordinals but the validation ones, ascending), shuffled by the
 * Fisher-Yates of loader.h for `epoch`: a pure function of (seed, epoch) and the split. */
static int build_order(sd_loader *l, int64_t epoch, sd_err *err)
{
    const int64_t n = l->info.n_train, n_val = l->info.n_val;
    int64_t k = 0, v = 0;
    uint32_t *o = l->order;
    if (epoch > (int64_t)SD_RNG_MAX_STEP)
        return sd_err_set(err, "epoch %lld is beyond the shuffle stream's limit %llu", (long long)epoch,
                          (unsigned long long)SD_RNG_MAX_STEP);
    for (int64_t g = 0; g < l->info.n_samples; g++) {
        if (v < n_val && (int64_t)l->val[v] == g) {
            v++;
            continue;
        }
        o[k++] = (uint32_t)g;
    }
    SD_CHECK(k == n, "train list of %lld samples, expected %lld", (long long)k, (long long)n);
    for (int64_t i = n - 1; i >= 1; i--) {
        uint32_t j = sd_rng_below(l->seed, SHUFFLE_PURPOSE, (uint64_t)epoch, (uint64_t)i >> 24,
                                  (uint32_t)(i & 0xFFFFFF), (uint32_t)(i + 1));
        uint32_t t = o[i];
        o[i] = o[j];
        o[j] = t;
    }
    l->order_epoch = epoch;
    return 0;
}

/* This rank's samples of `step` into b. Runs in the reader (thread or caller). */
static int read_step(sd_loader *l, int64_t step, sd_loader_batch *b, sd_err *err)
{
    const sd_loader_info *in = &l->info;
    int64_t epoch = step / in->steps_per_epoch;
    int64_t mine = (int64_t)in->rank * in->batch_per_rank;
    int64_t base = (step % in->steps_per_epoch) * in->global_batch + mine;
    if (epoch != l->order_epoch && build_order(l, epoch, err))
        return -1;
    b->step = step;
    b->count = in->batch_per_rank;
    for (int j = 0; j < in->batch_per_rank; j++) {
        uint32_t ord = l->order[base + j];
        l->items[j].ord = ord;
        l->items[j].dst = j;
        b->positions[j] = mine + j;
        b->ids[j] = id_of(l, ord);
    }
    /* Sorted by ordinal, neighbouring rows of a shard become one read. */
    sort_items(l->items, in->batch_per_rank);
    return read_items(l, l->items, in->batch_per_rank, b, l->stage_m, l->stage_e, err);
}

/* ---- prefetch ------------------------------------------------------------------------------- */

static void request(sd_loader *l, int k, int64_t step)
{
    l->slots[k].state = SLOT_REQUESTED;
    l->slots[k].step = step;
    SD_CHECK(pthread_cond_broadcast(&l->cv) == 0, "signal the prefetch thread");
}

static void *prefetch_main(void *arg)
{
    sd_loader *l = arg;
    SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "prefetch lock");
    for (;;) {
        int k = -1;
        int64_t step;
        sd_err e;
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
        step = l->slots[k].step;
        SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "prefetch unlock");
        e.msg[0] = '\0';
        rc = read_step(l, step, &l->slots[k].batch, &e);
        SD_CHECK(pthread_mutex_lock(&l->mu) == 0, "prefetch lock");
        l->slots[k].rc = rc;
        l->slots[k].err = e;
        l->slots[k].state = SLOT_READY;
        SD_CHECK(pthread_cond_broadcast(&l->cv) == 0, "prefetch signal");
    }
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "prefetch unlock");
    return NULL;
}

static int check_step(const sd_loader *l, int64_t step, sd_err *err)
{
    if (step < 0)
        return sd_err_set(err, "cannot seek the data loader to step %lld", (long long)step);
    if (step / l->info.steps_per_epoch > (int64_t)SD_RNG_MAX_STEP)
        return sd_err_set(err, "step %lld is in epoch %lld, beyond the shuffle stream's limit %llu",
                          (long long)step, (long long)(step / l->info.steps_per_epoch),
                          (unsigned long long)SD_RNG_MAX_STEP);
    return 0;
}

int sd_loader_seek(sd_loader *l, int64_t step, sd_err *err)
{
    if (check_step(l, step, err))
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
    request(l, 0, step);
    SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
    return 0;
}

int sd_loader_next(sd_loader *l, const sd_loader_batch **batch, double *wait_seconds, sd_err *err)
{
    double t0 = sd_time_now();
    const int64_t step = l->next_step;
    slot *s;
    int k = -1;
    *batch = NULL;
    if (wait_seconds)
        *wait_seconds = 0;
    if (!l->prefetch) {
        s = &l->slots[0];
        /* A failed step stays failed until a seek (as with prefetch). */
        if (!(s->state == SLOT_READY && s->step == step && s->rc)) {
            s->step = step;
            s->err.msg[0] = '\0';
            s->rc = check_step(l, step, &s->err) || read_step(l, step, &s->batch, &s->err);
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
        if (check_step(l, step, err)) {
            SD_CHECK(pthread_mutex_unlock(&l->mu) == 0, "loader unlock");
            return -1;
        }
        request(l, k, step);
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
    for (int i = 0; i < l->n_slots; i++)
        if (i != k && l->slots[i].state == SLOT_EMPTY && check_step(l, step + 1, NULL) == 0) {
            request(l, i, step + 1);
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
    b->count = 0;
    for (int i = 0; i < count; i += VAL_CHUNK) {
        int n = count - i < VAL_CHUNK ? count - i : VAL_CHUNK;
        for (int k = 0; k < n; k++) {
            uint32_t ord = l->val[first + i + k];
            items[k].ord = ord;
            items[k].dst = i + k;
            b->positions[i + k] = first + i + k;
            b->ids[i + k] = id_of(l, ord);
        }
        /* The list is ascending, so runs land on consecutive rows: no staging needed. */
        if (read_items(l, items, n, b, NULL, NULL, err))
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
    char msg[sizeof(((sd_err *)0)->msg)];
    int32_t resolution, latent_channels, latent_size, text_len, embed_dim;
    double scaling_factor;
    int64_t n_shards, n_samples, n_val;
    int32_t batch_per_rank;
    uint64_t seed;
    double val_fraction;
} open_header;

static void bcast_bytes(void *buf, size_t bytes, MPI_Comm comm)
{
    for (size_t off = 0; off < bytes; off += BCAST_CHUNK) {
        size_t n = bytes - off < BCAST_CHUNK ? bytes - off : BCAST_CHUNK;
        SD_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, 0, comm));
    }
}

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
    return 0;
}

/* Rank 0: the manifest, the shapes every shard must share, the validation ordinals and the
 * empty-caption embedding. */
static int scan_shards(const sd_loader_options *o, int n_ranks, open_header *h, sd_shard_manifest *m,
                       uint32_t **val_out, float **empty_out, sd_err *err)
{
    const char *dir = o->shard_dir;
    sd_loader_info want;
    uint32_t *val = NULL;
    size_t val_cap = 0;
    float *empty = NULL;
    char *keys = NULL;
    int64_t ord = 0, n_train, global;
    struct stat st;
    int rc = -1;
    memset(&want, 0, sizeof want);
    if (stat(dir, &st) != 0)
        return sd_err_set(err, "cannot read shard directory '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return sd_err_set(err, "shard directory '%s' is not a directory", dir);
    if (sd_shards_committed(dir, m, err))
        return -1;
    if (m->n == 0)
        return sd_err_set(err, "no committed shards in '%s' (no %s listing any; preprocess first: "
                               "mode 'process')", dir, SD_SHARD_MANIFEST);
    if (m->total_samples >= (int64_t)UINT32_MAX)
        return sd_err_set(err, "%s: %lld samples; the loader takes at most %llu", dir,
                          (long long)m->total_samples, (unsigned long long)UINT32_MAX - 1);
    for (int64_t k = 0; k < m->n; k++) {
        const sd_shard_entry *e = &m->entries[k];
        const sd_shard_info *in;
        sd_shard *s;
        size_t kw;
        int r;
        sd_loader_h5_lock();
        r = sd_shard_open_entry(dir, e, &s, err);
        if (r) {
            sd_loader_h5_unlock();
            goto out;
        }
        in = sd_shard_get_info(s);
        if (k == 0) {
            want.resolution = in->resolution;
            want.latent_channels = in->latent_channels;
            want.latent_size = in->latent_size;
            want.text_len = in->text_len;
            want.embed_dim = in->embed_dim;
            want.scaling_factor = in->scaling_factor;
            empty = sd_xmalloc((size_t)in->text_len * (size_t)in->embed_dim * sizeof(float));
            r = sd_shard_read_empty_embedding(s, empty, err);
        }
        if (r == 0)
            r = check_shape(&want, in, err);
        kw = in->key_width + 1;
        if (r == 0) {
            keys = sd_xrealloc(keys, (size_t)in->n_samples * kw);
            r = sd_shard_read_keys(s, 0, in->n_samples, 1, keys, kw, err);
        }
        sd_shard_close(s);
        sd_loader_h5_unlock();
        if (r)
            goto out;
        for (int64_t i = 0; i < e->samples; i++, ord++)
            if (sd_loader_key_is_val(keys + (size_t)i * kw, o->val_fraction)) {
                if ((size_t)h->n_val == val_cap) {
                    val_cap = val_cap ? 2 * val_cap : 1024;
                    val = sd_xrealloc(val, val_cap * sizeof *val);
                }
                val[h->n_val++] = (uint32_t)ord;
            }
    }
    n_train = m->total_samples - h->n_val;
    global = (int64_t)n_ranks * o->batch_per_rank;
    if (n_train < global) {
        sd_err_set(err, "%s: %lld training samples (of %lld; %lld held out for validation) are fewer "
                        "than one global batch of %lld (%d ranks x %d)", dir, (long long)n_train,
                   (long long)m->total_samples, (long long)h->n_val, (long long)global, n_ranks,
                   o->batch_per_rank);
        goto out;
    }
    h->resolution = want.resolution;
    h->latent_channels = want.latent_channels;
    h->latent_size = want.latent_size;
    h->text_len = want.text_len;
    h->embed_dim = want.embed_dim;
    h->scaling_factor = want.scaling_factor;
    h->n_shards = m->n;
    h->n_samples = m->total_samples;
    rc = 0;
out:
    free(keys);
    if (rc) {
        free(val);
        free(empty);
        val = NULL;
        empty = NULL;
    }
    *val_out = val;
    *empty_out = empty;
    return rc;
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

int sd_loader_open(MPI_Comm comm, const sd_loader_options *opt, sd_loader **out, sd_err *err)
{
    open_header h;
    sd_shard_manifest m = {0, NULL, 0};
    uint32_t *val = NULL;
    float *empty = NULL;
    sd_loader *l;
    int rank, size, failed;
    size_t n_empty;
    *out = NULL;
    err->msg[0] = '\0';
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));

    memset(&h, 0, sizeof h);
    if (rank == 0) {
        if (check_options(opt, err) == 0 && scan_shards(opt, size, &h, &m, &val, &empty, err) == 0) {
            h.batch_per_rank = opt->batch_per_rank;
            h.seed = opt->seed;
            h.val_fraction = opt->val_fraction;
        } else {
            h.status = -1;
            snprintf(h.msg, sizeof h.msg, "%s", err->msg);
        }
    }
    bcast_bytes(&h, sizeof h, comm);
    if (h.status) {
        if (rank == 0)
            sd_shard_manifest_free(&m);
        snprintf(err->msg, sizeof err->msg, "%s", h.msg);
        return -1;
    }

    l = sd_xcalloc(1, sizeof *l);
    l->info.resolution = h.resolution;
    l->info.latent_channels = h.latent_channels;
    l->info.latent_size = h.latent_size;
    l->info.text_len = h.text_len;
    l->info.embed_dim = h.embed_dim;
    l->info.scaling_factor = h.scaling_factor;
    l->info.n_shards = h.n_shards;
    l->info.n_samples = h.n_samples;
    l->info.n_val = h.n_val;
    l->info.n_train = h.n_samples - h.n_val;
    l->info.batch_per_rank = h.batch_per_rank;
    l->info.rank = rank;
    l->info.n_ranks = size;
    l->info.global_batch = (int64_t)size * h.batch_per_rank;
    l->info.steps_per_epoch = l->info.n_train / l->info.global_batch;
    l->seed = h.seed;
    l->m_el = (size_t)(2 * h.latent_channels) * (size_t)h.latent_size * (size_t)h.latent_size;
    l->e_el = (size_t)h.text_len * (size_t)h.embed_dim;
    n_empty = l->e_el;

    if (rank == 0) {
        l->entries = m.entries;
        l->val = val;
        l->empty = empty;
        m.entries = NULL;
    } else {
        l->entries = sd_xmalloc((size_t)h.n_shards * sizeof *l->entries);
        l->val = sd_xmalloc(((size_t)h.n_val + 1) * sizeof *l->val);
        l->empty = sd_xmalloc(n_empty * sizeof *l->empty);
    }
    bcast_bytes(l->entries, (size_t)h.n_shards * sizeof *l->entries, comm);
    bcast_bytes(l->val, (size_t)h.n_val * sizeof *l->val, comm);
    bcast_bytes(l->empty, n_empty * sizeof *l->empty, comm);

    /* Every rank checks its own options against rank 0's; the first failure is everyone's. */
    failed = check_options(opt, err) != 0;
    if (!failed && (opt->batch_per_rank != h.batch_per_rank || opt->seed != h.seed ||
                    opt->val_fraction != h.val_fraction))
        failed = sd_err_set(err, "rank %d was given other loader options than rank 0 (batch per rank %d, "
                                 "seed %llu, validation fraction %g)", rank, opt->batch_per_rank,
                            (unsigned long long)opt->seed, opt->val_fraction) != 0;
    if (!failed) {
        snprintf(l->dir, sizeof l->dir, "%s", opt->shard_dir);
        l->first = sd_xmalloc(((size_t)h.n_shards + 1) * sizeof *l->first);
        l->first[0] = 0;
        for (int64_t k = 0; k < h.n_shards; k++)
            l->first[k + 1] = l->first[k] + l->entries[k].samples;
        SD_CHECK(l->first[h.n_shards] == h.n_samples, "manifest of %lld samples, expected %lld",
                 (long long)l->first[h.n_shards], (long long)h.n_samples);
        l->order = sd_xmalloc((size_t)l->info.n_train * sizeof *l->order);
        l->order_epoch = -1;
        l->items = sd_xmalloc((size_t)h.batch_per_rank * sizeof *l->items);
        l->stage_m = sd_xmalloc((size_t)h.batch_per_rank * l->m_el * sizeof(float));
        l->stage_e = sd_xmalloc((size_t)h.batch_per_rank * l->e_el * sizeof(float));
        l->n_cache = opt->max_open_shards ? opt->max_open_shards : SD_LOADER_MAX_OPEN_SHARDS;
        l->cache = sd_xcalloc((size_t)l->n_cache, sizeof *l->cache);
        for (int c = 0; c < l->n_cache; c++)
            l->cache[c].pos = -1;
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
        for (int c = 0; c < l->n_cache; c++)
            if (l->cache[c].pos >= 0)
                sd_shard_close(l->cache[c].shard);
        sd_loader_h5_unlock();
    }
    if (l->n_slots) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
    }
    for (int s = 0; s < l->n_slots; s++)
        sd_loader_batch_free(&l->slots[s].batch);
    free(l->cache);
    free(l->stage_m);
    free(l->stage_e);
    free(l->items);
    free(l->order);
    free(l->first);
    free(l->empty);
    free(l->val);
    free(l->entries);
    free(l);
}
