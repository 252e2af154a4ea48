"""Writes the sampling goldens that tests/unit/test_sampler.c compares against.

Reference: diffusers 0.42.1 / torch 2.15.0 / transformers 5.23.0 on the CPU in fp32
(tests/reference/requirements-models.txt), schedulers configured as SD2's
scheduler_config.json (scaled_linear 0.00085..0.012, 1000 steps, steps_offset 1,
set_alpha_to_one false, clip_sample false, skip_prk_steps true).

Output (tests/data/sample/):
  tokenizer/vocab.json, tokenizer/merges.txt
      a tiny CLIP BPE vocabulary (256 byte symbols, their </w> forms, a few merges, bos, eos:
      521 ids) whose ids fit the tiny-sd2 text encoder (vocab_size 1000), so the whole
      text-to-image path runs from prompt strings; CLIPTokenizer reads the same files.
  goldens.safetensors (all F32; latents and images channels-last, NHWC):
    ts_<sched>_<N>_<T>      scheduler.timesteps after set_timesteps(N) with num_train_timesteps T
                            (sched = ddim | pndm | ddpm)
    step_sample             [2,3,5,4] the starting sample of the step-only tests
    step_model_out          [6,2,3,5,4] random model outputs, one per timestep (N = 5)
    step_noise              [6,2,3,5,4] the per-step DDPM noise (what randn_tensor returns)
    step_<sched>_<pred>     [n_t,2,3,5,4] the sample after each scheduler.step (pred = eps | v)
    step_ddim_clip          DDIM with clip_sample and set_alpha_to_one, from 3 * step_sample
    step_ddpm_clip          DDPM with clip_sample, from 3 * step_sample
    ids_cond [2,77], ids_uncond [77]   token ids of PROMPTS and of ""
    init_latents            [2,8,8,4] the initial latents (torch.randn, seed 0)
    ddpm_noise              [4,2,8,8,4] the per-step noise of the DDPM loop
    latents_<sched>_g<G>    [2,8,8,4] StableDiffusionPipeline(output_type='latent') final
                            latents, 4 steps, guidance G in {75 (7.5), 10 (1.0)}
    image_<sched>_g<G>      [2,16,16,3] vae.decode(latents / scaling_factor).sample
    u8_<sched>_g<G>         [2,16,16,3] the pipeline's uint8 post-processing of that image

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_sample_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import json
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.join(TOP, "tests", "data", "sample")
SNAP = os.path.join(TOP, "tests", "data", "models", "tiny-sd2")
PROMPTS = ["a photo of the cat", "red car at the sea"]
STEPS = 4
SCHED_KW = dict(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                beta_schedule="scaled_linear", steps_offset=1)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tokenizer(d):
    os.makedirs(d, exist_ok=True)
    syms = list(bytes_to_unicode().values())
    vocab = syms + [s + "</w>" for s in syms]
    merges = [("t", "h"), ("th", "e</w>"), ("c", "a"), ("ca", "t</w>"), ("r", "e"),
              ("re", "d</w>"), ("a", "r</w>"), ("o", "f</w>"), ("p", "h"), ("ph", "o")]
    for a, b in merges:
        vocab.append(a + b)
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    with open(os.path.join(d, "vocab.json"), "w") as f:
        json.dump({t: i for i, t in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")


def schedulers(pred="epsilon"):
    from diffusers import DDIMScheduler, DDPMScheduler, PNDMScheduler
    return {
        "ddim": DDIMScheduler(clip_sample=False, set_alpha_to_one=False, prediction_type=pred, **SCHED_KW),
        "pndm": PNDMScheduler(skip_prk_steps=True, set_alpha_to_one=False, prediction_type=pred, **SCHED_KW),
        "ddpm": DDPMScheduler(clip_sample=False, variance_type="fixed_small", prediction_type=pred, **SCHED_KW),
    }


class FixedNoise:
    """Stands in for randn_tensor in scheduling_ddpm: hands out the given tensors in order."""

    def __init__(self, noises):
        self.noises = list(noises)

    def __call__(self, shape, generator=None, device=None, dtype=None, **kw):
        n = self.noises.pop(0)
        assert tuple(n.shape) == tuple(shape), (n.shape, shape)
        return n.clone()


def nhwc(x):
    return x.permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32)


def main():
    import diffusers.schedulers.scheduling_ddpm as ddpm_mod
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    torch.set_num_threads(1)
    out = {}
    tokdir = os.path.join(OUT, "tokenizer")
    write_tokenizer(tokdir)

    # 1. timesteps
    for T in (1000, 10, 500):
        for N in (1, 2, 4, 5, 7, 10, 50, 999, 1000):
            if N > T:
                continue
            kw = dict(SCHED_KW, num_train_timesteps=T)
            from diffusers import DDIMScheduler, DDPMScheduler, PNDMScheduler
            for name, s in (("ddim", DDIMScheduler(**kw)), ("pndm", PNDMScheduler(skip_prk_steps=True, **kw)),
                            ("ddpm", DDPMScheduler(**kw))):
                s.set_timesteps(N)
                out[f"ts_{name}_{N}_{T}"] = s.timesteps.numpy().astype(np.float32)

    # 2. steps on random inputs (5 inference steps, PNDM takes 6)
    g = torch.Generator().manual_seed(1)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((6,) + shape, generator=g)
    noise = torch.randn((6,) + shape, generator=g)
    out["step_sample"] = sample0.numpy()
    out["step_model_out"] = mos.numpy()
    out["step_noise"] = noise.numpy()
    for pred, tag in (("epsilon", "eps"), ("v_prediction", "v")):
        for name, s in schedulers(pred).items():
            s.set_timesteps(5)
            ddpm_mod.randn_tensor = FixedNoise(noise)
            x = sample0.clone()
            res = []
            for i, t in enumerate(s.timesteps):
                x = s.step(mos[i], t, x, return_dict=False)[0]
                res.append(x.clone())
            out[f"step_{name}_{tag}"] = torch.stack(res).numpy()
    # the options a scheduler_config.json may set: clip_sample (DDIM, DDPM), set_alpha_to_one
    from diffusers import DDIMScheduler, DDPMScheduler
    for name, s in (("ddim", DDIMScheduler(clip_sample=True, set_alpha_to_one=True, **SCHED_KW)),
                    ("ddpm", DDPMScheduler(clip_sample=True, **SCHED_KW))):
        s.set_timesteps(5)
        ddpm_mod.randn_tensor = FixedNoise(noise)
        x = sample0.clone() * 3  # so that x0 leaves [-1, 1]
        res = []
        for i, t in enumerate(s.timesteps):
            x = s.step(mos[i], t, x, return_dict=False)[0]
            res.append(x.clone())
        out[f"step_{name}_clip"] = torch.stack(res).numpy()

    # 3. the whole pipeline on the tiny snapshot
    tok = CLIPTokenizer.from_pretrained(tokdir, model_max_length=77)
    ids = tok(PROMPTS, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    uids = tok([""], padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
    out["ids_cond"] = ids.numpy().astype(np.float32)
    out["ids_uncond"] = uids[0].numpy().astype(np.float32)
    unet = UNet2DConditionModel.from_pretrained(os.path.join(SNAP, "unet")).eval()
    vae = AutoencoderKL.from_pretrained(os.path.join(SNAP, "vae")).eval()
    te = CLIPTextModel.from_pretrained(os.path.join(SNAP, "text_encoder")).eval()
    lat0 = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    dnoise = torch.randn((STEPS, 2, 4, 8, 8), generator=torch.Generator().manual_seed(2))
    out["init_latents"] = nhwc(lat0)
    out["ddpm_noise"] = np.stack([nhwc(n) for n in dnoise])
    for name, s in schedulers().items():
        pipe = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=s,
                                       safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        for gs, gtag in ((7.5, "75"), (1.0, "10")):
            ddpm_mod.randn_tensor = FixedNoise(dnoise)
            with torch.no_grad():
                lat = pipe(PROMPTS, height=16, width=16, num_inference_steps=STEPS, guidance_scale=gs,
                           latents=lat0.clone(), output_type="latent").images
                img = vae.decode(lat / vae.config.scaling_factor, return_dict=False)[0]
            u8 = pipe.image_processor.postprocess(img, output_type="np")
            u8 = (u8 * 255).round().astype("uint8")
            out[f"latents_{name}_g{gtag}"] = nhwc(lat)
            out[f"image_{name}_g{gtag}"] = nhwc(img)
            out[f"u8_{name}_g{gtag}"] = u8.astype(np.float32)
            print(name, gs, "latents rms", float(lat.pow(2).mean().sqrt()), "image range",
                  float(img.min()), float(img.max()))

    from safetensors.numpy import save_file
    out = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    save_file(out, os.path.join(OUT, "goldens.safetensors"),
              metadata={"generator": "tests/reference/make_sample_goldens.py",
                        "diffusers": __import__("diffusers").__version__, "torch": torch.__version__,
                        "cpu_capability": torch.backends.cpu.get_cpu_capability()})
    print("wrote", os.path.join(OUT, "goldens.safetensors"), len(out), "tensors")


if __name__ == "__main__":
    main()
