"""Writes the goldens of the second set of samplers that tests/unit/test_sampler.c checks:
Euler, Euler ancestral and DPM-Solver++ (2M), the three timestep spacings for every scheduler,
DDIM with eta > 0 and the pipeline's guidance_rescale.

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt, the
same venv and pins as make_sample_goldens.py), schedulers built with SD2's schedule
(scaled_linear 0.00085..0.012) and each class's own defaults otherwise.

Output: tests/data/sample/schedulers.safetensors (all F32; latents and images NHWC):
  ts_<kind>_<spacing>_<N>_<T>_<offset>   scheduler.timesteps after set_timesteps(N)
        kind = ddim | pndm | ddpm | euler | euler_a | dpmpp_2m | unipc, spacing = leading | trailing |
        linspace, steps_offset = offset. Values outside [0, T) (which diffusers would index
        with, wrapping around) are kept: the C side must refuse those schedules.
  sig_<kind>_<spacing>_<N>_<T>_<offset>  scheduler.sigmas (euler, euler_a, dpmpp_2m, unipc)
  ins_<kind>_<spacing>_<N>_<T>_<offset>  [1] init_noise_sigma
  kts_<kind>_<spacing>_<N>, ksig_..., kins_...   the same with use_karras_sigmas (T = 1000,
        steps_offset 1): euler after each spacing, dpmpp_2m (linspace; the spacing is unused);
        ets_..., esig_..., eins_...: the same with use_exponential_sigmas
  hts_heun_<spacing>_<N>_<T>_<offset>, hsig_..., hins_...: Heun's (T 1000 and 10)
  step_model_out_heun [9,2,3,5,4]: model outputs for Heun's 9 calls of 5 steps
  step_sample, step_model_out [6,2,3,5,4], step_noise [6,2,3,5,4]: the inputs of the step tests
  step_<case>   [n_t,2,3,5,4] the sample after each scheduler.step, N = 5 (PNDM: 6 calls); <case> is
        <kind>_<spacing>_<pred> for euler, euler_a, dpmpp_2m (pred eps | v, spacing linspace |
        leading with steps_offset 1), <kind>_karras_eps (euler, dpmpp_2m, linspace, Karras
        sigmas), dpmpp_2m_sde_eps, dpmpp_2m_sde_karras_eps, dpmpp_2m_heun_eps,
        dpmpp_2m_sde_heun_eps, dpmpp_2m_order1_eps, dpmpp_2m_sigma_min_eps,
        dpmpp_2m_sigma_min_nolof_eps (lower_order_final false), dpmpp_2m_sigma_min_eaf_eps
        (euler_at_final), euler_sigma_min_eps, euler_expo_eps, dpmpp_2m_expo_eps,
        heun_linspace_eps / _v, heun_leading_eps, heun_karras_eps (9 calls), unipc_eps, unipc_v,
        unipc_leading_eps, unipc_karras_eps, unipc_order1_eps, unipc_sigma_min_eps, ddim_eta_<pred> (eta 0.8, leading, offset 1), and
        <kind>_<spacing>_eps for ddim, pndm, ddpm with trailing and linspace spacing. Euler
        kinds start from step_sample * init_noise_sigma.
  step16_model_out [16,2,3,5,4], step16_dpmpp_2m_sigma_min_eps [16,2,3,5,4]: 16 steps with
        final_sigmas_type 'sigma_min' (the last one second order); step16_unipc_eps: UniPC, 16
  p_<case>_latents [2,8,8,4], p_<case>_image [2,16,16,3], p_<case>_u8 [2,16,16,3]:
        StableDiffusionPipeline on tests/data/models/tiny-sd2 with make_sample_goldens.py's
        prompts, tokenizer, initial latents (init_latents there) and per-step noise
        (ddpm_noise there), 4 steps, guidance 7.5; <case> = euler, euler_a, dpmpp_2m (linspace),
        euler_leading, ddim_eta_rescale (eta 0.5, guidance_rescale 0.7), pndm_trailing,
        dpmpp_2m_karras, dpmpp_2m_sde_karras, heun (7 U-Net calls), unipc.
  p_euler_a_24x16_{init,noise,latents,image,u8}: Euler ancestral at 24 x 16 px (width x
        height; latents [2,8,12,4]) from its own initial latents [2,8,12,4] and per-step noise
        [4,2,8,12,4] (seeds 5 and 6).

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_scheduler_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_sample_goldens import FixedNoise, PROMPTS, SNAP, STEPS, nhwc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.join(TOP, "tests", "data", "sample")
SD2 = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
KINDS = ("ddim", "pndm", "ddpm", "euler", "euler_a", "dpmpp_2m", "unipc")
SIGMA_KINDS = ("euler", "euler_a", "dpmpp_2m", "unipc")


def make(kind, **kw):
    import diffusers as D
    kw = dict(SD2, **kw)
    if kind == "ddim":
        return D.DDIMScheduler(clip_sample=False, set_alpha_to_one=False, **kw)
    if kind == "pndm":
        return D.PNDMScheduler(skip_prk_steps=True, set_alpha_to_one=False, **kw)
    if kind == "ddpm":
        return D.DDPMScheduler(clip_sample=False, variance_type="fixed_small", **kw)
    if kind == "euler":
        return D.EulerDiscreteScheduler(**kw)
    if kind == "euler_a":
        return D.EulerAncestralDiscreteScheduler(**kw)
    if kind == "dpmpp_2m":
        return D.DPMSolverMultistepScheduler(**kw)
    if kind == "dpmpp_2m_sde":
        return D.DPMSolverMultistepScheduler(algorithm_type="sde-dpmsolver++", **kw)
    if kind == "heun":
        return D.HeunDiscreteScheduler(**kw)
    if kind == "unipc":
        return D.UniPCMultistepScheduler(**kw)
    raise ValueError(kind)


def save_goldens(out, filename, script, **meta):
    """Writes `out` (every array as fp32) to OUT/filename with the versions that made it: the
    script (tests/reference/<script>), diffusers, torch, the ATen CPU capability, and `meta`."""
    from safetensors.numpy import save_file
    out = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    path = os.path.join(OUT, filename)
    save_file(out, path, metadata={"generator": "tests/reference/" + script,
                                   "diffusers": __import__("diffusers").__version__,
                                   "torch": torch.__version__, **meta,
                                   "cpu_capability": torch.backends.cpu.get_cpu_capability()})
    print("wrote", path, len(out), "tensors", os.path.getsize(path), "bytes")


def run_steps(s, sample0, model_outs, **step_kw):
    """The sample after each scheduler.step from sample0 * init_noise_sigma, model output i at call
    i, scale_model_input called first as the pipeline does (it sets the step index); stacked."""
    x = sample0.clone() * s.init_noise_sigma
    res = []
    for i, t in enumerate(s.timesteps):
        if hasattr(s, "scale_model_input"):
            s.scale_model_input(x, t)
        x = s.step(model_outs[i], t, x, return_dict=False, **step_kw)[0]
        res.append(x.clone())
    return torch.stack(res).numpy()


def patch_noise(noises):
    """Every module whose step draws noise gets the same fixed list."""
    import diffusers.schedulers.scheduling_ddim as m1
    import diffusers.schedulers.scheduling_ddpm as m2
    import diffusers.schedulers.scheduling_euler_ancestral_discrete as m3
    import diffusers.schedulers.scheduling_dpmsolver_multistep as m4
    f = FixedNoise(noises)
    m1.randn_tensor = m2.randn_tensor = m3.randn_tensor = m4.randn_tensor = f
    return f


def main():
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    torch.set_num_threads(1)
    out = {}

    # 1. timesteps, sigmas, init_noise_sigma
    grid = {1000: (1, 2, 3, 4, 7, 10, 50, 999, 1000), 10: (1, 2, 3, 4, 7, 9, 10), 500: (1, 3, 7, 50, 500)}
    for T, Ns in grid.items():
        for N in Ns:
            for kind in KINDS:
                for spacing in ("leading", "trailing", "linspace"):
                    for off in (0, 1):
                        s = make(kind, num_train_timesteps=T, timestep_spacing=spacing, steps_offset=off)
                        s.set_timesteps(N)
                        tag = f"{kind}_{spacing}_{N}_{T}_{off}"
                        out["ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                        if kind in SIGMA_KINDS:
                            out["sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                            out["ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)

    # 1a. Heun (2 N - 1 model calls): its own keys, a smaller grid
    for T, Ns in ((1000, (1, 2, 3, 4, 7, 10, 50, 999, 1000)), (10, (1, 2, 3, 7, 10))):
        for N in Ns:
            for spacing in ("leading", "trailing", "linspace"):
                for off in (0, 1):
                    s = make("heun", num_train_timesteps=T, timestep_spacing=spacing, steps_offset=off)
                    s.set_timesteps(N)
                    tag = f"heun_{spacing}_{N}_{T}_{off}"
                    out["hts_" + tag] = s.timesteps.numpy().astype(np.float32)
                    out["hsig_" + tag] = s.sigmas.numpy().astype(np.float32)
                    out["hins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)

    # 1b. Karras (k) and exponential (e) sigmas: Euler after each spacing, DPM-Solver++ (spacing unused)
    for pre, opt in (("k", "use_karras_sigmas"), ("e", "use_exponential_sigmas")):
        for N in (1, 2, 3, 4, 7, 10, 25, 50, 100, 500):
            for kind, spacings in (("euler", ("linspace", "leading", "trailing")), ("dpmpp_2m", ("linspace",))):
                for spacing in spacings:
                    s = make(kind, num_train_timesteps=1000, timestep_spacing=spacing, steps_offset=1,
                             **{opt: True})
                    s.set_timesteps(N)
                    tag = f"{kind}_{spacing}_{N}"
                    out[pre + "ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                    out[pre + "sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                    out[pre + "ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)

    # 2. scheduler steps on random inputs, 5 inference steps
    g = torch.Generator().manual_seed(3)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((6,) + shape, generator=g)
    mos_heun = torch.randn((9,) + shape, generator=torch.Generator().manual_seed(7))
    out["step_model_out_heun"] = mos_heun.numpy()
    noise = torch.randn((6,) + shape, generator=g)
    out["step_sample"] = sample0.numpy()
    out["step_model_out"] = mos.numpy()
    out["step_noise"] = noise.numpy()
    cases = []
    for kind in SIGMA_KINDS:
        for spacing, off in (("linspace", 0), ("leading", 1)):
            for pred, ptag in (("epsilon", "eps"), ("v_prediction", "v")):
                cases.append((f"{kind}_{spacing}_{ptag}", kind,
                              dict(timestep_spacing=spacing, steps_offset=off, prediction_type=pred), {}))
    for kind in ("euler", "dpmpp_2m"):
        cases.append((f"{kind}_karras_eps", kind, dict(steps_offset=1, use_karras_sigmas=True), {}))
    for pred, ptag in (("epsilon", "eps"), ("v_prediction", "v")):
        cases.append((f"ddim_eta_{ptag}", "ddim", dict(steps_offset=1, prediction_type=pred), dict(eta=0.8)))
    for kind in ("ddim", "pndm", "ddpm"):
        for spacing in ("trailing", "linspace"):
            cases.append((f"{kind}_{spacing}_eps", kind, dict(timestep_spacing=spacing, steps_offset=1), {}))
    # DPM-Solver++'s options (and Euler's final_sigmas_type), epsilon, linspace, 5 steps
    for name, kind, kw in (
            ("dpmpp_2m_sde_eps", "dpmpp_2m_sde", {}),
            ("dpmpp_2m_sde_karras_eps", "dpmpp_2m_sde", dict(use_karras_sigmas=True)),
            ("dpmpp_2m_heun_eps", "dpmpp_2m", dict(solver_type="heun")),
            ("dpmpp_2m_sde_heun_eps", "dpmpp_2m_sde", dict(solver_type="heun")),
            ("dpmpp_2m_order1_eps", "dpmpp_2m", dict(solver_order=1)),
            ("dpmpp_2m_sigma_min_eps", "dpmpp_2m", dict(final_sigmas_type="sigma_min")),
            ("dpmpp_2m_sigma_min_nolof_eps", "dpmpp_2m",
             dict(final_sigmas_type="sigma_min", lower_order_final=False)),
            ("dpmpp_2m_sigma_min_eaf_eps", "dpmpp_2m",
             dict(final_sigmas_type="sigma_min", lower_order_final=False, euler_at_final=True)),
            ("euler_sigma_min_eps", "euler", dict(final_sigmas_type="sigma_min")),
            ("euler_expo_eps", "euler", dict(use_exponential_sigmas=True)),
            ("dpmpp_2m_expo_eps", "dpmpp_2m", dict(use_exponential_sigmas=True)),
            ("heun_linspace_eps", "heun", {}),
            ("heun_linspace_v", "heun", dict(prediction_type="v_prediction")),
            ("heun_leading_eps", "heun", dict(timestep_spacing="leading")),
            ("heun_karras_eps", "heun", dict(use_karras_sigmas=True)),
            ("unipc_eps", "unipc", {}),
            ("unipc_v", "unipc", dict(prediction_type="v_prediction")),
            ("unipc_leading_eps", "unipc", dict(timestep_spacing="leading")),
            ("unipc_karras_eps", "unipc", dict(use_karras_sigmas=True)),
            ("unipc_order1_eps", "unipc", dict(solver_order=1)),
            ("unipc_sigma_min_eps", "unipc", dict(final_sigmas_type="sigma_min"))):
        cases.append((name, kind, dict(steps_offset=1, **kw), {}))
    for name, kind, kw, step_kw in cases:
        s = make(kind, num_train_timesteps=1000, **kw)
        s.set_timesteps(5)
        patch_noise(noise)
        out["step_" + name] = run_steps(s, sample0, mos_heun if kind == "heun" else mos, **step_kw)
    # 16 steps with final_sigmas_type 'sigma_min': from 15 steps on, the last step is second order
    mos16 = torch.randn((16,) + shape, generator=torch.Generator().manual_seed(4))
    out["step16_model_out"] = mos16.numpy()
    for name, kind, kw in (("dpmpp_2m_sigma_min_eps", "dpmpp_2m", dict(final_sigmas_type="sigma_min")),
                           ("unipc_eps", "unipc", {})):
        s = make(kind, num_train_timesteps=1000, steps_offset=1, **kw)
        s.set_timesteps(16)
        x = sample0.clone()
        res = []
        for i, t in enumerate(s.timesteps):
            x = s.step(mos16[i], t, x, return_dict=False)[0]
            res.append(x.clone())
        out["step16_" + name] = torch.stack(res).numpy()

    # 3. the whole pipeline on the tiny snapshot
    tok = CLIPTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"), model_max_length=77)
    unet = UNet2DConditionModel.from_pretrained(os.path.join(SNAP, "unet")).eval()
    vae = AutoencoderKL.from_pretrained(os.path.join(SNAP, "vae")).eval()
    te = CLIPTextModel.from_pretrained(os.path.join(SNAP, "text_encoder")).eval()
    lat0 = torch.randn((2, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    dnoise = torch.randn((STEPS, 2, 4, 8, 8), generator=torch.Generator().manual_seed(2))
    pcases = (
        ("euler", "euler", dict(), dict()),
        ("euler_a", "euler_a", dict(), dict()),
        ("dpmpp_2m", "dpmpp_2m", dict(), dict()),
        ("euler_leading", "euler", dict(timestep_spacing="leading", steps_offset=1), dict()),
        ("ddim_eta_rescale", "ddim", dict(steps_offset=1), dict(eta=0.5, guidance_rescale=0.7)),
        ("pndm_trailing", "pndm", dict(timestep_spacing="trailing", steps_offset=1), dict()),
        ("dpmpp_2m_karras", "dpmpp_2m", dict(use_karras_sigmas=True), dict()),
        ("dpmpp_2m_sde_karras", "dpmpp_2m_sde", dict(use_karras_sigmas=True), dict()),
        ("heun", "heun", dict(), dict()),
        ("unipc", "unipc", dict(), dict()),
    )
    def run(s, lat_init, noises, height, width, **call_kw):
        pipe = StableDiffusionPipeline(vae=vae, text_encoder=te, tokenizer=tok, unet=unet, scheduler=s,
                                       safety_checker=None, feature_extractor=None,
                                       requires_safety_checker=False)
        pipe.set_progress_bar_config(disable=True)
        patch_noise(noises)
        with torch.no_grad():
            lat = pipe(PROMPTS, height=height, width=width, num_inference_steps=STEPS, guidance_scale=7.5,
                       latents=lat_init.clone(), output_type="latent", **call_kw).images
            img = vae.decode(lat / vae.config.scaling_factor, return_dict=False)[0]
        u8 = (pipe.image_processor.postprocess(img, output_type="np") * 255).round().astype("uint8")
        return lat, img, u8

    for name, kind, kw, call_kw in pcases:
        s = make(kind, num_train_timesteps=1000, **kw)
        lat, img, u8 = run(s, lat0, dnoise, 16, 16, **call_kw)
        out[f"p_{name}_latents"] = nhwc(lat)
        out[f"p_{name}_image"] = nhwc(img)
        out[f"p_{name}_u8"] = u8.astype(np.float32)
        print(name, "timesteps", s.timesteps.tolist(), "latents rms", float(lat.pow(2).mean().sqrt()))

    # 4. a non-square image: 24 x 16 px (latents 12 x 8), Euler ancestral (input scaling and noise)
    lat1 = torch.randn((2, 4, 8, 12), generator=torch.Generator().manual_seed(5))
    noise1 = torch.randn((STEPS, 2, 4, 8, 12), generator=torch.Generator().manual_seed(6))
    out["p_euler_a_24x16_init"] = nhwc(lat1)
    out["p_euler_a_24x16_noise"] = np.stack([nhwc(n) for n in noise1])
    lat, img, u8 = run(make("euler_a", num_train_timesteps=1000), lat1, noise1, 16, 24)
    out["p_euler_a_24x16_latents"] = nhwc(lat)
    out["p_euler_a_24x16_image"] = nhwc(img)
    out["p_euler_a_24x16_u8"] = u8.astype(np.float32)

    save_goldens(out, "schedulers.safetensors", "make_scheduler_goldens.py")


if __name__ == "__main__":
    main()
