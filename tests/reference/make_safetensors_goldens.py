#!/usr/bin/env python3
"""Regenerate the safetensors goldens in tests/data/safetensors/ with the reference writer.

Files written (all small, committed):

  golden.safetensors       tensors of many dtypes and shapes (F32 matrix with a subnormal,
                           F32 scalar, empty F32, F16 specials incl. inf/-0/NaN/subnormals,
                           BF16, F64, I64 position ids, I32 4-D, U8, BOOL) and metadata
                           {"format": "pt"}, written by safetensors.serialize_file;
  golden.json              what the C reader must return for it: data order, dtype, shape,
                           the float32 bit patterns numpy gives for float dtypes, raw bytes;
  writer_expected.safetensors
                           the tensor set that tests/unit/test_safetensors.c also builds with
                           the C writer (see WRITER_SET below, mirrored in the C test); the C
                           test requires its output to be byte-identical to this file.

Only one metadata key is used in the byte-compared files: the reference keeps metadata in a
hash map, so with several keys their order in its header is not deterministic.

How to run it (from the repository root):

    python3 -m venv tests/reference/.venv
    tests/reference/.venv/bin/pip install -r tests/reference/requirements-safetensors.txt
    tests/reference/.venv/bin/python tests/reference/make_safetensors_goldens.py

Options:
  --check        regenerate in memory and compare with the committed files (exit 1 if stale)
  --c-test BIN   also check the other direction: run "BIN --write DIR" (the built
                 tests/unit/test_safetensors, which then writes DIR/c_written.safetensors with
                 the C writer) and load that file with the reference reader, comparing every
                 tensor and the metadata with what the C side was asked to write.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, '..', 'data', 'safetensors'))

# safetensors dtype name -> TensorSpec dtype name
SPEC_DTYPE = {'F32': 'float32', 'F16': 'float16', 'BF16': 'bfloat16', 'F64': 'float64',
              'I64': 'int64', 'I32': 'int32', 'U8': 'uint8', 'BOOL': 'bool'}


def f32_bits_to_bf16(values):
    """bf16 bit patterns of float32 values that bf16 represents exactly (checked)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0), 'value not exact in bf16'
    return (bits >> 16).astype(np.uint16)


def golden_set():
    """name -> (dtype, shape, little-endian bytes, float32 view or None)."""
    t = {}

    def add(name, dtype, arr, shape=None, f32=None):
        arr = np.array(arr, order="C")  # (ascontiguousarray would make a scalar 1-D)
        shape = list(arr.shape) if shape is None else shape
        if f32 is None and dtype in ('F32', 'F16', 'F64'):
            f32 = arr.astype(np.float32)
        t[name] = (dtype, shape, arr.astype(arr.dtype.newbyteorder('<')).tobytes(), f32)

    add('f32_matrix', 'F32', np.array([[-1.5, 0.0, 1.0], [2.25, 3e-39, 65504.0]], np.float32))
    add('f32_scalar', 'F32', np.array(3.14159274, np.float32))
    add('f32_empty', 'F32', np.zeros((0, 3), np.float32))
    with np.errstate(over='ignore'):
        add('f16_specials', 'F16', np.array([1.0, -2.0, 0.5, 65504.0, 2.0 ** -14, 2.0 ** -24,
                                             np.inf, -0.0, np.nan], np.float16))
        add('f64_vec', 'F64', np.array([0.1, 1e300, -2.5], np.float64))
    bf = np.array([1.0, -3.5, 2.0 ** 100, 2.0 ** -133], np.float32)
    add('bf16_vec', 'BF16', f32_bits_to_bf16(bf).reshape(2, 2), f32=bf.reshape(2, 2))
    add('i64_position_ids', 'I64', np.arange(4, dtype=np.int64).reshape(1, 4))
    add('i32_4d', 'I32', np.array([-1, 2, -3, 4], np.int32).reshape(1, 2, 1, 2))
    add('u8_bytes', 'U8', np.array([0, 1, 127, 128, 255], np.uint8))
    add('bool_flag', 'BOOL', np.array([True, False]))
    return t


# Mirrored by build_writer_set() in tests/unit/test_safetensors.c: change both together.
WRITER_ODD_NAME = 'odd "name"/\u00e9\n\t\u0001'


def writer_set():
    t = {}
    i12 = np.arange(12)
    t['b.weight'] = ('F32', [3, 4], ((i12 - 5) * 0.375).astype('<f4').tobytes())
    t['a.bias'] = ('F32', [4], (np.arange(4) * 0.5).astype('<f4').tobytes())
    t['c'] = ('F16', [2, 3], (np.arange(6) * 0.25 - 0.5).astype('<f2').tobytes())
    t['d'] = ('BF16', [5], f32_bits_to_bf16((np.arange(5) + 1) * 1.5).astype('<u2').tobytes())
    t['e_scalar'] = ('F32', [], np.array(42.0, '<f4').tobytes())
    t['f_empty'] = ('F16', [0], b'')
    t['g'] = ('I64', [2], np.array([7, -9], '<i8').tobytes())
    t['h'] = ('U8', [3], bytes([1, 2, 255]))
    t[WRITER_ODD_NAME] = ('F32', [1], np.array([1.0], '<f4').tobytes())
    t['z.f64'] = ('F64', [2], np.array([0.1, -1e300], '<f8').tobytes())
    return t


WRITER_METADATA = {'format': 'pt'}
# The file the C test writes for --c-test has more metadata (order-free comparison there).
C_WRITTEN_METADATA = {'format': 'pt', 'producer': 'sdtrain test_safetensors', 'empty': ''}


def serialize(tensors, metadata, path):
    keep = []
    specs = {}
    for name, (dtype, shape, raw) in ((k, v[:3]) for k, v in tensors.items()):
        buf = np.frombuffer(raw, np.uint8).copy() if raw else np.zeros(1, np.uint8)
        keep.append(buf)
        specs[name] = safetensors.TensorSpec(dtype=SPEC_DTYPE[dtype], shape=shape,
                                             data_ptr=buf.ctypes.data, data_len=len(raw))
    safetensors.serialize_file(specs, path, metadata=metadata)


def data_order(path):
    with open(path, 'rb') as fh:
        n = int.from_bytes(fh.read(8), 'little')
        header = json.loads(fh.read(n))
    header.pop('__metadata__', None)
    return sorted(header, key=lambda k: (header[k]['data_offsets'], k))


def golden_json(tensors, path):
    out = {'metadata': WRITER_METADATA, 'order': data_order(path), 'tensors': {}}
    for name, (dtype, shape, raw, f32) in tensors.items():
        entry = {'dtype': dtype, 'shape': shape, 'raw': raw.hex()}
        if f32 is not None:
            entry['f32_bits'] = ['%08x' % b for b in np.asarray(f32, np.float32).ravel().view(np.uint32)]
        out['tensors'][name] = entry
    return json.dumps(out, indent=1, sort_keys=True) + '\n'


def check_c_written(binary):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([binary, '--write', tmp], check=True)
        path = os.path.join(tmp, 'c_written.safetensors')
        with open(path, 'rb') as fh:
            raw_file = fh.read()
        got = {name: (info['dtype'], info['shape'], bytes(info['data']))
               for name, info in safetensors.deserialize(raw_file)}
        want = writer_set()
        bad = 0
        if set(got) != set(want):
            print('C file tensor names differ: %r vs %r' % (sorted(got), sorted(want)))
            bad += 1
        for name in sorted(set(got) & set(want)):
            if got[name] != want[name]:
                print('tensor %r differs: %r vs %r' % (name, got[name], want[name]))
                bad += 1
        # The numpy front end too (it has no bf16: those were compared above).
        with safetensors.safe_open(path, framework='numpy') as f:
            meta = f.metadata()
            for name in sorted(f.keys()):
                if want[name][0] == 'BF16':
                    continue
                arr = f.get_tensor(name)
                if list(arr.shape) != want[name][1] or arr.tobytes() != want[name][2]:
                    print('numpy view of %r differs' % name)
                    bad += 1
        if meta != C_WRITTEN_METADATA:
            print('metadata differs: %r vs %r' % (meta, C_WRITTEN_METADATA))
            bad += 1
        print('C-written file: %d tensors, %d metadata keys, %s' %
              (len(got), len(meta or {}), 'OK' if bad == 0 else '%d problems' % bad))
        return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--check', action='store_true', help='compare only; exit 1 when stale')
    ap.add_argument('--c-test', metavar='BIN', help='built tests/unit/test_safetensors')
    args = ap.parse_args()

    os.makedirs(DATA, exist_ok=True)
    stale = 0
    with tempfile.TemporaryDirectory() as tmp:
        g = golden_set()
        gpath = os.path.join(tmp, 'golden.safetensors')
        serialize(g, WRITER_METADATA, gpath)
        wpath = os.path.join(tmp, 'writer_expected.safetensors')
        serialize(writer_set(), WRITER_METADATA, wpath)
        jtext = golden_json(g, gpath).encode()
        outputs = {'golden.safetensors': open(gpath, 'rb').read(),
                   'golden.json': jtext,
                   'writer_expected.safetensors': open(wpath, 'rb').read()}
    for name, content in outputs.items():
        dst = os.path.join(DATA, name)
        old = open(dst, 'rb').read() if os.path.exists(dst) else None
        if old == content:
            continue
        stale += 1
        if args.check:
            print('%s: %s' % (dst, 'missing' if old is None else 'differs'))
        else:
            with open(dst, 'wb') as fh:
                fh.write(content)
            print('wrote %s' % dst)
    print('safetensors %s, numpy %s: %d files, %d %s' % (
        safetensors.__version__, np.__version__, len(outputs), stale,
        'stale' if args.check else 'written'))
    ok = not (args.check and stale)
    if args.c_test:
        ok = check_c_written(args.c_test) and ok
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
