#!/usr/bin/env python3
"""Reads a shard directory written by `shards_test write DIR SHARDS N DTYPE` with h5py and checks
every value against an independent re-implementation of the test's data generator.

Optional: tests/mpi/shards.sh runs it when tests/reference/.venv-h5 exists
(python3 -m venv tests/reference/.venv-h5 && tests/reference/.venv-h5/bin/pip install h5py numpy).
fp16 expectations use numpy's own float32 -> float16 conversion (round to nearest even), so this
also checks the C conversion independently. Usage: check_shards_h5py.py DIR f16|f32 N SHARDS
"""
import json
import sys

import h5py
import numpy as np

M = (1 << 64) - 1
RES, HS, C2, L, D = 16, 2, 8, 77, 8


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def value(g, what, j):
    h = splitmix(((((g & M) * 1000003 + what) & M) * 0x100000001B3 & M) ^ j)
    u = (h >> 11) / 9007199254740992.0
    k = h & 15
    if k == 0:
        return np.float32((u - 0.5) * 1e-6)
    if k == 1:
        return np.float32(0.0)
    return np.float32((u - 0.5) * 40.0)


def caption(g):
    if g % 7 == 3:
        return ""
    s = "a photo of thing %d \u00fc" % g
    for _ in range(g % 5):
        s += " \u2713 long"
    return s


def main():
    d, dtype, n, shards = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    want_dtype = np.float16 if dtype == "f16" else np.float32
    manifest = json.load(open(d + "/manifest.json"))
    assert manifest["format"] == "sdtrain-shard-manifest" and manifest["version"] == 1
    listed = {e["index"]: e for e in manifest["shards"]}
    for shard in map(int, shards.split(",")):
        e = listed[shard]
        N = n + shard
        with h5py.File(d + "/" + e["file"], "r") as f:
            a = f.attrs
            assert a["format"] == "sdtrain-latent-shard" and a["format_version"] == 1, dict(a)
            assert a["num_samples"] == N == e["samples"] and a["resolution"] == RES
            assert abs(a["latent_scaling_factor"] - 0.18215) == 0 and a["latent_layout"] == "NCHW"
            lat = f["image_latents_%d" % RES]
            emb, ids, cap, key = f["caption_embeddings"], f["caption_ids"], f["caption"], f["key"]
            assert lat.shape == (N, C2, HS, HS) and lat.dtype == want_dtype and lat.chunks == (1, C2, HS, HS)
            assert emb.shape == (N, L, D) and emb.dtype == want_dtype and emb.chunks == (1, L, D)
            assert ids.shape == (N, L) and ids.dtype == np.int32
            assert h5py.check_string_dtype(cap.dtype).encoding == "utf-8"
            g = [shard * 1000 + i for i in range(N)]
            want_lat = np.array([[value(x, 0, j) for j in range(C2 * HS * HS)] for x in g], np.float32)
            want_emb = np.array([[value(x, 1, j) for j in range(L * D)] for x in g], np.float32)
            want_empty = np.array([value(-1, 9, j) for j in range(L * D)], np.float32)
            bits = np.uint16 if dtype == "f16" else np.uint32

            def same_bits(got, want):
                # compare stored bit patterns, not values (0.0 == -0.0 would hide a sign error)
                return np.array_equal(np.ascontiguousarray(got).reshape(-1).view(bits),
                                      want.astype(want_dtype).reshape(-1).view(bits))

            assert same_bits(lat[...], want_lat), "latents differ"
            assert same_bits(emb[...], want_emb), "embeddings differ"
            assert same_bits(f["empty_caption_embedding"][...], want_empty), "empty embedding differs"
            want_ids = np.array([[(x * 31 + j * 7) % 49408 for j in range(L)] for x in g], np.int32)
            assert np.array_equal(ids[...], want_ids), "ids differ"
            assert list(cap.asstr()[...]) == [caption(x) for x in g], "captions differ"
            assert list(key.asstr()[...]) == ["%05d/%09d" % (x // 1000, x) for x in g], "keys differ"
        print("ok %s: %d samples, h5py %s (HDF5 %s)" % (e["file"], N, h5py.__version__, h5py.version.hdf5_version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
