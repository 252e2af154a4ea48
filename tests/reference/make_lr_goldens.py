"""Writes the goldens of the learning-rate schedules added after make_optim_goldens.py
(cosine_with_restarts, polynomial) that tests/unit/test_optim.c checks (test_lr_more).

Reference: diffusers 0.42.1's get_scheduler (torch 2.15.0's LambdaLR) on the CPU
(requirements-models.txt).

Output: tests/data/optim/lr_more.safetensors: lr.<case> (F64 [T + 6]): the optimizer's learning
rate after k = 0 .. T + 5 scheduler steps (the rate update k + 1 uses), for the cases below;
each case's parameters in the metadata as <case>.{schedule,lr,warmup,steps,cycles,power}.

Run:
    tests/reference/.venv-models/bin/python tests/reference/make_lr_goldens.py
Never regenerate goldens to make a failing test pass without saying why in the commit.
"""
import os

import numpy as np
import torch
from diffusers.optimization import get_scheduler

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.environ.get("SD_GOLDEN_OUT") or os.path.normpath(os.path.join(HERE, "..", "data", "optim"))

CASES = [
    dict(name="restarts3", schedule="cosine_with_restarts", lr=1e-3, warmup=3, steps=20, cycles=3, power=1.0),
    dict(name="restarts1", schedule="cosine_with_restarts", lr=2e-4, warmup=0, steps=7, cycles=1, power=1.0),
    dict(name="poly2", schedule="polynomial", lr=5e-4, warmup=2, steps=15, cycles=1, power=2.0),
    dict(name="poly05", schedule="polynomial", lr=1e-3, warmup=0, steps=10, cycles=1, power=0.5),
]


def main():
    from safetensors.numpy import save_file
    out, meta = {}, {"generator": "tests/reference/make_lr_goldens.py",
                     "diffusers": __import__("diffusers").__version__, "torch": torch.__version__}
    for c in CASES:
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=c["lr"])
        sch = get_scheduler(c["schedule"], opt, num_warmup_steps=c["warmup"],
                            num_training_steps=c["steps"], num_cycles=c["cycles"], power=c["power"])
        lrs = []
        for k in range(c["steps"] + 6):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        out["lr." + c["name"]] = np.array(lrs, dtype=np.float64)
        for key in ("schedule", "lr", "warmup", "steps", "cycles", "power"):
            meta[f"{c['name']}.{key}"] = repr(c[key]) if key != "schedule" else c[key]
    path = os.path.join(OUT, "lr_more.safetensors")
    save_file(out, path, metadata=meta)
    print("wrote", path, len(out), "tensors")


if __name__ == "__main__":
    main()
