"""Checks `sdtool forward` against transformers / diffusers at the full SD2-base size (not in CI).

Builds the SD2-base text encoder (23 layers, 1024 wide, eos_token_id 2 as in the hub config, so
pooler_output uses the legacy argmax rule) and/or the SD2-base VAE with random weights (every
parameter random, norms around 1, as the tiny goldens), saves them as a diffusers snapshot in a
temporary folder (F32 safetensors; the VAE mid-block attention in the legacy query/key/value/
proj_attn spelling and the text encoder keys with the "text_model." prefix, as the hub files),
runs the reference and `sdtool forward` on the same inputs with the same thread count, and
prints the relative error ||ours - ref|| / ||ref|| of every output (goal <= 1e-5) and both
forward times.

    tests/reference/.venv-models/bin/python tests/reference/verify_full_size.py \
        [--sdtool "build/cpu/sdtool forward"] [--modules text-encoder,vae-encode,vae-decode]
        [--res 256] [--batch 1] [--threads 2] [--keep DIR]

--sdtool is the command that takes `--snapshot ... --module ...` (split like a shell line).
Exit status 0 when every error is within --tol (default 1e-5), 1 otherwise.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from safetensors.numpy import load_file as np_load
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import AutoencoderKL
from transformers import CLIPTextConfig, CLIPTextModel

SD2_TEXT = dict(vocab_size=49408, hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                num_hidden_layers=23, max_position_embeddings=77, hidden_act="gelu",
                layer_norm_eps=1e-5, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                projection_dim=512)
SD2_VAE = dict(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512),
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
               layers_per_block=2, latent_channels=4, norm_num_groups=32, sample_size=512)
LEGACY = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            fan = p.shape[1] if p.dim() > 1 else 1
            if p.dim() > 2:
                fan = p.shape[1] * p.shape[2] * p.shape[3]
            if p.dim() == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(fan))
    return model


def rename_file(path, rename):
    t = load_file(path)
    save_file({rename(k): v for k, v in t.items()}, path, metadata={"format": "pt"})


def rel(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def timed(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return out, min(ts)


def run_sdtool(cmd, snap, module, inp, out, threads, repeat):
    argv = shlex.split(cmd) + ["--snapshot", snap, "--module", module, "--in", inp, "--out", out,
                               "--threads", str(threads), "--repeat", str(repeat)]
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}{res.stderr}")
    m = re.search(r"load ([0-9.]+) s, forward ([0-9.]+) s", res.stdout)
    return res.stdout.strip(), float(m[1]), float(m[2])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sdtool", default="build/cpu/sdtool forward")
    ap.add_argument("--modules", default="text-encoder,vae-encode")
    ap.add_argument("--res", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=1,
                    help="timed runs after a warm-up (sdtool: --repeat reps+1); the fastest counts")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--keep", help="write the snapshot and tensors here instead of a temp folder")
    a = ap.parse_args()
    mods = a.modules.split(",")
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    work = a.keep or tempfile.mkdtemp(prefix="sdtrain-verify-")
    os.makedirs(work, exist_ok=True)
    snap = os.path.join(work, "snapshot")
    os.makedirs(snap, exist_ok=True)
    with open(os.path.join(snap, "model_index.json"), "w") as f:
        json.dump({"_class_name": "StableDiffusionPipeline", "_diffusers_version": diffusers.__version__,
                   "text_encoder": ["transformers", "CLIPTextModel"],
                   "vae": ["diffusers", "AutoencoderKL"]}, f)
    g = torch.Generator().manual_seed(1234)
    B, R = a.batch, a.res
    worst = 0.0
    print(f"# SD2-base size, random weights, fp32 CPU, {a.threads} threads, batch {B}; torch "
          f"{torch.__version__}, diffusers {diffusers.__version__}; work folder {work}")

    if "text-encoder" in mods:
        text = randomize(CLIPTextModel(CLIPTextConfig(**SD2_TEXT)), 3).eval()
        text.save_pretrained(os.path.join(snap, "text_encoder"), safe_serialization=True)
        rename_file(os.path.join(snap, "text_encoder", "model.safetensors"),
                    lambda k: k if k.startswith("text_model.") else "text_model." + k)
        ids = torch.randint(0, 49406, (B, 77), generator=g, dtype=torch.int64)
        ids[:, 0] = 49406
        ids[:, 12] = 49407  # eos, then "!" padding (id 0) as SD2's tokenizer pads
        ids[:, 13:] = 0
        with torch.no_grad():
            ref, t_ref = timed(lambda: text(input_ids=ids), a.reps)
        del text
        inp, out = os.path.join(work, "text_in.safetensors"), os.path.join(work, "text_out.safetensors")
        save_file({"input_ids": ids}, inp)
        line, t_load, t_ours = run_sdtool(a.sdtool, snap, "text-encoder", inp, out, a.threads,
                                          a.reps + 1)
        ours = np_load(out)
        for k, v in (("last_hidden_state", ref.last_hidden_state), ("pooler_output", ref.pooler_output)):
            e = rel(ours[k], v.numpy())
            worst = max(worst, e)
            print(f"text-encoder  {k:24s} {str(list(v.shape)):18s} rel err {e:.3g}")
        print(f"text-encoder  time: transformers {t_ref:.3f} s, sdtool {t_ours:.3f} s "
              f"(ratio {t_ref / t_ours:.2f}; sdtool load {t_load:.2f} s)")

    if "vae-encode" in mods or "vae-decode" in mods:
        vae = randomize(AutoencoderKL(**SD2_VAE), 4).eval()
        vae.save_pretrained(os.path.join(snap, "vae"), safe_serialization=True)

        def legacy(k):
            for new, old in LEGACY.items():
                k = k.replace(".attentions.0." + new + ".", ".attentions.0." + old + ".")
            return k
        rename_file(os.path.join(snap, "vae", "diffusion_pytorch_model.safetensors"), legacy)
        if "vae-encode" in mods:
            img = torch.rand(B, 3, R, R, generator=g) * 2 - 1
            with torch.no_grad():
                dist, t_ref = timed(lambda: vae.encode(img).latent_dist, a.reps)
            inp, out = os.path.join(work, "enc_in.safetensors"), os.path.join(work, "enc_out.safetensors")
            save_file({"images": img}, inp)
            line, t_load, t_ours = run_sdtool(a.sdtool, snap, "vae-encode", inp, out, a.threads,
                                          a.reps + 1)
            ours = np_load(out)
            for k, v in (("latent_dist.parameters", dist.parameters), ("latent_dist.mean", dist.mean),
                         ("latent_dist.logvar", dist.logvar)):
                e = rel(ours[k], v.numpy())
                worst = max(worst, e)
                print(f"vae-encode    {k:24s} {str(list(v.shape)):18s} rel err {e:.3g}")
            print(f"vae-encode    time: diffusers {t_ref:.3f} s, sdtool {t_ours:.3f} s "
                  f"(ratio {t_ref / t_ours:.2f}; sdtool load {t_load:.2f} s)")
        if "vae-decode" in mods:
            lat = torch.randn(B, 4, R // 8, R // 8, generator=g)
            with torch.no_grad():
                dec, t_ref = timed(lambda: vae.decode(lat).sample, a.reps)
            inp, out = os.path.join(work, "dec_in.safetensors"), os.path.join(work, "dec_out.safetensors")
            save_file({"latents": lat}, inp)
            line, t_load, t_ours = run_sdtool(a.sdtool, snap, "vae-decode", inp, out, a.threads,
                                          a.reps + 1)
            e = rel(np_load(out)["sample"], dec.numpy())
            worst = max(worst, e)
            print(f"vae-decode    {'sample':24s} {str(list(dec.shape)):18s} rel err {e:.3g}")
            print(f"vae-decode    time: diffusers {t_ref:.3f} s, sdtool {t_ours:.3f} s "
                  f"(ratio {t_ref / t_ours:.2f}; sdtool load {t_load:.2f} s)")
    ok = worst <= a.tol
    print(f"worst relative error {worst:.3g}: {'OK' if ok else 'FAIL'} (tolerance {a.tol:g})")
    if not a.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
