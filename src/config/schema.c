/* The schema: every namelist group and key sdtrain understands, with defaults and limits. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/config.h"

#define SZ(g, k) sizeof(((sd_config *)0)->g.k)
#define N(g, k) offsetof(sd_config, g.n_##k)
#define U NAN

#define INT(g, k, def, lo, hi, unit, help) \
    {#g, #k, SD_OPT_INT, offsetof(sd_config, g.k), 0, 0, 0, def, lo, hi, NULL, unit, help}
#define REAL(g, k, def, lo, hi, unit, help) \
    {#g, #k, SD_OPT_REAL, offsetof(sd_config, g.k), 0, 0, 0, def, lo, hi, NULL, unit, help}
#define LOGICAL(g, k, def, help) \
    {#g, #k, SD_OPT_LOGICAL, offsetof(sd_config, g.k), 0, 0, 0, def, U, U, NULL, "", help}
#define STRING(g, k, def, help) \
    {#g, #k, SD_OPT_STRING, offsetof(sd_config, g.k), 0, SZ(g, k), 0, def, U, U, NULL, "", help}
#define CHOICE(g, k, def, choices, help) \
    {#g, #k, SD_OPT_CHOICE, offsetof(sd_config, g.k), 0, SZ(g, k), 0, def, U, U, choices, "", help}
#define INT_LIST(g, k, def, lo, hi, unit, help)                                               \
    {#g, #k, SD_OPT_INT_LIST, offsetof(sd_config, g.k), N(g, k),                             \
     sizeof(((sd_config *)0)->g.k) / sizeof(((sd_config *)0)->g.k[0]), 0, def, lo, hi, NULL, \
     unit, help}
#define STRING_LIST(g, k, def, help)                                                        \
    {#g, #k, SD_OPT_STRING_LIST, offsetof(sd_config, g.k), N(g, k),                        \
     sizeof(((sd_config *)0)->g.k) / sizeof(((sd_config *)0)->g.k[0]),                     \
     sizeof(((sd_config *)0)->g.k[0]), def, U, U, NULL, "", help}

static const char *const groups[] = {"run", "model", "data", "train", "diffusion", "checkpoint", "sample"};

static const sd_option options[] = {
    /* &run */
    CHOICE(run, mode, "", "process|train|pipeline|sample",
           "What the job does: 'process' = preprocessing only (all ranks), 'train' = training from "
           "existing shards (all ranks), 'pipeline' = both at once (n_process_ranks preprocess, the "
           "rest train), 'sample' = generate images. Required."),
    INT(run, n_process_ranks, "0", 0, 2147483647, "ranks",
        "Ranks given to preprocessing when mode = 'pipeline' (the rest train); ignored otherwise."),
    CHOICE(run, pipeline_end, "'shards'", "shards|training",
           "When a mode = 'pipeline' job ends: 'shards' = once training is done and every planned "
           "shard is committed (the shard directory complete, as mode 'process' makes it); "
           "'training' = once training is done: preprocessing commits the shard it is writing and "
           "stops (a later 'process' or 'pipeline' run commits the rest)."),
    CHOICE(run, device, "'auto'", "auto|cpu|cuda",
           "'cuda' requires a GPU and fails without one; 'auto' uses the GPU when there is one and "
           "falls back to the CPU with a notice."),
    INT(run, seed, "1234", 0, 4294967295.0, "",
        "Seed of every random stream (noise, timesteps, data order, initialization). Results "
        "depend on (seed, step, sample index), never on the rank count."),
    STRING(run, output_dir, "'runs/sdtrain'",
           "Directory for used.nml, metrics.jsonl and logs (created if missing)."),
    CHOICE(run, log_level, "'info'", "debug|info|warn|error", "Least severe message printed."),
    STRING(run, io_hints, "''",
           "MPI-IO hints for every HDF5 file the job writes (latent shards, checkpoints): "
           "'key=value' pairs separated by commas, given as they are to MPI_File_open, which "
           "creates each file (its ranks then write their parts with pwrite, so collective-I/O "
           "hints such as romio_cb_write have no effect); on Lustre e.g. 'striping_factor=16, "
           "striping_unit=4194304' (the stripes of each new file). MPI-IO ignores hints it does "
           "not know: the log says which it took. '' = none."),
    INT(run, io_alignment, "1048576", 0, 1073741824, "bytes",
        "Datasets of at least this size in the HDF5 files the job writes start at a multiple of "
        "it (H5Pset_alignment), so that the ranks' writes meet whole file-system blocks or "
        "stripes; set it to the stripe size of a striped file system. 0 or 1 = no alignment "
        "(HDF5 packs the file)."),
    REAL(run, stall_timeout, "1800", 0, U, "s",
         "End the job (status 1, which slurm/train.sh requeues, so that it resumes from the "
         "newest checkpoint) when a rank has made no progress for this long: no op computed, no "
         "file block read or written. That is a rank stuck on a hung file system "
         "or device, or the ranks waiting in a collective for it; those inside MPI wait a tenth "
         "longer (2 to 300 s), so that the stuck rank is the one that reports where it is. Waits "
         "bounded otherwise (mode 'pipeline': the trainers waiting for shards, one half for the "
         "other; the ranks waiting for rank 0's own work, such as indexing the dataset) do not "
         "count, unless a file-system call in them does not return for this long. 0 = never. SIGUSR2 asks every rank for the same "
         "report of its work at any time, without stopping the job."),

    /* &model */
    STRING(model, pretrained, "''",
           "Local diffusers snapshot (model_index.json, unet/, vae/, text_encoder/, tokenizer/, "
           "scheduler/). '' = build the models from the shape keys below."),
    STRING(model, autoencoder, "''", "VAE directory to use instead of <pretrained>/vae ('' = that one)."),
    STRING(model, tokenizer, "''",
           "CLIP tokenizer: a diffusers tokenizer/ folder (vocab.json + merges.txt) or OpenAI's "
           "bpe_simple_vocab_16e6.txt.gz ('' = <pretrained>/tokenizer)."),
    CHOICE(model, unet_init, "'random'", "random|pretrained",
           "'random' = pre-train the U-Net from scratch (the snapshot's U-Net config is still used); "
           "'pretrained' = start from the snapshot's U-Net weights."),
    INT(model, resolution, "256", 8, 4096, "px", "Image side after resize and center crop; multiple of 8."),
    INT_LIST(model, block_out_channels, "320, 640, 1280, 1280", 1, 16384, "channels",
             "U-Net channels per resolution level (used without a snapshot)."),
    INT(model, layers_per_block, "2", 1, 8, "", "U-Net ResNet blocks per level (used without a snapshot)."),
    INT_LIST(model, attention_head_dim, "5, 10, 20, 20", 1, 1024, "",
             "U-Net attention heads per level, as diffusers' attention_head_dim (one value, or one "
             "per level; used without a snapshot)."),
    INT(model, cross_attention_dim, "1024", 1, 65536, "", "Width of the text embeddings the U-Net attends to."),
    INT(model, norm_num_groups, "32", 1, 1024, "", "Group-norm groups in U-Net and VAE."),
    INT(model, latent_channels, "4", 1, 64, "", "VAE latent channels (= U-Net in/out channels)."),
    INT_LIST(model, vae_block_out_channels, "128, 256, 512, 512", 1, 16384, "channels",
             "VAE channels per level (used without a snapshot)."),
    INT(model, text_hidden_size, "1024", 1, 65536, "", "Text encoder width (used without a snapshot)."),
    INT(model, text_layers, "23", 1, 256, "", "Text encoder layers (used without a snapshot)."),
    INT(model, text_heads, "16", 1, 1024, "", "Text encoder attention heads (used without a snapshot)."),

    /* &data */
    STRING(data, input, "''",
           "Dataset: an img2dataset folder, a folder or glob of webdataset .tar shards, or a TSV "
           "manifest (path<TAB>caption). Required for mode = 'process' and 'pipeline'."),
    CHOICE(data, input_format, "'auto'", "auto|files|webdataset|tsv", "Format of data.input; 'auto' looks at it."),
    STRING(data, shard_dir, "''",
           "Directory of the HDF5 latent shards and their manifest: written by preprocessing, read "
           "by training. Required for every mode but 'sample'."),
    INT(data, samples_per_shard, "4096", 1, U, "samples", "Samples per HDF5 shard file."),
    CHOICE(data, shard_dtype, "'fp16'", "fp16|fp32", "Storage type of latents and embeddings in shards."),
    INT(data, max_samples, "0", 0, U, "samples", "Stop after this many input samples (0 = all)."),
    REAL(data, val_fraction, "0.01", 0, 0.5, "",
         "Fraction of samples held out for validation, chosen by a hash of the sample key."),
    CHOICE(data, caption_utf8, "'replace'", "replace|reject",
           "A caption that is not valid UTF-8: 'replace' repairs it with U+FFFD (as Python's "
           "errors='replace'), 'reject' skips the sample; either way it is counted."),
    CHOICE(data, missing_caption, "'skip'", "skip|empty",
           "An image without a caption: 'skip' it, or keep it with the empty caption (counted)."),
    CHOICE(data, alpha, "'drop'", "drop|white",
           "Images with transparency: 'drop' the alpha channel as Pillow's convert('RGB') does (the "
           "reference pipeline), or composite on 'white'."),
    INT(data, max_image_pixels, "178956970", 1, U, "pixels",
        "Images with more pixels are skipped, judged from the header before decoding (Pillow's "
        "decompression-bomb limit)."),
    INT(data, min_image_side, "0", 0, 16777216, "px", "Images whose shorter side is smaller are skipped (0 = no limit)."),
    STRING(data, filter, "''",
           "Keep only the samples whose .json metadata (img2dataset, webdataset) meets every "
           "condition: KEY OP VALUE joined by ',' or 'and', OP one of < <= > >= == !=, VALUE a "
           "number or a \"string\" (== and != only), KEY a field, '.' for nested ones; e.g. "
           "'original_width >= 512, punsafe < 0.1, status == \"success\"'. Refused samples are "
           "not read and count as 'filtered'; those whose metadata cannot answer (no .json, no "
           "such field, not a number) as 'no_metadata'. '' = every sample."),
    LOGICAL(data, strict_jpeg, ".true.",
            "Treat libjpeg's corrupt-data warnings as errors (skip the image); truncated files are "
            "always skipped."),
    INT(data, encode_batch_size, "0", 0, 4096, "samples",
        "Images and captions encoded per VAE / text-encoder call during preprocessing; 0 = 32 "
        "on a GPU, 8 on the CPU."),
    CHOICE(data, encode_precision, "'auto'", "auto|fp32|bf16",
           "Compute type of the VAE and text encoders in preprocessing: 'auto' = bf16 on a GPU, "
           "fp32 on the CPU; 'bf16' needs &run device = 'cuda' (or 'auto' with a GPU)."),
    LOGICAL(data, exif_transpose, ".false.",
            "Apply the image's orientation before resizing, as Pillow 9.4's ImageOps.exif_transpose "
            "(JPEG EXIF; PNG eXIf, raw EXIF profile or XMP); the reference pipeline does not."),
    LOGICAL(data, overlap_writes, ".true.",
            "Preprocessing: write each shard on a thread of its own while the next shard is read "
            "and encoded (each rank then holds two shards' worth of encodings); the shards are "
            "the same bytes either way. Not with pipeline_end = 'training', which checks for the "
            "trainers' word between shards."),
    REAL(data, shard_wait_timeout, "3600", 0.001, U, "s",
         "mode = 'pipeline': the longest the training ranks wait for the next shard they need (or "
         "for the preprocessing half's plan) before the job ends with an error."),
    INT(data, open_shards, "64", 1, 65536, "files",
        "Training: the latent shards each rank keeps open (least recently used closed first). "
        "Batches are drawn from the whole data set (unless shuffle_window), so with more shards "
        "than this nearly every sample costs an open (an HDF5 open: several reads, and a metadata operation on a "
        "parallel file system); each open shard holds about 1 MiB of HDF5 memory and a file "
        "descriptor (the soft limit is raised to fit when the hard one allows)."),
    INT(data, shuffle_window, "0", 0, 65536, "shards",
        "Training: 0 shuffles each epoch's samples over the whole data set. W > 0 shuffles the "
        "shards, cuts them into windows of W and shuffles the samples of each window among "
        "themselves: a global batch then draws from at most about 2 W shards, so with W up to "
        "open_shards each rank opens a shard about once an epoch instead of nearly once a "
        "sample when the shards outnumber open_shards. Mixing is within a window only (a shard "
        "holds consecutive samples of the dataset). Deterministic like the global order; "
        "changing it changes the data order from there on."),

    /* &train */
    INT(train, max_steps, "1000", 1, U, "steps", "Optimizer steps to run in total (counting resumed ones)."),
    INT(train, batch_size_per_rank, "8", 1, 2147483647, "samples",
        "Samples per training rank per forward/backward pass; the global batch is this times the "
        "training ranks times grad_accum_steps."),
    INT(train, grad_accum_steps, "1", 1, 4096, "micro-batches",
        "Forward/backward passes of batch_size_per_rank samples each rank adds up before one "
        "optimizer step: a global batch larger than memory allows, same result as one pass over "
        "all of them."),
    REAL(train, learning_rate, "1e-4", 0, 1, "", "Peak AdamW learning rate (reached after warmup)."),
    CHOICE(train, lr_schedule, "'constant'", "constant|linear|cosine|cosine_with_restarts|polynomial",
           "Learning rate after warmup: constant, linear decay to 0, cosine decay to 0 at "
           "max_steps, cosine_with_restarts (lr_num_cycles cosine decays, each restarting at the "
           "peak) or polynomial (decay to 1e-7 with exponent lr_power), as diffusers' "
           "get_scheduler."),
    INT(train, warmup_steps, "0", 0, U, "steps", "Linear learning-rate warmup from 0."),
    INT(train, lr_num_cycles, "1", 1, 1000000, "",
        "lr_schedule = 'cosine_with_restarts': the number of cosine decays (hard restarts)."),
    REAL(train, lr_power, "1.0", 1e-6, 1000, "",
         "lr_schedule = 'polynomial': the exponent of the decay (1 = linear to 1e-7)."),
    REAL(train, weight_decay, "1e-2", 0, 1, "", "AdamW decoupled weight decay."),
    REAL(train, adam_beta1, "0.9", 0, 0.999999, "", "AdamW beta1."),
    REAL(train, adam_beta2, "0.999", 0, 0.99999999, "", "AdamW beta2."),
    REAL(train, adam_eps, "1e-8", 0, 1, "", "AdamW epsilon."),
    REAL(train, grad_clip, "1.0", 0, U, "", "Clip the global gradient norm to this (0 = off)."),
    CHOICE(train, sharding, "'none'", "none|shard_grad_op",
           "'none' = DDP (all-reduce gradients); 'shard_grad_op' = ZeRO-2 (reduce-scatter "
           "gradients, optimizer state sharded, all-gather parameters)."),
    CHOICE(train, grad_reduce, "'auto'", "auto|overlap|after_backward",
           "When the gradients are reduced between the ranks: 'overlap' = bucket by bucket "
           "while the backward still runs (the last micro-batch's; with ZeRO-2 on GPUs the "
           "parameters' all-gather likewise, bucket by bucket as the next forward reaches "
           "them), 'after_backward' = the whole buffer after it; 'auto' = overlap on GPUs with "
           "NCCL and several ranks, else after the backward. The same result either way (on "
           "the CPU, the same bits)."),
    REAL(train, grad_bucket_mb, "64", 0.001, 65536, "MiB",
        "Largest gradient bucket of grad_reduce = 'overlap' (fp32; buckets never straddle two "
        "ranks' shards). Raised, with a warning, when it would make more than about 1024 "
        "buckets."),
    CHOICE(train, precision, "'fp32'", "fp32|bf16",
           "Compute precision. 'bf16' = bf16 activations with fp32 master weights (GPU); 'fp32' "
           "= full fp32, no TF32 (comparable with the CPU reference)."),
    REAL(train, ema_decay, "0", 0, 1, "", "Exponential moving average of the weights (0 = off)."),
    INT(train, ema_start_step, "0", 0, U, "steps",
        "diffusers' EMAModel update_after_step: the moving average is a copy of the weights "
        "through update ema_start_step + 1 and averages from the next one on."),
    INT(train, log_every, "10", 1, 2147483647, "steps",
        "Progress line interval (metrics.jsonl gets every step)."),
    INT(train, val_every, "0", 0, U, "steps",
        "Validation loss interval (0 = off); also before the first and after the last step."),
    REAL(train, latent_scale, "0", 0, U, "",
         "Multiplier of the stored latents (0 = the shards' scaling_factor, the VAE's). Set it "
         "when the VAE's factor does not give unit-variance latents, e.g. an untrained VAE."),
    LOGICAL(train, latent_sample, ".true.",
            "Latents drawn from the stored VAE posterior each time a sample is seen (diffusers' "
            "latent_dist.sample()); .false. uses its mean (latent_dist.mode()), e.g. for an "
            "untrained VAE whose posterior noise would drown the image."),
    LOGICAL(train, recompute_activations, ".false.",
            "Keep only block inputs and outputs and recompute each ResNet / transformer block's "
            "activations in the backward: less memory, one more forward of compute, same result."),

    /* &diffusion */
    CHOICE(diffusion, prediction_type, "'epsilon'", "epsilon|v_prediction", "Training target of the U-Net."),
    INT(diffusion, num_train_timesteps, "1000", 1, 100000, "steps", "Diffusion steps of the DDPM schedule."),
    CHOICE(diffusion, beta_schedule, "'scaled_linear'", "scaled_linear|linear|squaredcos_cap_v2",
           "DDPM beta schedule ('squaredcos_cap_v2': the cosine schedule, beta_start / beta_end "
           "unused)."),
    REAL(diffusion, beta_start, "0.00085", 0, 1, "", "First beta of the schedule."),
    REAL(diffusion, beta_end, "0.012", 0, 1, "", "Last beta of the schedule."),
    LOGICAL(diffusion, rescale_betas_zero_snr, ".false.",
            "Rescale the betas to zero terminal SNR (the last timestep is pure noise; needs "
            "prediction_type = 'v_prediction'; sample with 'trailing' spacing)."),
    REAL(diffusion, caption_dropout, "0", 0, 1, "",
         "Probability that a sample trains with the empty-caption embedding (for guidance)."),
    REAL(diffusion, min_snr_gamma, "0", 0, U, "", "Min-SNR-gamma loss weighting (0 = off)."),
    REAL(diffusion, noise_offset, "0", 0, 1, "", "Noise offset added per sample and channel (0 = off)."),
    REAL(diffusion, input_perturbation, "0", 0, 1, "",
         "Input perturbation (Ning et al. 2023; diffusers' --input_perturbation, 0.1 there): the "
         "U-Net's input is noised with eps + input_perturbation * n, the target keeps eps "
         "(0 = off; training steps only, not validation)."),

    /* &checkpoint */
    STRING(checkpoint, dir, "''", "Checkpoint directory ('' = <output_dir>/checkpoints)."),
    INT(checkpoint, every_n_steps, "1000", 0, U, "steps", "Checkpoint interval (0 = only at the end)."),
    REAL(checkpoint, every_n_minutes, "0", 0, 1e6, "min",
         "Also checkpoint at the first step boundary after this many minutes of training since "
         "the last checkpoint (written at once: since it ended; async: since it started) or since "
         "the run started, by rank 0's clock, so that a lost node costs at most this much work "
         "whatever the step time (0 = off; every_n_steps still applies). Fractions are allowed."),
    INT(checkpoint, keep_last, "3", 0, U, "", "Complete checkpoints kept (0 = all)."),
    INT(checkpoint, keep_every_n_steps, "0", 0, U, "steps",
        "Milestones: a checkpoint is also written at every multiple of this step count and "
        "keep_last never removes it, so that e.g. every 10000th step stays for evaluation while "
        "only the newest keep_last others are kept for restarts (0 = none)."),
    STRING(checkpoint, resume, "'auto'",
           "'auto' = continue from the newest checkpoint if there is one (a damaged or missing one is "
           "moved aside with a warning and the one before it used); 'never' = start "
           "fresh; or the path of one checkpoint directory (or of a checkpoint root: its latest)."),
    LOGICAL(checkpoint, verify, ".true.",
            "Read each checkpoint back before committing it: every rank re-reads the parts it "
            "wrote (past the page cache where the kernel allows) and compares their checksums "
            "with those of the data written; a mismatch leaves it uncommitted, as a failed write "
            "(the previous checkpoint stays the latest and is not pruned)."),
    LOGICAL(checkpoint, async, ".false.",
            "Write the periodic checkpoints in the background: training stops only while each "
            "rank copies its part of the state into host memory (a second copy of that part, "
            "allocated when the run starts) and the state file is created; a thread per rank "
            "then writes, syncs and "
            "(verify) reads back its part while the steps go on, and the checkpoint is committed "
            "at the first step boundary after every rank is done (a checkpoint still in flight "
            "is finished first when the next one is due, at a signal and at the end; the final "
            "checkpoint and those that &sample every_n_steps turns into images are written at "
            "once)."),

    /* &sample */
    STRING_LIST(sample, prompts, "", "Prompts to generate images for (mode = 'sample')."),
    STRING(sample, prompts_file, "''",
           "A UTF-8 text file of prompts, one per line (blank lines skipped), used instead of "
           "prompts: evaluation sets of thousands of captions (at most 1000000 prompts of "
           "1023 bytes). Rank 0 reads it when sampling starts."),
    STRING_LIST(sample, negative_prompts, "",
                "What the images should not show: the unconditional half of classifier-free "
                "guidance is conditioned on it instead of on the empty prompt (diffusers' "
                "negative_prompt). None, one for every prompt, or one per prompt; used only "
                "when guidance_scale > 1."),
    INT(sample, num_steps, "50", 1, 1000, "steps", "Denoising steps."),
    REAL(sample, guidance_scale, "7.5", 0, 100, "",
         "Classifier-free guidance scale; <= 1 = off (no unconditional U-Net pass, as diffusers)."),
    CHOICE(sample, scheduler, "'ddim'",
           "ddim|pndm|ddpm|euler|euler_a|heun|lms|dpm2|dpm2_a|dpmpp_2m|dpmpp_2m_sde|dpmpp_sde|unipc",
           "Sampler (noise scheduler): diffusers' DDIM, PNDM (PLMS), DDPM, EulerDiscrete, "
           "EulerAncestralDiscrete, HeunDiscrete (2 U-Net calls a step but the last), "
           "LMSDiscrete (linear multistep, order 4), KDPM2Discrete (DPM-Solver-2, 2 calls a step "
           "but the last; _a: KDPM2AncestralDiscrete), DPMSolverMultistep (DPM-Solver++ 2M; _sde: its stochastic variant), "
           "DPMSolverSDE ('dpmpp_sde', \"DPM++ SDE\": 2 calls a step but the last, Brownian "
           "noise from counter-based normals) or UniPCMultistep."),
    CHOICE(sample, timestep_spacing, "'auto'", "auto|leading|trailing|linspace",
           "Which timesteps num_steps visits (diffusers' timestep_spacing). 'auto' = the "
           "snapshot's scheduler_config.json (without the key: the scheduler class's default, "
           "'leading' for ddim, pndm and ddpm, else 'linspace'), or 'leading' without a "
           "snapshot config (SD's convention)."),
    LOGICAL(sample, use_karras_sigmas, ".false.",
            "Karras et al.'s sigmas (rho 7) for scheduler = 'euler', 'heun', 'lms', 'dpm2', 'dpm2_a', "
            "'dpmpp_2m', "
            "'dpmpp_2m_sde', 'dpmpp_sde' or 'unipc' "
            "(diffusers' use_karras_sigmas; 'dpmpp_2m' with it is \"DPM++ 2M Karras\"); a "
            "snapshot's scheduler_config.json can also set it."),
    LOGICAL(sample, use_exponential_sigmas, ".false.",
            "Exponentially spaced sigmas (log-linear from the largest to the smallest) for "
            "scheduler = 'euler', 'heun', 'lms', 'dpm2', 'dpm2_a', 'dpmpp_2m', 'dpmpp_2m_sde', "
            "'dpmpp_sde' or 'unipc' "
            "(diffusers' "
            "use_exponential_sigmas); not with use_karras_sigmas."),
    LOGICAL(sample, use_beta_sigmas, ".false.",
            "Beta-distributed sigmas (Lee et al. 2024: the quantiles of Beta(0.6, 0.6), dense at "
            "both ends of the range) for the schedulers of use_karras_sigmas (diffusers' "
            "use_beta_sigmas); not with use_karras_sigmas or use_exponential_sigmas."),
    INT(sample, solver_order, "0", 0, 3, "",
        "The multistep solvers' order (1, 2 or 3) for 'dpmpp_2m', 'dpmpp_2m_sde' and 'unipc' "
        "('dpmpp_2m_sde' with 3 is \"DPM++ 3M SDE\"); 0 = the snapshot's "
        "scheduler_config.json, else 2."),
    REAL(sample, eta, "0", 0, 1, "",
         "DDIM's eta: 0 = deterministic DDIM, 1 = DDPM-like noise at every step (drawn like "
         "the ddpm noise). Only scheduler = 'ddim' uses it."),
    REAL(sample, guidance_rescale, "0", 0, 1, "",
         "The pipeline's guidance_rescale (rescale_noise_cfg: the guided prediction's standard "
         "deviation pulled toward the conditional one's; 0 = off). Needs guidance_scale > 1."),
    INT(sample, width, "0", 0, 16384, "px",
        "Image width (a multiple of the VAE's factor, 8 for SD); 0 = &model resolution."),
    INT(sample, height, "0", 0, 16384, "px",
        "Image height (a multiple of the VAE's factor, 8 for SD); 0 = &model resolution."),
    INT(sample, images_per_prompt, "1", 1, 1024, "",
        "Images per prompt; image j of prompt p is a function of (seed, p, j) only."),
    INT(sample, batch_size, "0", 0, 256, "images",
        "Images denoised together in one U-Net call (each rank's images, in order; the images do "
        "not depend on it on the CPU, whose U-Net is batch-invariant). 0 = 8 on a GPU, 1 on the "
        "CPU."),
    INT(sample, decode_batch_size, "0", 0, 256, "images",
        "Images the VAE decodes in one call (at most batch_size): faster on a GPU, more memory. "
        "0 = batch_size on a GPU, 1 on the CPU."),
    STRING(sample, checkpoint, "''",
           "What to sample from: a diffusers snapshot, a training output directory (its "
           "unet_final.safetensors, else its newest checkpoint), a checkpoint directory (step-K, "
           "or a checkpoint root with 'latest'), or a U-Net .safetensors file; VAE, text encoder "
           "and U-Net config then come from &model. '' = &model pretrained, or without one "
           "<output_dir>'s final weights or newest checkpoint."),
    INT(sample, every_n_steps, "0", 0, U, "steps",
        "mode = 'train' or 'pipeline': images of the prompts from every checkpoint whose step is "
        "a multiple of this, and from the last one, into <output_dir>/samples/step-<step>/ "
        "(0 = none); a multiple of &checkpoint every_n_steps."),
    CHOICE(sample, resume, "'auto'", "auto|never",
           "'auto': a rerun with the same settings (<output_dir>/samples.settings: the namelist's "
           "keys that decide the images, the prompts, the weight files, the backend) keeps the "
           "images already in <output_dir>/samples/ and makes only the missing ones, so that a "
           "requeued job goes on; with other settings the images there are removed first. "
           "'never': every image is made again."),
    LOGICAL(sample, use_ema, ".false.",
            "Sample with the EMA weights: a checkpoint's EMA, or unet_ema.safetensors beside "
            "unet_final.safetensors (an error when the source has none)."),
};

const sd_option *sd_config_options(size_t *n)
{
    *n = sizeof options / sizeof options[0];
    return options;
}

const char *const *sd_config_groups(size_t *n)
{
    *n = sizeof groups / sizeof groups[0];
    return groups;
}

const sd_option *sd_config_find(const char *group, const char *key)
{
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (strcasecmp(options[i].group, group) == 0 && strcasecmp(options[i].key, key) == 0)
            return &options[i];
    return NULL;
}
