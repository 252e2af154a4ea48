"""Writes the goldens of the third-order multistep solvers that tests/unit/test_sampler.c checks
(test_order3): DPM-Solver++ of order 3 ("DPM++ 3M", "DPM++ 3M SDE"), UniPC of order 3, and
UniPC's bh1.

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt), under
ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py, with SD2's schedule (scaled_linear
0.00085..0.012), steps_offset 1, 'linspace' spacing unless said.

Output: tests/data/sample/order3.safetensors (all F32):
  in_sample [2,3,5,4], in_model_out [16,2,3,5,4], in_noise [16,2,3,5,4]: the step inputs
  step_<case> [N,2,3,5,4]: the sample after each scheduler.step from in_sample, the SDE cases
        given in_noise step by step, for
        dpm3_eps, dpm3_v (N 5: orders 1, 2, 3, 2, 1 with lower_order_final),
        dpm3_sde_eps (sde-dpmsolver++), dpm3_karras_eps (Karras sigmas),
        dpm3_sigma_min_nolof_eps (final_sigmas_type sigma_min, lower_order_final false: third
        order to the end), dpm3_16_eps and dpm3_sde_16_eps (N 16: no lower-order steps but the
        last, final sigma 0), dpm3_trailing_eps (trailing spacing);
        unipc3_eps, unipc3_v (N 5), unipc3_16_eps (N 16), unipc3_karras_eps,
        unipc3_sigma_min_nolof_eps (final_sigmas_type sigma_min, lower_order_final false: with
        the final sigma 0 instead, diffusers' last predictor step divides by h = inf and its
        solve fails), unipc_bh1_eps (order 2, bh1), unipc3_bh1_eps (order 3, bh1),
        unipc_bh1_order1_eps, all three with final_sigmas_type sigma_min (to sigma 0 diffusers'
        bh1 ends in NaN); predict_x0 false (also sigma_min: to sigma 0 it is NaN too):
        unipc_px0f_eps (order 2), unipc3_px0f_v (order 3, v), unipc_px0f_bh1_eps;
        unipc_nocorr_eps (disable_corrector [1, 2])
Run:
    tests/reference/.venv-models/bin/python tests/reference/make_order3_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import make, patch_noise, run_steps, save_goldens  # noqa: E402


def main():
    torch.set_num_threads(1)
    out = {}
    g = torch.Generator().manual_seed(21)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((16,) + shape, generator=g)
    noise = torch.randn((16,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    out["in_noise"] = noise.numpy()
    base = dict(steps_offset=1, solver_order=3, timestep_spacing="linspace")
    # bh1 only with a final sigma > 0: to sigma 0 its last step multiplies B(h) = -h = -inf by
    # a zero update (diffusers returns NaN there)
    SMIN = dict(final_sigmas_type="sigma_min")
    cases = (
        ("dpm3_eps", "dpmpp_2m", 5, {}),
        ("dpm3_v", "dpmpp_2m", 5, dict(prediction_type="v_prediction")),
        ("dpm3_sde_eps", "dpmpp_2m_sde", 5, {}),
        ("dpm3_karras_eps", "dpmpp_2m", 5, dict(use_karras_sigmas=True)),
        ("dpm3_sigma_min_nolof_eps", "dpmpp_2m", 5,
         dict(final_sigmas_type="sigma_min", lower_order_final=False)),
        ("dpm3_16_eps", "dpmpp_2m", 16, {}),
        ("dpm3_sde_16_eps", "dpmpp_2m_sde", 16, {}),
        ("dpm3_trailing_eps", "dpmpp_2m", 5, dict(timestep_spacing="trailing")),
        ("unipc3_eps", "unipc", 5, {}),
        ("unipc3_v", "unipc", 5, dict(prediction_type="v_prediction")),
        ("unipc3_16_eps", "unipc", 16, {}),
        ("unipc3_karras_eps", "unipc", 5, dict(use_karras_sigmas=True)),
        ("unipc3_sigma_min_nolof_eps", "unipc", 5,
         dict(lower_order_final=False, final_sigmas_type="sigma_min")),
        ("unipc_bh1_eps", "unipc", 5, dict(solver_order=2, solver_type="bh1", **SMIN)),
        ("unipc3_bh1_eps", "unipc", 5, dict(solver_type="bh1", **SMIN)),
        ("unipc_bh1_order1_eps", "unipc", 5, dict(solver_order=1, solver_type="bh1", **SMIN)),
        ("unipc_px0f_eps", "unipc", 5, dict(solver_order=2, predict_x0=False, **SMIN)),
        ("unipc3_px0f_v", "unipc", 5, dict(predict_x0=False, prediction_type="v_prediction", **SMIN)),
        ("unipc_px0f_bh1_eps", "unipc", 5,
         dict(solver_order=2, predict_x0=False, solver_type="bh1", **SMIN)),
        ("unipc_nocorr_eps", "unipc", 5, dict(solver_order=2, disable_corrector=[1, 2])),
    )
    for name, kind, n, kw in cases:
        s = make(kind, num_train_timesteps=1000, **dict(base, **kw))
        s.set_timesteps(n)
        patch_noise(noise)
        out["step_" + name] = run_steps(s, sample0, mos)

    save_goldens(out, "order3.safetensors", "make_order3_goldens.py")


if __name__ == "__main__":
    main()
