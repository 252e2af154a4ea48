"""Writes the goldens of KDPM2DiscreteScheduler (DPM-Solver-2, "DPM2") and of its ancestral
variant KDPM2AncestralDiscreteScheduler ("DPM2 a") that
tests/unit/test_sampler.c checks (test_dpm2).

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt), under
ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py, with SD2's schedule (scaled_linear
0.00085..0.012).

Output: tests/data/sample/dpm2.safetensors (all F32):
  ts_<spacing>_<N>_<offset> [2N-1], sig_..., sigi_... [2N+2], ins_... [1]: the interleaved
        timesteps, sigmas, sigmas_interpol and init_noise_sigma after set_timesteps(N) for
        spacing leading | trailing | linspace, N in 1, 2, 3, 4, 7, 10, 50, steps_offset 0 and 1
        (T 1000), and leading_1000_1, whose timestep 1000 is outside [0, T) (kept)
  kts_<N>, ksig_<N>, ksigi_<N>, ets_..: the same with Karras (k) and exponential (e) sigmas,
        linspace, N in 2, 5, 10, 25
  in_sample [2,3,5,4], in_model_out [15,2,3,5,4]: the step inputs
  step_<case> [15,2,3,5,4]: the sample after each of the 15 scheduler.step calls of 8 steps
        from in_sample * init_noise_sigma, scale_model_input called first as the pipeline
        does: linspace_eps, linspace_v, leading_eps (steps_offset 1), trailing_eps,
        karras_eps, expo_eps
  ats_<spacing>_<N>, asig_, asigi_, asigu_, asigd_ [2N+2], ains_ [1]: the ancestral variant's
        interleaved timesteps, sigmas, sigmas_interpol, sigmas_up, sigmas_down (NaN -> 0) and
        init_noise_sigma, N in 1, 2, 3, 5, 10, steps_offset 1
  in_noise [15,2,3,5,4], step_a_<case> [15,2,3,5,4]: its 8 steps, the noise of call i being
        in_noise[i] (drawn at the odd, second-order calls): a_linspace_eps, a_linspace_v,
        a_leading_eps, a_karras_eps

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_dpm2_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import SD2, run_steps, save_goldens  # noqa: E402


def dpm2(**kw):
    from diffusers import KDPM2DiscreteScheduler
    return KDPM2DiscreteScheduler(num_train_timesteps=1000, **dict(SD2, **kw))


def dpm2a(**kw):
    from diffusers import KDPM2AncestralDiscreteScheduler
    return KDPM2AncestralDiscreteScheduler(num_train_timesteps=1000, **dict(SD2, **kw))


def main():
    torch.set_num_threads(1)
    out = {}
    for N in (1, 2, 3, 4, 7, 10, 50, 1000):
        for spacing in ("leading", "trailing", "linspace"):
            for off in (0, 1):
                if N == 1000 and (spacing, off) != ("leading", 1):
                    continue  # 1000 only for the unusable schedule (a timestep of 1000)
                s = dpm2(timestep_spacing=spacing, steps_offset=off)
                s.set_timesteps(N)
                tag = f"{spacing}_{N}_{off}"
                out["ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                out["sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                out["sigi_" + tag] = np.nan_to_num(s.sigmas_interpol.numpy().astype(np.float32))
                out["ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)
    for pre, opt in (("k", "use_karras_sigmas"), ("e", "use_exponential_sigmas")):
        for N in (2, 5, 10, 25):
            s = dpm2(**{opt: True})
            s.set_timesteps(N)
            out[f"{pre}ts_{N}"] = s.timesteps.numpy().astype(np.float32)
            out[f"{pre}sig_{N}"] = s.sigmas.numpy().astype(np.float32)
            out[f"{pre}sigi_{N}"] = np.nan_to_num(s.sigmas_interpol.numpy().astype(np.float32))

    g = torch.Generator().manual_seed(31)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((15,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    for name, kw in (("linspace_eps", {}),
                     ("linspace_v", dict(prediction_type="v_prediction")),
                     ("leading_eps", dict(timestep_spacing="leading", steps_offset=1)),
                     ("trailing_eps", dict(timestep_spacing="trailing")),
                     ("karras_eps", dict(use_karras_sigmas=True)),
                     ("expo_eps", dict(use_exponential_sigmas=True))):
        s = dpm2(**kw)
        s.set_timesteps(8)
        out["step_" + name] = run_steps(s, sample0, mos)

    # 3. the ancestral variant (KDPM2AncestralDiscreteScheduler): its schedules, and 8 steps with
    #    the noise of call i (drawn at the second-order calls, the odd ones) = in_noise[i]
    import diffusers.schedulers.scheduling_k_dpm_2_ancestral_discrete as anc_mod
    from make_sample_goldens import FixedNoise
    for N in (1, 2, 3, 5, 10):
        for spacing in ("leading", "trailing", "linspace"):
            s = dpm2a(timestep_spacing=spacing, steps_offset=1)
            s.set_timesteps(N)
            tag = f"{spacing}_{N}"
            out["ats_" + tag] = s.timesteps.numpy().astype(np.float32)
            for key, arr in (("asig_", s.sigmas), ("asigi_", s.sigmas_interpol),
                             ("asigu_", s.sigmas_up), ("asigd_", s.sigmas_down)):
                out[key + tag] = np.nan_to_num(arr.numpy().astype(np.float32))
            out["ains_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)
    noise = torch.randn((15,) + shape, generator=torch.Generator().manual_seed(32))
    out["in_noise"] = noise.numpy()
    for name, kw in (("a_linspace_eps", {}),
                     ("a_linspace_v", dict(prediction_type="v_prediction")),
                     ("a_leading_eps", dict(timestep_spacing="leading", steps_offset=1)),
                     ("a_karras_eps", dict(use_karras_sigmas=True))):
        s = dpm2a(**kw)
        s.set_timesteps(8)
        anc_mod.randn_tensor = FixedNoise([noise[i] for i in range(1, 15, 2)])
        out["step_" + name] = run_steps(s, sample0, mos)

    save_goldens(out, "dpm2.safetensors", "make_dpm2_goldens.py")


if __name__ == "__main__":
    main()
