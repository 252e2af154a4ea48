/* Tensor descriptors (pointer, dtype, device, shape) and exact fp16/bf16 <-> fp32 conversion. */
#ifndef SDTRAIN_TENSOR_H
#define SDTRAIN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SD_F32 = 0,
    SD_F16,
    SD_BF16,
    SD_I32,
    SD_I64,
    SD_U8,
    SD_DTYPE_COUNT
} sd_dtype;

typedef enum {
    SD_DEV_CPU = 0,
    SD_DEV_CUDA
} sd_device;

#define SD_TENSOR_MAX_DIMS 8

/* A view of contiguous row-major memory: the tensor does not own `data`. */
typedef struct sd_tensor {
    void *data;
    sd_dtype dtype;
    sd_device device;
    int ndim;                          /* 0 (a scalar) .. SD_TENSOR_MAX_DIMS */
    int64_t shape[SD_TENSOR_MAX_DIMS]; /* entries past ndim are 0 */
} sd_tensor;

/* Bytes per element; 0 for an invalid dtype. */
size_t sd_dtype_size(sd_dtype dtype);

/* The safetensors spelling: "F32", "F16", "BF16", "I32", "I64", "U8"; "?" if invalid. */
const char *sd_dtype_name(sd_dtype dtype);

/* Parses a dtype name: the safetensors spellings above, in any letter case. Returns 0 and sets
 * *out, or -1 for an unknown name (e.g. "F64", which this project does not use). */
int sd_dtype_from_name(const char *name, sd_dtype *out);

/* Product of the shape (1 for a scalar). */
int64_t sd_tensor_numel(const sd_tensor *t);
size_t sd_tensor_nbytes(const sd_tensor *t);

/* Describes `data` as a tensor of the given shape. Returns 0, or -1 (t zeroed) when ndim is
 * outside [0, SD_TENSOR_MAX_DIMS], the dtype is invalid, a dimension is negative, or the byte
 * size would overflow. `shape` may be NULL when ndim is 0. */
int sd_tensor_view(sd_tensor *t, void *data, sd_dtype dtype, sd_device device, int ndim,
                   const int64_t *shape);

/* The same memory with another shape. One dimension may be -1, meaning "whatever makes the
 * element count match". Returns 0, or -1 (out untouched) when the counts cannot match or the
 * shape is invalid. `out` may be `src`. */
int sd_tensor_reshape(const sd_tensor *src, int ndim, const int64_t *shape, sd_tensor *out);

/* Writes "[2, 4, 64, 64]" ("[]" for a scalar) into buf, truncated to fit size bytes, and
 * returns buf so it can go straight into a printf argument. */
const char *sd_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);

/* 1 when both have the same ndim and dimensions (dtype and device are not compared). */
int sd_tensor_same_shape(const sd_tensor *a, const sd_tensor *b);

/* ---- Exact scalar conversions ------------------------------------------------------------
 * Half precision (IEEE binary16) and bfloat16 values are passed as their 16-bit patterns.
 * Widening is exact. Narrowing rounds to nearest, ties to even, as IEEE conversion and the
 * hardware instructions do: values from the largest finite value plus half an ulp up become
 * infinity, values below the smallest subnormal round to (signed) zero, subnormals are
 * produced exactly. NaNs stay NaN: sign and the top payload bits are kept and the quiet bit is
 * set (as x86 F16C and CUDA do), so a NaN whose payload lives only in dropped bits cannot
 * turn into infinity. fp16 -> fp32 also quiets signalling NaNs; bf16 -> fp32 is a plain shift. */
float sd_f16_to_f32(uint16_t h);
uint16_t sd_f32_to_f16(float f);
float sd_bf16_to_f32(uint16_t b);
uint16_t sd_f32_to_bf16(float f);

/* Array versions; src and dst must not overlap. The fp16 ones run on F16C where the CPU has it,
 * with the scalar routines' bits (sd_f16_simd says which; SDTRAIN_NO_F16C=1 turns it off). */
int sd_f16_simd(void);
/* Tests: 0 makes the fp16 array conversions use the scalar routines from now on, 1 F16C again
 * where the CPU has it. */
void sd_f16_simd_enable(int on);
void sd_f16_to_f32_array(const uint16_t *src, float *dst, size_t n);
void sd_f32_to_f16_array(const float *src, uint16_t *dst, size_t n);
void sd_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n);
void sd_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n);

#ifdef __cplusplus
}
#endif
#endif
