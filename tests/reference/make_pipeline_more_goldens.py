"""Writes the whole-pipeline goldens of the samplers added after make_scheduler_goldens.py:
StableDiffusionPipeline on tests/data/models/tiny-sd2 as there (its prompts, tokenizer, initial
latents and per-step noise), 4 steps, guidance 7.5, checked by tests/unit/test_sampler.c
(test_pipeline).

Reference: diffusers 0.42.1 / torch 2.15.0 / scipy 1.17.1 on the CPU in fp32
(requirements-models.txt), under ATEN_CPU_CAPABILITY=avx2.

Output: tests/data/sample/pipelines_more.safetensors (all F32; latents and images NHWC):
  p_<case>_latents [2,8,8,4], p_<case>_image [2,16,16,3], p_<case>_u8 [2,16,16,3] for
        lms (LMSDiscreteScheduler, linspace), dpm2 (KDPM2DiscreteScheduler, linspace, 7 U-Net
        calls), zsnr_ddim (DDIMScheduler with rescale_betas_zero_snr, v_prediction, 'trailing'
        spacing, and the pipeline's guidance_rescale 0.7: zero terminal SNR's recipe; tiny-sd2's
        random U-Net read as a v model)

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_pipeline_more_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_sample_goldens import PROMPTS, SNAP, STEPS, nhwc  # noqa: E402
from make_scheduler_goldens import OUT, SD2, patch_noise, save_goldens  # noqa: E402


def main():
    import diffusers as D
    from transformers import CLIPTextModel, CLIPTokenizer

    torch.set_num_threads(1)
    out = {}
    tok = CLIPTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"), model_max_length=77)
    unet = D.UNet2DConditionModel.from_pretrained(os.path.join(SNAP, "unet")).eval()
    vae = D.AutoencoderKL.from_pretrained(os.path.join(SNAP, "vae")).eval()
    te = CLIPTextModel.from_pretrained(os.path.join(SNAP, "text_encoder")).eval()
    # the same initial latents and noise as make_scheduler_goldens.py's pipeline cases
    lat0 = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    dnoise = torch.randn((STEPS, 2, 4, 8, 8), generator=torch.Generator().manual_seed(2))
    cases = (
        ("lms", D.LMSDiscreteScheduler(num_train_timesteps=1000, **SD2), {}),
        ("dpm2", D.KDPM2DiscreteScheduler(num_train_timesteps=1000, **SD2), {}),
        ("zsnr_ddim", D.DDIMScheduler(num_train_timesteps=1000, clip_sample=False, set_alpha_to_one=False,
                                      steps_offset=1, prediction_type="v_prediction",
                                      rescale_betas_zero_snr=True, timestep_spacing="trailing", **SD2),
         dict(guidance_rescale=0.7)),
    )
    for name, s, call_kw in cases:
        pipe = D.StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=s,
                                         safety_checker=None, feature_extractor=None,
                                         requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        patch_noise(dnoise)
        with torch.no_grad():
            lat = pipe(PROMPTS, height=16, width=16, num_inference_steps=STEPS, guidance_scale=7.5,
                       latents=lat0.clone(), output_type="latent", **call_kw).images
            img = vae.decode(lat / vae.config.scaling_factor, return_dict=False)[0]
        u8 = (pipe.image_processor.postprocess(img, output_type="np") * 255).round().astype("uint8")
        out[f"p_{name}_latents"] = nhwc(lat)
        out[f"p_{name}_image"] = nhwc(img)
        out[f"p_{name}_u8"] = u8.astype(np.float32)
        print(name, "timesteps", s.timesteps.tolist(), "latents rms", float(lat.pow(2).mean().sqrt()))

    save_goldens(out, "pipelines_more.safetensors", "make_pipeline_more_goldens.py")


if __name__ == "__main__":
    main()
