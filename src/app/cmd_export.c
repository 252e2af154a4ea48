/* sdtool export: a training checkpoint (or a training output's final weights) as a diffusers
 * snapshot that diffusers' from_pretrained and sdtrain's own loaders read (doc/export.md). */
#include "sd_config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/commands.h"
#include "sdtrain/config.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/json_file.h"
#include "sdtrain/models.h"
#include "sdtrain/modes.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/single_file.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/utf8.h"
#include "sdtrain/weights.h"

#define PATH_LEN (SD_PATH_MAX + 256)
#define UNET_WEIGHTS "diffusion_pytorch_model.safetensors"
#define JSON_FLAGS (JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED | JSON_C_TO_STRING_NOSLASHESCAPE)
/* snprintf into a char array; a path beyond PATH_LEN is a bug in the caller's limits */
#define PATHF(buf, ...)                                                                       \
    SD_CHECK(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf), "path too long")

static void export_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool export --from SRC --out DIR [--ema] [--pretrained SNAPSHOT]\n"
            "                     [--nml INPUT.nml] [--single-file FILE] [--force]\n"
            "\n"
            "Writes the trained U-Net as a diffusers snapshot DIR: unet/config.json and\n"
            "unet/diffusion_pytorch_model.safetensors (diffusers names, PyTorch layouts, F32), the\n"
            "noise schedule the run trained with as scheduler/scheduler_config.json, and the\n"
            "other parts (vae, text_encoder, tokenizer, feature_extractor, ... and\n"
            "model_index.json) copied from the pretrained snapshot, so that\n"
            "StableDiffusionPipeline.from_pretrained(DIR) and `&sample checkpoint = DIR` load it.\n"
            "\n"
            "  --from SRC         a checkpoint directory (step-K), a checkpoint root (its `latest`),\n"
            "                     a training output directory (its checkpoints/latest, else\n"
            "                     unet_final.safetensors / unet_ema.safetensors) or a U-Net\n"
            "                     .safetensors file (needs --nml or a used.nml beside it)\n"
            "  --out DIR          the snapshot to write (built in DIR.tmp, then renamed); not\n"
            "                     SRC nor a folder holding it\n"
            "  --ema              export the EMA of the parameters instead of the parameters\n"
            "  --pretrained SNAP  where the other parts come from (default: the run's &model\n"
            "                     pretrained; none: only unet/, scheduler/ and model_index.json)\n"
            "  --nml FILE         the run's namelist (default: the one the checkpoint stores, or\n"
            "                     SRC/used.nml)\n"
            "  --single-file FILE also write the exported snapshot as one checkpoint in the\n"
            "                     original SD layout (as `sdtool single-file`; needs the VAE and\n"
            "                     text encoder of a pretrained snapshot)\n"
            "  --force            replace an existing DIR (and FILE)\n"
            "\n"
            "exit status: 0 done, 1 DIR cannot be written, 2 bad usage or input (missing or\n"
            "corrupt checkpoint, weights that do not fit the configuration).\n");
}

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

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* Reads a small text file (a `latest` pointer, a config.json) into a malloc'ed string. */
static int slurp(const char *path, char **out, sd_err *err)
{
    uint8_t *buf;
    size_t n;
    FILE *f = fopen(path, "rb");
    if (!f)
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (n = (size_t)ftell(f), fseek(f, 0, SEEK_SET)) != 0) {
        fclose(f);
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    }
    buf = sd_xmalloc(n + 1);
    if (n && fread(buf, 1, n, f) != n) {
        fclose(f);
        free(buf);
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    }
    fclose(f);
    buf[n] = '\0';
    *out = (char *)buf;
    return 0;
}

/* What SRC turned out to be. */
typedef struct source {
    char ckpt[PATH_LEN];    /* a checkpoint directory, or "" */
    char weights[PATH_LEN]; /* a U-Net safetensors file (diffusers names), or "" */
    char nml[PATH_LEN];     /* the namelist to read the configuration from, or "" (manifest) */
} source;

/* The checkpoint a root's `latest` names into out; 1 when root has no `latest`. */
static int latest_of(const char *root, char *out, size_t size, sd_err *err)
{
    char p[PATH_LEN], *name;
    size_t n;
    PATHF(p, "%s/%s", root, SD_CKPT_LATEST);
    if (!is_file(p))
        return 1;
    if (slurp(p, &name, err))
        return -1;
    n = strlen(name);
    while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == ' '))
        name[--n] = '\0';
    snprintf(out, size, "%s/%s", root, name);
    if (!n || strchr(name, '/') || !is_dir(out)) {
        sd_err_set(err, "%s names '%s', which is not a checkpoint directory in %s", p, name, root);
        free(name);
        return -1;
    }
    free(name);
    return 0;
}

static int resolve_source(const char *src, int ema, const char *nml, source *s, sd_err *err)
{
    char p[PATH_LEN];
    int rc;
    memset(s, 0, sizeof *s);
    if (nml)
        snprintf(s->nml, sizeof s->nml, "%s", nml);
    if (!exists(src))
        return sd_err_set(err, "--from %s: no such file or directory", src);
    if (is_file(src)) {
        snprintf(s->weights, sizeof s->weights, "%s", src);
        if (!nml) {
            const char *slash = strrchr(src, '/');
            PATHF(p, "%.*s/used.nml", slash ? (int)(slash - src) : 1,
                     slash ? src : ".");
            if (!is_file(p))
                return sd_err_set(err, "--from %s is a weight file and %s does not exist: give "
                                       "the run's namelist with --nml", src, p);
            snprintf(s->nml, sizeof s->nml, "%s", p);
        }
        return 0;
    }
    PATHF(p, "%s/%s", src, SD_CKPT_MANIFEST);
    if (is_file(p)) {
        snprintf(s->ckpt, sizeof s->ckpt, "%s", src);
        return 0;
    }
    rc = latest_of(src, s->ckpt, sizeof s->ckpt, err);
    if (rc <= 0)
        return rc;
    /* a training output directory: its checkpoints, else its final weights */
    PATHF(p, "%s/used.nml", src);
    if (!nml && is_file(p))
        snprintf(s->nml, sizeof s->nml, "%s", p);
    {
        char root[PATH_LEN];
        sd_run_checkpoint_root(src, s->nml[0] ? s->nml : NULL, root, sizeof root);
        rc = latest_of(root, s->ckpt, sizeof s->ckpt, err);
        if (rc <= 0) {
            if (rc == 0 && !nml)
                s->nml[0] = '\0'; /* the checkpoint's own configuration */
            return rc;
        }
    }
    PATHF(p, "%s/%s", src, ema ? "unet_ema.safetensors" : "unet_final.safetensors");
    if (!is_file(p))
        return sd_err_set(err, "--from %s: not a checkpoint directory (no %s), not a checkpoint "
                               "root (no %s) and not a training output directory with "
                               "checkpoints/%s or %s",
                          src, SD_CKPT_MANIFEST, SD_CKPT_LATEST, SD_CKPT_LATEST, p);
    if (!s->nml[0])
        return sd_err_set(err, "--from %s: %s has no used.nml beside it: give the run's namelist "
                               "with --nml", src, p);
    snprintf(s->weights, sizeof s->weights, "%s", p);
    return 0;
}

static void add_pair(json_object *o, const char *key, const char *lib, const char *cls)
{
    json_object *a = json_object_new_array();
    json_object_array_add(a, lib ? json_object_new_string(lib) : NULL);
    json_object_array_add(a, cls ? json_object_new_string(cls) : NULL);
    json_object_object_add(o, key, a);
}

static int listed(json_object *index, const char *key)
{
    json_object *v;
    return json_object_object_get_ex(index, key, &v) && json_object_is_type(v, json_type_array) &&
           json_object_array_length(v) == 2 &&
           !json_object_is_type(json_object_array_get_idx(v, 1), json_type_null);
}

/* The scheduler the run trained with, as diffusers' PNDMScheduler config with Stable
 * Diffusion's conventions (what mode 'sample' assumes for &diffusion). */
static int write_scheduler(const char *tmp, const sd_config *cfg, sd_err *err)
{
    char p[PATH_LEN];
    json_object *o = json_object_new_object();
    const char *text;
    int rc;
    PATHF(p, "%s/scheduler", tmp);
    if (sd_mkdir_p(p, "directory", err)) {
        json_object_put(o);
        return -1;
    }
    const int zsnr = cfg->diffusion.rescale_betas_zero_snr;
    /* zero terminal SNR: PNDMScheduler has no rescale_betas_zero_snr (diffusers would load it
     * and sample another schedule), DDIMScheduler has; with 'trailing' spacing, whose first
     * step is the pure-noise timestep T - 1 */
    json_object_object_add(o, "_class_name",
                           json_object_new_string(zsnr ? "DDIMScheduler" : "PNDMScheduler"));
    json_object_object_add(o, "_diffusers_version", json_object_new_string("0.42.1"));
    json_object_object_add(o, "beta_end", json_object_new_double(cfg->diffusion.beta_end));
    json_object_object_add(o, "beta_schedule",
                           json_object_new_string(cfg->diffusion.beta_schedule));
    json_object_object_add(o, "beta_start", json_object_new_double(cfg->diffusion.beta_start));
    json_object_object_add(o, "clip_sample", json_object_new_boolean(0));
    json_object_object_add(o, "num_train_timesteps",
                           json_object_new_int64(cfg->diffusion.num_train_timesteps));
    json_object_object_add(o, "prediction_type",
                           json_object_new_string(cfg->diffusion.prediction_type));
    if (zsnr)
        json_object_object_add(o, "rescale_betas_zero_snr", json_object_new_boolean(1));
    json_object_object_add(o, "set_alpha_to_one", json_object_new_boolean(0));
    if (!zsnr)
        json_object_object_add(o, "skip_prk_steps", json_object_new_boolean(1));
    json_object_object_add(o, "steps_offset", json_object_new_int(1));
    json_object_object_add(o, "timestep_spacing",
                           json_object_new_string(zsnr ? "trailing" : "leading"));
    json_object_object_add(o, "trained_betas", NULL);
    text = json_object_to_json_string_ext(o, JSON_FLAGS);
    PATHF(p, "%s/scheduler/scheduler_config.json", tmp);
    rc = sd_write_file_atomic(p, text, strlen(text), err);
    json_object_put(o);
    return rc;
}

/* o[key] = value (taken over), its name appended to the list `changed` unless o had it already. */
static void fit_key(json_object *o, const char *key, json_object *value, char *changed,
                    size_t size)
{
    json_object *v;
    const size_t n = strlen(changed);
    if (json_object_object_get_ex(o, key, &v) && json_object_equal(v, value)) {
        json_object_put(value);
        return;
    }
    json_object_object_add(o, key, value);
    snprintf(changed + n, size - n, "%s%s", n ? ", " : "", key);
}

/* The snapshot's scheduler config copied to tmp/scheduler, with the schedule the run trained
 * with: &diffusion's keys replace the snapshot's (a v-prediction fine-tune of an epsilon snapshot
 * must not be sampled as epsilon); its class and other options (steps_offset, timestep_spacing,
 * ...) stay. 1 when the copy cannot be read as a JSON object (the caller writes it from
 * &diffusion), 0 done, -1 error. */
static int fit_scheduler(const char *tmp, const char *pre, const sd_config *cfg, sd_err *err)
{
    char p[PATH_LEN], changed[256] = "";
    json_object *o, *v;
    sd_err e2;
    const char *text;
    int rc;
    PATHF(p, "%s/scheduler/scheduler_config.json", tmp);
    if (sd_json_read_object(p, &o, &e2)) {
        fprintf(stderr, "sdtool export: warning: %s/scheduler/scheduler_config.json: %s: "
                        "scheduler/ written from &diffusion instead\n", pre, e2.msg);
        return 1;
    }
    fit_key(o, "prediction_type", json_object_new_string(cfg->diffusion.prediction_type),
            changed, sizeof changed);
    fit_key(o, "beta_schedule", json_object_new_string(cfg->diffusion.beta_schedule), changed,
            sizeof changed);
    fit_key(o, "beta_start", json_object_new_double(cfg->diffusion.beta_start), changed,
            sizeof changed);
    fit_key(o, "beta_end", json_object_new_double(cfg->diffusion.beta_end), changed,
            sizeof changed);
    fit_key(o, "num_train_timesteps", json_object_new_int64(cfg->diffusion.num_train_timesteps),
            changed, sizeof changed);
    /* the run's betas come from beta_schedule; zero terminal SNR is written whole elsewhere */
    if (json_object_object_get_ex(o, "trained_betas", &v) && v)
        fit_key(o, "trained_betas", NULL, changed, sizeof changed);
    if (json_object_object_get_ex(o, "rescale_betas_zero_snr", &v))
        fit_key(o, "rescale_betas_zero_snr", json_object_new_boolean(0), changed, sizeof changed);
    if (changed[0])
        fprintf(stderr, "sdtool export: scheduler/scheduler_config.json: copied from %s with the "
                        "run's &diffusion for %s\n", pre, changed);
    text = json_object_to_json_string_ext(o, JSON_FLAGS);
    rc = sd_write_file_atomic(p, text, strlen(text), err);
    json_object_put(o);
    return rc;
}

/* Everything but the U-Net: copied from the snapshot `pre` ("" = none), the scheduler's config
 * given the run's &diffusion (fit_scheduler) or written from it when the snapshot has none, the
 * tokenizer from &model tokenizer when that is a folder and the snapshot has none; then
 * model_index.json. */
static int write_other_parts(const char *tmp, const char *pre, const sd_config *cfg,
                             const char *provenance, sd_err *err)
{
    static const char *const known[] = {"vae", "text_encoder", "tokenizer", "scheduler",
                                        "feature_extractor", "safety_checker", NULL};
    char a[PATH_LEN], b[PATH_LEN];
    json_object *index = NULL;
    const char *text;
    int rc = 0;
    if (pre[0]) {
        PATHF(a, "%s/model_index.json", pre);
        if (is_file(a) && sd_json_read_object(a, &index, err) != 0)
            return -1;
    }
    if (!index) {
        index = json_object_new_object();
        json_object_object_add(index, "_class_name",
                               json_object_new_string("StableDiffusionPipeline"));
        json_object_object_add(index, "_diffusers_version", json_object_new_string("0.42.1"));
        if (pre[0]) /* a snapshot without model_index.json: the folders it has */
            for (int i = 0; known[i]; i++) {
                PATHF(a, "%s/%s", pre, known[i]);
                if (!is_dir(a))
                    continue;
                if (!strcmp(known[i], "vae"))
                    add_pair(index, "vae", "diffusers", "AutoencoderKL");
                else if (!strcmp(known[i], "text_encoder"))
                    add_pair(index, "text_encoder", "transformers", "CLIPTextModel");
                else if (!strcmp(known[i], "tokenizer"))
                    add_pair(index, "tokenizer", "transformers", "CLIPTokenizer");
                else if (!strcmp(known[i], "scheduler"))
                    add_pair(index, "scheduler", "diffusers", "PNDMScheduler");
                else if (!strcmp(known[i], "feature_extractor"))
                    add_pair(index, "feature_extractor", "transformers", "CLIPImageProcessor");
            }
    }
    /* copy every listed part but the U-Net; a listed part that is missing becomes null */
    {
        json_object_object_foreach(index, key, val)
        {
            (void)val;
            if (key[0] == '_' || !strcmp(key, "unet") || !listed(index, key))
                continue;
            PATHF(a, "%s/%s", pre, key);
            PATHF(b, "%s/%s", tmp, key);
            if (is_dir(a)) {
                if ((rc = sd_copy_tree(a, b, err)) != 0)
                    break;
            } else {
                fprintf(stderr, "sdtool export: warning: %s/model_index.json lists '%s', but %s "
                                "does not exist: left out\n", pre, key, a);
                add_pair(index, key, NULL, NULL);
            }
        }
    }
    if (!rc && listed(index, "scheduler") && cfg->diffusion.rescale_betas_zero_snr) {
        fprintf(stderr, "sdtool export: the run trained with zero terminal SNR: scheduler/ "
                        "written from &diffusion (DDIMScheduler, rescale_betas_zero_snr, "
                        "'trailing'), not copied from %s\n", pre);
        add_pair(index, "scheduler", NULL, NULL); /* written below */
    } else if (!rc && listed(index, "scheduler")) {
        rc = fit_scheduler(tmp, pre, cfg, err);
        if (rc == 1) {
            add_pair(index, "scheduler", NULL, NULL); /* written below */
            rc = 0;
        }
    }
    if (!rc && !listed(index, "scheduler")) {
        rc = write_scheduler(tmp, cfg, err);
        add_pair(index, "scheduler", "diffusers",
                 cfg->diffusion.rescale_betas_zero_snr ? "DDIMScheduler" : "PNDMScheduler");
    }
    if (!rc && !listed(index, "tokenizer") && is_dir(cfg->model.tokenizer) && pre[0]) {
        PATHF(b, "%s/tokenizer", tmp);
        rc = sd_copy_tree(cfg->model.tokenizer, b, err);
        add_pair(index, "tokenizer", "transformers", "CLIPTokenizer");
    }
    if (rc) {
        json_object_put(index);
        return -1;
    }
    add_pair(index, "unet", "diffusers", "UNet2DConditionModel");
    for (int i = 0; known[i]; i++) {
        json_object *v;
        if (!json_object_object_get_ex(index, known[i], &v))
            add_pair(index, known[i], NULL, NULL);
    }
    if (!json_object_object_get_ex(index, "requires_safety_checker", NULL))
        json_object_object_add(index, "requires_safety_checker", json_object_new_boolean(0));
    {
        /* paths are bytes, JSON text is UTF-8: ill-formed parts become U+FFFD (json-c would
         * copy them, and model_index.json would not be JSON) */
        char *fixed = sd_xmalloc(3 * strlen(provenance) + 1);
        sd_utf8_repair(provenance, strlen(provenance), fixed, NULL);
        json_object_object_add(index, "_sdtrain_export", json_object_new_string(fixed));
        free(fixed);
    }
    text = json_object_to_json_string_ext(index, JSON_FLAGS);
    PATHF(b, "%s/model_index.json", tmp);
    rc = sd_write_file_atomic(b, text, strlen(text), err);
    json_object_put(index);
    return rc;
}

/* The U-Net's config.json: the snapshot's when the run trained from one (copied as it is),
 * else built from the &model shape keys. */
static int unet_config(const sd_config *cfg, const char *pre_opt, sd_unet_config *uc, char **json,
                       char *from, size_t from_size, sd_err *err)
{
    const char *snaps[2] = {cfg->model.pretrained, pre_opt ? pre_opt : ""};
    *json = NULL;
    if (!cfg->model.pretrained[0]) {
        sd_unet_config_from_namelist(cfg, uc);
        *json = sd_unet_config_to_json(uc);
        snprintf(from, from_size, "the &model shape keys");
        return 0;
    }
    for (int i = 0; i < 2; i++) {
        sd_snapshot s;
        sd_err e;
        char dir[PATH_LEN], conf[PATH_LEN + 16];
        if (!snaps[i][0] || sd_snapshot_open(&s, snaps[i], &e))
            continue;
        if (sd_snapshot_component_dir(&s, SD_COMPONENT_UNET, dir, sizeof dir, &e)) {
            sd_snapshot_close(&s);
            continue;
        }
        sd_snapshot_close(&s);
        PATHF(conf, "%s/config.json", dir);
        if (!is_file(conf))
            continue;
        if (sd_unet_config_load(conf, uc, err) || slurp(conf, json, err))
            return -1;
        SD_CHECK(snprintf(from, from_size, "%s", conf) < (int)from_size, "path too long");
        return 0;
    }
    return sd_err_set(err, "the run trained from &model pretrained = '%s', whose unet/config.json "
                           "(the U-Net's configuration) is not there%s: give the snapshot with "
                           "--pretrained", cfg->model.pretrained,
                      pre_opt ? " and --pretrained has none either" : "");
}

int sd_cmd_export(int argc, char **argv)
{
    const char *from = NULL, *out = NULL, *pre_opt = NULL, *nml = NULL, *single = NULL;
    int ema = 0, force = 0, code = SD_EXIT_USAGE;
    sd_err err;
    source src;
    sd_run_config rc;
    sd_unet_config uc;
    sd_param_table table;
    sd_weights w;
    sd_ckpt_info info;
    char *config_json = NULL, conf_from[PATH_LEN], tmp[PATH_LEN], p[PATH_LEN], what[PATH_LEN];
    char provenance[3 * PATH_LEN];
    const char *pre;
    int have_rc = 0, have_w = 0;

    for (int i = 1; i < argc; i++) {
        const char **slot = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            export_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(argv[i], "--ema")) {
            ema = 1;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (!strcmp(argv[i], "--from")) {
            slot = &from;
        } else if (!strcmp(argv[i], "--out")) {
            slot = &out;
        } else if (!strcmp(argv[i], "--pretrained")) {
            slot = &pre_opt;
        } else if (!strcmp(argv[i], "--nml")) {
            slot = &nml;
        } else if (!strcmp(argv[i], "--single-file")) {
            slot = &single;
        } else {
            fprintf(stderr, "sdtool export: unknown argument '%s'\n", argv[i]);
            export_usage(stderr);
            return SD_EXIT_USAGE;
        }
        if (slot) {
            if (i + 1 >= argc || !argv[i + 1][0]) {
                fprintf(stderr, "sdtool export: %s needs a value\n", argv[i]);
                return SD_EXIT_USAGE;
            }
            *slot = argv[++i];
        }
    }
    if (!from || !out) {
        fprintf(stderr, "sdtool export: --from and --out are required\n");
        export_usage(stderr);
        return SD_EXIT_USAGE;
    }
    {
        size_t n = strlen(out);
        while (n > 1 && out[n - 1] == '/')
            n--;
        PATHF(tmp, "%.*s.tmp", (int)n, out);
    }
    if (exists(out) && !force) {
        fprintf(stderr, "sdtool export: %s already exists (give --force to replace it)\n", out);
        return SD_EXIT_USAGE;
    }
    if (single && exists(single) && !force) {
        fprintf(stderr, "sdtool export: %s already exists (give --force to replace it)\n", single);
        return SD_EXIT_USAGE;
    }
    memset(&w, 0, sizeof w);
    memset(&info, 0, sizeof info);
    sd_run_config_init(&rc);
    have_rc = 1;

    /* the source and the run's configuration */
    if (resolve_source(from, ema, nml, &src, &err))
        goto bad;
    /* DIR.tmp is removed and DIR replaced: neither may be or hold what is read (inside it is
     * fine: runs/x/export) */
    {
        const char *inputs[4] = {from, src.ckpt, src.weights, src.nml};
        for (int i = 0; i < 4; i++)
            if (inputs[i][0] && (sd_path_within(inputs[i], out) || sd_path_within(inputs[i], tmp))) {
                sd_err_set(&err, "--out %s would replace the source %s (or a folder holding "
                                 "it): give another folder", out, inputs[i]);
                goto bad;
            }
    }
    if (src.ckpt[0] && !src.nml[0]) {
        if (sd_ckpt_peek(src.ckpt, &info, &err))
            goto bad;
        if (sd_config_from_text(&rc, info.config_text, strlen(info.config_text), &err) ||
            sd_config_validate(&rc, &err)) {
            char m[sizeof err.msg];
            snprintf(m, sizeof m, "%s", err.msg);
            sd_err_set(&err, "%s/%s: the stored configuration: %s", src.ckpt, SD_CKPT_MANIFEST, m);
            sd_ckpt_info_free(&info);
            goto bad;
        }
        sd_ckpt_info_free(&info);
    } else if (sd_config_load(&rc, src.nml, 0, NULL, &err)) {
        goto bad;
    }
    if (unet_config(&rc.cfg, pre_opt, &uc, &config_json, conf_from, sizeof conf_from, &err))
        goto bad;
    memset(&table, 0, sizeof table);
    sd_unet_params(&uc, &table);
    sd_weights_init(&w, &table);
    have_w = 1;

    /* the weights, checked against that configuration */
    if (src.ckpt[0]) {
        if (sd_ckpt_read_dataset(src.ckpt, &w.table, ema ? "ema" : "params", w.data, &info, &err))
            goto bad;
        PATHF(what, "step %lld (%s) of checkpoint %s", (long long)info.s.step,
                 ema ? "EMA" : "parameters", src.ckpt);
        sd_ckpt_info_free(&info);
    } else {
        sd_st_set set;
        if (sd_st_set_open_file(&set, src.weights, &err))
            goto bad;
        if (sd_weights_load(&w, &set, &err)) {
            sd_st_set_close(&set);
            goto bad;
        }
        sd_st_set_close(&set);
        PATHF(what, "%s", src.weights);
    }
    pre = pre_opt ? pre_opt : rc.cfg.model.pretrained;
    if (pre[0] && !is_dir(pre)) {
        sd_err_set(&err, "%s %s: no such snapshot folder (the other parts of the pipeline come "
                         "from it)", pre_opt ? "--pretrained" : "&model pretrained =", pre);
        goto bad;
    }

    if (pre[0] && (sd_path_within(pre, out) || sd_path_within(pre, tmp))) {
        sd_err_set(&err, "--out %s would replace the pretrained snapshot %s that the other parts "
                         "come from: give another folder", out, pre);
        goto bad;
    }
    if (single) {
        /* the file written may not be one that is read, nor lie in the checkpoint or snapshot read */
        const char *inputs[5] = {from, src.ckpt, src.weights, src.nml, pre};
        for (int i = 0; i < 5; i++)
            if (inputs[i][0] && (sd_same_file(single, inputs[i]) ||
                                 (i != 0 && i != 3 && sd_path_within(single, inputs[i])))) {
                sd_err_set(&err, "--single-file %s would overwrite %s, which the export reads: "
                                 "give another file", single, inputs[i]);
                goto bad;
            }
    }
    if (single && !pre[0]) {
        sd_err_set(&err, "--single-file %s needs the VAE and text encoder of a pretrained "
                         "snapshot, and the run has none: give --pretrained SNAPSHOT", single);
        goto bad;
    }

    /* DIR.tmp, then the rename */
    code = SD_EXIT_FAILURE;
    PATHF(p, "%s/unet", tmp);
    if (sd_remove_tree(tmp, &err) || sd_mkdir_p(p, "directory", &err))
        goto fail;
    PATHF(p, "%s/unet/config.json", tmp);
    if (sd_write_file_atomic(p, config_json, strlen(config_json), &err))
        goto fail;
    PATHF(p, "%s/unet/%s", tmp, UNET_WEIGHTS);
    if (sd_weights_save_torch(&w.table, w.data, p, &err))
        goto fail;
    snprintf(provenance, sizeof provenance,
             "exported by sdtool export from %s; unet config from %s; other parts %s%s", what,
             conf_from, pre[0] ? "from " : "",
             pre[0] ? pre
                    : "not included (no pretrained snapshot: the run used a VAE and text encoder "
                      "drawn from its seed; see doc/export.md)");
    if (write_other_parts(tmp, pre, &rc.cfg, provenance, &err))
        goto fail;
    if (sd_fsync_path(tmp, &err))
        goto fail;
    if (sd_commit_dir(tmp, out, "sdtool export", &err))
        goto fail;
    printf("exported %s\n  to %s: unet (%zu tensors, %zu parameters; config from %s)%s%s\n", what,
           out, w.table.n, w.table.total_numel, conf_from,
           pre[0] ? ", other parts from " : ", scheduler from &diffusion; no VAE, text encoder or "
                                            "tokenizer (no pretrained snapshot)",
           pre[0] ? pre : "");
    if (single) {
        sd_single_file_info sf;
        char note[3 * PATH_LEN + 64];
        snprintf(note, sizeof note, "written by sdtool export from %s", what);
        /* DIR is complete and stays; a failure here is the file's alone */
        if (sd_single_file_write(out, single, SD_ST_F32, note, &sf, &err)) {
            char m[sizeof err.msg];
            snprintf(m, sizeof m, "%s", err.msg);
            sd_err_set(&err, "%s was written, but not the single file: %s", out, m);
            code = SD_EXIT_FAILURE;
            fprintf(stderr, "sdtool export: %s\n", err.msg);
            goto done;
        }
        printf("  and %s: one checkpoint in the original layout (%zu + %zu + %zu tensors)\n",
               single, sf.tensors[0], sf.tensors[1], sf.tensors[2]);
    }
    code = SD_EXIT_OK;
    goto done;
bad:
    code = SD_EXIT_USAGE;
fail:
    fprintf(stderr, "sdtool export: %s\n", err.msg);
    if (code == SD_EXIT_FAILURE) {
        sd_err e2;
        sd_remove_tree(tmp, &e2);
        if (err.input) /* a part copied from the snapshot is at fault, not DIR */
            code = SD_EXIT_USAGE;
    }
done:
    free(config_json);
    if (have_w)
        sd_weights_free(&w);
    if (have_rc)
        sd_run_config_free(&rc);
    return code;
}
