"""Writes the goldens of the cosine schedule and of zero terminal SNR that tests/unit/test_sampler.c
checks (test_zero_snr).

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt), under
ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py (the FMA-contracted linspace).

Output: tests/data/sample/zero_snr.safetensors (all F32):
  betas_<s>, abar_<s>    DDPMScheduler(num_train_timesteps=1000, ...).betas / .alphas_cumprod for
        s = cos (beta_schedule squaredcos_cap_v2), zsnr (SD2's scaled_linear 0.00085..0.012 with
        rescale_betas_zero_snr), cos_zsnr (both), linear_zsnr (linear 0.0001..0.02, rescaled)
  in_sample [2,3,5,4], in_model_out [6,2,3,5,4], in_noise [6,2,3,5,4]: the step inputs
  ts_<case>, sig_<case> (sigma schedulers), ins_<case> [1]: timesteps, sigmas, init_noise_sigma
        after set_timesteps(5)
  step_<case> [n,2,3,5,4] (n model calls: 5, PNDM 6, Heun 9): the sample after each scheduler.step from in_sample * init_noise_sigma,
        the noise-drawing schedulers given in_noise step by step; <case> =
        zsnr_<kind>_<spacing>_v (v_prediction, rescale_betas_zero_snr, steps_offset 1) for
        kind ddim, ddpm, euler, euler_a, dpmpp_2m, dpmpp_2m_sde, unipc with 'trailing' spacing,
        and ddim, euler with 'leading'; zsnr_dpmpp_2m_karras_v, zsnr_euler_karras_v;
        cos_<kind>_eps (squaredcos_cap_v2, epsilon, 'linspace'; 'leading' for pndm) for kind
        ddim, pndm, euler, euler_a, heun, dpmpp_2m, unipc; cos_unipc_karras_eps (Karras
        timesteps rounded)
  ts_cos_dpmpp_2m_karras_<N>, sig_...: DPM-Solver++ with Karras sigmas on squaredcos_cap_v2,
        N = 5, 10, 25: its timesteps truncated, not rounded (at N = 5 one repeats)

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_zero_snr_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import make, patch_noise, run_steps, save_goldens  # noqa: E402

SD2 = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
COS = dict(beta_schedule="squaredcos_cap_v2")


def main():
    from diffusers import DDPMScheduler

    torch.set_num_threads(1)
    out = {}
    for name, kw in (("cos", COS), ("zsnr", dict(SD2, rescale_betas_zero_snr=True)),
                     ("cos_zsnr", dict(COS, rescale_betas_zero_snr=True)),
                     ("linear_zsnr", dict(beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                                          rescale_betas_zero_snr=True))):
        s = DDPMScheduler(num_train_timesteps=1000, **kw)
        out["betas_" + name] = s.betas.numpy()
        out["abar_" + name] = s.alphas_cumprod.numpy()

    g = torch.Generator().manual_seed(11)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((9,) + shape, generator=g)
    noise = torch.randn((9,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    out["in_noise"] = noise.numpy()

    cases = []
    zs = dict(SD2, rescale_betas_zero_snr=True, prediction_type="v_prediction", steps_offset=1)
    for kind in ("ddim", "ddpm", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_sde", "unipc"):
        cases.append((f"zsnr_{kind}_trailing_v", kind, dict(zs, timestep_spacing="trailing")))
    for kind in ("ddim", "euler"):
        cases.append((f"zsnr_{kind}_leading_v", kind, dict(zs, timestep_spacing="leading")))
    for kind in ("dpmpp_2m", "euler"):
        cases.append((f"zsnr_{kind}_karras_v", kind,
                      dict(zs, timestep_spacing="linspace", use_karras_sigmas=True)))
    cs = dict(COS, steps_offset=1)
    for kind in ("ddim", "pndm", "euler", "euler_a", "heun", "dpmpp_2m", "unipc"):
        cases.append((f"cos_{kind}_eps", kind,
                      dict(cs, timestep_spacing="leading" if kind == "pndm" else "linspace")))
    cases.append(("cos_unipc_karras_eps", "unipc",
                  dict(cs, timestep_spacing="linspace", use_karras_sigmas=True)))
    # DPM-Solver++'s Karras timesteps on this schedule: truncated; at 5 steps that repeats 998,
    # which diffusers' step cannot run (an index past its sigmas) and sdtrain refuses
    for N in (5, 10, 25):
        s = make("dpmpp_2m", num_train_timesteps=1000, use_karras_sigmas=True, **cs)
        s.set_timesteps(N)
        out[f"ts_cos_dpmpp_2m_karras_{N}"] = s.timesteps.numpy().astype(np.float32)
        out[f"sig_cos_dpmpp_2m_karras_{N}"] = s.sigmas.numpy().astype(np.float32)

    for name, kind, kw in cases:
        kw = dict(kw)
        for k, v in SD2.items():  # the cosine cases: beta_start / beta_end are unused
            kw.setdefault(k, v)
        s = make(kind, num_train_timesteps=1000, **kw)
        s.set_timesteps(5)
        out["ts_" + name] = s.timesteps.numpy().astype(np.float32)
        if hasattr(s, "sigmas"):
            out["sig_" + name] = s.sigmas.numpy().astype(np.float32)
        out["ins_" + name] = np.array([float(s.init_noise_sigma)], dtype=np.float32)
        patch_noise(noise)
        out["step_" + name] = run_steps(s, sample0, mos)

    save_goldens(out, "zero_snr.safetensors", "make_zero_snr_goldens.py")


if __name__ == "__main__":
    main()
