"""Writes the goldens of PNDMScheduler with its Runge-Kutta warm-up (skip_prk_steps false,
PNDMScheduler's own default) that tests/unit/test_sampler.c checks (test_prk).

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt), under
ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py, with SD2's schedule (scaled_linear
0.00085..0.012), T = 1000, set_alpha_to_one false.

Output: tests/data/sample/prk.safetensors (all F32):
  ts_<spacing>_<N>_<offset> [calls]: the timesteps after set_timesteps(N) for spacing leading |
        trailing | linspace, N in 4, 5, 10, 50, steps_offset 0 and 1; absent where
        diffusers steps outside the schedule (an IndexError in step); fewer than 4 steps
        fail in diffusers' set_timesteps
  in_sample [2,3,5,4], in_model_out [20,2,3,5,4]: the step inputs
  step_<case> [calls,2,3,5,4]: the sample after each scheduler.step from in_sample, for
        leading_eps_<N> (N 4, 5, 8; steps_offset 1), leading_v_5, trailing_eps_5

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_prk_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import OUT, SD2, run_steps  # noqa: E402


def prk(**kw):
    from diffusers import PNDMScheduler
    return PNDMScheduler(num_train_timesteps=1000, skip_prk_steps=False, set_alpha_to_one=False,
                         **dict(SD2, **kw))


def main():
    torch.set_num_threads(1)
    out = {}
    for N in (4, 5, 10, 50):
        for spacing in ("leading", "trailing", "linspace"):
            for off in (0, 1):
                s = prk(timestep_spacing=spacing, steps_offset=off)
                s.set_timesteps(N)
                ts = s.timesteps.numpy()
                if len(ts) == 0 or ts.min() < 0 or ts.max() > 999:
                    continue
                out[f"ts_{spacing}_{N}_{off}"] = ts.astype(np.float32)

    g = torch.Generator().manual_seed(51)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((20,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    cases = [(f"leading_eps_{N}", N, dict(timestep_spacing="leading", steps_offset=1))
             for N in (4, 5, 8)]
    cases += [("leading_v_5", 5, dict(timestep_spacing="leading", steps_offset=1,
                                      prediction_type="v_prediction")),
              ("trailing_eps_5", 5, dict(timestep_spacing="trailing"))]
    for name, N, kw in cases:
        s = prk(**kw)
        s.set_timesteps(N)
        out["step_" + name] = run_steps(s, sample0, mos)

    from safetensors.numpy import save_file
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "prk.safetensors")
    save_file({k: np.ascontiguousarray(v) for k, v in out.items()}, path)
    print(f"wrote {path}: {len(out)} tensors")


if __name__ == "__main__":
    main()
