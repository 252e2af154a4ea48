/* &run mode = 'process': images and captions in, committed latent shards out, on every rank
 * of the preprocessing communicator. */
#include "sd_config.h"

#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/clip.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/dataset.h"
#include "sdtrain/fault.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"
#include "sdtrain/json_file.h"
#include "sdtrain/log.h"
#include "sdtrain/metafilter.h"
#include "sdtrain/modes.h"
#include "sdtrain/ops.h"
#include "sdtrain/progress.h"
#include "sdtrain/runtime.h"
#include "sdtrain/shards.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/tokenizer.h"
#include "sdtrain/transform.h"
#include "sdtrain/utf8.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"

#define TEXT_LEN SD_TOKENIZER_LENGTH

struct slice;

/* The frozen encoders and the tokenizer, as one rank uses them, and the pipeline of encoder
 * batches (doc/architecture.md, "Preprocessing"): the same code on both backends, where on the
 * CPU every copy below is a memcpy and every op runs at once. A batch is made in host memory from
 * sd_host_alloc (pinned on CUDA), one of two that alternate; it travels by sd_upload_async on the
 * copy stream, is cast to the compute type and encoded. Its results are sent back (cast to fp32,
 * sd_download_async) when the next batch is handed over, and waited for only when the batch
 * after that is: so up to two batches are queued on the GPU while the host decodes images, and
 * the host waits only for a batch the GPU finished while it worked. */
typedef struct encoders {
    const sd_backend *be;
    sd_cmd_backend cb;
    void *vparams, *cparams;            /* device copies of vw / cw (host: vw.data / cw.data) */
    float *h_img[2];                    /* host: a batch of images [B, res, res, 3] fp32 */
    int32_t *h_ids[2];                  /* host: its token ids [B, 77] */
    float *d_img32[2];                  /* backend: the images as they arrive (fp32) */
    int32_t *d_ids[2];                  /* backend: the ids */
    void *d_images, *d_mom, *d_emb;     /* backend, compute type: the encoders' input / outputs */
    float *d_out32, *h_out;             /* a batch's [moments | embeddings] fp32, backend / host */
    int slot;                           /* which h_img / h_ids the batch being filled uses */
    int slot_sent[2];                   /* that slot's upload may still be on the copy stream */
    /* up to two encoded batches whose results have not landed in their slices: `queued` (the
     * last one, still on the device) and `fetched` (the one before, on its way to h_out) */
    struct batch_ref {
        struct slice *s;                /* NULL: none */
        int64_t first;                  /* its first sample in the slice */
        int n;
    } queued, fetched;
    sd_vae_config vcfg;
    sd_clip_config ccfg;
    sd_weights vw, cw;
    sd_vae *vae;
    sd_clip *clip;
    sd_tokenizer *tok;
    sd_arena vae_arena, clip_arena;
    int batch, res, lh, lw;
    char weights_path[1024];
    char weights_hash[128];
} encoders;

/* Floats of one sample's posterior moments [lh, lw, 2C] and caption embedding [77, D]. */
static size_t enc_mom(const encoders *e)
{
    return (size_t)e->lh * (size_t)e->lw * 2 * (size_t)e->vcfg.latent_channels;
}
static size_t enc_emb(const encoders *e)
{
    return (size_t)TEXT_LEN * (size_t)e->ccfg.hidden_size;
}

/* Counts of every reason a sample was kept or skipped: the dataset's reasons, then the
 * decoder's (a plain array, summed over ranks with one reduction). */
#define COUNT_NON_FINITE (SD_SAMPLE_N_REASONS + SD_IMG_STATUS_COUNT)
#define COUNT_FILTERED (COUNT_NON_FINITE + 1)    /* &data filter: a condition is false */
#define COUNT_NO_METADATA (COUNT_NON_FINITE + 2) /* &data filter: the .json cannot answer */
#define N_COUNTS (COUNT_NON_FINITE + 3)

static const char *count_name(int i, char *buf, size_t size)
{
    if (i < SD_SAMPLE_N_REASONS)
        return sd_sample_reason_name((sd_sample_reason)i);
    if (i == COUNT_NON_FINITE)
        return "non_finite_encoding";
    if (i == COUNT_FILTERED)
        return "filtered";
    if (i == COUNT_NO_METADATA)
        return "no_metadata";
    snprintf(buf, size, "image_%s", sd_image_status_name((sd_image_status)(i - SD_SAMPLE_N_REASONS)));
    return buf;
}

/* FNV-1a over the weights the shards depend on: with the snapshot path it says which weights
 * made a shard. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* &data encode_precision resolved for the device this rank computes on. */
static const char *encode_precision(const sd_config *cfg, const sd_device_info *dev)
{
    if (!strcmp(cfg->data.encode_precision, "auto"))
        return dev->use_cuda ? "bf16" : "fp32";
    return cfg->data.encode_precision;
}

static int load_encoders(const sd_config *cfg, const sd_device_info *dev, encoders *e, sd_err *err)
{
    char tok_path[SD_PATH_MAX + 16];
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    memset(e, 0, sizeof *e);
    if (!dev->use_cuda && !strcmp(cfg->data.encode_precision, "bf16"))
        return sd_err_set(err, "&data encode_precision = 'bf16' needs a GPU (this rank computes on "
                               "the CPU, which encodes in fp32): set &run device = 'cuda' or "
                               "encode_precision = 'auto'");
    if (sd_cmd_backend_open(dev->use_cuda ? "cuda" : "cpu", dev->device_id,
                            encode_precision(cfg, dev), &e->cb, err))
        return -1;
    e->be = e->cb.be;
    e->res = (int)cfg->model.resolution;
    e->batch = cfg->data.encode_batch_size > 0 ? (int)cfg->data.encode_batch_size
               : dev->use_cuda                  ? 32
                                                : 8;

    if (cfg->model.pretrained[0] || cfg->model.autoencoder[0]) {
        sd_snapshot s;
        const char *vae_path = cfg->model.autoencoder[0] ? cfg->model.autoencoder : cfg->model.pretrained;
        int eos = 0;
        if (sd_snapshot_open(&s, vae_path, err))
            return -1;
        if (sd_snapshot_load_vae(&s, NULL, &e->vcfg, &e->vw, err)) {
            sd_snapshot_close(&s);
            return -1;
        }
        sd_snapshot_close(&s);
        if (!cfg->model.pretrained[0])
            return sd_err_set(err, "&model autoencoder is set but &model pretrained is not: the text "
                                   "encoder comes from the snapshot");
        if (sd_snapshot_open(&s, cfg->model.pretrained, err))
            return -1;
        if (sd_snapshot_load_text_encoder(&s, NULL, &e->ccfg, &eos, &e->cw, err)) {
            sd_snapshot_close(&s);
            return -1;
        }
        sd_snapshot_close(&s);
        snprintf(e->weights_path, sizeof e->weights_path, "%.1000s", cfg->model.pretrained);
    } else {
        /* No snapshot: the shapes come from the namelist and the weights from the seed, which
         * is what a demo or a from-scratch smoke test wants. */
        sd_param_table t;
        sd_vae_config_from_namelist(cfg, &e->vcfg);
        sd_clip_config_from_namelist(cfg, &e->ccfg);
        sd_vae_params(&e->vcfg, &t);
        if (sd_weights_check_size(&t, "the VAE of the &model shape keys", err)) {
            sd_param_table_free(&t);
            return -1;
        }
        sd_weights_init(&e->vw, &t);
        sd_weights_init_random(&e->vw, (uint64_t)cfg->run.seed ^ UINT64_C(0x7661650000000000));
        sd_clip_params(&e->ccfg, &t);
        if (sd_weights_check_size(&t, "the text encoder of the &model shape keys", err)) {
            sd_param_table_free(&t);
            return -1;
        }
        sd_weights_init(&e->cw, &t);
        sd_weights_init_random(&e->cw, (uint64_t)cfg->run.seed ^ UINT64_C(0x636c697000000000));
        snprintf(e->weights_path, sizeof e->weights_path, "random(seed=%lld)", (long long)cfg->run.seed);
    }
    h = fnv1a(h, e->vw.data, e->vw.table.total_floats * sizeof(float));
    h = fnv1a(h, e->cw.data, e->cw.table.total_floats * sizeof(float));
    snprintf(e->weights_hash, sizeof e->weights_hash, "fnv1a64:%016" PRIx64, h);

    if (cfg->model.tokenizer[0])
        snprintf(tok_path, sizeof tok_path, "%s", cfg->model.tokenizer);
    else if (cfg->model.pretrained[0])
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer", cfg->model.pretrained);
    else
        return sd_err_set(err, "no tokenizer: set &model tokenizer (a tokenizer/ folder or "
                               "bpe_simple_vocab_16e6.txt.gz) or &model pretrained");
    if (sd_tokenizer_load(tok_path, &e->tok, err))
        return -1;
    if (sd_tokenizer_check_model_vocab(e->tok, e->ccfg.vocab_size, err))
        return -1;
    if (e->res % 8 != 0 || sd_vae_check_image_shape(&e->vcfg, e->batch, e->res, e->res, &e->lh, &e->lw, err))
        return -1;
    if (e->lh * 8 != e->res || e->lw * 8 != e->res)
        return sd_err_set(err, "the VAE maps %d px images to %dx%d latents; latent shards need the "
                               "factor 8 of Stable Diffusion (a VAE with 4 levels)", e->res, e->lh, e->lw);
    e->vparams = sd_cmd_put(&e->cb, e->vw.data, (int64_t)e->vw.table.total_floats);
    e->cparams = sd_cmd_put(&e->cb, e->cw.data, (int64_t)e->cw.table.total_floats);
    if (!e->vparams || !e->cparams)
        return sd_err_set(err, "cannot allocate the encoders' weights on the %s backend", e->be->name);
    if (sd_vae_create(&e->vae, &e->vcfg, &e->vw.table, e->vparams, e->be, err) ||
        sd_clip_create(&e->clip, &e->ccfg, &e->cw.table, e->cparams, e->be, err))
        return -1;
    if (sd_cmd_arena(&e->cb, sd_vae_encode_scratch_bytes(&e->vcfg, e->be, e->batch, e->res, e->res),
                     &e->vae_arena) ||
        sd_cmd_arena(&e->cb, sd_clip_scratch_bytes(&e->ccfg, e->be, e->batch, TEXT_LEN),
                     &e->clip_arena))
        return sd_err_set(err, "cannot allocate the encoders' activation memory for batches of %d "
                               "(&data encode_batch_size) on the %s backend", e->batch, e->be->name);
    {
        const size_t es = sd_dtype_size(e->be->dtype), B = (size_t)e->batch;
        const size_t img = B * (size_t)e->res * (size_t)e->res * 3, ids = B * TEXT_LEN;
        const size_t mom = B * enc_mom(e), emb = B * enc_emb(e);
        int ok = 1;
        for (int k = 0; k < 2; k++) {
            e->h_img[k] = sd_host_alloc(e->be, img * sizeof(float));
            e->h_ids[k] = sd_host_alloc(e->be, ids * sizeof(int32_t));
            e->d_img32[k] = sd_backend_alloc(e->be, img * sizeof(float));
            e->d_ids[k] = sd_backend_alloc(e->be, ids * sizeof(int32_t));
            ok = ok && e->h_img[k] && e->h_ids[k] && e->d_img32[k] && e->d_ids[k];
        }
        e->d_images = sd_backend_alloc(e->be, img * es);
        e->d_mom = sd_backend_alloc(e->be, mom * es);
        e->d_emb = sd_backend_alloc(e->be, emb * es);
        e->d_out32 = sd_backend_alloc(e->be, (mom + emb) * sizeof(float));
        e->h_out = sd_host_alloc(e->be, (mom + emb) * sizeof(float));
        if (!ok || !e->d_images || !e->d_mom || !e->d_emb || !e->d_out32 || !e->h_out)
            return sd_err_set(err, "cannot allocate the buffers of two batches of %d "
                                   "(&data encode_batch_size) on the %s backend",
                              e->batch, e->be->name);
    }
    return 0;
}

static void free_encoders(encoders *e)
{
    if (e->vae)
        sd_vae_free(e->vae);
    if (e->clip)
        sd_clip_free(e->clip);
    if (e->tok)
        sd_tokenizer_free(e->tok);
    if (e->cb.be) {
        sd_cmd_release(&e->cb, e->vparams, e->vw.data);
        sd_cmd_release(&e->cb, e->cparams, e->cw.data);
        sd_synchronize(e->be);
        sd_download_wait(e->be);
        for (int k = 0; k < 2; k++) {
            sd_host_free(e->be, e->h_img[k]);
            sd_host_free(e->be, e->h_ids[k]);
            sd_backend_free(e->be, e->d_img32[k]);
            sd_backend_free(e->be, e->d_ids[k]);
        }
        sd_backend_free(e->be, e->d_images);
        sd_backend_free(e->be, e->d_mom);
        sd_backend_free(e->be, e->d_emb);
        sd_backend_free(e->be, e->d_out32);
        sd_host_free(e->be, e->h_out);
        sd_cmd_arena_free(&e->cb, &e->vae_arena);
        sd_cmd_arena_free(&e->cb, &e->clip_arena);
        sd_cmd_backend_close(&e->cb);
    }
    sd_weights_free(&e->vw);
    sd_weights_free(&e->cw);
}

/* One rank's samples of one shard, encoded. */
typedef struct slice {
    int64_t n, cap;
    float *moments;    /* [n, lh, lw, 2C] */
    float *embeddings; /* [n, 77, D] */
    int32_t *ids;      /* [n, 77] */
    char **captions, **keys;
    int *count;        /* [n] the counts[] entry each sample was counted under */
    int64_t *index;    /* [n] its global sample index */
} slice;

static void slice_reset(slice *s)
{
    for (int64_t i = 0; i < s->n; i++) {
        free(s->captions[i]);
        free(s->keys[i]);
    }
    s->n = 0;
}

static void slice_reserve(slice *s, int64_t cap, const encoders *e)
{
    if (cap <= s->cap)
        return;
    s->moments = sd_xrealloc(s->moments, (size_t)cap * enc_mom(e) * sizeof(float));
    s->embeddings = sd_xrealloc(s->embeddings, (size_t)cap * enc_emb(e) * sizeof(float));
    s->ids = sd_xrealloc(s->ids, (size_t)cap * TEXT_LEN * sizeof(int32_t));
    s->captions = sd_xrealloc(s->captions, (size_t)cap * sizeof(char *));
    s->keys = sd_xrealloc(s->keys, (size_t)cap * sizeof(char *));
    s->count = sd_xrealloc(s->count, (size_t)cap * sizeof(int));
    s->index = sd_xrealloc(s->index, (size_t)cap * sizeof(int64_t));
    s->cap = cap;
}

static void slice_free(slice *s)
{
    slice_reset(s);
    free(s->moments);
    free(s->embeddings);
    free(s->ids);
    free(s->captions);
    free(s->keys);
    free(s->count);
    free(s->index);
}

/* Where a rank's time goes (seconds). */
enum { T_READ, T_DECODE, T_TRANSFORM, T_TOKENIZE, T_ENCODE, T_WRITE, T_N };
static const char *const stage_names[T_N] = {"read", "decode", "transform", "tokenize", "encode", "write"};

/* Staging for one encoder call. */
typedef struct batch {
    int n;
    float *images;  /* [B, res, res, 3] in [-1, 1] */
    int32_t *ids;   /* [B, 77] */
} batch;

/* The queued batch's results: cast to fp32 behind its encoders (and before the next batch's
 * encoders overwrite d_mom / d_emb, which come later in the stream) and sent to the host on the
 * copy stream; returns at once. h_out / d_out32 must be free (the fetched batch landed). */
static void fetch_queued(encoders *e)
{
    const size_t mom = enc_mom(e), emb = enc_emb(e);
    const size_t n = (size_t)e->queued.n;
    sd_cast_to_f32(e->be, (int64_t)(n * mom), e->d_mom, e->d_out32);
    sd_cast_to_f32(e->be, (int64_t)(n * emb), e->d_emb, e->d_out32 + n * mom);
    sd_download_async(e->be, e->h_out, e->d_out32, n * (mom + emb) * sizeof(float));
    e->fetched = e->queued;
    e->queued.s = NULL;
}

/* Waits for the fetched batch's results and copies them into their slice. */
static void land_fetched(encoders *e)
{
    const size_t mom = enc_mom(e), emb = enc_emb(e);
    const size_t n = (size_t)e->fetched.n, first = (size_t)e->fetched.first;
    slice *s = e->fetched.s;
    sd_download_wait(e->be); /* every copy on the copy stream, the uploads too */
    e->slot_sent[0] = e->slot_sent[1] = 0;
    memcpy(s->moments + first * mom, e->h_out, n * mom * sizeof(float));
    memcpy(s->embeddings + first * emb, e->h_out + n * mom, n * emb * sizeof(float));
    e->fetched.s = NULL;
}

/* Every encoded batch's results into its slice (before the slice is written). */
static void flush_pending(encoders *e)
{
    if (e->fetched.s)
        land_fetched(e);
    if (e->queued.s) {
        fetch_queued(e);
        land_fetched(e);
    }
}

/* Encodes the batch being filled (host slot e->slot): the batch before the previous one lands
 * first (its input slot and the output buffers become free; the GPU is working on the previous
 * one meanwhile), then this batch is sent, the previous one's results are sent back, and this
 * batch's encoders are queued; the caller fills the other slot next.
 * Why the slots are free: landing a batch waits for the whole copy stream, so every upload sent
 * before it has arrived; a slot is refilled two batches after its upload, with a landing in
 * between except right after a slice's second batch, where encode_batch waits itself. */
static void encode_batch(encoders *e, batch *b, slice *s)
{
    const int64_t first = s->n - b->n; /* the batch's samples are the slice's last b->n */
    const size_t img = (size_t)e->res * (size_t)e->res * 3;
    const int k = e->slot;
    if (b->n == 0)
        return;
    if (e->fetched.s)
        land_fetched(e); /* two batches ago: slot k's last upload and cast are done */
    sd_upload_async(e->be, e->d_img32[k], e->h_img[k], (size_t)b->n * img * sizeof(float));
    sd_upload_async(e->be, e->d_ids[k], e->h_ids[k], (size_t)b->n * TEXT_LEN * sizeof(int32_t));
    e->slot_sent[k] = 1;
    if (e->queued.s)
        fetch_queued(e);
    sd_cast_f32(e->be, (int64_t)((size_t)b->n * img), e->d_img32[k], e->d_images);
    sd_vae_encode(e->vae, b->n, e->res, e->res, e->d_images, e->d_mom, &e->vae_arena, NULL);
    sd_clip_forward(e->clip, b->n, TEXT_LEN, e->d_ids[k], e->d_emb, &e->clip_arena, NULL);
    memcpy(s->ids + (size_t)first * TEXT_LEN, b->ids, (size_t)b->n * TEXT_LEN * sizeof(int32_t));
    e->queued.s = s;
    e->queued.first = first;
    e->queued.n = b->n;
    e->slot ^= 1;
    /* the caller writes the other slot next: its upload must be done. It is, unless no batch
     * has landed since it was sent (the second batch of a slice): then wait for the copies */
    if (e->slot_sent[e->slot]) {
        sd_download_wait(e->be);
        e->slot_sent[0] = e->slot_sent[1] = 0;
    }
    b->images = e->h_img[e->slot];
    b->ids = e->h_ids[e->slot];
    b->n = 0;
}

/* One input sample as a worker left it, committed in input order by the rank's main thread. */
typedef struct prepared {
    int kept;          /* read, decoded, transformed: goes into the batch */
    int count;         /* the counts[] entry it adds to: its dataset reason, or the image's */
    char *key, *caption; /* kept only: owned, moved into the slice */
    float *image;      /* [res, res, 3] in [-1, 1]: window memory */
    int32_t ids[TEXT_LEN];
    sd_err err;        /* why it was skipped (logged at debug level) */
} prepared;

/* What one decode thread keeps between samples: its own reader (open-shard cache), decoder and
 * resize scratch, and the time it spent per stage. */
typedef struct worker {
    sd_sample smp;
    sd_image img;
    sd_image_decoder *dec;
    sd_resize_ws ws;
    uint8_t *rgb;
    double t[T_N];
} worker;

/* &data filter on global sample i's .json: 1 it passes (or there is no filter), else 0 with
 * p->count and p->err saying why (a read error of the .json: p->err, storage marked) */
static int filter_sample(const sd_meta_filter *flt, const sd_dataset *ds, int64_t i, worker *w,
                         prepared *p)
{
    char why[400];
    int has, v;
    if (flt->n == 0)
        return 1;
    has = sd_dataset_read_json(ds, i, &w->smp, &p->err);
    if (has < 0) {
        p->count = COUNT_NO_METADATA;
        return 0;
    }
    v = sd_meta_filter_eval(flt, has ? (const char *)w->smp.json : NULL, w->smp.json_size, why,
                            sizeof why);
    if (v == 1)
        return 1;
    p->count = v == 0 ? COUNT_FILTERED : COUNT_NO_METADATA;
    sd_err_set(&p->err, "%s", why);
    return 0;
}

/* Reads, decodes, transforms, normalizes and tokenizes global sample i into *p (any thread);
 * a sample &data filter refuses is not read. */
static void prepare_sample(const sd_image_opts *iopts, const sd_transform_opts *topts,
                           const sd_meta_filter *flt, const sd_dataset *ds, const encoders *e,
                           int64_t i, worker *w, prepared *p)
{
    double t0 = sd_time_now(), t1;
    sd_image_status st;

    p->kept = 0;
    p->key = p->caption = NULL;
    sd_err_clear(&p->err);

    if (!filter_sample(flt, ds, i, w, p)) {
        w->t[T_READ] += sd_time_now() - t0;
        return;
    }
    int read_ok = sd_dataset_read(ds, i, &w->smp, &p->err) == 0;
    t1 = sd_time_now();
    w->t[T_READ] += t1 - t0;
    p->count = (int)w->smp.reason;
    if (!read_ok)
        return;
    st = sd_image_decoder_run(w->dec, w->smp.image, w->smp.image_size, w->smp.key, iopts,
                              &w->img, &p->err);
    t0 = sd_time_now();
    w->t[T_DECODE] += t0 - t1;
    if (st == SD_IMG_OK && sd_transform_rgb8(w->img.data, w->img.width, w->img.height, topts,
                                             w->rgb, &w->ws, &p->err) != 0) {
        /* the header check (iopts->resize_to) refuses the sizes first; what is left is memory */
        char msg[sizeof p->err.msg];
        st = sd_transform_size_ok(w->img.width, w->img.height, topts->resolution) ? SD_IMG_NOMEM
                                                                                   : SD_IMG_TOO_LARGE;
        memcpy(msg, p->err.msg, sizeof msg);
        sd_err_set(&p->err, "%s: %s", w->smp.key, msg);
    }
    if (st != SD_IMG_OK) {
        /* read fine, but the image is not usable: counted under the image's reason */
        p->count = SD_SAMPLE_N_REASONS + (int)st;
        if (!p->err.msg[0])
            sd_err_set(&p->err, "%s: image not usable", w->smp.key);
        return;
    }
    sd_normalize_rgb8(w->rgb, e->res, e->res, SD_LAYOUT_HWC, p->image);
    t1 = sd_time_now();
    w->t[T_TRANSFORM] += t1 - t0;
    sd_tokenize(e->tok, w->smp.caption, w->smp.caption_len, p->ids, NULL);
    /* the shard's strings end at a NUL: one inside the caption is stored as U+2400 (the ids
     * above are the caption's as read) */
    p->caption = sd_xmalloc(sd_utf8_nul_to_symbol(w->smp.caption, w->smp.caption_len, NULL) + 1);
    sd_utf8_nul_to_symbol(w->smp.caption, w->smp.caption_len, p->caption);
    p->key = sd_xstrdup(w->smp.key);
    p->kept = 1;
    w->t[T_TOKENIZE] += sd_time_now() - t1;
}

/* Reads, decodes, transforms, tokenizes and encodes global samples [begin, end). A stop signal
 * (SIGUSR1, SIGTERM) caught meanwhile cuts the work short at the next window (*cut = 1): the
 * shard is then not written, and a rerun encodes it again, so that the stop does not wait for a
 * whole shard's encoding (minutes on a few CPU ranks) while the time limit nears.
 *
 * The CPU stages run on the rank's OpenMP threads, a window of samples at a time (each thread
 * its own reader, decoder and resize scratch); the main thread then takes the window's samples
 * in input order into encoder batches. So the data and the counts do not depend on the thread
 * count, and on a GPU the next window decodes while the previous batch encodes (the encoders
 * run asynchronously until their results are fetched). */
static int process_range(const sd_config *cfg, const sd_dataset *ds, encoders *e, int64_t begin,
                         int64_t end, int world_rank, slice *s, uint64_t *counts, double *t,
                         int *cut, sd_err *fail)
{
    int storage_failed = 0;
    const size_t img_elems = (size_t)e->res * (size_t)e->res * 3;
    const sd_transform_opts topts = {e->res, SD_PASS_ORDER_PILLOW_9}; /* the pinned Pillow 9.4 */
    sd_image_opts iopts;
    int nthreads = 1;
    int64_t win;
    batch b = {0, NULL, NULL};
    worker *ws;
    prepared *pw;
    float *win_images;

    sd_meta_filter flt;
    sd_err ferr;
    SD_CHECK(sd_meta_filter_parse(cfg->data.filter, &flt, &ferr) == 0, "&data filter: %s",
             ferr.msg); /* checked with the configuration */
    sd_image_opts_default(&iopts);
    iopts.exif_transpose = cfg->data.exif_transpose;
    iopts.alpha = strcmp(cfg->data.alpha, "white") == 0 ? SD_ALPHA_WHITE : SD_ALPHA_DROP;
    iopts.max_pixels = cfg->data.max_image_pixels;
    iopts.min_side = (int)cfg->data.min_image_side;
    iopts.resize_to = e->res;
    iopts.strict_jpeg = cfg->data.strict_jpeg;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    /* enough samples per window to keep every thread busy despite uneven images, and at least
     * one encoder batch */
    win = 4 * (int64_t)nthreads;
    if (win < e->batch)
        win = e->batch;
    if (win > end - begin)
        win = end - begin > 0 ? end - begin : 1;
    ws = sd_xcalloc((size_t)nthreads, sizeof *ws);
    for (int k = 0; k < nthreads; k++) {
        ws[k].dec = sd_image_decoder_new();
        SD_CHECK(ws[k].dec != NULL, "TurboJPEG cannot initialise");
        ws[k].rgb = sd_xmalloc(img_elems);
    }
    pw = sd_xcalloc((size_t)win, sizeof *pw);
    win_images = sd_xmalloc((size_t)win * img_elems * sizeof(float));
    for (int64_t j = 0; j < win; j++)
        pw[j].image = win_images + (size_t)j * img_elems;
    b.images = e->h_img[e->slot];
    b.ids = e->h_ids[e->slot];
    slice_reserve(s, end - begin, e);
    *cut = 0;

    for (int64_t w0 = begin; w0 < end && !storage_failed; w0 += win) {
        const int64_t m = end - w0 < win ? end - w0 : win;
        if (w0 > begin && sd_ckpt_signal_pending()) {
            *cut = 1;
            break;
        }
        double busy[T_N] = {0}, cpu = 0, wall = sd_time_now();
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
#endif
        for (int64_t j = 0; j < m; j++) {
            int k = 0;
#ifdef _OPENMP
            k = omp_get_thread_num();
#endif
            prepare_sample(&iopts, &topts, &flt, ds, e, w0 + j, &ws[k], &pw[j]);
        }
        /* the window's wall time, split over the CPU stages as their thread time was */
        wall = sd_time_now() - wall;
        for (int k = 0; k < nthreads; k++)
            for (int i = T_READ; i <= T_TOKENIZE; i++) {
                busy[i] += ws[k].t[i];
                cpu += ws[k].t[i];
                ws[k].t[i] = 0;
            }
        for (int i = T_READ; i <= T_TOKENIZE; i++)
            t[i] += cpu > 0 ? wall * busy[i] / cpu : 0;

        for (int64_t j = 0; j < m && !storage_failed; j++) {
            prepared *p = &pw[j];
            if (!p->kept && p->err.storage) {
                /* the storage, not the sample: skipping it would change the dataset */
                *fail = p->err;
                storage_failed = 1;
                for (int64_t r = j + 1; r < m; r++) { /* what the rest of the window holds */
                    free(pw[r].caption);
                    free(pw[r].key);
                }
                break;
            }
            counts[p->count]++;
            /* SDTRAIN_FAULT usr1:rank=R:phase=encode:step=S: the signal in the middle of a shard,
             * once global sample S is read */
            if (sd_fault_armed(SD_FAULT_USR1, world_rank, w0 + j, "encode"))
                raise(SIGUSR1);
            if (!p->kept) {
                sd_debug("skipped %s: %s", sd_dataset_key(ds, w0 + j), p->err.msg);
                continue;
            }
            memcpy(b.images + (size_t)b.n * img_elems, p->image, img_elems * sizeof(float));
            memcpy(b.ids + (size_t)b.n * TEXT_LEN, p->ids, sizeof p->ids);
            s->captions[s->n] = p->caption;
            s->keys[s->n] = p->key;
            s->count[s->n] = p->count;
            s->index[s->n] = w0 + j;
            s->n++;
            b.n++;
            if (b.n == e->batch) {
                double t0 = sd_time_now();
                encode_batch(e, &b, s);
                t[T_ENCODE] += sd_time_now() - t0;
            }
        }
    }
    {
        double t0 = sd_time_now();
        encode_batch(e, &b, s);
        flush_pending(e);
        t[T_ENCODE] += sd_time_now() - t0;
    }
    free(win_images);
    free(pw);
    for (int k = 0; k < nthreads; k++) {
        free(ws[k].rgb);
        sd_resize_ws_free(&ws[k].ws);
        sd_image_free(&ws[k].img);
        sd_image_decoder_free(ws[k].dec);
        sd_sample_free(&ws[k].smp);
    }
    free(ws);
    return storage_failed;
}

/* A committed shard's filter attribute and this run's &data filter: the same conditions (a
 * text that does not parse, edited by hand, is another filter). */
static int same_filter(const char *shard, const char *run)
{
    sd_meta_filter a, b;
    sd_err e;
    return sd_meta_filter_parse(shard, &a, &e) == 0 && sd_meta_filter_parse(run, &b, &e) == 0 &&
           sd_meta_filter_equal(&a, &b);
}

/* A test hook's delay on this process (sd_progress_test_delay_ms); rank 0 warns of a bad one. */
static long test_delay_ms(const char *name, int rank)
{
    int world;
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world));
    return sd_progress_test_delay_ms(name, world, rank == 0);
}

/* Rank 0 builds the index; every rank gets a view (sd_dataset_view) of one packed image of it
 * per node, in MPI shared memory (`image`, which must outlive the dataset: close_dataset): 400
 * million TSV samples make an image of ~58 GB, which a node cannot hold once per rank. */
static int open_dataset(const sd_config *cfg, MPI_Comm comm, int rank, sd_dataset *ds,
                        sd_node_buffer *image, sd_err *err)
{
    long long size = 0;
    sd_dataset built;
    int status = 0;
    memset(&built, 0, sizeof built);
    if (rank == 0) {
        /* test hook: an index that takes this much longer (hundreds of millions of samples),
         * working meanwhile */
        sd_progress_sleep_ms(test_delay_ms("SDTRAIN_TEST_INDEX_DELAY_MS", rank));
        if (sd_dataset_open(cfg->data.input, cfg->data.input_format, &built, err) != 0)
            status = 1;
        else if (cfg->data.filter[0] && built.format == SD_DATASET_TSV) { /* format 'auto' */
            sd_err_set(err, "&data filter needs each sample's .json metadata, which the tsv "
                            "manifest '%s' has none of", cfg->data.input);
            status = 1;
        }
        size = (long long)(status ? 0 : sd_dataset_pack_size(&built));
    }
    if (rank == 0 && status && err->storage)
        status = 2; /* the storage failed the index: a retry may succeed */
    if (rank == 0 && status == 0) {
        /* what indexing met that is no sample (damaged shards, unreadable folders, bad lines):
         * named here, counted in the summary */
        for (int i = 0; i < built.n_notes; i++)
            sd_warn("%s", built.notes[i]);
        if (built.n_notes_total > built.n_notes)
            sd_warn("%lld more problem(s) of the dataset '%s' are only counted (summary: \"index\")",
                    (long long)(built.n_notes_total - built.n_notes), cfg->data.input);
    }
    /* indexing hundreds of millions of samples takes rank 0 minutes: the others' wait is
     * bounded by rank 0's own stall watchdog */
    if (rank != 0)
        sd_progress_wait_begin("waiting for rank 0 to index the dataset");
    SD_MPI_CHECK(MPI_Bcast(&status, 1, MPI_INT, 0, comm));
    if (rank != 0)
        sd_progress_wait_end();
    if (status) {
        sd_dataset_close(&built);
        SD_MPI_CHECK(MPI_Bcast(err->msg, (int)sizeof err->msg, MPI_CHAR, 0, comm));
        err->storage = status == 2;
        return -1;
    }
    SD_MPI_CHECK(MPI_Bcast(&size, 1, MPI_LONG_LONG, 0, comm));
    {
        /* Test hook: SDTRAIN_TEST_NO_SHARED_INDEX=1 takes the fallback of a node whose shared
         * window cannot be had (one copy per rank), as if MPI_Win_allocate_shared had failed. */
        const char *off = getenv("SDTRAIN_TEST_NO_SHARED_INDEX");
        const int try_shared = !(off && *off && strcmp(off, "0") != 0);
        const double mib = (double)size / (1024.0 * 1024.0);
        sd_err why;
        int n[4]; /* copies of the image, ranks, nodes that fell back, nodes that share one */
        const int one_copy = sd_node_buffer_alloc(comm, (size_t)size, try_shared, image, &why) == 0;
        if (!one_copy && image->node_rank == 0)
            sd_warn("dataset index: %.1f MiB (%lld bytes) not in node-shared memory (%s): one copy on "
                    "each of this node's %d ranks", mib, size, why.msg, image->node_size);
        n[0] = image->shared ? image->node_rank == 0 : 1;
        n[1] = 1;
        n[2] = !one_copy && image->node_rank == 0;
        n[3] = image->shared && image->node_rank == 0;
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, n, 4, MPI_INT, MPI_SUM, comm));
        if (rank == 0 && n[3] == 0 && n[2] == 0) /* each rank alone on its node */
            sd_info("dataset index: %.1f MiB (%lld bytes), one copy for each of the %d rank(s), "
                    "each alone on its node", mib, size, n[1]);
        else if (rank == 0 && n[2] == 0)
            sd_info("dataset index: %.1f MiB (%lld bytes) in node-shared memory, %d cop%s for %d "
                    "rank(s) (one per node)", mib, size, n[0], n[0] == 1 ? "y" : "ies", n[1]);
        else if (rank == 0)
            sd_info("dataset index: %.1f MiB (%lld bytes), %d copies for %d rank(s): one per rank "
                    "on the %d node(s) without node-shared memory", mib, size, n[0], n[1], n[2]);
    }
    /* packed straight into the node's copy, the build going as it is copied: rank 0 holds
     * the index twice over only in part, only while it packs */
    if (rank == 0)
        sd_dataset_pack_close(&built, image->data, (size_t)size);
    sd_node_buffer_publish(image);
    if (sd_dataset_view(image->data, (size_t)size, ds, err) != 0)
        SD_CHECK(0, "the broadcast dataset index does not unpack: %s", err->msg);
    ds->utf8_policy = strcmp(cfg->data.caption_utf8, "reject") == 0 ? SD_UTF8_REJECT : SD_UTF8_REPLACE;
    ds->missing_caption = strcmp(cfg->data.missing_caption, "empty") == 0 ? SD_MISSING_CAPTION_EMPTY
                                                                          : SD_MISSING_CAPTION_SKIP;
    if (cfg->data.max_samples > 0)
        sd_dataset_truncate(ds, cfg->data.max_samples);
    return 0;
}

/* Collective over the preprocessing communicator: the dataset, then the image it views. */
static void close_dataset(sd_dataset *ds, sd_node_buffer *image)
{
    sd_dataset_close(ds);
    sd_node_buffer_free(image);
}

/* Rank 0: whether the shards an earlier run committed in the shard directory belong to this
 * run's plan, which skips them and writes the others (shard k holds good samples of
 * [k S, min((k+1) S, n))). Every committed shard must be one of the plan's, hold at most the
 * samples the plan gives it and be of this resolution; the first one holding samples (else the
 * first, an empty one) is opened, and its encoder weights and keys (in order, among the samples
 * the plan gives it) must be this run's. Another
 * &data input, max_samples or samples_per_shard, or other encoders, would otherwise top the
 * directory up with samples twice over, or with latents of another space, without a word. */
static int check_committed(const sd_config *cfg, const sd_dataset *ds, int64_t n, int64_t n_shards,
                           const sd_shard_manifest *man, const encoders *e, sd_err *err)
{
    const int64_t S = cfg->data.samples_per_shard;
    static const char *const advice = "use another &data shard_dir, or empty this one";
    const sd_shard_entry *m0;
    sd_shard *sh = NULL;
    char *keys = NULL;
    int rc = 0;
    if (man->n == 0)
        return 0;
    for (int64_t i = 0; i < man->n; i++) {
        const sd_shard_entry *m = &man->entries[i];
        const int64_t planned = m->index < n_shards ? (n - m->index * S < S ? n - m->index * S : S) : 0;
        if (m->samples > planned)
            return sd_err_set(err, "%s: the committed %s holds %lld samples, but this run plans %lld "
                              "for it (%lld samples of %s in shards of %lld): the shards were written "
                              "with another &data input, max_samples or samples_per_shard; %s",
                              cfg->data.shard_dir, m->file, (long long)m->samples, (long long)planned,
                              (long long)n, cfg->data.input, (long long)S, advice);
        if (m->index >= n_shards)
            return sd_err_set(err, "%s: the committed %s is beyond this run's plan of %lld shard(s) "
                              "(%lld samples of %s in shards of %lld): the shards were written "
                              "with another &data input, max_samples or samples_per_shard; %s",
                              cfg->data.shard_dir, m->file, (long long)n_shards, (long long)n,
                              cfg->data.input, (long long)S, advice);
        /* the range the writer planned for it (manifests since 2026-11-27): the same samples,
         * starting at the same key, also for a shard left empty, whose keys say nothing */
        if (m->has_range &&
            (m->range.first != m->index * S || m->range.samples != planned ||
             m->range.key_hash != sd_shard_key_hash(sd_dataset_key(ds, m->index * S))))
            return sd_err_set(err, "%s: the committed %s was planned for samples %lld to %lld of "
                              "its run's input, starting at a key with FNV-1a %016llx; this run "
                              "plans samples %lld to %lld for it, starting at '%s' (%lld samples of "
                              "%s in shards of %lld): the shards were written with another &data "
                              "input, max_samples or samples_per_shard; %s", cfg->data.shard_dir,
                              m->file, (long long)m->range.first,
                              (long long)(m->range.first + m->range.samples - 1),
                              (unsigned long long)m->range.key_hash, (long long)(m->index * S),
                              (long long)(m->index * S + planned - 1),
                              sd_dataset_key(ds, m->index * S), (long long)n, cfg->data.input,
                              (long long)S, advice);
        if (m->resolution != e->res)
            return sd_err_set(err, "%s: the committed %s is of resolution %d, this run's is %d; %s",
                              cfg->data.shard_dir, m->file, m->resolution, e->res, advice);
    }
    /* an empty shard has no keys to compare: the first one with samples, where there is one */
    m0 = &man->entries[0];
    for (int64_t i = 1; i < man->n && m0->samples == 0; i++)
        if (man->entries[i].samples > 0)
            m0 = &man->entries[i];
    /* HDF5's reads of the shard (open, header, keys) as one marked call on it */
    char m0_path[SD_PATH_MAX + 80];
    snprintf(m0_path, sizeof m0_path, "%s/%s", cfg->data.shard_dir, m0->file);
    sd_progress_io_enter_path("HDF5 read", m0_path);
    if (sd_shard_open_entry(cfg->data.shard_dir, m0, &sh, err)) {
        sd_progress_io_leave();
        return -1;
    }
    {
        const sd_shard_info *in = sd_shard_get_info(sh);
        const sd_shard_entry *m = m0;
        const size_t kw = in->key_width + 1;
        if (strcmp(in->weights_hash, e->weights_hash) != 0) {
            rc = sd_err_set(err, "%s: the committed %s was encoded by other weights (%s, %s) than "
                            "this run's (%s, %s); %s", cfg->data.shard_dir, m->file,
                            in->weights_hash, in->weights_path, e->weights_hash, e->weights_path,
                            advice);
        } else if (!same_filter(in->filter, cfg->data.filter)) {
            rc = sd_err_set(err, "%s: the committed %s was made with &data filter = '%s', this "
                            "run has '%s' (its shards would hold samples another selection "
                            "chose); %s", cfg->data.shard_dir, m->file, in->filter,
                            cfg->data.filter, advice);
        } else {
            keys = sd_xmalloc((size_t)in->n_samples * kw + 1);
            rc = sd_shard_read_keys(sh, 0, in->n_samples, 1, keys, kw, err);
        }
        sd_progress_io_leave();
        /* its keys, in order, among the keys of the samples the plan gives it */
        for (int64_t r = 0, i = m->index * S; rc == 0 && r < in->n_samples; r++, i++) {
            const char *key = keys + (size_t)r * kw;
            const int64_t end = n - m->index * S < S ? n : (m->index + 1) * S;
            while (i < end && strcmp(sd_dataset_key(ds, i), key) != 0)
                i++;
            if (i == end)
                rc = sd_err_set(err, "%s: the committed %s holds sample '%s', which this run's plan "
                                "does not put there (%lld samples of %s in shards of %lld): the "
                                "shards were written from another input; %s", cfg->data.shard_dir,
                                m->file, key, (long long)n, cfg->data.input, (long long)S, advice);
        }
    }
    free(keys);
    sd_shard_close(sh);
    return rc;
}

/* What the dataset index counted that is no sample (sd_dataset_stats), as the summary names it. */
typedef struct index_count {
    const char *name;
    int64_t n;
} index_count;
enum { N_INDEX_COUNTS = 7 };

static void index_counts(const sd_dataset_stats *st, index_count *c)
{
    const index_count all[N_INDEX_COUNTS] = {
        {"damaged_shards", st->n_damaged_shards},   {"truncated_members", st->n_truncated},
        {"unreadable_folders", st->n_unreadable_dirs}, {"bad_lines", st->n_bad_lines},
        {"orphan_captions", st->n_orphan_captions}, {"duplicates", st->n_duplicates},
        {"ignored_files", st->n_ignored}};
    memcpy(c, all, sizeof all);
}

/* One run's part of <shard_dir>/preprocess_summary.json: the shards it committed, as ranges
 * [first, last] in increasing order, and why their samples were kept or skipped (summed over
 * ranks). */
typedef struct summary_run {
    int64_t (*ranges)[2];
    int64_t n_ranges, cap;
    double seconds;
    uint64_t counts[N_COUNTS];
} summary_run;

static void summary_run_add(summary_run *r, int64_t first, int64_t last)
{
    if (r->n_ranges > 0 && r->ranges[r->n_ranges - 1][1] == first - 1) {
        r->ranges[r->n_ranges - 1][1] = last;
        return;
    }
    if (r->n_ranges == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 8;
        r->ranges = sd_xrealloc(r->ranges, (size_t)r->cap * sizeof *r->ranges);
    }
    r->ranges[r->n_ranges][0] = first;
    r->ranges[r->n_ranges][1] = last;
    r->n_ranges++;
}

static int64_t summary_run_shards(const summary_run *r)
{
    int64_t n = 0;
    for (int64_t i = 0; i < r->n_ranges; i++)
        n += r->ranges[i][1] - r->ranges[i][0] + 1;
    return n;
}

static void summary_runs_free(summary_run *runs, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        free(runs[i].ranges);
    free(runs);
}

static uint64_t kept_count(const uint64_t *counts)
{
    uint64_t kept = 0;
    for (int i = 0; i < SD_SAMPLE_N_REASONS; i++)
        if (sd_sample_reason_keeps((sd_sample_reason)i))
            kept += counts[i];
    return kept;
}

/* The counts[] entry a summary names `name`, or -1. */
static int count_index(const char *name)
{
    char buf[64];
    for (int i = 0; i < N_COUNTS; i++)
        if (!strcmp(count_name(i, buf, sizeof buf), name))
            return i;
    return -1;
}

/* A JSON integer >= 0, else -1. */
static int64_t json_count(json_object *v)
{
    if (!v || !json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0)
        return -1;
    return json_object_get_int64(v);
}

/* The runs of the summary at `path` (written by earlier runs) that still describe the shard
 * directory: each of their shards is committed (in `man`, read when this run started) and the
 * manifest lists as many samples for them as the run kept. A run that does not (its shards were
 * removed, or rewritten since) is dropped and counted in *dropped. Returns 0 (no file: no runs),
 * or -1 with why the file is no summary this run can add to: unreadable, another format or
 * version, another plan (n samples in shards of S), a shard counted twice. */
static int read_summary(const char *path, int64_t n, int64_t S, int64_t n_shards,
                        const sd_shard_manifest *man, summary_run **out, int64_t *n_out,
                        int64_t *dropped, sd_err *err)
{
    json_object *root, *v = NULL, *runs = NULL;
    summary_run *r = NULL;
    unsigned char *seen = NULL;
    int64_t nr = 0;
    size_t len = 0;
    int rc = 0;
    *out = NULL;
    *n_out = *dropped = 0;
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return 0;
    if (sd_json_read_object(path, &root, err) != 0)
        return -1;
    if (!json_object_object_get_ex(root, "format", &v) || !json_object_is_type(v, json_type_string) ||
        strcmp(json_object_get_string(v), "sdtrain-preprocess-summary") != 0)
        rc = sd_err_set(err, "%s: not an sdtrain preprocessing summary", path);
    else if (!json_object_object_get_ex(root, "version", &v) || json_count(v) != 2)
        rc = sd_err_set(err, "%s: a summary of version %lld, not 2 (version 1 counted the shards "
                             "of the run that wrote it only)", path, (long long)json_count(v));
    else if (!json_object_object_get_ex(root, "dataset_samples", &v) || json_count(v) != n ||
             !json_object_object_get_ex(root, "samples_per_shard", &v) || json_count(v) != S)
        rc = sd_err_set(err, "%s: the summary of another plan (this run's: %lld samples in shards "
                             "of %lld)", path, (long long)n, (long long)S);
    else if (!json_object_object_get_ex(root, "runs", &runs) ||
             !json_object_is_type(runs, json_type_array))
        rc = sd_err_set(err, "%s: a summary without \"runs\"", path);
    if (rc == 0) {
        len = json_object_array_length(runs);
        r = sd_xcalloc(len + 1, sizeof *r);
        seen = sd_xcalloc((size_t)n_shards + 1, 1);
    }
    for (size_t i = 0; rc == 0 && i < len; i++) {
        json_object *run = json_object_array_get_idx(runs, i), *shards, *reasons;
        summary_run *x = &r[nr];
        int64_t listed = 0;
        int committed = 1, ok = json_object_is_type(run, json_type_object) &&
                                json_object_object_get_ex(run, "shards", &shards) &&
                                json_object_is_type(shards, json_type_array) &&
                                json_object_object_get_ex(run, "reasons", &reasons) &&
                                json_object_is_type(reasons, json_type_object);
        for (size_t j = 0; ok && j < json_object_array_length(shards); j++) {
            json_object *range = json_object_array_get_idx(shards, j);
            int64_t a = -1, b = -1;
            if (json_object_is_type(range, json_type_array) && json_object_array_length(range) == 2) {
                a = json_count(json_object_array_get_idx(range, 0));
                b = json_count(json_object_array_get_idx(range, 1));
            }
            ok = a >= 0 && a <= b && b < n_shards;
            if (ok)
                summary_run_add(x, a, b);
        }
        if (ok) {
            json_object_object_foreach(reasons, name, count)
            {
                const int c = count_index(name);
                const int64_t m = json_count(count);
                if (c < 0 || m < 0) {
                    ok = 0;
                    break;
                }
                x->counts[c] += (uint64_t)m;
            }
        }
        if (!ok) {
            rc = sd_err_set(err, "%s: run %zu of \"runs\" is not {\"shards\": [[first, last], ...], "
                                 "\"reasons\": {...}} of this plan's shards and known reasons",
                            path, i + 1);
            free(x->ranges);
            break;
        }
        if (json_object_object_get_ex(run, "seconds", &v) &&
            (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)))
            x->seconds = json_object_get_double(v);
        for (int64_t j = 0; committed && j < x->n_ranges; j++)
            for (int64_t k = x->ranges[j][0]; committed && k <= x->ranges[j][1]; k++) {
                const sd_shard_entry *e = sd_shard_manifest_find(man, k);
                committed = e != NULL;
                listed += e ? e->samples : 0;
            }
        if (!committed || (uint64_t)listed != kept_count(x->counts)) {
            free(x->ranges);
            memset(x, 0, sizeof *x);
            (*dropped)++;
            continue;
        }
        nr++; /* (kept: freed with the others when a shard turns out counted twice) */
        for (int64_t j = 0; rc == 0 && j < x->n_ranges; j++)
            for (int64_t k = x->ranges[j][0]; rc == 0 && k <= x->ranges[j][1]; k++) {
                if (seen[k])
                    rc = sd_err_set(err, "%s: two runs count shard %lld", path, (long long)k);
                seen[k] = 1;
            }
    }
    json_object_put(root);
    free(seen);
    if (rc != 0) {
        summary_runs_free(r, nr);
        return -1;
    }
    *out = r;
    *n_out = nr;
    return 0;
}

/* The members of a summary's "reasons" object: the counts that are not 0, by name. */
static void put_reasons(FILE *f, const uint64_t *counts)
{
    char name[64];
    for (int i = 0, first = 1; i < N_COUNTS; i++) {
        if (!counts[i])
            continue;
        fprintf(f, "%s\"%s\": %" PRIu64, first ? "" : ", ", count_name(i, name, sizeof name),
                counts[i]);
        first = 0;
    }
}

/* The per-reason summary (rank 0). With print_table, this run's table on stdout: `counts` are
 * its samples by reason. Then <shard_dir>/preprocess_summary.json (doc/datasets.md, "The
 * summary file"): the runs of the earlier summary that still describe the directory, and this
 * one's (`mine`: the shards it committed and their counts, a part of `counts` only when a shard
 * was read and not committed), with their sums: the counts of every committed shard some run
 * counted, not just this run's. Nothing is lost: a rerun that commits nothing leaves an earlier
 * summary it cannot add to as it is, and one that commits shards moves it to ".old". */
static void write_summary(const sd_config *cfg, const uint64_t *counts, const summary_run *mine,
                          const sd_dataset_stats *ist, const sd_shard_manifest *man,
                          int64_t n_samples, int64_t n_shards, int64_t n_new_shards, int print_table)
{
    const int64_t S = cfg->data.samples_per_shard;
    char path[SD_PATH_MAX + 64], old[SD_PATH_MAX + 96], name[64];
    uint64_t kept = kept_count(counts), read = 0, all[N_COUNTS] = {0}, all_kept;
    int64_t n_runs = 0, dropped = 0, counted = 0;
    summary_run *runs = NULL;
    index_count ic[N_INDEX_COUNTS];
    int any_index = 0;
    sd_err err;
    char *text = NULL;
    size_t text_len = 0;
    FILE *f;
    sd_err_clear(&err);
    index_counts(ist, ic);
    for (int i = 0; i < N_INDEX_COUNTS; i++)
        any_index |= ic[i].n != 0;
    for (int i = 0; i < N_COUNTS; i++)
        read += counts[i];
    if (print_table) {
        printf("preprocessing summary: %" PRIu64 " samples read, %" PRIu64 " kept, %" PRIu64
               " skipped, %lld new shard(s), %.1f s\n", read, kept, read - kept,
               (long long)n_new_shards, mine->seconds);
        printf("  %-28s %12s  %s\n", "reason", "samples", "outcome");
        for (int i = 0; i < N_COUNTS; i++) {
            if (!counts[i])
                continue;
            int keeps = i < SD_SAMPLE_N_REASONS && sd_sample_reason_keeps((sd_sample_reason)i);
            printf("  %-28s %12" PRIu64 "  %s\n", count_name(i, name, sizeof name), counts[i],
                   keeps ? "kept" : "skipped");
        }
        if (any_index) {
            /* found while indexing, before any sample: not among the samples read */
            printf("  dataset index (not samples):");
            for (int i = 0, first = 1; i < N_INDEX_COUNTS; i++)
                if (ic[i].n) {
                    printf("%s %s %lld", first ? "" : ",", ic[i].name, (long long)ic[i].n);
                    first = 0;
                }
            printf("\n");
        }
        fflush(stdout);
    }

    snprintf(path, sizeof path, "%s/preprocess_summary.json", cfg->data.shard_dir);
    if (read_summary(path, n_samples, S, n_shards, man, &runs, &n_runs, &dropped, &err) != 0) {
        if (mine->n_ranges == 0) {
            sd_info("%s; it is left as it is (this run committed no shard)", err.msg);
            return;
        }
        snprintf(old, sizeof old, "%s.old", path);
        if (rename(path, old) != 0) {
            sd_warn("%s, and it cannot be moved to %s (%s): the summary is not updated", err.msg,
                    old, strerror(errno));
            return;
        }
        sd_warn("%s; it is kept as %s, and the new summary counts this run's shards only", err.msg,
                old);
    }
    if (dropped > 0)
        sd_warn("%s: %lld earlier run(s) counted shards that are not committed as they were then "
                "(removed or rewritten since): their counts are dropped", path, (long long)dropped);
    if (mine->n_ranges > 0) {
        runs = sd_xrealloc(runs, (size_t)(n_runs + 1) * sizeof *runs);
        runs[n_runs] = *mine;
        runs[n_runs].ranges = sd_xmalloc((size_t)mine->n_ranges * sizeof *mine->ranges);
        memcpy(runs[n_runs].ranges, mine->ranges, (size_t)mine->n_ranges * sizeof *mine->ranges);
        runs[n_runs].cap = mine->n_ranges;
        n_runs++;
    }
    read = 0;
    for (int64_t r = 0; r < n_runs; r++) {
        counted += summary_run_shards(&runs[r]);
        for (int i = 0; i < N_COUNTS; i++)
            all[i] += runs[r].counts[i];
    }
    for (int i = 0; i < N_COUNTS; i++)
        read += all[i];
    all_kept = kept_count(all);
    if (print_table && (n_runs > (mine->n_ranges > 0) || counted < man->n + n_new_shards))
        printf("  all runs (%s): %" PRIu64 " samples read, %" PRIu64 " kept, %" PRIu64 " skipped "
               "in %lld of the %lld committed shard(s)%s\n", path, read, all_kept, read - all_kept,
               (long long)counted, (long long)(man->n + n_new_shards),
               counted < man->n + n_new_shards ? " (the others were committed by runs whose "
                                                 "counts it lacks: killed, say)" : "");
    fflush(stdout);

    f = open_memstream(&text, &text_len);
    SD_CHECK(f != NULL, "open_memstream: %s", strerror(errno));
    fprintf(f, "{\"format\": \"sdtrain-preprocess-summary\", \"version\": 2, \"dataset_samples\": %lld, "
               "\"samples_per_shard\": %lld, \"shards_planned\": %lld, \"shards_committed\": %lld, "
               "\"shards_counted\": %lld, \"read\": %" PRIu64 ", \"kept\": %" PRIu64 ", \"skipped\": %"
               PRIu64 ", \"new_shards\": %lld, \"reasons\": {", (long long)n_samples, (long long)S,
            (long long)n_shards, (long long)(man->n + n_new_shards), (long long)counted, read,
            all_kept, read - all_kept, (long long)n_new_shards);
    put_reasons(f, all);
    fprintf(f, "}, \"index\": {");
    for (int i = 0; i < N_INDEX_COUNTS; i++)
        fprintf(f, "%s\"%s\": %lld", i ? ", " : "", ic[i].name, (long long)ic[i].n);
    fprintf(f, "},\n \"runs\": [");
    for (int64_t r = 0; r < n_runs; r++) {
        fprintf(f, "%s\n  {\"shards\": [", r ? "," : "");
        for (int64_t j = 0; j < runs[r].n_ranges; j++)
            fprintf(f, "%s[%lld, %lld]", j ? ", " : "", (long long)runs[r].ranges[j][0],
                    (long long)runs[r].ranges[j][1]);
        fprintf(f, "], \"seconds\": %.2f, \"reasons\": {", runs[r].seconds);
        put_reasons(f, runs[r].counts);
        fprintf(f, "}}");
    }
    fprintf(f, "\n ]}\n");
    SD_CHECK(fclose(f) == 0, "open_memstream: %s", strerror(errno));
    if (sd_write_file_atomic(path, text, text_len, &err) != 0)
        sd_warn("cannot write %s: %s", path, err.msg);
    free(text);
    summary_runs_free(runs, n_runs);
}

/* A sample whose encoding is not finite as the shard stores it (NaN or infinity from the
 * encoders, or a value that fp16 storage rounds to infinity) would make every training step
 * that draws it non-finite, epoch after epoch: it leaves the slice before the shard is written,
 * counted as "non_finite_encoding" instead of its reason, with a warning naming it (the first
 * ten of a rank; a broken encoder would otherwise print one per sample).
 * SDTRAIN_FAULT nan:rank=R:phase=encode:step=I (a test hook) makes the moments of global sample
 * I NaN on world rank R first. */
static void drop_non_finite(slice *s, const encoders *e, sd_dtype dtype, int world_rank,
                            uint64_t *counts, int *warned)
{
    const size_t mom = enc_mom(e), emb = enc_emb(e);
    int64_t out = 0;
    for (int64_t i = 0; i < s->n; i++) {
        float *m = s->moments + (size_t)i * mom, *x = s->embeddings + (size_t)i * emb;
        if (sd_fault_armed(SD_FAULT_NAN, world_rank, s->index[i], "encode"))
            m[0] = NAN;
        if (sd_shard_storable(m, mom, dtype) && sd_shard_storable(x, emb, dtype)) {
            if (out != i) {
                memcpy(s->moments + (size_t)out * mom, m, mom * sizeof(float));
                memcpy(s->embeddings + (size_t)out * emb, x, emb * sizeof(float));
                memcpy(s->ids + (size_t)out * TEXT_LEN, s->ids + (size_t)i * TEXT_LEN,
                       TEXT_LEN * sizeof(int32_t));
                s->captions[out] = s->captions[i];
                s->keys[out] = s->keys[i];
                s->count[out] = s->count[i];
                s->index[out] = s->index[i];
            }
            out++;
            continue;
        }
        if (*warned < 10)
            sd_warn("sample %lld (%s): its %s encoding is not finite as %s: skipped%s",
                    (long long)s->index[i], s->keys[i],
                    sd_shard_storable(m, mom, dtype) ? "caption" : "image",
                    dtype == SD_F16 ? "fp16 (|x| < 65520)" : "fp32",
                    *warned == 9 ? " (further ones on this rank are only counted)" : "");
        (*warned)++;
        counts[s->count[i]]--;
        counts[COUNT_NON_FINITE]++;
        free(s->captions[i]);
        free(s->keys[i]);
    }
    s->n = out;
}

/* A shard's collective write on a thread of the rank's own, so that the main thread reads,
 * decodes and encodes the next shard meanwhile (&data overlap_writes). MPI and HDF5 are used by
 * one thread of the rank at a time (MPI_THREAD_SERIALIZED; HDF5 is not built thread-safe): from
 * writer_start to writer_finish the main thread makes no MPI or HDF5 call, and the writers of all
 * ranks make the same collective calls in the same order, shard after shard. The slice written
 * is not touched by the main thread until the join (in writer_finish). Without the thread (overlap off, or an MPI
 * without MPI_THREAD_SERIALIZED) writer_start writes at once on the calling thread. */
typedef struct shard_writer {
    /* the write */
    MPI_Comm comm;
    const char *dir;
    const sd_shard_meta *meta;
    const float *empty;
    int64_t index;
    sd_shard_batch batch;
    uint64_t counts[N_COUNTS]; /* its samples by reason, over all ranks (set before the start) */
    /* its outcome */
    int rc;
    sd_shard_entry entry;
    sd_shard_range range; /* the planned range of the shard written, recorded in the manifest */
    sd_err err;
    double seconds; /* the write's own time */
    double done;    /* when it ended */
    int on_thread;  /* whether it runs (ran) on the writer thread, to be joined */
    /* the thread */
    int threaded;
    int pending;    /* a write started whose outcome writer_finish has not taken */
    double started; /* when the shard's reading began (for its log line) */
    pthread_t thread;
    /* every write's outcome: the shards committed and their counts, for the summary */
    summary_run committed;
} shard_writer;

static void writer_write(shard_writer *w)
{
    double t0 = sd_time_now();
    w->rc = sd_shard_write(w->comm, w->dir, w->index, w->meta, w->empty, &w->batch, &w->entry, &w->err);
    w->done = sd_time_now();
    w->seconds = w->done - t0;
}

static void *writer_main(void *arg)
{
    writer_write(arg);
    return NULL;
}

/* Writes slice s as shard `index`: on the writer thread (returns at once; writer_finish waits),
 * or on this one. */
static void writer_start(shard_writer *w, int64_t index, const sd_shard_range *range,
                         const slice *s, double started)
{
    SD_CHECK(!w->pending, "a shard write is still running");
    w->index = index;
    w->range = *range;
    w->batch.range = &w->range;
    w->started = started;
    w->pending = 1;
    w->batch.n = s->n;
    w->batch.layout = SD_LATENT_NHWC;
    w->batch.moments = s->moments;
    w->batch.embeddings = s->embeddings;
    w->batch.ids = s->ids;
    w->batch.captions = (const char *const *)s->captions;
    w->batch.keys = (const char *const *)s->keys;
    sd_err_clear(&w->err);
    w->on_thread = 0;
    if (!w->threaded) {
        writer_write(w);
        return;
    }
    /* created with every signal blocked (as the loader's prefetch thread is): the SIGUSR1 /
     * SIGTERM caught for a stop at the next boundary is never handled on this thread, where it
     * would interrupt a system call inside MPI-IO or HDF5 */
    sigset_t all, old;
    sigfillset(&all);
    SD_CHECK(pthread_sigmask(SIG_SETMASK, &all, &old) == 0, "block signals");
    int e = pthread_create(&w->thread, NULL, writer_main, w);
    SD_CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0, "restore signals");
    if (e != 0) {
        /* (every rank writes this shard, on its thread or here: the collective calls still
         * pair up; later shards are written here) */
        sd_warn("cannot start a thread for the shard writes (%s): they are made between "
                "encodings from now on", strerror(e));
        w->threaded = 0;
        writer_write(w);
        return;
    }
    w->on_thread = 1;
}

/* The outcome of the last write started (after waiting for it): 0 and the shard's log line,
 * or -1 with the message printed by rank 0. Nothing to do without a pending write. *waited gets
 * the time spent joining the writer thread, or all of a write made on this thread. (A write beside the
 * encoding is logged when its outcome is taken, after the next shard's encoding; its times are
 * its own.) */
static int writer_finish(shard_writer *w, int rank, int64_t n_shards, double *t, double *waited,
                         int64_t *n_new)
{
    if (!w->pending)
        return 0;
    w->pending = 0;
    if (w->on_thread) {
        const double t0 = sd_time_now();
        int e;
        sd_progress_phase("waiting for the writer of shard", w->index);
        e = pthread_join(w->thread, NULL);
        SD_CHECK(e == 0, "cannot join the shard writer thread: %s", strerror(e));
        *waited += sd_time_now() - t0;
    } else {
        *waited += w->seconds;
    }
    t[T_WRITE] += w->seconds;
    if (w->rc != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", w->err.msg);
        return -1;
    }
    (*n_new)++;
    summary_run_add(&w->committed, w->index, w->index);
    for (int i = 0; i < N_COUNTS; i++)
        w->committed.counts[i] += w->counts[i];
    if (rank == 0)
        sd_info("shard %lld/%lld committed: %lld samples (%.2f s from its first read, of it %.2f s "
                "writing%s)", (long long)w->index + 1, (long long)n_shards,
                (long long)w->entry.samples, w->done - w->started, w->seconds,
                w->on_thread ? " on the writer thread" : "");
    return 0;
}

/* Rank 0, before the first shard: a warning when the shards still to write will not fit. Each
 * shard checks its own room before it is written (sd_shard_write), so this only says early what
 * would otherwise be found after hours of encoding. The estimate leaves out the captions and
 * keys (not read yet) and counts every sample (some may be skipped). */
static void warn_if_no_room(const sd_config *cfg, const sd_shard_meta *meta,
                            const sd_shard_manifest *man, int64_t n, int64_t n_shards)
{
    const int64_t per = cfg->data.samples_per_shard;
    double need = 0;
    int64_t todo = 0;
    for (int64_t k = 0; k < n_shards; k++) {
        if (sd_shard_manifest_find(man, k))
            continue;
        const int64_t len = n - k * per < per ? n - k * per : per;
        need += sd_shard_data_bytes(meta, len, 0, 0);
        todo++;
    }
    const double avail = sd_fs_free_bytes(cfg->data.shard_dir);
    if (todo > 0 && avail >= 0 && avail < need)
        sd_warn("the %lld shard(s) still to write need about %.1f MiB (latents, embeddings and "
                "token ids), and the file system of '%s' has %.1f MiB free: the run will stop at "
                "the first shard that does not fit (the shards committed before it are kept, "
                "and a rerun with room goes on from them)",
                (long long)todo, need / 1048576.0, cfg->data.shard_dir, avail / 1048576.0);
}

/* Each rank's time for its parts of the shards: every rank waits for the slowest at the end
 * of each shard's encoding (the shard is written only when all parts are in), so one slow node,
 * GPU or file system costs all of them. Rank 0 judges the times over intervals of at least a
 * minute of its clock (report_s; the test hook SDTRAIN_TEST_PART_REPORT_MS sets another) and
 * the last one at the end: a shard can take well under a second on many GPUs, and a warning a
 * shard would flood the log. */
typedef struct part_times {
    struct {
        double v;
        int rank;                 /* world rank */
    } *last;                      /* rank 0: each rank's time of the last shard, by role rank */
    double *total;                /* rank 0: each rank's sum over this run's shards */
    double *iv;                   /* rank 0: each rank's sum over the interval's shards */
    int64_t shards;               /* shards timed */
    int64_t iv_first, iv_last;    /* rank 0: the interval's first and last shard; -1: none yet */
    double iv_start;              /* rank 0: when the interval began (its clock) */
    double report_s;              /* rank 0: the intervals' least length (s) */
} part_times;

/* The (first) index of the largest of v[0 .. n-1]; *sum := their sum. */
static int slowest_of(const double *v, int n, double *sum)
{
    int slow = 0;
    *sum = 0;
    for (int r = 0; r < n; r++) {
        *sum += v[r];
        if (v[r] > v[slow])
            slow = r;
    }
    return slow;
}

/* Rank 0: names a rank that is a straggler over the interval (sd_progress_is_straggler, the
 * span its own time: the others waited that long for it), then starts a new interval. */
static void report_parts(part_times *pt, int size)
{
    double sum;
    if (!pt->iv || pt->iv_first < 0)
        return;
    const int slow = slowest_of(pt->iv, size, &sum);
    const double mean = sum / size;
    if (sd_progress_is_straggler(pt->iv[slow], mean, pt->iv[slow])) {
        char which[64];
        if (pt->iv_first == pt->iv_last)
            snprintf(which, sizeof which, "shard %lld", (long long)pt->iv_first);
        else
            snprintf(which, sizeof which, "shards %lld-%lld", (long long)pt->iv_first,
                     (long long)pt->iv_last);
        sd_warn("%s: rank %d took %.2f s for its parts (reading, decoding, encoding), the ranks' "
                "mean %.2f s: the others wait for it at every shard (a slow node, GPU or file "
                "system?)", which, pt->last[slow].rank, pt->iv[slow], mean);
    }
    memset(pt->iv, 0, (size_t)size * sizeof *pt->iv);
    pt->iv_first = -1;
}

/* Collective, after shard k's encoding (no write running): this rank's `secs` for its part
 * (reading, decoding, tokenizing, encoding), begun at `started`, gathered on rank 0, which
 * reports on the interval once it has lasted report_s. */
static void time_parts(part_times *pt, MPI_Comm comm, int rank, int size, int world_rank,
                       int64_t k, double started, double secs)
{
    struct {
        double v;
        int rank;
    } mine = {secs, world_rank};
    if (size < 2)
        return;
    if (rank == 0 && !pt->last) {
        pt->last = sd_xmalloc((size_t)size * sizeof *pt->last);
        pt->total = sd_xcalloc((size_t)size, sizeof *pt->total);
        pt->iv = sd_xcalloc((size_t)size, sizeof *pt->iv);
        pt->iv_first = -1;
        pt->report_s = 60.0;
        if (getenv("SDTRAIN_TEST_PART_REPORT_MS"))
            pt->report_s = 1e-3 * (double)sd_progress_test_delay_ms("SDTRAIN_TEST_PART_REPORT_MS",
                                                                    world_rank, 1);
    }
    SD_MPI_CHECK(MPI_Gather(&mine, 1, MPI_DOUBLE_INT, pt->last, 1, MPI_DOUBLE_INT, 0, comm));
    pt->shards++;
    if (rank != 0)
        return;
    if (pt->iv_first < 0) {
        pt->iv_first = k;
        pt->iv_start = started;
    }
    pt->iv_last = k;
    for (int r = 0; r < size; r++) {
        pt->total[r] += pt->last[r].v;
        pt->iv[r] += pt->last[r].v;
    }
    if (sd_time_now() - pt->iv_start >= pt->report_s)
        report_parts(pt, size);
}

/* Rank 0, in the summary: the last interval's report, then the rank that took longest over the
 * run's shards, against the mean. */
static void print_part_times(part_times *pt, int size)
{
    double sum;
    if (!pt->total || pt->shards == 0)
        return;
    report_parts(pt, size);
    const int slow = slowest_of(pt->total, size, &sum);
    printf("slowest rank: %d, %.2f s for its parts of %lld shard(s) against the ranks' mean of "
           "%.2f s (%.0f%% more)\n", pt->last[slow].rank, pt->total[slow],
           (long long)pt->shards, sum / size,
           sum > 0 ? 100.0 * (pt->total[slow] * size / sum - 1.0) : 0.0);
}

/* Collective over the preprocessing ranks, at a shard boundary (no write running): stop[0] = a
 * signal caught on any of them, stop[1] = a pipeline's training half's stop word (rank 0 hears
 * it). A signal caught here is passed on to the trainers; returns 1 on rank 0 when it sent the
 * word (sd_pipeline_stop_tell). */
static int agree_stop(const sd_runtime *rt, MPI_Comm comm, int stop[2])
{
    int why[2] = {sd_ckpt_signal_pending(), sd_pipeline_stop_heard(rt)};
    SD_MPI_CHECK(MPI_Allreduce(why, stop, 2, MPI_INT, MPI_MAX, comm));
    return stop[0] ? sd_pipeline_stop_tell(rt, stop[0]) : 0;
}

int sd_mode_process(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev)
{
    const sd_config *cfg = &rc->cfg;
    MPI_Comm comm = rt->role_comm;
    int rank = rt->role_rank, size = rt->role_size, code = SD_EXIT_OK, world_rank;
    int non_finite_warned = 0;
    sd_dataset ds;
    sd_node_buffer index_image; /* what ds views: one copy of the index per node */
    encoders enc;
    sd_err err, read_err;
    sd_shard_manifest man;
    sd_shard_meta meta;
    uint64_t counts[N_COUNTS] = {0}, total[N_COUNTS] = {0};
    uint64_t shard_start[N_COUNTS]; /* counts[] before the shard being read */
    float *empty = NULL;
    slice sl[2];
    int cur = 0;
    shard_writer writer;
    int64_t n, n_shards, n_new = 0;
    double t_start = sd_time_now(), t_loop = 0, t_waited = 0, t[T_N] = {0}, part_s;
    part_times parts = {.last = NULL, .iv_first = -1};
    long delay_ms = 0;
    /* SIGUSR1 / SIGTERM (Slurm's notice ahead of the time limit, scancel) stop the run at a
     * shard boundary: the shard encoded is committed, and a rerun goes on from there. In a
     * pipeline job the training half's stop word counts as a signal, and a signal caught here is
     * passed on to the trainers, which checkpoint (runtime.h, sd_pipeline_stop_tell). */
    const int pipeline = !strcmp(cfg->run.mode, "pipeline");
    int stop[2] = {0, 0}; /* agreed at the last boundary: a signal caught here, the trainers' */
    int64_t stopped_at = -1; /* a signal stop's shard: after committing it, or before it */
    int stopped_before = 0;
    int abandoned = 0; /* the stop came in the middle of shard stopped_at: its work is dropped */
    int told = 0; /* rank 0 sent the trainers the stop word (sd_pipeline_stop_tell) */
    /* a pipeline job ending with its training: stop at a shard boundary once told */
    const int stop_when_trained = pipeline && !strcmp(cfg->run.pipeline_end, "training");
    MPI_Request trained_req = MPI_REQUEST_NULL; /* completed once the trainers' word came */
    sd_progress_phase("preprocessing set-up (dataset index, encoders)", -1);

    memset(&ds, 0, sizeof ds);
    memset(&index_image, 0, sizeof index_image);
    memset(sl, 0, sizeof sl);
    memset(&writer, 0, sizeof writer);
    sd_err_clear(&err);
    sd_ckpt_signals_install();
    /* Test hook: slow preprocessing down by this much per shard (RANK:MS: one rank), so that
     * tests can show a pipeline's training does not depend on how fast its shards come, and
     * that a slow rank is named. */
    delay_ms = test_delay_ms("SDTRAIN_TEST_SHARD_DELAY_MS", rank);

    if (open_dataset(cfg, comm, rank, &ds, &index_image, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        return err.storage ? SD_EXIT_FAILURE : SD_EXIT_USAGE; /* storage: status 1, a retry */
    }
    n = sd_dataset_count(&ds);
    n_shards = sd_dataset_n_shards(n, cfg->data.samples_per_shard);
    {
        /* mode 'pipeline': the trainers learn how many shards to expect (a no-op otherwise) */
        sd_pipeline_plan plan = {n_shards, n};
        sd_pipeline_send_plan(rt, &plan);
    }

    if (sd_agree(comm, load_encoders(cfg, dev, &enc, &err) != 0, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        free_encoders(&enc);
        close_dataset(&ds, &index_image);
        return SD_EXIT_USAGE;
    }
    /* Which shards a previous run committed: rank 0 reads the manifest and tells the others,
     * so that every rank skips the same shards even where a file system's client caches let
     * two nodes see two versions of the file (the ranks' collectives pair shard by shard). */
    memset(&man, 0, sizeof man);
    if (sd_agree(comm, rank == 0 && sd_shards_committed(cfg->data.shard_dir, &man, &err) != 0,
                 &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        free_encoders(&enc);
        close_dataset(&ds, &index_image);
        /* a shard changed after its commit is not mended by a retry; the storage may be */
        return err.storage ? SD_EXIT_FAILURE : SD_EXIT_USAGE;
    }
    {
        int64_t head[2] = {man.n, man.total_samples};
        SD_MPI_CHECK(MPI_Bcast(head, 2, MPI_INT64_T, 0, comm));
        if (rank != 0) {
            man.n = head[0];
            man.total_samples = head[1];
            man.entries = man.n > 0 ? sd_xmalloc((size_t)man.n * sizeof *man.entries) : NULL;
        }
        if (man.n > 0) {
            MPI_Datatype entry_type; /* an entry a unit: a count of entries fits an int */
            SD_CHECK(man.n <= INT_MAX, "%lld committed shards", (long long)man.n);
            SD_MPI_CHECK(MPI_Type_contiguous((int)sizeof *man.entries, MPI_BYTE, &entry_type));
            SD_MPI_CHECK(MPI_Type_commit(&entry_type));
            SD_MPI_CHECK(MPI_Bcast(man.entries, (int)man.n, entry_type, 0, comm));
            SD_MPI_CHECK(MPI_Type_free(&entry_type));
        }
    }
    /* the committed shards are this run's to skip */
    if (sd_agree(comm, rank == 0 && check_committed(cfg, &ds, n, n_shards, &man, &enc, &err) != 0,
                 &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        sd_shard_manifest_free(&man);
        free_encoders(&enc);
        close_dataset(&ds, &index_image);
        return err.storage ? SD_EXIT_FAILURE : SD_EXIT_USAGE;
    }
    /* a shard directory that cannot take shards: an error now, before any encoding */
    if (sd_agree(comm, rank == 0 && (sd_mkdir_writable(cfg->data.shard_dir, "shard directory",
                                                       &err) != 0 ||
                                     sd_lock_dir(cfg->data.shard_dir, ".sdtrain-writer.lock",
                                                 "shard directory", &err) != 0), &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        sd_shard_manifest_free(&man);
        free_encoders(&enc);
        close_dataset(&ds, &index_image);
        return SD_EXIT_USAGE;
    }
    if (rank == 0)
        sd_info("preprocessing %lld samples of %s into %lld shard(s) of %lld in %s with %d rank(s); %lld "
                "already committed; weights %s (%s); encoders on %s in %s", (long long)n, cfg->data.input,
                (long long)n_shards, (long long)cfg->data.samples_per_shard, cfg->data.shard_dir, size,
                (long long)man.n, enc.weights_path, enc.weights_hash, enc.be->name,
                encode_precision(cfg, dev));

    /* The empty caption's embedding: what caption dropout and guidance use. */
    {
        int32_t ids[TEXT_LEN];
        empty = sd_xmalloc((size_t)TEXT_LEN * (size_t)enc.ccfg.hidden_size * sizeof(float));
        sd_tokenize(enc.tok, "", 0, ids, NULL);
        sd_upload(enc.be, enc.d_ids[0], ids, sizeof ids);
        sd_clip_forward(enc.clip, 1, TEXT_LEN, enc.d_ids[0], enc.d_emb, &enc.clip_arena, NULL);
        sd_synchronize(enc.be);
        sd_download_f32(enc.be, empty, enc.d_emb, (int64_t)TEXT_LEN * enc.ccfg.hidden_size);
    }
    sd_shard_meta_defaults(&meta);
    meta.resolution = enc.res;
    meta.latent_channels = enc.vcfg.latent_channels;
    meta.text_len = TEXT_LEN;
    meta.embed_dim = enc.ccfg.hidden_size;
    meta.scaling_factor = enc.vcfg.scaling_factor;
    meta.float_dtype = strcmp(cfg->data.shard_dtype, "fp32") == 0 ? SD_F32 : SD_F16;
    memcpy(meta.weights_path, enc.weights_path, sizeof meta.weights_path);
    memcpy(meta.weights_hash, enc.weights_hash, sizeof meta.weights_hash);
    snprintf(meta.filter, sizeof meta.filter, "%s", cfg->data.filter);

    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank)); /* SDTRAIN_FAULT's rank */
    if (rank == 0)
        warn_if_no_room(cfg, &meta, &man, n, n_shards);
    if (stop_when_trained)
        sd_pipeline_trained_listen(rt, &trained_req);
    /* Shard k is read and encoded into slice sl[cur] while shard k-1 (in the other slice) is
     * written on the writer thread; its outcome is taken before shard k's write starts. */
    writer.comm = comm;
    writer.dir = cfg->data.shard_dir;
    writer.meta = &meta;
    writer.empty = empty;
    writer.threaded = cfg->data.overlap_writes && !stop_when_trained && sd_mpi_serialized();
    if (rank == 0 && cfg->data.overlap_writes && !writer.threaded)
        sd_info("shards are written between encodings, not beside them (%s)",
                stop_when_trained ? "&run pipeline_end = 'training' checks for the trainers' word between shards"
                                  : "the MPI library lacks MPI_THREAD_SERIALIZED");
    t_loop = sd_time_now();
    for (int64_t k = 0; k < n_shards && code == SD_EXIT_OK; k++) {
        int64_t begin, end;
        double t0 = sd_time_now();
        if (sd_shard_manifest_find(&man, k))
            continue; /* committed by an earlier run: its samples are not read again */
        sd_progress_phase("reading and encoding shard", k);
        sd_progress_sleep_ms(delay_ms); /* the test hook's slow preprocessing is work */
        /* (no shard write runs here: with stop_when_trained the writes are not threaded) */
        if (stop_when_trained && sd_pipeline_trained(rt, &trained_req)) {
            /* the trainers send their word after a signal stop too (their own, or this half's
             * passed on): then preprocessing stops for the signal, and says so */
            agree_stop(rt, comm, stop); /* (training is over: telling it only marks the word
                                           sent, so that the wait below does not send it) */
            if (stop[0] || stop[1]) {
                stopped_at = k;
                stopped_before = 1;
            } else if (rank == 0) {
                sd_info("training is done (&run pipeline_end = 'training'): preprocessing stops "
                        "before shard %lld of %lld; a later 'process' or 'pipeline' run commits "
                        "the rest", (long long)k + 1, (long long)n_shards);
            }
            break;
        }
        /* the shard's samples [span_first, span_end) (the plan's), and this rank's part of them */
        int64_t span_first, span_end;
        sd_dataset_partition(n, cfg->data.samples_per_shard, 1, 0, k, &span_first, &span_end);
        sd_dataset_partition(n, cfg->data.samples_per_shard, size, rank, k, &begin, &end);
        slice_reset(&sl[cur]);
        sd_err_clear(&read_err);
        memcpy(shard_start, counts, sizeof shard_start);
        int cut;
        const int read_failed = process_range(cfg, &ds, &enc, begin, end, world_rank, &sl[cur],
                                              counts, t, &cut, &read_err);
        if (!read_failed)
            drop_non_finite(&sl[cur], &enc, meta.float_dtype, world_rank, counts,
                            &non_finite_warned);
        part_s = sd_time_now() - t0;
        if (writer_finish(&writer, rank, n_shards, t, &t_waited, &n_new) != 0) {
            code = SD_EXIT_FAILURE;
            break;
        }
        /* an input the storage could not deliver, on any rank (after the join: no MPI call
         * while a write is on the writer thread): the shards committed so far stay, this one is
         * not written, and the run ends with status 1 so that a retry resumes here */
        if (sd_agree(comm, read_failed, &read_err)) {
            if (rank == 0)
                sd_error("cannot read input %s; the shards committed so far are kept, shard %lld "
                         "is not written, and the run ends with status 1 so that a retry "
                         "resumes there", read_err.msg, (long long)k);
            code = SD_EXIT_FAILURE;
            break;
        }
        {
            /* the shard's samples by reason over all ranks, which the summary adds up once it
             * is committed (no write is pending: the last one was taken above), and how many
             * are kept: a shard of nothing but skipped samples is committed empty (the shards
             * are numbered without gaps; readers skip it), bad input never stops the run */
            uint64_t mine[N_COUNTS + 2];
            for (int i = 0; i < N_COUNTS; i++)
                mine[i] = counts[i] - shard_start[i];
            mine[N_COUNTS] = (uint64_t)sl[cur].n;
            mine[N_COUNTS + 1] = (uint64_t)cut; /* ranks whose work a signal cut short */
            SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mine, N_COUNTS + 2, MPI_UINT64_T, MPI_SUM, comm));
            if (mine[N_COUNTS + 1] > 0) {
                /* the shard is incomplete on some rank: not written, its samples not counted;
                 * every rank stops here (the signal is agreed as at a boundary) */
                memcpy(counts, shard_start, sizeof shard_start);
                told = agree_stop(rt, comm, stop);
                stopped_at = k;
                stopped_before = 1;
                abandoned = 1;
                break;
            }
            memcpy(writer.counts, mine, sizeof writer.counts);
            time_parts(&parts, comm, rank, size, world_rank, k, t0, part_s);
            if (mine[N_COUNTS] == 0 && rank == 0)
                sd_warn("shard %lld is empty: each of its %lld samples (%lld to %lld of %s, from "
                        "'%s' on) was skipped (bad image, caption or encoding: the summary counts "
                        "why, &run log_level = 'debug' names each); it is committed with 0 "
                        "samples, and training skips it", (long long)k,
                        (long long)(span_end - span_first), (long long)span_first,
                        (long long)span_end - 1, cfg->data.input, sd_dataset_key(&ds, span_first));
        }
        {
            /* SDTRAIN_FAULT usr1:rank=R:step=K: world rank R is signalled once shard K is encoded.
             * (No write runs here: the last one was taken above.) A signal stop is passed on to
             * the trainers at once: they stop at their next step while this shard is written. */
            if (sd_fault_armed(SD_FAULT_USR1, world_rank, k, NULL))
                raise(SIGUSR1);
            told = agree_stop(rt, comm, stop);
        }
        {
            /* the range the plan gives shard k, recorded in its manifest entry (check_committed) */
            const sd_shard_range range = {span_first, span_end - span_first,
                                          sd_shard_key_hash(sd_dataset_key(&ds, span_first))};
            writer_start(&writer, k, &range, &sl[cur], t0);
        }
        if (!writer.threaded && writer_finish(&writer, rank, n_shards, t, &t_waited, &n_new) != 0) {
            code = SD_EXIT_FAILURE;
            break;
        }
        cur ^= 1;
        if (stop[0] || stop[1]) { /* this shard's write is taken below, with the loop's last one */
            stopped_at = k;
            break;
        }
    }
    if (writer_finish(&writer, rank, n_shards, t, &t_waited, &n_new) != 0)
        code = SD_EXIT_FAILURE;
    if (code == SD_EXIT_OK && stopped_at >= 0 && rank == 0)
        sd_info("stopped for %s%s %s shard %lld%s: %lld of the %lld shards are committed, and a "
                "rerun goes on from them%s", sd_ckpt_signal_name(stop[0] ? stop[0] : stop[1]),
                stop[0] ? "" : " (caught by the training half)",
                stopped_before ? "before" : "after committing", (long long)stopped_at,
                abandoned ? " (its encoding, under way, is dropped)" : "",
                (long long)(man.n + n_new), (long long)n_shards,
                told ? "; the training half is told to stop too" : "");

    SD_MPI_CHECK(MPI_Reduce(counts, total, N_COUNTS, MPI_UINT64_T, MPI_SUM, 0, comm));
    {
        /* each stage's time summed over ranks: the shares say where the job's work went */
        double sum[T_N], all = 0, waited = 0;
        int n_threaded = 0; /* ranks whose writes ran on the writer thread at the end */
        SD_MPI_CHECK(MPI_Reduce(t, sum, T_N, MPI_DOUBLE, MPI_SUM, 0, comm));
        SD_MPI_CHECK(MPI_Reduce(&t_waited, &waited, 1, MPI_DOUBLE, MPI_SUM, 0, comm));
        SD_MPI_CHECK(MPI_Reduce(&writer.threaded, &n_threaded, 1, MPI_INT, MPI_SUM, 0, comm));
        const double now = sd_time_now(), secs = now - t_start, loop = now - t_loop;
        writer.committed.seconds = secs;
        /* (after a failure too: the shards committed before it are counted) */
        if (rank == 0 && (code == SD_EXIT_OK || writer.committed.n_ranges > 0))
            write_summary(cfg, total, &writer.committed, &ds.stats, &man, n, n_shards, n_new,
                          code == SD_EXIT_OK);
        if (code == SD_EXIT_OK && rank == 0) {
            const uint64_t kept = kept_count(total);
            for (int i = 0; i < T_N; i++)
                all += sum[i];
            printf("throughput: %.1f images/s (%" PRIu64 " encoded in %.2f s on %d rank(s)); time by stage:",
                   secs > 0 ? (double)kept / secs : 0.0, kept, secs, size);
            for (int i = 0; i < T_N; i++)
                printf(" %s %.1f%%", stage_names[i], all > 0 ? 100.0 * sum[i] / all : 0.0);
            /* shares of the work, not of the wall time: a write beside the encoding overlaps it */
            printf("%s\n", n_threaded ? " (the writes on a thread of their own)" : "");
            /* what the decode threads alone would deliver: the rate to compare with the
             * encoders' (on a GPU the two overlap and the slower one sets the throughput) */
            {
                double cpu = 0;
                for (int i = T_READ; i <= T_TOKENIZE; i++)
                    cpu += sum[i];
                printf("CPU stages (read to tokenize): %.1f images/s per rank; encode: %.1f "
                       "images/s per rank\n", cpu > 0 ? (double)kept / cpu : 0.0,
                       sum[T_ENCODE] > 0 ? (double)kept / sum[T_ENCODE] : 0.0);
            }
            /* the rate once the encoders are loaded (what a long run approaches), and the
             * writes' own rate: beside the encoding only their excess over it costs time */
            printf("after set-up (%.2f s: dataset index, encoder weights, device): %.1f images/s; "
                   "shard writes %s: %.1f images/s per rank, waited for %.2f s per rank\n",
                   t_loop - t_start, loop > 0 ? (double)kept / loop : 0.0,
                   n_threaded == size ? "beside the encoding"
                   : n_threaded    ? "beside the encoding on some ranks"
                                   : "between encodings",
                   sum[T_WRITE] > 0 ? (double)kept / sum[T_WRITE] : 0.0, waited / size);
            print_part_times(&parts, size);
            fflush(stdout);
        }
    }
    free(empty);
    free(parts.last);
    free(parts.total);
    free(parts.iv);
    free(writer.committed.ranges);
    slice_free(&sl[0]);
    slice_free(&sl[1]);
    sd_shard_manifest_free(&man);
    free_encoders(&enc);
    close_dataset(&ds, &index_image);
    if (code == SD_EXIT_OK && stop_when_trained) {
        /* every shard first: take the trainers' word, passing a signal on meanwhile */
        int sig;
        sd_progress_wait_begin("waiting for the training half to finish");
        sig = sd_pipeline_wait_watching(rt, &trained_req);
        sd_progress_wait_end();
        if (sig && rank == 0)
            sd_info("%s while preprocessing waits for the end of training: the training half "
                    "stops at its next step, with a checkpoint", sd_ckpt_signal_name(sig));
    }
    return code;
}
