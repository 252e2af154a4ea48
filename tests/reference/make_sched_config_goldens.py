"""Writes the goldens of schedulers built from a scheduler_config.json as the pipeline builds
them, which tests/unit/test_sched_config.c checks (test_config_steps): `<Class>.from_config`
of the file's dict, then StableDiffusionPipeline's fix-ups (steps_offset 1, clip_sample
false), then 5 inference steps on random inputs.

Reference: diffusers 0.42.1 on the CPU in fp32. Generated with Debian 12's python3-torch 1.13.1
(diffusers 0.42.1 imported with a stub for the torch.accelerator module it probes, which 1.13
lacks); the steps are elementwise fp32 arithmetic on 0-d tensors, so the torch version matters
only through its sqrt (doc/sampling.md, "Why the scheduler steps are not bit-identical").

Output: tests/data/sample/sched_config.safetensors (all F32):
  in_sample [2,3,5,4], in_model_out [20,2,3,5,4]: the step inputs (torch seed 77)
  step_<case> [calls,2,3,5,4]: the sample after each scheduler.step, for the CONFIGS below
        (the C test holds the same JSON texts)

Run:
    python tests/reference/make_sched_config_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import json
import os
import types

import numpy as np
import torch

if not hasattr(torch, "accelerator"):  # torch < 2.6: diffusers 0.42 only asks for availability
    torch.accelerator = types.SimpleNamespace(is_available=lambda: False,
                                              current_accelerator=lambda: None)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "data", "sample")
SD2 = ('"beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear", '
       '"num_train_timesteps": 1000, "steps_offset": 1')

# case -> (diffusers class, N, scheduler_config.json text)
CONFIGS = {
    # PNDMScheduler's set_alpha_to_one: the last step (prev_t < 0) ends at abar = 1
    "pndm_alpha1_eps": ("PNDMScheduler", 5,
                        '{' + SD2 + ', "skip_prk_steps": true, "set_alpha_to_one": true}'),
    "pndm_alpha1_v": ("PNDMScheduler", 5,
                      '{' + SD2 + ', "skip_prk_steps": true, "set_alpha_to_one": true, '
                      '"prediction_type": "v_prediction"}'),
    "pndm_prk_alpha1_eps": ("PNDMScheduler", 5,
                            '{' + SD2 + ', "skip_prk_steps": false, "set_alpha_to_one": true}'),
    # a DDIM config (set_alpha_to_one true, clip_sample true) sampled with PNDM
    "pndm_from_ddim_eps": ("PNDMScheduler", 5,
                           '{"_class_name": "DDIMScheduler", ' + SD2 + ', "clip_sample": true, '
                           '"set_alpha_to_one": true, "skip_prk_steps": true}'),
}


def main():
    import diffusers
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(77)
    shape = (2, 3, 5, 4)
    sample0 = torch.randn(shape, generator=g)
    mos = torch.randn((20,) + shape, generator=g)
    out = {"in_sample": sample0.numpy(), "in_model_out": mos.numpy()}
    for name, (cls, n_steps, text) in CONFIGS.items():
        s = getattr(diffusers, cls).from_config(json.loads(text))
        fix = {}
        if getattr(s.config, "steps_offset", 1) != 1:
            fix["steps_offset"] = 1
        if getattr(s.config, "clip_sample", False) is True:
            fix["clip_sample"] = False
        if fix:
            s._internal_dict = diffusers.configuration_utils.FrozenDict({**s.config, **fix})
        s.set_timesteps(n_steps)
        x = sample0 * s.init_noise_sigma
        steps = []
        for i, t in enumerate(s.timesteps):
            x_in = s.scale_model_input(x, t)
            assert torch.equal(x_in, x)
            x = s.step(mos[i], t, x).prev_sample
            steps.append(x.numpy().copy())
        out["step_" + name] = np.stack(steps)
        print(name, cls, len(steps), "calls")

    from safetensors.numpy import save_file
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "sched_config.safetensors")
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}, path)
    print(f"wrote {path}: {len(out)} tensors")


if __name__ == "__main__":
    main()
