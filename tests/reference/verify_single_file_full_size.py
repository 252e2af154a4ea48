"""Checks `sdtool single-file` and `sdtool import-single-file` at the full SD2-base size (not in
CI; doc/export.md "One file").

Builds SD2-base's U-Net, VAE and text encoder with random weights in diffusers / transformers,
saves them as a snapshot (F16 safetensors, as the hub's), runs `sdtool single-file` on it
(--dtype F16, and the peak memory of the process from /usr/bin/time), then:
  - converts the file back with diffusers' convert_ldm_unet_checkpoint,
    convert_ldm_vae_checkpoint and convert_open_clip_checkpoint and compares every tensor with
    the snapshot's (bit for bit, nothing missing, left over or unused), and loads it with
    UNet2DConditionModel.from_single_file (config from the snapshot);
  - runs `sdtool import-single-file` with the snapshot as the configuration and compares the
    imported snapshot's tensors with the original's (bit for bit, as fp32).

    tests/reference/.venv-models/bin/python tests/reference/verify_single_file_full_size.py \
        [--sdtool build/cpu/sdtool] [--keep DIR]

Needs about 12 GB of memory and 10 GB of disk. Exit status 0 when everything holds.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
from safetensors.torch import load_file

from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders import single_file_utils as sfu
from transformers import CLIPTextConfig, CLIPTextModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# SD2-base's configurations, as the other full-size checks build them
from verify_full_size import SD2_TEXT, SD2_VAE  # noqa: E402
from verify_unet_full_size import SD2_BASE as SD2_UNET  # noqa: E402
from make_single_file_goldens import bare, same  # noqa: E402


def timed(cmd):
    """Runs cmd under /usr/bin/time -v: (seconds, peak RSS in GB)."""
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return time.time() - t0, int(rss.group(1)) / 2**20 if rss else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdtool", default="build/cpu/sdtool")
    ap.add_argument("--keep", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    tmp = a.keep or tempfile.mkdtemp(prefix="sdsf-")
    snap = os.path.join(tmp, "snap")
    unet = UNet2DConditionModel(**SD2_UNET).half()
    vae = AutoencoderKL(**SD2_VAE).half()
    text = CLIPTextModel(CLIPTextConfig(**SD2_TEXT)).half()
    with torch.no_grad():  # norms and biases random too, so a misplaced tensor cannot hide
        for m in (unet, vae, text):
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    unet.save_pretrained(os.path.join(snap, "unet"))
    vae.save_pretrained(os.path.join(snap, "vae"))
    text.save_pretrained(os.path.join(snap, "text_encoder"))
    path = os.path.join(tmp, "sd2.safetensors")
    secs, rss = timed([a.sdtool, "single-file", "--snapshot", snap, "--out", path, "--dtype", "F16",
                       "--force"])
    print(f"sdtool single-file: {secs:.1f} s, peak RSS {rss:.2f} GB, file "
          f"{os.path.getsize(path) / 2**30:.2f} GiB")
    ckpt = load_file(path)
    bad = same("unet", sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config)), unet.state_dict())
    bad += same("vae", sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config)), vae.state_dict())
    bad += same("text encoder", bare(sfu.convert_open_clip_checkpoint(text, ckpt)),
                bare(text.state_dict()))
    u2 = UNet2DConditionModel.from_single_file(path, config=snap, subfolder="unet",
                                               local_files_only=True, torch_dtype=torch.float16)
    bad += same("unet from_single_file", u2.state_dict(), unet.state_dict())
    n = {p: sum(k.startswith(p) for k in ckpt) for p in ("model.", "first_stage_model.",
                                                          "cond_stage_model.")}
    print(f"file: {len(ckpt)} tensors ({n}); diffusers' conversion: "
          f"{'every tensor bit for bit' if not bad else f'{len(bad)} problems'}")
    del ckpt, u2

    out = os.path.join(tmp, "imported")
    secs, rss = timed([a.sdtool, "import-single-file", "--file", path, "--config", snap, "--out", out,
                       "--force"])
    print(f"sdtool import-single-file: {secs:.1f} s, peak RSS {rss:.2f} GB")
    for part, fname, model in (("unet", "diffusion_pytorch_model.safetensors", unet),
                               ("vae", "diffusion_pytorch_model.safetensors", vae),
                               ("text_encoder", "model.safetensors", text)):
        got = load_file(os.path.join(out, part, fname))
        bad += same(f"imported {part}", bare(got), bare(model.state_dict()))
    for b in bad[:20]:
        print("FAIL", b)
    print("all tensors bit for bit" if not bad else f"{len(bad)} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
