/* Text-to-image generation on one backend: prompt -> text embedding -> guided denoising loop
 * -> VAE decode (StableDiffusionPipeline's order; see include/sdtrain/text2img.h). */
#include "sdtrain/text2img.h"

#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

#define TEXT_LEN SD_TOKENIZER_LENGTH

static void take_weights(sd_weights *dst, sd_weights *src)
{
    *dst = *src;
    memset(src, 0, sizeof *src);
}

void sd_t2i_close(sd_t2i *g)
{
    if (g->unet)
        sd_unet_free(g->unet);
    if (g->vae)
        sd_vae_free(g->vae);
    if (g->clip)
        sd_clip_free(g->clip);
    if (g->be) {
        sd_cmd_release(&g->cb, g->uparams, g->uw.data);
        sd_cmd_release(&g->cb, g->vparams, g->vw.data);
        sd_cmd_release(&g->cb, g->cparams, g->cw.data);
        void *bufs[] = {g->d_lat, g->d_eps, g->d_ctx, g->d_ids, g->d_emb, g->d_img};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i])
                sd_backend_free(g->be, bufs[i]);
        sd_cmd_arena_free(&g->cb, &g->unet_arena);
        sd_cmd_arena_free(&g->cb, &g->vae_arena);
        sd_cmd_arena_free(&g->cb, &g->clip_arena);
        sd_cmd_backend_close(&g->cb);
    }
    if (g->tok)
        sd_tokenizer_free(g->tok);
    if (g->uw.data)
        sd_weights_free(&g->uw);
    if (g->vw.data)
        sd_weights_free(&g->vw);
    if (g->cw.data)
        sd_weights_free(&g->cw);
    free(g->h_eps);
    free(g->h_ts);
    free(g->h_z);
    free(g->h_in);
    memset(g, 0, sizeof *g);
}

int sd_t2i_open(sd_t2i *g, const char *device, int gpu, const char *precision,
                const sd_unet_config *uc, sd_weights *uw, const sd_vae_config *vc,
                sd_weights *vw, const sd_clip_config *cc, sd_weights *cw, sd_tokenizer *tok,
                int height, int width, int max_images, int max_decode, sd_err *err)
{
    int factor, oh, ow;
    memset(g, 0, sizeof *g);
    g->max_images = max_images > 0 ? max_images : 1;
    g->max_decode = max_decode < 1 ? 1 : max_decode > g->max_images ? g->max_images : max_decode;
    g->ucfg = *uc;
    g->vcfg = *vc;
    g->ccfg = *cc;
    take_weights(&g->uw, uw);
    take_weights(&g->vw, vw);
    take_weights(&g->cw, cw);
    g->tok = tok;

    if (g->ucfg.in_channels != g->vcfg.latent_channels ||
        g->ucfg.out_channels != g->ucfg.in_channels)
        return sd_err_set(err, "the U-Net takes %d and gives %d channels, the VAE's latents have "
                               "%d", g->ucfg.in_channels, g->ucfg.out_channels,
                          g->vcfg.latent_channels);
    if (g->ucfg.cross_attention_dim != g->ccfg.hidden_size)
        return sd_err_set(err, "the U-Net attends to %d-wide text embeddings, the text encoder "
                               "gives %d", g->ucfg.cross_attention_dim, g->ccfg.hidden_size);
    factor = 1 << (g->vcfg.n_levels - 1);
    if (height < factor || height % factor != 0 || width < factor || width % factor != 0)
        return sd_err_set(err, "%dx%d px images: each side must be a positive multiple of the "
                               "VAE's factor %d", width, height, factor);
    g->height = height;
    g->width = width;
    g->lh = height / factor;
    g->lw = width / factor;
    g->lc = g->vcfg.latent_channels;
    g->hidden = g->ccfg.hidden_size;
    g->n_latent = (int64_t)g->lh * g->lw * g->lc;
    g->n_image = (int64_t)height * width * g->vcfg.out_channels;
    g->n_emb = (int64_t)TEXT_LEN * g->hidden;
    if (g->vcfg.out_channels != 3)
        return sd_err_set(err, "the VAE decodes to %d channels; images need 3 (RGB)",
                          g->vcfg.out_channels);
    if (sd_unet_check_shape(&g->ucfg, 2 * g->max_images, g->lh, g->lw, TEXT_LEN, err) ||
        sd_vae_check_latent_shape(&g->vcfg, g->max_decode, g->lh, g->lw, &oh, &ow, err) ||
        sd_clip_check_shape(&g->ccfg, 1, TEXT_LEN, err))
        return -1;
    if (oh != height || ow != width)
        return sd_err_set(err, "the VAE decodes %dx%d latents to %dx%d, not %dx%d px", g->lw,
                          g->lh, ow, oh, width, height);

    if (sd_cmd_backend_open(device, gpu, precision, &g->cb, err))
        return -1;
    g->be = g->cb.be;
    g->uparams = sd_cmd_put(&g->cb, g->uw.data, (int64_t)g->uw.table.total_floats);
    g->vparams = sd_cmd_put(&g->cb, g->vw.data, (int64_t)g->vw.table.total_floats);
    g->cparams = sd_cmd_put(&g->cb, g->cw.data, (int64_t)g->cw.table.total_floats);
    if (!g->uparams || !g->vparams || !g->cparams)
        return sd_err_set(err, "cannot allocate the weights on the %s backend", g->be->name);
    if (sd_unet_create(&g->unet, &g->ucfg, &g->uw.table, g->uparams, g->be, err) ||
        sd_vae_create(&g->vae, &g->vcfg, &g->vw.table, g->vparams, g->be, err) ||
        sd_clip_create(&g->clip, &g->ccfg, &g->cw.table, g->cparams, g->be, err))
        return -1;
    if (sd_cmd_arena(&g->cb, sd_unet_scratch_bytes(&g->ucfg, g->be, 2 * g->max_images, g->lh,
                                                   g->lw, TEXT_LEN),
                     &g->unet_arena) ||
        sd_cmd_arena(&g->cb,
                     sd_vae_decode_scratch_bytes(&g->vcfg, g->be, g->max_decode, g->lh, g->lw),
                     &g->vae_arena) ||
        sd_cmd_arena(&g->cb, sd_clip_scratch_bytes(&g->ccfg, g->be, 1, TEXT_LEN), &g->clip_arena))
        return sd_err_set(err, "cannot allocate the activation memory on the %s backend",
                          g->be->name);
    {
        const size_t es = sd_dtype_size(g->be->dtype), rows = 2 * (size_t)g->max_images;
        g->d_lat = sd_backend_alloc(g->be, rows * (size_t)g->n_latent * es);
        g->d_eps = sd_backend_alloc(g->be, rows * (size_t)g->n_latent * es);
        g->d_ctx = sd_backend_alloc(g->be, rows * (size_t)g->n_emb * es);
        g->d_ids = sd_backend_alloc(g->be, TEXT_LEN * sizeof(int32_t));
        g->d_emb = sd_backend_alloc(g->be, (size_t)g->n_emb * es);
        g->d_img = sd_backend_alloc(g->be, (size_t)g->max_decode * (size_t)g->n_image * es);
        if (!g->d_lat || !g->d_eps || !g->d_ctx || !g->d_ids || !g->d_emb || !g->d_img)
            return sd_err_set(err, "cannot allocate the sampling buffers on the %s backend",
                              g->be->name);
    }
    g->h_eps = sd_xmalloc(2 * (size_t)g->max_images * (size_t)g->n_latent * sizeof(float));
    g->h_ts = sd_xmalloc(2 * (size_t)g->max_images * sizeof(float));
    g->h_z = sd_xmalloc((size_t)g->max_images * (size_t)g->n_latent * sizeof(float));
    g->h_in = sd_xmalloc((size_t)g->max_images * (size_t)g->n_latent * sizeof(float));
    return 0;
}

void sd_t2i_encode_ids(sd_t2i *g, const int32_t *ids, float *emb)
{
    sd_upload(g->be, g->d_ids, ids, TEXT_LEN * sizeof(int32_t));
    sd_clip_forward(g->clip, 1, TEXT_LEN, (const int32_t *)g->d_ids, g->d_emb, &g->clip_arena,
                    NULL);
    sd_synchronize(g->be);
    sd_download_f32(g->be, emb, g->d_emb, g->n_emb);
}

int sd_t2i_encode(sd_t2i *g, const char *prompt, int32_t *ids_out, float *emb, sd_err *err)
{
    int32_t ids[TEXT_LEN];
    sd_tokenize(g->tok, prompt, strlen(prompt), ids, NULL);
    for (int i = 0; i < TEXT_LEN; i++)
        if (ids[i] < 0 || ids[i] >= g->ccfg.vocab_size)
            return sd_err_set(err, "prompt '%.200s': token id %d is beyond the text encoder's "
                                   "vocabulary of %d (tokenizer and text encoder do not belong "
                                   "together)", prompt, (int)ids[i], g->ccfg.vocab_size);
    if (ids_out)
        memcpy(ids_out, ids, sizeof ids);
    sd_t2i_encode_ids(g, ids, emb);
    return 0;
}

void sd_t2i_denoise_batch(sd_t2i *g, sd_sampler *s, int nb, const float *conds,
                          const float *unconds, double guidance, float *latents,
                          sd_t2i_noise_fn noise, void *const *noise_users)
{
    const int64_t n = g->n_latent, nn = (int64_t)nb * n;
    const int rows = unconds ? 2 * nb : nb;
    const size_t es = sd_dtype_size(g->be->dtype);
    float *eps = g->h_eps;
    SD_CHECK(nb >= 1 && nb <= g->max_images, "%d images for a generator of %d", nb,
             g->max_images);
    SD_CHECK(s->n == nn, "sampler for %lld elements, latents of %d images have %lld",
             (long long)s->n, nb, (long long)nn);
    /* contexts [uncond_0 .. uncond_nb-1, cond_0 .. cond_nb-1] (or the conds) stay on the
     * backend for the whole loop */
    if (unconds)
        sd_upload_f32(g->be, g->d_ctx, unconds, (int64_t)nb * g->n_emb);
    sd_upload_f32(g->be, (char *)g->d_ctx + (size_t)(rows - nb) * (size_t)g->n_emb * es, conds,
                  (int64_t)nb * g->n_emb);
    sd_sampler_reset(s);
    for (int i = 0; i < s->n_timesteps; i++) {
        /* scale_model_input (Euler: / sqrt(sigma^2 + 1)), the latents once per half of the
         * batch */
        const float *in = latents;
        if (sd_sampler_scales_input(s)) {
            sd_sampler_scale_input(s, i, nn, latents, g->h_in);
            in = g->h_in;
        }
        for (int r = 0; r < rows; r++)
            g->h_ts[r] = s->model_t[i];
        for (int h = 0; h < rows / nb; h++)
            sd_upload_f32(g->be, (char *)g->d_lat + (size_t)h * (size_t)nn * es, in, nn);
        sd_unet_forward(g->unet, rows, g->lh, g->lw, g->d_lat, g->h_ts, g->d_ctx, TEXT_LEN,
                        g->d_eps, &g->unet_arena, NULL);
        sd_synchronize(g->be);
        sd_download_f32(g->be, eps, g->d_eps, (int64_t)rows * n);
        if (unconds) {
            sd_guidance_combine(nn, eps, eps + nn, guidance, eps);
            if (g->guidance_rescale > 0.0)
                for (int b = 0; b < nb; b++)
                    sd_guidance_rescale(n, eps + (size_t)b * (size_t)n,
                                        eps + (size_t)(nn + (int64_t)b * n), g->guidance_rescale);
        }
        const float *z = NULL;
        if (sd_sampler_step_noise(s, i)) {
            SD_CHECK(noise != NULL, "%s sampling needs a noise source",
                     sd_sampler_kind_name(s->kind));
            for (int b = 0; b < nb; b++)
                noise(noise_users[b], i, g->h_z + (size_t)b * (size_t)n, n);
            z = g->h_z;
        }
        sd_sampler_step(s, i, eps, latents, z);
    }
}

void sd_t2i_denoise(sd_t2i *g, sd_sampler *s, const float *cond, const float *uncond,
                    double guidance, float *latents, sd_t2i_noise_fn noise, void *noise_user)
{
    void *users[1] = {noise_user};
    sd_t2i_denoise_batch(g, s, 1, cond, uncond, guidance, latents, noise, users);
}

void sd_t2i_decode_batch(sd_t2i *g, int nb, const float *latents, double scale, float *images)
{
    const float sf = (float)scale;
    const int64_t n = (int64_t)nb * g->n_latent;
    float *x;
    SD_CHECK(nb >= 1 && nb <= g->max_decode, "%d images to decode, at most %d a call", nb,
             g->max_decode);
    x = sd_xmalloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = latents[i] / sf;
    sd_upload_f32(g->be, g->d_lat, x, n);
    sd_vae_decode(g->vae, nb, g->lh, g->lw, g->d_lat, g->d_img, &g->vae_arena, NULL);
    sd_synchronize(g->be);
    sd_download_f32(g->be, images, g->d_img, (int64_t)nb * g->n_image);
    free(x);
}

void sd_t2i_decode(sd_t2i *g, const float *latents, double scale, float *image)
{
    sd_t2i_decode_batch(g, 1, latents, scale, image);
}
