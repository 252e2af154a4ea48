"""Writes the model goldens that the C tests compare against.

For each tiny configuration below this script builds a random diffusers / transformers model
with a fixed seed, saves it as a diffusers snapshot under tests/data/models/<name>/ (the same
layout as a real snapshot: model_index.json, unet/, vae/, text_encoder/ with config.json and
safetensors weights), and writes the inputs, outputs and a few intermediate activations of
each module to tests/data/models/<name>/golden/<module>.safetensors, in the diffusers layout
(NCHW) and under the names diffusers uses.

Run (CPU, fp32, deterministic):
    python3 -m venv tests/reference/.venv-models
    tests/reference/.venv-models/bin/pip install -r tests/reference/requirements-models.txt
    tests/reference/.venv-models/bin/python tests/reference/make_model_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
Tensor data is reproducible bit for bit; only the order of the __metadata__ entries in the
safetensors headers may change between runs.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

import diffusers
import transformers
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.normpath(os.path.join(HERE, "..", "data", "models"))

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

# Tiny configurations: SD2-like (linear projections, per-level head counts, GELU text
# encoder), SD1-like (1x1-conv projections, one head count for all levels, quick_gelu), and an
# odd one (three levels, channel counts that are not powers of two, 2 transformer layers).
CONFIGS = {
    "tiny-sd2": dict(
        unet=dict(block_out_channels=(16, 32), layers_per_block=2, sample_size=8,
                  down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                  attention_head_dim=(2, 4), cross_attention_dim=32, norm_num_groups=8,
                  use_linear_projection=True, flip_sin_to_cos=True, freq_shift=0),
        vae=dict(block_out_channels=(16, 32), layers_per_block=2, latent_channels=4,
                 norm_num_groups=8, sample_size=32,
                 down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2),
        text=dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=3,
                  max_position_embeddings=77, vocab_size=1000, hidden_act="gelu", layer_norm_eps=1e-5),
        batch=2, latent=8, image=16, dtype="F16", text_prefix=True, vae_legacy=True),
    "tiny-sd1": dict(
        unet=dict(block_out_channels=(16, 32), layers_per_block=1, sample_size=8,
                  down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                  attention_head_dim=4, cross_attention_dim=24, norm_num_groups=8,
                  use_linear_projection=False),
        vae=dict(block_out_channels=(16, 32, 32), layers_per_block=1, latent_channels=4,
                 norm_num_groups=8, sample_size=32,
                 down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3),
        text=dict(hidden_size=24, intermediate_size=48, num_attention_heads=3, num_hidden_layers=2,
                  max_position_embeddings=77, vocab_size=500, hidden_act="quick_gelu", layer_norm_eps=1e-5),
        batch=1, latent=8, image=24, dtype="BF16", text_prefix=True, vae_legacy=False),
    "odd": dict(
        unet=dict(block_out_channels=(8, 16, 24), layers_per_block=1, sample_size=12,
                  down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
                  attention_head_dim=(2, 3, 3), transformer_layers_per_block=(1, 2, 2),
                  cross_attention_dim=20, norm_num_groups=4, use_linear_projection=True, in_channels=5,
                  out_channels=3),
        vae=dict(block_out_channels=(8, 12), layers_per_block=1, latent_channels=3, norm_num_groups=4,
                 sample_size=32, in_channels=3, out_channels=3,
                 down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2),
        text=dict(hidden_size=20, intermediate_size=44, num_attention_heads=5, num_hidden_layers=2,
                  max_position_embeddings=77, vocab_size=300, hidden_act="gelu", layer_norm_eps=1e-5),
        batch=3, latent=16, image=20, dtype="F32", text_prefix=False, vae_legacy=False),
}


def randomize(model, seed):
    """diffusers initializes norms to 1/0 and some layers to zero; random values everywhere
    make every parameter matter in the comparison."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            fan = p.shape[1] if p.dim() > 1 else 1
            if p.dim() > 2:
                fan = p.shape[1] * p.shape[2] * p.shape[3]
            scale = 1.0 / np.sqrt(fan)
            if p.dim() == 1 and ("norm" in name and name.endswith("weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))
    return model


TORCH_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


def round_to_storage(model, dtype):
    """Rounds the fp32 weights to what the file will store, so the goldens are computed from
    exactly the stored values (the models still run in fp32)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(TORCH_DTYPES[dtype]).float())


LEGACY_VAE = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out.0": "proj_attn"}


def rewrite_weights(path, dtype, rename):
    """Stores the weights in `dtype` and renames keys, as real snapshots do: SD2's VAE file
    keeps the legacy attention names, hub text encoders carry the text_model. prefix."""
    from safetensors.torch import load_file
    tensors = load_file(path)
    out = {}
    for k, v in tensors.items():
        out[rename(k)] = v.to(TORCH_DTYPES[dtype]) if v.dtype.is_floating_point else v
    save_file(out, path, metadata={"format": "pt"})


def vae_rename(legacy):
    def f(k):
        if legacy and ".attentions.0." in k:
            for new, old in LEGACY_VAE.items():
                k = k.replace(".attentions.0." + new + ".", ".attentions.0." + old + ".")
        return k
    return f


def text_rename(prefix):
    return lambda k: ("text_model." + k if prefix and not k.startswith("text_model.") else k)


def record(model, names):
    """Forward hooks that keep the outputs of the named submodules."""
    acts = {}
    mods = dict(model.named_modules())
    for n in names:
        def hook(_m, _i, out, n=n):
            acts["act." + n] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        mods[n].register_forward_hook(hook)
    return acts


def contig(d):
    return {k: v.detach().float().contiguous().clone() if v.dtype.is_floating_point else v.detach().contiguous().clone()
            for k, v in d.items()}


def main():
    versions = {"torch": torch.__version__, "diffusers": diffusers.__version__,
                "transformers": transformers.__version__}
    for name, cfg in CONFIGS.items():
        root = os.path.join(OUT, name)
        golden = os.path.join(root, "golden")
        os.makedirs(golden, exist_ok=True)
        seed = sum(map(ord, name))
        B, h, H = cfg["batch"], cfg["latent"], cfg["image"]

        torch.manual_seed(seed)
        dt = cfg["dtype"]
        unet = randomize(UNet2DConditionModel(**cfg["unet"]), seed + 1).eval()
        round_to_storage(unet, dt)
        unet.set_attn_processor(diffusers.models.attention_processor.AttnProcessor())
        unet.save_pretrained(os.path.join(root, "unet"), safe_serialization=True)
        rewrite_weights(os.path.join(root, "unet", "diffusion_pytorch_model.safetensors"), dt, lambda k: k)
        vae = randomize(AutoencoderKL(**cfg["vae"]), seed + 2).eval()
        round_to_storage(vae, dt)
        vae.set_attn_processor(diffusers.models.attention_processor.AttnProcessor())
        vae.save_pretrained(os.path.join(root, "vae"), safe_serialization=True)
        rewrite_weights(os.path.join(root, "vae", "diffusion_pytorch_model.safetensors"), dt,
                        vae_rename(cfg["vae_legacy"]))
        text = randomize(CLIPTextModel(CLIPTextConfig(**cfg["text"])), seed + 3).eval()
        round_to_storage(text, dt)
        text.save_pretrained(os.path.join(root, "text_encoder"), safe_serialization=True)
        rewrite_weights(os.path.join(root, "text_encoder", "model.safetensors"), dt,
                        text_rename(cfg["text_prefix"]))
        with open(os.path.join(root, "model_index.json"), "w") as f:
            json.dump({"_class_name": "StableDiffusionPipeline", "_diffusers_version": diffusers.__version__,
                       "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
                       "text_encoder": ["transformers", "CLIPTextModel"]}, f, indent=1, sort_keys=True)

        g = torch.Generator().manual_seed(seed + 10)
        uc = cfg["unet"]
        sample = torch.randn(B, uc.get("in_channels", 4), h, h + 2 * (name == "odd"), generator=g)
        timestep = torch.tensor([999, 1, 500][:B], dtype=torch.int64)
        ctx = torch.randn(B, 77, uc["cross_attention_dim"], generator=g)
        acts = record(unet, ["time_embedding", "conv_in", "down_blocks.0", "mid_block", "up_blocks.0"])
        with torch.no_grad():
            out = unet(sample, timestep, encoder_hidden_states=ctx).sample
        save_file(contig({"sample": sample, "timestep": timestep, "encoder_hidden_states": ctx,
                          "out.sample": out, **acts}),
                  os.path.join(golden, "unet.safetensors"), metadata=versions)

        vc = cfg["vae"]
        images = torch.rand(B, vc.get("in_channels", 3), H, H + 4, generator=g) * 2 - 1
        acts = record(vae, ["encoder.conv_in", "encoder.down_blocks.0", "encoder.mid_block"])
        with torch.no_grad():
            dist = vae.encode(images).latent_dist
        save_file(contig({"images": images, "out.latent_dist.parameters": dist.parameters,
                          "out.latent_dist.mean": dist.mean, "out.latent_dist.logvar": dist.logvar, **acts}),
                  os.path.join(golden, "vae-encode.safetensors"), metadata=versions)
        lat = torch.randn(B, vc["latent_channels"], H // 2 ** (len(vc["block_out_channels"]) - 1),
                          H // 2 ** (len(vc["block_out_channels"]) - 1), generator=g)
        acts = record(vae, ["decoder.conv_in", "decoder.mid_block", "decoder.up_blocks.0"])
        with torch.no_grad():
            dec = vae.decode(lat).sample
        save_file(contig({"latents": lat, "out.sample": dec, **acts}),
                  os.path.join(golden, "vae-decode.safetensors"), metadata=versions)

        tc = cfg["text"]
        ids = torch.randint(0, tc["vocab_size"], (B, 77), generator=g, dtype=torch.int64)
        ids[:, 0] = tc["vocab_size"] - 2  # a bos-like first token, an eos-like one, padding
        ids[:, 10] = tc["vocab_size"] - 1
        ids[:, 11:] = 0
        acts = record(text, [n for n, _ in text.named_modules()
                             if n in ("embeddings", "encoder.layers.0", "text_model.embeddings",
                                      "text_model.encoder.layers.0")])
        with torch.no_grad():
            res = text(input_ids=ids)
        save_file(contig({"input_ids": ids.to(torch.int32), "out.last_hidden_state": res.last_hidden_state,
                          "out.pooler_output": res.pooler_output, **acts}),
                  os.path.join(golden, "text-encoder.safetensors"), metadata=versions)
        print(name, "written", file=sys.stderr)
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
