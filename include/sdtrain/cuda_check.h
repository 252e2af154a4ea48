/* Check macros for CUDA, cuBLAS(Lt), cuDNN and NCCL calls (for .cu files): on failure they
 * report the statement, the library's own error text, file:line and rank, and end the job. */
#ifndef SDTRAIN_CUDA_CHECK_H
#define SDTRAIN_CUDA_CHECK_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "sdtrain/check.h"

#define SD_CUDA_CHECK(call)                                                                    \
    do {                                                                                       \
        cudaError_t sd_e_ = (call);                                                            \
        if (sd_e_ != cudaSuccess)                                                              \
            sd_fatal_report(__FILE__, __LINE__, __func__, #call, cudaGetErrorString(sd_e_),     \
                            cudaGetErrorName(sd_e_));                                          \
    } while (0)

#define SD_CUBLAS_CHECK(call)                                                                  \
    do {                                                                                       \
        cublasStatus_t sd_s_ = (call);                                                         \
        if (sd_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            sd_fatal_report(__FILE__, __LINE__, __func__, #call, cublasGetStatusString(sd_s_),  \
                            cublasGetStatusName(sd_s_));                                       \
    } while (0)

#define SD_CUDNN_CHECK(call)                                                                   \
    do {                                                                                       \
        cudnnStatus_t sd_s_ = (call);                                                          \
        if (sd_s_ != CUDNN_STATUS_SUCCESS)                                                     \
            sd_fatal_report(__FILE__, __LINE__, __func__, #call, cudnnGetErrorString(sd_s_),    \
                            NULL);                                                             \
    } while (0)

#define SD_NCCL_CHECK(call)                                                                    \
    do {                                                                                       \
        ncclResult_t sd_r_ = (call);                                                           \
        if (sd_r_ != ncclSuccess)                                                              \
            sd_fatal_report(__FILE__, __LINE__, __func__, #call, ncclGetErrorString(sd_r_),     \
                            "set NCCL_DEBUG=WARN for details");                                \
    } while (0)

#endif
