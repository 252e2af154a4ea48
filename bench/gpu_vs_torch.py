#!/usr/bin/env python3
"""sdtrain's CUDA backend vs diffusers + PyTorch on the same GPU, in the same run.

Measured (SD2-base shapes, random weights, bf16):
  vae-encode   images/s of AutoencoderKL.encode at 256 and 512 px, batch --batch
  unet-train   U-Net forward + backward (gradients of all weights) at 256 px, batch --batch
  unet-fwd     U-Net forward alone
PyTorch side: the weights in bf16 for the VAE (inference), bf16 autocast over fp32 weights for
the U-Net (how training runs), channels_last, PyTorch's SDPA attention (diffusers' default),
and torch.compile unless --no-compile. Both sides are timed from a synchronized device to a
synchronized device, median of --reps after warm-ups (compilation happens in the warm-ups).
Our side is bench/models_cuda from the build (or bundle) given by --bin; with --variant (one or
more) our side runs once more per variant, with that variant's environment (e.g. --variant
"legacy=SDTRAIN_CUDA_CONV_API=legacy"), against the same torch measurement: one row per variant.

Prints one table: what, resolution, batch, ours ms, torch ms, ratio (torch / ours, > 1 means
sdtrain is faster), and images/s; each row also as a "PEER ..." line as soon as it is measured,
so that a run cut at a deadline keeps the cases it finished. Needs torch with CUDA and diffusers (carry the wheel: see
bench/README.md, "GPU benchmarks"). Versions are printed with the table.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

SD2_UNET = dict(sample_size=64, in_channels=4, out_channels=4,
                down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                attention_head_dim=(5, 10, 20, 20), cross_attention_dim=1024,
                use_linear_projection=True, norm_num_groups=32, flip_sin_to_cos=True, freq_shift=0)
SD2_VAE = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512),
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
               layers_per_block=2, latent_channels=4, norm_num_groups=32, sample_size=512)


def timed(fn, reps, warmup):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_vae(batch, res, reps, warmup, compile_):
    import torch
    from diffusers import AutoencoderKL
    vae = AutoencoderKL(**SD2_VAE).to("cuda", dtype=torch.bfloat16).eval()
    vae = vae.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, res, res, device="cuda", dtype=torch.bfloat16)
    x = x.to(memory_format=torch.channels_last)
    enc = torch.compile(vae.encode) if compile_ else vae.encode

    def step():
        with torch.inference_mode():
            enc(x).latent_dist.mean
    t = timed(step, reps, warmup)
    del vae
    torch.cuda.empty_cache()
    return t


def torch_unet(batch, res, reps, warmup, compile_, train):
    import torch
    from diffusers import UNet2DConditionModel
    unet = UNet2DConditionModel(**SD2_UNET).to("cuda").to(memory_format=torch.channels_last)
    L = res // 8
    x = torch.randn(batch, 4, L, L, device="cuda").to(memory_format=torch.channels_last)
    ctx = torch.randn(batch, 77, 1024, device="cuda")
    t = torch.arange(batch, device="cuda") * 997 % 1000
    dout = torch.randn(batch, 4, L, L, device="cuda")
    fwd = torch.compile(unet) if compile_ else unet
    if train:
        unet.train()

        def step():
            unet.zero_grad(set_to_none=False)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = fwd(x, t, ctx).sample
            out.float().backward(dout)
    else:
        unet.eval()

        def step():
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
                fwd(x, t, ctx).sample
    ms = timed(step, reps, warmup)
    del unet
    torch.cuda.empty_cache()
    return ms


def ours(binary, what, batch, res, reps, warmup, env=None):
    cmd = [binary, "--what", what, "--batch", str(batch), "--res", str(res), "--reps", str(reps),
           "--warmup", str(warmup), "--precision", "bf16"]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, **env) if env else None)
    sys.stdout.write(p.stdout)
    # always: a variant's diagnostics (SDTRAIN_CUDA_CONV_LOG=1: each shape's plans and timings)
    # belong in the log beside its row
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        return None
    m = re.search(r"RESULT what=\S+ .* ms=([0-9.]+)", p.stdout)
    return float(m.group(1)) / 1e3 if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/cuda/bench/models_cuda")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--what", default="vae-encode,unet-train,unet-fwd")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=VAR=value[ VAR=value...]: our side again with these variables")
    a = ap.parse_args()
    variants = [("default", {})]
    for v in a.variant:
        name, _, envs = v.partition("=")
        env = dict(e.split("=", 1) for e in envs.split() if "=" in e)
        if not name or not env:
            ap.error(f"--variant {v!r}: want NAME=VAR=value[ VAR=value...]")
        variants.append((name, env))
    import torch
    import diffusers
    compile_ = not a.no_compile
    print(f"# torch {torch.__version__}, diffusers {diffusers.__version__}, "
          f"{torch.cuda.get_device_name()}, compile={compile_}")
    cases = []
    for w in a.what.split(","):
        if w == "vae-encode":
            cases += [(w, 256), (w, 512)]
        else:
            cases.append((w, 256))
    rows = []
    for what, res in cases:
        mine = [ours(a.bin, what, a.batch, res, a.reps, a.warmup, env) for _, env in variants]
        if what == "vae-encode":
            theirs = torch_vae(a.batch, res, a.reps, a.warmup + 2, compile_)
        else:
            theirs = torch_unet(a.batch, res, a.reps, a.warmup + 2, compile_, what == "unet-train")
        for (name, _), m in zip(variants, mine):
            rows.append((what, res, m, theirs, name))
            # each case's line as soon as it is measured: a run cut at a deadline keeps what it had
            print("PEER " + row(what, res, a.batch, m, theirs, name), flush=True)
    print(f"\n{'what':<12} {'res':>4} {'batch':>5} {'ours ms':>9} {'torch ms':>9} {'ratio':>6} "
          f"{'ours img/s':>10} {'torch img/s':>11}  ours")
    for what, res, mine, theirs, name in rows:
        print(row(what, res, a.batch, mine, theirs, name))


def row(what, res, batch, mine, theirs, name="default"):
    """One line of the table: ours and torch's ms, the ratio (> 1: sdtrain faster), images/s,
    and which variant of ours."""
    r = f"{theirs / mine:6.2f}" if mine else "   n/a"
    om = f"{mine * 1e3:9.2f}" if mine else "   failed"
    oi = f"{batch / mine:10.1f}" if mine else "       n/a"
    return (f"{what:<12} {res:>4} {batch:>5} {om} {theirs * 1e3:9.2f} {r} {oi} "
            f"{batch / theirs:11.1f}  {name}")

if __name__ == "__main__":
    main()
