"""Writes the diffusion-schedule goldens that tests/unit/test_diffusion.c compares against.

Output: tests/data/diffusion/goldens.safetensors (written with safetensors.numpy), holding
  betas_<schedule>_<cap>, alphas_cumprod_<schedule>_<cap>
      DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012) with
      beta_schedule scaled_linear, and beta_start=0.0001, beta_end=0.02 with linear, computed
      by torch under ATEN_CPU_CAPABILITY=<cap> for cap in {default, avx2}. The two differ at
      the ulp level: torch's CPU linspace kernel computes start + step*i (first half) and
      end - step*(n-1-i) (second half) per element, and the AVX2/AVX512 builds of that kernel
      are compiled with FMA contraction (one rounding) while the default build is not.
  x0, noise, timesteps, pred        inputs (x0/noise/pred [4,4,3,5] fp32, timesteps int64 [4])
  noisy_eps, velocity               DDPMScheduler.add_noise / get_velocity (scaled_linear)
  noisy_v, velocity_v               the same for prediction_type v_prediction (identical math)
  torch_sqrt_abar_t, torch_sqrt_1m_abar_t   alphas_cumprod[t] ** 0.5, (1 - alphas_cumprod[t]) ** 0.5
  snr                               diffusers.training_utils.compute_snr for t = 0..999
  minsnr_eps_g5, minsnr_v_g5        train_text_to_image.py min-SNR weights, gamma 5, all t
  loss_eps_g5, grad_eps_g5          the example's weighted loss for (pred, noise) and its
  loss_v_g5, grad_v_g5              gradient d loss / d pred (autograd), batch of 4
  loss_plain, grad_plain            plain F.mse_loss(pred, noise) (no weighting)

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_diffusion_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import json
import os
import subprocess
import sys

# The main part runs under the AVX2 kernels (the FMA-contracted linspace that AVX2 and AVX512
# CPUs give), whatever this CPU would pick; re-exec before torch is imported.
if os.environ.get("ATEN_CPU_CAPABILITY") is None:
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, ATEN_CPU_CAPABILITY="avx2"))

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.normpath(os.path.join(HERE, "..", "data", "diffusion"))

SCHEDULES = {"scaled_linear": (0.00085, 0.012), "linear": (0.0001, 0.02)}


def schedules():
    from diffusers import DDPMScheduler

    out = {}
    for name, (b0, b1) in SCHEDULES.items():
        s = DDPMScheduler(num_train_timesteps=1000, beta_start=b0, beta_end=b1, beta_schedule=name)
        out["betas_" + name] = s.betas.numpy().astype(np.float32)
        out["alphas_cumprod_" + name] = s.alphas_cumprod.numpy().astype(np.float32)
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--schedules-only":
        np.savez(sys.argv[2], cap=torch.backends.cpu.get_cpu_capability(), **schedules())
        return

    import diffusers
    from diffusers import DDPMScheduler
    from diffusers.training_utils import compute_snr
    from safetensors.numpy import save_file

    torch.set_num_threads(1)
    tensors = {}
    caps = {}
    for cap in ("default", "avx2"):
        tmp = os.path.join(OUT, ".sched_%s.npz" % cap)
        env = dict(os.environ, ATEN_CPU_CAPABILITY=cap)
        subprocess.run([sys.executable, __file__, "--schedules-only", tmp], env=env, check=True)
        z = np.load(tmp)
        caps[cap] = str(z["cap"])
        for k in z.files:
            if k != "cap":
                tensors["%s_%s" % (k, cap)] = np.ascontiguousarray(z[k])
        os.remove(tmp)

    g = torch.Generator().manual_seed(1234)
    x0 = torch.randn(4, 4, 3, 5, generator=g)
    noise = torch.randn(4, 4, 3, 5, generator=g)
    pred = torch.randn(4, 4, 3, 5, generator=g)
    t = torch.tensor([0, 17, 500, 999], dtype=torch.int64)
    tensors.update(x0=x0.numpy(), noise=noise.numpy(), pred=pred.numpy(), timesteps=t.numpy())

    for ptype, suffix in (("epsilon", "eps"), ("v_prediction", "v")):
        s = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                          beta_schedule="scaled_linear", prediction_type=ptype)
        noisy = s.add_noise(x0, noise, t)
        vel = s.get_velocity(x0, noise, t)
        tensors["noisy_" + suffix] = noisy.numpy()
        # torch's own square roots of the gathered factors (its CPU float sqrt is not
        # correctly rounded), so that the C test can check the order of operations bit for bit
        tensors["torch_sqrt_abar_t"] = (s.alphas_cumprod[t] ** 0.5).numpy()
        tensors["torch_sqrt_1m_abar_t"] = ((1 - s.alphas_cumprod[t]) ** 0.5).numpy()
        tensors["velocity" + ("" if suffix == "eps" else "_v")] = vel.numpy()
        all_t = torch.arange(1000, dtype=torch.int64)
        snr = compute_snr(s, all_t)
        tensors["snr"] = snr.numpy()
        gamma = 5.0
        # train_text_to_image.py, verbatim apart from names
        w = torch.stack([snr, gamma * torch.ones_like(all_t)], dim=1).min(dim=1)[0]
        w = w / snr if ptype == "epsilon" else w / (snr + 1)
        tensors["minsnr_%s_g5" % suffix] = w.numpy()

        target = noise if ptype == "epsilon" else vel
        p = pred.clone().requires_grad_(True)
        snr_b = compute_snr(s, t)
        wb = torch.stack([snr_b, gamma * torch.ones_like(t)], dim=1).min(dim=1)[0]
        wb = wb / snr_b if ptype == "epsilon" else wb / (snr_b + 1)
        loss = torch.nn.functional.mse_loss(p.float(), target.float(), reduction="none")
        loss = loss.mean(dim=list(range(1, len(loss.shape)))) * wb
        loss = loss.mean()
        loss.backward()
        tensors["loss_%s_g5" % suffix] = loss.detach().reshape(1).numpy()
        tensors["grad_%s_g5" % suffix] = p.grad.numpy()

    p = pred.clone().requires_grad_(True)
    loss = torch.nn.functional.mse_loss(p.float(), noise.float(), reduction="mean")
    loss.backward()
    tensors["loss_plain"] = loss.detach().reshape(1).numpy()
    tensors["grad_plain"] = p.grad.numpy()

    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    meta = {"diffusers": diffusers.__version__, "torch": torch.__version__,
            "capabilities": json.dumps(caps),
            "main_capability": torch.backends.cpu.get_cpu_capability()}
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "goldens.safetensors")
    save_file(tensors, path, metadata=meta)
    os.chmod(path, 0o644)
    print("wrote", path, meta)


if __name__ == "__main__":
    main()
