/* shard_compare A.h5 B.h5 TOL: two latent shards written from the same samples (for instance by
 * the CPU and the GPU encoders). Keys, captions and token ids must be equal; the moments, the
 * caption embeddings and the empty-caption embedding are compared as ||a - b|| / ||b|| (each
 * array on its own), which must be <= TOL. Prints one line per array. Exit 0 when everything
 * holds, 1 when something differs, 2 on bad input (a shard that does not open, other shapes). */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/shards.h"

static double rel_diff(const float *a, const float *b, size_t n, double *max_abs)
{
    double d2 = 0, b2 = 0;
    *max_abs = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        d2 += d * d;
        b2 += (double)b[i] * (double)b[i];
        if (fabs(d) > *max_abs)
            *max_abs = fabs(d);
    }
    return b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
}

static int check_floats(const char *what, const float *a, const float *b, size_t n, double tol)
{
    double max_abs, r = rel_diff(a, b, n, &max_abs);
    const int ok = r <= tol;
    printf("%-22s rel %.3e  max abs %.3e  (%zu values, tol %.0e) %s\n", what, r, max_abs, n, tol,
           ok ? "ok" : "DIFFERS");
    return ok;
}

int main(int argc, char **argv)
{
    sd_shard *sa = NULL, *sb = NULL;
    sd_err err;
    char *end;
    if (argc != 4) {
        fprintf(stderr, "usage: shard_compare A.h5 B.h5 TOL\n");
        return 2;
    }
    const double tol = strtod(argv[3], &end);
    if (*end || !(tol >= 0)) {
        fprintf(stderr, "shard_compare: TOL '%s' is not a number >= 0\n", argv[3]);
        return 2;
    }
    if (sd_shard_open(argv[1], &sa, &err) || sd_shard_open(argv[2], &sb, &err)) {
        fprintf(stderr, "shard_compare: %s\n", err.msg);
        return 2;
    }
    const sd_shard_info *ia = sd_shard_get_info(sa), *ib = sd_shard_get_info(sb);
    if (ia->n_samples != ib->n_samples || ia->latent_channels != ib->latent_channels ||
        ia->latent_size != ib->latent_size || ia->text_len != ib->text_len ||
        ia->embed_dim != ib->embed_dim) {
        fprintf(stderr, "shard_compare: %s and %s hold other shapes (%lld vs %lld samples)\n",
                argv[1], argv[2], (long long)ia->n_samples, (long long)ib->n_samples);
        return 2;
    }
    const int64_t n = ia->n_samples;
    const size_t mom = (size_t)n * 2 * ia->latent_channels * ia->latent_size * ia->latent_size;
    const size_t emb = (size_t)n * ia->text_len * ia->embed_dim, emp = emb / (n ? n : 1);
    const size_t ids = (size_t)n * ia->text_len;
    const size_t cw = (ia->caption_width > ib->caption_width ? ia->caption_width
                                                             : ib->caption_width) + 1;
    const size_t kw = (ia->key_width > ib->key_width ? ia->key_width : ib->key_width) + 1;
    float *ma = sd_xmalloc((mom + 1) * sizeof(float)), *mb = sd_xmalloc((mom + 1) * sizeof(float));
    float *ea = sd_xmalloc((emb + 1) * sizeof(float)), *eb = sd_xmalloc((emb + 1) * sizeof(float));
    float *pa = sd_xmalloc((emp + 1) * sizeof(float)), *pb = sd_xmalloc((emp + 1) * sizeof(float));
    int32_t *da = sd_xmalloc((ids + 1) * sizeof(int32_t)), *db = sd_xmalloc((ids + 1) * sizeof(int32_t));
    char *ca = sd_xcalloc((size_t)n * cw + 1, 1), *cb = sd_xcalloc((size_t)n * cw + 1, 1);
    char *ka = sd_xcalloc((size_t)n * kw + 1, 1), *kb = sd_xcalloc((size_t)n * kw + 1, 1);
    int ok = 1;
    if (n > 0 &&
        (sd_shard_read_moments(sa, 0, n, 1, SD_LATENT_NHWC, ma, &err) ||
         sd_shard_read_moments(sb, 0, n, 1, SD_LATENT_NHWC, mb, &err) ||
         sd_shard_read_embeddings(sa, 0, n, 1, ea, &err) ||
         sd_shard_read_embeddings(sb, 0, n, 1, eb, &err) ||
         sd_shard_read_ids(sa, 0, n, 1, da, &err) || sd_shard_read_ids(sb, 0, n, 1, db, &err) ||
         sd_shard_read_captions(sa, 0, n, 1, ca, cw, &err) ||
         sd_shard_read_captions(sb, 0, n, 1, cb, cw, &err) ||
         sd_shard_read_keys(sa, 0, n, 1, ka, kw, &err) ||
         sd_shard_read_keys(sb, 0, n, 1, kb, kw, &err) ||
         sd_shard_read_empty_embedding(sa, pa, &err) ||
         sd_shard_read_empty_embedding(sb, pb, &err))) {
        fprintf(stderr, "shard_compare: %s\n", err.msg);
        return 2;
    }
    printf("%s vs %s: %lld samples\n", argv[1], argv[2], (long long)n);
    if (memcmp(ka, kb, (size_t)n * kw) || memcmp(ca, cb, (size_t)n * cw) ||
        memcmp(da, db, ids * sizeof(int32_t))) {
        printf("keys, captions or token ids DIFFER\n");
        ok = 0;
    } else {
        printf("keys, captions, token ids: equal\n");
    }
    if (n > 0) {
        ok &= check_floats("moments", ma, mb, mom, tol);
        ok &= check_floats("caption embeddings", ea, eb, emb, tol);
        ok &= check_floats("empty-caption embedding", pa, pb, emp, tol);
    }
    free(ma), free(mb), free(ea), free(eb), free(pa), free(pb), free(da), free(db);
    free(ca), free(cb), free(ka), free(kb);
    sd_shard_close(sa);
    sd_shard_close(sb);
    return ok ? 0 : 1;
}
