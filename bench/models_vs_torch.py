"""Times sdtrain's CPU forward (bench/models_cpu) against transformers / diffusers on the CPU.

Same shapes (text encoder: ids [1, 77]; VAE encoder: images [1, 3, R, R] at tiny and SD2-base
size), fp32, random weights, the same thread count on both sides (OpenMP threads for ours,
torch.set_num_threads for PyTorch), median of --reps runs after one warm-up. Prints both times
and the ratio torch / ours (> 1: sdtrain is faster), of the medians and of the fastest runs
(the latter is steadier on a shared machine).

Run (the reference venv of tests/reference/make_model_goldens.py):
    tests/reference/.venv-models/bin/python bench/models_vs_torch.py \
        --bench build/cpu/bench/models_cpu --threads 2 [--res 256] [--reps 3] [--quick]
The 2-core development machine is often shared: compare ratios taken in the same run.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
from diffusers import AutoencoderKL
from transformers import CLIPTextConfig, CLIPTextModel

SD2_TEXT = dict(vocab_size=49408, hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                num_hidden_layers=23, max_position_embeddings=77, hidden_act="gelu",
                layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1)
TINY_TEXT = dict(SD2_TEXT, vocab_size=1000, hidden_size=32, intermediate_size=64,
                 num_attention_heads=4, num_hidden_layers=3)
SD2_VAE = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512),
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
               layers_per_block=2, latent_channels=4, norm_num_groups=32, sample_size=512)
TINY_VAE = dict(SD2_VAE, block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8)


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def torch_times(quick, res, reps):
    out = {}
    sizes = [("tiny", TINY_TEXT, TINY_VAE, 64)]
    if not quick:
        sizes.append(("sd2-base", SD2_TEXT, SD2_VAE, res))
    g = torch.Generator().manual_seed(0)
    for size, tc, vc, r in sizes:
        text = CLIPTextModel(CLIPTextConfig(**tc)).eval()
        ids = torch.randint(0, tc["vocab_size"], (1, 77), generator=g)
        with torch.no_grad():
            out[("text-encoder", size)] = median_time(lambda: text(input_ids=ids), reps)
        del text
        vae = AutoencoderKL(**vc).eval()
        img = torch.rand(1, 3, r, r, generator=g) * 2 - 1
        with torch.no_grad():
            out[("vae-encode", size)] = median_time(lambda: vae.encode(img), reps)
        del vae
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default="build/cpu/bench/models_cpu")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--res", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    cmd = [a.bench, "--reps", str(a.reps), "--res", str(a.res)] + (["--quick"] if a.quick else [])
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr}")
    ours = {}
    for line in res.stdout.splitlines():
        m = re.match(r"RESULT module=(\S+) size=(\S+) seconds=(\S+) min_seconds=(\S+) gflop=(\S+)", line)
        if m:
            ours[(m[1], m[2])] = (float(m[3]), float(m[4]), float(m[5]))

    torch.set_num_threads(a.threads)
    theirs = torch_times(a.quick, a.res, a.reps)

    print(f"# CPU fp32, {a.threads} threads, batch 1, median of {a.reps} (min in parentheses); "
          f"torch {torch.__version__}; ratio = torch / sdtrain")
    print(f"{'module':13s} {'size':9s} {'GFLOP':>8s} {'sdtrain s':>17s} {'GFLOP/s':>8s} "
          f"{'torch s':>17s} {'GFLOP/s':>8s} {'ratio':>6s} {'(min)':>6s}")
    for key in sorted(ours, key=lambda k: (k[1] != "tiny", k[0])):
        if key not in theirs:
            continue
        s, smin, gf = ours[key]
        t, tmin = theirs[key]
        print(f"{key[0]:13s} {key[1]:9s} {gf:8.2f} {s:9.4f} ({smin:.4f}) {gf / s:8.1f} "
              f"{t:9.4f} ({tmin:.4f}) {gf / t:8.1f} {t / s:6.2f} {tmin / smin:6.2f}")


if __name__ == "__main__":
    main()
