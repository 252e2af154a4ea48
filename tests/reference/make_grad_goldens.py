"""Writes the U-Net training-gradient goldens that `sdtool grad` is tested against.

For each case below this script loads a tiny diffusers snapshot (the ones make_model_goldens.py
writes, plus tests/data/models/odd-train/, which this script creates), draws a random batch,
runs one step of the epsilon / v-prediction training objective through PyTorch autograd and
stores the loss, the intermediate tensors and the gradient of every U-Net parameter.

Contract (what `sdtool grad --snapshot DIR --batch BATCH --out OUT` implements):
  tests/data/grad/<case>/batch.safetensors
      latents                float32 [B, C, h, w]  already-scaled x0 (NCHW)
      noise                  float32 [B, C, h, w]
      timesteps              int64   [B]           integers in [0, 1000)
      encoder_hidden_states  float32 [B, L, cross_attention_dim]
      __metadata__           {"prediction_type": "epsilon" | "v_prediction"}
  schedule: DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
      beta_schedule="scaled_linear", prediction_type=<batch's>), or, when the snapshot has
      scheduler/scheduler_config.json, DDPMScheduler.from_pretrained of it with prediction_type
      replaced by the batch's (none of the committed snapshots has one).
  noisy  = scheduler.add_noise(latents, noise, timesteps)
  pred   = unet(noisy, timesteps, encoder_hidden_states).sample
  target = noise (epsilon) or scheduler.get_velocity(latents, noise, timesteps) (v_prediction)
  loss   = F.mse_loss(pred, target, reduction="mean"); loss.backward()
  tests/data/grad/<case>/expected.safetensors
      loss                   float32 [] (0-d)
      pred, noisy_latents, target   float32 [B, C, h, w]
      <every U-Net state_dict key>  float32, the parameter's gradient, PyTorch layout
                                    (conv weights [O, I, kh, kw], linear weights [out, in])
      __metadata__           prediction_type, snapshot, library versions, CPU capability

The snapshot weights are loaded as float32 (tiny-sd2 stores F16, tiny-sd1 BF16; the upcast is
exact) and everything runs in float32 on the CPU with one thread and deterministic algorithms.
The main part runs under ATEN_CPU_CAPABILITY=avx2 (the script re-executes itself), which gives
the FMA-contracted torch.linspace behind the beta schedule (sd_linspace_kind
SD_LINSPACE_FUSED, see make_diffusion_goldens.py) whatever this CPU would pick.

Run (same virtual environment and pins as make_model_goldens.py, requirements-models.txt):
    python3 -m venv tests/reference/.venv-models
    tests/reference/.venv-models/bin/pip install -r tests/reference/requirements-models.txt
    tests/reference/.venv-models/bin/python tests/reference/make_grad_goldens.py
SD_GOLDEN_OUT=DIR writes the cases to DIR/grad/ and the odd-train snapshot to DIR/models/
instead of tests/data/. verify_grad.py uses the functions below for its own random batches.
Tensor data is reproducible bit for bit; only the order of the __metadata__ entries may change.
It is not stable against everything, though: recomputing a case from batch.safetensors as
load_file returns it (tensors not 64-byte aligned) moves single gradients by up to ~1e-5
relative, as PyTorch picks other kernel paths; compare with relative tolerances, not bits.
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import json
import os
import sys

if __name__ == "__main__" and os.environ.get("ATEN_CPU_CAPABILITY") is None:
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, ATEN_CPU_CAPABILITY="avx2"))

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import diffusers
from diffusers import DDPMScheduler, UNet2DConditionModel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_model_goldens as mmg  # noqa: E402  (randomize, rewrite_weights; sets determinism)

DATA = os.environ.get("SD_GOLDEN_OUT") or os.path.normpath(os.path.join(HERE, "..", "data"))

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

# A U-Net for training tests with in_channels == out_channels (the `odd` snapshot has 5 in / 3
# out, so MSE against the noise is undefined there) and awkward sizes: channel counts that are
# not multiples of 8 (15 is odd) with 5 groups of 2/3/4 channels, a different head count per
# level (diffusers' attention_head_dim is the number of heads: head sizes 10, 5 and 4), two
# transformer layers in the second down level, the mid block and the matching up level,
# 1x1-conv proj_in/proj_out (use_linear_projection false), a DownBlock2D last level, and a
# cross-attention width of 13.
ODD_TRAIN_UNET = dict(
    sample_size=8, in_channels=4, out_channels=4, block_out_channels=(10, 15, 20), layers_per_block=1,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    attention_head_dim=(1, 3, 5), transformer_layers_per_block=(1, 2, 2), cross_attention_dim=13,
    norm_num_groups=5, use_linear_projection=False)

# The tiny-sd2 U-Net configuration (make_model_goldens.py), for verify_grad.py --random-config.
RANDOM_CONFIGS = {"tiny-sd2-like": dict(mmg.CONFIGS["tiny-sd2"]["unet"], in_channels=4, out_channels=4),
                  "odd": ODD_TRAIN_UNET}

# B, h, w, L, prediction type and timesteps per case. odd-train's 6x10 latent is not a multiple
# of 2^(levels-1) = 4 on either side: the down path gives 6x10 -> 3x5 -> 2x3, so diffusers
# passes the skip's size to the upsamplers (2x3 -> 3x5 -> 6x10) instead of doubling.
CASES = {
    "tiny-sd2": dict(snapshot="tiny-sd2", batch=2, height=8, width=8, ctx_len=7,
                     prediction_type="epsilon", timesteps=[17, 640]),
    "tiny-sd1": dict(snapshot="tiny-sd1", batch=3, height=8, width=8, ctx_len=5,
                     prediction_type="v_prediction", timesteps=[0, 321, 999]),
    "odd-train": dict(snapshot="odd-train", batch=2, height=6, width=10, ctx_len=5,
                      prediction_type="epsilon", timesteps=[1, 998]),
}


def case_seed(name):
    return 7000 + sum(map(ord, name))


def write_unet_snapshot(root, unet_config, seed):
    """A random U-Net saved as a diffusers snapshot holding only unet/ (fp32 weights), with
    the same initialization as make_model_goldens.py."""
    torch.manual_seed(seed)
    unet = mmg.randomize(UNet2DConditionModel(**unet_config), seed + 1).eval()
    unet.save_pretrained(os.path.join(root, "unet"), safe_serialization=True)
    mmg.rewrite_weights(os.path.join(root, "unet", "diffusion_pytorch_model.safetensors"), "F32",
                        lambda k: k)
    with open(os.path.join(root, "model_index.json"), "w") as f:
        json.dump({"_class_name": "StableDiffusionPipeline", "_diffusers_version": diffusers.__version__,
                   "unet": ["diffusers", "UNet2DConditionModel"]}, f, indent=1, sort_keys=True)
    os.chmod(os.path.join(root, "unet", "diffusion_pytorch_model.safetensors"), 0o644)


def load_unet(snapshot):
    unet = UNet2DConditionModel.from_pretrained(os.path.join(snapshot, "unet"), torch_dtype=torch.float32)
    # the plain attention (bmm, softmax, bmm) that make_model_goldens.py also uses
    unet.set_attn_processor(diffusers.models.attention_processor.AttnProcessor())
    unet.train()  # dropout is 0 in these configurations, so train() and eval() agree
    for p in unet.parameters():
        if p.dtype != torch.float32:
            raise SystemExit("%s: parameters are %s, not float32" % (snapshot, p.dtype))
    return unet


def make_scheduler(snapshot, prediction_type):
    cfg = os.path.join(snapshot, "scheduler", "scheduler_config.json")
    if os.path.exists(cfg):
        return DDPMScheduler.from_pretrained(os.path.join(snapshot, "scheduler"),
                                             prediction_type=prediction_type)
    return DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                         beta_schedule="scaled_linear", prediction_type=prediction_type)


def make_batch(unet, batch, height, width, ctx_len, seed, timesteps=None):
    g = torch.Generator().manual_seed(seed)
    c = unet.config.in_channels
    latents = torch.randn(batch, c, height, width, generator=g)
    noise = torch.randn(batch, c, height, width, generator=g)
    if timesteps is None:
        t = torch.randint(0, 1000, (batch,), generator=g, dtype=torch.int64)
    else:
        if len(timesteps) != batch:
            raise SystemExit("need %d timesteps, got %d" % (batch, len(timesteps)))
        t = torch.tensor(timesteps, dtype=torch.int64)
    ctx = torch.randn(batch, ctx_len, unet.config.cross_attention_dim, generator=g)
    return {"latents": latents, "noise": noise, "timesteps": t, "encoder_hidden_states": ctx}


def reference(unet, scheduler, b):
    """One training step's forward and backward; returns the expected.safetensors tensors and
    the names of the parameters autograd left without a gradient."""
    unet.zero_grad(set_to_none=True)
    latents, noise, t = b["latents"], b["noise"], b["timesteps"]
    noisy = scheduler.add_noise(latents, noise, t)
    pred = unet(noisy, t, encoder_hidden_states=b["encoder_hidden_states"]).sample
    if scheduler.config.prediction_type == "epsilon":
        target = noise
    elif scheduler.config.prediction_type == "v_prediction":
        target = scheduler.get_velocity(latents, noise, t)
    else:
        raise SystemExit("unknown prediction type %s" % scheduler.config.prediction_type)
    loss = F.mse_loss(pred.float(), target.float(), reduction="mean")
    loss.backward()
    out = {"loss": loss.detach().clone(), "pred": pred.detach(), "noisy_latents": noisy.detach(),
           "target": target.detach()}
    no_grad = []
    for name, p in unet.named_parameters():
        # p.grad stays None when a parameter takes no part in the graph of the loss (a module
        # the configuration builds but the forward never calls, or a path cut by no_grad). With
        # these U-Nets and this objective every parameter is used, so this is not expected; a
        # zero tensor keeps the file complete, and the caller reports the names.
        if p.grad is None:
            no_grad.append(name)
            out[name] = torch.zeros_like(p)
        else:
            out[name] = p.grad.detach()
    keys = set(unet.state_dict().keys())
    if keys != set(n for n, _ in unet.named_parameters()):
        raise SystemExit("state_dict keys differ from parameter names: %s" %
                         sorted(keys ^ set(n for n, _ in unet.named_parameters())))
    return out, no_grad


def contig(d):
    return {k: v.detach().contiguous().clone() for k, v in d.items()}


def write_pair(outdir, b, expected, prediction_type, snapshot_name):
    os.makedirs(outdir, exist_ok=True)
    bp = os.path.join(outdir, "batch.safetensors")
    ep = os.path.join(outdir, "expected.safetensors")
    save_file(contig(b), bp, metadata={"prediction_type": prediction_type})
    meta = {"prediction_type": prediction_type, "snapshot": snapshot_name, "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    save_file(contig(expected), ep, metadata=meta)
    os.chmod(bp, 0o644)
    os.chmod(ep, 0o644)
    with safe_open(ep, "pt") as f:  # the 0-d loss survives the round trip
        shape = list(f.get_slice("loss").get_shape())
    return bp, ep, shape


def main():
    models = os.path.join(DATA, "models")
    write_unet_snapshot(os.path.join(models, "odd-train"), ODD_TRAIN_UNET, case_seed("odd-train-model"))
    total = 0
    for name, c in CASES.items():
        seed = case_seed(name)
        torch.manual_seed(seed)
        snap = os.path.join(models, c["snapshot"])
        unet = load_unet(snap)
        sched = make_scheduler(snap, c["prediction_type"])
        b = make_batch(unet, c["batch"], c["height"], c["width"], c["ctx_len"], seed, c["timesteps"])
        expected, no_grad = reference(unet, sched, b)
        bp, ep, loss_shape = write_pair(os.path.join(DATA, "grad", name), b, expected,
                                        c["prediction_type"], c["snapshot"])
        nparam = len(expected) - 4
        size = os.path.getsize(bp) + os.path.getsize(ep)
        total += size
        print("%-9s loss %.9g (shape %s)  %d gradient tensors (%d without a gradient%s)  "
              "batch %d B, expected %d B" %
              (name, expected["loss"].item(), loss_shape, nparam, len(no_grad),
               (": " + ", ".join(no_grad)) if no_grad else "", os.path.getsize(bp), os.path.getsize(ep)))
    print("total %d B under %s" % (total, os.path.join(DATA, "grad")))


if __name__ == "__main__":
    main()
