"""Full-size U-Net parity check (not part of `make check`: it needs 8+ GB of memory and minutes).

Builds diffusers' UNet2DConditionModel with the SD2-base configuration and random weights (every
parameter random, norms around 1, as the tiny goldens), saves it as a diffusers snapshot in a
temporary folder, runs it in PyTorch (CPU, fp32) on random inputs, runs our implementation on the
same snapshot and inputs, and prints the relative error ||ours - ref|| / ||ref|| (goal <= 1e-5)
and both forward times. Ours runs through `sdtool forward --module unet` (--sdtool) or the
bench/unet_file driver (--driver, the default).

    OMP_NUM_THREADS=2 tests/reference/.venv-models/bin/python tests/reference/verify_unet_full_size.py \
        [--sdtool build/cpu/sdtool | --driver build/cpu/bench/unet_file] [--latent 32] [--batch 1] \
        [--reps N] [--keep DIR]

Exit status 0 when the error is within --tol, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import diffusers
from diffusers import UNet2DConditionModel
from safetensors.torch import load_file, save_file

SD2_BASE = dict(sample_size=64, in_channels=4, out_channels=4,
                down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                attention_head_dim=(5, 10, 20, 20), cross_attention_dim=1024,
                use_linear_projection=True, norm_num_groups=32, flip_sin_to_cos=True, freq_shift=0)


def randomize(model, seed):
    """Same scheme as make_model_goldens.py: N(0, 1/fan_in) weights, norm scales 1 + N(0, 0.04)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            fan = p.shape[1] if p.dim() > 1 else 1
            if p.dim() > 2:
                fan = p.shape[1] * p.shape[2] * p.shape[3]
            if p.dim() == 1 and ("norm" in name and name.endswith("weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", default="build/cpu/bench/unet_file", help="path of bench/unet_file")
    ap.add_argument("--sdtool", help="path of sdtool: run `sdtool forward --module unet` instead")
    ap.add_argument("--latent", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--reps", type=int, default=1, help="timed forwards on each side (median)")
    ap.add_argument("--sdpa", action="store_true",
                    help="PyTorch's default SDPA attention instead of the eager AttnProcessor")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--keep", help="write the snapshot and tensors here and keep them")
    a = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(a.threads)
    work = a.keep or tempfile.mkdtemp(prefix="sdtrain-unet-full-")
    os.makedirs(work, exist_ok=True)
    try:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        model = UNet2DConditionModel(**SD2_BASE).eval()
        randomize(model, 2026)
        if not a.sdpa:
            model.set_attn_processor(diffusers.models.attention_processor.AttnProcessor())
        n_params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(os.path.join(work, "unet"), safe_serialization=True)
        with open(os.path.join(work, "model_index.json"), "w") as f:
            json.dump({"_class_name": "StableDiffusionPipeline",
                       "_diffusers_version": diffusers.__version__,
                       "unet": ["diffusers", "UNet2DConditionModel"]}, f)
        print("SD2-base U-Net, %d parameters, random weights saved in %.1f s" % (
            n_params, time.perf_counter() - t0))

        g = torch.Generator().manual_seed(7)
        sample = torch.randn(a.batch, 4, a.latent, a.latent, generator=g)
        timestep = torch.tensor([999, 500, 1, 250][:a.batch] + [0] * max(0, a.batch - 4),
                                dtype=torch.int64)
        ctx = torch.randn(a.batch, 77, 1024, generator=g)
        times = []
        with torch.inference_mode():
            for _ in range(a.reps):
                t0 = time.perf_counter()
                ref = model(sample, timestep, encoder_hidden_states=ctx).sample
                times.append(time.perf_counter() - t0)
        torch_ms = (min(times) if a.sdtool else float(np.median(times))) * 1e3
        del model
        inputs = os.path.join(work, "inputs.safetensors")
        save_file({"sample": sample.contiguous(), "timestep": timestep,
                   "encoder_hidden_states": ctx.contiguous(), "ref.sample": ref.contiguous()}, inputs)

        out_path = os.path.join(work, "ours.safetensors")
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        if a.sdtool:
            cmd = [a.sdtool, "forward", "--snapshot", work, "--module", "unet", "--in", inputs,
                   "--out", out_path, "--threads", str(a.threads), "--repeat", str(a.reps)]
        else:
            cmd = [a.driver, work, inputs, out_path, "--reps", str(a.reps)]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        sys.stdout.write(res.stdout)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
            sys.exit("%s failed with status %d" % (cmd[0], res.returncode))
        if a.sdtool:  # "forward: unet ...: load X s, forward Y s ..."
            line = next(l for l in res.stdout.splitlines() if l.startswith("forward:"))
            ours_ms = float(line.split(", forward ")[1].split(" s")[0]) * 1e3
            ours = load_file(out_path)["sample"].double()
        else:
            ours_ms = next(float(l.split("=")[1]) for l in res.stdout.splitlines()
                           if l.startswith("RESULT ms="))
            ours = load_file(out_path)["out.sample"].double()
        r = ref.double()
        rel = ((ours - r).norm() / r.norm()).item()
        mx = (ours - r).abs().max().item()
        print("latent %dx%d batch %d, %d threads, attention %s" % (
            a.latent, a.latent, a.batch, a.threads, "SDPA" if a.sdpa else "eager"))
        print("relative error ||ours - ref|| / ||ref|| = %.3g (max |diff| %.3g, |ref| max %.3g)" % (
            rel, mx, r.abs().max().item()))
        print("forward time (%s of %d): torch %.1f ms, ours %.1f ms (%s), speedup %.2fx" % (
            "fastest" if a.sdtool else "median", a.reps, torch_ms, ours_ms,
            "sdtool forward" if a.sdtool else "bench/unet_file", torch_ms / ours_ms))
        ok = rel <= a.tol
        print("PASS" if ok else "FAIL (tolerance %g)" % a.tol)
        sys.exit(0 if ok else 1)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
