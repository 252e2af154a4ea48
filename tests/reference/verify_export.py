"""Checks a snapshot written by `sdtool export` with diffusers (not in CI; doc/export.md).

Loads DIR/unet with UNet2DConditionModel.from_pretrained, checks that every tensor diffusers
loaded equals the exported file's bit for bit (and that none is missing or left over), runs the
diffusers forward and `sdtool forward --snapshot DIR --module unet` on the same random inputs and
prints ||ours - ref|| / ||ref|| and the largest absolute difference (goal <= 1e-5). When
model_index.json lists a VAE, a text encoder and a tokenizer, it also loads the whole
StableDiffusionPipeline.from_pretrained(DIR) and generates one small image with it.

    /path/to/.venv-models/bin/python tests/reference/verify_export.py DIR \
        [--sdtool "build-cpu/sdtool"] [--res 8] [--batch 2] [--tol 1e-5]

Exit status 0 when everything holds, 1 otherwise.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import load_file as np_load
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import StableDiffusionPipeline, UNet2DConditionModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--sdtool", default="build-cpu/sdtool")
    ap.add_argument("--res", type=int, default=8, help="latent height and width")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ok = True
    torch.set_num_threads(1)

    unet = UNet2DConditionModel.from_pretrained(os.path.join(a.dir, "unet")).eval()
    print(f"diffusers {diffusers.__version__}, torch {torch.__version__}: "
          f"UNet2DConditionModel.from_pretrained({a.dir}/unet) loaded "
          f"({sum(p.numel() for p in unet.parameters())} parameters)")
    stored = load_file(os.path.join(a.dir, "unet", "diffusion_pytorch_model.safetensors"))
    sd = unet.state_dict()
    missing = sorted(set(sd) - set(stored))
    extra = sorted(set(stored) - set(sd))
    differ = [k for k in sd if k in stored and not torch.equal(sd[k], stored[k])]
    print(f"weights: {len(stored)} tensors in the file, {len(sd)} in the model; missing {len(missing)}, "
          f"left over {len(extra)}, not bit-identical {len(differ)}")
    ok &= not missing and not extra and not differ

    cfg = unet.config
    g = torch.Generator().manual_seed(a.seed)
    sample = torch.randn(a.batch, cfg.in_channels, a.res, a.res, generator=g)
    timestep = torch.tensor([999.0, 17.0][: a.batch] + [500.0] * max(0, a.batch - 2))
    ctx = torch.randn(a.batch, 77, cfg.cross_attention_dim, generator=g)
    with torch.no_grad():
        ref = unet(sample, timestep, encoder_hidden_states=ctx).sample.numpy()
    with tempfile.TemporaryDirectory() as tmp:
        fin, fout = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file({"sample": sample.contiguous(), "timestep": timestep.contiguous(),
                   "encoder_hidden_states": ctx.contiguous()}, fin)
        cmd = shlex.split(a.sdtool) + ["forward", "--snapshot", a.dir, "--module", "unet",
                                       "--in", fin, "--out", fout, "--threads", "1"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"sdtool forward failed ({r.returncode}): {r.stderr.strip()}")
            return 1
        ours = np_load(fout)["sample"]
    rel = float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))
    mad = float(np.abs(ours - ref).max())
    print(f"unet forward [{a.batch}, {cfg.in_channels}, {a.res}, {a.res}]: sdtool vs diffusers "
          f"rel err {rel:.3e}, max abs diff {mad:.3e} (|ref| max {float(np.abs(ref).max()):.3f})")
    ok &= rel <= a.tol

    with open(os.path.join(a.dir, "model_index.json")) as f:
        index = json.load(f)
    parts = [k for k in ("vae", "text_encoder", "tokenizer") if (index.get(k) or [None, None])[1]]
    if len(parts) == 3:
        pipe = StableDiffusionPipeline.from_pretrained(a.dir, safety_checker=None)
        if pipe.tokenizer.model_max_length > 10**6:  # a tokenizer/ without tokenizer_config.json
            pipe.tokenizer.model_max_length = 77
        size = 8 * pipe.unet.config.sample_size
        img = pipe("a red square on a blue background", num_inference_steps=2, height=size,
                   width=size, generator=torch.Generator().manual_seed(0),
                   output_type="np").images[0]
        print(f"StableDiffusionPipeline.from_pretrained({a.dir}) loaded ({type(pipe.scheduler).__name__}); "
              f"a {img.shape[1]}x{img.shape[0]} image in 2 steps, mean {float(img.mean()):.3f}")
    else:
        print(f"model_index.json has no {', '.join(k for k in ('vae', 'text_encoder', 'tokenizer') if k not in parts)}: "
              f"StableDiffusionPipeline needs them passed in (export without a pretrained snapshot)")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
