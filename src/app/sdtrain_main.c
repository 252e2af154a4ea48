/* sdtrain: the SPMD job. Reads and validates the namelist on rank 0, broadcasts it, splits
 * MPI_COMM_WORLD into the preprocessing and training communicators and runs the mode. */
#include "sd_config.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/config.h"
#include "sdtrain/device.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/fault.h"
#include "sdtrain/h5util.h"
#include "sdtrain/log.h"
#include "sdtrain/models.h"
#include "sdtrain/modes.h"
#include "sdtrain/runtime.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/version.h"

typedef struct cli {
    const char *input;
    int check;
    int np;          /* --np N for --check; 0 = the real world size */
    int n_set;
    char **sets;
} cli;

static void print_help(void)
{
    printf("usage: sdtrain INPUT.nml [--set group.key=value ...]\n"
           "       sdtrain --check INPUT.nml [--np N] [--set group.key=value ...]\n"
           "       sdtrain --help | --version\n\n"
           "Stable Diffusion pre-training as one MPI job: run it under mpirun or srun, e.g.\n"
           "  mpirun -np 32 ./sdtrain input.nml\n\n"
           "The namelist's &run mode says what the ranks do: 'process' (all preprocess images and\n"
           "captions into HDF5 latent shards), 'train' (all train from shards), 'pipeline' (the\n"
           "first n_process_ranks preprocess while the rest train), 'sample' (generate images).\n\n"
           "options:\n"
           "  --set group.key=value  override one namelist value (validated like the file and\n"
           "                         recorded in <output_dir>/used.nml); may be repeated; string\n"
           "                         values need no quotes: --set run.mode=train (a list's\n"
           "                         unquoted value is one string; several: quote each,\n"
           "                         --set \"sample.prompts='a cat','a dog'\")\n"
           "  --check                validate the namelist, print the effective configuration and\n"
           "                         the communicator layout, and exit without running\n"
           "  --np N                 with --check: show the layout for N ranks\n"
           "  --help, --version\n\n"
           "exit status: 0 success, 1 runtime failure, 2 bad command line or configuration,\n"
           "3 mode not implemented in this build.\n\n"
           "namelist keys (group.key, type, default); full reference in doc/namelist.md:\n");
    sd_config_print_keys(stdout);
}

/* Returns 0, or SD_EXIT_USAGE with the message in `err`. */
static int parse_cli(int argc, char **argv, cli *c, sd_err *err)
{
    memset(c, 0, sizeof *c);
    c->sets = sd_xcalloc((size_t)argc + 1, sizeof *c->sets);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check")) {
            c->check = 1;
        } else if (!strcmp(a, "--np") || !strncmp(a, "--np=", 5)) {
            const char *v = a[4] == '=' ? a + 5 : (i + 1 < argc ? argv[++i] : NULL);
            char *end;
            long n;
            if (!v)
                return sd_err_set(err, "--np needs a number of ranks");
            n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 10000000)
                return sd_err_set(err, "--np '%s': expected a positive number of ranks", v);
            c->np = (int)n;
        } else if (!strcmp(a, "--set") || !strncmp(a, "--set=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v)
                return sd_err_set(err, "--set needs group.key=value");
            c->sets[c->n_set++] = (char *)v;
        } else if (a[0] == '-' && a[1]) {
            return sd_err_set(err, "unknown option '%s' (see sdtrain --help)", a);
        } else if (c->input) {
            return sd_err_set(err, "more than one input file: '%s' and '%s'", c->input, a);
        } else {
            c->input = a;
        }
    }
    if (!c->input)
        return sd_err_set(err, "no input namelist given (usage: sdtrain INPUT.nml; see --help)");
    if (c->np && !c->check)
        return sd_err_set(err, "--np only makes sense with --check");
    return 0;
}

/* Ends the job with `code` on every rank (after a collective decision, so nobody hangs). */
static int finish(sd_runtime *rt, int code)
{
    sd_watchdog_stop();
    fflush(stdout);
    fflush(stderr);
    sd_mpi_finish(rt);
    return code;
}

/* &run stall_timeout passed without progress on this rank (src/core/progress.c's thread): the
 * report, then MPI_Abort with status 1 (slurm/train.sh requeues; sdtrain resumes). Should the
 * abort itself hang (the network that stalled the job may be what it needs), SIGALRM's default
 * action ends this process a minute later, and with it the job. */
static void on_stall(const char *message, void *user)
{
    signal(SIGALRM, SIG_DFL);
    alarm(60);
    sd_fatal_report(__FILE__, __LINE__, __func__, "the job stalled", message, (const char *)user);
}

/* What on_stall says follows the end, by mode: what a rerun of the same job keeps. */
static const char *stall_advice(const char *mode)
{
    if (!strcmp(mode, "process"))
        return "ending the job with status 1; a rerun goes on from the shards committed";
    if (!strcmp(mode, "sample"))
        return "ending the job with status 1; a rerun keeps the images already written";
    return "ending the job with status 1; a restart resumes from the newest checkpoint";
}

/* SIGUSR2: each rank says what it is doing (the watchdog thread prints it), the job goes on. */
static void on_usr2(int sig)
{
    (void)sig;
    sd_progress_report_request();
}

/* The inputs the mode needs: an error for a job, a note for --check (which may check a
 * layout before the data exists). Returns 0 or SD_EXIT_USAGE; rank 0 only. */
static int check_mode_inputs(const cli *c, const sd_run_config *rc)
{
    sd_err err;
    if (sd_config_check_mode_inputs(rc, &err) == 0)
        return 0;
    if (!c->check) {
        fprintf(stderr, "%s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    printf("note: the job itself will refuse to start: %s\n", err.msg);
    return 0;
}

/* The noise schedule of &diffusion, built as the modes that use it build it (train, pipeline,
 * sample from a U-Net trained here), so that --check refuses one they would refuse. */
static int check_schedule(const sd_run_config *rc, sd_err *err)
{
    sd_diffusion d;
    sd_err why;
    if (!strcmp(rc->cfg.run.mode, "process"))
        return 0;
    if (sd_diffusion_init_config(&d, &rc->cfg, &why) == 0) {
        sd_diffusion_free(&d);
        return 0;
    }
    const char *msg = strncmp(why.msg, "diffusion: ", 11) ? why.msg : why.msg + 11;
    return sd_config_error_at(rc, "diffusion", strstr(msg, "beta_start") ? "beta_start" : "beta_end",
                              err, "&diffusion: %s", msg);
}

/* Rank 0 loads and validates; everybody gets the result. Returns 0 or the exit code. */
static int load_config(const cli *c, int rank, sd_run_config *rc)
{
    sd_err err;
    int status = 0;
    char *text = NULL;
    long long len = 0;
    size_t n_opt;

    sd_config_options(&n_opt);
    sd_err_clear(&err);
    if (rank == 0) {
        if (sd_config_load(rc, c->input, c->n_set, c->sets, &err) != 0 ||
            check_schedule(rc, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            status = SD_EXIT_USAGE;
        } else if ((status = check_mode_inputs(c, rc)) == 0) {
            text = sd_config_to_namelist(rc, false);
            len = (long long)strlen(text);
        }
    }
    SD_MPI_CHECK(MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (status)
        return status;
    SD_MPI_CHECK(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD));
    if (rank != 0)
        text = sd_xmalloc((size_t)len + 1);
    SD_MPI_CHECK(MPI_Bcast(text, (int)len + 1, MPI_CHAR, 0, MPI_COMM_WORLD));
    SD_MPI_CHECK(MPI_Bcast(rc->source, (int)sizeof rc->source, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (rank != 0) {
        /* The text is what rank 0 validated; it must read back identically. */
        SD_CHECK(sd_config_from_text(rc, text, (size_t)len, &err) == 0,
                 "broadcast configuration does not re-parse: %s", err.msg);
    }
    SD_MPI_CHECK(MPI_Bcast(rc->origin, (int)(n_opt * sizeof *rc->origin), MPI_BYTE, 0, MPI_COMM_WORLD));
    free(text);
    return 0;
}

/* used.nml is written to a temporary name, flushed to disk and renamed, so a reader never
 * sees half a file. */
static int write_used_nml(const sd_run_config *rc, const cli *c, int world_size, sd_err *err)
{
    char path[SD_PATH_MAX + 16], tmp[SD_PATH_MAX + 32], stamp[64];
    char *body;
    FILE *f;
    time_t now = time(NULL);
    struct tm tm;
    int ok;

    snprintf(path, sizeof path, "%s/used.nml", rc->cfg.run.output_dir); /* the caller made it */
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    f = fopen(tmp, "w");
    if (!f)
        return sd_err_errno(err, errno, "cannot write '%s'", tmp);
    fprintf(f, "! used.nml: the effective configuration of an sdtrain run (re-usable as input)\n"
               "! sdtrain %s (git %s), %s, %d rank(s)\n! input: ",
            sd_version(), sd_git_revision(), stamp, world_size);
    sd_config_put_comment(f, rc->source); /* a line break in it would end the comment */
    fputc('\n', f);
    for (int i = 0; i < c->n_set; i++) {
        fprintf(f, "! --set #%d: ", i + 1);
        sd_config_put_comment(f, c->sets[i]);
        fputc('\n', f);
    }
    body = sd_config_to_namelist(rc, true);
    fputs(body, f);
    free(body);
    ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return sd_err_errno(err, e, "cannot write '%s'", path);
    }
    return 0;
}

/* Every rank resolves its device; the lowest failing rank explains, all stop together. */
static int resolve_devices(const sd_run_config *rc, const sd_runtime *rt, sd_device_info *dev)
{
    sd_err err;
    int failed = sd_device_resolve(rc->cfg.run.device, rt->node_rank, dev, &err) != 0;
    int mine = failed ? rt->world_rank : rt->world_size, first;
    SD_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (first < rt->world_size) {
        if (rt->world_rank == first)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    if (rt->world_rank == 0 && dev->notice[0])
        sd_info("device = '%s': %s", rc->cfg.run.device, dev->notice);
    /* 'auto' on nodes that differ: some ranks on a GPU, the others on the CPU. Training refuses
     * the mix (mode_train.c); shards and images would depend on which rank made them */
    {
        char why[sizeof dev->notice];
        const int cpu_rank = sd_device_mix(MPI_COMM_WORLD, dev->use_cuda, dev->notice, why,
                                           sizeof why);
        if (cpu_rank >= 0 && rt->world_rank == 0)
            sd_warn("device = '%s': rank %d computes on the CPU (%s) while other ranks use GPUs: "
                    "what each rank makes depends on its device (set device = 'cpu', or give "
                    "every rank a GPU)", rc->cfg.run.device, cpu_rank,
                    why[0] ? why : "its device resolved to the CPU");
    }
    return 0;
}

/* "12.3 GB", "4.5 MB": decimal units, as df -H and the checkpoint sizes in the docs */
static const char *fmt_bytes(double b, char *buf, size_t size)
{
    if (b >= 1e12)
        snprintf(buf, size, "%.2f TB", b / 1e12);
    else if (b >= 1e9)
        snprintf(buf, size, "%.2f GB", b / 1e9);
    else
        snprintf(buf, size, "%.1f MB", b / 1e6);
    return buf;
}

/* Steps in [1, n] that are multiples of a or of b (0: none of that kind). */
static int64_t multiples(int64_t n, int64_t a, int64_t b)
{
    int64_t k = 0, g, x, y;
    if (a > 0)
        k += n / a;
    if (b > 0)
        k += n / b;
    if (a > 0 && b > 0) {
        for (x = a, y = b; y; g = x % y, x = y, y = g)
            ;
        if (a / x <= n / b) /* lcm(a, b) <= n */
            k -= n / (a / x * b);
    }
    return k;
}

/* --check of mode 'train' / 'pipeline': what the checkpoints will take on disk, from the
 * U-Net's parameter table (the snapshot's unet/config.json, or the &model shape keys) and the
 * &checkpoint keys, against the room on the checkpoint folder's file system now. */
static void print_checkpoint_plan(const sd_config *cfg)
{
    sd_unet_config uc;
    sd_param_table table;
    sd_err err;
    char dir[SD_PATH_MAX + 32], where[SD_PATH_MAX + 32];
    const char *from = "the &model shape keys";
    memset(&table, 0, sizeof table);
    sd_err_clear(&err);
    if (cfg->model.pretrained[0]) {
        sd_snapshot s;
        int bad = sd_snapshot_open(&s, cfg->model.pretrained, &err) != 0;
        if (!bad) {
            bad = sd_snapshot_component_table(&s, SD_COMPONENT_UNET, &uc, &table, &err) != 0;
            sd_snapshot_close(&s);
        }
        if (bad) {
            /* a login node may not see the snapshot: the shape keys (SD2's by default) */
            printf("checkpoints: the snapshot's U-Net cannot be read here (%s); sizes by the "
                   "&model shape keys instead\n", err.msg);
            sd_param_table_free(&table);
            memset(&table, 0, sizeof table);
        } else {
            from = "the snapshot's unet/config.json";
        }
    }
    if (!table.total_floats) {
        sd_unet_config_from_namelist(cfg, &uc);
        sd_unet_params(&uc, &table);
    }
    const int ema = cfg->train.ema_decay > 0;
    const double floats = (double)table.total_floats;
    const double one = floats * 4.0 * (3 + ema); /* params, adam_m, adam_v (, ema), fp32 */
    const int64_t m = cfg->train.max_steps, every = cfg->checkpoint.every_n_steps;
    const int64_t mile = cfg->checkpoint.keep_every_n_steps, keep = cfg->checkpoint.keep_last;
    /* over the run: the periodic ones and the milestones (those at max_steps are the final
     * one), and the final one */
    const int64_t written = multiples(m - 1, every, mile) + 1;
    const int64_t milestones = mile > 0 ? m / mile : 0; /* multiples of mile up to m */
    int64_t at_once = keep > 0 ? keep + 1 + milestones : written; /* + the one being written */
    if (at_once > written)
        at_once = written;
    char b1[32], b2[32], b3[32];
    printf("checkpoints: U-Net of %.1f M parameters (%s); each checkpoint %s (parameters, "
           "AdamW moments%s: %d x %zu floats)\n", (double)table.total_numel / 1e6, from,
           fmt_bytes(one, b1, sizeof b1), ema ? ", EMA" : "", 3 + ema, table.total_floats);
    sd_config_checkpoint_dir(cfg, dir, sizeof dir);
    /* the folder may not exist yet: its nearest existing parent says the file system */
    snprintf(where, sizeof where, "%s", dir);
    for (;;) {
        struct stat st;
        char *slash;
        if (stat(where, &st) == 0 || !(slash = strrchr(where, '/')) || slash == where)
            break;
        *slash = '\0';
    }
    {
        struct stat st;
        if (stat(where, &st) != 0) /* nothing of the path exists: the folder it starts from */
            snprintf(where, sizeof where, "%s", dir[0] == '/' ? "/" : ".");
    }
    const double avail = sd_fs_free_bytes(where);
    const int by_clock = cfg->checkpoint.every_n_minutes > 0;
    printf("  %lld written over max_steps = %lld%s; ", (long long)written, (long long)m,
           by_clock ? " (plus those of every_n_minutes)" : "");
    if (keep > 0)
        printf("at most %lld on disk at once (the newest keep_last = %lld, %lld milestone(s) of "
               "keep_every_n_steps, the one being written): %s in %s", (long long)at_once,
               (long long)keep, (long long)milestones,
               fmt_bytes((double)at_once * one, b2, sizeof b2), dir);
    else
        printf("all kept (keep_last = 0): %s%s in %s", by_clock ? "at least " : "",
               fmt_bytes((double)at_once * one, b2, sizeof b2), dir);
    if (avail >= 0)
        printf(" (%s free there now)", fmt_bytes(avail, b3, sizeof b3));
    printf("\n");
    if (avail >= 0 && (double)at_once * one > avail)
        printf("  warning: that is more than the file system has free now\n");
    sd_param_table_free(&table);
}

static void print_layout_for(const sd_run_config *rc, const sd_layout *l)
{
    printf("communicators for %d ranks: preprocessing communicator %d ranks; training "
           "communicator %d ranks\n", l->world_size, l->n_process, l->n_train);
    if (l->n_process)
        printf("  world ranks %d-%d: %s\n", 0, l->n_process - 1, sd_role_name(SD_ROLE_PROCESS));
    if (l->n_train)
        printf("  world ranks %d-%d: %s\n", l->n_process, l->world_size - 1,
               sd_role_name(sd_layout_role(&rc->cfg, l, l->world_size - 1)));
}

/* OpenMP threads per rank: OMP_NUM_THREADS when set, else the cores this rank sees divided by
 * the ranks on its node (at least 1). Without this, N ranks on a node each start one thread
 * per core, and spinning OpenMP threads oversubscribe the cores many times over. */
static void share_cores(const sd_runtime *rt)
{
#ifdef _OPENMP
    const char *env = getenv("OMP_NUM_THREADS");
    int n;
    if (env && env[0]) {
        /* a list of positive numbers (one per nesting level); anything else the OpenMP runtime
         * rejects and then runs a thread per visible core in every rank: the share below */
        char *end;
        const long first = strtol(env, &end, 10);
        if (first < 1 || first > INT_MAX || (*end && *end != ',' && *end != ' ')) {
            if (rt->world_rank == 0)
                sd_warn("OMP_NUM_THREADS = '%.40s' is not a positive number of threads: taken as "
                        "unset", env);
            env = NULL;
        }
    }
    if (env && env[0])
        n = omp_get_max_threads();
    else {
        n = omp_get_num_procs() / (rt->node_size > 0 ? rt->node_size : 1);
        if (n < 1)
            n = 1;
        omp_set_num_threads(n);
    }
    {
        /* nodes with different rank counts give different shares: the range, not rank 0's */
        int range[2] = {-n, n};
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
        if (rt->world_rank == 0 && -range[0] == range[1])
            printf("OpenMP threads per rank: %d (%s)\n", n,
                   env && env[0] ? "OMP_NUM_THREADS" : "cores visible / ranks on the node; "
                                                      "OMP_NUM_THREADS overrides");
        else if (rt->world_rank == 0)
            printf("OpenMP threads per rank: %d to %d (%s)\n", -range[0], range[1],
                   env && env[0] ? "OMP_NUM_THREADS" : "cores visible / ranks on the node, "
                                                      "which differ between nodes; "
                                                      "OMP_NUM_THREADS overrides");
    }
#else
    (void)rt;
#endif
}

/* &run mode = 'pipeline': the preprocessing ranks run mode 'process' while the training ranks
 * run mode 'train' with the loader following the shards as they are committed
 * (doc/loader.md "Follow mode"). A half that fails ends the whole job at once (MPI_Abort with
 * its exit status): the other half would otherwise wait for shards that never come, or go on
 * preprocessing for a job that has failed. A half that is done waits for the other without
 * spinning (the trainers usually finish first and must leave the cores to preprocessing); the
 * job ends when both are done, so every planned shard is committed: the shard directory is the
 * one mode 'process' writes, reusable by later 'train' runs. With &run pipeline_end = 'training'
 * the trainers tell preprocessing when they are done, and it stops at its next shard boundary.
 * SIGUSR1 / SIGTERM reaching either half stop both, with status 0: the half that caught it stops
 * at its next boundary and tells the other (runtime.h, SD_PIPELINE_STOP_TAG), which does too. */
static int run_pipeline(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev)
{
    const int process = rt->role == SD_ROLE_PROCESS;
    const char *half = process ? "preprocessing" : "training";
    const char *other = process ? "training" : "preprocessing";
    int code;
    sd_log_set_info_leader(rt->role_rank == 0);
    sd_pipeline_stop_listen(rt); /* before either half may stop for a signal */
    code = process ? sd_mode_process(rc, rt, dev) : sd_mode_train(rc, rt, dev);
    if (code != SD_EXIT_OK) {
        /* The ranks of a half agree on its status; one MPI_Abort is enough (Open MPI 4.1 can
         * lose the output when several ranks abort at once), the pause lets the launcher
         * forward the messages first. The other ranks abort too should rank 0 not. */
        struct timespec pause = {0, 200000000};
        if (rt->role_rank == 0)
            fprintf(stderr, "sdtrain: mode 'pipeline': the %s half failed (exit status %d); ending "
                            "the whole job\n", process ? "preprocessing" : "training", code);
        else
            pause.tv_sec = 5;
        fflush(stdout);
        fflush(stderr);
        nanosleep(&pause, NULL);
        MPI_Abort(MPI_COMM_WORLD, code);
    }
    if (!process && !strcmp(rc->cfg.run.pipeline_end, "training")) {
        /* (after a signal stop too: preprocessing waits for this word before it ends) */
        if (rt->role_rank == 0 && !sd_ckpt_signal_pending() && !sd_pipeline_stop_heard(rt))
            sd_info("mode 'pipeline': training is done; preprocessing stops at its next shard "
                    "(&run pipeline_end = 'training')");
        sd_pipeline_send_trained(rt);
    }
    if (rt->role_rank == 0)
        sd_info("mode 'pipeline': the %s half is done; waiting for the %s half", half, other);
    {
        /* a signal meanwhile is passed on: the other half stops instead of going on alone */
        MPI_Request barrier;
        int sig;
        SD_MPI_CHECK(MPI_Ibarrier(MPI_COMM_WORLD, &barrier));
        /* as long as the other half works, under its own stall watchdog */
        sd_progress_wait_begin("waiting for the other half of the pipeline");
        sig = sd_pipeline_wait_watching(rt, &barrier);
        sd_progress_wait_end();
        if (sig)
            sd_info("mode 'pipeline': %s while the %s half waits: the %s half stops at its next "
                    "%s", sd_ckpt_signal_name(sig), half, other,
                    process ? "step, with a checkpoint" : "shard boundary");
    }
    sd_pipeline_stop_close(rt);
    sd_log_set_info_leader(rt->world_rank == 0);
    if (rt->world_rank == 0)
        sd_info("mode 'pipeline': both halves are done");
    return SD_EXIT_OK;
}

static int run_mode(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev)
{
    const char *mode = rc->cfg.run.mode;
    const char *what = "work that is not filed yet";
    if (!strcmp(mode, "process"))
        return sd_mode_process(rc, rt, dev);
    if (!strcmp(mode, "train"))
        return sd_mode_train(rc, rt, dev);
    if (!strcmp(mode, "sample"))
        return sd_mode_sample(rc, rt, dev);
    if (!strcmp(mode, "pipeline"))
        return run_pipeline(rc, rt, dev);
    /* The other modes' work is not implemented yet: say so instead of pretending. */
    if (rt->world_rank == 0)
        fprintf(stderr, "sdtrain: mode '%s' is not implemented in this build yet: it needs %s. "
                        "Configuration and communicators are set up; nothing was computed.\n",
                mode, what);
    return SD_EXIT_NOT_IMPLEMENTED;
}

int main(int argc, char **argv)
{
    cli c;
    sd_err err;
    sd_run_config rc;
    sd_runtime rt;
    sd_layout layout;
    sd_device_info dev;
    int rank, size, code;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            if (sd_launcher_rank() == 0)
                print_help();
            return SD_EXIT_OK;
        }
        if (!strcmp(argv[i], "--version")) {
            if (sd_launcher_rank() == 0)
                sd_print_version("sdtrain");
            return SD_EXIT_OK;
        }
    }

    /* Command-line and SDTRAIN_FAULT errors are found before MPI starts; every rank finds
     * the same ones, and only the launcher's rank 0 prints. */
    sd_err_clear(&err);
    if (parse_cli(argc, argv, &c, &err) != 0 || sd_fault_init_from_env(&err) != 0) {
        if (sd_launcher_rank() == 0)
            fprintf(stderr, "sdtrain: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    sd_run_config_init(&rc);

    if (c.check && c.np) {
        /* The layout of a job this process does not run: no MPI, no split, no device probe,
         * so job scripts can call it on a login or batch node. */
        code = SD_EXIT_OK;
        if (sd_config_load(&rc, c.input, c.n_set, c.sets, &err) != 0 ||
            check_schedule(&rc, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            code = SD_EXIT_USAGE;
        } else if (sd_layout_compute(&rc.cfg, c.np, &layout, &err) != 0) {
            fprintf(stderr, "%s: %s\n", rc.source, err.msg);
            code = SD_EXIT_USAGE;
        } else {
            check_mode_inputs(&c, &rc);
            char *text = sd_config_to_namelist(&rc, true);
            printf("%s: configuration is valid\n%s", c.input, text);
            print_layout_for(&rc, &layout);
            printf("device = '%s' (resolved on each rank when the job starts)\n", rc.cfg.run.device);
            if (!strcmp(rc.cfg.run.mode, "train") || !strcmp(rc.cfg.run.mode, "pipeline"))
                print_checkpoint_plan(&rc.cfg);
            free(text);
        }
        sd_run_config_free(&rc);
        free(c.sets);
        return code;
    }

    sd_mpi_start(&argc, &argv);
    memset(&rt, 0, sizeof rt);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);

    code = load_config(&c, rank, &rc);
    if (code)
        return finish(NULL, code);
    if (!c.check) {
        if (sd_watchdog_start(rc.cfg.run.stall_timeout, -1, "&run stall_timeout", on_stall,
                              (void *)stall_advice(rc.cfg.run.mode)) != 0) {
            sd_warn("cannot start the stall watchdog (&run stall_timeout): %s; going on without "
                    "it", strerror(errno));
        } else {
            struct sigaction sa = {.sa_handler = on_usr2, .sa_flags = SA_RESTART};
            sigemptyset(&sa.sa_mask);
            sigaction(SIGUSR2, &sa, NULL);
        }
    }
    sd_log_set_level((sd_log_level)sd_log_level_from_name(rc.cfg.run.log_level));
    /* validated with the configuration, so the same on every rank and cannot fail here */
    SD_CHECK(sd_h5_set_file_options(rc.cfg.run.io_hints, rc.cfg.run.io_alignment, &err) == 0,
             "%s", err.msg);

    if (sd_layout_compute(&rc.cfg, size, &layout, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "%s: %s\n", rc.source, err.msg);
        return finish(NULL, SD_EXIT_USAGE);
    }

    sd_runtime_split(&rc.cfg, &layout, &rt);
    code = resolve_devices(&rc, &rt, &dev);
    if (code)
        return finish(&rt, code);

    if (!c.check) {
        int failed = 0;
        /* one job per output directory: a second one would interleave checkpoints, metrics
         * and samples with the first's */
        if (rank == 0 && (sd_mkdir_p(rc.cfg.run.output_dir, "directory", &err) != 0 ||
                          sd_lock_dir(rc.cfg.run.output_dir, ".sdtrain.lock", "output directory",
                                      &err) != 0 ||
                          write_used_nml(&rc, &c, size, &err) != 0)) {
            fprintf(stderr, "sdtrain: %s\n", err.msg);
            failed = 1;
        }
        /* an output_dir that cannot be made (a file of that name, no such parent, no
         * permission) is the configuration's; a failing storage is worth a retry */
        if (sd_agree(MPI_COMM_WORLD, failed, &err))
            return finish(&rt, err.storage ? SD_EXIT_FAILURE : SD_EXIT_USAGE);
    }
    if (rank == 0) {
        char *text = sd_config_to_namelist(&rc, true);
        if (c.check)
            printf("%s: configuration is valid\n", c.input);
        else
            printf("sdtrain %s (git %s): %s, mode '%s', %d rank(s)\n", sd_version(),
                   sd_git_revision(), c.input, rc.cfg.run.mode, size);
        printf("%s", text);
        if (!c.check)
            printf("effective configuration written to %s/used.nml\n", rc.cfg.run.output_dir);
        free(text);
        fflush(stdout);
    }
    sd_runtime_report(&rt);
    if (rank == 0)
        printf("device = '%s': rank 0 computes on %s\n", rc.cfg.run.device, dev.name);
    if (rank == 0 && c.check &&
        (!strcmp(rc.cfg.run.mode, "train") || !strcmp(rc.cfg.run.mode, "pipeline")))
        print_checkpoint_plan(&rc.cfg);

    if (!c.check)
        share_cores(&rt);
    code = c.check ? SD_EXIT_OK : run_mode(&rc, &rt, &dev);
    sd_run_config_free(&rc);
    free(c.sets);
    return finish(&rt, code);
}
