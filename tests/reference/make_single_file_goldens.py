"""Checks `sdtool single-file` with diffusers' own single-file conversion and writes the goldens
of tests/unit/test_single_file.c.

For each bundled test snapshot (tests/data/models/{tiny-sd2,tiny-sd1,odd}) it runs
`sdtool single-file` (F32), then converts the file back with diffusers' LDM converters
(convert_ldm_unet_checkpoint, convert_ldm_vae_checkpoint, convert_open_clip_checkpoint or
convert_ldm_clip_checkpoint) and requires:
  - every tensor of the U-Net, VAE and text encoder as diffusers / transformers load them from
    the snapshot, bit for bit (fp32), with no tensor missing or left over;
  - every key of the file used by a converter (none is silently dropped);
  - UNet2DConditionModel.from_single_file and AutoencoderKL.from_single_file (diffusers' real
    loading path, with the snapshot's config) give the same tensors.
Then it writes tests/data/single_file/<model>.tsv: one line per tensor of the verified file,
name, dtype, shape and the FNV-1a 64 hash of its bytes, which the C test compares its own
output with.

    tests/reference/.venv-models/bin/python tests/reference/make_single_file_goldens.py \
        --sdtool build/cpu/sdtool

SD_GOLDEN_OUT (a folder) writes the goldens there instead. Versions: requirements-models.txt.
Exit status 0 when everything holds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import diffusers
import transformers
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders import single_file_utils as sfu
from transformers import CLIPTextConfig, CLIPTextModel

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("tiny-sd2", "tiny-sd1", "odd")
PREFIXES = ("model.diffusion_model.", "first_stage_model.", "cond_stage_model.")


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in np.frombuffer(data, dtype=np.uint8):
        h ^= int(b)
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h




def bare(sd: dict) -> dict:
    """A text encoder's tensors without "text_model." and position_ids: transformers 5 names
    CLIPTextModel's tensors without the prefix, the files and diffusers' converters keep it."""
    return {k[len("text_model."):] if k.startswith("text_model.") else k: v
            for k, v in sd.items() if not k.endswith("position_ids")}


def same(name, got: dict, want: dict) -> list:
    """Differences between two state dicts (fp32): missing, extra, unequal."""
    bad = []
    for k in sorted(set(want) - set(got)):
        bad.append(f"{name}: missing {k}")
    for k in sorted(set(got) - set(want)):
        bad.append(f"{name}: left over {k}")
    for k in sorted(set(got) & set(want)):
        a, b = got[k].float(), want[k].float()
        if a.shape != b.shape:
            bad.append(f"{name}: {k} shape {tuple(a.shape)} != {tuple(b.shape)}")
        elif not torch.equal(a, b):
            bad.append(f"{name}: {k} differs (max {float((a - b).abs().max()):.3g})")
    return bad


def check(model: str, sdtool: str, out_dir: str) -> list:
    snap = os.path.join(TOP, "tests", "data", "models", model)
    bad = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{model}.safetensors")
        subprocess.run([sdtool, "single-file", "--snapshot", snap, "--out", path], check=True)
        ckpt = load_file(path)
        stray = [k for k in ckpt if not k.startswith(PREFIXES)]
        bad += [f"{model}: key outside the three models: {k}" for k in stray]

        unet = UNet2DConditionModel.from_pretrained(os.path.join(snap, "unet")).float()
        vae = AutoencoderKL.from_pretrained(os.path.join(snap, "vae")).float()
        text = CLIPTextModel.from_pretrained(os.path.join(snap, "text_encoder")).float()

        got = sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config))
        bad += same(f"{model} unet", got, unet.state_dict())
        n_unet = sum(k.startswith("model.diffusion_model.") for k in ckpt)
        if n_unet != len(got):
            bad.append(f"{model} unet: {n_unet} keys in the file, {len(got)} converted")

        got = sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config))
        bad += same(f"{model} vae", got, vae.state_dict())
        n_vae = sum(k.startswith("first_stage_model.") for k in ckpt)
        if n_vae != len(got):
            bad.append(f"{model} vae: {n_vae} keys in the file, {len(got)} converted")

        want = bare(text.state_dict())
        n_text = sum(k.startswith("cond_stage_model.") for k in ckpt)
        if text.config.hidden_act == "gelu":
            got = sfu.convert_open_clip_checkpoint(text, ckpt)
            fused = sum(k.endswith((".in_proj_weight", ".in_proj_bias")) for k in ckpt)
            used = n_text + 2 * fused
        else:
            got = sfu.convert_ldm_clip_checkpoint(ckpt)
            used = n_text
        got = bare(got)
        bad += same(f"{model} text encoder", got, want)
        if used != len(got):
            bad.append(f"{model} text encoder: {n_text} keys in the file, {len(got)} converted")

        # diffusers' own loading path (config from the snapshot, nothing fetched)
        u2 = UNet2DConditionModel.from_single_file(path, config=snap, subfolder="unet",
                                                   local_files_only=True)
        bad += same(f"{model} unet from_single_file", u2.float().state_dict(), unet.state_dict())
        v2 = AutoencoderKL.from_single_file(path, config=snap, subfolder="vae",
                                            local_files_only=True)
        bad += same(f"{model} vae from_single_file", v2.float().state_dict(), vae.state_dict())

        if not bad:
            lines = []
            with safe_open(path, "np") as f:
                raw = open(path, "rb").read()
                n = int.from_bytes(raw[:8], "little")
                header = json.loads(raw[8:8 + n])
                for k in sorted(k for k in header if k != "__metadata__"):
                    e = header[k]
                    b0, b1 = e["data_offsets"]
                    data = raw[8 + n + b0:8 + n + b1]
                    shape = "x".join(str(s) for s in e["shape"]) or "scalar"
                    lines.append(f"{k}\t{e['dtype']}\t{shape}\t{fnv1a64(data):016x}\n")
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f"{model}.tsv"), "w") as g:
                g.write(f"# sdtool single-file of tests/data/models/{model}, checked with diffusers "
                        f"{diffusers.__version__} (convert_ldm_*, from_single_file), transformers "
                        f"{transformers.__version__}, torch {torch.__version__}; "
                        "name, dtype, shape, FNV-1a 64 of the bytes\n")
                g.writelines(lines)
            print(f"{model}: {len(lines)} tensors, every one as diffusers loads the snapshot")
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sdtool", default=os.path.join(TOP, "build", "cpu", "sdtool"))
    a = ap.parse_args()
    out_dir = os.environ.get("SD_GOLDEN_OUT") or os.path.join(TOP, "tests", "data", "single_file")
    bad = []
    for m in MODELS:
        bad += check(m, a.sdtool, out_dir)
    for b in bad[:50]:
        print("FAIL", b)
    if bad:
        print(f"{len(bad)} problems", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
