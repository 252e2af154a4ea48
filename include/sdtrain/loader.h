/* The training data loader: latent shards in a seeded per-epoch order, each rank's slice of
 * every global batch read ahead by a prefetch thread, and a stable key-hash validation split. */
#ifndef SDTRAIN_LOADER_H
#define SDTRAIN_LOADER_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Samples. Every sample of the committed shards (manifest order, then row) has an ordinal
 * 0..N-1; its stable name is (shard index as in the manifest, row). At most 2^32 - 1 samples.
 * An empty shard (every sample of its range skipped in preprocessing) adds none: everything
 * below is as without it. Committed shards that are all empty are an error ("no training
 * samples").
 *
 * Validation split (key hash "sd-keyhash-v1", never to change: it decides which samples a model
 * was trained on): h = fmix64(FNV-1a-64(key bytes)), FNV-1a with offset basis
 * 0xcbf29ce484222325 and prime 0x100000001b3 over the key's bytes without the terminating NUL,
 * fmix64 the murmur3 finalizer (x ^= x >> 33; x *= 0xff51afd7ed558ccd; x ^= x >> 33;
 * x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33). With u = (h >> 11) * 2^-53 in [0, 1), the sample is
 * held out for validation when u < val_fraction. The validation list is in ordinal order;
 * training uses the rest (the "train list", also in ordinal order).
 *
 * Order (drop_last). G = ranks x batch_per_rank, steps_per_epoch = floor(n_train / G). Step s
 * (0-based) lies in epoch e = s / steps_per_epoch. The order of epoch e is the train list
 * shuffled by Fisher-Yates with
 *     for i = n_train - 1 down to 1:
 *         j = sd_rng_below(seed, SD_RNG_SHUFFLE, e, i >> 24, i & 0xFFFFFF, i + 1)
 *         swap(order[i], order[j])
 * (purpose SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 0); unbiased draws). With a shuffle window W > 0
 * (opt->shuffle_window) the order of epoch e is instead built from windows of shards:
 *     pi = the shard positions 0 .. n_shards-1 (index order), shuffled by Fisher-Yates as above
 *          with purpose SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 2), step e, sample i >> 24;
 *     window w = the shards pi[w W .. min((w + 1) W, n_shards) - 1]: their training ordinals,
 *          shard by shard in that order, each ascending, shuffled by Fisher-Yates with purpose
 *          SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 3), step e, sample w * 2^8 + (i >> 24);
 *     the order = window 0, then window 1, ...
 * so a global batch draws from one window (two where it straddles a boundary): at most about
 * 2 W shards, each read by a rank in one stretch of the epoch, instead of the whole data set.
 * The global batch of step s is
 * order[(s mod steps_per_epoch) * G + p] for positions p in [0, G); rank r reads positions
 * r * batch_per_rank + j, j in [0, batch_per_rank). So the global batch of a step depends on
 * (shards, val_fraction, seed, G) only, never on how G is split over ranks, and any step can be
 * read with no state (restarts seek to it). The last n_train mod G samples of each epoch's
 * order are not used in that epoch.
 *
 * Follow mode (&run mode = 'pipeline', opt->follow): the shards are being written while the
 * loader reads them. The preprocessing half's plan (sd_pipeline_plan: shards [0, P) will exist)
 * arrives at rank 0 over opt->plan_comm; rank 0 reads the manifest and takes the shards in index
 * order as they are committed (shard k only after 0..k-1), scans each (shapes, keys) and
 * broadcasts what it found, so every rank knows the same shards at the same call. Ordinals
 * count in index order as above. The validation split is the same key hash; the validation set
 * is the held-out samples of shard 0 only, or of the first shard holding samples when shard 0 is
 * empty (fixed at open, which waits for that shard, so every evaluation uses the same samples,
 * whatever the timing); held-out samples of later shards are never trained on.
 * Order: the first pass over the data (epoch 0) is the "stream": shard 0's training samples,
 * then shard 1's, ..., each shard's shuffled by Fisher-Yates with
 *     j = sd_rng_below(seed, SD_RNG_PURPOSE(SD_RNG_SHUFFLE, 1), k, i >> 24, i & 0xFFFFFF, i + 1)
 * (k the shard index); step s of epoch 0 takes stream positions [s G, (s + 1) G), so it needs
 * the shards that hold them. With T the training samples of all P shards, steps_per_epoch =
 * floor(T / G) as above, and epochs e >= 1 are the order of "Order" above, global or by windows
 * (the same as mode 'train' on the finished shards). None of it depends on when a shard
 * is committed. sd_loader_next is then collective over comm: when the step it returns (or, for
 * prefetch, the one after) is not covered yet, every rank polls together; for the returned step
 * they block (rank 0 prints "waiting for shard K ..." when the wait starts and every minute),
 * until it is covered or opt->wait_timeout_s passes (then every rank returns the same error),
 * or opt->stop_poll asks rank 0 to stop (then every rank returns SD_LOADER_STOPPED).
 *
 * Threads and HDF5. HDF5 is not built thread-safe here. With prefetch on, a background thread
 * reads shards while the caller computes; every HDF5 call of the loaders (all of them, in this
 * process) is made under one process-wide lock. While any loader is open the caller must not
 * call HDF5 itself, except between sd_loader_h5_lock() and sd_loader_h5_unlock(); validation
 * reads go through sd_loader_read_val, which takes the lock. The thread never calls MPI.
 */

/* Open shards kept per loader (least recently used is closed first; &data open_shards). */
#define SD_LOADER_MAX_OPEN_SHARDS 64
/* The largest &data shuffle_window. */
#define SD_LOADER_MAX_SHUFFLE_WINDOW 65536

typedef struct sd_loader_options {
    const char *shard_dir;  /* &data shard_dir */
    double val_fraction;    /* &data val_fraction, in [0, 1) */
    int batch_per_rank;     /* &train batch_size_per_rank, >= 1 */
    uint64_t seed;          /* &run seed */
    int prefetch;           /* 1 (default): read step s+1 in a thread while step s is used */
    int max_open_shards;    /* 0 means SD_LOADER_MAX_OPEN_SHARDS; fewer when the limit of open
                             * files cannot be raised to fit them (a warning on rank 0) */
    int64_t shuffle_window; /* &data shuffle_window: 0 (default) the global order of "Order";
                             * W in [1, SD_LOADER_MAX_SHUFFLE_WINDOW]: windows of W shards */
    /* Follow mode (above): 0 = read the committed shards once at open (the default). */
    int follow;
    MPI_Comm plan_comm;     /* where the preprocessing half's plan arrives (MPI_COMM_WORLD) */
    int plan_source;        /* rank in plan_comm that sends it (preprocessing rank 0) */
    double wait_timeout_s;  /* longest wait for the plan or for one shard (&data shard_wait_timeout);
                             * 0 = 3600 s */
    double poll_interval_s; /* manifest reads while waiting, 0 = 0.2 s */
    /* Follow mode: asked on rank 0 before each manifest read while the ranks wait for a shard
     * (never when the step is covered already): non-zero ends the wait on every rank, and
     * sd_loader_open / sd_loader_next return SD_LOADER_STOPPED (a signal stop: the caller saves
     * what it has and ends cleanly instead of waiting out wait_timeout_s). NULL: never. */
    int (*stop_poll)(void *ctx);
    void *stop_ctx;
} sd_loader_options;

/* What sd_loader_open and sd_loader_next return when opt->stop_poll ended a wait (follow mode),
 * on every rank alike; err says where it waited. After it only sd_loader_close is valid. */
#define SD_LOADER_STOPPED 1

/* val_fraction 0.01, batch_per_rank 8, seed 1234, prefetch on; shard_dir NULL (required);
 * follow off, plan_comm MPI_COMM_WORLD from rank 0, wait_timeout_s 3600, poll 0.2 s. */
void sd_loader_options_defaults(sd_loader_options *o);

/* What every sample shares and how the data divide into steps (identical on every rank). */
typedef struct sd_loader_info {
    int resolution;          /* image side in pixels */
    int latent_channels;     /* C: moments have 2C channels (mean, then logvar) */
    int latent_size;         /* h = w = resolution / 8 */
    int text_len, embed_dim; /* L, D */
    double scaling_factor;   /* applied when a latent is sampled from the moments */
    char weights_hash[128];  /* of the encoders that made the shards (all the same) */
    int64_t n_shards, n_samples, n_train, n_val;
    int batch_per_rank, rank, n_ranks;
    int64_t global_batch;    /* n_ranks * batch_per_rank */
    int64_t steps_per_epoch; /* floor(n_train / global_batch) >= 1 */
    /* 1 when every shard is known. Follow mode: 0 until the last planned shard is committed;
     * until then n_shards, n_samples, n_train and steps_per_epoch count the shards seen so far
     * (sd_loader_get_info returns the current values; steps_per_epoch may be 0), n_val is final. */
    int complete;
    int64_t n_planned;       /* follow mode: the shards the preprocessing half writes; else n_shards */
    int64_t n_direct;        /* of n_shards, those read without HDF5 (sd_shard_direct): all but
                              * shards written before 2026-11-27 */
} sd_loader_info;

/* A sample's stable name: shard index (as in the manifest and file name) and row in it. */
typedef struct sd_sample_id {
    int64_t shard;
    int64_t row;
} sd_sample_id;

/* A rank's samples of one step (or a range of validation samples). Floats are fp32 whatever
 * the shards store (fp16 widened exactly). */
typedef struct sd_loader_batch {
    int64_t step;        /* the training step, or -1 for validation samples */
    int64_t epoch;       /* the step's epoch, or -1 for validation samples */
    int count;           /* samples held */
    int capacity;        /* samples the arrays have room for */
    float *moments;      /* [count, 2C, h, w], NCHW as stored: mean channels, then logvar */
    float *embeddings;   /* [count, L, D] caption embeddings */
    int64_t *positions;  /* [count] position in the step's global batch (training: derive
                          * per-sample noise and timesteps from (seed, step, position)), or the
                          * validation index (validation: fixed noise per index) */
    sd_sample_id *ids;   /* [count] */
} sd_loader_batch;

typedef struct sd_loader sd_loader;

/* Collective over comm (the training ranks). Rank 0 reads the committed shards of
 * opt->shard_dir (sd_shards_committed), opens every shard, checks that they agree (resolution,
 * latent channels and size, text_len, embed_dim, scaling factor), reads every key and splits
 * train/val; it broadcasts the result. Errors there (no shard directory or no committed shard,
 * a missing, truncated or unreadable shard, shards that disagree, fewer training samples than
 * one global batch) and option errors make every rank return -1 with the same message. All
 * buffers are allocated here (none per step); with prefetch on the thread starts. The next step
 * is 0 until sd_loader_seek. */
int sd_loader_open(MPI_Comm comm, const sd_loader_options *opt, sd_loader **out, sd_err *err);

/* Stops and joins the thread, closes the shards, frees everything. Local; NULL is fine. */
void sd_loader_close(sd_loader *l);

const sd_loader_info *sd_loader_get_info(const sd_loader *l);
/* The empty-caption embedding [L, D] (fp32), read once from the first shard. */
const float *sd_loader_empty_embedding(const sd_loader *l);

/* Makes `step` (>= 0) the next step sd_loader_next returns, at start and on resume; with
 * prefetch on its read starts at once (follow mode: if the shards seen so far cover it). The
 * batch from the last sd_loader_next is given back. Clears an error from an earlier read. */
int sd_loader_seek(sd_loader *l, int64_t step, sd_err *err);
/* The step the next sd_loader_next returns. */
int64_t sd_loader_tell(const sd_loader *l);

/* This rank's batch of the current step; then the current step advances by one and (with
 * prefetch) the thread starts reading it. *batch stays valid until the next call of
 * sd_loader_next, sd_loader_seek or sd_loader_close on this loader. *wait_seconds (may be NULL)
 * receives the time the caller was blocked waiting for data (the whole read without prefetch).
 * A failed read (a shard that became unreadable...) returns -1 with a message naming the file;
 * the step does not advance and later calls fail the same way until sd_loader_seek. Local: each
 * rank reads its own slice, so ranks may disagree on failure (agree with sd_any_failed, and stop
 * on failure: in follow mode the call is collective, above). */
int sd_loader_next(sd_loader *l, const sd_loader_batch **batch, double *wait_seconds, sd_err *err);

/* Validation samples, in ordinal order; index i is the same on every rank and every run. */
int64_t sd_loader_val_count(const sd_loader *l);
/* A buffer for up to `capacity` samples (>= 1) of this loader's shapes, for sd_loader_read_val;
 * sd_loader_batch_free releases it (and zeroes the struct). */
void sd_loader_batch_alloc(const sd_loader *l, int capacity, sd_loader_batch *b);
void sd_loader_batch_free(sd_loader_batch *b);
/* Reads validation samples [first, first + count) into b (count <= b->capacity), in the
 * calling thread, while the prefetch thread may be running. Local. */
int sd_loader_read_val(sd_loader *l, int64_t first, int count, sd_loader_batch *b, sd_err *err);

/* The validation key hash (sd-keyhash-v1, above) and the split decision for one key. */
uint64_t sd_loader_key_hash(const char *key);
int sd_loader_key_is_val(const char *key, double val_fraction);

/* The process-wide HDF5 lock the loaders hold around every HDF5 call: take it around the
 * caller's own HDF5 calls while a loader is open. Not recursive. */
void sd_loader_h5_lock(void);
void sd_loader_h5_unlock(void);

#ifdef __cplusplus
}
#endif
#endif
