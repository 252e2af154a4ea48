"""Writes the goldens of DPMSolverSDEScheduler ("DPM++ SDE") that tests/unit/test_sampler.c
checks (test_dpmsde).

Reference: diffusers 0.42.1 / torch 2.15.0 on the CPU in fp32 (requirements-models.txt; the
scheduler needs torchsde 0.2.6), under ATEN_CPU_CAPABILITY=avx2 as make_scheduler_goldens.py,
with SD2's schedule (scaled_linear 0.00085..0.012).

The noise. diffusers draws it from a torchsde Brownian tree over sigma; sdtrain draws counter-
based normals z_i for model call i and builds the same Brownian motion from them (sampler.c,
sde_step): the first half of a step from sigma a to the midpoint m uses z_i, the second half from
a to the end b uses (z_(i-1) (a - m)^1/2 + z_i (m - b)^1/2) / (a - b)^1/2. Here the scheduler's
noise sampler is replaced by one that returns exactly that from in_noise, so the goldens check
diffusers' step arithmetic with sdtrain's noise. The script also checks, with torchsde itself,
that the rule is the tree's: the increment over [b, a] equals the sum of those over [m, a] and
[b, m] (within the tree's tolerance).

Output: tests/data/sample/dpmsde.safetensors (all F32):
  ts_<spacing>_<N>_<offset> [2N-1], sig_... [2N], ins_... [1]: timesteps, sigmas and
        init_noise_sigma after set_timesteps(N) for spacing leading | trailing | linspace, N in
        1, 2, 3, 4, 7, 10, 50, steps_offset 0 and 1
  kts_<N>, ksig_<N>, ets_.., esig_.., bts_.., bsig_..: the same with Karras (k), exponential (e)
        and beta (b) sigmas, linspace, N in 2, 5, 10, 25
  in_sample [2,3,5,4], in_model_out [15,2,3,5,4], in_noise [15,2,3,5,4]: the step inputs, the
        noise of call i being in_noise[i] (used at calls 0..13)
  step_<case> [15,2,3,5,4]: the sample after each of the 15 scheduler.step calls of 8 steps from
        in_sample * init_noise_sigma, scale_model_input called first as the pipeline does:
        linspace_eps, linspace_v, leading_eps (steps_offset 1), trailing_eps, karras_eps

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_dpmsde_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os
import sys

import aten_avx2  # noqa: F401,E402  (re-executes under ATEN_CPU_CAPABILITY=avx2)

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_scheduler_goldens import SD2, run_steps, save_goldens  # noqa: E402


def sde(**kw):
    from diffusers import DPMSolverSDEScheduler
    return DPMSolverSDEScheduler(num_train_timesteps=1000, **dict(SD2, **kw))


class SdtrainNoise:
    """The scheduler's noise_sampler(sigma, sigma_next) with sdtrain's rule: call i's normals
    z_i, the second half combining z_(i-1) and z_i with the midpoint the scheduler keeps."""

    def __init__(self, sched, noises):
        self.sched, self.noises, self.call, self.z_prev = sched, noises, 0, None

    def __call__(self, a, b):
        i = self.sched.step_index  # not yet advanced
        z = self.noises[i]
        if self.sched.state_in_first_order:
            self.z_prev = z
            return z
        m = self.sched.mid_point_sigma
        wa, wb, w = torch.sqrt(a - m), torch.sqrt(m - b), torch.sqrt(a - b)
        return (wa * self.z_prev + wb * z) / w


def check_brownian_rule():
    """torchsde's tree: W over [b, a] is the sum of W over [m, a] and [b, m]."""
    from diffusers.schedulers.scheduling_dpmsolver_sde import BatchedBrownianTree
    x = torch.zeros(64, 64)
    tree = BatchedBrownianTree(x, torch.tensor(0.03), torch.tensor(14.6), seed=5)
    a, m, b = torch.tensor(3.0), torch.tensor(1.7), torch.tensor(0.9)
    whole = tree(a, b)
    parts = tree(a, m) + tree(m, b)
    err = (whole - parts).abs().max().item()
    assert err < 1e-4, err
    print("Brownian tree: increment over [b, a] == sum of the halves within", err)


def main():
    torch.set_num_threads(1)
    check_brownian_rule()
    out = {}
    for N in (1, 2, 3, 4, 7, 10, 50):
        for spacing in ("leading", "trailing", "linspace"):
            for off in (0, 1):
                s = sde(timestep_spacing=spacing, steps_offset=off)
                s.set_timesteps(N)
                tag = f"{spacing}_{N}_{off}"
                out["ts_" + tag] = s.timesteps.numpy().astype(np.float32)
                out["sig_" + tag] = s.sigmas.numpy().astype(np.float32)
                out["ins_" + tag] = np.array([float(s.init_noise_sigma)], dtype=np.float32)
    for pre, opt in (("k", "use_karras_sigmas"), ("e", "use_exponential_sigmas"),
                     ("b", "use_beta_sigmas")):
        for N in (2, 5, 10, 25):
            s = sde(**{opt: True})
            s.set_timesteps(N)
            out[f"{pre}ts_{N}"] = s.timesteps.numpy().astype(np.float32)
            out[f"{pre}sig_{N}"] = s.sigmas.numpy().astype(np.float32)

    g = torch.Generator().manual_seed(41)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((15,) + shape, generator=g)
    noise = torch.randn((15,) + shape, generator=g)
    out["in_sample"] = sample0.numpy()
    out["in_model_out"] = mos.numpy()
    out["in_noise"] = noise.numpy()
    for name, kw in (("linspace_eps", {}),
                     ("linspace_v", dict(prediction_type="v_prediction")),
                     ("leading_eps", dict(timestep_spacing="leading", steps_offset=1)),
                     ("trailing_eps", dict(timestep_spacing="trailing")),
                     ("karras_eps", dict(use_karras_sigmas=True))):
        s = sde(**kw)
        s.set_timesteps(8)
        s.noise_sampler = SdtrainNoise(s, [noise[i] for i in range(15)])
        out["step_" + name] = run_steps(s, sample0, mos)

    save_goldens(out, "dpmsde.safetensors", "make_dpmsde_goldens.py")


if __name__ == "__main__":
    main()
