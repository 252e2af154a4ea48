/* What the structured HDF5 harnesses (tests/fuzz/fuzz_shardfile.c, fuzz_ckptstate.c) share:
 * the input bytes as a stream of choices, and a generator that writes one dataset of a
 * well-formed HDF5 file (with the HDF5 library) changed as the input says: omitted, a group in
 * its place, another dimension or rank, huge declared extents without storage, another element
 * type (8-byte or big-endian floats, a 16-bit float that is not binary16, 64-bit or big-endian
 * integers, variable-length strings), contiguous or chunked, its data from the input. A harness
 * defines FUZZ_NAME and includes fuzz_util.h first. */
#ifndef SDTRAIN_FUZZ_H5GEN_H
#define SDTRAIN_FUZZ_H5GEN_H

#include <hdf5.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the input as a stream of choices ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n, at;
} input;

static inline unsigned byte(input *in) { return in->at < in->n ? in->p[in->at++] : 0; }

/* ---- datasets ------------------------------------------------------------------------------- */

enum { D_F, D_I32, D_STR };

static inline hid_t half_type(int ieee)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (ieee)
        H5Tset_fields(t, 15, 10, 5, 0, 10);
    else
        H5Tset_fields(t, 15, 8, 7, 0, 8); /* bfloat16-like: not binary16 */
    H5Tset_size(t, 2);
    H5Tset_ebias(t, ieee ? 15 : 127);
    return t;
}

/* Writes dataset `name` of nd dims (float with fsz bytes, int32, or fixed strings of width w),
 * changed as the input says; its data bytes come from the input. Returns 1 when it was written
 * as asked (no change of presence, shape or type), with its data bytes copied to `written`
 * (may be NULL; room for the whole dataset), else 0. */
static inline int put_dataset(hid_t f, const char *name, int kind, int fsz, size_t w, int nd,
                              const hsize_t *dims_in, input *in, void *written)
{
    unsigned op = byte(in) % 16;
    hsize_t dims[4], chunk[4], total = 1;
    hid_t type, space, dcpl, d;
    int huge = 0;
    memcpy(dims, dims_in, (size_t)nd * sizeof *dims);
    if (op == 9)
        return 0; /* omitted */
    if (op == 10) { /* a group in its place */
        hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g >= 0)
            H5Gclose(g);
        return 0;
    }
    if (op == 11) { /* another dimension */
        unsigned k = byte(in);
        dims[k % nd] = (hsize_t)(k >> 4);
    } else if (op == 12) { /* another rank */
        nd = nd > 1 && (byte(in) & 1) ? nd - 1 : (nd < 4 ? nd + 1 : nd);
        dims[nd - 1] = 1;
    } else if (op == 13) { /* huge and declared only */
        dims[byte(in) % nd] = (hsize_t)1 << (20 + byte(in) % 20);
        huge = 1;
    }
    if (kind == D_STR) {
        type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, op == 14 ? H5T_VARIABLE : w);
    } else if (kind == D_I32) {
        type = H5Tcopy(op == 14 ? H5T_IEEE_F32LE : op == 15 ? H5T_STD_I64LE : H5T_STD_I32BE);
    } else if (op == 14) {
        type = fsz == 2 ? half_type(0) : H5Tcopy(H5T_IEEE_F64LE);
    } else if (op == 15) {
        type = fsz == 2 ? H5Tcopy(H5T_IEEE_F32LE) : H5Tcopy(H5T_IEEE_F32BE);
    } else {
        type = fsz == 2 ? half_type(1) : H5Tcopy(H5T_IEEE_F32LE);
    }
    for (int k = 0; k < nd; k++) {
        chunk[k] = dims[k] ? (dims[k] < 16 ? dims[k] : 16) : 1;
        total *= dims[k];
    }
    space = H5Screate_simple(nd, dims, NULL);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (huge || total == 0 || (byte(in) & 1)) /* chunked: nothing stored until written */
        H5Pset_chunk(dcpl, nd, chunk);
    d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d >= 0 && !huge && total > 0 && total < (1u << 16) && H5Tis_variable_str(type) <= 0) {
        size_t esz = H5Tget_size(type), nbytes = (size_t)total * esz;
        unsigned char *buf = malloc(nbytes);
        for (size_t b = 0; b < nbytes; b++)
            buf[b] = (unsigned char)(kind == D_STR && b % esz == esz - 1 ? 0 : byte(in));
        H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        if (written && op < 9)
            memcpy(written, buf, nbytes);
        free(buf);
    }
    if (d >= 0)
        H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Tclose(type);
    return op < 9 && d >= 0;
}

#endif
