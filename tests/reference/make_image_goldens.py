#!/usr/bin/env python3
"""Regenerate the image-pipeline parity goldens tests/image/ with Pillow + torchvision.

The seed pipeline opens an image with Pillow, converts it to RGB, and runs
torchvision's Resize(resolution) (antialiased bilinear on PIL images) and
CenterCrop(resolution).  This script makes a corpus of synthetic but
photo-like inputs (smooth gradients, hard edges, noise, real bitmap-font text)
in many formats, sizes and aspect ratios, runs that reference path on each and
writes the 8-bit results.  tests/unit/test_image.c runs sdtrain's decoder and
transform on the same inputs and compares.

How to run it (from the repository root), with Debian 12's packages, because
torchvision from PyPI pulls a multi-gigabyte torch:

    apt-get install python3-pil python3-torchvision python3-numpy python3-venv
    python3 -m venv --system-site-packages tests/reference/.venv
    tests/reference/.venv/bin/python tests/reference/make_image_goldens.py

--check regenerates everything in memory and compares with the committed files
(exit status 1 when one differs).  --pillow-only replaces the two torchvision
calls by the formulas they evaluate (short side = R, long side =
int(R * long / short), Image.resize(..., BILINEAR); crop offsets
int(round((size - R) / 2.0))), so that --check can be run against another
Pillow from PyPI (pip install pillow==X) without torch; when torchvision is
present every case is computed both ways and the two must agree.

Layout of tests/image/:

  input/NAME.EXT     the inputs (JPEG, PNG, one crafted YCCK JPEG)
  ref/NAME...png     8-bit RGB reference images
  manifest.tsv       one line per check, tab-separated:
      decode    INPUT  FLAGS  REF    Pillow's Image.open(INPUT).convert('RGB')
      transform INPUT  FLAGS  REF  R  ... then torchvision resize(R) + center_crop(R)
  FLAGS is '-' or a comma list of:
      exif         ImageOps.exif_transpose() before convert (sdtrain: exif_transpose on)
      alpha=white  im.convert('RGBA') composited on white with Image.paste(mask=alpha)
                   (sdtrain: SD_ALPHA_WHITE) instead of convert('RGB')
      tall         resized vertically first, as Pillow 12.2 does when h > 100 w and
                   the height shrinks (sdtrain: SD_PASS_ORDER_PILLOW_12_2); the same input
                   without the flag is Pillow <= 12.1's order
      pillow13     resized vertically first, as Pillow >= 13.0 does when the height shrinks
                   and h - h' > 2 (w - w') (sdtrain: SD_PASS_ORDER_PILLOW_13)

--add writes only the files that are missing (cases added to this script later), keeping every
committed input and reference, and fails if a committed reference would change: the corpus can
grow without the pinned Pillow, whose references are never rewritten by another one.  The new
cases' references must not depend on the running Pillow's own pass order (see pass_order_case).

The inputs are deterministic (numpy's PCG64 with fixed seeds), and so is the
output (PNG written by Pillow with fixed settings).
"""
import argparse
import ctypes
import ctypes.util
import hashlib
import io
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps
import PIL

try:
    import torchvision
    import torchvision.transforms.functional as TF
except ImportError:  # --pillow-only
    torchvision = None
    TF = None

PINNED = {'pillow': '9.4.0', 'torchvision': '0.14.1'}


# ---- synthetic content ------------------------------------------------------------------
def content(w, h, seed, noise=6.0, text=True):
    """Photo-like RGB content: gradients, hard-edged shapes, noise and bitmap text."""
    rng = np.random.Generator(np.random.PCG64(seed))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    fx = x / max(w - 1, 1)
    fy = y / max(h - 1, 1)
    r = 40 + 180 * fx + 25 * np.sin(6.0 * fy + seed)
    g = 30 + 150 * fy + 30 * np.cos(5.0 * fx * fy + seed)
    b = 200 - 120 * (fx + fy) / 2 + 20 * np.sin(9.0 * (fx - fy))
    img = np.stack([r, g, b], axis=-1)
    img += rng.normal(0.0, noise, img.shape)
    arr = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr, 'RGB')
    d = ImageDraw.Draw(im)
    n_shapes = 2 + (w * h) // 6000
    for _ in range(min(n_shapes, 12)):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(1, max(2, w // 3))), y0 + int(rng.integers(1, max(2, h // 3)))
        col = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.integers(0, 2):
            d.rectangle([x0, y0, x1, y1], fill=col)
        else:
            d.ellipse([x0, y0, x1, y1], fill=col, outline=(0, 0, 0))
    if text and w >= 12 and h >= 10:
        font = ImageFont.load_default()
        words = ['Stable', 'Diffusion', 'sdtrain', 'LAION', '0123456789', 'resize', 'crop']
        for i in range(0, h, 14):
            col = (255, 255, 255) if (i // 14) % 2 else (10, 10, 10)
            d.text((int(rng.integers(-20, max(1, w // 2))), i), ' '.join(
                words[int(k)] for k in rng.integers(0, len(words), 4)), fill=col, font=font)
    # a high-frequency patch: 1-pixel stripes and a checkerboard
    arr = np.array(im)
    ph, pw = max(1, h // 5), max(1, w // 5)
    yy, xx = np.mgrid[0:ph, 0:pw]
    arr[h - ph:, :pw] = np.where(((xx + yy) % 2 == 0)[..., None], 250, 5).astype(np.uint8)
    arr[:ph, w - pw:] = np.where((xx % 2 == 0)[..., None], 230, 20).astype(np.uint8)
    return Image.fromarray(arr, 'RGB')


def alpha_plane(w, h, seed):
    """An alpha channel with opaque, transparent and soft regions."""
    rng = np.random.Generator(np.random.PCG64(seed + 1000))
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    a = 255 * (x / max(w - 1, 1))
    a[: h // 3] = 255
    a[h // 3: h // 2] = 0
    a += rng.normal(0, 10, a.shape)
    return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), 'L')


# ---- writers Pillow lacks (16-bit colour PNG, interlaced PNG) -----------------------------
def png_chunk(tag, data):
    return struct.pack('>I', len(data)) + tag + data + struct.pack('>I', zlib.crc32(tag + data) & 0xffffffff)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def raw_png(arr, bitdepth, colortype, interlace=False, extra=b'', tail=b''):
    """Writes a PNG from a (h, w, c) uint8/uint16 array, filter type 0 (none); extra chunks go
    before the image data, tail chunks after it."""
    h, w = arr.shape[:2]
    if arr.ndim == 2:
        arr = arr[..., None]
    data = arr.astype('>u2' if bitdepth == 16 else np.uint8)

    def rows(a):
        return b''.join(b'\x00' + a[i].tobytes() for i in range(a.shape[0]))

    if interlace:
        raw = b''
        for x0, y0, dx, dy in ADAM7:
            sub = data[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += rows(sub)
    else:
        raw = rows(data)
    ihdr = struct.pack('>IIBBBBB', w, h, bitdepth, colortype, 0, 0, 1 if interlace else 0)
    return (b'\x89PNG\r\n\x1a\n' + png_chunk(b'IHDR', ihdr) + extra +
            png_chunk(b'IDAT', zlib.compress(raw, 9)) + tail + png_chunk(b'IEND', b''))


def ycck_jpeg(im, quality=90):
    """A YCCK (Adobe transform 2) JPEG from a CMYK image, through libturbojpeg's
    tjCompress2 with TJPF_CMYK (Pillow cannot write YCCK).  Pillow treats every
    4-component JPEG as Adobe-inverted CMYK, so the CMYK bytes are inverted first,
    as Photoshop writes them."""
    name = ctypes.util.find_library('turbojpeg')
    if not name:
        raise RuntimeError('libturbojpeg not found (apt-get install libturbojpeg0)')
    tj = ctypes.CDLL(name)
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = tj.tjInitCompress()
    buf = ctypes.POINTER(ctypes.c_ubyte)()
    size = ctypes.c_ulong(0)
    inv = 255 - np.array(im, dtype=np.uint8)  # Adobe polarity
    src = np.ascontiguousarray(inv).tobytes()
    TJPF_CMYK, TJSAMP_420 = 11, 2
    rc = tj.tjCompress2(ctypes.c_void_p(handle), src, im.size[0], 0, im.size[1], TJPF_CMYK,
                        ctypes.byref(buf), ctypes.byref(size), TJSAMP_420, quality, 0)
    if rc != 0:
        raise RuntimeError('tjCompress2 failed')
    out = ctypes.string_at(buf, size.value)
    tj.tjFree(buf)
    tj.tjDestroy(ctypes.c_void_p(handle))
    return out


def exif_bytes(orientation):
    ex = Image.Exif()
    ex[0x0112] = orientation
    return ex.tobytes()


def exif_tiff(orientation):
    """The TIFF structure of an EXIF with this orientation (a PNG eXIf chunk's body)."""
    return exif_bytes(orientation)[6:]


def xmp_packet(orientation, element=False):
    """An XMP packet with tiff:Orientation as an attribute or (element=True) as an element."""
    attr = '' if element else ' tiff:Orientation="%d"' % orientation
    elem = '<tiff:Orientation>%d</tiff:Orientation>' % orientation if element else ''
    return ('<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
            '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
            'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
            'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:ImageWidth="96"%s>%s'
            '<tiff:Make>Orient\u00e9</tiff:Make></rdf:Description></rdf:RDF></x:xmpmeta>'
            '<?xpacket end="w"?>' % (attr, elem)).encode('utf-8')


def itxt(key, text, compressed=False):
    body = zlib.compress(text, 9) if compressed else text
    return png_chunk(b'iTXt', key + b'\0' + bytes([1 if compressed else 0, 0]) + b'\0\0' + body)


def raw_profile_exif(orientation):
    """ImageMagick's "Raw profile type exif" text: a blank line, the type, the length, then the
    EXIF (with its Exif\\0\\0 header) in lines of 72 hex digits."""
    data = exif_bytes(orientation)
    h = data.hex()
    return ('\nexif\n%8d\n' % len(data) + '\n'.join(h[i:i + 72] for i in range(0, len(h), 72)) +
            '\n').encode('ascii')


# ---- the corpus -------------------------------------------------------------------------
def build_inputs():
    """Returns [(file name, bytes, note)]."""
    out = []

    def save(name, im, fmt, note, **kw):
        b = io.BytesIO()
        im.save(b, fmt, **kw)
        out.append((name, b.getvalue(), note))

    # JPEG: qualities, subsamplings, progressive, sizes and aspect ratios
    save('rgb_160x120_q90_420.jpg', content(160, 120, 1), 'JPEG', 'landscape 4:2:0 q90',
         quality=90, subsampling=2)
    save('rgb_120x160_q75_422.jpg', content(120, 160, 2), 'JPEG', 'portrait 4:2:2 q75',
         quality=75, subsampling=1)
    save('rgb_97x131_q95_444.jpg', content(97, 131, 3), 'JPEG', 'odd portrait 4:4:4 q95',
         quality=95, subsampling=0)
    save('rgb_131x97_q50_420_prog.jpg', content(131, 97, 4), 'JPEG', 'odd landscape progressive q50',
         quality=50, subsampling=2, progressive=True)
    save('rgb_250x61_q85_420.jpg', content(250, 61, 5), 'JPEG', 'very wide (4.1:1)',
         quality=85, subsampling=2)
    save('rgb_23x180_q80_420.jpg', content(23, 180, 6), 'JPEG', 'very tall (7.8:1), odd',
         quality=80, subsampling=2)
    save('rgb_33x47_q70_420.jpg', content(33, 47, 7), 'JPEG', 'small odd, upscaled',
         quality=70, subsampling=2)
    save('rgb_7x5_q90_420.jpg', content(7, 5, 8, text=False), 'JPEG', 'tiny odd', quality=90,
         subsampling=2)
    save('rgb_1x1_q90.jpg', content(1, 1, 9, text=False), 'JPEG', '1x1', quality=90)
    save('rgb_64x64_q90_420.jpg', content(64, 64, 10), 'JPEG', 'exactly 64: no resize',
         quality=90, subsampling=2)
    save('rgb_67x64_q90_444.jpg', content(67, 64, 11), 'JPEG', 'short side 64: crop only',
         quality=90, subsampling=0)
    save('rgb_300x200_q30_420_opt.jpg', content(300, 200, 12, noise=3.0), 'JPEG',
         'q30 optimized Huffman, downscale', quality=30, subsampling=2, optimize=True)
    save('rgb_170x170_q60_422_prog.jpg', content(170, 170, 13), 'JPEG', 'square progressive 4:2:2',
         quality=60, subsampling=1, progressive=True)
    save('gray_90x70_q85.jpg', content(90, 70, 14).convert('L'), 'JPEG', 'grayscale JPEG',
         quality=85)
    save('cmyk_80x60_q90.jpg', content(80, 60, 15).convert('CMYK'), 'JPEG',
         'Adobe CMYK JPEG (Pillow writes inverted CMYK)', quality=90)
    out.append(('ycck_72x56_q90.jpg', ycck_jpeg(content(72, 56, 16).convert('CMYK')),
                'Adobe YCCK JPEG (libturbojpeg)'))
    for o in (3, 5, 6, 8):
        save('exif%d_96x64_q90.jpg' % o, content(96, 64, 20 + o), 'JPEG',
             'EXIF orientation %d' % o, quality=90, exif=exif_bytes(o))

    # EXIF orientation in PNG as Pillow 9.4's getexif() finds it: the eXIf chunk (also after
    # the image data), else a "Raw profile type exif" text chunk, and when that EXIF has no
    # Orientation an XMP tiff:Orientation (attribute or element; iTXt, zTXt or tEXt)
    def png_o(name, seed, note, extra=b'', tail=b''):
        out.append((name, raw_png(np.array(content(96, 64, seed)), 8, 2, extra=extra, tail=tail),
                    note))
    png_o('exifpng_end6_96x64.png', 60, 'PNG, eXIf orientation 6 after the image data',
          tail=png_chunk(b'eXIf', exif_tiff(6)))
    png_o('exifpng_xmp5_96x64.png', 61, 'PNG, XMP orientation 5 (iTXt, attribute), no EXIF',
          extra=itxt(b'XML:com.adobe.xmp', xmp_packet(5)))
    png_o('exifpng_xmpz8_96x64.png', 62, 'PNG, XMP orientation 8 (compressed iTXt, element) '
          'after the image data', tail=itxt(b'XML:com.adobe.xmp', xmp_packet(8, True), True))
    png_o('exifpng_xmpt3_96x64.png', 63, 'PNG, XMP orientation 3 in a tEXt chunk',
          extra=png_chunk(b'tEXt', b'XML:com.adobe.xmp\0' + xmp_packet(3)))
    png_o('exifpng_raw6_96x64.png', 64, 'PNG, zTXt "Raw profile type exif" orientation 6',
          extra=png_chunk(b'zTXt', b'Raw profile type exif\0\0' + zlib.compress(raw_profile_exif(6))))
    png_o('exifpng_exif1xmp6_96x64.png', 65, 'PNG, eXIf orientation 1 and XMP 6: the EXIF tag wins',
          extra=png_chunk(b'eXIf', exif_tiff(1)) + itxt(b'XML:com.adobe.xmp', xmp_packet(6)))
    png_o('exifpng_last7_96x64.png', 66, 'PNG, XMP 2 before the image data, XMP 7 after it: '
          'the last one counts', extra=itxt(b'XML:com.adobe.xmp', xmp_packet(2)),
          tail=itxt(b'XML:com.adobe.xmp', xmp_packet(7)))
    jx = io.BytesIO()
    content(96, 64, 67).save(jx, 'JPEG', quality=90)
    jx = jx.getvalue()
    app1 = b'http://ns.adobe.com/xap/1.0/\0' + xmp_packet(6)
    out.append(('exifjpg_xmp6_96x64.jpg', jx[:2] + b'\xff\xe1' + struct.pack('>H', len(app1) + 2) +
                app1 + jx[2:], 'JPEG with only an XMP orientation 6: Pillow 9.4 ignores it'))

    # PNG: every colour type and bit depth the decoder converts
    save('rgb_110x90.png', content(110, 90, 30), 'PNG', 'RGB 8-bit')
    rgba = content(90, 110, 31)
    rgba.putalpha(alpha_plane(90, 110, 31))
    save('rgba_90x110.png', rgba, 'PNG', 'RGBA 8-bit')
    save('gray_75x50.png', content(75, 50, 32).convert('L'), 'PNG', 'L 8-bit')
    la = content(60, 80, 33).convert('L')
    la = Image.merge('LA', (la, alpha_plane(60, 80, 33)))
    save('la_60x80.png', la, 'PNG', 'LA 8-bit')
    pal = content(100, 70, 34).convert('P', palette=Image.ADAPTIVE, colors=200)
    save('pal_100x70.png', pal, 'PNG', 'P 8-bit, 200 colours')
    pal_t = pal.copy()
    pal_t.info['transparency'] = bytes([0, 64, 128, 200] + [255] * 196)
    save('palt_100x70.png', pal_t, 'PNG', 'P 8-bit with tRNS', transparency=pal_t.info['transparency'])
    pal4 = content(45, 38, 35).convert('P', palette=Image.ADAPTIVE, colors=16)
    save('pal4_45x38.png', pal4, 'PNG', 'P 4-bit', bits=4)
    g1 = content(50, 40, 36).convert('1')
    save('gray1_50x40.png', g1, 'PNG', 'L 1-bit')
    # 16-bit: values spread over the whole range, low bytes not zero
    rng = np.random.Generator(np.random.PCG64(37))
    base = np.array(content(70, 52, 37), dtype=np.uint16)
    rgb16 = (base * 257 + rng.integers(0, 257, base.shape)).astype(np.uint16)
    out.append(('rgb16_70x52.png', raw_png(rgb16, 16, 2), 'RGB 16-bit'))
    a16 = (np.array(alpha_plane(70, 52, 37), dtype=np.uint16) * 257)[..., None]
    out.append(('rgba16_70x52.png', raw_png(np.concatenate([rgb16, a16], axis=-1), 16, 6),
                'RGBA 16-bit'))
    out.append(('la16_70x52.png', raw_png(np.concatenate([rgb16[..., :1], a16], axis=-1), 16, 4),
                'LA 16-bit'))
    g16 = np.array(content(48, 40, 38).convert('L'), dtype=np.uint16)
    g16 = np.where(np.arange(48)[None, :] < 24, g16, g16 * 257)  # left half < 256: not clipped
    out.append(('gray16_48x40.png', raw_png(g16.astype(np.uint16), 16, 0), 'L 16-bit'))
    out.append(('rgb_interlaced_81x59.png',
                raw_png(np.array(content(81, 59, 39)), 8, 2, interlace=True), 'RGB Adam7 interlaced'))
    trns = png_chunk(b'tRNS', struct.pack('>HHH', 255, 255, 255))
    out.append(('rgb_trns_40x30.png', raw_png(np.array(content(40, 30, 40)), 8, 2, extra=trns),
                'RGB with tRNS colour key'))
    save('rgb_1x1.png', content(1, 1, 41, text=False), 'PNG', '1x1 PNG')
    save('big_600x450_q50.jpg', content(600, 450, 42, noise=3.0), 'JPEG',
         'strong downscale: 100+ taps per output', quality=50, subsampling=2)
    return out


# (input, resolution, flags) cases; every input is also decoded at full size (decode cases)
def transform_cases(names):
    cases = []
    for n in names:
        cases.append((n, 64, '-'))
    big = ['rgb_160x120_q90_420.jpg', 'rgb_250x61_q85_420.jpg', 'rgba_90x110.png',
           'rgb_23x180_q80_420.jpg', 'cmyk_80x60_q90.jpg']
    for n in big:
        cases.append((n, 256, '-'))
    cases.append(('gray_90x70_q85.jpg', 512, '-'))
    cases.append(('rgb_33x47_q70_420.jpg', 512, '-'))
    for r in (3, 4, 17, 100):  # taps per output: about 300, 225, 53, 9
        cases.append(('big_600x450_q50.jpg', r, '-'))
    for n in names:
        if n.startswith('exif'):
            cases.append((n, 64, 'exif'))
    for n in ('rgba_90x110.png', 'la_60x80.png', 'palt_100x70.png', 'rgba16_70x52.png',
              'rgb_110x90.png'):
        cases.append((n, 64, 'alpha=white'))
    return cases


# ---- the reference path -----------------------------------------------------------------
def open_rgb(data, flags):
    im = Image.open(io.BytesIO(data))
    im.load()
    if 'exif' in flags:
        im = ImageOps.exif_transpose(im)
    if 'alpha=white' in flags:
        rgba = im.convert('RGBA')
        bg = Image.new('RGB', rgba.size, (255, 255, 255))
        bg.paste(rgba.convert('RGB'), (0, 0), rgba.getchannel('A'))
        return bg
    return im.convert('RGB')


def emulated(im, res):
    """What torchvision's resize(img, res) + center_crop(img, res) evaluate on a PIL image."""
    w, h = im.size
    short, long_ = (w, h) if w <= h else (h, w)
    new_short, new_long = res, int(res * long_ / short)
    nw, nh = (new_short, new_long) if w <= h else (new_long, new_short)
    if (nw, nh) != (w, h):
        im = im.resize((nw, nh), Image.BILINEAR)
    top = int(round((nh - res) / 2.0))
    left = int(round((nw - res) / 2.0))
    return im.crop((left, top, left + res, top + res))


def reference(im, res, pillow_only):
    mine = emulated(im, res)
    if pillow_only:
        return mine
    tv = TF.center_crop(TF.resize(im, res, interpolation=TF.InterpolationMode.BILINEAR), res)
    if tv.tobytes() != mine.tobytes() or tv.size != mine.size:
        raise AssertionError('torchvision and the emulated formulas disagree')
    return tv


def running_pillow_vertical_first(w, h, nw, nh):
    """Whether this Pillow's Image.resize runs the vertical pass first (see --help)."""
    version = tuple(int(p) for p in PIL.__version__.split('.')[:2])
    if nh >= h:
        return False
    if version >= (13, 0):
        return h - nh > 2 * (w - nw)  # Resample.c (python-pillow/Pillow#9549)
    if version >= (12, 2):
        return h > 100 * w  # Image.resize (python-pillow/Pillow#9524)
    return False


def pass_order_case(im, res, vflag):
    """The transform of im at res in both pass orders, each as two single-direction resizes
    (whose arithmetic no Pillow version changed), checked against this Pillow's own
    Image.resize; returns [(flags, image)] for '-' (horizontal first) and vflag."""
    w, h = im.size
    short, long_ = (w, h) if w <= h else (h, w)
    nl = int(res * long_ / short)
    nw, nh = (res, nl) if w <= h else (nl, res)
    top, left = int(round((nh - res) / 2.0)), int(round((nw - res) / 2.0))
    box = (left, top, left + res, top + res)
    vfirst = im.resize((w, nh), Image.BILINEAR, box=(0, 0, w, h)).resize(
        (nw, nh), Image.BILINEAR, box=(0, 0, w, nh)).crop(box)
    hfirst = im.resize((nw, h), Image.BILINEAR, box=(0, 0, w, h)).resize(
        (nw, nh), Image.BILINEAR, box=(0, 0, nw, h)).crop(box)
    real = emulated(im, res)
    if real.tobytes() != (vfirst if running_pillow_vertical_first(w, h, nw, nh) else hfirst).tobytes():
        raise AssertionError('the two-pass emulation of Pillow %s disagrees with it' % PIL.__version__)
    if vfirst.tobytes() == hfirst.tobytes():
        raise AssertionError('%dx%d at %d does not tell the two orders apart' % (w, h, res))
    return [('-', hfirst), (vflag, vfirst)]


def png_bytes(im):
    b = io.BytesIO()
    im.save(b, 'PNG', optimize=False, compress_level=9)
    return b.getvalue()


def ref_name(inp, flags, res=None):
    stem = os.path.splitext(inp)[0]
    tag = '' if flags == '-' else '_' + flags.replace('=', '-').replace(',', '_')
    return '%s%s_%s.png' % (stem, tag, 'decode' if res is None else 'r%d' % res)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', default=os.path.normpath(os.path.join(here, '..', 'image')),
                    help='corpus directory (default: tests/image)')
    ap.add_argument('--check', action='store_true', help='compare only; exit 1 on a difference')
    ap.add_argument('--pillow-only', action='store_true',
                    help='do not use torchvision (emulate its two formulas)')
    ap.add_argument('--add', action='store_true',
                    help='write only missing files (new cases); keep every committed one')
    ap.add_argument('--any-version', action='store_true',
                    help='do not insist on the pinned Pillow/torchvision versions')
    args = ap.parse_args()
    pillow_only = args.pillow_only or TF is None
    if TF is None and not args.pillow_only:
        sys.exit('torchvision is missing: install python3-torchvision or pass --pillow-only')
    if not args.any_version and not args.check and not args.add:
        got = {'pillow': PIL.__version__,
               'torchvision': torchvision.__version__ if torchvision else None}
        for k, v in PINNED.items():
            if got[k] is not None and not str(got[k]).startswith(v):
                sys.exit('%s %s is not the pinned %s (pass --any-version to override)' % (k, got[k], v))

    files = {}  # relative path -> bytes
    lines = []
    inputs = build_inputs()
    for name, data, note in inputs:
        path = os.path.join(args.out, 'input', name)
        if (args.check or args.add) and os.path.exists(path):
            # another Pillow/libjpeg may encode differently: check the committed inputs
            data = open(path, 'rb').read()
        files['input/' + name] = data
    inputs = [(n, files['input/' + n], note) for n, _, note in inputs]
    for name, data, note in inputs:
        if name.startswith('big_'):
            continue  # its full-size decode would cost 350 kB; its transforms check it
        ref = ref_name(name, '-')
        files['ref/' + ref] = png_bytes(open_rgb(data, '-'))
        lines.append('decode\t%s\t-\t%s\t0\t# %s' % (name, ref, note))
    for name, res, flags in transform_cases([n for n, _, _ in inputs]):
        data = files['input/' + name]
        ref = ref_name(name, flags, res)
        files['ref/' + ref] = png_bytes(reference(open_rgb(data, flags), res, pillow_only))
        lines.append('transform\t%s\t%s\t%s\t%d' % (name, flags, ref, res))
    # h > 100 w and shrinking in height: Pillow >= 12.2 resizes vertically first ('tall'),
    # older Pillow horizontally first ('-'). Both references are written with any Pillow: the
    # 12.2 order is two single-direction resizes, checked against Image.resize on >= 12.2.
    tall = 'tall_66x6700.jpg'
    path = os.path.join(args.out, 'input', tall)
    if (args.check or args.add) and os.path.exists(path):
        data = open(path, 'rb').read()
    else:
        b = io.BytesIO()
        content(66, 6700, 50, noise=1.0, text=False).save(b, 'JPEG', quality=60)
        data = b.getvalue()
    files['input/' + tall] = data
    im = open_rgb(data, '-')
    reference(im, 64, pillow_only)  # torchvision agrees with the emulated formulas
    for flags, out_im in pass_order_case(im, 64, 'tall'):
        ref = ref_name(tall, flags, 64)
        files['ref/' + ref] = png_bytes(out_im)
        lines.append('transform\t%s\t%s\t%s\t64' % (tall, flags, ref))
    # A portrait photo over 2:1 scaled down: Pillow >= 13.0 resizes it vertically first
    # ('pillow13', 260 - 184 > 2 * (90 - 64)), older Pillow horizontally first ('-').
    portrait = 'portrait_90x260_q85.jpg'
    path = os.path.join(args.out, 'input', portrait)
    if (args.check or args.add) and os.path.exists(path):
        data = open(path, 'rb').read()
    else:
        b = io.BytesIO()
        content(90, 260, 51).save(b, 'JPEG', quality=85)
        data = b.getvalue()
    files['input/' + portrait] = data
    im = open_rgb(data, '-')
    ref = ref_name(portrait, '-')
    files['ref/' + ref] = png_bytes(im)
    lines.append('decode\t%s\t-\t%s\t0\t# portrait 2.9:1, 4:2:0 q85' % (portrait, ref))
    for flags, out_im in pass_order_case(im, 64, 'pillow13'):
        ref = ref_name(portrait, flags, 64)
        files['ref/' + ref] = png_bytes(out_im)
        lines.append('transform\t%s\t%s\t%s\t64' % (portrait, flags, ref))

    if not pillow_only:
        # ToTensor + Normalize([0.5]*3, [0.5]*3) of every 8-bit value, as float32 bit patterns
        import torch  # noqa: F401  (torchvision imported it already)
        from torchvision import transforms as T
        ramp = Image.fromarray(np.arange(256, dtype=np.uint8).reshape(16, 16), 'L').convert('RGB')
        t = T.Normalize([0.5] * 3, [0.5] * 3)(T.ToTensor()(ramp)).numpy()
        bits = t[0].reshape(-1).astype(np.float32).view(np.uint32)
        files['normalize_torch.txt'] = ('# torch %s: Normalize(0.5, 0.5)(ToTensor()(v)) for v = 0..255, '
                                        'float32 bits\n' % torch.__version__ +
                                        ''.join('%08x\n' % b for b in bits)).encode()
    header = ('# sdtrain image parity corpus, written by tests/reference/make_image_goldens.py\n'
              '# Pillow %s (libjpeg %s, zlib %s), torchvision %s%s\n'
              '# kind\tinput\tflags\treference\tresolution\n' % (
                  PIL.__version__, _feature('jpg'), _feature('zlib'),
                  torchvision.__version__ if torchvision else 'none',
                  ' (emulated)' if pillow_only else ''))
    manifest = header + '\n'.join(lines) + '\n'

    stale = 0
    added = []
    for rel, data in sorted(files.items()):
        path = os.path.join(args.out, rel)
        old = open(path, 'rb').read() if os.path.exists(path) else None
        if rel.startswith('ref/') and old is not None and old != data:
            # a PNG can differ in zlib bytes only: compare pixels
            if Image.open(io.BytesIO(old)).tobytes() == Image.open(io.BytesIO(data)).tobytes():
                continue
        if old == data:
            continue
        stale += 1
        if args.add and old is not None:
            sys.exit('%s: differs from what Pillow %s makes; --add changes no committed file' % (
                path, PIL.__version__))
        if args.add:
            added.append(rel)
        if args.check:
            print('%s: %s' % (path, 'missing' if old is None else 'differs'))
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'wb') as fh:
                fh.write(data)
    mpath = os.path.join(args.out, 'manifest.tsv')
    if args.add:
        # the committed header names the Pillow of the committed references; say who added what
        with open(mpath, encoding='utf-8') as fh:
            committed = [ln for ln in fh.read().split('\n') if ln.startswith('#')]
        notes = [ln for ln in committed if ln.startswith('# added by')]
        if added:
            notes.append('# added by Pillow %s (libjpeg %s) with --add: %s' % (
                PIL.__version__, _feature('jpg'), ' '.join(os.path.basename(a) for a in added)))
        head = [ln for ln in committed if not ln.startswith('# added by')]
        manifest = '\n'.join(head[:-1] + notes + head[-1:]) + '\n' + '\n'.join(lines) + '\n'
    if not args.check:
        with open(mpath, 'w', encoding='utf-8', newline='\n') as fh:
            fh.write(manifest)
    total = sum(len(d) for d in files.values())
    digest = hashlib.sha256(b''.join(files[k] for k in sorted(files) if k.startswith('ref/'))).hexdigest()
    print('Pillow %s torchvision %s: %d files (%d bytes), %d %s, refs sha256 %s' % (
        PIL.__version__, torchvision.__version__ if torchvision else 'none (emulated)',
        len(files), total, stale, 'stale' if args.check else 'written', digest[:16]))
    return 1 if (args.check and stale) else 0


def _feature(name):
    try:
        from PIL import features
        return features.version(name)
    except Exception:  # older Pillow
        return '?'


if __name__ == '__main__':
    sys.exit(main())
