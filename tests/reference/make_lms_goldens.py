"""Writes the goldens of LMSDiscreteScheduler (the linear multistep sampler, "LMS") that
tests/unit/test_sampler.c checks (test_lms).

Reference: diffusers 0.42.1 / torch 2.15.0 / scipy 1.17.1 (LMS integrates its coefficients with
scipy.integrate.quad) on the CPU in fp32 (requirements-models.txt), under
ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py, with SD2's schedule (scaled_linear
0.00085..0.012).

Output: tests/data/sample/lms.safetensors (all F32):
  ts_<spacing>_<N>_<offset>, sig_..., ins_... [N], [N+1], [1]: timesteps, sigmas and
        init_noise_sigma after set_timesteps(N) for spacing leading | trailing | linspace,
        N in 1, 2, 3, 4, 7, 10, 50, 999, 1000, steps_offset 0 and 1 (T 1000); values outside [0, T) kept
  in_sample [2,3,5,4], in_model_out [8,2,3,5,4]: the step inputs
  step_<case> [8,2,3,5,4]: the sample after each of 8 scheduler.step calls (order 4 from the
        fourth on) from in_sample * init_noise_sigma: linspace_eps, linspace_v, leading_eps
        (steps_offset 1), trailing_eps, karras_eps, expo_eps

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_lms_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import SD2, run_steps, save_goldens  # noqa: E402


def lms(**kw):
    from diffusers import LMSDiscreteScheduler
    return LMSDiscreteScheduler(num_train_timesteps=1000, **dict(SD2, **kw))


def main():
    import warnings
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # quad's accuracy warnings on degenerate schedules
    out = {}
    for N in (1, 2, 3, 4, 7, 10, 50, 999, 1000):
        for spacing in ("leading", "trailing", "linspace"):
            for off in (0, 1):
                s = lms(timestep_spacing=spacing, steps_offset=off)
                s.set_timesteps(N)
                tag = f"{spacing}_{N}_{off}"
                out["ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                out["sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                out["ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)

    g = torch.Generator().manual_seed(31)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((8,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    for name, kw in (("linspace_eps", {}),
                     ("linspace_v", dict(prediction_type="v_prediction")),
                     ("leading_eps", dict(timestep_spacing="leading", steps_offset=1)),
                     ("trailing_eps", dict(timestep_spacing="trailing")),
                     ("karras_eps", dict(use_karras_sigmas=True)),
                     ("expo_eps", dict(use_exponential_sigmas=True))):
        s = lms(**kw)
        s.set_timesteps(8)
        out["step_" + name] = run_steps(s, sample0, mos)

    import scipy
    save_goldens(out, "lms.safetensors", "make_lms_goldens.py", scipy=scipy.__version__)


if __name__ == "__main__":
    main()
