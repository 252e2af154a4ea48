/* The typed run configuration and the one schema table that drives parsing, validation,
 * printing, --help and doc/namelist.md. */
#ifndef SDTRAIN_CONFIG_H
#define SDTRAIN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "sdtrain/error.h"
#include "sdtrain/namelist.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_PATH_MAX 4096
#define SD_NAME_MAX 32
#define SD_MAX_BLOCKS 8
#define SD_MAX_PROMPTS 64
#define SD_PROMPT_MAX 1024

typedef struct sd_config {
    struct {
        char mode[SD_NAME_MAX];        /* process | train | pipeline | sample */
        int64_t n_process_ranks;
        char pipeline_end[SD_NAME_MAX]; /* shards | training */
        char device[SD_NAME_MAX];      /* auto | cpu | cuda */
        int64_t seed;
        char output_dir[SD_PATH_MAX];
        char log_level[SD_NAME_MAX];
        char io_hints[SD_PATH_MAX];    /* MPI-IO hints, "key=value, key=value" */
        int64_t io_alignment;          /* bytes; 0 = HDF5's packing */
        double stall_timeout;          /* s: the stall watchdog (sdtrain/progress.h); 0 = off */
    } run;
    struct {
        char pretrained[SD_PATH_MAX];  /* diffusers snapshot directory, '' = none */
        char autoencoder[SD_PATH_MAX]; /* separate VAE directory, '' = <pretrained>/vae */
        char tokenizer[SD_PATH_MAX];   /* tokenizer folder or bpe .gz, '' = <pretrained>/tokenizer */
        char unet_init[SD_NAME_MAX];   /* random | pretrained */
        int64_t resolution;
        int64_t block_out_channels[SD_MAX_BLOCKS];
        int n_block_out_channels;
        int64_t layers_per_block;
        int64_t attention_head_dim[SD_MAX_BLOCKS];
        int n_attention_head_dim;
        int64_t cross_attention_dim;
        int64_t norm_num_groups;
        int64_t latent_channels;
        int64_t vae_block_out_channels[SD_MAX_BLOCKS];
        int n_vae_block_out_channels;
        int64_t text_hidden_size;
        int64_t text_layers;
        int64_t text_heads;
    } model;
    struct {
        char input[SD_PATH_MAX];
        char input_format[SD_NAME_MAX]; /* auto | files | webdataset | tsv */
        char shard_dir[SD_PATH_MAX];
        int64_t samples_per_shard;
        char shard_dtype[SD_NAME_MAX];  /* fp16 | fp32 */
        int64_t max_samples;
        double val_fraction;
        bool exif_transpose;
        char caption_utf8[SD_NAME_MAX];    /* replace | reject */
        char missing_caption[SD_NAME_MAX]; /* skip | empty */
        char alpha[SD_NAME_MAX];           /* drop | white */
        int64_t max_image_pixels;
        int64_t min_image_side;
        char filter[1024];                 /* '' or conditions on the .json (metafilter.h) */
        bool strict_jpeg;
        int64_t encode_batch_size;      /* 0 = 32 on a GPU, 8 on the CPU */
        char encode_precision[SD_NAME_MAX]; /* auto | fp32 | bf16 */
        double shard_wait_timeout;          /* s: mode 'pipeline', the trainers' longest wait */
        bool overlap_writes;                /* write shard k while shard k+1 is encoded */
        int64_t open_shards;                /* training: shards each rank keeps open */
        int64_t shuffle_window;             /* training: 0 global order, W: windows of W shards */
    } data;
    struct {
        int64_t max_steps;
        int64_t batch_size_per_rank;
        int64_t grad_accum_steps;       /* micro-batches per optimizer step */
        double learning_rate;
        char lr_schedule[SD_NAME_MAX];  /* constant | linear | cosine | cosine_with_restarts |
                                           polynomial (after warmup) */
        int64_t warmup_steps;
        int64_t lr_num_cycles;          /* cosine_with_restarts */
        double lr_power;                /* polynomial */
        double weight_decay;
        double adam_beta1;
        double adam_beta2;
        double adam_eps;
        double grad_clip;
        char sharding[SD_NAME_MAX];     /* none | shard_grad_op */
        char grad_reduce[SD_NAME_MAX];  /* auto | overlap | after_backward */
        double grad_bucket_mb;          /* bucket size of the overlapped reduction, MiB */
        char precision[SD_NAME_MAX];    /* fp32 | bf16 */
        double ema_decay;
        int64_t ema_start_step;
        bool recompute_activations;
        bool latent_sample;
        double latent_scale;
        int64_t log_every;
        int64_t val_every;
    } train;
    struct {
        char prediction_type[SD_NAME_MAX]; /* epsilon | v_prediction */
        int64_t num_train_timesteps;
        char beta_schedule[SD_NAME_MAX];   /* scaled_linear | linear | squaredcos_cap_v2 */
        double beta_start;
        double beta_end;
        bool rescale_betas_zero_snr;
        double caption_dropout;
        double min_snr_gamma;
        double noise_offset;
        double input_perturbation;
    } diffusion;
    struct {
        char dir[SD_PATH_MAX];          /* '' = <output_dir>/checkpoints */
        int64_t every_n_steps;
        double every_n_minutes;         /* also after this much training since the last one; 0 = off */
        int64_t keep_last;
        int64_t keep_every_n_steps;     /* milestones: written and never pruned; 0 = none */
        char resume[SD_PATH_MAX];       /* auto | never | path of a checkpoint directory */
        bool verify;                    /* read each checkpoint back before committing it */
        bool async;                     /* periodic checkpoints written in the background */
    } checkpoint;
    struct {
        char prompts[SD_MAX_PROMPTS][SD_PROMPT_MAX];
        int n_prompts;
        char prompts_file[SD_PATH_MAX]; /* one prompt per line, instead of prompts; '' = none */
        char negative_prompts[SD_MAX_PROMPTS][SD_PROMPT_MAX]; /* none, one, or one per prompt */
        int n_negative_prompts;
        int64_t num_steps;
        double guidance_scale;
        char scheduler[SD_NAME_MAX];    /* ddim pndm ddpm euler euler_a heun dpmpp_2m(_sde) unipc */
        char timestep_spacing[SD_NAME_MAX]; /* auto | leading | trailing | linspace */
        bool use_karras_sigmas;         /* euler, dpmpp_2m, dpmpp_2m_sde */
        bool use_exponential_sigmas;    /* the same */
        bool use_beta_sigmas;           /* the same */
        int64_t solver_order;           /* dpmpp_2m(_sde), unipc: 1..3; 0 = auto */
        double eta;                     /* DDIM only */
        double guidance_rescale;
        int64_t width, height;          /* px; 0 = &model resolution */
        int64_t images_per_prompt;
        int64_t batch_size;             /* images per U-Net call; 0 = 8 on a GPU, 1 on the CPU */
        int64_t decode_batch_size;      /* images per VAE decode; 0 = batch_size on a GPU, 1 on
                                           the CPU */
        char checkpoint[SD_PATH_MAX];   /* '' = &model pretrained (see the schema's help) */
        int64_t every_n_steps;          /* train / pipeline: sample from these checkpoints */
        bool use_ema;
        char resume[SD_NAME_MAX];       /* auto | never: keep the images of the same settings */
    } sample;
} sd_config;

typedef enum {
    SD_OPT_INT,
    SD_OPT_REAL,
    SD_OPT_LOGICAL,
    SD_OPT_STRING,
    SD_OPT_CHOICE,   /* a string from a fixed set, compared case-insensitively, stored lower-case */
    SD_OPT_INT_LIST,
    SD_OPT_STRING_LIST
} sd_opt_type;

/* One namelist key. The default is namelist text, parsed and validated like user input. */
typedef struct sd_option {
    const char *group;
    const char *key;
    sd_opt_type type;
    size_t offset;        /* of the value (or first element) in sd_config */
    size_t count_offset;  /* lists: offset of the int element count */
    size_t capacity;      /* strings: buffer size; lists: max elements */
    size_t elem_size;     /* string lists: bytes per element */
    const char *def;      /* default as namelist value text */
    double min, max;      /* numeric range (inclusive); NAN = unbounded on that side */
    const char *choices;  /* SD_OPT_CHOICE: "a|b|c" */
    const char *unit;     /* "" when none */
    const char *help;
} sd_option;

/* Where an option's value came from. */
typedef enum { SD_ORIGIN_DEFAULT = 0, SD_ORIGIN_FILE, SD_ORIGIN_SET } sd_origin_kind;
typedef struct sd_origin {
    sd_origin_kind kind;
    int line, col;        /* SD_ORIGIN_FILE: position in the namelist */
    int set_index;        /* SD_ORIGIN_SET: which --set (1-based) */
} sd_origin;

/* Resolved configuration plus provenance, as the program passes it around. */
typedef struct sd_run_config {
    sd_config cfg;
    sd_origin *origin;    /* one per schema option, same order as sd_config_options() */
    char source[SD_PATH_MAX]; /* the namelist file */
    int group_line[16];   /* where each group (sd_config_groups order) starts in the file; */
    int group_col[16];    /* 0 when the file does not have it */
} sd_run_config;

const sd_option *sd_config_options(size_t *n);
const char *const *sd_config_groups(size_t *n);
/* The option for group/key (case-insensitive), or NULL. */
const sd_option *sd_config_find(const char *group, const char *key);

/* Fills defaults; allocates rc->origin. */
void sd_run_config_init(sd_run_config *rc);
void sd_run_config_free(sd_run_config *rc);

/* Applies a parsed namelist (schema checks: unknown group/key, types, ranges, duplicates). */
int sd_config_apply(sd_run_config *rc, const nl_file *f, sd_err *err);
/* Applies one "--set group.key=value" argument; `index` is its 1-based position. */
int sd_config_apply_set(sd_run_config *rc, const char *arg, int index, sd_err *err);
/* Cross-key checks that need the whole configuration (channel counts, schedule, ...). */
int sd_config_validate(const sd_run_config *rc, sd_err *err);
/* An error about &group key, located where the user set it (file line and column, or the
 * --set argument), else at the group, else at the file. Returns -1. */
int sd_config_error_at(const sd_run_config *rc, const char *group, const char *key, sd_err *err,
                       const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

/* The inputs the mode needs to run (&data input for 'process' and 'pipeline', &data shard_dir
 * for all but 'sample', &sample prompts for 'sample'). sdtrain refuses to start a job without
 * them; `sdtrain --check` reports them as a note, so a layout can be checked without data. */
int sd_config_check_mode_inputs(const sd_run_config *rc, sd_err *err);

/* The checkpoint root a training run writes into: &checkpoint dir, or <output_dir>/checkpoints
 * when that is ''. */
void sd_config_checkpoint_dir(const sd_config *c, char *buf, size_t size);

/* &run io_hints: "key=value" pairs separated by commas, spaces around either allowed. Each key
 * and value must fit MPI's limits (checked here with Open MPI's numbers, the smallest of the
 * MPIs: MPI_MAX_INFO_KEY 36 and MPI_MAX_INFO_VAL 256 bytes with the NUL, MPICH's are 255 and
 * 1024; this layer knows nothing of MPI, h5util.c asserts them against the MPI it is built with),
 * hold no control character but a tab; a key holds no blank and appears once; a value may
 * hold '=' and commas (a piece without '=' after a comma continues the value before). Fills
 * out[0 .. *n) (at most `max`); -1 with err saying which pair and why. An empty or all-blank
 * text gives *n = 0. */
#define SD_IO_HINT_KEY_MAX 35
#define SD_IO_HINT_VALUE_MAX 255
#define SD_IO_HINTS_MAX 64
typedef struct sd_io_hint {
    char key[SD_IO_HINT_KEY_MAX + 1];
    char value[SD_IO_HINT_VALUE_MAX + 1];
} sd_io_hint;
int sd_io_hints_parse(const char *text, sd_io_hint *out, int max, int *n, sd_err *err);

/* Reads `path`, applies it and the overrides, validates (not the mode inputs). */
int sd_config_load(sd_run_config *rc, const char *path, int n_set, char *const *sets, sd_err *err);

/* The configuration as namelist text (every key, schema order). With `annotate`, each line
 * carries a comment saying where the value came from; the text re-parses to the same config. */
char *sd_config_to_namelist(const sd_run_config *rc, bool annotate);

/* Writes s as the text of a namelist comment (after a '!'): line breaks and other control
 * characters become '?', so that the comment cannot end early (a path or a --set argument may
 * hold any byte but NUL). */
void sd_config_put_comment(FILE *f, const char *s);

/* Parses text written by sd_config_to_namelist (used to broadcast the configuration). */
int sd_config_from_text(sd_run_config *rc, const char *text, size_t len, sd_err *err);

/* Markdown reference of every group and key (doc/namelist.md). */
char *sd_config_reference_markdown(void);
/* Short per-key listing for --help. */
void sd_config_print_keys(FILE *f);

#ifdef __cplusplus
}
#endif
#endif
