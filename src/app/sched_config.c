/* The sampling schedule from &diffusion or a snapshot's scheduler_config.json (sched_config.h). */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sdtrain/json_file.h"
#include "sdtrain/sched_config.h"

void sd_sched_from_diffusion(sd_sched_setup *ss, const char *schedule, const char *prediction,
                             double beta_start, double beta_end, int64_t num_train_timesteps,
                             int zero_snr)
{
    memset(ss, 0, sizeof *ss);
    snprintf(ss->source, sizeof ss->source, "&diffusion");
    snprintf(ss->schedule, sizeof ss->schedule, "%s", schedule);
    snprintf(ss->prediction, sizeof ss->prediction, "%s", prediction);
    ss->beta_start = beta_start;
    ss->beta_end = beta_end;
    ss->T = num_train_timesteps > INT32_MAX ? INT32_MAX : (int)num_train_timesteps;
    ss->zero_snr = zero_snr;
    ss->steps_offset = 1;
    ss->spacing = SD_SPACING_LEADING;
    ss->dpm_order = 2;
    ss->lower_order_final = 1;
}

/* UniPC's disable_corrector: diffusers tests `step_index - 1 in disable_corrector`, so a number
 * equal to a step index (1.0 and true count, as in Python) disables that step's corrector and
 * other numbers match no step; anything but a number is refused as the mistake it most likely
 * is. */
static void read_disable_corrector(sd_jconf *j, sd_sched_setup *ss)
{
    json_object *v = sd_jconf_value(j, "disable_corrector");
    if (!v)
        return;
    if (!json_object_is_type(v, json_type_array)) {
        sd_jconf_fail(j, "%s: %s must be a list of step indices%s", "disable_corrector", NULL);
        return;
    }
    for (size_t k = 0; k < json_object_array_length(v); k++) {
        json_object *e = json_object_array_get_idx(v, k);
        if (!json_object_is_type(e, json_type_int) && !json_object_is_type(e, json_type_double) &&
            !json_object_is_type(e, json_type_boolean)) {
            char detail[48];
            snprintf(detail, sizeof detail, "[%zu] is not a step index", k);
            sd_jconf_fail(j, "%s: %s%s", "disable_corrector", detail);
            return;
        }
        const double x = json_object_get_double(e);
        if (x >= 0.0 && x < SD_SAMPLER_MAX_DISABLE && x == floor(x))
            ss->unipc_nocorr[(int)x / 8] |= (unsigned char)(1u << ((int)x % 8));
    }
}

int sd_sched_read(sd_sched_setup *ss, sd_sampler_kind kind, const char *path, sd_err *err)
{
    sd_jconf j;
    const int dpm = kind == SD_SAMPLER_DPMPP_2M || kind == SD_SAMPLER_DPMPP_2M_SDE,
              unipc = kind == SD_SAMPLER_UNIPC, multi = dpm || unipc,
              sigmas = sd_sampler_takes_sigma_schedule(kind);
    /* the file's values, with the diffusers classes' defaults */
    /* set_alpha_to_one: DDIMScheduler's default true, PNDMScheduler's false */
    int offset = 0, alpha_to_one = kind == SD_SAMPLER_DDIM, clip = 1, zero_snr = 0, karras = 0, expo = 0, beta = 0,
        skip_prk = 0, predict_x0 = 1, thresholding = 0, flow = 0, dynamic_shift = 0,
        lu_lambdas = 0;
    double lambda_min_clipped = -INFINITY, sigma_bound = 0;
    const char *schedule = "linear", *prediction = "epsilon", *spacing = NULL;
    /* the string options of some classes (NULL: absent) */
    const char *solver_type = NULL, *final_sigmas = NULL, *variance = NULL, *interpolation = NULL,
               *timestep_type = NULL, *algorithm = NULL;

    if (sd_jconf_open(&j, path, err) != 0)
        return -1;
    memset(ss, 0, sizeof *ss);
    snprintf(ss->source, sizeof ss->source, "%s", path);
    ss->beta_start = 0.0001;
    ss->beta_end = 0.02;
    ss->T = 1000;
    ss->spacing = sd_sampler_default_spacing(kind);
    ss->dpm_order = 2;
    ss->lower_order_final = 1;

    sd_jconf_int(&j, "num_train_timesteps", &ss->T);
    sd_jconf_double(&j, "beta_start", &ss->beta_start);
    sd_jconf_double(&j, "beta_end", &ss->beta_end);
    sd_jconf_string(&j, "beta_schedule", &schedule);
    sd_jconf_string(&j, "prediction_type", &prediction);
    sd_jconf_int(&j, "steps_offset", &offset);
    sd_jconf_bool(&j, "set_alpha_to_one", &alpha_to_one);
    sd_jconf_bool(&j, "clip_sample", &clip);
    sd_jconf_bool(&j, "rescale_betas_zero_snr", &zero_snr);
    sd_jconf_bool(&j, "use_karras_sigmas", &karras);
    sd_jconf_bool(&j, "use_exponential_sigmas", &expo);
    sd_jconf_bool(&j, "use_beta_sigmas", &beta);
    sd_jconf_bool(&j, "skip_prk_steps", &skip_prk);
    sd_jconf_bool(&j, "thresholding", &thresholding);
    sd_jconf_bool(&j, "use_flow_sigmas", &flow);
    sd_jconf_bool(&j, "use_dynamic_shifting", &dynamic_shift);
    sd_jconf_bool(&j, "use_lu_lambdas", &lu_lambdas);
    sd_jconf_double(&j, "lambda_min_clipped", &lambda_min_clipped);
    sd_jconf_double(&j, "sigma_min", &sigma_bound);
    sd_jconf_double(&j, "sigma_max", &sigma_bound);
    sd_jconf_string(&j, "timestep_spacing", &spacing);
    if (multi) {
        sd_jconf_int(&j, "solver_order", &ss->dpm_order);
        sd_jconf_bool(&j, "lower_order_final", &ss->lower_order_final);
    }
    if (unipc) {
        sd_jconf_bool(&j, "predict_x0", &predict_x0);
        read_disable_corrector(&j, ss);
    }
    if (dpm) {
        sd_jconf_bool(&j, "euler_at_final", &ss->euler_at_final);
        sd_jconf_string(&j, "algorithm_type", &algorithm);
    }
    if (multi)
        sd_jconf_string(&j, "solver_type", &solver_type);
    if (sd_sampler_takes_final_sigma_min(kind))
        sd_jconf_string(&j, "final_sigmas_type", &final_sigmas);
    if (kind == SD_SAMPLER_DDPM || dpm)
        sd_jconf_string(&j, "variance_type", &variance);
    if (kind == SD_SAMPLER_EULER) {
        sd_jconf_string(&j, "interpolation_type", &interpolation);
        sd_jconf_string(&j, "timestep_type", &timestep_type);
    }
    if (j.failed)
        return sd_jconf_close(&j);

    snprintf(ss->schedule, sizeof ss->schedule, "%s", schedule);
    snprintf(ss->prediction, sizeof ss->prediction, "%s", prediction);
    /* set_alpha_to_one is DDIM's and PNDM's (their final_alpha_cumprod); clip_sample DDIM's and
     * DDPM's (Heun's too, but the pipeline turns it off) */
    ss->set_alpha_to_one = (kind == SD_SAMPLER_DDIM || kind == SD_SAMPLER_PNDM) && alpha_to_one;
    /* from_config keeps the keys a class does not take in its config, and every class with a
     * sigma schedule reads sigma_min / sigma_max from there as the ends of its Karras,
     * exponential and beta sigmas: refused then (sd_sched_sampler), as not implemented */
    ss->sigma_bounds = sd_jconf_value(&j, "sigma_min") || sd_jconf_value(&j, "sigma_max");
    clip = clip && (kind == SD_SAMPLER_DDIM || kind == SD_SAMPLER_DDPM);
    /* StableDiffusionPipeline.__init__: "steps_offset should be set to 1", "clip_sample
     * should be set to False" */
    ss->steps_offset = 1;
    if (offset != 1 || clip)
        snprintf(ss->adjusted, sizeof ss->adjusted, "%s%s%s",
                 offset != 1 ? "steps_offset 1 (the file: " : "",
                 offset != 1 ? (offset == 0 ? "0)" : "other)") : "",
                 clip ? (offset != 1 ? ", clip_sample false" : "clip_sample false") : "");
    /* EulerAncestral, DDIM, PNDM, DDPM have no such option: from_config ignores the key */
    ss->zero_snr = zero_snr;
    ss->karras = sigmas && karras;
    ss->expo = sigmas && expo;
    ss->beta = sigmas && beta;
    /* PNDMScheduler's default is skip_prk_steps false: the Runge-Kutta warm-up */
    ss->pndm_prk = kind == SD_SAMPLER_PNDM && !skip_prk;
    ss->unipc_eps = unipc && !predict_x0;
    ss->unipc_bh1 = unipc && solver_type && !strcmp(solver_type, "bh1");
    if (unipc && solver_type && !ss->unipc_bh1 && strcmp(solver_type, "bh2") != 0)
        sd_jconf_fail(&j, "%s: solver_type '%s' is not implemented for 'unipc' (bh1 or bh2)%s",
                      solver_type, NULL);
    /* diffusers registers the solver types of other solvers as midpoint */
    ss->dpm_heun = dpm && solver_type && !strcmp(solver_type, "heun");
    ss->sigma_min = final_sigmas && !strcmp(final_sigmas, "sigma_min");
    if (final_sigmas && !ss->sigma_min && strcmp(final_sigmas, "zero") != 0)
        sd_jconf_fail(&j, "%s: final_sigmas_type '%s' is not one of zero, sigma_min%s",
                      final_sigmas, NULL);
    if (spacing) {
        const int sp = sd_spacing_from_name(spacing);
        if (sp < 0)
            sd_jconf_fail(&j, "%s: timestep_spacing '%s' is not one of leading, trailing, "
                              "linspace%s", spacing, NULL);
        else
            ss->spacing = (sd_spacing)sp;
    }
    if (j.failed)
        return sd_jconf_close(&j);

    int rc = 0;
    if (sd_jconf_value(&j, "trained_betas"))
        rc = sd_err_set(err, "%s: trained_betas are not implemented", path);
    else if (kind != SD_SAMPLER_PNDM && thresholding)
        rc = sd_err_set(err, "%s: thresholding is not implemented", path);
    else if (!sd_sampler_takes_zero_snr(kind) && zero_snr)
        rc = sd_err_set(err, "%s: rescale_betas_zero_snr is set, which diffusers' %s would "
                             "ignore (sampling another schedule than the model's): use ddim, "
                             "ddpm, euler, euler_a, dpmpp_2m, dpmpp_2m_sde or unipc", path,
                        sd_sampler_class_name(kind));
    else if (kind == SD_SAMPLER_DDPM && variance && strcmp(variance, "fixed_small") != 0)
        rc = sd_err_set(err, "%s: variance_type '%s' is not implemented for 'ddpm' (only "
                             "'fixed_small')", path, variance);
    else if (ss->karras + ss->expo + ss->beta > 1)
        rc = sd_err_set(err, "%s: more than one of use_karras_sigmas, use_exponential_sigmas and "
                             "use_beta_sigmas is set", path);
    else if (kind == SD_SAMPLER_EULER &&
             (sd_jconf_value(&j, "sigma_min") || sd_jconf_value(&j, "sigma_max")))
        rc = sd_err_set(err, "%s: sigma_min / sigma_max are not implemented for 'euler'", path);
    else if (interpolation && strcmp(interpolation, "linear") != 0)
        rc = sd_err_set(err, "%s: interpolation_type '%s' is not implemented (only 'linear')",
                        path, interpolation);
    else if (timestep_type && strcmp(timestep_type, "discrete") != 0)
        rc = sd_err_set(err, "%s: timestep_type '%s' is not implemented (only 'discrete')", path,
                        timestep_type);
    else if (unipc && (flow || dynamic_shift))
        rc = sd_err_set(err, "%s: use_flow_sigmas and use_dynamic_shifting are not implemented",
                        path);
    else if (multi && (ss->dpm_order < 1 || ss->dpm_order > 3))
        rc = sd_err_set(err, "%s: solver_order %d is not implemented for '%s' (1 to 3)", path,
                        ss->dpm_order, sd_sampler_kind_name(kind));
    else if (algorithm && strcmp(algorithm, "dpmsolver++") != 0 &&
             strcmp(algorithm, "sde-dpmsolver++") != 0)
        rc = sd_err_set(err, "%s: algorithm_type '%s' is not implemented (dpmsolver++ and "
                             "sde-dpmsolver++: &sample scheduler 'dpmpp_2m' / 'dpmpp_2m_sde')",
                        path, algorithm);
    else if (dpm && variance)
        rc = sd_err_set(err, "%s: variance_type '%s' is not implemented for '%s'", path, variance,
                        sd_sampler_kind_name(kind));
    else if (dpm && isfinite(lambda_min_clipped))
        rc = sd_err_set(err, "%s: lambda_min_clipped %g is not implemented (only -inf)", path,
                        lambda_min_clipped);
    else if (dpm && (lu_lambdas || flow || dynamic_shift))
        rc = sd_err_set(err, "%s: use_lu_lambdas, use_flow_sigmas and use_dynamic_shifting are "
                             "not implemented", path);
    sd_jconf_close(&j);
    return rc;
}

/* err's message prefixed by `source` */
static int prefixed(sd_err *err, const char *source)
{
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return sd_err_set(err, "%s: %s", source, msg);
}

int sd_sched_diffusion(const sd_sched_setup *ss, sd_diffusion *d, sd_err *err)
{
    if (sd_diffusion_init(d, ss->schedule, ss->beta_start, ss->beta_end, ss->T, ss->prediction,
                          SD_LINSPACE_FUSED, err) != 0)
        return prefixed(err, ss->source);
    if (!ss->zero_snr)
        return 0;
    if (d->prediction == SD_PRED_EPSILON) {
        sd_diffusion_free(d);
        return sd_err_set(err, "%s: rescale_betas_zero_snr with prediction_type 'epsilon': at "
                               "zero SNR an epsilon prediction gives no image (needs "
                               "'v_prediction')", ss->source);
    }
    if (sd_diffusion_rescale_zero_snr(d, err) != 0) {
        sd_diffusion_free(d);
        return prefixed(err, ss->source);
    }
    return 0;
}

int sd_sched_sampler(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d,
                     const sd_sched_setup *ss, int num_steps, int64_t n, sd_err *err)
{
    if (ss->sigma_bounds && (ss->karras || ss->expo || ss->beta))
        return sd_err_set(err, "%s: sigma_min / sigma_max are not implemented (diffusers' %s "
                               "makes them the ends of its %s sigmas): remove them from the "
                               "file, or sample without %s sigmas", ss->source,
                          sd_sampler_class_name(kind),
                          ss->karras ? "Karras" : ss->expo ? "exponential" : "beta",
                          ss->karras ? "Karras" : ss->expo ? "exponential" : "beta");
    if (sd_sampler_init(s, kind, d, num_steps, ss->spacing, ss->steps_offset, n, err) != 0)
        return -1;
    if ((ss->sigma_min && sd_sampler_final_sigma_min(s, err) != 0) ||
        (ss->karras && sd_sampler_use_karras(s, err) != 0) ||
        (ss->expo && sd_sampler_use_exponential(s, err) != 0) ||
        (ss->beta && sd_sampler_use_beta(s, err) != 0) ||
        (ss->pndm_prk && sd_sampler_pndm_prk(s, err) != 0)) {
        sd_sampler_free(s);
        return -1;
    }
    s->dpm_order = ss->dpm_order;
    s->dpm_heun = ss->dpm_heun;
    s->lower_order_final = ss->lower_order_final;
    s->euler_at_final = ss->euler_at_final;
    s->unipc_bh1 = ss->unipc_bh1;
    s->unipc_eps = ss->unipc_eps;
    memcpy(s->unipc_nocorr, ss->unipc_nocorr, sizeof s->unipc_nocorr);
    if (sd_sampler_check_options(s, err) != 0) { /* NaN-making combinations */
        sd_sampler_free(s);
        return prefixed(err, ss->source);
    }
    if (ss->set_alpha_to_one)
        s->final_alpha_cumprod = 1.0f;
    return 0;
}
