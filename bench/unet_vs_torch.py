"""Times diffusers' UNet2DConditionModel forward (CPU, fp32) and bench/unet_cpu on the same
shapes with the same thread count, and prints the ratio.

Run from the repository root with the reference stack of tests/reference/requirements-models.txt:
    OMP_NUM_THREADS=2 tests/reference/.venv-models/bin/python bench/unet_vs_torch.py \
        --ours build/cpu/bench/unet_cpu [--model tiny|sd2|all] [--latent 32] [--batch 1] [--reps 3]

Both sides: random weights, batch 1 (default), 77 context tokens, one warm-up run, then the
median of --reps timed runs. PyTorch runs under torch.inference_mode() with
torch.set_num_threads(threads) and diffusers' default attention processor (SDPA); --eager-attention
selects the eager AttnProcessor that the goldens use. FLOPs per forward come from our benchmark
(2 x multiply-adds of convolutions, linears and attention matmuls), so both rates use one count.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import diffusers
from diffusers import UNet2DConditionModel

CONFIGS = {
    # tiny-sd2 of tests/reference/make_model_goldens.py
    "tiny": dict(block_out_channels=(16, 32), layers_per_block=2, sample_size=8,
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                 attention_head_dim=(2, 4), cross_attention_dim=32, norm_num_groups=8,
                 use_linear_projection=True, flip_sin_to_cos=True, freq_shift=0),
    # SD2-base (spec section 1.1)
    "sd2": dict(sample_size=64, in_channels=4, out_channels=4,
                down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                attention_head_dim=(5, 10, 20, 20), cross_attention_dim=1024,
                use_linear_projection=True, norm_num_groups=32, flip_sin_to_cos=True, freq_shift=0),
}


def time_torch(name, latent, batch, reps, threads, eager, ctx_len=77):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = CONFIGS[name]
    model = UNet2DConditionModel(**cfg).eval()
    if eager:
        model.set_attn_processor(diffusers.models.attention_processor.AttnProcessor())
    sample = torch.randn(batch, cfg.get("in_channels", 4), latent, latent)
    ctx = torch.randn(batch, ctx_len, cfg["cross_attention_dim"])
    t = torch.tensor([999 - 37 * b for b in range(batch)], dtype=torch.int64)
    times = []
    with torch.inference_mode():
        model(sample, t, encoder_hidden_states=ctx)
        for _ in range(reps):
            t0 = time.perf_counter()
            model(sample, t, encoder_hidden_states=ctx)
            times.append(time.perf_counter() - t0)
    del model
    return statistics.median(times) * 1e3, min(times) * 1e3, max(times) * 1e3


def time_ours(binary, name, latent, batch, reps, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "--model", name, "--latent", str(latent), "--batch", str(batch),
                          "--reps", str(reps)], env=env, check=True, capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
    sys.exit("no RESULT line from %s:\n%s%s" % (binary, out.stdout, out.stderr))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default="build/cpu/bench/unet_cpu", help="path of bench/unet_cpu")
    ap.add_argument("--model", choices=["tiny", "sd2", "all"], default="all")
    ap.add_argument("--latent", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--eager-attention", action="store_true")
    a = ap.parse_args()
    models = ["tiny", "sd2"] if a.model == "all" else [a.model]
    print("torch %s, diffusers %s, %d threads, latent %dx%d, batch %d, %d reps" % (
        torch.__version__, diffusers.__version__, a.threads, a.latent, a.latent, a.batch, a.reps))
    print("%-5s %12s %12s %10s %12s %12s %8s" % ("model", "torch ms", "ours ms", "GFLOP",
                                                "torch GF/s", "ours GF/s", "speedup"))
    for m in models:
        ours = time_ours(a.ours, m, a.latent, a.batch, a.reps, a.threads)
        tm, tmin, tmax = time_torch(m, a.latent, a.batch, a.reps, a.threads, a.eager_attention)
        om, gflop = float(ours["ms"]), float(ours["gflop"])
        print("%-5s %12.2f %12.2f %10.3f %12.1f %12.1f %7.2fx" % (
            m, tm, om, gflop, gflop / tm * 1e3, gflop / om * 1e3, tm / om))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
