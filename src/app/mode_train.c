/* &run mode = 'train': the U-Net trained data-parallel from latent shards (DDP or ZeRO-2 over the
 * training communicator), on the CPU or a GPU, with metrics, validation and a final summary. */
#include "sd_config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <json-c/json.h>

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/collectives.h"
#include "sdtrain/device.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/fault.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/grad_buckets.h"
#include "sdtrain/json_file.h"
#include "sdtrain/loader.h"
#include "sdtrain/log.h"
#include "sdtrain/modes.h"
#include "sdtrain/ops.h"
#include "sdtrain/optim.h"
#include "sdtrain/rng.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"
#if defined(SD_HAVE_CUDA)
#include "sdtrain/nccl_comm.h"
#include "sdtrain/optim_cuda.h"
#endif

/* the most gradient buckets a step cuts (grad_bucket_mb is raised to stay below) */
#define GRAD_BUCKETS_MAX 1024

/* Validation noise, timesteps and latent samples use this reserved step counter, so they are
 * the same at every evaluation, in every run and after every resume. */
#define VAL_RNG_STEP SD_RNG_MAX_STEP

enum { T_DATA, T_FWD, T_BWD, T_COMM, T_OPT, T_N };
static const char *const t_names[T_N] = {"data_wait", "forward", "backward", "comm", "optimizer"};

/* One step's inputs (doc/training.md "Inputs"): made on the host by make_inputs, then carried
 * to the backend by one sd_upload_async of `h` into `d` (fp32; the micro-batches cast them to
 * the compute type). Two alternate so that step s+1's are made and travel while step s
 * computes. */
typedef struct step_inputs {
    int count;              /* samples: bs * acc (a step) or up to bs (validation) */
    int cap;                /* samples the buffers hold */
    int64_t epoch;          /* the loader's epoch of the step */
    int ready;              /* fetched for the step the loop runs next */
    int failed;             /* sd_loader_next failed (err says why) */
    int stopped;            /* follow mode: its wait for a shard ended for a signal stop */
    sd_err err;
    int32_t *tsteps;        /* [cap] timesteps, for the loss weights */
    float *tfloat;          /* [cap] the same as floats (validation's U-Net calls) */
    unsigned char *drop;    /* [cap] caption dropped */
    /* the block that travels: [xh | ctx | target | coef | tsin], fp32, host (sd_host_alloc:
     * pinned on CUDA) and backend copies; xh = x_t and target in NHWC, coef =
     * sd_diffusion_loss_coef, tsin = the timesteps' sinusoids (sd_unet_time_sinusoid) */
    float *h, *d;
    size_t floats;
} step_inputs;

/* Everything one training rank holds. */
typedef struct trainer {
    const sd_config *cfg;
    sd_comm *comm;
    int rank, size, world_rank;
    const sd_backend *be;
    sd_unet_config uc;
    sd_weights w;          /* parameters: the flat fp32 buffer, full on every rank */
    float *grads;          /* full flat buffer (ZeRO-2: reduced into this rank's shard only) */
    float *m, *v, *ema;    /* optimizer state and EMA: the shard [begin, end) only */
    size_t n, begin, end;  /* buffer size in floats and this rank's shard */
    int zero2;
    /* grad_reduce = 'overlap': the last micro-batch's backward launches the buckets' reductions
     * as it finishes them (doc/training.md "Gradient reduction") */
    int overlap;
    sd_grad_buckets gb;
    /* ... and, with ZeRO-2 on the device path, the parameters' all-gather after AdamW runs
     * bucket by bucket (gb's cuts, from the start of the buffer) ahead of the next forward,
     * which waits only for the buckets it is about to read (param_need) */
    int pgather;
    int pg_next;           /* the first bucket, counted from the buffer's start, that the forward
                              has not asked for yet; gb.count: nothing pending */
    int follow;            /* mode 'pipeline': the loader follows the shards being written */
    sd_unet *unet;
    sd_unet_trainer *tr;
    sd_arena arena;
    sd_diffusion diff;
    sd_adamw_hparams adam;
    sd_lr_schedule sched;
    sd_loader *loader;
    sd_loader_info info;
    /* make_inputs' host work arrays, NCHW (bs * acc samples: the micro-batches in a row) */
    int bs, acc, C, H, W, L, D;
    float *x0, *noise, *xt, *target;
    /* the inputs of two steps (the current one and the next, made and uploaded while the
     * current one computes) and of a validation batch */
    step_inputs in[2], val_in;
    float *mse;            /* host copy of d_mse (bs * acc) */
    FILE *metrics;
    int64_t metrics_lost;  /* rank 0: the step whose metrics line could not be written, or -1 */
    /* The GPU (doc/training.md "On the GPU"); on the CPU be is the CPU backend, the d_* buffers
     * of a micro-batch below are host memory and the rest of this part is unused. */
    int gpu;               /* the CUDA backend computes the U-Net (or emu) */
    int emu;               /* SDTRAIN_EMULATE_DEVICE_PATH=1 on the CPU: the device path's buffers,
                              ranges and collectives with the CPU backend and MPI (a test mode) */
    sd_comm *ecomm;        /* emu: MPI collectives over the device path's equal shards */
    int dev_opt;           /* "device" path: reduction and optimizer on the GPU; else "host" path */
    const char *path_why;  /* why the host path was chosen (rank 0's info line), or NULL */
    sd_cmd_backend cb;     /* owns the CUDA backend */
    const sd_backend *hb;  /* the CPU backend: layout changes of the host arrays */
    size_t np, shard;      /* device path: padded buffer length (size * shard) and shard length */
    void *d_params;        /* the U-Net's parameters (be->dtype), np elements */
    float *d_master;       /* device path: fp32 master parameters (d_params itself in fp32),
                              holding floats [mbase, ...): see master_sharded */
    int master_sharded;    /* ZeRO-2 with several ranks in bf16 (and in the emulation): d_master
                              is this rank's shard only, mbase = begin (the master is optimizer
                              state, as ZeRO shards it); AdamW writes the compute copy of its
                              range, the ranks gather d_params, and the whole master is gathered
                              only to be read (dp_master_full) */
    size_t mbase;
    float *d_grads;        /* fp32 gradients, np */
    float *d_m, *d_v, *d_ema; /* device path: [begin, end) */
    size_t dev_bytes;      /* what dev_alloc allocated: parameters, gradients, optimizer state */
    void *d_scratch;       /* device path: sumsq / non-finite scratch */
    /* one micro-batch in and out, in the backend's memory (the CPU's: host arrays) and dtype:
     * the latents and contexts (cast from the fp32 inputs), the prediction, the loss gradient;
     * and the per-sample MSE of a step (fp32, bs * acc) */
    void *d_xh, *d_ctx, *d_yh, *d_dy;
    float *d_mse;
#if defined(SD_HAVE_CUDA)
    sd_nccl *nccl;         /* device path with several ranks */
#endif
    /* checkpoints (doc/checkpoints.md) */
    const sd_run_config *rc;
    MPI_Comm mpi_comm;
    char ckpt_dir[4200];
    int64_t start_step, start_opt_step, start_skipped; /* 0 or the resumed checkpoint's */
    int64_t last_ckpt;  /* step of the newest checkpoint this run wrote or resumed, or -1 */
    double ckpt_clock;  /* &checkpoint every_n_minutes: rank 0's time the interval counts from */
    char last_ckpt_path[4200]; /* the checkpoint this run wrote last (or resumed from, when its
                                  &sample every_n_steps images are not all there), or "" */
    const sd_device_info *dev_info; /* this rank's device (&sample every_n_steps' images) */
    int resumed, stopped; /* stopped: by a signal, after checkpointing */
    /* mode 'pipeline': the runtime (the stop word to and from the preprocessing half), and on
     * rank 0 why the loader's wait for a shard ended (wait_stop): a signal caught here, the
     * preprocessing half's; wait_step: the step whose inputs the loader is fetching (-1 at open) */
    const sd_runtime *rt;
    int stop_own, stop_peer;
    int64_t wait_step;
    int setup_exit;        /* the exit status of a failed setup when not SD_EXIT_USAGE */
    sd_ckpt_async *ack;    /* &checkpoint async: the background writer (NULL before its first) */
    int async_off;         /* &checkpoint async given up for the run (no memory for the copy) */
    double ack_held;       /* the training pause of the background checkpoint in flight */
    long load_delay_ms;    /* test hook SDTRAIN_TEST_LOAD_DELAY=RANK:MS on this rank, else 0 */
    long compute_delay_ms; /* test hook SDTRAIN_TEST_COMPUTE_DELAY=RANK:MS on this rank, else 0 */
    double comm_in_compute_s; /* this step's collectives called inside the forward and backward
                               * (buckets, parameter broadcasts): on the CPU they block and are
                               * taken out of the compute's time; a GPU only queues them */
} trainer;

/* The U-Net: its config from the snapshot (unet/config.json) or from the &model shape keys;
 * weights from the snapshot (unet_init = 'pretrained') or drawn from the seed. */
static int build_model(trainer *t, sd_err *err)
{
    const sd_config *cfg = t->cfg;
    if (cfg->model.pretrained[0]) {
        sd_snapshot s;
        if (sd_snapshot_open(&s, cfg->model.pretrained, err))
            return -1;
        if (sd_snapshot_load_unet(&s, NULL, &t->uc, &t->w, err)) {
            sd_snapshot_close(&s);
            return -1;
        }
        sd_snapshot_close(&s);
        if (strcmp(cfg->model.unet_init, "random") == 0)
            sd_weights_init_random(&t->w, cfg->run.seed);
    } else {
        sd_param_table table;
        if (strcmp(cfg->model.unet_init, "pretrained") == 0)
            return sd_err_set(err, "&model unet_init = 'pretrained' needs &model pretrained (a "
                              "diffusers snapshot with a unet/ folder)");
        sd_unet_config_from_namelist(cfg, &t->uc);
        memset(&table, 0, sizeof table);
        sd_unet_params(&t->uc, &table);
        if (sd_weights_check_size(&table, "the U-Net of the &model shape keys", err)) {
            sd_param_table_free(&table);
            return -1;
        }
        sd_weights_init(&t->w, &table);
        sd_weights_init_random(&t->w, cfg->run.seed);
    }
    return 0;
}

/* Rank 0, a U-Net from a snapshot: what of the snapshot's training setup this run does not
 * follow, as warnings (nothing here stops the run). Its config's `dropout` (diffusers drops out
 * inside every ResNet block while training; sdtrain does not), and, for its weights, a noise
 * schedule of its scheduler_config.json other than &diffusion's: fine-tuning a v-prediction
 * model on the epsilon objective, say, retrains what it predicts without a word otherwise. */
static void snapshot_training_notes(const sd_config *cfg)
{
    char path[SD_PATH_MAX + 64];
    json_object *o, *v;
    sd_err e;
    snprintf(path, sizeof path, "%s/unet/config.json", cfg->model.pretrained);
    if (sd_json_read_object(path, &o, &e) == 0) {
        if (json_object_object_get_ex(o, "dropout", &v) && v && json_object_get_double(v) > 0)
            sd_warn("%s has dropout = %g: sdtrain trains the U-Net without dropout (diffusers "
                    "applies it in every ResNet block)", path, json_object_get_double(v));
        json_object_put(o);
    }
    if (strcmp(cfg->model.unet_init, "pretrained") != 0)
        return;
    snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", cfg->model.pretrained);
    if (sd_json_read_object(path, &o, &e) != 0)
        return;
    char diff[512] = "";
    size_t n = 0;
    if (json_object_object_get_ex(o, "prediction_type", &v) && v &&
        json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), cfg->diffusion.prediction_type) != 0)
        n += (size_t)snprintf(diff + n, sizeof diff - n, "%sprediction_type '%s' (this run: '%s')",
                              n ? ", " : "", json_object_get_string(v),
                              cfg->diffusion.prediction_type);
    if (n < sizeof diff && json_object_object_get_ex(o, "num_train_timesteps", &v) && v &&
        json_object_get_int64(v) != cfg->diffusion.num_train_timesteps)
        n += (size_t)snprintf(diff + n, sizeof diff - n, "%snum_train_timesteps %lld (this run: "
                              "%lld)", n ? ", " : "", (long long)json_object_get_int64(v),
                              (long long)cfg->diffusion.num_train_timesteps);
    if (n < sizeof diff && json_object_object_get_ex(o, "beta_schedule", &v) && v &&
        json_object_is_type(v, json_type_string) &&
        strcmp(json_object_get_string(v), cfg->diffusion.beta_schedule) != 0)
        n += (size_t)snprintf(diff + n, sizeof diff - n, "%sbeta_schedule '%s' (this run: '%s')",
                              n ? ", " : "", json_object_get_string(v),
                              cfg->diffusion.beta_schedule);
    /* the betas' ends (unused by the cosine schedule), compared as the fp32 linspace takes them */
    const char *const ends[2] = {"beta_start", "beta_end"};
    const double mine[2] = {cfg->diffusion.beta_start, cfg->diffusion.beta_end};
    for (int i = 0; i < 2 && strcmp(cfg->diffusion.beta_schedule, "squaredcos_cap_v2") != 0;
         i++)
        if (n < sizeof diff && json_object_object_get_ex(o, ends[i], &v) && v &&
            (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) &&
            (float)json_object_get_double(v) != (float)mine[i])
            n += (size_t)snprintf(diff + n, sizeof diff - n, "%s%s %g (this run: %g)",
                                  n ? ", " : "", ends[i], json_object_get_double(v), mine[i]);
    /* a zero terminal SNR schedule (absent: diffusers' default, not rescaled) */
    {
        int zero_snr = 0;
        if (json_object_object_get_ex(o, "rescale_betas_zero_snr", &v) && v &&
            json_object_is_type(v, json_type_boolean))
            zero_snr = json_object_get_boolean(v) != 0;
        if (n < sizeof diff && zero_snr != (cfg->diffusion.rescale_betas_zero_snr != 0))
            n += (size_t)snprintf(diff + n, sizeof diff - n, "%srescale_betas_zero_snr %s (this "
                                  "run: %s)", n ? ", " : "", zero_snr ? "true" : "false",
                                  cfg->diffusion.rescale_betas_zero_snr ? ".true." : ".false.");
    }
    if (n)
        sd_warn("the U-Net's weights come from %s, whose scheduler has %s: this run trains it "
                "with &diffusion's schedule instead (set &diffusion to the snapshot's to "
                "continue its own)", cfg->model.pretrained, diff);
    json_object_put(o);
}

static int check_shapes(trainer *t, sd_err *err)
{
    const sd_loader_info *i = &t->info;
    if (i->latent_channels != t->uc.in_channels || t->uc.in_channels != t->uc.out_channels)
        return sd_err_set(err, "the shards hold %d-channel latents, the U-Net takes %d channels "
                          "and predicts %d (they must all agree)", i->latent_channels,
                          t->uc.in_channels, t->uc.out_channels);
    if (i->embed_dim != t->uc.cross_attention_dim)
        return sd_err_set(err, "the shards hold caption embeddings of width %d, the U-Net's "
                          "cross_attention_dim is %d (encode with the matching text encoder)",
                          i->embed_dim, t->uc.cross_attention_dim);
    return sd_unet_check_shape(&t->uc, t->bs, i->latent_size, i->latent_size, i->text_len, err);
}

/* The parts of an input block: sample offsets in floats. */
static size_t in_xh(const trainer *t, int j) { return (size_t)j * t->C * t->H * t->W; }
static size_t in_ctx(const trainer *t, const step_inputs *in, int j)
{
    return in_xh(t, in->cap) + (size_t)j * t->L * t->D;
}
static size_t in_target(const trainer *t, const step_inputs *in, int j)
{
    return in_ctx(t, in, in->cap) + in_xh(t, j);
}
static size_t in_coef(const trainer *t, const step_inputs *in, int j)
{
    return in_target(t, in, in->cap) + (size_t)j;
}
static size_t in_tsin(const trainer *t, const step_inputs *in, int j)
{
    return in_coef(t, in, in->cap) + (size_t)j * t->uc.block_out_channels[0];
}

/* Host (pinned) and backend memory for `cap` samples' inputs, or -1 with err set. */
static int inputs_alloc(trainer *t, step_inputs *in, int cap, sd_err *err)
{
    in->cap = cap;
    in->floats = in_tsin(t, in, cap);
    in->tsteps = sd_xmalloc((size_t)cap * sizeof *in->tsteps);
    in->tfloat = sd_xmalloc((size_t)cap * sizeof *in->tfloat);
    in->drop = sd_xmalloc((size_t)cap);
    in->h = sd_host_alloc(t->be, in->floats * sizeof(float));
    in->d = sd_backend_alloc(t->be, in->floats * sizeof(float));
    if (!in->h || !in->d)
        return sd_err_set(err, "training rank %d cannot allocate %.1f MB of %s memory for the "
                          "inputs of %d samples", t->rank, (double)in->floats * 4e-6,
                          !in->h ? (t->gpu ? "pinned host" : "host") : "GPU", cap);
    return 0;
}

static void inputs_free(trainer *t, step_inputs *in)
{
    free(in->tsteps);
    free(in->tfloat);
    free(in->drop);
    if (in->h)
        sd_host_free(t->be, in->h);
    if (in->d)
        sd_backend_free(t->be, in->d);
    memset(in, 0, sizeof *in);
}

/* The work arrays, the inputs of two steps and a validation batch, one micro-batch's buffers. */
static int alloc_buffers(trainer *t, sd_err *err)
{
    const size_t per = (size_t)t->C * t->H * t->W, bs = (size_t)t->bs * t->acc;
    const size_t es = sd_dtype_size(t->be->dtype);
    t->x0 = sd_xmalloc(bs * per * sizeof(float));
    t->noise = sd_xmalloc(bs * per * sizeof(float));
    t->xt = sd_xmalloc(bs * per * sizeof(float));
    t->target = sd_xmalloc(bs * per * sizeof(float));
    t->mse = sd_xmalloc(bs * sizeof(float));
    if (inputs_alloc(t, &t->in[0], (int)bs, err) || inputs_alloc(t, &t->in[1], (int)bs, err) ||
        inputs_alloc(t, &t->val_in, t->bs, err))
        return -1;
    t->d_xh = sd_backend_alloc(t->be, (size_t)t->bs * per * es);
    t->d_ctx = sd_backend_alloc(t->be, (size_t)t->bs * t->L * t->D * es);
    t->d_yh = sd_backend_alloc(t->be, (size_t)t->bs * per * es);
    t->d_dy = sd_backend_alloc(t->be, (size_t)t->bs * per * es);
    t->d_mse = sd_backend_alloc(t->be, bs * sizeof(float));
    if (!t->d_xh || !t->d_ctx || !t->d_yh || !t->d_dy || !t->d_mse)
        return sd_err_set(err, "training rank %d cannot allocate the %s buffers of a batch of %d",
                          t->rank, t->gpu ? "GPU" : "host", t->bs);
    return 0;
}

/* x0 (latent samples), noise, timesteps and contexts of `count` samples into `in`'s host block;
 * sample j uses the counters (step, ids[j]), so the draws of a sample never depend on the rank
 * that has it. */
static void make_inputs(trainer *t, const sd_loader_batch *b, uint64_t step, int train,
                        step_inputs *in)
{
    const int64_t hw = (int64_t)t->H * t->W, per = (int64_t)t->C * hw;
    const size_t ctx_elems = (size_t)t->L * t->D;
    const uint64_t seed = t->cfg->run.seed;
    const float scale = (float)(t->cfg->train.latent_scale > 0 ? t->cfg->train.latent_scale
                                                               : t->info.scaling_factor);
    sd_err err;
    SD_CHECK(b->count <= in->cap, "%d samples for inputs of %d", b->count, in->cap);
    in->count = b->count;
    for (int j = 0; j < b->count; j++) {
        const uint64_t i = (uint64_t)b->positions[j];
        const float *mom = b->moments + (size_t)j * 2 * per;
        if (t->cfg->train.latent_sample) {
            SD_CHECK(sd_diffusion_sample_latent(seed, step, i, scale, mom, mom + per, 0,
                                                t->x0 + (size_t)j * per, (size_t)per,
                                                &err) == 0, "%s", err.msg);
        } else {
            /* the posterior's mode, scaled as diffusers scales latent_dist.mode() */
            for (int64_t e = 0; e < per; e++)
                t->x0[(size_t)j * per + e] = mom[e] * scale;
        }
        SD_CHECK(sd_diffusion_noise(&t->diff, seed, step, i, t->C, hw, 0,
                                    t->noise + (size_t)j * per, (size_t)per, &err) == 0,
                 "%s", err.msg);
        in->tsteps[j] = (int32_t)sd_diffusion_timestep(&t->diff, seed, step, i);
        in->tfloat[j] = (float)in->tsteps[j];
        in->drop[j] = train && sd_diffusion_drop_caption(&t->diff, seed, step, i);
        memcpy(in->h + in_ctx(t, in, j),
               in->drop[j] ? sd_loader_empty_embedding(t->loader)
                           : b->embeddings + (size_t)j * ctx_elems,
               ctx_elems * sizeof(float));
    }
    if (train && t->diff.input_perturbation > 0.0) {
        /* the input from the perturbed noise (built in xt, then noised in place), the target
         * from the noise itself */
        for (int j = 0; j < b->count; j++)
            SD_CHECK(sd_diffusion_perturb_noise(&t->diff, seed, step,
                                                (uint64_t)b->positions[j], t->C, hw, 0,
                                                t->noise + (size_t)j * per,
                                                t->xt + (size_t)j * per, (size_t)per,
                                                &err) == 0,
                     "%s", err.msg);
        sd_diffusion_add_noise(&t->diff, in->tsteps, b->count, per, t->x0, t->xt, t->xt);
    } else {
        sd_diffusion_add_noise(&t->diff, in->tsteps, b->count, per, t->x0, t->noise, t->xt);
    }
    sd_diffusion_target(&t->diff, in->tsteps, b->count, per, t->x0, t->noise, t->target);
    sd_nchw_to_nhwc(t->hb, b->count, t->C, t->H, t->W, t->xt, in->h + in_xh(t, 0));
    sd_nchw_to_nhwc(t->hb, b->count, t->C, t->H, t->W, t->target, in->h + in_target(t, in, 0));
    sd_diffusion_loss_coef(&t->diff, in->tsteps, b->count, per, t->info.global_batch,
                           in->h + in_coef(t, in, 0));
    sd_unet_time_sinusoid(&t->uc, b->count, in->tfloat, in->h + in_tsin(t, in, 0));
}

/* The host block to the backend, asynchronously (the whole block: its size is fixed). */
static void send_inputs(trainer *t, step_inputs *in)
{
    sd_upload_async(t->be, in->d, in->h, in->floats * sizeof(float));
}

/* The training inputs of `step` into `in`: the loader's batch, the inputs made, the copy
 * started. A failed read leaves in->failed set (the loop stops on it, every rank together). */
static void fetch_inputs(trainer *t, step_inputs *in, int64_t step)
{
    const sd_loader_batch *b;
    int rc;
    /* the test hook's slow input on one rank (a straggler: "Stragglers" in doc/training.md) */
    sd_progress_sleep_ms(t->load_delay_ms);
    in->ready = 1;
    t->wait_step = step;
    rc = sd_loader_next(t->loader, &b, NULL, &in->err);
    in->stopped = rc == SD_LOADER_STOPPED;
    in->failed = rc != 0 && !in->stopped;
    if (rc)
        return;
    SD_CHECK(b->count == t->bs * t->acc, "step %lld: %d samples, expected %d x %d",
             (long long)step, b->count, t->bs, t->acc);
    in->epoch = b->epoch;
    make_inputs(t, b, (uint64_t)step, 1, in);
    send_inputs(t, in);
}

/* Micro-batch [first, first + bs) of `in` into the U-Net's input buffers (compute type). */
static void stage_micro_batch(trainer *t, const step_inputs *in, int first, int count)
{
    const int64_t per = (int64_t)t->C * t->H * t->W, ctx = (int64_t)t->L * t->D;
    sd_cast_f32(t->be, count * per, in->d + in_xh(t, first), t->d_xh);
    sd_cast_f32(t->be, count * ctx, in->d + in_ctx(t, in, first), t->d_ctx);
}

static void dp_params_complete(trainer *t);

static int any_failed(sd_comm *c, int failed);

/* Rank 0, after a metrics line: a write the file system refused (a full disk, a failing
 * storage: stdio reports it at the flush) is said once, naming the file, the step and the errno;
 * the training goes on without metrics.jsonl, whose lines are not its state (the checkpoints and
 * the final weights are unaffected), and the summary repeats it. */
static void metrics_flush(trainer *t, int64_t step)
{
    errno = 0;
    if (fflush(t->metrics) == 0 && !ferror(t->metrics))
        return;
    const int e = errno;
    sd_warn("cannot write %s/metrics.jsonl at step %lld: %s; training goes on without it (the "
            "checkpoints and the final weights are not affected)", t->cfg->run.output_dir,
            (long long)step, e ? strerror(e) : "write error");
    fclose(t->metrics);
    t->metrics = NULL;
    t->metrics_lost = step;
}

/* Validation loss: the unweighted MSE averaged over the whole held-out split, with fixed
 * latents, noise and timesteps per validation sample; split over the ranks. A read that fails
 * on any rank (a shard the storage cannot deliver) sets *failed on every rank, the rank that
 * saw it printing why, and returns NaN: the run then ends with status 1. */
static double validate(trainer *t, sd_loader_batch *vb, int64_t *n_out, int *failed)
{
    const int64_t nv = sd_loader_val_count(t->loader);
    const int64_t first = nv * t->rank / t->size, last = nv * (t->rank + 1) / t->size;
    step_inputs *in = &t->val_in;
    double sum = 0;
    sd_err err = {.storage = 0};
    sd_progress_phase("validation", -1);
    int read_failed = 0;
    dp_params_complete(t);
    for (int64_t i = first; i < last; i += t->bs) {
        int count = (int)(last - i < t->bs ? last - i : t->bs);
        if (sd_loader_read_val(t->loader, i, count, vb, &err) != 0) {
            read_failed = 1;
            break;
        }
        make_inputs(t, vb, VAL_RNG_STEP, 0, in);
        send_inputs(t, in);
        stage_micro_batch(t, in, 0, count);
        sd_unet_forward(t->unet, count, t->H, t->W, t->d_xh, in->tfloat, t->d_ctx, t->L,
                        t->d_yh, &t->arena, NULL);
        sd_mse_loss(t->be, count, (int64_t)t->H * t->W, t->C, t->d_yh,
                    in->d + in_target(t, in, 0), NULL, t->d_mse, NULL);
        sd_synchronize(t->be); /* also: the block's copy is done before the next is made */
        sd_download(t->be, t->mse, t->d_mse, (size_t)count * sizeof(float));
        for (int j = 0; j < count; j++)
            sum += t->mse[j];
    }
    *failed = any_failed(t->comm, read_failed);
    if (*failed) {
        if (read_failed)
            sd_error("validation read: %s", err.msg);
        *n_out = 0;
        return NAN;
    }
    /* the ranks' ranges partition the nv samples */
    sd_allreduce_f64(t->comm, &sum, 1, SD_RED_SUM);
    *n_out = nv;
    return nv > 0 ? sum / (double)nv : NAN;
}

/* 1 on every rank when any rank failed (over the training communicator). */
static int any_failed(sd_comm *c, int failed)
{
    int64_t v = failed != 0;
    sd_allreduce_i64(c, &v, 1, SD_RED_MAX);
    return v != 0;
}

static size_t peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

static void fmt_duration(double s, char *buf, size_t size)
{
    long v = s > 0 && s < 1e9 ? (long)(s + 0.5) : 0;
    snprintf(buf, size, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
}

/* The parameters (and the EMA) in diffusers' names and PyTorch's layouts, rank 0. */
static int write_weights(const trainer *t, const float *data, const char *name, sd_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", t->cfg->run.output_dir, name);
    return sd_weights_save_torch(&t->w.table, data, path, err);
}


/* ---- the GPU ------------------------------------------------------------------------------
 * Two ways to reduce the gradients and run the optimizer (doc/training.md "On the GPU"):
 *   device  NCCL (several ranks, one GPU each) or nothing (one rank), then sd_cuda_* on the
 *           GPU over this rank's range of padded flat buffers; the shards are equal
 *           (NCCL's reduce-scatter and all-gather need that), so their boundaries are not the
 *           CPU's sd_comm_shard ones;
 *   host    the fp32 gradients downloaded into t->grads, the CPU code of this file as it is
 *           (MPI collectives, AdamW, EMA on host arrays), the parameters uploaded again: slow
 *           for SD2, but the CPU's DDP == ZeRO-2 bits, and ranks may share a GPU. */

/* Device memory of `bytes`, or NULL with err set (the first failure only) and *failed = 1. */
static void *dev_alloc(trainer *t, const sd_device_info *dev, size_t bytes, const char *what,
                       int *failed, sd_err *err)
{
    void *p;
    if (*failed)
        return NULL;
    p = sd_backend_alloc(t->be, bytes ? bytes : 256);
    if (p) {
        t->dev_bytes += bytes;
    } else {
        sd_err_set(err, "out of GPU memory: training rank %d cannot allocate %.1f MB for %s on "
                   "GPU %d (%s); use a smaller batch_size_per_rank, recompute_activations = "
                   ".true., precision = 'bf16' or more GPUs with sharding = 'shard_grad_op'",
                   t->rank, (double)bytes * 1e-6, what, dev->device_id, dev->name);
        *failed = 1;
    }
    return p;
}

static void dev_free(trainer *t, void *p)
{
    if (p)
        sd_backend_free(t->be, p);
}

/* The comm path: SDTRAIN_GPU_COMM=device|host forces one; otherwise the device path for one
 * rank, or for several when every rank has a GPU of its own (NCCL cannot put two ranks on one
 * GPU), else the host path. Whether two ranks share a GPU is told by the GPUs' UUIDs, not by
 * counting: with one GPU per task (Slurm --gpus-per-task, CUDA_VISIBLE_DEVICES set per rank)
 * every rank sees one GPU, device 0, and yet each has its own. Collective; every rank gets the
 * same answer (or the same error). */
static int choose_comm_path(trainer *t, const sd_runtime *rt, const sd_device_info *dev,
                            sd_err *err)
{
    const char *env = getenv("SDTRAIN_GPU_COMM");
    int64_t v[2];
    int failed = 0, want = 0; /* want: 0 auto, 1 device, 2 host */
    int shared, ra = 0, rb = 0;
    unsigned char *uuids;
    static char why[160];
    if (env && *env) {
        if (!strcmp(env, "device"))
            want = 1;
        else if (!strcmp(env, "host"))
            want = 2;
        else
            failed = sd_err_set(err, "SDTRAIN_GPU_COMM = '%s': expected device or host", env) != 0;
    }
    if (t->emu) {
        /* the device path on every rank; its collectives over equal shards (place_model) */
        t->dev_opt = 1;
        t->ecomm = sd_comm_create_mpi(rt->role_comm);
        return sd_agree(rt->role_comm, failed, err);
    }
    /* v[0]: the most ranks on any node, v[1]: the fewest GPUs any rank sees (for the messages);
     * the UUIDs of every rank's GPU */
    v[0] = rt->node_size;
    v[1] = -(int64_t)dev->n_devices;
    sd_allreduce_i64(t->comm, v, 2, SD_RED_MAX);
    v[1] = -v[1];
    uuids = sd_xmalloc(16 * (size_t)t->size);
    SD_MPI_CHECK(MPI_Allgather(dev->uuid, 16, MPI_BYTE, uuids, 16, MPI_BYTE, rt->role_comm));
    shared = sd_devices_shared(uuids, t->size, &ra, &rb);
    free(uuids);
    t->path_why = NULL;
    if (want == 2) {
        t->dev_opt = 0;
        t->path_why = "SDTRAIN_GPU_COMM=host";
    } else if (t->size == 1 || !shared) {
        t->dev_opt = 1;
    } else if (want == 1) {
        failed = sd_err_set(err, "SDTRAIN_GPU_COMM=device with %d training ranks needs NCCL, "
                            "which needs one GPU per rank, but training ranks %d and %d use the "
                            "same GPU (a node runs up to %lld ranks, a rank sees %lld GPU(s)): use "
                            "as many ranks per node as GPUs, or SDTRAIN_GPU_COMM=host", t->size,
                            ra, rb, (long long)v[0], (long long)v[1]) != 0;
    } else {
        t->dev_opt = 0;
        snprintf(why, sizeof why, "training ranks %d and %d share a GPU (NCCL needs one GPU per "
                 "rank)", ra, rb);
        t->path_why = why;
    }
    if (sd_agree(rt->role_comm, failed, err))
        return -1;
    /* the same path everywhere, even if the environment differed between ranks */
    v[0] = t->dev_opt;
    sd_allreduce_i64(t->comm, v, 1, SD_RED_MIN);
    if (!v[0] && t->dev_opt && !t->path_why)
        t->path_why = "another rank chose the host path";
    t->dev_opt = (int)v[0];
#if defined(SD_HAVE_CUDA)
    /* one rank needs no communicator, except to run the overlapped path when asked to */
    if (t->dev_opt && (t->size > 1 || !strcmp(t->cfg->train.grad_reduce, "overlap"))) {
        unsigned char id[SD_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        failed = t->rank == 0 && sd_nccl_unique_id(id, err) != 0;
        if (sd_agree(rt->role_comm, failed, err))
            return -1;
        SD_MPI_CHECK(MPI_Bcast(id, SD_NCCL_ID_BYTES, MPI_BYTE, 0, rt->role_comm));
        t->nccl = sd_nccl_create(id, t->size, t->rank, dev->device_id, t->be);
    }
#else
    SD_CHECK(!t->dev_opt || t->size == 1, "multi-rank GPU training without CUDA");
#endif
    return 0;
}

/* The U-Net on its backend: on the CPU over the host weights in place; on the GPU over the
 * device copy (fp32, or bf16 rounded from the fp32 master), with the fp32 gradient buffer.
 * Sets the buffer layout: n, np, shard and this rank's optimizer range [begin, end). */
static void upload_master(trainer *t);
static int place_model(trainer *t, const sd_device_info *dev, sd_err *err)
{
    const size_t n = t->w.table.total_floats;
    int failed = 0;
    t->n = n;
    if (!t->gpu)
        return sd_unet_create_from_weights(&t->unet, &t->uc, &t->w, t->be, err);
    t->np = t->shard = n;
    if (t->dev_opt && t->size > 1) {
        /* equal shards, each a multiple of SD_SHARD_ALIGN floats (256 bytes) */
        size_t per = (n + (size_t)t->size - 1) / (size_t)t->size;
        t->shard = (per + SD_SHARD_ALIGN - 1) / SD_SHARD_ALIGN * SD_SHARD_ALIGN;
        t->np = t->shard * (size_t)t->size;
    }
    if (t->ecomm) /* rank r's shard of np floats is then [r * shard, (r + 1) * shard) */
        sd_comm_set_align(t->ecomm, t->shard);
    if (t->dev_opt) {
        t->begin = t->zero2 ? (size_t)t->rank * t->shard : 0;
        t->end = t->zero2 ? t->begin + t->shard : t->np;
    }
    t->d_params = dev_alloc(t, dev, t->np * sd_dtype_size(t->be->dtype), "the parameters",
                            &failed, err);
    t->master_sharded = t->dev_opt && t->zero2 && t->size > 1 &&
                        (t->be->dtype != SD_F32 || t->emu);
    t->mbase = t->master_sharded ? t->begin : 0;
    if (t->dev_opt)
        t->d_master = t->be->dtype == SD_F32 && !t->master_sharded
                          ? (float *)t->d_params
                          : dev_alloc(t, dev,
                                      (t->master_sharded ? t->shard : t->np) * sizeof(float),
                                      t->master_sharded ? "this rank's shard of the fp32 master "
                                                          "parameters"
                                                        : "the fp32 master parameters",
                                      &failed, err);
    t->d_grads = dev_alloc(t, dev, t->np * sizeof(float), "the gradients", &failed, err);
    if (failed)
        return -1;
    /* the padding stays zero: no gradient reaches it, so AdamW keeps it zero */
    sd_zero(t->be, t->d_params, t->np * sd_dtype_size(t->be->dtype));
    sd_upload_f32(t->be, t->d_params, t->w.data, (int64_t)n);
    upload_master(t);
    return sd_unet_create(&t->unet, &t->uc, &t->w.table, t->d_params, t->be, err);
}

/* Device path: the fp32 master parameter at float i of the flat buffer (i >= mbase). */
static float *master_at(const trainer *t, size_t i)
{
    return t->d_master + (i - t->mbase);
}

/* Device path: the master from the host parameters (t->w.data, n floats) when it is a buffer of
 * its own: all of it, or this rank's shard (the padding past n zero). */
static void upload_master(trainer *t)
{
    size_t b, e;
    if (!t->d_master || (void *)t->d_master == t->d_params)
        return;
    b = t->mbase;
    e = t->master_sharded ? t->end : t->np;
    sd_zero(t->be, t->d_master, (e - b) * sizeof(float));
    if (b < t->n)
        sd_upload(t->be, t->d_master, t->w.data + b, ((e < t->n ? e : t->n) - b) * sizeof(float));
}

/* One bucket's reduction, launched by the backward's ready hook: the sum over the ranks, on
 * every rank (DDP) or on the bucket's owner (ZeRO-2), in place. On the CPU a blocking MPI
 * collective, the same rank-order sum as the whole-buffer one, so the same bits; on the GPU's
 * device path an NCCL call on the communicator's side stream, after the backward so far. */
static void dp_bucket(trainer *t, float *buf, size_t n, int owner);

static void launch_bucket(void *user, const sd_grad_bucket *b)
{
    trainer *t = user;
    const size_t len = b->end - b->begin;
    const double t0 = sd_time_now();
    if (t->dev_opt)
        dp_bucket(t, t->d_grads + b->begin, len, t->zero2 ? b->owner : -1);
    else if (t->zero2)
        sd_reduce_f32(t->comm, t->grads + b->begin, len, SD_RED_SUM, b->owner);
    else
        sd_allreduce_f32(t->comm, t->grads + b->begin, len, SD_RED_SUM);
    t->comm_in_compute_s += sd_time_now() - t0;
}

/* &train grad_reduce: whether the gradients are reduced during the backward, and the buckets.
 * The same answer on every rank (the configuration and the comm path agree). */
static void plan_grad_reduce(trainer *t)
{
    const char *want = t->cfg->train.grad_reduce;
    const int P = t->size;
    size_t *bounds, max_floats;
    t->overlap = !strcmp(want, "overlap") ||
                 (!strcmp(want, "auto") && t->gpu && t->dev_opt && P > 1);
    if (t->overlap && t->gpu && !t->dev_opt) {
        /* the host path downloads the gradients after the backward */
        if (t->rank == 0)
            sd_warn("grad_reduce = 'overlap' needs the GPU's device path (NCCL); on the host "
                    "path the gradients are reduced after the backward");
        t->overlap = 0;
    }
    if (!t->overlap)
        return;
    bounds = sd_xmalloc(((size_t)P + 1) * sizeof *bounds);
    for (int r = 0; r < P; r++) {
        size_t e;
        if (t->dev_opt)
            bounds[r] = (size_t)r * t->shard; /* NCCL's equal shards */
        else
            sd_shard_range(t->n, P, r, t->comm->align, &bounds[r], &e);
    }
    bounds[P] = t->dev_opt ? t->np : t->n;
    max_floats = (size_t)(t->cfg->train.grad_bucket_mb * (double)(1 << 20) / sizeof(float));
    /* at most about GRAD_BUCKETS_MAX buckets: each is a collective, an event and a launch a
     * step, and a tiny grad_bucket_mb on a full-size model would make millions of them */
    if (max_floats < (bounds[P] + GRAD_BUCKETS_MAX - 1) / GRAD_BUCKETS_MAX) {
        max_floats = (bounds[P] + GRAD_BUCKETS_MAX - 1) / GRAD_BUCKETS_MAX;
        max_floats = (max_floats + SD_SHARD_ALIGN - 1) / SD_SHARD_ALIGN * SD_SHARD_ALIGN;
        if (t->rank == 0)
            sd_warn("&train grad_bucket_mb = %g would cut the %zu gradients into more than %d "
                    "buckets; using buckets of %.3g MiB", t->cfg->train.grad_bucket_mb, bounds[P],
                    GRAD_BUCKETS_MAX, (double)max_floats * sizeof(float) / (double)(1 << 20));
    }
    sd_grad_buckets_init(&t->gb, bounds, P, max_floats, SD_SHARD_ALIGN, launch_bucket, t);
    free(bounds);
    t->pgather = t->dev_opt && t->zero2 && P > 1;
    t->pg_next = t->gb.count; /* nothing launched yet */
    if (t->rank == 0)
        sd_info("gradient reduction: overlapped with the backward%s, %d buckets of up to %g MiB "
                "(%s)",
                t->pgather ? ", and the parameters' all-gather with the next forward" : "",
                t->gb.count, (double)max_floats * sizeof(float) / (double)(1 << 20),
                t->emu       ? "MPI, emulating the device path's NCCL calls"
                : t->dev_opt ? "NCCL on a stream of its own"
                           : "blocking MPI calls: on the CPU this saves no time, it runs the GPU "
                             "path's bucket order");
}

/* ---- the device path's collectives and kernels ---------------------------------------------
 * On a GPU: NCCL and the sd_cuda_* optimizer kernels (a build without CUDA reaches the device
 * path only through the emulation; choose_comm_path ensures it). In the CPU emulation of the device path
 * (t->emu, SDTRAIN_EMULATE_DEVICE_PATH=1, a test mode: doc/training.md "Testing the device path
 * without GPUs"): the deterministic MPI collectives over the same equal shards (t->ecomm, whose
 * shard alignment is the shard length) and the CPU optimizer, on the same buffers and ranges,
 * so that CI runs every line of the device path's bookkeeping with several ranks. */

/* All of buf [np] summed in place (DDP), or [np] reduced so that rank r's shard holds the sum
 * (ZeRO-2). */
static void dp_allreduce(trainer *t, float *buf, size_t n)
{
    if (t->emu) {
        sd_allreduce_f32(t->ecomm, buf, n, SD_RED_SUM);
        return;
    }
#if defined(SD_HAVE_CUDA)
    sd_nccl_allreduce_sum(t->nccl, buf, n);
#endif
}
static void dp_reduce_scatter(trainer *t, float *buf)
{
    if (t->emu) {
        sd_reduce_scatter_f32(t->ecomm, buf, buf + (size_t)t->rank * t->shard, t->np,
                              SD_RED_SUM);
        return;
    }
#if defined(SD_HAVE_CUDA)
    sd_nccl_reduce_scatter_sum(t->nccl, buf, t->shard);
#endif
}
/* Every rank's shard of buf [np] to every rank. */
static void dp_allgather(trainer *t, float *buf)
{
    if (t->emu) {
        sd_allgather_f32(t->ecomm, buf, t->np);
        return;
    }
#if defined(SD_HAVE_CUDA)
    sd_nccl_allgather(t->nccl, buf, t->shard);
#endif
}
/* One gradient bucket during the backward: summed on every rank, or on its owner. */
static void dp_bucket(trainer *t, float *buf, size_t n, int owner)
{
    if (t->emu) {
        if (owner >= 0)
            sd_reduce_f32(t->ecomm, buf, n, SD_RED_SUM, owner);
        else
            sd_allreduce_f32(t->ecomm, buf, n, SD_RED_SUM);
        return;
    }
#if defined(SD_HAVE_CUDA)
    if (owner >= 0)
        sd_nccl_bucket_reduce_sum(t->nccl, buf, n, owner);
    else
        sd_nccl_bucket_allreduce_sum(t->nccl, buf, n);
#endif
}
/* The backend's work waits for the buckets' reductions. */
static void dp_join(trainer *t)
{
#if defined(SD_HAVE_CUDA)
    if (!t->emu)
        sd_nccl_join(t->nccl);
#endif
}
static double dp_sumsq(trainer *t, const float *x, size_t n)
{
    double v = 0;
    if (t->emu)
        return sd_sumsq(x, n);
#if defined(SD_HAVE_CUDA)
    sd_cuda_sumsq(t->be, x, n, &v, t->d_scratch);
#else
    SD_CHECK(0, "the GPU device path in a build without CUDA");
#endif
    return v;
}
/* Clipping, AdamW (and the bf16 copy `lowp` of the updated range, GPU only) and the EMA. */
static void dp_optimizer(trainer *t, double lr, int64_t k, double coef, size_t len, void *lowp)
{
    float *p = master_at(t, t->begin), *g = t->d_grads + t->begin;
    const double d = sd_ema_decay(k, t->cfg->train.ema_decay, t->cfg->train.ema_start_step);
    if (t->emu) {
        SD_CHECK(lowp == NULL, "the CPU emulation of the device path runs in fp32");
        if (coef < 1.0)
            sd_scale(g, len, coef);
        sd_adamw_update(&t->adam, lr, k, p, g, t->d_m, t->d_v, len);
        if (t->d_ema)
            sd_ema_update(t->d_ema, p, len, d);
        return;
    }
#if defined(SD_HAVE_CUDA)
    if (coef < 1.0)
        sd_cuda_scale(t->be, g, len, (float)coef);
    sd_cuda_adamw_update(t->be, &t->adam, lr, k, p, g, t->d_m, t->d_v, len, lowp);
    if (t->d_ema)
        sd_cuda_ema_update(t->be, t->d_ema, p, len, d);
#endif
}

/* GPU: the optimizer state of the device path. */
static int alloc_device_state(trainer *t, const sd_device_info *dev, sd_err *err)
{
    int failed = 0;
    if (t->dev_opt) {
        const size_t len = t->end - t->begin;
        size_t scratch = 256;
#if defined(SD_HAVE_CUDA)
        if (!t->emu) {
            scratch = sd_cuda_sumsq_scratch(t->shard);
        }
#endif
        t->d_m = dev_alloc(t, dev, len * sizeof(float), "AdamW's first moments", &failed, err);
        t->d_v = dev_alloc(t, dev, len * sizeof(float), "AdamW's second moments", &failed, err);
        if (t->cfg->train.ema_decay > 0)
            t->d_ema = dev_alloc(t, dev, len * sizeof(float), "the EMA", &failed, err);
        t->d_scratch = dev_alloc(t, dev, scratch, "optimizer scratch", &failed, err);
        if (failed)
            return -1;
        sd_zero(t->be, t->d_m, len * sizeof(float));
        sd_zero(t->be, t->d_v, len * sizeof(float));
        if (t->d_ema)
            sd_copy(t->be, t->d_ema, master_at(t, t->begin), len * sizeof(float));
        sd_synchronize(t->be);
    }
    return failed ? -1 : 0;
}

/* Device path: the gradients summed over the ranks (ZeRO-2: into this rank's shard), this
 * rank's part of the squared norm (its shard, in both modes) and the non-finite flag of the
 * loss. A non-finite gradient needs no pass of its own: the squares are summed in fp64, where
 * no finite float's square overflows, so the norm (summed over the ranks' shards, which cover
 * the buffer) is non-finite exactly when some gradient is, and the step loop skips on it. */
static void dev_reduce(trainer *t, double loss_local, double stats[2], int64_t *bad)
{
    if (t->overlap)
        ; /* reduced during the backward */
    else if (t->size > 1 && t->zero2)
        dp_reduce_scatter(t, t->d_grads);
    else if (t->size > 1)
        dp_allreduce(t, t->d_grads, t->np);
    stats[0] = dp_sumsq(t, t->d_grads + (size_t)t->rank * t->shard, t->shard);
    stats[1] = loss_local;
    *bad = !isfinite(loss_local);
}

/* Device path: clipping, AdamW and the EMA on [begin, end), as the host code does them. */
static void dev_update(trainer *t, double lr, int64_t k, double coef)
{
    const size_t len = t->end - t->begin;
    void *lowp = NULL;
    /* AdamW writes the bf16 compute copy of its range too; with ZeRO-2 the ranks then
     * all-gather those bf16 shards (dev_gather). The emulation's compute copy is fp32: a copy
     * of the updated range. */
    if ((void *)t->d_master != t->d_params && !t->emu)
        lowp = (char *)t->d_params + t->begin * sd_dtype_size(t->be->dtype);
    dp_optimizer(t, lr, k, coef, len, lowp);
    if ((void *)t->d_master != t->d_params && t->emu)
        sd_copy(t->be, (float *)t->d_params + t->begin, master_at(t, t->begin),
                len * sizeof(float));
    sd_synchronize(t->be);
}

/* ZeRO-2 with grad_reduce 'overlap' on the device path, after AdamW: each bucket of the
 * parameters from its owner to the other ranks, queued from the start of the buffer on the
 * communicator's stream, a mark after each. The next forward waits for a bucket only when it
 * is about to read it (param_need). In the CPU emulation nothing moves here: param_need
 * broadcasts each bucket when asked, and until then the ranges other ranks own are NaN, so a
 * forward that read a range before asking for it would show in the loss and the weights. */
static void pg_launch(trainer *t)
{
    const size_t es = sd_dtype_size(t->be->dtype);
    for (int j = 0; j < t->gb.count; j++) {
        const sd_grad_bucket *b = &t->gb.b[t->gb.count - 1 - j];
        if (t->emu) {
            float *p = (float *)t->d_params;
            SD_CHECK(es == sizeof(float), "the CPU emulation of the device path runs in fp32");
            if (b->owner != t->rank)
                for (size_t i = b->begin; i < b->end; i++)
                    p[i] = NAN;
            continue;
        }
#if defined(SD_HAVE_CUDA)
        sd_nccl_bucket_broadcast(t->nccl, (char *)t->d_params + b->begin * es, b->end - b->begin,
                                 (int)es, b->owner);
        sd_nccl_side_mark(t->nccl, j);
#endif
    }
    t->pg_next = 0;
}

/* The U-Net trainer's need hook: the forward is about to read the parameters [0, upto). The
 * backend's stream waits for the buckets that hold them (emulation: they are broadcast now). */
static void param_need(void *user, size_t upto)
{
    trainer *t = user;
    int last = -1;
    if (upto >= t->n)
        upto = t->np; /* the padding of the last shard comes too */
    while (t->pg_next < t->gb.count) {
        const sd_grad_bucket *b = &t->gb.b[t->gb.count - 1 - t->pg_next];
        if (b->begin >= upto)
            break;
        if (t->emu) {
            const double t0 = sd_time_now();
            sd_broadcast(t->ecomm, (float *)t->d_params + b->begin,
                         (b->end - b->begin) * sizeof(float), b->owner);
            t->comm_in_compute_s += sd_time_now() - t0;
        }
        last = t->pg_next++;
    }
#if defined(SD_HAVE_CUDA)
    if (!t->emu && last >= 0)
        sd_nccl_side_wait(t->nccl, last);
#else
    (void)last;
#endif
}

/* Before anything but the training forward reads the parameters (validation, checkpoints, the
 * final weights): the whole all-gather. Collective. */
static void dp_params_complete(trainer *t)
{
    param_need(t, t->np);
}

/* Device path, ZeRO-2 with several ranks: every shard of the parameters to every rank. */
static void dev_gather(trainer *t)
{
    if (!(t->zero2 && t->size > 1))
        return;
    if (t->pgather) {
        pg_launch(t);
        return;
    }
    /* the compute copy travels: in bf16 half the bytes of the fp32 master, and no conversion
     * pass over the whole buffer; the master shards are gathered only when something reads the
     * whole master (dp_master_full) */
    if (t->be->dtype == SD_F32)
        dp_allgather(t, (float *)t->d_params);
#if defined(SD_HAVE_CUDA)
    else
        sd_nccl_allgather_bf16(t->nccl, t->d_params, t->shard);
#endif
    sd_synchronize(t->be);
}

/* The whole fp32 master, to be read (a checkpoint, the final weights): the master itself, or,
 * when each rank holds only its shard, every rank's shard gathered into the spent gradient
 * buffer (valid until the next step's backward). Waits for the parameters' gather too.
 * Collective. */
static const float *dp_master_full(trainer *t)
{
    dp_params_complete(t);
    if (!t->master_sharded)
        return t->d_master;
    sd_copy(t->be, t->d_grads + t->begin, t->d_master, t->shard * sizeof(float));
    dp_allgather(t, t->d_grads);
    sd_synchronize(t->be);
    return t->d_grads;
}

/* Device path, at the end: the master parameters into t->w.data and the EMA gathered into a
 * new host buffer (returned; NULL without EMA), on every rank. */
static float *dev_fetch(trainer *t)
{
    float *ema = NULL;
    sd_download(t->be, t->w.data, dp_master_full(t), t->n * sizeof(float));
    if (!t->d_ema)
        return NULL;
    ema = sd_xcalloc(t->np ? t->np : 1, sizeof *ema);
    if (t->zero2 && t->size > 1) {
        /* the gradients are spent: their buffer gathers the EMA shards */
        sd_copy(t->be, t->d_grads + t->begin, t->d_ema, (t->end - t->begin) * sizeof(float));
        dp_allgather(t, t->d_grads);
        sd_download(t->be, ema, t->d_grads, t->n * sizeof(float));
    } else {
        sd_download(t->be, ema, t->d_ema, t->n * sizeof(float));
    }
    return ema;
}

/* Rank 0's line on where each rank computes and how the gradients travel. Collective. */
static void report_compute(const trainer *t, const sd_runtime *rt, const sd_device_info *dev)
{
    int *ids = t->rank == 0 ? sd_xcalloc((size_t)t->size, sizeof *ids) : NULL;
    int id = t->gpu ? dev->device_id : -1;
    SD_MPI_CHECK(MPI_Gather(&id, 1, MPI_INT, ids, 1, MPI_INT, 0, rt->role_comm));
    if (t->rank == 0 && t->emu)
        sd_info("compute: CPU, emulating the GPU's device path (SDTRAIN_EMULATE_DEVICE_PATH=1, a "
                "test mode): its buffers, equal shards of %zu floats and collectives, over MPI",
                t->shard);
    if (t->rank == 0 && t->gpu && !t->emu) {
        char list[256] = "";
        size_t used = 0;
        for (int r = 0; r < t->size && used + 16 < sizeof list; r++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", r ? "," : "",
                                     ids[r]);
        if (used + 16 >= sizeof list)
            snprintf(list + used, sizeof list - used, ",...");
        sd_info("compute: CUDA (%s), precision %s%s, GPU of each training rank: %s; gradient "
                "reduction and optimizer %s%s%s", dev->name,
                t->be->dtype == SD_BF16 ? "bf16" : "fp32 (no TF32)",
                t->be->dtype == SD_BF16 ? " with fp32 master weights" : "", list,
                !t->dev_opt ? "on the host (MPI; slow for large models)"
                : t->master_sharded ? "on the GPU (NCCL; each rank holds its shard of the fp32 "
                                      "master and of AdamW's moments)"
                : t->size > 1 ? "on the GPU (NCCL)" : "on the GPU (one rank: no communication)",
                t->path_why ? ": " : "", t->path_why ? t->path_why : "");
    }
    if (t->rank == 0 && t->gpu)
        sd_info("%s memory of training rank 0: %.1f MB of parameters, gradients and optimizer "
                "state, %.1f MB of activation arena (batch %d)",
                t->emu ? "device-path (emulated: host)" : "GPU", (double)t->dev_bytes * 1e-6,
                (double)sd_arena_capacity(&t->arena) * 1e-6, t->bs);
    free(ids);
}

/* ---- checkpoints: thin glue to src/io/checkpoint.c ------------------------------------------ */

/* sd_ckpt_tensors.copy of the device path: floats from device memory into a host buffer. */
static void dev_copy(void *ctx, float *dst, const float *src, size_t count)
{
    const trainer *t = ctx;
    sd_download(t->be, dst, src, count * sizeof(float));
}

/* sd_ckpt_tensors.upload of the device path (the resume): floats from a host buffer into device
 * memory. */
static void dev_upload(void *ctx, float *dst, const float *src, size_t count)
{
    const trainer *t = ctx;
    sd_upload(t->be, dst, src, count * sizeof(float));
}

/* sd_ckpt_tensors.host_alloc / host_free of the device path: the backend's page-locked memory. */
static void *dev_host_alloc(void *ctx, size_t bytes)
{
    const trainer *t = ctx;
    return sd_host_alloc(t->be, bytes);
}

static void dev_host_free(void *ctx, void *p)
{
    const trainer *t = ctx;
    sd_host_free(t->be, p);
}

/* Device path: the checkpoint writers' host memory is the backend's page-locked memory. */
static void dev_host_hooks(trainer *t, sd_ckpt_tensors *ts)
{
    ts->host_alloc = dev_host_alloc;
    ts->host_free = dev_host_free;
    ts->copy_ctx = t;
}

/* The state as the checkpoint code sees it. Device path: the moments and the EMA are the
 * device's buffers, which the load fills through its upload hook (a page-locked block at a
 * time: no host copy of them); the parameters are read into t->w.data (dev_resume_in uploads
 * them), and the writers take the device's master (dev_ckpt_tensors). */
static void ckpt_tensors(trainer *t, sd_ckpt_tensors *ts)
{
    memset(ts, 0, sizeof *ts);
    ts->table = &t->w.table;
    ts->n = t->n;
    ts->params = t->w.data;
    ts->begin = t->begin;
    ts->end = t->end;
    ts->m = t->m;
    ts->v = t->v;
    ts->ema = t->ema;
    if (t->dev_opt) {
        /* the GPU's equal NCCL shards run past n: the padding is not stored */
        ts->begin = t->begin < t->n ? t->begin : t->n;
        ts->end = t->end < t->n ? t->end : t->n;
        ts->m = t->d_m;
        ts->v = t->d_v;
        ts->ema = t->d_ema;
        ts->upload = dev_upload;
        dev_host_hooks(t, ts);
    }
}

/* After a resume (the moments and the EMA uploaded by the load): the parameters and the master
 * from t->w.data; without an EMA in the checkpoint, the EMA starts from the parameters. */
static void dev_resume_in(trainer *t, int has_ema)
{
    sd_upload_f32(t->be, t->d_params, t->w.data, (int64_t)t->n);
    upload_master(t);
    if (t->d_ema && !has_ema)
        sd_copy(t->be, t->d_ema, master_at(t, t->begin), (t->end - t->begin) * sizeof(float));
    sd_synchronize(t->be);
}

static void ckpt_scalars(const trainer *t, int64_t done, int64_t k, int64_t skipped,
                         sd_ckpt_scalars *s)
{
    /* the loader's own: in follow mode t->info is what was known at the start (the shards
     * committed then), and the first shards may hold less than one global batch: 0 steps an
     * epoch, whose division ended a pipeline job with SIGFPE at a checkpoint until 2026-11-28 */
    const sd_loader_info *li = sd_loader_get_info(t->loader);
    memset(s, 0, sizeof *s);
    s->step = done;
    s->opt_step = k;
    s->skipped = skipped;
    s->steps_per_epoch = li->steps_per_epoch;
    s->epoch = li->steps_per_epoch > 0 ? done / li->steps_per_epoch : 0;
    s->global_batch = t->info.global_batch;
    s->batch_per_rank = t->bs;
    s->seed = t->cfg->run.seed;
    s->n_ranks = t->size;
    s->has_ema = t->ema != NULL || t->d_ema != NULL;
    snprintf(s->sharding, sizeof s->sharding, "%s", t->cfg->train.sharding);
}

/* Device path (collective: ZeRO-2 gathers the master on the device): the writers' tensors are
 * the device's buffers, each rank's parts downloaded by the writer itself (the copy hook) into
 * its page-locked memory: no host copy of the whole state. */
static void dev_ckpt_tensors(trainer *t, sd_ckpt_tensors *ts)
{
    ts->params = (float *)dp_master_full(t);
    ts->m = t->d_m;
    ts->v = t->d_v;
    ts->ema = t->d_ema;
    ts->copy = dev_copy;
}

/* metrics.jsonl (rank 0): the checkpoint of step `of` committed (ok) or failed at the boundary
 * after `done` steps: how long its write took, how long training waited for it, the state
 * file's bytes. */
static void metrics_checkpoint(trainer *t, int64_t done, int64_t of, int ok, double write_s,
                               double held_s, const char *committed)
{
    char path[4300];
    struct stat st;
    long long bytes = -1;
    if (!t->metrics)
        return;
    if (ok && snprintf(path, sizeof path, "%s/%s", committed, SD_CKPT_STATE_FILE) <
                  (int)sizeof path && stat(path, &st) == 0)
        bytes = (long long)st.st_size;
    fprintf(t->metrics, "{\"step\": %lld, \"checkpoint_step\": %lld", (long long)done,
            (long long)of);
    if (ok)
        fprintf(t->metrics, ", \"checkpoint_s\": %.4f, \"checkpoint_held_s\": %.4f, "
                "\"checkpoint_bytes\": %lld}\n", write_s, held_s, bytes);
    else
        fprintf(t->metrics, ", \"checkpoint_failed\": 1}\n");
    metrics_flush(t, done);
}

/* &checkpoint async, collective at a step boundary (`done` steps): the checkpoint in flight, if
 * any, is committed once every rank's writer is done, or at once after waiting for them
 * (wait != 0: the next checkpoint is due, a signal, the end). A failure is reported and training
 * goes on, as for a periodic checkpoint written at once. */
static void settle_checkpoint(trainer *t, int64_t done, int wait)
{
    const int64_t step = sd_ckpt_async_step(t->ack);
    char committed[4200];
    double secs = 0, t0;
    sd_err err;
    if (step < 0 || (!wait && !sd_ckpt_async_ready(t->ack, t->mpi_comm)))
        return;
    sd_err_clear(&err);
    t0 = sd_time_now();
    sd_loader_h5_lock();
    const int rc = sd_ckpt_async_finish(t->ack, committed, sizeof committed, &secs, &err);
    sd_loader_h5_unlock();
    if (rc == 0) {
        t->last_ckpt = step;
        snprintf(t->last_ckpt_path, sizeof t->last_ckpt_path, "%s", committed);
        sd_info("step %lld: checkpoint of step %lld written to %s in the background (%.2f s%s), "
                "committed in %.2f s", (long long)done, (long long)step, committed, secs,
                t->cfg->checkpoint.verify ? ", read back and verified" : "", sd_time_now() - t0);
        metrics_checkpoint(t, done, step, 1, secs, t->ack_held + (sd_time_now() - t0),
                           committed);
    } else {
        if (t->rank == 0)
            sd_error("%s; training goes on", err.msg);
        metrics_checkpoint(t, done, step, 0, 0, 0, NULL);
    }
}

/* &checkpoint keep_last and keep_every_n_steps */
static sd_ckpt_keep ckpt_keep(const sd_config *cfg)
{
    return (sd_ckpt_keep){cfg->checkpoint.keep_last, cfg->checkpoint.keep_every_n_steps};
}

/* &checkpoint async (collective): the checkpoint of step `done` started in the background
 * (sd_ckpt_async_start, into the copy setup reserved), after the one in flight is committed. */
static int start_checkpoint(trainer *t, int64_t done, int64_t k, int64_t skipped, sd_err *err)
{
    sd_progress_phase("starting the background checkpoint of step", done);
    const sd_config *cfg = t->cfg;
    sd_ckpt_scalars s;
    sd_ckpt_tensors ts;
    char *text;
    double t0 = sd_time_now();
    int rc;
    settle_checkpoint(t, done, 1);
    ckpt_scalars(t, done, k, skipped, &s);
    ckpt_tensors(t, &ts);
    if (t->dev_opt)
        dev_ckpt_tensors(t, &ts);
    text = sd_config_to_namelist(t->rc, false);
    sd_loader_h5_lock();
    rc = sd_ckpt_async_start(&t->ack, t->mpi_comm, t->ckpt_dir, &s, &ts, text, ckpt_keep(cfg),
                             cfg->checkpoint.verify, err);
    sd_loader_h5_unlock();
    free(text);
    t->ack_held = sd_time_now() - t0;
    if (rc == 0)
        sd_info("step %lld: checkpoint started in the background (training held %.2f s)",
                (long long)done, t->ack_held);
    else
        metrics_checkpoint(t, done, done, 0, 0, 0, NULL);
    return rc;
}

/* Collective: the state after `done` steps (k optimizer steps) into the checkpoint directory,
 * written at once (after the one in flight in the background, if any, is committed). */
static int save_checkpoint(trainer *t, int64_t done, int64_t k, int64_t skipped, sd_err *err)
{
    sd_progress_phase("writing the checkpoint of step", done);
    const sd_config *cfg = t->cfg;
    sd_ckpt_scalars s;
    sd_ckpt_tensors ts;
    char committed[4200], *text;
    double t0;
    int rc;
    settle_checkpoint(t, done, 1);
    t0 = sd_time_now();
    ckpt_scalars(t, done, k, skipped, &s);
    ckpt_tensors(t, &ts);
    if (t->dev_opt)
        dev_ckpt_tensors(t, &ts);
    text = sd_config_to_namelist(t->rc, false);
    sd_loader_h5_lock(); /* the prefetch thread reads shards meanwhile */
    rc = sd_ckpt_write(t->mpi_comm, t->ckpt_dir, &s, &ts, text, ckpt_keep(cfg),
                       cfg->checkpoint.verify, committed, sizeof committed, err);
    sd_loader_h5_unlock();
    free(text);
    const double secs = sd_time_now() - t0;
    if (rc == 0) {
        t->last_ckpt = done;
        snprintf(t->last_ckpt_path, sizeof t->last_ckpt_path, "%s", committed);
        sd_info("step %lld: checkpoint written to %s (%.2f s%s)", (long long)done, committed,
                secs, cfg->checkpoint.verify ? ", read back and verified" : "");
    }
    metrics_checkpoint(t, done, done, rc == 0, secs, secs, committed);
    return rc;
}

/* &sample every_n_steps (collective over the training ranks): the images of &sample prompts
 * from the checkpoint this run just wrote at step `done`, made as mode 'sample' makes them
 * (sd_sample_images with &sample checkpoint = that checkpoint), into
 * <output_dir>/samples/step-<done>/ (samples/<p>-<j>.png and samples.jsonl). The loader's prefetch
 * thread waits meanwhile (the checkpoint is read through HDF5). A failure is reported and the
 * training goes on. */
static void sample_checkpoint(trainer *t, int64_t done)
{
    const sd_config *cfg = t->cfg;
    /* the boundary's checkpoint (periodic: done < max_steps; or the last one) written by this
     * run, not one it resumed from; each step comes here once */
    if (cfg->sample.every_n_steps <= 0 || t->last_ckpt != done || !t->last_ckpt_path[0])
        return;
    sd_run_config *rc = sd_xmalloc(sizeof *rc);
    memcpy(rc, t->rc, sizeof *rc); /* a shallow copy: only these fixed-size fields change */
    const int long_path =
        snprintf(rc->cfg.run.output_dir, sizeof rc->cfg.run.output_dir, "%s/samples/step-%08lld",
                 cfg->run.output_dir, (long long)done) >= (int)sizeof rc->cfg.run.output_dir ||
        snprintf(rc->cfg.sample.checkpoint, sizeof rc->cfg.sample.checkpoint, "%s",
                 t->last_ckpt_path) >= (int)sizeof rc->cfg.sample.checkpoint;
    snprintf(rc->cfg.run.mode, sizeof rc->cfg.run.mode, "sample");
    if (long_path) {
        if (t->rank == 0)
            sd_error("step %lld: no images: %s/samples/step-%08lld is too long a path; training "
                     "goes on", (long long)done, cfg->run.output_dir, (long long)done);
        free(rc);
        return;
    }
    const double t0 = sd_time_now();
    sd_loader_h5_lock();
    sd_progress_phase("images of the checkpoint of step", done);
    const int code = sd_sample_images(rc, t->mpi_comm, t->rank, t->size, t->dev_info, 0);
    sd_loader_h5_unlock();
    if (t->rank == 0) {
        if (code == SD_EXIT_OK)
            sd_info("step %lld: images of &sample prompts in %s/samples (%.1f s)",
                    (long long)done, rc->cfg.run.output_dir, sd_time_now() - t0);
        else
            sd_error("step %lld: the images of &sample prompts failed (above); training goes on",
                     (long long)done);
    }
    free(rc);
}

/* Set-up (collective): finds the checkpoint to resume from (&checkpoint resume) and loads the
 * parameters, moments, EMA and counters from it; nothing to do on a fresh start. */
static int resume_from_checkpoint(trainer *t, sd_err *err)
{
    const sd_config *cfg = t->cfg;
    sd_ckpt_info info;
    sd_ckpt_tensors ts;
    char path[4200];
    int found = 0, failed = 0, rc;
    t->last_ckpt = -1;
    sd_config_checkpoint_dir(cfg, t->ckpt_dir, sizeof t->ckpt_dir);
    /* every run writes checkpoints (a final one at least): a folder that cannot take them is an
     * error now, not after hours of training whose periodic checkpoints all fail */
    if (t->rank == 0)
        failed = sd_mkdir_writable(t->ckpt_dir, "checkpoint directory", err) != 0;
    if (sd_agree(t->mpi_comm, failed, err))
        return -1;
    if (sd_ckpt_resolve(t->mpi_comm, t->ckpt_dir, cfg->checkpoint.resume, path, sizeof path,
                        &found, err))
        return -1;
    if (!found)
        return 0;
    const double t0 = sd_time_now();
    ckpt_tensors(t, &ts);
    sd_loader_h5_lock();
    rc = sd_ckpt_load(t->mpi_comm, path, &ts, &info, err);
    /* resume = 'auto' (a requeued job): a damaged newest checkpoint is moved aside and the one
     * before it loaded, rather than ending a run that can go on (a load overwrites all the state
     * a failed one may have touched); a checkpoint named explicitly stays an error */
    while (rc == SD_CKPT_DAMAGED && !strcmp(cfg->checkpoint.resume, "auto")) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        sd_err_clear(err);
        if (sd_ckpt_set_aside(t->mpi_comm, t->ckpt_dir, path, why, path, sizeof path, err)) {
            rc = -1;
            break;
        }
        rc = sd_ckpt_load(t->mpi_comm, path, &ts, &info, err);
    }
    sd_loader_h5_unlock();
    if (rc == SD_CKPT_DAMAGED) {
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; resume from an older checkpoint with "
                 "&checkpoint resume = '<its directory>'");
    }
    if (rc == SD_CKPT_IO_ERROR) { /* not the input's fault: a retry (requeue) may read it */
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, "; the checkpoint is left as it is, and "
                 "the run ends with status 1 so that a retry reads it again");
        t->setup_exit = SD_EXIT_FAILURE;
    }
    if (rc)
        return -1;
    if (t->rank == 0) {
        char *text = sd_config_to_namelist(t->rc, false);
        failed = sd_ckpt_check_config(info.config_text, text, err) != 0;
        free(text);
        if (!failed && info.s.seed != cfg->run.seed)
            failed = sd_err_set(err, "checkpoint %s was written with seed %lld, this run has %lld",
                                path, (long long)info.s.seed, (long long)cfg->run.seed) != 0;
        if (!failed && info.s.global_batch != t->info.global_batch)
            sd_warn("resume: the checkpoint's global batch is %lld, this run's %lld: the data "
                    "order from here on differs from an uninterrupted run (keep ranks x "
                    "batch_size_per_rank to reproduce it)", (long long)info.s.global_batch,
                    (long long)t->info.global_batch);
        /* mode 'train' knows its whole dataset now (mode 'pipeline' counts the shards seen so
         * far); with the same global batch, other steps per epoch mean other training samples */
        if (!failed && info.s.global_batch == t->info.global_batch &&
            !strcmp(cfg->run.mode, "train") && info.s.steps_per_epoch > 0 &&
            info.s.steps_per_epoch != t->info.steps_per_epoch)
            sd_warn("resume: the shards in %s give %lld steps per epoch, %lld when the checkpoint "
                    "was written: the training samples changed, so the data order from here on "
                    "differs from an uninterrupted run, and epochs are counted with this run's "
                    "samples", cfg->data.shard_dir, (long long)t->info.steps_per_epoch,
                    (long long)info.s.steps_per_epoch);
        if (!failed && info.s.step > cfg->train.max_steps)
            sd_warn("resume: the checkpoint is at step %lld, beyond max_steps = %lld",
                    (long long)info.s.step, (long long)cfg->train.max_steps);
    }
    if (sd_agree(t->mpi_comm, failed, err)) {
        sd_ckpt_info_free(&info);
        return -1;
    }
    if (t->dev_opt) {
        dev_resume_in(t, info.s.has_ema);
    } else if (t->gpu) {
        /* host path: the parameters live on the host; the device copy follows them */
        sd_upload_f32(t->be, t->d_params, t->w.data, (int64_t)t->n);
        sd_synchronize(t->be);
    }
    if ((t->ema || t->d_ema) && !info.s.has_ema && t->rank == 0)
        sd_warn("resume: the checkpoint has no EMA; the EMA starts from its parameters");
    if (t->ema && !info.s.has_ema) {
        memcpy(t->ema, t->w.data + t->begin, (t->end - t->begin) * sizeof(float));
    }
    t->start_step = info.s.step;
    t->start_opt_step = info.s.opt_step;
    t->start_skipped = info.s.skipped;
    t->last_ckpt = info.s.step;
    t->resumed = 1;
    /* &sample every_n_steps: a job that ended during the images of the checkpoint it resumes
     * from (no samples.jsonl beside them) makes them again, keeping those already written
     * (&sample resume), before its first step (or at the end, for the last checkpoint) */
    if (cfg->sample.every_n_steps > 0 && info.s.step > 0 &&
        (info.s.step % cfg->sample.every_n_steps == 0 || info.s.step == cfg->train.max_steps)) {
        int missing = 0;
        if (t->rank == 0) {
            char index[4300];
            struct stat st;
            snprintf(index, sizeof index, "%s/samples/step-%08lld/samples.jsonl",
                     cfg->run.output_dir, (long long)info.s.step);
            missing = stat(index, &st) != 0;
        }
        SD_MPI_CHECK(MPI_Bcast(&missing, 1, MPI_INT, 0, t->mpi_comm));
        if (missing)
            snprintf(t->last_ckpt_path, sizeof t->last_ckpt_path, "%s", path);
    }
    sd_info("resuming from %s: step %lld (%lld optimizer steps, %lld skipped), written by %lld "
            "rank(s) with sharding '%s' (loaded in %.2f s)", path, (long long)info.s.step,
            (long long)info.s.opt_step, (long long)info.s.skipped, (long long)info.s.n_ranks,
            info.s.sharding, sd_time_now() - t0);
    sd_ckpt_info_free(&info);
    return 0;
}

/* The stop for a signal after `done` steps (collective): `sig` caught by this half, else `peer`
 * by a pipeline's preprocessing half (their values on rank 0 are what counts). The other half is
 * told first (rank 0, sig only), then the checkpoint of step `done` is written unless it exists
 * (none before the first step: nothing is trained, and a rerun starts afresh). Returns 1. */
static int stop_for_signal(trainer *t, int64_t done, int64_t k, int64_t skipped, int sig, int peer,
                           int *code)
{
    sd_err err;
    sd_err_clear(&err);
    if (sig)
        sd_pipeline_stop_tell(t->rt, sig);
    t->stopped = 1;
    if (done == 0) {
        if (t->rank == 0) {
            printf("stopped for %s%s before the first step: nothing to checkpoint; resubmit to "
                   "continue\n", sd_ckpt_signal_name(sig ? sig : peer),
                   sig ? "" : " (caught by the preprocessing half)");
            fflush(stdout);
        }
        return 1;
    }
    if (t->last_ckpt != done && save_checkpoint(t, done, k, skipped, &err)) {
        if (t->rank == 0)
            sd_error("%s", err.msg);
        *code = SD_EXIT_FAILURE;
        return 1;
    }
    if (t->rank == 0) {
        printf("checkpointed at step %lld after %s%s; resubmit to continue\n", (long long)done,
               sd_ckpt_signal_name(sig ? sig : peer),
               sig ? "" : " (caught by the preprocessing half)");
        fflush(stdout);
    }
    return 1;
}

/* The loader's question while training rank 0 waits for a shard (follow mode): stop? For a
 * signal caught on this rank or the preprocessing half's stop word, noted for stop_for_signal.
 * SDTRAIN_FAULT usr1:rank=R:phase=shard-wait[:step=S] signals world rank R here. */
static int wait_stop(void *ctx)
{
    trainer *t = ctx;
    if (sd_fault_armed(SD_FAULT_USR1, t->world_rank, t->wait_step, "shard-wait"))
        raise(SIGUSR1);
    t->stop_own = sd_ckpt_signal_pending();
    t->stop_peer = sd_pipeline_stop_heard(t->rt);
    return t->stop_own || t->stop_peer;
}

/* The boundary after `done` steps: a signal on any rank (SIGUSR1/SIGTERM, agreed by a
 * reduction), or in a pipeline job the preprocessing half's stop word (rank 0), checkpoints and
 * stops; every_n_steps and keep_every_n_steps, or every_n_minutes of training by rank 0's
 * clock (in the same reduction, so every rank agrees), checkpoint and go on. Returns 1 to stop. */
static int checkpoint_boundary(trainer *t, int64_t done, int64_t k, int64_t skipped, int *code)
{
    const int64_t every = t->cfg->checkpoint.every_n_steps;
    const int64_t milestone = t->cfg->checkpoint.keep_every_n_steps;
    const double minutes = t->cfg->checkpoint.every_n_minutes;
    int64_t why[3];
    sd_err err;
    sd_err_clear(&err);
    if (sd_fault_armed(SD_FAULT_USR1, t->world_rank, done - 1, NULL))
        raise(SIGUSR1);
    settle_checkpoint(t, done, 0); /* a background checkpoint whose writers are all done */
    why[0] = sd_ckpt_signal_pending();
    why[1] = sd_pipeline_stop_heard(t->rt);
    why[2] = t->rank == 0 && minutes > 0 && sd_time_now() - t->ckpt_clock >= minutes * 60.0;
    sd_allreduce_i64(t->comm, why, 3, SD_RED_MAX);
    /* after the last step the run ends normally anyway: final checkpoint and weights (a
     * pipeline's preprocessing half learns of a signal while the trainers wait for it) */
    if ((why[0] || why[1]) && done < t->cfg->train.max_steps)
        return stop_for_signal(t, done, k, skipped, (int)why[0], (int)why[1], code);
    /* the steps whose checkpoint &sample every_n_steps turns into images write it at once */
    const int sampled = t->cfg->sample.every_n_steps > 0 &&
                        done % t->cfg->sample.every_n_steps == 0 && done < t->cfg->train.max_steps;
    const int by_step = (every > 0 && done % every == 0) ||
                        (milestone > 0 && done % milestone == 0);
    const int attempted = (by_step || why[2]) && done < t->cfg->train.max_steps &&
                          t->last_ckpt != done;
    if (attempted) {
        if (!by_step)
            sd_info("step %lld: %.1f min of training since the last checkpoint "
                    "(&checkpoint every_n_minutes = %g)", (long long)done,
                    (sd_time_now() - t->ckpt_clock) / 60.0, minutes);
        if ((t->cfg->checkpoint.async && !t->async_off && !sampled
                 ? start_checkpoint(t, done, k, skipped, &err)
                 : save_checkpoint(t, done, k, skipped, &err)) &&
            t->rank == 0)
            sd_error("%s; training goes on", err.msg);
    }
    if (sampled)
        sample_checkpoint(t, done);
    /* the clock counts training only: it restarts after the write (and the images), also
     * after a failed write, whose next try then comes an interval later, not at once */
    if (attempted)
        t->ckpt_clock = sd_time_now();
    return 0;
}

static void free_trainer(trainer *t)
{
    if (t->gpu && t->be) {
        /* nothing may still run on the GPU when its buffers go: after an early exit the NCCL
         * stream may still hold broadcasts into d_params (pg_launch), the copy stream a copy */
#if defined(SD_HAVE_CUDA)
        sd_nccl_destroy(t->nccl); /* waits for its streams first */
        t->nccl = NULL;
#endif
        sd_synchronize(t->be);
        sd_download_wait(t->be);
    }
    sd_ckpt_async_free(t->ack); /* after a failure: waits for its thread, commits nothing */
    t->ack = NULL;
    sd_loader_close(t->loader);
    sd_grad_buckets_free(&t->gb);
    /* the backend's buffers of the inputs and of one micro-batch (CPU: host memory) */
    inputs_free(t, &t->in[0]);
    inputs_free(t, &t->in[1]);
    inputs_free(t, &t->val_in);
    dev_free(t, t->d_xh);
    dev_free(t, t->d_ctx);
    dev_free(t, t->d_yh);
    dev_free(t, t->d_dy);
    dev_free(t, t->d_mse);
    sd_unet_trainer_free(t->tr);
    sd_unet_free(t->unet);
    sd_weights_free(&t->w);
    if (t->gpu) {
        if (t->arena.base)
            sd_cmd_arena_free(&t->cb, &t->arena);
        if ((void *)t->d_master != t->d_params)
            dev_free(t, t->d_master);
        dev_free(t, t->d_params);
        dev_free(t, t->d_grads);
        dev_free(t, t->d_m);
        dev_free(t, t->d_v);
        dev_free(t, t->d_ema);
        dev_free(t, t->d_scratch);
        sd_comm_destroy(t->ecomm);
        sd_cmd_backend_close(&t->cb);
    } else if (sd_arena_capacity(&t->arena)) {
        sd_arena_free(&t->arena);
    }
    sd_diffusion_free(&t->diff);
    free(t->grads);
    free(t->m);
    free(t->v);
    free(t->ema);
    free(t->x0);
    free(t->noise);
    free(t->xt);
    free(t->target);
    free(t->mse);
    if (t->metrics)
        fclose(t->metrics);
    sd_comm_destroy(t->comm);
}

/* Set-up that may fail on bad input: every rank agrees on the verdict (0, -1 with err). 1 in a
 * pipeline job stopped for a signal while the loader waited for the first shard. */
static int setup(trainer *t, const sd_runtime *rt, const sd_device_info *dev, sd_err *err)
{
    const sd_config *cfg = t->cfg;
    MPI_Comm comm = rt->role_comm;
    sd_loader_options lo;
    int failed;

    t->zero2 = strcmp(cfg->train.sharding, "shard_grad_op") == 0;
    /* every training rank on the same kind of device: a rank that device = 'auto' left on the
     * CPU (no usable GPU there) would skip the GPU path's collectives and hang the others */
    {
        char why[sizeof dev->notice];
        const int first = sd_device_mix(comm, t->gpu, dev->notice, why, sizeof why);
        if (first >= 0)
            return sd_err_set(err, "training rank %d computes on the CPU (%s) while other "
                                   "training ranks use GPUs: give every training rank a GPU, "
                                   "or set &run device = 'cpu'", first,
                              why[0] ? why : "its device resolved to the CPU");
    }
    failed = sd_diffusion_init_config(&t->diff, cfg, err) != 0;
    if (!failed)
        failed = sd_lr_schedule_from_name(cfg->train.lr_schedule, &t->sched, err) != 0;
    if (!failed && (!t->gpu || t->emu) && cfg->train.precision[0] &&
        strcmp(cfg->train.precision, "fp32") != 0 && t->rank == 0)
        sd_warn("&train precision = '%s' applies to the CUDA backend; the CPU backend trains "
                "in fp32", cfg->train.precision);
    /* each rank its own CUDA backend (its stream, handles) on the GPU sd_device_resolve chose */
    if (!failed && t->gpu) {
        failed = sd_cmd_backend_open(t->emu ? "cpu" : "cuda", dev->device_id,
                                     t->emu || !cfg->train.precision[0] ? "fp32"
                                                                        : cfg->train.precision,
                                     &t->cb, err) != 0;
        if (!failed)
            t->be = t->cb.be;
    }
    if (sd_agree(comm, failed, err))
        return -1;
    if (t->gpu && choose_comm_path(t, rt, dev, err))
        return -1;

    sd_loader_options_defaults(&lo);
    lo.shard_dir = cfg->data.shard_dir;
    lo.val_fraction = cfg->data.val_fraction;
    /* a step's samples of this rank: its grad_accum_steps micro-batches, read together */
    /* sd_config_validate keeps it in range */
    SD_CHECK(cfg->train.batch_size_per_rank * cfg->train.grad_accum_steps <= INT32_MAX,
             "batch_size_per_rank x grad_accum_steps out of range");
    lo.batch_per_rank = (int)(cfg->train.batch_size_per_rank * cfg->train.grad_accum_steps);
    lo.seed = cfg->run.seed;
    lo.max_open_shards = (int)cfg->data.open_shards; /* schema: 1 .. 65536 */
    lo.shuffle_window = cfg->data.shuffle_window;    /* schema: 0 .. 65536 */
    if (strcmp(cfg->run.mode, "pipeline") == 0) {
        /* online preprocessing: the shards as they are committed (doc/loader.md "Follow mode") */
        lo.follow = 1;
        t->follow = 1;
        lo.plan_comm = MPI_COMM_WORLD;
        lo.plan_source = 0; /* preprocessing rank 0 */
        lo.wait_timeout_s = cfg->data.shard_wait_timeout;
        lo.stop_poll = wait_stop; /* a signal stop ends a wait for a shard */
        lo.stop_ctx = t;
    }
    t->wait_step = -1;
    failed = sd_loader_open(comm, &lo, &t->loader, err);
    if (failed == SD_LOADER_STOPPED)
        return 1; /* before any step: the caller ends cleanly */
    if (failed)
        return -1; /* collective: every rank has the same message */
    t->info = *sd_loader_get_info(t->loader);
    if (t->rank == 0 && cfg->data.shuffle_window > 0) {
        sd_info("data order: windows of %lld shard(s) (&data shuffle_window), the shards and "
                "each window's samples shuffled every epoch", (long long)cfg->data.shuffle_window);
        if (cfg->data.shuffle_window > cfg->data.open_shards)
            sd_warn("&data shuffle_window = %lld is more than open_shards = %lld: a window's "
                    "shards do not all stay open, so a rank opens some of them more than once an "
                    "epoch (doc/loader.md)", (long long)cfg->data.shuffle_window,
                    (long long)cfg->data.open_shards);
    }
    t->bs = (int)cfg->train.batch_size_per_rank;
    t->acc = (int)cfg->train.grad_accum_steps;
    t->C = t->info.latent_channels;
    t->H = t->W = t->info.latent_size;
    t->L = t->info.text_len;
    t->D = t->info.embed_dim;

    failed = build_model(t, err) != 0;
    if (sd_agree(comm, failed, err))
        return -1;
    /* The replicas must start from the same weights. Each rank read the snapshot itself, and a
     * file that changed between the reads (a job beside this one writing it), or a node's
     * storage returning other bytes, would leave them apart for good without a word: the
     * weights' checksum is compared (a fraction of a second for SD2). */
    if (cfg->model.pretrained[0] && !strcmp(cfg->model.unet_init, "pretrained") && t->size > 1) {
        if (sd_fault_armed(SD_FAULT_FLIP, t->world_rank, -1, "unet-load") &&
            t->w.table.total_floats)
            t->w.data[0] = nextafterf(t->w.data[0], INFINITY);
        const uint64_t sum = sd_ckpt_checksum(t->w.data, 0, t->w.table.total_floats);
        uint64_t sum0 = sum;
        SD_MPI_CHECK(MPI_Bcast(&sum0, 1, MPI_UINT64_T, 0, comm));
        int mine = sum != sum0 ? t->rank : INT_MAX, first;
        SD_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
        if (first != INT_MAX) {
            sd_err_set(err, "the training ranks read different U-Net weights from %s (rank %d's "
                       "differ from rank 0's): the files changed while the ranks read them, or "
                       "the storage returned other bytes to some node; the replicas would start "
                       "apart. Run again once the snapshot is stable",
                       cfg->model.pretrained, first);
            err->storage = 1; /* status 1: a retry reads the files again */
            t->setup_exit = SD_EXIT_FAILURE;
            return -1;
        }
    }
    if (!failed && t->rank == 0 && cfg->model.pretrained[0])
        snapshot_training_notes(cfg);
    if (!failed)
        failed = check_shapes(t, err) != 0;
    if (!failed)
        failed = place_model(t, dev, err) != 0;
    if (sd_agree(comm, failed, err))
        return -1;

    /* the host gradient buffer: the CPU's, and the GPU host path's copy of the device one */
    if (!t->dev_opt)
        t->grads = sd_xcalloc(t->n ? t->n : 1, sizeof *t->grads);
    failed = sd_unet_trainer_create(&t->tr, t->unet, &t->w.table,
                                    t->gpu ? t->d_grads : t->grads, t->bs, t->H, t->W, t->L,
                                    cfg->train.recompute_activations, err) != 0;
    if (!failed) {
        size_t need = sd_unet_trainer_arena_bytes(t->tr);
        size_t val = sd_unet_scratch_bytes(&t->uc, t->be, t->bs, t->H, t->W, t->L);
        need = need > val ? need : val;
        if (t->gpu ? sd_cmd_arena(&t->cb, need, &t->arena) != 0
                   : sd_arena_init(&t->arena, need, SD_ARENA_DEFAULT_ALIGNMENT) != 0) {
            sd_err_set(err, "cannot allocate %zu bytes of activation memory for batch %d%s",
                       need, t->bs, t->gpu ? " on the GPU (out of GPU memory: use a smaller "
                       "batch_size_per_rank or recompute_activations = .true.)" : "");
            failed = 1;
        }
    }
    if (!failed && t->gpu)
        failed = alloc_device_state(t, dev, err) != 0;
    if (sd_agree(comm, failed, err))
        return -1;
    plan_grad_reduce(t);
    if (t->pgather)
        sd_unet_trainer_set_need_hook(t->tr, param_need, t);

    /* ZeRO-2 keeps optimizer state for this rank's shard only; DDP for everything (the GPU's
     * device path keeps it on the GPU, over the ranges place_model set) */
    if (!t->dev_opt) {
        if (t->zero2) {
            sd_comm_shard(t->comm, t->n, &t->begin, &t->end);
        } else {
            t->begin = 0;
            t->end = t->n;
        }
        t->m = sd_xcalloc(t->end - t->begin + 1, sizeof(float));
        t->v = sd_xcalloc(t->end - t->begin + 1, sizeof(float));
        if (cfg->train.ema_decay > 0) {
            t->ema = sd_xmalloc((t->end - t->begin + 1) * sizeof(float));
            memcpy(t->ema, t->w.data + t->begin, (t->end - t->begin) * sizeof(float));
        }
    }
    t->adam.beta1 = cfg->train.adam_beta1;
    t->adam.beta2 = cfg->train.adam_beta2;
    t->adam.eps = cfg->train.adam_eps;
    t->adam.weight_decay = cfg->train.weight_decay;
    if (sd_agree(comm, alloc_buffers(t, err) != 0, err))
        return -1;
    if (resume_from_checkpoint(t, err))
        return -1; /* collective: every rank has the same message */
    if (cfg->checkpoint.async &&
        (cfg->checkpoint.every_n_steps > 0 || cfg->checkpoint.every_n_minutes > 0 ||
         cfg->checkpoint.keep_every_n_steps > 0)) {
        /* the background checkpoints' copy, had now (or found missing) rather than at the
         * first checkpoint */
        sd_ckpt_tensors ts;
        size_t bytes = 0;
        const double t0 = sd_time_now();
        ckpt_tensors(t, &ts); /* the copy only: its ranges are the run's, nothing is read now */
        const int rc = sd_ckpt_async_reserve(&t->ack, t->mpi_comm, &ts,
                                             t->ema != NULL || t->d_ema != NULL, &bytes, err);
        if (rc == SD_CKPT_NO_MEMORY) {
            if (t->rank == 0)
                sd_warn("%s: &checkpoint async is off for this run; checkpoints are written at "
                        "once", err->msg);
            t->async_off = 1;
            sd_err_clear(err);
        } else if (rc) {
            return -1;
        } else {
            sd_info("&checkpoint async: the copy of the state that background checkpoints "
                    "write takes %.1f MiB of %shost memory on rank 0 (allocated in %.2f s)",
                    (double)bytes / 1048576.0,
                    t->gpu && !t->emu && sd_ckpt_async_pinned(t->ack) ? "page-locked " : "",
                    sd_time_now() - t0);
        }
    }

    if (t->rank == 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.jsonl", cfg->run.output_dir);
        /* resumed: the lines up to the checkpoint stay, the ones after it are recomputed */
        failed = t->resumed && sd_ckpt_metrics_rollback(path, t->start_step, err) != 0;
        if (!failed) {
            t->metrics = fopen(path, t->resumed ? "a" : "w");
            failed = !t->metrics;
            if (failed)
                sd_err_set(err, "cannot write %s: %s", path, strerror(errno));
        }
    }
    return sd_agree(comm, failed, err);
}

/* Every shard known (mode 'pipeline': the last planned one committed) and fewer training
 * samples than one global batch: the same on every rank. */
static int too_few_samples(const trainer *t)
{
    const sd_loader_info *li = sd_loader_get_info(t->loader);
    return li->complete && li->steps_per_epoch < 1;
}

/* Every training rank at a progress line (collective): which rank waited longest for its
 * inputs over the interval, and which computed longest (the forwards and backwards by the
 * backend's stream clock: on a GPU the GPU's time, without the host's waits for the other ranks'
 * collectives), against the ranks' mean. Every rank waits for the slowest at each step, so one
 * slow node, GPU or file system costs all of them. Rank 0 writes a metrics line and names a rank
 * that is a straggler over the interval's wall time (sd_progress_is_straggler). iv: this rank's
 * data wait and compute (s). */
static void report_stragglers(trainer *t, int64_t first, int64_t last, const double iv[2],
                              double wall)
{
    struct {
        double v;
        int rank;
    } mx[2] = {{iv[0], t->world_rank}, {iv[1], t->world_rank}};
    double sum[2] = {iv[0], iv[1]};
    static const char *const what[2] = {"waited %.2f s for its inputs", "computed %.2f s"};
    static const char *const why[2] = {"a slow file system or node?",
                                       "a slow or busy node, or a throttled GPU?"};
    if (t->size < 2)
        return;
    SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mx, 2, MPI_DOUBLE_INT, MPI_MAXLOC, t->mpi_comm));
    SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sum, 2, MPI_DOUBLE, MPI_SUM, t->mpi_comm));
    if (t->rank != 0)
        return;
    if (t->metrics) {
        fprintf(t->metrics, "{\"step\": %lld, \"data_wait_max_s\": %.6f, \"data_wait_max_rank\": %d, "
                "\"data_wait_mean_s\": %.6f, \"compute_max_s\": %.6f, \"compute_max_rank\": %d, "
                "\"compute_mean_s\": %.6f}\n", (long long)last, mx[0].v, mx[0].rank,
                sum[0] / t->size, mx[1].v, mx[1].rank, sum[1] / t->size);
        metrics_flush(t, last);
    }
    for (int i = 0; i < 2; i++) {
        const double mean = sum[i] / t->size;
        char text[64];
        if (!sd_progress_is_straggler(mx[i].v, mean, wall))
            continue;
        snprintf(text, sizeof text, what[i], mx[i].v);
        sd_warn("steps %lld-%lld: rank %d %s, the training ranks' mean %.2f s (the interval took "
                "%.1f s): the others wait for it at every step (%s)", (long long)first,
                (long long)last, mx[i].rank, text, mean, wall, why[i]);
    }
}

int sd_mode_train(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev)
{
    const sd_config *cfg = &rc->cfg;
    trainer t;
    sd_err err = {.storage = 0};
    sd_loader_batch vb;
    const int64_t max_steps = cfg->train.max_steps;
    const int64_t log_every = cfg->train.log_every > 0 ? cfg->train.log_every : 1;
    int64_t k = 0, skipped = 0, step;
    double t_start, t_acc[T_N] = {0}, interval_loss = 0, last_loss = NAN, last_val = NAN;
    double t_loop = 0, flops_sample = 0, c_acc = 0; /* c_acc: rank 0's compute_s, summed */
    double iv[2] = {0, 0}, iv_wall = 0; /* this rank's data wait and compute since the last line */
    int64_t iv_first = 0;
    int interval_n = 0, code = SD_EXIT_OK, set_up;
    size_t peak;

    sd_progress_phase("training set-up", -1);

    memset(&t, 0, sizeof t);
    memset(&vb, 0, sizeof vb);
    sd_err_clear(&err);
    t.cfg = cfg;
    t.metrics_lost = -1;
    t.rank = rt->role_rank;
    t.size = rt->role_size;
    t.world_rank = rt->world_rank;
    t.be = sd_backend_cpu();
    t.hb = sd_backend_cpu();
    t.gpu = dev->use_cuda;
    /* test hooks: world rank RANK's inputs, or its forward, MS late at every step */
    t.load_delay_ms = sd_progress_test_delay_ms("SDTRAIN_TEST_LOAD_DELAY", t.world_rank,
                                                t.rank == 0);
    t.compute_delay_ms = sd_progress_test_delay_ms("SDTRAIN_TEST_COMPUTE_DELAY", t.world_rank,
                                                   t.rank == 0);
    if (!t.gpu && getenv("SDTRAIN_EMULATE_DEVICE_PATH") &&
        !strcmp(getenv("SDTRAIN_EMULATE_DEVICE_PATH"), "1"))
        t.gpu = t.emu = 1;
    t.comm = sd_comm_create_mpi(rt->role_comm);
    t.rc = rc;
    t.mpi_comm = rt->role_comm;
    t.dev_info = dev;
    t.rt = rt;
    sd_ckpt_signals_install();

    set_up = setup(&t, rt, dev, &err);
    if (set_up > 0) {
        /* mode 'pipeline': a signal stop while waiting for the first shard, before anything is
         * trained (no model yet): nothing to checkpoint; the other half stops as well */
        if (t.stop_own)
            sd_pipeline_stop_tell(rt, t.stop_own);
        if (t.rank == 0) {
            printf("stopped for %s%s while waiting for the first shard, before any step of this "
                   "run; resubmit to continue\n",
                   sd_ckpt_signal_name(t.stop_own ? t.stop_own : t.stop_peer),
                   t.stop_own ? "" : " (caught by the preprocessing half)");
            fflush(stdout);
        }
        free_trainer(&t);
        return SD_EXIT_OK;
    }
    if (set_up) {
        /* a failing storage (a shard the file system could not read) is not bad input: status
         * 1, so that a requeued job tries again */
        const int status = t.setup_exit ? t.setup_exit : err.storage ? SD_EXIT_FAILURE
                                                                     : SD_EXIT_USAGE;
        if (t.rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        free_trainer(&t);
        return status;
    }
    sd_loader_batch_alloc(t.loader, t.bs, &vb);
    char accum_text[64] = "";
    if (t.acc > 1)
        snprintf(accum_text, sizeof accum_text, " x %d accumulated micro-batches", t.acc);
    sd_info("training the U-Net (%zu parameters, %.1f MB) on %d rank(s), %s, batch %d per rank%s "
            "(global %lld), %lld training / %lld validation samples, %lld steps per epoch%s, "
            "%lld steps",
            t.w.table.total_numel, t.w.table.total_numel * 4e-6, t.size,
            t.zero2 ? "ZeRO-2 (shard_grad_op)" : "DDP (sharding 'none')", t.bs, accum_text,
            (long long)t.info.global_batch, (long long)t.info.n_train, (long long)t.info.n_val,
            (long long)t.info.steps_per_epoch,
            t.info.complete ? "" : " (in the shards committed so far)", (long long)max_steps);
    report_compute(&t, rt, dev);

    /* mode 'pipeline' learns only here (or at a later step) that all its shards together hold
     * fewer training samples than one global batch: the configuration error mode 'train' gives
     * at open, status 2 */
    if (sd_agree(t.mpi_comm, sd_loader_seek(t.loader, t.start_step, &err) != 0, &err) != 0) {
        const int status = too_few_samples(&t) ? SD_EXIT_USAGE : SD_EXIT_FAILURE;
        if (t.rank == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        sd_loader_batch_free(&vb);
        free_trainer(&t);
        return status;
    }
    k = t.start_opt_step;
    skipped = t.start_skipped;
    if (cfg->train.val_every > 0 && t.info.n_val == 0)
        sd_info("validation: no held-out samples (val_fraction %g); no validation loss",
                cfg->data.val_fraction);
    if (cfg->train.val_every > 0 && t.info.n_val > 0 && !t.resumed) {
        /* the untrained model's validation loss: the reference every later one is read against */
        int64_t nv;
        int vfailed;
        last_val = validate(&t, &vb, &nv, &vfailed);
        if (vfailed) {
            code = SD_EXIT_FAILURE; /* the loop below does not start */
        } else {
            if (t.metrics) {
                fprintf(t.metrics, "{\"step\": 0, \"val_loss\": %.9g, \"val_samples\": %lld}\n",
                        isfinite(last_val) ? last_val : -1.0, (long long)nv);
                metrics_flush(&t, 0);
            }
            sd_info("step 0: validation loss %.6f over %lld samples", last_val, (long long)nv);
        }
    }
    /* the model's FLOPs of one training sample (forward + backward as the dry run counts them,
     * recomputation not counted: the numerator of the model FLOPs utilization) */
    flops_sample = sd_unet_trainer_flops(t.tr) / (double)t.bs;
    if (code == SD_EXIT_OK && t.start_step < max_steps)
        sample_checkpoint(&t, t.start_step); /* the resumed checkpoint's images not all there */
    t_start = sd_time_now();
    t.ckpt_clock = t_start;
    for (step = t.start_step; step < max_steps && code == SD_EXIT_OK; step++) {
        step_inputs *in = &t.in[step & 1], *next = &t.in[(step + 1) & 1];
        double t0 = sd_time_now(), t1, loss_local, stats[2], sumsq, gnorm, lr, coef, compute_s;
        double tt[T_N] = {0};
        int64_t bad;

        sd_progress_phase("training step", step + 1);
        if (sd_fault_armed(SD_FAULT_KILL, t.world_rank, step, NULL)) {
            fprintf(stderr, "[rank %d] SDTRAIN_FAULT: killing this rank at step %lld\n",
                    t.world_rank, (long long)step);
            fflush(stderr);
            raise(SIGKILL);
        }
        if (sd_fault_armed(SD_FAULT_HANG, t.world_rank, step, "step"))
            sd_fault_hang(t.world_rank, "training, steps done:", step);
        /* this step's inputs: fetched during the previous step, or now (the first step; follow
         * mode, whose loader calls are collective and may wait for preprocessing) */
        if (!in->ready) {
            t1 = sd_time_now();
            fetch_inputs(&t, in, step);
            tt[T_DATA] += sd_time_now() - t1;
        }
        in->ready = 0;
        if (in->stopped) {
            /* follow mode: the wait for a shard ended for a signal stop, on every rank alike;
             * the boundary after the last step passed without one: its checkpoint now */
            if (t.rank == 0)
                sd_info("%s", in->err.msg);
            stop_for_signal(&t, step, k, skipped, t.stop_own, t.stop_peer, &code);
            break;
        }
        if (any_failed(t.comm, in->failed)) {
            if (in->failed)
                sd_error("%s", in->err.msg);
            code = too_few_samples(&t) ? SD_EXIT_USAGE : SD_EXIT_FAILURE;
            break;
        }

        /* forward, objective and backward of this rank's samples: grad_accum_steps
         * micro-batches of batch_size_per_rank, their parameter gradients adding up (the
         * backward accumulates; each micro-batch's loss is already divided by the global
         * batch). On a GPU all of it is queued at once and runs while the host goes on. */
        t1 = sd_time_now();
        sd_zero(t.be, t.gpu ? t.d_grads : t.grads, (t.gpu ? t.np : t.n) * sizeof(float));
        for (int m0 = 0; m0 < in->count; m0 += t.bs) {
            stage_micro_batch(&t, in, m0, t.bs);
            if (m0 == 0) {
                /* the compute's own time runs from here to the last backward (stream marks:
                 * a GPU's time, not the host's, which only queues the ops) */
                sd_stream_mark(t.be, 0);
                t.comm_in_compute_s = 0;
                sd_progress_sleep_ms(t.compute_delay_ms);
            }
            sd_unet_train_forward_sin(t.tr, t.d_xh, in->d + in_tsin(&t, in, m0), t.d_ctx,
                                      t.d_yh, &t.arena);
            sd_mse_loss(t.be, t.bs, (int64_t)t.H * t.W, t.C, t.d_yh,
                        in->d + in_target(&t, in, m0), in->d + in_coef(&t, in, m0),
                        t.d_mse + m0, t.d_dy);
            if (m0 == 0 && sd_fault_armed(SD_FAULT_NAN, t.world_rank, step, NULL)) {
                const float nan_value = NAN;
                sd_upload_f32(t.be, t.d_dy, &nan_value, 1);
            }
            tt[T_FWD] += sd_time_now() - t1;
            t1 = sd_time_now();
            if (t.overlap && m0 + t.bs >= in->count) {
                /* the last micro-batch: each bucket reduced as soon as the backward is done
                 * with it */
                sd_grad_buckets_begin(&t.gb);
                sd_unet_trainer_set_ready_hook(t.tr, sd_grad_buckets_ready, &t.gb);
                sd_unet_backward(t.tr, t.d_dy, &t.arena);
                sd_unet_trainer_set_ready_hook(t.tr, NULL, NULL);
                sd_grad_buckets_finish(&t.gb);
                /* before the stream waits for the reductions (dp_join) */
                sd_stream_mark(t.be, 1);
                if (t.dev_opt)
                    dp_join(&t);
            } else {
                sd_unet_backward(t.tr, t.d_dy, &t.arena);
                if (m0 + t.bs >= in->count)
                    sd_stream_mark(t.be, 1);
            }
            tt[T_BWD] += sd_time_now() - t1;
            t1 = sd_time_now();
        }
        /* the next step's inputs while the GPU computes (the loader's own thread has read its
         * samples meanwhile); follow mode fetches at the top of the step instead */
        if (!t.follow && step + 1 < max_steps) {
            t1 = sd_time_now();
            fetch_inputs(&t, next, step + 1);
            tt[T_DATA] += sd_time_now() - t1;
        }
        t1 = sd_time_now();
        sd_synchronize(t.be);
        compute_s = sd_stream_elapsed(t.be, 0, 1);
        if (t.be->device == SD_DEV_CPU) /* the host's clock: its blocking collectives out */
            compute_s -= t.comm_in_compute_s;
        sd_download(t.be, t.mse, t.d_mse, (size_t)in->count * sizeof(float));
        loss_local = 0;
        for (int m0 = 0; m0 < in->count; m0 += t.bs)
            loss_local += sd_diffusion_loss_from_mse(&t.diff, in->tsteps + m0, t.bs,
                                                     t.info.global_batch, t.mse + m0);
        tt[T_BWD] += sd_time_now() - t1;

        /* gradients: the global mean loss's gradient is the sum over ranks (each rank's loss
         * is already divided by the global batch); ZeRO-2 keeps only this rank's shard */
        t1 = sd_time_now();
        if (t.dev_opt) {
            dev_reduce(&t, loss_local, stats, &bad);
        } else {
            if (t.gpu) /* host path */
                sd_download(t.be, t.grads, t.d_grads, t.n * sizeof *t.grads);
            if (t.overlap)
                ; /* reduced bucket by bucket during the backward */
            else if (t.zero2)
                sd_reduce_scatter_f32(t.comm, t.grads, t.grads + t.begin, t.n, SD_RED_SUM);
            else
                sd_allreduce_f32(t.comm, t.grads, t.n, SD_RED_SUM);
            /* one global norm, summed shard by shard in rank order whatever the sharding, so
             * DDP and ZeRO-2 clip by the same bits */
            size_t sb, se;
            sd_comm_shard(t.comm, t.n, &sb, &se);
            stats[0] = sd_sumsq(t.grads + sb, se - sb);
            stats[1] = loss_local;
            bad = sd_any_nonfinite(t.grads + t.begin, t.end - t.begin) || !isfinite(loss_local);
        }
        sd_allreduce_f64(t.comm, stats, 2, SD_RED_SUM);
        sd_allreduce_i64(t.comm, &bad, 1, SD_RED_MAX);
        tt[T_COMM] = sd_time_now() - t1;
        sumsq = stats[0];
        gnorm = sqrt(sumsq);

        /* AdamW on this rank's range, then the parameters gathered (ZeRO-2) */
        t1 = sd_time_now();
        {
            const sd_lr_params lp = {t.sched, cfg->train.warmup_steps, max_steps,
                                     cfg->train.lr_num_cycles, cfg->train.lr_power,
                                     cfg->train.learning_rate};
            lr = cfg->train.learning_rate * sd_lr_factor_params(&lp, k);
        }
        if (bad || !isfinite(gnorm)) {
            skipped++;
            if (t.rank == 0)
                sd_warn("step %lld: non-finite loss or gradients on some rank; the step is "
                        "skipped on every rank (%lld skipped so far)", (long long)step + 1,
                        (long long)skipped);
        } else {
            k++;
            coef = cfg->train.grad_clip > 0 ? sd_clip_coef(sumsq, cfg->train.grad_clip) : 1.0;
            if (t.dev_opt) {
                dev_update(&t, lr, k, coef);
            } else {
                if (coef < 1.0)
                    sd_scale(t.grads + t.begin, t.end - t.begin, coef);
                sd_adamw_update(&t.adam, lr, k, t.w.data + t.begin, t.grads + t.begin, t.m, t.v,
                                t.end - t.begin);
                if (t.ema)
                    sd_ema_update(t.ema, t.w.data + t.begin, t.end - t.begin,
                                  sd_ema_decay(k, cfg->train.ema_decay,
                                               cfg->train.ema_start_step));
            }
        }
        tt[T_OPT] = sd_time_now() - t1;
        if (t.dev_opt) {
            t1 = sd_time_now();
            dev_gather(&t);
            tt[T_COMM] += sd_time_now() - t1;
        } else if (t.zero2) {
            t1 = sd_time_now();
            sd_allgather_f32(t.comm, t.w.data, t.n);
            tt[T_COMM] += sd_time_now() - t1;
        }
        if (t.gpu && !t.dev_opt) {
            /* host path: the updated parameters back into the U-Net's (converted to bf16) */
            t1 = sd_time_now();
            sd_upload_f32(t.be, t.d_params, t.w.data, (int64_t)t.n);
            tt[T_COMM] += sd_time_now() - t1;
        }

        /* metrics (rank 0's clock) */
        {
            const double dt = sd_time_now() - t0;
            const double ips = (double)t.info.global_batch / (dt > 0 ? dt : 1e-9);
            for (int i = 0; i < T_N; i++)
                t_acc[i] += tt[i];
            t_loop += dt;
            if (iv_first == 0)
                iv_first = step + 1;
            iv[0] += tt[T_DATA];
            if (isfinite(compute_s)) {
                iv[1] += compute_s;
                c_acc += compute_s;
            }
            iv_wall += dt;
            last_loss = stats[1];
            if (isfinite(stats[1])) {
                interval_loss += stats[1];
                interval_n++;
            }
            if (t.metrics) {
                fprintf(t.metrics,
                        "{\"step\": %lld, \"epoch\": %lld, \"loss\": %.9g, \"lr\": %.9g, "
                        "\"grad_norm\": %.9g, \"skipped\": %lld, \"images_per_s\": %.4f, "
                        "\"tflops_per_rank\": %.6g, \"step_s\": %.6f",
                        (long long)step + 1, (long long)in->epoch,
                        isfinite(stats[1]) ? stats[1] : -1.0, lr, isfinite(gnorm) ? gnorm : -1.0,
                        (long long)skipped, ips, ips * flops_sample / t.size * 1e-12, dt);
                for (int i = 0; i < T_N; i++)
                    fprintf(t.metrics, ", \"%s_s\": %.6f", t_names[i], tt[i]);
                fprintf(t.metrics, ", \"compute_s\": %.6f}\n", isfinite(compute_s) ? compute_s : -1.0);
                metrics_flush(&t, step + 1);
            }
            if ((step + 1) % log_every == 0 || step + 1 == max_steps) {
                char eta[32];
                fmt_duration(t_loop / (double)(step + 1 - t.start_step) *
                                 (double)(max_steps - step - 1), eta, sizeof eta);
                sd_info("step %lld/%lld  loss %.5f (mean of %d)  lr %.3g  grad norm %.3g  "
                        "%.1f img/s  ETA %s", (long long)step + 1, (long long)max_steps,
                        interval_n ? interval_loss / interval_n : NAN, interval_n, lr, gnorm,
                        (double)t.info.global_batch * (step + 1 - t.start_step) / t_loop, eta);
                interval_loss = 0;
                interval_n = 0;
                report_stragglers(&t, iv_first, step + 1, iv, iv_wall);
                iv[0] = iv[1] = iv_wall = 0;
                iv_first = 0;
            }
        }

        if (cfg->train.val_every > 0 && t.info.n_val > 0 &&
            ((step + 1) % cfg->train.val_every == 0 || step + 1 == max_steps)) {
            int64_t nv;
            int vfailed;
            double tv = sd_time_now();
            last_val = validate(&t, &vb, &nv, &vfailed);
            if (vfailed) {
                code = SD_EXIT_FAILURE;
                break;
            }
            if (t.metrics) {
                /* -1 for a non-finite loss, as the step lines: "nan" is no JSON */
                fprintf(t.metrics, "{\"step\": %lld, \"val_loss\": %.9g, \"val_samples\": %lld}\n",
                        (long long)step + 1, isfinite(last_val) ? last_val : -1.0, (long long)nv);
                metrics_flush(&t, step + 1);
            }
            sd_info("step %lld: validation loss %.6f over %lld samples (%.2f s)",
                    (long long)step + 1, last_val, (long long)nv, sd_time_now() - tv);
        }
        if (checkpoint_boundary(&t, step + 1, k, skipped, &code)) {
            step++; /* steps done */
            break;
        }
    }

    /* the last checkpoint, the final weights (and EMA), then the summary; the weights are
     * written even when the checkpoint cannot be (a full checkpoint disk), and the run then ends
     * with status 1 */
    int final_ckpt_failed = 0;
    sd_progress_phase("the final checkpoint and weights after step", step);
    if (code == SD_EXIT_OK && !t.stopped && t.last_ckpt != step &&
        save_checkpoint(&t, step, k, skipped, &err)) {
        if (t.rank == 0)
            sd_error("%s; the final weights are written all the same", err.msg);
        final_ckpt_failed = 1;
    }
    if (code == SD_EXIT_OK && !t.stopped && !final_ckpt_failed)
        sample_checkpoint(&t, step); /* the last checkpoint's images too */
    if (code == SD_EXIT_OK && !t.stopped) {
        int failed = 0;
        float *ema_full = NULL;
        if (t.dev_opt) {
            /* the GPU's parameters and EMA into the host buffers the writer reads */
            ema_full = dev_fetch(&t);
        } else if (t.ema && t.zero2) {
            /* ZeRO-2 keeps the EMA of the shard only: gather it into a full buffer to write */
            ema_full = sd_xcalloc(t.n ? t.n : 1, sizeof *ema_full);
            memcpy(ema_full + t.begin, t.ema, (t.end - t.begin) * sizeof *ema_full);
            sd_allgather_f32(t.comm, ema_full, t.n);
        }
        if (t.rank == 0) {
            const float *ema_out = ema_full ? ema_full : t.ema;
            failed = write_weights(&t, t.w.data, "unet_final.safetensors", &err) != 0;
            if (!failed && ema_out)
                failed = write_weights(&t, ema_out, "unet_ema.safetensors", &err) != 0;
            if (failed)
                sd_error("%s", err.msg);
        }
        free(ema_full);
        /* (the others wait for rank 0's writes, which its own stall watchdog bounds) */
        if (t.rank != 0)
            sd_progress_wait_begin("waiting for rank 0 to write the final weights");
        if (any_failed(t.comm, failed))
            code = SD_EXIT_FAILURE;
        if (t.rank != 0)
            sd_progress_wait_end();
    }
    if (final_ckpt_failed)
        code = SD_EXIT_FAILURE;
    {
        double pk = (double)peak_rss_bytes();
        sd_allreduce_f64(t.comm, &pk, 1, SD_RED_MAX);
        peak = (size_t)pk;
    }
    t.info = *sd_loader_get_info(t.loader); /* follow mode: the shards known by now */
    if (t.rank == 0) {
        const double wall = sd_time_now() - t_start;
        const int64_t done = step, ran = step - t.start_step; /* ran: this run's, after a resume */
        printf("\ntraining summary (%d rank(s), %s)\n", t.size,
               t.zero2 ? "ZeRO-2" : "DDP");
        if (t.resumed)
            printf("  %-28s %lld of %lld, %lld of them in this run (%lld skipped: non-finite)\n",
                   "steps", (long long)done, (long long)max_steps, (long long)ran,
                   (long long)skipped);
        else
            printf("  %-28s %lld of %lld (%lld skipped: non-finite)\n", "steps", (long long)done,
                   (long long)max_steps, (long long)skipped);
        printf("  %-28s %lld (%.2f epochs%s)\n", "samples seen",
               (long long)(done * t.info.global_batch),
               t.info.steps_per_epoch ? (double)done / (double)t.info.steps_per_epoch : 0.0,
               t.info.complete ? "" : " of the shards committed so far");
        if (ran > 0)
            printf("  %-28s %.6f\n", "last training loss", last_loss);
        else
            printf("  %-28s none (no step in this run)\n", "last training loss");
        if (isfinite(last_val))
            printf("  %-28s %.6f\n", "last validation loss", last_val);
        printf("  %-28s %.2f img/s (%.1f s wall)\n", "throughput",
               wall > 0 ? (double)(ran * t.info.global_batch) / wall : 0.0, wall);
        /* over the steps' own time (t_loop: no set-up, validation or checkpoints) */
        printf("  %-28s %.4g TFLOP/s a rank (%.4g GFLOP a sample: forward + backward, "
               "recomputation not counted)\n", "model compute",
               t_loop > 0 ? (double)(ran * t.info.global_batch) * flops_sample / t_loop /
                                t.size * 1e-12
                          : 0.0,
               flops_sample * 1e-9);
        for (int i = 0; i < T_N; i++)
            printf("  %-28s %8.3f s  %5.1f%%\n", t_names[i], t_acc[i],
                   t_loop > 0 ? 100.0 * t_acc[i] / t_loop : 0.0);
        /* the backend's own time of the forwards and backwards (the stream clock): on a GPU
         * the share of the steps it computes, and the model's rate while it does */
        printf("  %-28s %8.3f s  %5.1f%%  (%s; %.4g TFLOP/s while computing)\n",
               "forward + backward, own", c_acc, t_loop > 0 ? 100.0 * c_acc / t_loop : 0.0,
               t.be->device == SD_DEV_CPU ? "the host's clock" : "the GPU's clock",
               c_acc > 0 ? (double)(ran * t.info.global_batch) / t.size * flops_sample / c_acc *
                               1e-12
                         : 0.0);
        if (!t.gpu) {
            printf("  %-28s %.1f MB (activation arena %.1f MB)\n", "peak memory per rank (max)",
                   peak * 1e-6, sd_unet_trainer_arena_bytes(t.tr) * 1e-6);
        } else {
            printf("  %-28s %.1f MB\n", "peak host memory per rank", peak * 1e-6);
            printf("  %-28s %.1f MB (state %.1f MB, activation arena %.1f MB)\n",
                   t.emu ? "device-path memory, rank 0" : "GPU memory, rank 0",
                   (double)(t.dev_bytes + sd_arena_capacity(&t.arena)) * 1e-6,
                   (double)t.dev_bytes * 1e-6, (double)sd_arena_capacity(&t.arena) * 1e-6);
        }
        if (t.stopped && t.last_ckpt < 0)
            printf("  %-28s %s/metrics.jsonl (no checkpoint: stopped before the first step)\n",
                   "outputs", cfg->run.output_dir);
        else if (t.stopped)
            printf("  %-28s %s/metrics.jsonl, checkpoint %s/step-%08lld\n", "outputs",
                   cfg->run.output_dir, t.ckpt_dir, (long long)t.last_ckpt);
        else
            printf("  %-28s %s/metrics.jsonl, %s/unet_final.safetensors%s\n", "outputs",
                   cfg->run.output_dir, cfg->run.output_dir,
                   cfg->train.ema_decay > 0 ? ", unet_ema.safetensors" : "");
        if (t.metrics_lost >= 0)
            printf("  %-28s %s/metrics.jsonl from step %lld on: writing it failed (see the "
                   "warning above)\n", "INCOMPLETE", cfg->run.output_dir,
                   (long long)t.metrics_lost);
        fflush(stdout);
    }
    sd_loader_batch_free(&vb);
    free_trainer(&t);
    return code;
}
