"""Times one U-Net training step (forward, MSE loss, backward, gradient clipping, AdamW) in
PyTorch + diffusers (CPU, fp32) and in bench/train_step on the same snapshot, shapes and thread
count, alternating the two, and prints the speed ratio and the peak memory of each.

Run from the repository root with the reference stack of tests/reference/requirements-models.txt:
    tests/reference/.venv-models/bin/python bench/train_vs_torch.py \
        --ours build/cpu/bench/train_step [--snapshot tests/data/models/tiny-sd2 | --config tiny]
        [--batch 8] [--size S] [--ctx-len 77] [--reps 10] [--warmup 2] [--threads 2]
        [--rounds 3] [--recompute] [--no-variant] [--wait-idle 0.9 --wait-max 120] [--json F]

Every measurement is a subprocess of its own, so the peak RSS (getrusage ru_maxrss of that
process) belongs to one side only: a PyTorch child (this script with --torch-child) and
bench/train_step. A round runs sdtrain with batch invariance on (the CPU default, which the
training loop uses), sdtrain with it off (one GEMM per layer over the whole batch; skipped with
--no-variant) and PyTorch; the order flips every round, so slow drift of a shared machine falls
on both sides. Each run times --reps steps after --warmup untimed ones and reports its median;
the table gives the median over rounds and the range (min-max) of those medians, the fastest
single step of all rounds ("best", the least disturbed by other jobs), and the ratio: the
median over rounds of PyTorch's time / ours in the same round (> 1: ours is faster).
On a shared machine, --wait-idle 0.9 waits (at most --wait-max seconds) before every run for a
second in which 90% of the CPUs were idle: with other jobs running, every OpenMP barrier of a
multi-threaded run can wait a scheduler time slice, which slows both sides by up to 100x at
these sizes. Each run's line on stderr shows the idle share before it and the load average.

The PyTorch step is the diffusers training script's: DDPMScheduler.add_noise (SD's
scaled_linear betas, epsilon target), UNet2DConditionModel in train() mode with the default
attention processor (SDPA), F.mse_loss, loss.backward(), clip_grad_norm_(1.0),
torch.optim.AdamW(lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight_decay 0.01; PyTorch's default
implementation on the CPU) .step(), zero_grad(set_to_none=False). Forward means add_noise +
forward + loss; the optimizer part is clipping + step + zeroing, as in bench/train_step.
--recompute turns on recomputation on both sides (enable_gradient_checkpointing() for
diffusers). With --config the weights are random on both sides (different draws; the time does
not depend on them).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

# The configurations of bench/train_step --config (diffusers' attention_head_dim = heads).
CONFIGS = {
    "tiny": dict(block_out_channels=(16, 32), layers_per_block=2, sample_size=8,
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                 attention_head_dim=(2, 4), cross_attention_dim=32, norm_num_groups=8,
                 use_linear_projection=True, flip_sin_to_cos=True, freq_shift=0),
    "sd2-small": dict(sample_size=32, in_channels=4, out_channels=4,
                      down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                      up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
                      block_out_channels=(64, 128, 256, 256), layers_per_block=2,
                      attention_head_dim=(1, 2, 4, 4), cross_attention_dim=1024,
                      use_linear_projection=True, norm_num_groups=32, flip_sin_to_cos=True,
                      freq_shift=0),
}


def cpu_idle_fraction(seconds=1.0):
    """Share of the machine's CPU time that was idle over the next `seconds` (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v[:8])  # idle + iowait, total without guest time
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(1, t1 - t0)


def wait_for_idle(want, limit):
    """Waits up to `limit` seconds for a one-second window with at least `want` of the CPUs
    idle (other jobs on a shared machine make OpenMP barriers wait for a time slice); returns
    the idle share of the last window."""
    end = time.monotonic() + limit
    idle = cpu_idle_fraction()
    while idle < want and time.monotonic() < end:
        idle = cpu_idle_fraction()
    return idle


def max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def median_of(xs):
    return statistics.median(xs)


def torch_child(a):
    """One PyTorch run: prints a RESULT line like bench/train_step's."""
    import torch
    import torch.nn.functional as F
    from diffusers import DDPMScheduler, UNet2DConditionModel

    torch.set_num_threads(a.threads)
    rss_import = max_rss_mib()
    torch.manual_seed(0)
    if a.config:
        model = UNet2DConditionModel(**CONFIGS[a.config])
    else:
        # low_cpu_mem_usage needs accelerate, which the reference stack does not install
        model = UNet2DConditionModel.from_pretrained(os.path.join(a.snapshot, "unet"),
                                                     torch_dtype=torch.float32,
                                                     low_cpu_mem_usage=False)
    model = model.float().train()
    if a.recompute:
        model.enable_gradient_checkpointing()
    cfg = model.config
    size = a.size or cfg.sample_size
    sched = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                          beta_schedule="scaled_linear", prediction_type="epsilon")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    g = torch.Generator().manual_seed(20261122)
    latents = torch.randn(a.batch, cfg.in_channels, size, size, generator=g)
    noise = torch.randn(a.batch, cfg.in_channels, size, size, generator=g)
    ctx = torch.randn(a.batch, a.ctx_len, cfg.cross_attention_dim, generator=g)
    t = torch.tensor([(999 - 37 * b) % 1000 for b in range(a.batch)], dtype=torch.int64)
    rss_loaded = max_rss_mib()
    step, fwd, bwd, opt_t, losses = [], [], [], [], []
    for r in range(a.warmup + a.reps):
        t0 = time.perf_counter()
        noisy = sched.add_noise(latents, noise, t)
        pred = model(noisy, t, encoder_hidden_states=ctx).sample
        loss = F.mse_loss(pred.float(), noise.float(), reduction="mean")
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        t3 = time.perf_counter()
        losses.append(loss.item())
        if r >= a.warmup:
            step.append(t3 - t0)
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
            opt_t.append(t3 - t2)
    n_params = sum(p.numel() for p in model.parameters())
    print("RESULT step_ms=%.3f min_ms=%.3f max_ms=%.3f fwd_ms=%.3f bwd_ms=%.3f opt_ms=%.3f "
          "params=%d peak_rss_mb=%.1f import_rss_mb=%.1f loaded_rss_mb=%.1f loss0=%.6f loss=%.6f "
          "size=%d torch=%s threads=%d" % (
              median_of(step) * 1e3, min(step) * 1e3, max(step) * 1e3, median_of(fwd) * 1e3,
              median_of(bwd) * 1e3, median_of(opt_t) * 1e3, n_params, max_rss_mib(), rss_import,
              rss_loaded, losses[0], losses[-1], size, torch.__version__,
              torch.get_num_threads()))


def parse_result(out, what):
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return {k: v for k, v in (kv.split("=", 1) for kv in line.split()[1:])}
    sys.exit("no RESULT line from %s:\n%s%s" % (what, out.stdout, out.stderr))


def run_child(cmd, threads, what):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed (exit %d):\n%s%s" % (what, out.returncode, out.stdout, out.stderr))
    return parse_result(out, what)


def common_args(a):
    args = ["--batch", str(a.batch), "--ctx-len", str(a.ctx_len), "--reps", str(a.reps),
            "--warmup", str(a.warmup), "--threads", str(a.threads)]
    args += ["--config", a.config] if a.config else ["--snapshot", a.snapshot]
    if a.size:
        args += ["--size", str(a.size)]
    if a.recompute:
        args.append("--recompute")
    return args


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default="build/cpu/bench/train_step", help="path of bench/train_step")
    ap.add_argument("--snapshot", default="tests/data/models/tiny-sd2")
    ap.add_argument("--config", choices=sorted(CONFIGS), help="random weights of a built-in shape")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=0, help="latent side (default: sample_size)")
    ap.add_argument("--ctx-len", type=int, default=77)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recompute", action="store_true")
    ap.add_argument("--no-variant", action="store_true",
                    help="skip the sdtrain run with batch invariance off")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="FRACTION",
                    help="before each run, wait for a second with this share of the CPUs idle")
    ap.add_argument("--wait-max", type=float, default=120.0, metavar="SECONDS",
                    help="longest wait for --wait-idle (then run anyway)")
    ap.add_argument("--json", help="also write every run's RESULT fields to this file")
    ap.add_argument("--torch-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        torch_child(a)
        return
    if a.reps < 1 or a.rounds < 1 or a.warmup < 0:
        sys.exit("--reps and --rounds must be >= 1, --warmup >= 0")

    sides = [("pytorch", [sys.executable, os.path.abspath(__file__), "--torch-child"]),
             ("sdtrain", [a.ours])]
    if not a.no_variant:
        sides.append(("sdtrain-no-inv", [a.ours, "--no-batch-invariance"]))
    runs = {name: [] for name, _ in sides}
    for r in range(a.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for name, cmd in order:
            idle = wait_for_idle(a.wait_idle, a.wait_max) if a.wait_idle > 0 else None
            res = run_child(cmd + common_args(a), a.threads, name)
            res["idle_before"] = idle
            runs[name].append(res)
            print("round %d %-15s step %9.2f ms  fwd %8.2f  bwd %8.2f  opt %7.2f  "
                  "peak RSS %7.1f MiB  (idle before: %s, load %s)"
                  % (r + 1, name, float(res["step_ms"]), float(res["fwd_ms"]),
                     float(res["bwd_ms"]), float(res["opt_ms"]), float(res["peak_rss_mb"]),
                     "-" if idle is None else "%.0f%%" % (100 * idle), load_average()),
                  file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": runs}, f, indent=1)

    tr, ours = runs["pytorch"][0], runs["sdtrain"][0]
    what = ("config %s (random weights)" % a.config) if a.config else a.snapshot
    print("%s: torch %s, batch %d, latent %s, ctx %d, %d threads, %d steps after %d warm-ups, "
          "%d rounds%s" % (what, tr["torch"], a.batch, tr["size"], a.ctx_len, a.threads, a.reps,
                           a.warmup, a.rounds, ", recompute" if a.recompute else ""))
    print("params: %s (torch) / %s (ours); %.3f GFLOP per step (our count); loss %s -> %s (torch), "
          "%s -> %s (ours)" % (tr["params"], ours["params"], float(ours["gflop"]), tr["loss0"],
                               tr["loss"], ours["loss0"], ours["loss"]))
    print("%-15s %10s %17s %8s %9s %9s %9s %9s %10s %16s" % (
        "", "step ms", "range", "best ms", "fwd ms", "bwd ms", "opt ms", "GFLOP/s", "peak MiB",
        "torch/this"))
    gflop = float(ours["gflop"])
    busy = 0
    for name, _ in sides:
        rs = runs[name]
        step = [float(x["step_ms"]) for x in rs]
        ratios = [float(t["step_ms"]) / float(x["step_ms"]) for t, x in zip(runs["pytorch"], rs)]
        peak = max(float(x["peak_rss_mb"]) for x in rs)
        busy += sum(1 for x in rs
                    if x["idle_before"] is not None and x["idle_before"] < a.wait_idle)
        print("%-15s %10.2f %17s %8.2f %9.2f %9.2f %9.2f %9.1f %10.1f %16s" % (
            name, median_of(step), "%.2f-%.2f" % (min(step), max(step)),
            min(float(x["min_ms"]) for x in rs),
            median_of([float(x["fwd_ms"]) for x in rs]),
            median_of([float(x["bwd_ms"]) for x in rs]),
            median_of([float(x["opt_ms"]) for x in rs]), gflop / median_of(step) * 1e3, peak,
            "-" if name == "pytorch" else "%.2fx (%.2f-%.2f)" % (median_of(ratios), min(ratios),
                                                                 max(ratios))))
    if busy:
        print("%d of %d runs started on a busy machine (less than %.0f%% idle after waiting "
              "%.0f s): see the per-run lines on stderr" % (busy, a.rounds * len(sides),
                                                            100 * a.wait_idle, a.wait_max))
    print("memory: pytorch peak RSS %.1f MiB, of which %.1f MiB after importing torch and "
          "diffusers and %.1f MiB more after loading the model and inputs; sdtrain peak RSS "
          "%.1f MiB (parameters + gradients + AdamW moments %.1f MiB, activation arena %.1f MiB)"
          % (max(float(x["peak_rss_mb"]) for x in runs["pytorch"]), float(tr["import_rss_mb"]),
             float(tr["loaded_rss_mb"]) - float(tr["import_rss_mb"]),
             max(float(x["peak_rss_mb"]) for x in runs["sdtrain"]), float(ours["params_mb"]),
             float(ours["arena_mb"])))


if __name__ == "__main__":
    main()
