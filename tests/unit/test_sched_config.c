/* Scheduler configurations (scheduler_config.json, sched_config.h): SD2's file, the diffusers
 * classes' defaults and the pipeline's fix-ups, typed keys, and a clear error for every file the
 * reader refuses; the JSON file reader (json_file.h) it shares with the model configurations. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/json_file.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/sched_config.h"
#include "tap.h"

static char tmpdir[64];

static const char *write_text(const char *name, const char *text, size_t len)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len)
        tap_diag("cannot write %s", path);
    if (f)
        fclose(f);
    return path;
}

/* Reads `text` as a scheduler_config.json for `kind`; returns sd_sched_read's status. */
static int read_config(const char *text, sd_sampler_kind kind, sd_sched_setup *ss, sd_err *err)
{
    const char *path = write_text("scheduler_config.json", text, strlen(text));
    sd_err_clear(err);
    return sd_sched_read(ss, kind, path, err);
}

static void expect_error(const char *text, sd_sampler_kind kind, const char *want)
{
    sd_sched_setup ss;
    sd_err err;
    const int rc = read_config(text, kind, &ss, &err);
    tap_ok(rc == -1 && strstr(err.msg, "scheduler_config.json") && strstr(err.msg, want),
           "%s: %s refused: %s", sd_sampler_kind_name(kind), text, err.msg);
}

static const char *sd2_base =
    "{\n  \"_class_name\": \"PNDMScheduler\",\n  \"_diffusers_version\": \"0.10.0.dev0\",\n"
    "  \"beta_end\": 0.012,\n  \"beta_schedule\": \"scaled_linear\",\n  \"beta_start\": 0.00085,\n"
    "  \"clip_sample\": false,\n  \"num_train_timesteps\": 1000,\n"
    "  \"prediction_type\": \"epsilon\",\n  \"set_alpha_to_one\": false,\n"
    "  \"skip_prk_steps\": true,\n  \"steps_offset\": 1,\n  \"trained_betas\": null\n}\n";

static void test_sd2(void)
{
    sd_sched_setup ss;
    sd_err err;
    for (int k = 0; k < SD_SAMPLER_N_KINDS; k++) {
        const int rc = read_config(sd2_base, (sd_sampler_kind)k, &ss, &err);
        tap_ok(rc == 0 && ss.T == 1000 && !strcmp(ss.schedule, "scaled_linear") &&
                   !strcmp(ss.prediction, "epsilon") && ss.beta_start == 0.00085 &&
                   ss.beta_end == 0.012 && ss.steps_offset == 1 && !ss.set_alpha_to_one &&
                   !ss.pndm_prk && !ss.adjusted[0] && !ss.zero_snr &&
                   ss.spacing == sd_sampler_default_spacing((sd_sampler_kind)k),
               "SD2-base's file read for %s (%s)", sd_sampler_kind_name((sd_sampler_kind)k),
               rc ? err.msg : "ok");
        if (rc != 0)
            continue;
        sd_diffusion d;
        sd_sampler s;
        int ok = sd_sched_diffusion(&ss, &d, &err) == 0;
        ok = ok && sd_sched_sampler(&s, (sd_sampler_kind)k, &d, &ss, 25, 16, &err) == 0;
        tap_ok(ok && s.num_steps == 25, "%s: 25-step sampler from it (%s)",
               sd_sampler_kind_name((sd_sampler_kind)k), ok ? "ok" : err.msg);
        if (ok)
            sd_sampler_free(&s);
        sd_diffusion_free(&d);
    }
}

/* An empty object: each diffusers class's own defaults, then the pipeline's fix-ups. */
static void test_defaults(void)
{
    sd_sched_setup ss;
    sd_err err;
    int rc = read_config("{}", SD_SAMPLER_DDIM, &ss, &err);
    tap_ok(rc == 0 && ss.T == 1000 && !strcmp(ss.schedule, "linear") && ss.beta_start == 0.0001 &&
               ss.beta_end == 0.02 && ss.set_alpha_to_one && ss.steps_offset == 1 &&
               ss.spacing == SD_SPACING_LEADING &&
               !strcmp(ss.adjusted, "steps_offset 1 (the file: 0), clip_sample false"),
           "ddim defaults: linear 1e-4..0.02, set_alpha_to_one, fix-ups '%s'", ss.adjusted);
    rc = read_config("{}", SD_SAMPLER_PNDM, &ss, &err);
    tap_ok(rc == 0 && ss.pndm_prk && !ss.set_alpha_to_one &&
               !strcmp(ss.adjusted, "steps_offset 1 (the file: 0)"),
           "pndm defaults: Runge-Kutta warm-up, no clip_sample to fix ('%s')", ss.adjusted);
    rc = read_config("{\"steps_offset\": 1, \"set_alpha_to_one\": true}", SD_SAMPLER_EULER, &ss,
                     &err);
    tap_ok(rc == 0 && ss.spacing == SD_SPACING_LINSPACE && !ss.set_alpha_to_one && !ss.adjusted[0],
           "euler: linspace, set_alpha_to_one ignored (not its option)");
    rc = read_config("{\"solver_order\": 3, \"solver_type\": \"heun\", \"lower_order_final\": "
                     "false, \"euler_at_final\": true, \"algorithm_type\": \"sde-dpmsolver++\", "
                     "\"lambda_min_clipped\": -Infinity, \"use_karras_sigmas\": true, "
                     "\"final_sigmas_type\": \"sigma_min\"}",
                     SD_SAMPLER_DPMPP_2M_SDE, &ss, &err);
    tap_ok(rc == 0 && ss.dpm_order == 3 && ss.dpm_heun && !ss.lower_order_final &&
               ss.euler_at_final && ss.karras && ss.sigma_min,
           "dpmpp_2m_sde: its options read (%s)", rc ? err.msg : "ok");
    rc = read_config("{\"solver_order\": 3, \"use_karras_sigmas\": true}", SD_SAMPLER_DDIM, &ss,
                     &err);
    tap_ok(rc == 0 && ss.dpm_order == 2 && !ss.karras, "ddim: other classes' options ignored");
    rc = read_config("{\"solver_type\": \"bh1\", \"predict_x0\": false, \"disable_corrector\": "
                     "[0, 2.0, true, 7.5, -1, 100000]}",
                     SD_SAMPLER_UNIPC, &ss, &err);
    tap_ok(rc == 0 && ss.unipc_bh1 && ss.unipc_eps && ss.unipc_nocorr[0] == 0x07,
           "unipc: bh1, noise prediction, disable_corrector bits 0-2 (0x%02x)", ss.unipc_nocorr[0]);
    rc = read_config("{\"num_train_timesteps\": 500.0, \"timestep_spacing\": \"trailing\", "
                     "\"rescale_betas_zero_snr\": true, \"prediction_type\": \"v_prediction\"}",
                     SD_SAMPLER_EULER, &ss, &err);
    tap_ok(rc == 0 && ss.T == 500 && ss.spacing == SD_SPACING_TRAILING && ss.zero_snr,
           "an integral number (500.0) is an integer; trailing; zero SNR");
    sd_sched_from_diffusion(&ss, "scaled_linear", "v_prediction", 0.00085, 0.012, 1000, 0);
    tap_ok(!strcmp(ss.source, "&diffusion") && ss.spacing == SD_SPACING_LEADING &&
               ss.steps_offset == 1 && ss.dpm_order == 2 && ss.lower_order_final,
           "from &diffusion: SD's conventions");
}

static void test_refusals(void)
{
    /* the JSON types of the keys */
    expect_error("{\"num_train_timesteps\": \"1000\"}", SD_SAMPLER_DDIM,
                 "'num_train_timesteps' must be an integer");
    expect_error("{\"num_train_timesteps\": 1000.5}", SD_SAMPLER_DDIM,
                 "'num_train_timesteps' must be an integer");
    expect_error("{\"num_train_timesteps\": 1e300}", SD_SAMPLER_DDIM,
                 "'num_train_timesteps' must be an integer");
    expect_error("{\"beta_start\": \"0.1\"}", SD_SAMPLER_EULER, "'beta_start' must be a number");
    expect_error("{\"clip_sample\": \"false\"}", SD_SAMPLER_DDIM,
                 "'clip_sample' must be true or false");
    expect_error("{\"use_karras_sigmas\": 1}", SD_SAMPLER_EULER,
                 "'use_karras_sigmas' must be true or false");
    expect_error("{\"beta_schedule\": 3}", SD_SAMPLER_DDIM, "'beta_schedule' must be a string");
    expect_error("{\"timestep_spacing\": [\"leading\"]}", SD_SAMPLER_DDIM,
                 "'timestep_spacing' must be a string");
    expect_error("{\"solver_order\": \"2\"}", SD_SAMPLER_DPMPP_2M, "'solver_order' must be an integer");
    expect_error("{\"solver_type\": 2}", SD_SAMPLER_UNIPC, "'solver_type' must be a string");
    expect_error("{\"algorithm_type\": null, \"variance_type\": 1}", SD_SAMPLER_DPMPP_2M,
                 "'variance_type' must be a string");
    /* values and options sdtrain does not implement */
    expect_error("{\"timestep_spacing\": \"even\"}", SD_SAMPLER_DDIM,
                 "timestep_spacing 'even' is not one of leading, trailing, linspace");
    expect_error("{\"trained_betas\": [0.1, 0.2]}", SD_SAMPLER_DDIM, "trained_betas are not implemented");
    expect_error("{\"thresholding\": true}", SD_SAMPLER_DDIM, "thresholding is not implemented");
    expect_error("{\"rescale_betas_zero_snr\": true}", SD_SAMPLER_PNDM, "PNDMScheduler would ignore");
    expect_error("{\"variance_type\": \"learned\"}", SD_SAMPLER_DDPM,
                 "variance_type 'learned' is not implemented for 'ddpm'");
    expect_error("{\"use_karras_sigmas\": true, \"use_beta_sigmas\": true}", SD_SAMPLER_EULER,
                 "more than one of use_karras_sigmas");
    expect_error("{\"sigma_min\": 0.1}", SD_SAMPLER_EULER, "sigma_min / sigma_max");
    expect_error("{\"interpolation_type\": \"log_linear\"}", SD_SAMPLER_EULER,
                 "interpolation_type 'log_linear'");
    expect_error("{\"timestep_type\": \"continuous\"}", SD_SAMPLER_EULER, "timestep_type 'continuous'");
    expect_error("{\"final_sigmas_type\": \"one\"}", SD_SAMPLER_EULER,
                 "final_sigmas_type 'one' is not one of zero, sigma_min");
    expect_error("{\"solver_type\": \"bh3\"}", SD_SAMPLER_UNIPC, "solver_type 'bh3' is not implemented");
    expect_error("{\"disable_corrector\": 1}", SD_SAMPLER_UNIPC,
                 "disable_corrector must be a list of step indices");
    expect_error("{\"disable_corrector\": [0, \"1\"]}", SD_SAMPLER_UNIPC,
                 "disable_corrector[1] is not a step index");
    expect_error("{\"use_dynamic_shifting\": true}", SD_SAMPLER_UNIPC, "use_dynamic_shifting");
    expect_error("{\"solver_order\": 4}", SD_SAMPLER_DPMPP_2M, "solver_order 4 is not implemented");
    expect_error("{\"algorithm_type\": \"dpmsolver\"}", SD_SAMPLER_DPMPP_2M,
                 "algorithm_type 'dpmsolver' is not implemented");
    expect_error("{\"lambda_min_clipped\": -5.1}", SD_SAMPLER_DPMPP_2M,
                 "lambda_min_clipped -5.1 is not implemented");
    expect_error("{\"use_lu_lambdas\": true}", SD_SAMPLER_DPMPP_2M, "use_lu_lambdas");
    /* the file itself */
    expect_error("{\"beta_start\": 0.1,\n \"beta_end\": }", SD_SAMPLER_DDIM,
                 "scheduler_config.json:2:14: invalid JSON");
    expect_error("{\"beta_start\": 0.1", SD_SAMPLER_DDIM, "unexpected end of file");
    expect_error("", SD_SAMPLER_DDIM, "unexpected end of file");
    expect_error("[1, 2]", SD_SAMPLER_DDIM, "the top level must be an object");
    expect_error("null", SD_SAMPLER_DDIM, "the top level must be an object");
    expect_error("{} {}", SD_SAMPLER_DDIM, "text after the top-level value at byte 3");
    {
        sd_sched_setup ss;
        sd_err err;
        const char *path = write_text("scheduler_config.json", "{\"a\": 1}\0{}", 11);
        tap_ok(sd_sched_read(&ss, SD_SAMPLER_DDIM, path, &err) == -1 &&
                   strstr(err.msg, "contains a NUL byte"),
               "a NUL byte: %s", err.msg);
        char p[128];
        snprintf(p, sizeof p, "%s/fifo.json", tmpdir);
        tap_ok(mkfifo(p, 0600) == 0 && sd_sched_read(&ss, SD_SAMPLER_DDIM, p, &err) == -1 &&
                   strstr(err.msg, "fifo.json: not a regular file"),
               "a FIFO is refused, not waited on: %s", err.msg);
        tap_ok(sd_sched_read(&ss, SD_SAMPLER_DDIM, tmpdir, &err) == -1 &&
                   strstr(err.msg, "not a regular file"),
               "a folder: %s", err.msg);
        snprintf(p, sizeof p, "%s/none.json", tmpdir);
        tap_ok(sd_sched_read(&ss, SD_SAMPLER_DDIM, p, &err) == -1 &&
                   strstr(err.msg, "none.json: cannot read: No such file"),
               "a missing file: %s", err.msg);
    }
}

/* Values the reader passes on that the schedule or the sampler refuses, named by the file. */
static void test_schedule_errors(void)
{
    static const struct {
        const char *text, *want;
        sd_sampler_kind kind;
    } cases[] = {
        {"{\"beta_end\": 1.5}", "need 0 < beta_start", SD_SAMPLER_DDIM},
        {"{\"beta_schedule\": \"sigmoid\"}", "unknown beta_schedule 'sigmoid'", SD_SAMPLER_DDIM},
        {"{\"prediction_type\": \"sample\"}", "unknown prediction_type 'sample'", SD_SAMPLER_EULER},
        {"{\"num_train_timesteps\": 0}", "num_train_timesteps 0 out of", SD_SAMPLER_DDIM},
        {"{\"rescale_betas_zero_snr\": true}", "an epsilon prediction gives no image", SD_SAMPLER_DDIM},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sd_sched_setup ss;
        sd_diffusion d;
        sd_err err;
        int rc = read_config(cases[i].text, cases[i].kind, &ss, &err);
        if (rc == 0)
            rc = sd_sched_diffusion(&ss, &d, &err);
        tap_ok(rc == -1 && strstr(err.msg, "scheduler_config.json: ") && strstr(err.msg, cases[i].want),
               "%s: %s", cases[i].text, err.msg);
        if (rc == 0)
            sd_diffusion_free(&d);
    }
    /* a sampler the schedule cannot give: named by the file as well */
    sd_sched_setup ss;
    sd_diffusion d;
    sd_sampler s;
    sd_err err;
    int rc = read_config("{\"num_train_timesteps\": 10}", SD_SAMPLER_DDIM, &ss, &err);
    rc = rc ? rc : sd_sched_diffusion(&ss, &d, &err);
    if (rc == 0) {
        rc = sd_sched_sampler(&s, SD_SAMPLER_DDIM, &d, &ss, 50, 4, &err);
        sd_diffusion_free(&d);
    }
    tap_ok(rc == -1 && strstr(err.msg, "50"), "50 steps of a 10-step schedule: %s", err.msg);
    rc = read_config("{\"solver_order\": 1, \"euler_at_final\": true, \"final_sigmas_type\": "
                     "\"sigma_min\", \"beta_schedule\": \"scaled_linear\"}",
                     SD_SAMPLER_DPMPP_2M, &ss, &err);
    tap_ok(rc == 0, "dpmpp_2m options read");
}

/* sigma_min / sigma_max: every class with a sigma schedule takes them from its config (from_config
 * keeps the keys a class does not name) as the ends of its Karras, exponential and beta sigmas;
 * refused there rather than ignored, with the file's and with the namelist's choice of sigmas. */
static void test_sigma_bounds(void)
{
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_HEUN,  SD_SAMPLER_LMS,        SD_SAMPLER_DPM2,
                                            SD_SAMPLER_DPM2_A, SD_SAMPLER_DPMPP_SDE,
                                            SD_SAMPLER_DPMPP_2M, SD_SAMPLER_UNIPC};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (int c = 0; c < 3; c++) {
            static const char *const texts[3] = {
                "{\"beta_schedule\": \"scaled_linear\", \"use_karras_sigmas\": true, "
                "\"sigma_min\": 0.1, \"sigma_max\": 10.0}",
                "{\"beta_schedule\": \"scaled_linear\", \"sigma_max\": 10.0}",
                "{\"beta_schedule\": \"scaled_linear\", \"use_karras_sigmas\": true, "
                "\"sigma_min\": null, \"sigma_max\": null}"};
            sd_sched_setup ss;
            sd_diffusion d;
            sd_sampler s;
            sd_err err;
            int rc = read_config(texts[c], kinds[k], &ss, &err);
            if (rc == 0 && c == 1)
                ss.expo = 1; /* &sample use_exponential_sigmas */
            rc = rc ? rc : sd_sched_diffusion(&ss, &d, &err);
            if (rc == 0) {
                rc = sd_sched_sampler(&s, kinds[k], &d, &ss, 10, 4, &err);
                if (rc == 0)
                    sd_sampler_free(&s);
                sd_diffusion_free(&d);
            }
            if (c < 2)
                tap_ok(rc == -1 && strstr(err.msg, "scheduler_config.json: sigma_min / sigma_max") &&
                           strstr(err.msg, c ? "exponential" : "Karras"),
                       "%s: sigma_min / sigma_max with %s sigmas refused: %s",
                       sd_sampler_kind_name(kinds[k]), c ? "the namelist's exponential" : "Karras",
                       rc ? err.msg : "accepted");
            else
                tap_ok(rc == 0, "%s: sigma_min / sigma_max null (diffusers' default) accepted (%s)",
                       sd_sampler_kind_name(kinds[k]), rc ? err.msg : "ok");
        }
    }
    sd_sched_setup ss;
    sd_err err;
    const int rc = read_config("{\"sigma_min\": 0.1}", SD_SAMPLER_HEUN, &ss, &err);
    tap_ok(rc == 0 && ss.sigma_bounds, "heun: sigma_min without a Karras schedule: unused, read");
}

/* tests/data/sample/sched_config.safetensors (make_sched_config_goldens.py): schedulers built
 * from a scheduler_config.json, stepped on its random inputs. The JSON texts are the script's. */
#define SD2_KEYS "\"beta_start\": 0.00085, \"beta_end\": 0.012, \"beta_schedule\": " \
                 "\"scaled_linear\", \"num_train_timesteps\": 1000, \"steps_offset\": 1"
#define CFG_N (2 * 3 * 5 * 4)
static void test_config_steps(void)
{
    static const struct {
        const char *name, *text;
        sd_sampler_kind kind;
        int steps, calls;
    } cases[] = {
        {"pndm_alpha1_eps", "{" SD2_KEYS ", \"skip_prk_steps\": true, \"set_alpha_to_one\": true}",
         SD_SAMPLER_PNDM, 5, 6},
        {"pndm_alpha1_v",
         "{" SD2_KEYS ", \"skip_prk_steps\": true, \"set_alpha_to_one\": true, "
         "\"prediction_type\": \"v_prediction\"}",
         SD_SAMPLER_PNDM, 5, 6},
        {"pndm_prk_alpha1_eps",
         "{" SD2_KEYS ", \"skip_prk_steps\": false, \"set_alpha_to_one\": true}", SD_SAMPLER_PNDM,
         5, 14},
        {"pndm_from_ddim_eps",
         "{\"_class_name\": \"DDIMScheduler\", " SD2_KEYS ", \"clip_sample\": true, "
         "\"set_alpha_to_one\": true, \"skip_prk_steps\": true}",
         SD_SAMPLER_PNDM, 5, 6},
    };
    const char *srcdir = getenv("srcdir");
    char path[4200];
    sd_st_file f;
    sd_err err;
    snprintf(path, sizeof path, "%s/tests/data/sample/sched_config.safetensors",
             srcdir ? srcdir : ".");
    if (!tap_ok(sd_st_open(path, &f, &err) == 0, "open %s", path)) {
        tap_diag("%s", err.msg);
        return;
    }
    float *x0 = malloc(CFG_N * sizeof *x0), *mo = malloc(20 * CFG_N * sizeof *mo);
    const int have = sd_st_read_f32(&f, "in_sample", x0, CFG_N, &err) == 0 &&
                     sd_st_read_f32(&f, "in_model_out", mo, 20 * CFG_N, &err) == 0;
    tap_ok(have, "step inputs read");
    for (size_t c = 0; have && c < sizeof cases / sizeof cases[0]; c++) {
        sd_sched_setup ss;
        sd_diffusion d;
        sd_sampler s;
        char name[64];
        float x[CFG_N];
        double worst = 0.0;
        int rc = read_config(cases[c].text, cases[c].kind, &ss, &err);
        rc = rc ? rc : sd_sched_diffusion(&ss, &d, &err);
        if (rc == 0 && (rc = sd_sched_sampler(&s, cases[c].kind, &d, &ss, cases[c].steps, CFG_N,
                                              &err)) != 0)
            sd_diffusion_free(&d);
        if (rc != 0) {
            tap_ok(0, "%s: %s", cases[c].name, err.msg);
            continue;
        }
        snprintf(name, sizeof name, "step_%s", cases[c].name);
        float *ref = malloc((size_t)s.n_timesteps * CFG_N * sizeof *ref);
        const int ok = s.n_timesteps == cases[c].calls &&
                       sd_st_read_f32(&f, name, ref, (size_t)s.n_timesteps * CFG_N, &err) == 0;
        for (int64_t j = 0; j < CFG_N; j++)
            x[j] = x0[j] * s.init_noise_sigma;
        sd_sampler_reset(&s);
        for (int i = 0; ok && i < s.n_timesteps; i++) {
            sd_sampler_step(&s, i, mo + (size_t)i * CFG_N, x, NULL);
            double num = 0.0, den = 0.0;
            for (int64_t j = 0; j < CFG_N; j++) {
                const double e = (double)x[j] - ref[(size_t)i * CFG_N + (size_t)j];
                num += e * e;
                den += (double)ref[(size_t)i * CFG_N + (size_t)j] * ref[(size_t)i * CFG_N + (size_t)j];
            }
            const double r = sqrt(num / den);
            worst = r > worst || isnan(r) ? r : worst;
        }
        tap_ok(ok && worst <= 1e-6, "%s: %d calls from the file's config within %.3g of diffusers' "
                                    "(set_alpha_to_one %d)",
               cases[c].name, s.n_timesteps, worst, ss.set_alpha_to_one);
        free(ref);
        sd_sampler_free(&s); /* it points into d's arrays */
        sd_diffusion_free(&d);
    }
    free(x0);
    free(mo);
    sd_st_close(&f);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sdtrain-sched-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    test_sd2();
    test_defaults();
    test_refusals();
    test_schedule_errors();
    test_sigma_bounds();
    test_config_steps();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", tmpdir);
    return tap_done();
}
