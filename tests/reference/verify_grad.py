"""Checks `sdtool grad` against PyTorch autograd on a fresh random batch (not part of `make check`).

Takes a diffusers snapshot (--snapshot DIR, with unet/) or builds a random U-Net and saves it
as a snapshot in a temporary folder (--random-config tiny-sd2-like|odd, --seed S; `odd` is the
odd-train configuration of make_grad_goldens.py), draws a random batch with the contract of
make_grad_goldens.py (latents, noise, timesteps, encoder_hidden_states, prediction_type in the
metadata), computes the loss and every parameter gradient with PyTorch, then runs

    SDTOOL grad --snapshot DIR --batch BATCH.safetensors --out OUT.safetensors

and compares: the loss by relative error, each gradient by ||ours - ref|| / ||ref|| (the
absolute norm where ||ref|| = 0), missing and unexpected names, shapes. `pred`,
`noisy_latents` and `target` are compared too when the tool writes them. Exit status 0 when
the loss is within --loss-tol (1e-6) and every tensor within --grad-tol (1e-4), 1 otherwise.

    tests/reference/.venv-models/bin/python tests/reference/verify_grad.py --sdtool build/cpu/sdtool \\
        --random-config odd --seed 3 --batch 2 --height 6 --width 10 --ctx-len 5 \\
        [--prediction-type epsilon|v_prediction] [--timesteps 1,998] [--keep DIR]

--reference-only DIR writes DIR/batch.safetensors and DIR/expected.safetensors (the layout of
tests/data/grad/<case>/) and runs no tool. Same environment as make_grad_goldens.py.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

if __name__ == "__main__" and os.environ.get("ATEN_CPU_CAPABILITY") is None:
    os.execve(sys.executable, [sys.executable] + sys.argv,
              dict(os.environ, ATEN_CPU_CAPABILITY="avx2"))

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_grad_goldens as mgg  # noqa: E402

EXTRAS = ("pred", "noisy_latents", "target")


def rel_err(ours, ref):
    d = (ours.double() - ref.double()).norm().item()
    n = ref.double().norm().item()
    return d / n if n > 0 else d


def compare(out, ref, loss_tol, grad_tol, worst):
    ok = True
    if "loss" not in out:
        print("loss: MISSING")
        ok = False
    elif out["loss"].numel() != 1:
        print("loss: %d elements, expected 1" % out["loss"].numel())
        ok = False
    else:
        lo, lr = out["loss"].double().reshape(()).item(), ref["loss"].double().item()
        le = abs(lo - lr) / abs(lr) if lr != 0 else abs(lo - lr)
        ok &= le <= loss_tol
        print("loss: ours %.9g  ref %.9g  rel %.3g%s" % (lo, lr, le, "" if le <= loss_tol else "  FAIL"))

    names = [k for k in ref if k != "loss" and k not in EXTRAS]
    missing = [k for k in names if k not in out]
    unexpected = sorted(k for k in out if k not in ref)
    errs, shape_bad = [], []
    for k in names + [k for k in EXTRAS if k in out]:
        if k not in out:
            continue
        if tuple(out[k].shape) != tuple(ref[k].shape):
            shape_bad.append("%s %s (expected %s)" % (k, list(out[k].shape), list(ref[k].shape)))
            continue
        errs.append((rel_err(out[k], ref[k]), k))
    # NaN compares false both ways: sort it to the front and count it as a failure
    errs.sort(key=lambda e: (e[0] == e[0], -e[0] if e[0] == e[0] else 0.0))
    bad = [e for e in errs if not e[0] <= grad_tol]
    print("gradients: %d expected, %d compared, %d over %.0e, %d missing, %d unexpected, %d wrong shape"
          % (len(names), len(errs), len(bad), grad_tol, len(missing), len(unexpected), len(shape_bad)))
    for e, k in errs[:worst]:
        print("  %-70s rel %.3g%s" % (k, e, "" if e <= grad_tol else "  FAIL"))
    for title, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", shape_bad)):
        for k in items[:20]:
            print("  %s: %s" % (title, k))
        if len(items) > 20:
            print("  ... %d more %s" % (len(items) - 20, title))
    return ok and not bad and not missing and not unexpected and not shape_bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdtool", help="path of sdtool")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--snapshot", help="a diffusers snapshot folder with unet/")
    src.add_argument("--random-config", choices=sorted(mgg.RANDOM_CONFIGS),
                     help="build a random U-Net of this configuration in a temporary snapshot")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random U-Net and batch")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--height", type=int, default=8, help="latent height")
    ap.add_argument("--width", type=int, default=8, help="latent width")
    ap.add_argument("--ctx-len", type=int, default=7, help="encoder_hidden_states length L")
    ap.add_argument("--prediction-type", choices=("epsilon", "v_prediction"), default="epsilon")
    ap.add_argument("--timesteps", help="comma-separated, one per sample (default: random)")
    ap.add_argument("--loss-tol", type=float, default=1e-6)
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    ap.add_argument("--worst", type=int, default=8, help="how many of the worst tensors to print")
    ap.add_argument("--reference-only", metavar="DIR",
                    help="write DIR/batch.safetensors and DIR/expected.safetensors; run no tool")
    ap.add_argument("--keep", metavar="DIR", help="keep the snapshot, batch and outputs in DIR")
    args = ap.parse_args()
    if not args.sdtool and not args.reference_only:
        ap.error("give --sdtool PATH or --reference-only DIR")
    timesteps = [int(x) for x in args.timesteps.split(",")] if args.timesteps else None
    if timesteps and any(not 0 <= t < 1000 for t in timesteps):
        ap.error("timesteps must lie in [0, 1000)")

    work = args.keep or tempfile.mkdtemp(prefix="verify_grad.")
    os.makedirs(work, exist_ok=True)
    try:
        if args.snapshot:
            snap = args.snapshot
        else:
            snap = os.path.join(work, "snapshot")
            mgg.write_unet_snapshot(snap, mgg.RANDOM_CONFIGS[args.random_config], args.seed)
        torch.manual_seed(args.seed)
        unet = mgg.load_unet(snap)
        sched = mgg.make_scheduler(snap, args.prediction_type)
        b = mgg.make_batch(unet, args.batch, args.height, args.width, args.ctx_len, args.seed + 100,
                           timesteps)
        ref, no_grad = mgg.reference(unet, sched, b)
        print("reference: %s, batch %d, latent %dx%d, L %d, %s, timesteps %s, loss %.9g, "
              "%d gradient tensors%s" %
              (args.snapshot or "random " + args.random_config, args.batch, args.height, args.width,
               args.ctx_len, args.prediction_type, b["timesteps"].tolist(), ref["loss"].item(),
               len(ref) - 1 - len(EXTRAS),
               (", without a gradient (zeros): " + ", ".join(no_grad)) if no_grad else ""))
        outdir = args.reference_only or work
        bp, ep, _ = mgg.write_pair(outdir, b, ref, args.prediction_type, snap)
        if args.reference_only:
            print("wrote %s (%d B), %s (%d B)" % (bp, os.path.getsize(bp), ep, os.path.getsize(ep)))
            return 0
        out_path = os.path.join(work, "sdtool-grad.safetensors")
        cmd = [args.sdtool, "grad", "--snapshot", snap, "--batch", bp, "--out", out_path]
        print("running:", " ".join(cmd))
        sys.stdout.flush()
        r = subprocess.run(cmd)
        if r.returncode != 0:
            print("sdtool grad failed with exit status %d" % r.returncode)
            return 1
        ok = compare(load_file(out_path), ref, args.loss_tol, args.grad_tol, args.worst)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
