#!/usr/bin/env python3
"""Decode + resize + center-crop throughput on one core: sdtrain (bench/transform) vs Pillow + torchvision.

Makes photo-sized inputs (the golden set's content generator, tests/reference/make_image_goldens.py,
at 512..1280 px, plus two golden inputs scaled up), in a temporary directory, then times on the same
files in the same run:

  Pillow      Image.open(BytesIO(data)).convert('RGB')                               (decode)
              + torchvision resize(R) + center_crop(R)                               (transform)
              + ToTensor() + Normalize([0.5]*3, [0.5]*3)                             (normalize)
  sdtrain     sd_image_decoder_run / + sd_transform_rgb8 / + sd_normalize_rgb8 (NHWC)

Both read the file from memory, on one thread, medians of --repeat samples of process CPU time
(--clock wall for elapsed time; CPU time keeps other jobs on a shared machine out of the numbers). The table gives
milliseconds per image and the ratio Pillow / sdtrain (> 1: sdtrain is faster).

    tests/reference/.venv/bin/python bench/transform_vs_pillow.py [--bench-bin PATH] [--resolution 256 512]

Without --bench-bin the C benchmark is compiled into the temporary directory with $CC (default cc)
from bench/transform.c and the library sources, -O2 like the default build.
"""
import argparse
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, 'tests', 'reference'))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
import PIL  # noqa: E402
import make_image_goldens as goldens  # noqa: E402

try:
    import torch
    import torchvision
    import torchvision.transforms.functional as TF
    from torchvision import transforms as T
    torch.set_num_threads(1)
except ImportError:
    torch = torchvision = TF = T = None


def make_inputs(d):
    """Photo-sized files; returns their paths."""
    specs = [
        ('photo_1024x768_q90_420.jpg', 1024, 768, dict(quality=90, subsampling=2)),
        ('photo_768x1024_q85_422.jpg', 768, 1024, dict(quality=85, subsampling=1)),
        ('photo_1024x1024_q95_444.jpg', 1024, 1024, dict(quality=95, subsampling=0)),
        ('photo_1280x720_q90_420.jpg', 1280, 720, dict(quality=90, subsampling=2)),
        ('photo_800x600_q75_420_prog.jpg', 800, 600, dict(quality=75, subsampling=2, progressive=True)),
        ('photo_640x480_q80_420.jpg', 640, 480, dict(quality=80, subsampling=2)),
        ('photo_512x512_q90_420.jpg', 512, 512, dict(quality=90, subsampling=2)),
        ('gray_1024x768_q90.jpg', 1024, 768, dict(quality=90)),
        ('photo_1024x768.png', 1024, 768, {}),
    ]
    paths = []
    for i, (name, w, h, kw) in enumerate(specs):
        im = goldens.content(w, h, 100 + i)
        if name.startswith('gray'):
            im = im.convert('L')
        im.save(os.path.join(d, name), 'PNG' if name.endswith('.png') else 'JPEG', **kw)
        paths.append(os.path.join(d, name))
    for name, scale in (('rgb_160x120_q90_420.jpg', 6), ('rgb_97x131_q95_444.jpg', 7)):
        src = Image.open(os.path.join(TOP, 'tests', 'image', 'input', name)).convert('RGB')
        big = src.resize((src.width * scale, src.height * scale), Image.LANCZOS)
        out = os.path.join(d, 'golden_%s_x%d.jpg' % (os.path.splitext(name)[0], scale))
        big.save(out, 'JPEG', quality=90)
        paths.append(out)
    return paths


CLOCK = time.process_time


def timeit(fn, repeat, min_time):
    fn()  # warm-up
    samples = []
    budget = min_time / repeat
    for _ in range(repeat):
        n, t0 = 0, CLOCK()
        while True:
            fn()
            n += 1
            t1 = CLOCK()
            if t1 - t0 >= budget:
                break
        samples.append((t1 - t0) / n)
    return 1e3 * statistics.median(samples)


def pillow_times(data, res, repeat, min_time):
    def decode():
        return Image.open(io.BytesIO(data)).convert('RGB')

    if TF is not None:
        def transform():
            return TF.center_crop(TF.resize(decode(), res, interpolation=TF.InterpolationMode.BILINEAR), res)
        norm = T.Compose([T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])

        def normalize():
            return norm(transform())
    else:
        def transform():
            return goldens.emulated(decode(), res)

        def normalize():
            a = np.asarray(transform(), dtype=np.float32)
            return (a / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    return [timeit(f, repeat, min_time) for f in (decode, transform, normalize)]


def build_bench(tmp):
    cc = os.environ.get('CC', 'cc')
    flags = subprocess.check_output(['pkg-config', '--cflags', '--libs', 'libturbojpeg', 'libpng']).decode().split()
    exe = os.path.join(tmp, 'bench_transform')
    cmd = [cc, '-std=c11', '-D_GNU_SOURCE', '-O2', '-g', '-I' + os.path.join(TOP, 'include'),
           os.path.join(HERE, 'transform.c'), os.path.join(TOP, 'src', 'data', 'image.c'),
           os.path.join(TOP, 'src', 'data', 'transform.c'), os.path.join(TOP, 'src', 'core', 'error.c'),
           '-o', exe] + flags + ['-lm']
    subprocess.check_call(cmd)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--bench-bin', help='bench/transform built by make (default: compile it here)')
    ap.add_argument('--resolution', type=int, nargs='+', default=[512, 256])
    ap.add_argument('--repeat', type=int, default=5)
    ap.add_argument('--min-time', type=float, default=0.5, help='seconds per measurement (all samples)')
    ap.add_argument('--keep', help='write the inputs here and keep them')
    ap.add_argument('--clock', choices=('cpu', 'wall'), default='cpu',
                    help='process CPU time (default: robust on a shared machine) or elapsed time')
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == 'cpu' else time.perf_counter

    tmp = tempfile.mkdtemp(prefix='sdtrain-bench-transform-')
    try:
        d = args.keep or tmp
        os.makedirs(d, exist_ok=True)
        files = make_inputs(d)
        exe = args.bench_bin or build_bench(tmp)
        print('Pillow %s, torchvision %s, numpy %s; one thread; %s clock; %s' % (
            PIL.__version__, torchvision.__version__ if torchvision else 'none (emulated)', np.__version__,
            'process CPU' if args.clock == 'cpu' else 'wall', time.strftime('%Y-%m-%d')))
        try:
            cpu = [l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name')][0]
            print('CPU: %s' % cpu)
        except (OSError, IndexError):
            pass
        tot = {}
        for res in args.resolution:
            out = subprocess.check_output([exe, '--resolution', str(res), '--repeat', str(args.repeat),
                                           '--min-time', str(args.min_time), '--clock', args.clock] +
                                          files).decode()
            c_rows = {l.split('\t')[0]: [float(x) for x in l.split('\t')[3:6]] for l in out.splitlines()[1:]}
            print('\nresolution %d: ms per image (median), ratio = Pillow / sdtrain' % res)
            hdr = ('%-38s %9s %8s %8s %6s %8s %8s %6s %8s %8s %6s' %
                   ('file', 'pixels', 'dec PIL', 'dec sd', 'x', 'd+r+c PIL', 'sd', 'x', '+norm PIL', 'sd', 'x'))
            print(hdr)
            print('-' * len(hdr))
            sums = [0.0] * 6
            for f in files:
                data = open(f, 'rb').read()
                p = pillow_times(data, res, args.repeat, args.min_time)
                c = c_rows[f]
                w, h = Image.open(io.BytesIO(data)).size
                print('%-38s %9s %8.2f %8.2f %6.2f %8.2f %8.2f %6.2f %8.2f %8.2f %6.2f' % (
                    os.path.basename(f), '%dx%d' % (w, h), p[0], c[0], p[0] / c[0], p[1], c[1], p[1] / c[1],
                    p[2], c[2], p[2] / c[2]))
                for k in range(3):
                    sums[2 * k] += p[k]
                    sums[2 * k + 1] += c[k]
            n = len(files)
            print('%-38s %9s %8.2f %8.2f %6.2f %8.2f %8.2f %6.2f %8.2f %8.2f %6.2f' % (
                'all (mean ms)', '', sums[0] / n, sums[1] / n, sums[0] / sums[1], sums[2] / n, sums[3] / n,
                sums[2] / sums[3], sums[4] / n, sums[5] / n, sums[4] / sums[5]))
            print('images/s per core, decode+resize+crop: Pillow+torchvision %.1f, sdtrain %.1f (%.2fx)' % (
                1e3 * n / sums[2], 1e3 * n / sums[3], sums[2] / sums[3]))
            tot[res] = sums[2] / sums[3]
        print('\nspeed-up on decode+resize+crop: ' + ', '.join('R=%d %.2fx' % (r, x) for r, x in tot.items()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
