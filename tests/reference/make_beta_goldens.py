"""Writes the goldens of diffusers' beta sigmas (use_beta_sigmas: Lee et al. 2024, "Beta Sampling
is All You Need"; scipy.stats.beta.ppf with alpha = beta = 0.6) that tests/unit/test_sampler.c
checks (test_beta).

Reference: diffusers 0.42.1 / torch 2.15.0 / scipy 1.17.1 on the CPU in fp32
(requirements-models.txt), under ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py, with
SD2's schedule (scaled_linear 0.00085..0.012), T = 1000, steps_offset 1.

Output: tests/data/sample/beta.safetensors (all F32):
  ts_<kind>_<spacing>_<N>, sig_..., ins_... : timesteps, sigmas and init_noise_sigma after
        set_timesteps(N) with use_beta_sigmas, for euler (linspace, leading, trailing),
        dpmpp_2m, unipc, heun and lms (linspace), N in 1, 2, 3, 4, 7, 10, 25, 50, 100
  ppf [101]: scipy.stats.beta.ppf(1 - linspace(0, 1, 101), 0.6, 0.6) in float64, as float32 pairs
        (hi, lo) in ppf_hi / ppf_lo: hi = float32(x), lo = float32(x - hi)
  in_sample [2,3,5,4], in_model_out [9,2,3,5,4], in_noise [9,2,3,5,4]: the step inputs
  step_<kind> [calls,2,3,5,4]: the sample after each scheduler.step from in_sample *
        init_noise_sigma, epsilon, linspace, 5 steps with beta sigmas, for euler, dpmpp_2m,
        dpmpp_2m_sde (noise of step i = in_noise[i]), unipc, heun, lms, dpm2 (9 calls)

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_beta_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import scipy.stats
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import OUT, SD2, make, patch_noise, run_steps  # noqa: E402

NS = (1, 2, 3, 4, 7, 10, 25, 50, 100)


def beta_kind(kind, **kw):
    import diffusers as D
    kw = dict(SD2, num_train_timesteps=1000, steps_offset=1, use_beta_sigmas=True, **kw)
    if kind == "lms":
        return D.LMSDiscreteScheduler(**kw)
    if kind == "dpm2":
        return D.KDPM2DiscreteScheduler(**kw)
    kw.pop("beta_start"), kw.pop("beta_end"), kw.pop("beta_schedule")
    return make(kind, **kw)


def main():
    import warnings
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    out = {}
    for kind, spacings in (("euler", ("linspace", "leading", "trailing")), ("dpmpp_2m", ("linspace",)),
                           ("unipc", ("linspace",)), ("heun", ("linspace",)), ("lms", ("linspace",))):
        for spacing in spacings:
            for N in NS:
                s = beta_kind(kind, timestep_spacing=spacing)
                s.set_timesteps(N)
                tag = f"{kind}_{spacing}_{N}"
                out["ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                out["sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                out["ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)
    ppf = np.array([scipy.stats.beta.ppf(t, 0.6, 0.6) for t in 1 - np.linspace(0, 1, 101)])
    hi = ppf.astype(np.float32)
    out["ppf_hi"] = hi
    out["ppf_lo"] = (ppf - hi.astype(np.float64)).astype(np.float32)

    g = torch.Generator().manual_seed(41)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((9,) + shape, generator=g)
    noise = torch.randn((9,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    out["in_noise"] = noise.numpy()
    for kind in ("euler", "dpmpp_2m", "dpmpp_2m_sde", "unipc", "heun", "lms", "dpm2"):
        s = beta_kind(kind, timestep_spacing="linspace")
        s.set_timesteps(5)
        patch_noise(noise)
        out["step_" + kind] = run_steps(s, sample0, mos)

    from safetensors.numpy import save_file
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "beta.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, path)
    print(f"wrote {path}: {len(out)} tensors")


if __name__ == "__main__":
    main()
