#!/usr/bin/env python3
"""Throughput of sdtrain's CLIP tokenizer (bench/tokenizer) against the reference, on one core.

Writes N LAION-like captions (the generator of make_tokenizer_goldens.py, fixed seed) to a
temporary file, runs `bench/tokenizer FILE` on it, then times transformers' slow
CLIPTokenizer (4.47.0, no ftfy, SD2 tokenizer files rebuilt from the committed
bpe_simple_vocab_16e6.txt.gz) the way the seed pipeline calls it, one caption at a time:
    tokenizer(text, padding="max_length", max_length=77, truncation=True)
The Python number is taken on a second pass, when its per-word BPE cache is warm (its best
case; sdtrain keeps no cache). Both sides are pinned to CPU 0 when taskset is available.

    tests/reference/.venv/bin/python tests/reference/bench_tokenizer.py --bench PATH/bench/tokenizer
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_goldens as goldens  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="path of the built bench/tokenizer program")
    ap.add_argument("--captions", type=int, default=20000)
    ap.add_argument("--min-time", type=float, default=3.0)
    args = ap.parse_args()
    goldens.check_environment()
    import random
    rng = random.Random(7)
    caps = [goldens.laion_caption(rng).replace("\n", " ") for _ in range(args.captions)]
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "captions.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(caps) + "\n")
        with open(os.path.join(goldens.DATA, goldens.BPE_NAME), "rb") as f:
            files = goldens.build_sd2_files(f.read())
        tdir = os.path.join(d, "tokenizer")
        os.makedirs(tdir)
        for name, data in files.items():
            with open(os.path.join(tdir, name), "wb") as f:
                f.write(data)
        out = subprocess.run(pin + [args.bench, "--vocab", tdir, "--min-time", str(args.min_time), path],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        c = dict(line.split("\t", 1) for line in out.strip().split("\n"))
        c_rate = float(c["captions_per_s"])
        if pin:
            os.sched_setaffinity(0, {0})
        tok = goldens.reference_tokenizer(tdir)
        for s in caps:  # first pass fills the BPE cache
            tok(s, padding="max_length", max_length=77, truncation=True)
        t0 = time.perf_counter()
        for s in caps:
            tok(s, padding="max_length", max_length=77, truncation=True)
        py_rate = len(caps) / (time.perf_counter() - t0)
    print(f"captions\t{len(caps)}\nmean_bytes\t{sum(len(s.encode()) for s in caps) / len(caps):.1f}")
    print(f"sdtrain_captions_per_s\t{c_rate:.0f}\t(load {float(c['load_s']):.3f} s)")
    print(f"transformers_captions_per_s\t{py_rate:.0f}\t(warm cache)")
    print(f"ratio\t{c_rate / py_rate:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
