/* Text-to-image generation as diffusers' StableDiffusionPipeline does it: text encoder,
 * classifier-free guided U-Net denoising loop, VAE decode, on a CPU or CUDA backend. */
#ifndef SDTRAIN_TEXT2IMG_H
#define SDTRAIN_TEXT2IMG_H
/*
 * The models run on the backend (weights and activations in its memory, elements of its
 * dtype); latents, embeddings and images cross to the host as fp32 at every step, where the
 * scheduler (sampler.h) works. Up to max_images images at a time: with guidance the U-Net runs
 * on the batch [uncond x nb, cond_0 .. cond_nb-1] (the pipeline's order for one image); the CPU
 * backend's batch invariance makes every image the same bits as a batch of one. Tensors are
 * channels-last: latents [h, w, C], images [H, W, 3].
 */
#include <stdint.h>
#include "sdtrain/arena.h"
#include "sdtrain/clip.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/sampler.h"
#include "sdtrain/tokenizer.h"
#include "sdtrain/unet.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_t2i {
    sd_cmd_backend cb;
    const sd_backend *be;
    sd_unet_config ucfg;
    sd_vae_config vcfg;
    sd_clip_config ccfg;
    sd_weights uw, vw, cw;           /* host fp32 (owned) */
    void *uparams, *vparams, *cparams; /* backend copies (host backend: the same memory) */
    sd_unet *unet;
    sd_vae *vae;
    sd_clip *clip;
    sd_tokenizer *tok;               /* owned */
    sd_arena unet_arena, vae_arena, clip_arena;
    void *d_lat, *d_eps, *d_ctx, *d_ids, *d_emb, *d_img; /* backend buffers */
    float *h_eps;                    /* host [2 max_images n] */
    float *h_ts;                     /* host [2 max_images]: the timestep of each batch row */
    float *h_z;                      /* host [max_images n]: a stochastic step's noise */
    float *h_in;                     /* host [max_images n]: the scaled model input (Euler) */
    double guidance_rescale;         /* the pipeline's guidance_rescale; 0 after open (off) */
    int max_images;                  /* images per denoising call at most */
    int max_decode;                  /* images per VAE decode call at most (<= max_images) */
    int height, width, lh, lw, lc, hidden; /* image and latent sides */
    int64_t n_latent, n_image, n_emb;
} sd_t2i;

/* Builds the generator. Takes ownership of the weights (zeroed in the caller's structs) and of
 * `tok`, also on failure. device "cpu" | "cuda" (CUDA ordinal gpu), precision "fp32" | "bf16"
 * (CUDA only). Images are height x width pixels (each a multiple of the VAE's factor
 * 2^(levels - 1)); the latents are height / factor x width / factor.
 * Returns 0, or -1 with a message (shape mismatches between the parts included); sd_t2i_close
 * cleans up either way. */
int sd_t2i_open(sd_t2i *g, const char *device, int gpu, const char *precision,
                const sd_unet_config *uc, sd_weights *uw, const sd_vae_config *vc,
                sd_weights *vw, const sd_clip_config *cc, sd_weights *cw, sd_tokenizer *tok,
                int height, int width, int max_images, int max_decode, sd_err *err);
void sd_t2i_close(sd_t2i *g);

/* Tokenizes `prompt` (77 ids, the pipeline's max_length padding and truncation) into ids
 * (may be NULL) and encodes it: emb = last_hidden_state [77, hidden] on the host. -1 with a
 * message when an id is beyond the text encoder's vocabulary. */
int sd_t2i_encode(sd_t2i *g, const char *prompt, int32_t *ids, float *emb, sd_err *err);
/* The same from ids (each in [0, vocab_size), checked by the caller). */
void sd_t2i_encode_ids(sd_t2i *g, const int32_t *ids, float *emb);

/* The noise of model call k (n values, channels-last), asked for before each step that takes
 * noise (sd_sampler_step_noise: DDPM with t > 0, DDIM with eta > 0, Euler ancestral). */
typedef void (*sd_t2i_noise_fn)(void *user, int k, float *out, int64_t n);

/* The denoising loop: for each timestep of the sampler (reset first), eps = U-Net(scaled
 * latents, t, [uncond, cond]) combined with guidance (then rescaled by g->guidance_rescale when
 * > 0), or U-Net(scaled latents, t, cond) when uncond is NULL; then the scheduler step. latents
 * (host [lh, lw, C]) in: the initial noise times the sampler's init_noise_sigma, out: the
 * result. */
void sd_t2i_denoise(sd_t2i *g, sd_sampler *s, const float *cond, const float *uncond,
                    double guidance, float *latents, sd_t2i_noise_fn noise, void *noise_user);
/* The same for nb images at once (1 <= nb <= max_images): conds [nb, 77, hidden], unconds
 * [nb, 77, hidden] (each image's own: its negative prompt's encoding) or NULL, latents
 * [nb, lh, lw, C], the sampler made for nb latents (s->n = nb * n_latent), noise_users[b] the
 * noise source of image b. */
void sd_t2i_denoise_batch(sd_t2i *g, sd_sampler *s, int nb, const float *conds,
                          const float *unconds, double guidance, float *latents,
                          sd_t2i_noise_fn noise, void *const *noise_users);

/* image (host [height, width, 3], about [-1, 1]) = VAE decode of latents / scale (fp32 division,
 * as the pipeline's latents / vae.config.scaling_factor). */
void sd_t2i_decode(sd_t2i *g, const float *latents, double scale, float *image);
/* The same for nb images in one decoder call (1 <= nb <= max_decode): latents [nb, lh, lw, C],
 * images [nb, height, width, 3]. */
void sd_t2i_decode_batch(sd_t2i *g, int nb, const float *latents, double scale, float *images);

#ifdef __cplusplus
}
#endif
#endif
