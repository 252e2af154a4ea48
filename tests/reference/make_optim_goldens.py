"""Writes the optimizer goldens that tests/unit/test_optim.c compares against.

tests/data/optim/adamw_<name>.safetensors: a few small parameter tensors trained for STEPS steps
with random (seeded) gradients by the reference loop of the diffusers training example:

    total_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)   # gradients scaled in place
    optimizer.step()              # torch.optim.AdamW(..., foreach=False): the for-loop path
    lr_scheduler.step()           # diffusers.optimization.get_scheduler (a LambdaLR)
    ema.step(params)              # diffusers.training_utils.EMAModel (update_after_step = S)

Tensors (F32 unless said): p0.<t> initial parameters; per step s = 1..STEPS: g.<s>.<t> the
gradient BEFORE clipping, p.<s>.<t> / m.<s>.<t> / v.<s>.<t> parameters and AdamW moments after
the step, e.<s>.<t> the EMA weights after the step, lr.<s> (F64 [1]) the learning rate the step
used, norm.<s> (F32 [1]) the total norm clip_grad_norm_ returned. Hyper-parameters are in
__metadata__.

tests/data/optim/schedules.safetensors: sched.<constant|linear|cosine> (F64 [K]) the LambdaLR
factor after k = 0..K-1 steps (warmup / total steps in __metadata__), from diffusers.

Run (CPU, fp32, deterministic):
    tests/reference/.venv-models/bin/python tests/reference/make_optim_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os

import torch
from safetensors.torch import save_file

from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.normpath(os.path.join(HERE, "..", "data", "optim"))

torch.use_deterministic_algorithms(True)
torch.set_num_threads(1)

SHAPES = [(3, 4), (13,), (2, 3, 3)]  # 12 + 13 + 18 elements
STEPS = 5
DIFFUSERS_SCHED = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}

CONFIGS = [
    dict(name="linear", schedule="linear", lr=0.05, warmup=2, max_steps=STEPS, wd=0.01,
         beta1=0.9, beta2=0.999, eps=1e-8, max_norm=1.0, ema_decay=0.9999, ema_start=0, seed=1),
    dict(name="cosine", schedule="cosine", lr=0.02, warmup=1, max_steps=8, wd=0.1,
         beta1=0.8, beta2=0.95, eps=1e-6, max_norm=0.5, ema_decay=0.95, ema_start=2, seed=2),
    dict(name="constant", schedule="constant", lr=0.01, warmup=0, max_steps=STEPS, wd=0.0,
         beta1=0.9, beta2=0.999, eps=1e-8, max_norm=0.0, ema_decay=0.0, ema_start=0, seed=3),
]
# Gradient scale per step: the norms fall on both sides of max_norm, so clipping is exercised.
GRAD_SCALE = [0.5, 0.05, 0.3, 0.02, 0.4]


def run(cfg):
    gen = torch.Generator().manual_seed(cfg["seed"])
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    out = {}
    for t, p in enumerate(params):
        out[f"p0.{t}"] = p.detach().clone()
    opt = torch.optim.AdamW(params, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                            eps=cfg["eps"], weight_decay=cfg["wd"], foreach=False)
    sched = get_scheduler(DIFFUSERS_SCHED[cfg["schedule"]], optimizer=opt,
                          num_warmup_steps=cfg["warmup"], num_training_steps=cfg["max_steps"])
    ema = None
    if cfg["ema_decay"] > 0:
        ema = EMAModel(params, decay=cfg["ema_decay"], update_after_step=cfg["ema_start"])
    for s in range(1, STEPS + 1):
        for t, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=gen) * GRAD_SCALE[s - 1]
            out[f"g.{s}.{t}"] = p.grad.detach().clone()
        if cfg["max_norm"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, cfg["max_norm"])
            out[f"norm.{s}"] = norm.detach().reshape(1).clone()
        out[f"lr.{s}"] = torch.tensor([opt.param_groups[0]["lr"]], dtype=torch.float64)
        opt.step()
        sched.step()
        if ema is not None:
            ema.step(params)
        for t, p in enumerate(params):
            st = opt.state[p]
            out[f"p.{s}.{t}"] = p.detach().clone()
            out[f"m.{s}.{t}"] = st["exp_avg"].clone()
            out[f"v.{s}.{t}"] = st["exp_avg_sq"].clone()
            if ema is not None:
                out[f"e.{s}.{t}"] = ema.shadow_params[t].detach().clone()
    meta = {k: str(v) for k, v in cfg.items()}
    meta.update(steps=str(STEPS), ntensors=str(len(SHAPES)), optimizer="torch.optim.AdamW foreach=False",
                torch=torch.__version__)
    save_file({k: v.contiguous() for k, v in out.items()},
              os.path.join(OUT, f"adamw_{cfg['name']}.safetensors"), metadata=meta)


def schedules():
    warmup, total, K = 3, 10, 13
    out = {}
    for name, dname in DIFFUSERS_SCHED.items():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = get_scheduler(dname, optimizer=opt, num_warmup_steps=warmup, num_training_steps=total)
        vals = []
        for _ in range(K):
            vals.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out[f"sched.{name}"] = torch.tensor(vals, dtype=torch.float64)
    save_file(out, os.path.join(OUT, "schedules.safetensors"),
              metadata=dict(warmup=str(warmup), max_steps=str(total), count=str(K)))


def main():
    os.makedirs(OUT, exist_ok=True)
    for cfg in CONFIGS:
        run(cfg)
    schedules()


if __name__ == "__main__":
    main()
