/* &run mode = 'sample': text-to-image generation from a diffusers snapshot or a training
 * output, the images split over every rank of MPI_COMM_WORLD (doc/sampling.md). */
#include "sd_config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/config.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/fault.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"
#include "sdtrain/log.h"
#include "sdtrain/modes.h"
#include "sdtrain/progress.h"
#include "sdtrain/runtime.h"
#include "sdtrain/sampler.h"
#include "sdtrain/sched_config.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/text2img.h"
#include "sdtrain/timer.h"
#include "sdtrain/tokenizer.h"
#include "sdtrain/utf8.h"

#define TEXT_LEN SD_TOKENIZER_LENGTH
#define TRAIN_UNET_FILE "unet_final.safetensors"
#define TRAIN_EMA_FILE "unet_ema.safetensors"

/* Where each part comes from, as resolved from &sample checkpoint and &model. */
typedef struct sources {
    char unet_snapshot[SD_PATH_MAX];  /* a diffusers snapshot holding unet/, or "" */
    char unet_file[SD_PATH_MAX + 64]; /* a U-Net safetensors file (diffusers names), or "" */
    char ckpt[SD_PATH_MAX + 64];      /* a checkpoint directory (step-K) of mode 'train', or "" */
    char parts[SD_PATH_MAX];          /* snapshot of the VAE / text encoder / tokenizer, or "" */
    char vae[SD_PATH_MAX];            /* VAE snapshot or folder, or "" (random from the seed) */
} sources;

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* A checkpoint of mode 'train' in `dir`: dir itself (it has a manifest.json), or what the
 * `latest` file of a checkpoint root names. 1 and the step directory in out, 0 when dir is
 * neither. */
static int find_checkpoint(const char *dir, char *out, size_t size)
{
    char path[SD_PATH_MAX + 64], line[256] = "";
    FILE *f;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (is_file(path)) {
        snprintf(out, size, "%s", dir);
        return 1;
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    if (!(f = fopen(path, "r")))
        return 0;
    if (!fgets(line, sizeof line, f))
        line[0] = '\0';
    fclose(f);
    len = strcspn(line, "\r\n");
    line[len] = '\0';
    snprintf(out, size, "%s/%s", dir, line);
    return 1;
}

void sd_run_checkpoint_root(const char *run_dir, const char *nml, char *root, size_t size)
{
    char used[SD_PATH_MAX + 16];
    snprintf(root, size, "%s/checkpoints", run_dir);
    if (!nml) {
        snprintf(used, sizeof used, "%s/used.nml", run_dir);
        if (!is_file(used))
            return;
        nml = used;
    }
    sd_run_config rc;
    sd_err err;
    sd_run_config_init(&rc);
    /* &checkpoint dir, when the run set one and it is reachable from here */
    if (sd_config_load(&rc, nml, 0, NULL, &err) == 0 && rc.cfg.checkpoint.dir[0] &&
        is_dir(rc.cfg.checkpoint.dir))
        snprintf(root, size, "%s", rc.cfg.checkpoint.dir);
    sd_run_config_free(&rc);
}

/* A training output directory (`key` names where it was given): its final weights (the EMA
 * file with use_ema), else the newest checkpoint of its checkpoint root. 1 when found; 0 when
 * dir is no training output directory (none of what mode 'train' writes there; its used.nml
 * counts unless `own`: this run's output_dir, where this run wrote one); -1 with a message when
 * it is one without what is asked for. */
static int from_training_output(const sd_config *cfg, const char *key, const char *dir, int own,
                                sources *s, sd_err *err)
{
    char path[SD_PATH_MAX + 64], root[SD_PATH_MAX + 64];
    const char *want = cfg->sample.use_ema ? TRAIN_EMA_FILE : TRAIN_UNET_FILE;
    int n_marks = 0;
    snprintf(path, sizeof path, "%s/%s", dir, want);
    if (is_file(path)) {
        snprintf(s->unet_file, sizeof s->unet_file, "%s", path);
        return 1;
    }
    sd_run_checkpoint_root(dir, NULL, root, sizeof root);
    if (is_dir(root) && find_checkpoint(root, s->ckpt, sizeof s->ckpt))
        return 1;
    static const char *const marks[] = {TRAIN_UNET_FILE, TRAIN_EMA_FILE, "metrics.jsonl",
                                        "used.nml"};
    for (int i = 0; i < (own ? 3 : 4); i++) {
        snprintf(path, sizeof path, "%s/%s", dir, marks[i]);
        n_marks += is_file(path);
    }
    if (!n_marks && !is_dir(root))
        return 0;
    if (cfg->sample.use_ema)
        return sd_err_set(err, "%s = '%s' is a training output directory without EMA weights "
                               "(&sample use_ema = .true.): no %s and no checkpoint in %s (the run "
                               "had &train ema_decay = 0?)", key, dir, TRAIN_EMA_FILE, root);
    return sd_err_set(err, "%s = '%s' is a training output directory with nothing to sample "
                           "from: no %s and no checkpoint in %s (its &checkpoint dir, from "
                           "used.nml, or checkpoints/)", key, dir, TRAIN_UNET_FILE, root);
}

static int resolve_sources(const sd_config *cfg, sources *s, sd_err *err)
{
    const char *ck = cfg->sample.checkpoint, *pre = cfg->model.pretrained;
    int rc;
    memset(s, 0, sizeof *s);
    if (!ck[0]) {
        if (pre[0]) {
            if (cfg->sample.use_ema)
                return sd_err_set(err, "&sample use_ema = .true., but the U-Net comes from &model "
                                       "pretrained = '%s', a diffusers snapshot, which has no EMA "
                                       "weights: set &sample checkpoint to the training output "
                                       "directory or checkpoint", pre);
            snprintf(s->unet_snapshot, sizeof s->unet_snapshot, "%s", pre);
        } else if ((rc = from_training_output(cfg, "&run output_dir", cfg->run.output_dir, 1,
                                              s, err)) < 0) {
            return -1;
        } else if (rc == 0) {
            return sd_err_set(err, "nothing to sample from: &sample checkpoint and &model "
                                   "pretrained are both '' and &run output_dir '%s' holds neither "
                                   "%s nor checkpoints/ (what mode 'train' writes there). Set "
                                   "&sample checkpoint to a diffusers snapshot, a training output "
                                   "directory or a checkpoint", cfg->run.output_dir,
                              cfg->sample.use_ema ? TRAIN_EMA_FILE : TRAIN_UNET_FILE);
        }
    } else if (is_file(ck)) {
        if (cfg->sample.use_ema)
            return sd_err_set(err, "&sample use_ema = .true., but &sample checkpoint = '%s' is a "
                                   "U-Net .safetensors file, which has no EMA weights: give the "
                                   "training output directory or checkpoint, or the file of the "
                                   "EMA weights (%s) with use_ema = .false.", ck, TRAIN_EMA_FILE);
        snprintf(s->unet_file, sizeof s->unet_file, "%s", ck);
    } else if (is_dir(ck)) {
        if (!find_checkpoint(ck, s->ckpt, sizeof s->ckpt)) {
            if ((rc = from_training_output(cfg, "&sample checkpoint", ck, 0, s, err)) < 0)
                return -1;
            if (rc == 0 && cfg->sample.use_ema)
                return sd_err_set(err, "&sample use_ema = .true., but &sample checkpoint = '%s' "
                                       "is no training output directory or checkpoint: a diffusers "
                                       "snapshot has no EMA weights", ck);
            if (rc == 0)
                snprintf(s->unet_snapshot, sizeof s->unet_snapshot, "%s", ck);
        }
    } else {
        return sd_err_set(err, "&sample checkpoint = '%s': no such file or directory (expected a "
                               "diffusers snapshot, a training output directory with %s, or a "
                               "U-Net .safetensors file)", ck, TRAIN_UNET_FILE);
    }
    /* the other parts: the snapshot the U-Net came from, else &model pretrained */
    snprintf(s->parts, sizeof s->parts, "%s", s->unet_snapshot[0] ? s->unet_snapshot : pre);
    snprintf(s->vae, sizeof s->vae, "%s",
             cfg->model.autoencoder[0] ? cfg->model.autoencoder : s->parts);
    return 0;
}

/* The prompts of a run: &sample prompts, or the lines of &sample prompts_file. */
typedef struct prompt_set {
    int n;               /* prompts */
    const char **text;   /* [n] */
    int64_t *line;       /* [n] their lines in prompts_file, or NULL */
    int n_neg;           /* negative prompts: 0, 1, or n (namelist prompts only) */
    const char **neg;    /* [n_neg] */
    char *buf;           /* prompts_file's bytes, which text points into */
} prompt_set;

#define PROMPTS_FILE_MAX_BYTES ((size_t)256 << 20)
#define PROMPTS_FILE_MAX 1000000

static void prompts_free(prompt_set *ps)
{
    free(ps->text);
    free(ps->line);
    free(ps->neg);
    free(ps->buf);
    memset(ps, 0, sizeof *ps);
}

/* Splits prompts_file's bytes into prompts in place: lines ended by LF (a CR before it
 * dropped), blank lines (spaces and tabs only) skipped. Every rank parses the same bytes, so
 * each finds the same prompts or the same error. */
static int prompts_parse(prompt_set *ps, const char *path, char *buf, size_t len, sd_err *err)
{
    size_t cap = 0;
    int64_t line = 0;
    for (size_t at = 0; at < len;) {
        char *start = buf + at, *nl = memchr(start, '\n', len - at);
        size_t n = nl ? (size_t)(nl - start) : len - at;
        at += n + (nl ? 1 : 0);
        line++;
        if (n > 0 && start[n - 1] == '\r')
            n--;
        start[n] = '\0';
        if (memchr(start, '\0', n))
            return sd_err_at(err, path, (int)line, 1, "a NUL byte: not a text file of prompts");
        if (strspn(start, " \t") == n)
            continue;
        if (n >= SD_PROMPT_MAX)
            return sd_err_at(err, path, (int)line, 1, "a prompt of %zu bytes (at most %d)", n,
                             SD_PROMPT_MAX - 1);
        if (ps->n == PROMPTS_FILE_MAX)
            return sd_err_at(err, path, (int)line, 1, "more than %d prompts", PROMPTS_FILE_MAX);
        if ((size_t)ps->n == cap) {
            cap = cap ? 2 * cap : 1024;
            ps->text = sd_xrealloc(ps->text, cap * sizeof *ps->text);
            ps->line = sd_xrealloc(ps->line, cap * sizeof *ps->line);
        }
        ps->text[ps->n] = start;
        ps->line[ps->n++] = line;
    }
    if (ps->n == 0)
        return sd_err_set(err, "%s: no prompts (the file has only blank lines)", path);
    return 0;
}

/* Collective over comm: the run's prompts. A prompts_file is read by rank 0 and broadcast. */
static int prompts_load(const sd_config *cfg, MPI_Comm comm, int rank, prompt_set *ps,
                        sd_err *err)
{
    const char *path = cfg->sample.prompts_file;
    int failed = 0;
    memset(ps, 0, sizeof *ps);
    ps->n_neg = cfg->sample.n_negative_prompts;
    ps->neg = sd_xmalloc(((size_t)ps->n_neg + 1) * sizeof *ps->neg);
    for (int k = 0; k < ps->n_neg; k++)
        ps->neg[k] = cfg->sample.negative_prompts[k];
    if (!path[0]) {
        ps->n = cfg->sample.n_prompts;
        ps->text = sd_xmalloc(((size_t)ps->n + 1) * sizeof *ps->text);
        for (int p = 0; p < ps->n; p++)
            ps->text[p] = cfg->sample.prompts[p];
        return 0;
    }
    uint64_t len = 0;
    if (rank == 0) {
        size_t n = 0;
        failed = sd_read_regular_file(path, PROMPTS_FILE_MAX_BYTES, "a prompts file", &ps->buf,
                                      &n, err) != 0;
        len = n;
    }
    if (sd_agree(comm, failed, err) != 0) {
        prompts_free(ps);
        return -1;
    }
    SD_MPI_CHECK(MPI_Bcast(&len, 1, MPI_UINT64_T, 0, comm));
    if (rank != 0)
        ps->buf = sd_xmalloc((size_t)len + 1);
    sd_bcast_bytes(ps->buf, (size_t)len, comm);
    ps->buf[len] = '\0';
    if (prompts_parse(ps, path, ps->buf, (size_t)len, err) != 0) {
        prompts_free(ps);
        return -1;
    }
    return 0;
}

/* Warnings on the texts that the tokenizer changes: invalid UTF-8 (its bytes dropped) or more
 * tokens than the text encoder sees. At most 10 of each, then a count. */
static void warn_prompts(const sd_tokenizer *tok, const char *key, const char *const *texts,
                         int n, const int64_t *line, const char *file)
{
    int n_bad = 0, n_long = 0;
    for (int p = 0; p < n; p++) {
        int32_t ids[TEXT_LEN];
        int n_tok = 0;
        char where[SD_PATH_MAX + 64];
        if (line)
            snprintf(where, sizeof where, "%s:%lld: the prompt", file, (long long)line[p]);
        else
            snprintf(where, sizeof where, "&sample %s(%d)", key, p + 1);
        if (sd_tokenize(tok, texts[p], strlen(texts[p]), ids, &n_tok) > 0 && n_bad++ < 10)
            sd_warn("%s is not valid UTF-8: the bad bytes are dropped, as the reference "
                    "tokenizer does", where);
        if (n_tok > TEXT_LEN && n_long++ < 10)
            sd_warn("%s has %d tokens; the text encoder sees the first %d (truncated, as the "
                    "pipeline does)", where, n_tok - 2, TEXT_LEN - 2);
    }
    if (n_bad > 10 || n_long > 10)
        sd_warn("%s: %d prompt(s) in all are not valid UTF-8 and %d are truncated (the first 10 "
                "of each are named above)", line ? file : key, n_bad, n_long);
}

/* The images' height ('h') or width ('w'): &sample height / width, else &model resolution. */
static int sample_side(const sd_config *cfg, char which)
{
    const int64_t v = which == 'h' ? cfg->sample.height : cfg->sample.width;
    return (int)(v > 0 ? v : cfg->model.resolution);
}

/* Loads every part on the host (fp32) and opens the generator on this rank's device. */
static int load_models(const sd_config *cfg, const sd_device_info *dev, const sources *src,
                       int max_images, int max_decode, sd_t2i *g, char *what,
                       size_t what_size, sd_err *err)
{
    sd_unet_config uc;
    sd_vae_config vc;
    sd_clip_config cc;
    sd_weights uw, vw, cw;
    sd_tokenizer *tok = NULL;
    sd_snapshot s;
    char tok_path[SD_PATH_MAX + 16];
    int eos = 0, rc = -1;
    const char *precision = dev->use_cuda ? cfg->train.precision : "fp32";

    memset(&uw, 0, sizeof uw);
    memset(&vw, 0, sizeof vw);
    memset(&cw, 0, sizeof cw);
    memset(g, 0, sizeof *g);
    if (!dev->use_cuda && strcmp(cfg->train.precision, "bf16") == 0)
        sd_warn("&train precision = 'bf16' needs a GPU; this rank samples on the CPU in fp32");

    /* U-Net */
    if (src->unet_snapshot[0]) {
        if (sd_snapshot_open(&s, src->unet_snapshot, err))
            goto out;
        if (sd_snapshot_load_unet(&s, NULL, &uc, &uw, err)) {
            sd_snapshot_close(&s);
            goto out;
        }
        sd_snapshot_close(&s);
    } else {
        sd_st_set set;
        sd_param_table table;
        if (cfg->model.pretrained[0]) {
            char dir[SD_PATH_MAX + 16], conf[SD_PATH_MAX + 32];
            if (sd_snapshot_open(&s, cfg->model.pretrained, err))
                goto out;
            if (sd_snapshot_component_dir(&s, SD_COMPONENT_UNET, dir, sizeof dir, err) ||
                (snprintf(conf, sizeof conf, "%s/config.json", dir), 0) ||
                sd_unet_config_load(conf, &uc, err)) {
                sd_snapshot_close(&s);
                goto out;
            }
            sd_snapshot_close(&s);
        } else {
            sd_unet_config_from_namelist(cfg, &uc);
        }
        memset(&table, 0, sizeof table);
        sd_unet_params(&uc, &table);
        if (sd_weights_check_size(&table, cfg->model.pretrained[0] ? "the snapshot's U-Net"
                                  : "the U-Net of the &model shape keys", err)) {
            sd_param_table_free(&table);
            goto out;
        }
        sd_weights_init(&uw, &table);
        if (src->ckpt[0]) {
            /* a checkpoint: its manifest is checked against the table, the dataset's checksum
             * verified */
            sd_ckpt_info info;
            if (sd_ckpt_peek(src->ckpt, &info, err))
                goto out;
            if (cfg->sample.use_ema && !info.s.has_ema) {
                sd_err_set(err, "&sample use_ema = .true. but checkpoint %s holds no EMA (the run "
                                "had &train ema_decay = 0)", src->ckpt);
                sd_ckpt_info_free(&info);
                goto out;
            }
            sd_ckpt_info_free(&info);
            if (sd_ckpt_read_dataset(src->ckpt, &uw.table, cfg->sample.use_ema ? "ema" : "params",
                                     uw.data, &info, err))
                goto out;
            sd_ckpt_info_free(&info);
        } else {
            if (sd_st_set_open_file(&set, src->unet_file, err))
                goto out;
            if (sd_weights_load(&uw, &set, err)) {
                sd_st_set_close(&set);
                goto out;
            }
            sd_st_set_close(&set);
        }
    }

    /* VAE and text encoder: from a snapshot, or (no snapshot at all, as in the demo) drawn from
     * the seed exactly as mode 'process' draws them, so the latents a U-Net was trained on
     * decode with the same VAE. */
    if (src->vae[0]) {
        if (sd_snapshot_open(&s, src->vae, err))
            goto out;
        if (sd_snapshot_load_vae(&s, NULL, &vc, &vw, err)) {
            sd_snapshot_close(&s);
            goto out;
        }
        sd_snapshot_close(&s);
    } else {
        sd_param_table t;
        sd_vae_config_from_namelist(cfg, &vc);
        memset(&t, 0, sizeof t);
        sd_vae_params(&vc, &t);
        if (sd_weights_check_size(&t, "the VAE of the &model shape keys", err)) {
            sd_param_table_free(&t);
            goto out;
        }
        sd_weights_init(&vw, &t);
        sd_weights_init_random(&vw, (uint64_t)cfg->run.seed ^ UINT64_C(0x7661650000000000));
    }
    if (src->parts[0]) {
        if (sd_snapshot_open(&s, src->parts, err))
            goto out;
        if (sd_snapshot_load_text_encoder(&s, NULL, &cc, &eos, &cw, err)) {
            sd_snapshot_close(&s);
            goto out;
        }
        sd_snapshot_close(&s);
    } else {
        sd_param_table t;
        sd_clip_config_from_namelist(cfg, &cc);
        memset(&t, 0, sizeof t);
        sd_clip_params(&cc, &t);
        if (sd_weights_check_size(&t, "the text encoder of the &model shape keys", err)) {
            sd_param_table_free(&t);
            goto out;
        }
        sd_weights_init(&cw, &t);
        sd_weights_init_random(&cw, (uint64_t)cfg->run.seed ^ UINT64_C(0x636c697000000000));
    }

    if (cfg->model.tokenizer[0])
        snprintf(tok_path, sizeof tok_path, "%s", cfg->model.tokenizer);
    else if (src->parts[0])
        snprintf(tok_path, sizeof tok_path, "%s/tokenizer", src->parts);
    else {
        sd_err_set(err, "no tokenizer: set &model tokenizer (a tokenizer/ folder or "
                        "bpe_simple_vocab_16e6.txt.gz) or use a snapshot with tokenizer/");
        goto out;
    }
    if (sd_tokenizer_load(tok_path, &tok, err))
        goto out;
    if (sd_tokenizer_check_model_vocab(tok, cc.vocab_size, err))
        goto out;

    /* a description for the log; a long one is cut */
    if (snprintf(what, what_size, "U-Net %s%s, VAE %s, text encoder %s, tokenizer %s",
                 src->unet_snapshot[0] ? src->unet_snapshot
                 : src->ckpt[0]        ? src->ckpt
                                       : src->unet_file,
                 src->unet_snapshot[0] ? "/unet"
                 : src->ckpt[0]        ? (cfg->sample.use_ema ? " (EMA)" : " (parameters)")
                                       : "",
                 src->vae[0] ? src->vae : "random(seed)",
                 src->parts[0] ? src->parts : "random(seed)", tok_path) >= (int)what_size)
        what[what_size - 1] = '\0';
    rc = sd_t2i_open(g, dev->use_cuda ? "cuda" : "cpu", dev->device_id, precision, &uc, &uw, &vc,
                     &vw, &cc, &cw, tok, sample_side(cfg, 'h'), sample_side(cfg, 'w'), max_images,
                     max_decode, err);
    tok = NULL; /* owned by g now */
out:
    sd_weights_free(&uw);
    sd_weights_free(&vw);
    sd_weights_free(&cw);
    if (tok)
        sd_tokenizer_free(tok);
    return rc;
}

/* JSON string body of s (quotes, backslashes and control characters escaped; UTF-8 as is, each
 * ill-formed subpart written as U+FFFD, so the index stays UTF-8 JSON). */
static void json_str(FILE *f, const char *s)
{
    const size_t n = strlen(s);
    char *fixed = sd_xmalloc(3 * n + 1);
    sd_utf8_repair(s, n, fixed, NULL);
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)fixed; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
    free(fixed);
}

/* A scheduler for `n` latent elements (nb images of a batch) with the snapshot's options. */
static int make_sampler(sd_sampler *s, int kind, const sd_diffusion *d, const sd_config *cfg,
                        const sd_sched_setup *ss, int64_t n, sd_err *err)
{
    if (sd_sched_sampler(s, (sd_sampler_kind)kind, d, ss, (int)cfg->sample.num_steps, n, err) != 0)
        return -1;
    if (kind == SD_SAMPLER_DDIM)
        s->eta = cfg->sample.eta;
    return 0;
}

typedef struct noise_ctx {
    uint64_t seed, image, prompt;
    int c, h, w;
    int failed;
} noise_ctx;

static void step_noise(void *user, int k, float *out, int64_t n)
{
    noise_ctx *nc = user;
    sd_err err;
    if (sd_sampler_normals_nhwc(nc->seed, SD_SAMPLER_RNG_DDPM, nc->image, nc->prompt,
                                (uint64_t)k * (uint64_t)n, nc->c, nc->h, nc->w, out, &err) != 0) {
        memset(out, 0, (size_t)n * sizeof *out);
        nc->failed = 1;
    }
}

/* the shortest decimal that reads back as the same double */
static void shortest(double v, char out[40])
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, 40, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            break;
    }
}

/* samples.jsonl, written by rank 0 once every image exists (temporary name + rename). */
static int write_index(const sd_config *cfg, const prompt_set *ps, const char *scheduler,
                       const char *spacing, sd_err *err)
{
    char path[SD_PATH_MAX + 32], tmp[SD_PATH_MAX + 64];
    FILE *f;
    int ok;
    char gs[40], eta[40], gr[40];
    shortest(cfg->sample.guidance_scale, gs);
    shortest(cfg->sample.eta, eta);
    shortest(cfg->sample.guidance_rescale, gr);
    snprintf(path, sizeof path, "%s/samples.jsonl", cfg->run.output_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    f = fopen(tmp, "w");
    if (!f)
        return sd_err_set(err, "cannot write '%s': %s", tmp, strerror(errno));
    for (int p = 0; p < ps->n; p++)
        for (int64_t j = 0; j < cfg->sample.images_per_prompt; j++) {
            fprintf(f, "{\"prompt_index\": %d, \"image_index\": %" PRId64 ", ", p, j);
            if (ps->line)
                fprintf(f, "\"prompt_line\": %" PRId64 ", ", ps->line[p]);
            fprintf(f, "\"prompt\": ");
            json_str(f, ps->text[p]);
            if (ps->n_neg > 0 && cfg->sample.guidance_scale > 1.0) {
                fprintf(f, ", \"negative_prompt\": ");
                json_str(f, ps->neg[ps->n_neg > 1 ? p : 0]);
            }
            fprintf(f, ", \"seed\": %lld, \"steps\": %lld, \"scheduler\": \"%s\", "
                       "\"timestep_spacing\": \"%s\", ", (long long)cfg->run.seed,
                    (long long)cfg->sample.num_steps, scheduler, spacing);
            if (strcmp(scheduler, "ddim") == 0 && cfg->sample.eta > 0)
                fprintf(f, "\"eta\": %s, ", eta);
            fprintf(f, "\"guidance_scale\": %s, ", gs);
            if (cfg->sample.guidance_scale > 1.0 && cfg->sample.guidance_rescale > 0)
                fprintf(f, "\"guidance_rescale\": %s, ", gr);
            fprintf(f, "\"width\": %d, \"height\": %d, \"file\": \"samples/%d-%" PRId64
                       ".png\"}\n", sample_side(cfg, 'w'), sample_side(cfg, 'h'), p, j);
        }
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return sd_err_set(err, "cannot write '%s': %s", path, strerror(e));
    }
    return 0;
}

/* ---- Resuming (&sample resume) -------------------------------------------------------------
 * <output_dir>/samples.settings holds what decides the images of the run that wrote
 * samples/: the namelist's keys (but those of &data, &checkpoint and &train other than precision
 * and latent_scale, and &run's bookkeeping), a hash of the prompts, the weight files' sizes and
 * times, the backend and the batches. A rerun with the same text keeps the images already
 * written (a batch whose images are all there and whole is not made again); with another text,
 * or none, the images there are removed before the new text is written, so that the file always
 * describes every image beside it. */

/* Whether a namelist key cannot change an image: bookkeeping of &run, and what only training
 * and preprocessing read (&train precision and latent_scale are read by sampling). */
static int key_not_in_settings(const char *group, const char *key)
{
    static const char *const run_keys[] = {"mode", "n_process_ranks", "pipeline_end",
                                           "output_dir", "log_level", "io_hints",
                                           "io_alignment", "stall_timeout"};
    static const char *const sample_keys[] = {"resume", "every_n_steps", "prompts",
                                              "prompts_file", "negative_prompts"};
    if (!strcmp(group, "data") || !strcmp(group, "checkpoint"))
        return 1;
    if (!strcmp(group, "train"))
        return strcmp(key, "precision") != 0 && strcmp(key, "latent_scale") != 0;
    if (!strcmp(group, "run")) {
        for (size_t i = 0; i < sizeof run_keys / sizeof *run_keys; i++)
            if (!strcmp(key, run_keys[i]))
                return 1;
    }
    if (!strcmp(group, "sample")) /* the prompts are hashed below, whichever key gave them */
        for (size_t i = 0; i < sizeof sample_keys / sizeof *sample_keys; i++)
            if (!strcmp(key, sample_keys[i]))
                return 1;
    return 0;
}

static uint64_t fnv1a_str(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s;; p++) {
        h ^= *p;
        h *= UINT64_C(0x100000001b3);
        if (!*p)
            return h; /* the NUL too: "ab", "c" differs from "a", "bc" */
    }
}

/* "  file PATH: SIZE bytes, modified SEC.NSEC" for `path` and, when it is a folder, its regular
 * files down to `depth` folders (a snapshot's unet/…safetensors, a checkpoint's state.h5), in
 * name order, at most 512 of them. */
static void put_files(FILE *f, const char *path, int depth, int *left)
{
    struct stat st;
    if (*left <= 0 || stat(path, &st) != 0)
        return;
    if (S_ISREG(st.st_mode)) {
        (*left)--;
        fprintf(f, "file %s: %lld bytes, modified %lld.%09ld\n", path, (long long)st.st_size,
                (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
        return;
    }
    if (!S_ISDIR(st.st_mode) || depth <= 0)
        return;
    size_t n;
    char **names = sd_list_names(path, &n);
    for (size_t i = 0; names && i < n; i++) {
        char sub[SD_PATH_MAX + 300];
        if (snprintf(sub, sizeof sub, "%s/%s", path, names[i]) < (int)sizeof sub)
            put_files(f, sub, depth - 1, left);
    }
    sd_free_names(names, n);
}

/* The settings text of this run (rank 0); malloc'd. */
static char *settings_text(const sd_run_config *rc, const prompt_set *ps, const sources *src,
                           const sd_t2i *g, int nb_max, int nd_max, int use_cuda)
{
    char *text = NULL, *nml = sd_config_to_namelist(rc, false), group[64] = "";
    size_t len = 0;
    int skip = 0, left = 512;
    uint64_t h = UINT64_C(0xcbf29ce484222325), hn = h;
    FILE *f = open_memstream(&text, &len);
    SD_CHECK(f != NULL && nml != NULL, "open_memstream: %s", strerror(errno));
    fprintf(f, "# the settings of the images in samples/ (sdtrain &run mode 'sample'): a rerun "
               "with the same ones keeps them\n");
    for (char *line = nml, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        const char *t = line + strspn(line, " \t");
        if (*t == '&') {
            snprintf(group, sizeof group, "%s", t + 1);
            group[strcspn(group, " \t")] = '\0';
            fprintf(f, "%s\n", t);
            continue;
        }
        if (*t == '!' || *t == '\0')
            continue;
        if (*t == '/') {
            fprintf(f, "/\n");
            continue;
        }
        const char *eq = strstr(t, " = ");
        if (eq) { /* a key's first line; else one more line of the key before */
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - t), t);
            skip = key_not_in_settings(group, key);
        }
        if (!skip)
            fprintf(f, "  %s\n", t);
    }
    free(nml);
    for (int i = 0; i < ps->n; i++)
        h = fnv1a_str(h, ps->text[i]);
    for (int i = 0; i < ps->n_neg; i++)
        hn = fnv1a_str(hn, ps->neg[i]);
    fprintf(f, "prompts: %d, fnv1a64 %016" PRIx64 "\nnegative prompts: %d, fnv1a64 %016" PRIx64
               "\n", ps->n, h, ps->n_neg, hn);
    fprintf(f, "backend: %s %s\n", g->be->name, sd_dtype_name(g->be->dtype));
    /* the GPU's bits depend on the batches (the CPU's U-Net and VAE do not) */
    if (use_cuda)
        fprintf(f, "batches: %d images a U-Net call, %d a decode\n", nb_max, nd_max);
    const char *parts[] = {src->unet_snapshot, src->unet_file, src->ckpt, src->parts, src->vae,
                           rc->cfg.model.pretrained, rc->cfg.model.autoencoder,
                           rc->cfg.model.tokenizer};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (parts[i][0])
            put_files(f, parts[i], 2, &left);
    SD_CHECK(fclose(f) == 0, "open_memstream: %s", strerror(errno));
    return text;
}

/* Whether `path` is a whole PNG of w x h: its signature and IHDR size at the start and the IEND
 * chunk at the end (a file cut short after a crash of the node lacks it). */
static int png_whole(const char *path, int w, int h)
{
    static const unsigned char sig[16] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n',
                                          0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    static const unsigned char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    unsigned char head[24], tail[12];
    struct stat st;
    const int fd = sd_open(path, O_RDONLY | O_CLOEXEC, 0);
    int ok = 0;
    if (fd < 0)
        return 0;
    if (sd_fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 24 + 12 &&
        sd_pio_all(fd, head, sizeof head, 0, 0, NULL) == 0 &&
        sd_pio_all(fd, tail, sizeof tail, (uint64_t)st.st_size - 12, 0, NULL) == 0) {
        const uint32_t pw = (uint32_t)head[16] << 24 | (uint32_t)head[17] << 16 |
                            (uint32_t)head[18] << 8 | head[19];
        const uint32_t ph = (uint32_t)head[20] << 24 | (uint32_t)head[21] << 16 |
                            (uint32_t)head[22] << 8 | head[23];
        ok = !memcmp(head, sig, sizeof sig) && pw == (uint32_t)w && ph == (uint32_t)h &&
             !memcmp(tail, iend, sizeof iend);
    }
    close(fd);
    return ok;
}

/* Whether `name` is one of the files an image write leaves in samples/: "<p>-<j>.png", or its
 * temporary "<p>-<j>.png.tmp<pid>" (left by a run that ended during the write). */
static int image_file_name(const char *name, int *is_tmp)
{
    const char *c = name;
    size_t n = strspn(c, "0123456789");
    if (n == 0 || c[n] != '-')
        return 0;
    c += n + 1;
    n = strspn(c, "0123456789");
    if (n == 0 || strncmp(c + n, ".png", 4) != 0)
        return 0;
    c += n + 4;
    *is_tmp = *c != '\0';
    return !*c || (!strncmp(c, ".tmp", 4) && c[4] && strspn(c + 4, "0123456789") == strlen(c + 4));
}

/* Rank 0, before any rank writes an image: decides whether this run keeps the images there
 * (*keep := 1: samples.settings holds this run's text and &sample resume is 'auto'); otherwise
 * removes them and samples.jsonl, then writes the text (so the file never describes images of
 * other settings). Leftover temporary images are removed either way. *removed := how many
 * images were removed. */
static int settings_begin(const sd_config *cfg, const char *text, const char *dir, int *keep,
                          int64_t *removed, char *why, size_t why_size, sd_err *err)
{
    char path[SD_PATH_MAX + 32], *old = NULL;
    size_t cap = 0, len = 0;
    int fd;
    *keep = 0;
    *removed = 0;
    why[0] = '\0';
    snprintf(path, sizeof path, "%s/samples.settings", cfg->run.output_dir);
    fd = sd_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        if (sd_read_to_end(fd, (void **)&old, &cap, &len) != 0) {
            const int e = errno;
            close(fd);
            free(old);
            return sd_err_set(err, "cannot read '%s': %s", path, strerror(e));
        }
        close(fd);
    } else if (errno != ENOENT) {
        return sd_err_set(err, "cannot open '%s': %s", path, strerror(errno));
    }
    if (old && len == strlen(text) && !memcmp(old, text, len)) {
        *keep = strcmp(cfg->sample.resume, "auto") == 0;
        if (!*keep)
            snprintf(why, why_size, "&sample resume = '%s'", cfg->sample.resume);
    } else if (old) {
        /* the first line that differs, for the message */
        size_t a = 0, b = 0;
        const char *t = text;
        while (a < len && t[b] && old[a] == t[b]) {
            a++;
            b++;
        }
        while (b > 0 && t[b - 1] != '\n')
            b--;
        const size_t e = strcspn(t + b, "\n");
        snprintf(why, why_size, "other settings than those of the images there (first "
                 "difference: '%.*s')", (int)(e < 200 ? e : 200), t + b);
    } else {
        snprintf(why, why_size, "no %s", path);
    }
    free(old);
    DIR *d = sd_opendir(dir);
    if (!d)
        return sd_err_set(err, "cannot list '%s': %s", dir, strerror(errno));
    errno = 0;
    for (struct dirent *e; (e = sd_readdir(d)) != NULL; errno = 0) {
        int is_tmp = 0;
        char f[SD_PATH_MAX + 300];
        if (!image_file_name(e->d_name, &is_tmp) || (*keep && !is_tmp))
            continue;
        snprintf(f, sizeof f, "%s/%s", dir, e->d_name);
        if (unlink(f) != 0 && errno != ENOENT) {
            const int er = errno;
            closedir(d);
            return sd_err_set(err, "cannot remove '%s': %s", f, strerror(er));
        }
        *removed += !is_tmp;
    }
    const int list_errno = errno;
    closedir(d);
    if (list_errno)
        return sd_err_set(err, "cannot list '%s': %s", dir, strerror(list_errno));
    if (*keep)
        return 0;
    snprintf(path, sizeof path, "%s/samples.jsonl", cfg->run.output_dir);
    if (unlink(path) != 0 && errno != ENOENT)
        return sd_err_set(err, "cannot remove '%s': %s", path, strerror(errno));
    if (*removed > 0 && sd_fsync_path(dir, err) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/samples.settings", cfg->run.output_dir);
    return sd_write_file_atomic(path, text, strlen(text), err);
}

int sd_sample_images(const sd_run_config *rc, MPI_Comm comm, int rank, int size,
                     const sd_device_info *dev, int stoppable)
{
    const sd_config *cfg = &rc->cfg;
    const double g_scale = cfg->sample.guidance_scale;
    /* diffusers: do_classifier_free_guidance = guidance_scale > 1 */
    const int guided = g_scale > 1.0;
    sources src;
    sd_t2i g;
    sd_diffusion d;
    sd_sampler s;
    sd_sched_setup ss;
    sd_err err;
    char what[4 * SD_PATH_MAX + 128], dir[SD_PATH_MAX + 16];
    float *uncond = NULL, *unconds = NULL, *cond = NULL, *lat = NULL, *img = NULL;
    uint8_t *rgb = NULL;
    int kind = sd_sampler_kind_from_name(cfg->sample.scheduler), failed, n_mine = 0, keep = 0;
    int64_t n_kept = 0; /* this rank's images kept from a run before (&sample resume) */
    /* stoppable (mode 'sample'): a batch boundary ends the run on SIGUSR1 / SIGTERM (Slurm's
     * warning before the time limit: slurm/sample.sh requeues it, and the rerun keeps the
     * images); the images of a training job's checkpoints are made whole, the training loop
     * stops after them */
    int stop_sig = 0;
    /* test hook: each batch takes this much longer (RANK:MS: one rank), so that a test's signal
     * comes in the middle of the images */
    const long delay_ms = sd_progress_test_delay_ms("SDTRAIN_TEST_SAMPLE_DELAY_MS", rank, rank == 0);
    int sched_file = 0; /* the U-Net's snapshot has scheduler/scheduler_config.json */
    prompt_set ps;
    if (prompts_load(cfg, comm, rank, &ps, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: mode 'sample': %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    const int64_t n_total = (int64_t)ps.n * cfg->sample.images_per_prompt;
    double t0 = sd_time_now();
    float scale;
    /* images per U-Net call: &sample batch_size (0: 8 on a GPU, 1 on the CPU), at most this
     * rank's share (images i = rank, rank + size, ...) */
    const int64_t mine = n_total > rank ? (n_total - rank + size - 1) / size : 0;
    int nb_max = cfg->sample.batch_size > 0 ? (int)cfg->sample.batch_size : dev->use_cuda ? 8 : 1;
    if (nb_max > mine)
        nb_max = mine > 0 ? (int)mine : 1;
    /* images per VAE decode: &sample decode_batch_size (0: the U-Net batch on a GPU, 1 on the
     * CPU), at most the U-Net batch */
    int nd_max = cfg->sample.decode_batch_size > 0 ? (int)cfg->sample.decode_batch_size
                 : dev->use_cuda                   ? nb_max
                                                   : 1;
    if (nd_max > nb_max)
        nd_max = nb_max;

    memset(&g, 0, sizeof g);
    memset(&d, 0, sizeof d);
    memset(&s, 0, sizeof s);
    sd_err_clear(&err);
    failed = kind < 0 && sd_err_set(&err, "&sample scheduler = '%s': expected ddim, pndm, ddpm, "
                                           "euler, euler_a, heun, lms, dpm2, dpm2_a, dpmpp_2m, dpmpp_2m_sde, dpmpp_sde or unipc",
                                     cfg->sample.scheduler);
    /* What to sample from (the U-Net's source, and whether its snapshot has a scheduler config)
     * is rank 0's decision, broadcast: every rank looking for itself could find another source
     * (a stat that fails on one node, a training run beside this job that writes its final
     * weights or moves `latest` between the ranks' looks), and its images would then come from
     * another U-Net or schedule without a word. Reading the parts stays every rank's own. */
    memset(&src, 0, sizeof src);
    if (!failed && rank == 0) {
        failed = resolve_sources(cfg, &src, &err) != 0;
        if (!failed && src.unet_snapshot[0]) {
            char path[SD_PATH_MAX + 64];
            struct stat st;
            snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", src.unet_snapshot);
            sched_file = lstat(path, &st) == 0; /* anything there is read, or refused by name */
        }
    }
    if (sd_agree(comm, failed, &err) != 0) {
        failed = 1;
    } else {
        SD_MPI_CHECK(MPI_Bcast(&src, (int)sizeof src, MPI_BYTE, 0, comm));
        SD_MPI_CHECK(MPI_Bcast(&sched_file, 1, MPI_INT, 0, comm));
    }
    /* the schedule: a snapshot's U-Net samples with its scheduler_config.json, a U-Net we
     * trained with the &diffusion it was trained with; checked before the weights load */
    sd_sched_from_diffusion(&ss, cfg->diffusion.beta_schedule, cfg->diffusion.prediction_type,
                            cfg->diffusion.beta_start, cfg->diffusion.beta_end,
                            cfg->diffusion.num_train_timesteps,
                            cfg->diffusion.rescale_betas_zero_snr);
    if (!failed && sched_file) {
        char path[SD_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", src.unet_snapshot);
        failed = sd_sched_read(&ss, (sd_sampler_kind)kind, path, &err) != 0;
    }
    if (!failed && strcmp(cfg->sample.timestep_spacing, "auto") != 0)
        ss.spacing = (sd_spacing)sd_spacing_from_name(cfg->sample.timestep_spacing);
    /* sd_config_validate refused these &sample options for the samplers without them (its list
     * of names must be the samplers' own: a mismatch is a bug, not bad input) */
    if (!failed && (cfg->sample.use_karras_sigmas || cfg->sample.use_exponential_sigmas ||
                    cfg->sample.use_beta_sigmas)) {
        SD_CHECK(sd_sampler_takes_sigma_schedule((sd_sampler_kind)kind) &&
                     cfg->sample.use_karras_sigmas + cfg->sample.use_exponential_sigmas +
                             cfg->sample.use_beta_sigmas == 1,
                 "&sample sigma schedule for '%s' passed validation", cfg->sample.scheduler);
        /* the namelist's choice replaces the snapshot config's */
        ss.karras = cfg->sample.use_karras_sigmas;
        ss.expo = cfg->sample.use_exponential_sigmas;
        ss.beta = cfg->sample.use_beta_sigmas;
    }
    if (!failed && cfg->sample.solver_order > 0) { /* the namelist's replaces the config's */
        SD_CHECK(kind == SD_SAMPLER_DPMPP_2M || kind == SD_SAMPLER_DPMPP_2M_SDE ||
                     kind == SD_SAMPLER_UNIPC,
                 "&sample solver_order for '%s' passed validation", cfg->sample.scheduler);
        ss.dpm_order = (int)cfg->sample.solver_order;
    }
    if (!failed)
        failed = sd_sched_diffusion(&ss, &d, &err) != 0;
    if (!failed) { /* the schedule itself, before the weights load */
        failed = make_sampler(&s, kind, &d, cfg, &ss, 1, &err) != 0;
        sd_sampler_free(&s);
    }
    if (!failed)
        failed = load_models(cfg, dev, &src, nb_max, nd_max, &g, what, sizeof what, &err) != 0;
    if (!failed)
        failed = make_sampler(&s, kind, &d, cfg, &ss, (int64_t)nb_max * g.n_latent, &err) != 0;
    if (!failed) {
        snprintf(dir, sizeof dir, "%s/samples", cfg->run.output_dir);
        failed = sd_mkdir_p(dir, "samples directory", &err) != 0;
    }
    /* resuming: rank 0 compares this run's settings with those of the images there, before any
     * rank writes one */
    if (!failed && rank == 0) {
        char *text = settings_text(rc, &ps, &src, &g, nb_max, nd_max, dev->use_cuda);
        char why[SD_PATH_MAX + 400];
        int64_t removed = 0;
        failed = settings_begin(cfg, text, dir, &keep, &removed, why, sizeof why, &err) != 0;
        free(text);
        if (!failed && removed > 0)
            sd_info("removed the %lld image(s) in %s: %s", (long long)removed, dir, why);
    }
    if (sd_agree(comm, failed, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: mode 'sample': %s\n", err.msg);
        sd_sampler_free(&s);
        sd_diffusion_free(&d);
        sd_t2i_close(&g);
        prompts_free(&ps);
        return SD_EXIT_USAGE;
    }
    SD_MPI_CHECK(MPI_Bcast(&keep, 1, MPI_INT, 0, comm));
    scale = (float)(cfg->train.latent_scale > 0 ? cfg->train.latent_scale : g.vcfg.scaling_factor);
    if (rank == 0) {
        char extra[192] = "";
        if (kind == SD_SAMPLER_DDIM && cfg->sample.eta > 0)
            snprintf(extra, sizeof extra, ", eta %g", cfg->sample.eta);
        if (guided && cfg->sample.guidance_rescale > 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     ", guidance_rescale %g", cfg->sample.guidance_rescale);
        if (ss.sigma_min)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", final sigma_min");
        if (ss.pndm_prk)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     ", Runge-Kutta warm-up (skip_prk_steps false)");
        if ((kind == SD_SAMPLER_DPMPP_2M || kind == SD_SAMPLER_DPMPP_2M_SDE) &&
            (ss.dpm_order != 2 || ss.dpm_heun || !ss.lower_order_final || ss.euler_at_final))
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra),
                     ", solver_order %d, %s%s%s", ss.dpm_order, ss.dpm_heun ? "heun" : "midpoint",
                     ss.lower_order_final ? "" : ", no lower_order_final",
                     ss.euler_at_final ? ", euler_at_final" : "");
        sd_info("sampling %lld image(s) (%d prompt(s) x %lld) at %dx%d px with %s, %lld steps (%d "
                "U-Net calls per image, '%s' spacing%s%s), guidance %g%s, seed %lld, on %d "
                "rank(s), %s in %s; %s; schedule from %s (%s, %s %g..%g over %d, steps_offset "
                "%d%s%s%s%s); latents / %g before decoding", (long long)n_total,
                ps.n, (long long)cfg->sample.images_per_prompt, g.width,
                g.height, cfg->sample.scheduler,
                (long long)cfg->sample.num_steps, s.n_timesteps, sd_spacing_name(ss.spacing),
                ss.karras ? ", Karras sigmas" : ss.expo ? ", exponential sigmas" : ss.beta ? ", beta sigmas" : "", extra,
                g_scale, guided ? "" : " (no unconditional pass)",
                (long long)cfg->run.seed, size, g.be->name, sd_dtype_name(g.be->dtype), what,
                ss.source, ss.prediction, ss.schedule, ss.beta_start, ss.beta_end, ss.T,
                ss.steps_offset, ss.set_alpha_to_one ? ", set_alpha_to_one" : "",
                ss.zero_snr ? ", zero terminal SNR" : "",
                ss.adjusted[0] ? "; as StableDiffusionPipeline: " : "", ss.adjusted,
                (double)scale);
    }
    if (rank == 0 && kind != SD_SAMPLER_DDIM && cfg->sample.eta > 0)
        sd_warn("&sample eta = %g is not used: only scheduler = 'ddim' takes it (as in diffusers)",
                cfg->sample.eta);
    if (rank == 0 && !guided && cfg->sample.guidance_rescale > 0)
        sd_warn("&sample guidance_rescale = %g is not used: guidance_scale %g <= 1 (as in "
                "diffusers)", cfg->sample.guidance_rescale, g_scale);
    g.guidance_rescale = cfg->sample.guidance_rescale;

    if (rank == 0)
        sd_info("%d image(s) per denoising call (&sample batch_size %lld%s): a U-Net batch of %d; "
                "%d per VAE decode call", nb_max, (long long)cfg->sample.batch_size,
                cfg->sample.batch_size ? "" : dev->use_cuda ? ": 8 on a GPU" : ": 1 on the CPU",
                guided ? 2 * nb_max : nb_max, nd_max);
    if (rank == 0)
        warn_prompts(g.tok, "prompts", ps.text, ps.n, ps.line, cfg->sample.prompts_file);
    if (rank == 0 && ps.n_neg > 0 && !guided)
        sd_warn("&sample negative_prompts are not used: guidance_scale %g <= 1 makes no "
                "unconditional pass (as in diffusers)", g_scale);
    if (rank == 0 && guided)
        warn_prompts(g.tok, "negative_prompts", ps.neg, ps.n_neg, NULL, NULL);
    cond = sd_xmalloc((size_t)nb_max * (size_t)g.n_emb * sizeof *cond);
    lat = sd_xmalloc((size_t)nb_max * (size_t)g.n_latent * sizeof *lat);
    img = sd_xmalloc((size_t)nd_max * (size_t)g.n_image * sizeof *img);
    rgb = sd_xmalloc((size_t)g.n_image);
    failed = 0;
    if (guided) {
        /* the unconditional half: the empty prompt, or the one negative prompt of every image
         * (encoded once here), or each prompt's own (encoded with its prompt, below) */
        uncond = sd_xmalloc((size_t)g.n_emb * sizeof *uncond);
        unconds = sd_xmalloc((size_t)nb_max * (size_t)g.n_emb * sizeof *unconds);
        if (ps.n_neg <= 1)
            failed = sd_t2i_encode(&g, ps.n_neg ? ps.neg[0] : "", NULL, uncond, &err) != 0;
    }
    /* Image i = p * images_per_prompt + j goes to rank i mod size: a fixed assignment, and each
     * image depends on (seed, p, j) only, so the files do not depend on the rank count (nor, on
     * the CPU, on batch_size). A rank denoises its images nb_max at a time, in order. */
    {
        noise_ctx nc[256];
        void *users[256];
        int64_t ids[256];
        int last_p = -1;
        float *last_cond = sd_xmalloc((size_t)g.n_emb * sizeof *last_cond);
        SD_CHECK(nb_max <= 256, "batch_size %d", nb_max);
        for (int64_t i0 = rank; i0 < n_total && !failed; i0 += (int64_t)nb_max * size) {
            int nb = 0;
            double ti = sd_time_now();
            sd_progress_phase("sampling: the batch of images from image", i0);
            if (delay_ms > 0)
                sd_progress_sleep_ms(delay_ms);
            if (stoppable && (stop_sig = sd_ckpt_signal_pending()) != 0)
                break;
            for (int64_t i = i0; i < n_total && nb < nb_max; i += size)
                ids[nb++] = i;
            if (keep) { /* a batch whose images are all there and whole is not made again */
                int whole = 1;
                for (int b = 0; b < nb && whole; b++) {
                    char file[SD_PATH_MAX + 64];
                    snprintf(file, sizeof file, "%s/%d-%" PRId64 ".png", dir,
                             (int)(ids[b] / cfg->sample.images_per_prompt),
                             ids[b] % cfg->sample.images_per_prompt);
                    whole = png_whole(file, g.width, g.height);
                }
                if (whole) {
                    n_kept += nb;
                    continue;
                }
            }
            /* SDTRAIN_FAULT hang:rank=R:step=I: the rank stops making progress at image I */
            for (int b = 0; stoppable && b < nb; b++)
                if (sd_fault_armed(SD_FAULT_HANG, rank, ids[b], NULL))
                    sd_fault_hang(rank, "sampling, image", ids[b]);
            for (int b = 0; b < nb && !failed; b++) {
                const int p = (int)(ids[b] / cfg->sample.images_per_prompt);
                const int64_t j = ids[b] % cfg->sample.images_per_prompt;
                float *cb = cond + (size_t)b * (size_t)g.n_emb;
                nc[b] = (noise_ctx){(uint64_t)cfg->run.seed, (uint64_t)j, (uint64_t)p, g.lc, g.lh,
                                    g.lw, 0};
                users[b] = &nc[b];
                /* one text-encoder pass per prompt change (images come prompt by prompt) */
                if (p != last_p) {
                    failed = sd_t2i_encode(&g, ps.text[p], NULL, last_cond, &err) != 0;
                    if (!failed && guided && ps.n_neg > 1)
                        failed = sd_t2i_encode(&g, ps.neg[p], NULL, uncond, &err) != 0;
                    last_p = p;
                }
                memcpy(cb, last_cond, (size_t)g.n_emb * sizeof *cb);
                if (guided)
                    memcpy(unconds + (size_t)b * (size_t)g.n_emb, uncond,
                           (size_t)g.n_emb * sizeof *unconds);
                if (!failed)
                    failed = sd_sampler_normals_nhwc(nc[b].seed, SD_SAMPLER_RNG_INIT,
                                                     nc[b].image, nc[b].prompt, 0, g.lc, g.lh,
                                                     g.lw, lat + (size_t)b * (size_t)g.n_latent,
                                                     &err) != 0;
                /* prepare_latents: latents * init_noise_sigma (1 but for Euler) */
                for (int64_t e = 0; e < g.n_latent; e++)
                    lat[(size_t)b * (size_t)g.n_latent + (size_t)e] *= s.init_noise_sigma;
            }
            if (failed)
                break;
            if (s.n != (int64_t)nb * g.n_latent) { /* the last, smaller batch */
                sd_sampler_free(&s);
                SD_CHECK(make_sampler(&s, kind, &d, cfg, &ss, (int64_t)nb * g.n_latent,
                                      &err) == 0, "%s", err.msg);
            }
            sd_t2i_denoise_batch(&g, &s, nb, cond, guided ? unconds : NULL, g_scale, lat,
                                 step_noise, users);
            for (int b = 0; b < nb && !failed; b++) {
                const int p = (int)(ids[b] / cfg->sample.images_per_prompt);
                const int64_t j = ids[b] % cfg->sample.images_per_prompt;
                char file[SD_PATH_MAX + 64];
                if (nc[b].failed) {
                    failed = sd_err_set(&err, "step noise of image %lld beyond the RNG limits",
                                        (long long)ids[b]) != 0;
                    break;
                }
                /* the VAE decodes nd_max images a call; image b is then taken from img */
                if (b % nd_max == 0)
                    sd_t2i_decode_batch(&g, nb - b < nd_max ? nb - b : nd_max,
                                        lat + (size_t)b * (size_t)g.n_latent, scale, img);
                sd_image_to_u8(g.n_image, img + (size_t)(b % nd_max) * (size_t)g.n_image, rgb);
                snprintf(file, sizeof file, "%s/%d-%" PRId64 ".png", dir, p, j);
                if (sd_image_write_png(file, rgb, g.width, g.height, &err)) {
                    failed = 1;
                    break;
                }
                n_mine++;
                sd_debug("wrote %s", file);
                /* SDTRAIN_FAULT usr1:rank=R:step=I: SIGUSR1 once image I is written */
                if (stoppable && sd_fault_armed(SD_FAULT_USR1, rank, ids[b], NULL))
                    raise(SIGUSR1);
            }
            sd_debug("%d image(s) in %.2f s", nb, sd_time_now() - ti);
        }
        free(last_cond);
    }
    int any_stop = 0;
    if (sd_agree(comm, failed, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "sdtrain: mode 'sample': %s\n", err.msg);
        failed = 1;
    } else {
        SD_MPI_CHECK(MPI_Allreduce(&stop_sig, &any_stop, 1, MPI_INT, MPI_MAX, comm));
    }
    if (!failed && any_stop) {
        /* a rank stopped for a signal: no samples.jsonl (the images are not all there) */
        int64_t made = 0, kept = 0, mine_made = n_mine;
        SD_MPI_CHECK(MPI_Reduce(&mine_made, &made, 1, MPI_INT64_T, MPI_SUM, 0, comm));
        SD_MPI_CHECK(MPI_Reduce(&n_kept, &kept, 1, MPI_INT64_T, MPI_SUM, 0, comm));
        if (rank == 0)
            sd_info("stopped for %s: %lld of the %lld image(s) are in %s (%lld made now, %lld "
                    "kept), and a rerun with the same settings goes on from them (&sample resume)",
                    sd_ckpt_signal_name(any_stop), (long long)(made + kept), (long long)n_total,
                    dir, (long long)made, (long long)kept);
    } else if (!failed) {
        int bad = rank == 0 &&
                  write_index(cfg, &ps, cfg->sample.scheduler, sd_spacing_name(ss.spacing), &err) != 0;
        if (bad)
            fprintf(stderr, "sdtrain: mode 'sample': %s\n", err.msg);
        sd_err e2;
        failed = sd_agree(comm, bad, &e2) != 0;
    }
    if (!failed && !any_stop) {
        int64_t kept = 0;
        SD_MPI_CHECK(MPI_Reduce(&n_kept, &kept, 1, MPI_INT64_T, MPI_SUM, 0, comm));
        if (rank == 0 && kept > 0)
            sd_info("kept %lld of the %lld image(s) from the run before (the same settings: "
                    "%s/samples.settings; &sample resume = 'never' makes them again)",
                    (long long)kept, (long long)n_total, cfg->run.output_dir);
        if (rank == 0)
            sd_info("wrote %lld image(s) to %s and their list to %s/samples.jsonl in %.1f s",
                    (long long)(n_total - kept), dir, cfg->run.output_dir, sd_time_now() - t0);
    }
    sd_debug("this rank made %d of the %lld image(s)", n_mine, (long long)n_total);
    free(uncond);
    free(unconds);
    free(cond);
    free(lat);
    free(img);
    free(rgb);
    sd_sampler_free(&s);
    sd_diffusion_free(&d);
    sd_t2i_close(&g);
    prompts_free(&ps);
    return failed ? SD_EXIT_FAILURE : SD_EXIT_OK;
}

int sd_mode_sample(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev)
{
    sd_ckpt_signals_install();
    return sd_sample_images(rc, MPI_COMM_WORLD, rt->world_rank, rt->world_size, dev, 1);
}
