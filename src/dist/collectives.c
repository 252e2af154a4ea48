/* Collectives on flat fp32 buffers: the MPI backend, shard layout and the ZeRO-2 helpers.
 *
 * The reductions never use MPI_Reduce/MPI_Allreduce on floats (their summation order depends on
 * the library's algorithm and on the rank count). Instead each shard owner receives every
 * rank's contribution for its shard and adds them in rank order 0..P-1 (reduce-scatter); an
 * all-reduce is that reduce-scatter followed by an all-gather. Both move (P-1)/P of the buffer
 * per rank each way, like a ring, and are exact copies apart from the owner's fixed-order sum. */
#include "sdtrain/collectives.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/runtime.h"

void sd_shard_range(size_t n_total, int n_ranks, int rank, size_t align, size_t *begin,
                    size_t *end)
{
    SD_CHECK(n_ranks >= 1 && rank >= 0 && rank < n_ranks, "rank %d of %d", rank, n_ranks);
    if (align == 0)
        align = 1;
    size_t nb = n_total / align + (n_total % align != 0); /* aligned blocks, last one partial */
    size_t P = (size_t)n_ranks, r = (size_t)rank;
    size_t base = nb / P, extra = nb % P;
    size_t b0 = r * base + (r < extra ? r : extra);
    size_t b1 = b0 + base + (r < extra);
    size_t b = b0 * align, e = b1 * align;
    *begin = b < n_total ? b : n_total;
    *end = e < n_total ? e : n_total;
}

/* ---- MPI backend ---------------------------------------------------------------------------- */

enum { TAG_RS = 7101, TAG_AG = 7102, TAG_RD = 7103 };

typedef struct mpi_impl {
    MPI_Comm comm;
    float *tmp;         /* P * chunk floats for the reduce-scatter */
    size_t tmp_cap;     /* floats */
    MPI_Request *reqs;  /* 2 * P */
} mpi_impl;

static mpi_impl *impl_of(sd_comm *c) { return (mpi_impl *)c->impl; }

static float *tmp_floats(sd_comm *c, size_t n)
{
    mpi_impl *m = impl_of(c);
    if (n > m->tmp_cap) {
        free(m->tmp);
        m->tmp = sd_xmalloc(n * sizeof(float));
        m->tmp_cap = n;
    }
    return m->tmp;
}

/* Elements of the k-th chunk of a range of `len`, chunks of `chunk`. */
static size_t chunk_count(size_t len, size_t k, size_t chunk)
{
    size_t off = k * chunk;
    if (off >= len)
        return 0;
    return len - off < chunk ? len - off : chunk;
}

/* Number of chunk rounds for a buffer of n: rank 0 owns the largest shard. */
static size_t n_rounds(const sd_comm *c, size_t n, size_t chunk)
{
    size_t b, e;
    sd_shard_range(n, c->size, 0, c->align, &b, &e);
    return (e - b + chunk - 1) / chunk;
}

/* o[0:cnt] = x_0 + x_1 + ... + x_{P-1} (then / P for AVG), left to right, element by element,
 * x_q = tmp + q * stride: the one summation every reduction here uses. */
static void sum_in_rank_order(float *o, const float *tmp, size_t stride, size_t cnt, int P,
                              sd_red_op op)
{
    const float pf = (float)P;
    for (size_t b0 = 0; b0 < cnt; b0 += 2048) {
        size_t bn = cnt - b0 < 2048 ? cnt - b0 : 2048;
        float *ob = o + b0;
        memcpy(ob, tmp + b0, bn * sizeof(float));
        for (int q = 1; q < P; q++) {
            const float *x = tmp + (size_t)q * stride + b0;
            for (size_t i = 0; i < bn; i++)
                ob[i] += x[i];
        }
        if (op == SD_RED_AVG)
            for (size_t i = 0; i < bn; i++)
                ob[i] /= pf;
    }
}

static void mpi_reduce_scatter_f32(sd_comm *c, const float *send, float *shard, size_t n,
                                   sd_red_op op)
{
    mpi_impl *m = impl_of(c);
    const int P = c->size, me = c->rank;
    SD_CHECK(op == SD_RED_SUM || op == SD_RED_AVG, "reduce_scatter_f32: op %d", (int)op);
    size_t mb, me_end;
    sd_shard_range(n, P, me, c->align, &mb, &me_end);
    const size_t my_len = me_end - mb;
    SD_CHECK(n == 0 || send != NULL, "reduce_scatter_f32: NULL buffer for %zu floats", n);
    size_t rank0_b, rank0_e;
    sd_shard_range(n, P, 0, c->align, &rank0_b, &rank0_e);
    const size_t chunk = c->chunk_elems < rank0_e - rank0_b ? c->chunk_elems : rank0_e - rank0_b;
    if (chunk == 0)
        return; /* n == 0 */
    const size_t rounds = n_rounds(c, n, chunk);
    float *tmp = tmp_floats(c, (size_t)P * chunk);

    for (size_t k = 0; k < rounds; k++) {
        int nr = 0;
        const size_t off = k * chunk;
        const size_t cnt = chunk_count(my_len, k, chunk);
        if (cnt > 0)
            for (int i = 1; i < P; i++) {
                int q = (me + P - i) % P;
                SD_MPI_CHECK(MPI_Irecv(tmp + (size_t)q * chunk, (int)cnt, MPI_FLOAT, q, TAG_RS,
                                       m->comm, &m->reqs[nr++]));
            }
        for (int i = 1; i < P; i++) {
            int q = (me + i) % P;
            size_t qb, qe;
            sd_shard_range(n, P, q, c->align, &qb, &qe);
            size_t qc = chunk_count(qe - qb, k, chunk);
            if (qc > 0)
                SD_MPI_CHECK(MPI_Isend(send + qb + off, (int)qc, MPI_FLOAT, q, TAG_RS, m->comm,
                                       &m->reqs[nr++]));
        }
        /* this rank's own contribution, copied so that `shard` may alias `send + begin` */
        if (cnt > 0)
            memcpy(tmp + (size_t)me * chunk, send + mb + off, cnt * sizeof(float));
        SD_MPI_CHECK(MPI_Waitall(nr, m->reqs, MPI_STATUSES_IGNORE));
        if (cnt == 0)
            continue;
        sum_in_rank_order(shard + off, tmp, chunk, cnt, P, op);
    }
}

static void mpi_reduce_f32(sd_comm *c, float *buf, size_t n, sd_red_op op, int root)
{
    mpi_impl *m = impl_of(c);
    const int P = c->size, me = c->rank;
    SD_CHECK(op == SD_RED_SUM || op == SD_RED_AVG, "reduce_f32: op %d", (int)op);
    SD_CHECK(root >= 0 && root < P, "reduce_f32: root %d of %d ranks", root, P);
    SD_CHECK(n == 0 || buf != NULL, "reduce_f32: NULL buffer for %zu floats", n);
    const size_t chunk = c->chunk_elems < n ? c->chunk_elems : n;
    if (chunk == 0)
        return;
    float *tmp = me == root ? tmp_floats(c, (size_t)P * chunk) : NULL;
    for (size_t off = 0; off < n; off += chunk) {
        const size_t cnt = chunk_count(n, off / chunk, chunk);
        int nr = 0;
        if (me != root) {
            SD_MPI_CHECK(MPI_Send(buf + off, (int)cnt, MPI_FLOAT, root, TAG_RD, m->comm));
            continue;
        }
        for (int q = 0; q < P; q++)
            if (q != me)
                SD_MPI_CHECK(MPI_Irecv(tmp + (size_t)q * chunk, (int)cnt, MPI_FLOAT, q, TAG_RD,
                                       m->comm, &m->reqs[nr++]));
        memcpy(tmp + (size_t)me * chunk, buf + off, cnt * sizeof(float));
        SD_MPI_CHECK(MPI_Waitall(nr, m->reqs, MPI_STATUSES_IGNORE));
        sum_in_rank_order(buf + off, tmp, chunk, cnt, P, op);
    }
}

static void mpi_allgather_f32(sd_comm *c, float *buf, size_t n)
{
    mpi_impl *m = impl_of(c);
    const int P = c->size, me = c->rank;
    SD_CHECK(n == 0 || buf != NULL, "allgather_f32: NULL buffer for %zu floats", n);
    size_t rank0_b, rank0_e, mb, mend;
    sd_shard_range(n, P, 0, c->align, &rank0_b, &rank0_e);
    sd_shard_range(n, P, me, c->align, &mb, &mend);
    const size_t chunk = c->chunk_elems < rank0_e - rank0_b ? c->chunk_elems : rank0_e - rank0_b;
    if (chunk == 0 || P == 1)
        return;
    const size_t rounds = n_rounds(c, n, chunk);
    for (size_t k = 0; k < rounds; k++) {
        int nr = 0;
        const size_t off = k * chunk;
        const size_t cnt = chunk_count(mend - mb, k, chunk);
        for (int i = 1; i < P; i++) {
            int q = (me + P - i) % P;
            size_t qb, qe;
            sd_shard_range(n, P, q, c->align, &qb, &qe);
            size_t qc = chunk_count(qe - qb, k, chunk);
            if (qc > 0)
                SD_MPI_CHECK(MPI_Irecv(buf + qb + off, (int)qc, MPI_FLOAT, q, TAG_AG, m->comm,
                                       &m->reqs[nr++]));
        }
        if (cnt > 0)
            for (int i = 1; i < P; i++) {
                int q = (me + i) % P;
                SD_MPI_CHECK(MPI_Isend(buf + mb + off, (int)cnt, MPI_FLOAT, q, TAG_AG, m->comm,
                                       &m->reqs[nr++]));
            }
        SD_MPI_CHECK(MPI_Waitall(nr, m->reqs, MPI_STATUSES_IGNORE));
    }
}

static void mpi_allreduce_f32(sd_comm *c, float *buf, size_t n, sd_red_op op)
{
    size_t b, e;
    sd_comm_shard(c, n, &b, &e);
    mpi_reduce_scatter_f32(c, buf, buf + b, n, op);
    mpi_allgather_f32(c, buf, n);
}

static void mpi_broadcast(sd_comm *c, void *buf, size_t bytes, int root)
{
    mpi_impl *m = impl_of(c);
    SD_CHECK(root >= 0 && root < c->size, "broadcast: root %d of %d ranks", root, c->size);
    size_t chunk = c->chunk_elems * sizeof(float);
    if (chunk > INT_MAX)
        chunk = INT_MAX;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t cnt = bytes - off < chunk ? bytes - off : chunk;
        SD_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)cnt, MPI_BYTE, root, m->comm));
    }
}

static void mpi_allreduce_f64(sd_comm *c, double *v, int n, sd_red_op op)
{
    mpi_impl *m = impl_of(c);
    const int P = c->size;
    SD_CHECK(n >= 0, "allreduce_f64: n = %d", n);
    if (n == 0)
        return;
    double *all = sd_xmalloc((size_t)P * (size_t)n * sizeof(double));
    SD_MPI_CHECK(MPI_Allgather(v, n, MPI_DOUBLE, all, n, MPI_DOUBLE, m->comm));
    for (int i = 0; i < n; i++) {
        double acc = all[i];
        for (int q = 1; q < P; q++) {
            double x = all[(size_t)q * (size_t)n + (size_t)i];
            switch (op) {
            case SD_RED_SUM:
            case SD_RED_AVG: acc += x; break;
            case SD_RED_MAX: if (isnan(x) || x > acc) acc = isnan(acc) ? acc : x; break;
            case SD_RED_MIN: if (isnan(x) || x < acc) acc = isnan(acc) ? acc : x; break;
            }
        }
        v[i] = op == SD_RED_AVG ? acc / (double)P : acc;
    }
    free(all);
}

static void mpi_allreduce_i64(sd_comm *c, int64_t *v, int n, sd_red_op op)
{
    MPI_Op mop = op == SD_RED_SUM ? MPI_SUM : op == SD_RED_MAX ? MPI_MAX : MPI_MIN;
    SD_CHECK(op == SD_RED_SUM || op == SD_RED_MAX || op == SD_RED_MIN, "allreduce_i64: op %d",
             (int)op);
    SD_CHECK(n >= 0, "allreduce_i64: n = %d", n);
    if (n > 0)
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, mop, impl_of(c)->comm));
}

static void mpi_barrier(sd_comm *c) { SD_MPI_CHECK(MPI_Barrier(impl_of(c)->comm)); }

static void mpi_destroy(sd_comm *c)
{
    mpi_impl *m = impl_of(c);
    SD_MPI_CHECK(MPI_Comm_free(&m->comm));
    free(m->tmp);
    free(m->reqs);
    free(m);
    free(c);
}

static const sd_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_f32 = mpi_allreduce_f32,
    .reduce_scatter_f32 = mpi_reduce_scatter_f32,
    .reduce_f32 = mpi_reduce_f32,
    .allgather_f32 = mpi_allgather_f32,
    .broadcast = mpi_broadcast,
    .allreduce_f64 = mpi_allreduce_f64,
    .allreduce_i64 = mpi_allreduce_i64,
    .barrier = mpi_barrier,
    .destroy = mpi_destroy,
};

sd_comm *sd_comm_create_mpi(MPI_Comm comm)
{
    sd_comm *c = sd_xcalloc(1, sizeof *c);
    mpi_impl *m = sd_xcalloc(1, sizeof *m);
    SD_MPI_CHECK(MPI_Comm_dup(comm, &m->comm));
    SD_MPI_CHECK(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
    SD_MPI_CHECK(MPI_Comm_rank(m->comm, &c->rank));
    SD_MPI_CHECK(MPI_Comm_size(m->comm, &c->size));
    m->reqs = sd_xmalloc(2 * (size_t)c->size * sizeof(MPI_Request));
    c->ops = &mpi_ops;
    c->impl = m;
    c->align = SD_SHARD_ALIGN;
    /* 4 Mi floats (16 MiB) per message, less with many ranks so that the reduce-scatter's
     * staging buffer (P chunks) stays near 128 MiB. */
    size_t chunk = ((size_t)32 << 20) / (size_t)c->size;
    if (chunk > ((size_t)4 << 20))
        chunk = (size_t)4 << 20;
    if (chunk < ((size_t)64 << 10))
        chunk = (size_t)64 << 10;
    c->chunk_elems = chunk;
    return c;
}

void sd_comm_destroy(sd_comm *c)
{
    if (c)
        c->ops->destroy(c);
}

void sd_comm_set_align(sd_comm *c, size_t align) { c->align = align ? align : 1; }

void sd_comm_set_chunk_elems(sd_comm *c, size_t elems)
{
    if (elems < 1)
        elems = 1;
    if (elems > INT_MAX)
        elems = INT_MAX;
    c->chunk_elems = elems;
}

/* ---- ZeRO-2 --------------------------------------------------------------------------------- */

void sd_zero2_init(sd_zero2 *z, sd_comm *c, size_t n)
{
    z->comm = c;
    z->n = n;
    sd_comm_shard(c, n, &z->begin, &z->end);
}

void sd_zero2_reduce_grads(const sd_zero2 *z, const float *grads, float *shard_grads)
{
    sd_reduce_scatter_f32(z->comm, grads, shard_grads, z->n, SD_RED_AVG);
}

void sd_zero2_gather_params(const sd_zero2 *z, float *params)
{
    sd_allgather_f32(z->comm, params, z->n);
}
