/* Choosing the compute device for a rank: 'cpu', 'cuda' or 'auto', and what the build has. */
#ifndef SDTRAIN_DEVICE_H
#define SDTRAIN_DEVICE_H

#include <stddef.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_device_info {
    int use_cuda;        /* 1 when this rank computes on a GPU */
    int device_id;       /* CUDA device ordinal (node-local rank modulo the GPUs on the node) */
    int n_devices;       /* GPUs visible to this rank (0 without CUDA or without a driver) */
    char name[256];      /* "cpu" or the GPU's name */
    char notice[512];    /* why 'auto' chose the CPU; empty otherwise */
    unsigned char uuid[16]; /* the GPU's UUID (all zero on the CPU): the same in two ranks when
                               they share a GPU, whatever each rank's CUDA_VISIBLE_DEVICES */
} sd_device_info;

/* Resolves `requested` ('auto', 'cpu', 'cuda') for a rank with the given node-local rank.
 * 'cuda' without a usable GPU is an error that says why (no CUDA in this build, no driver,
 * no device); 'auto' then falls back to the CPU and fills `notice`. */
int sd_device_resolve(const char *requested, int node_rank, sd_device_info *out, sd_err *err);

/* Whether two of n ranks use the same GPU: uuids [n][16] (sd_device_info.uuid of each; all-zero
 * ones, CPU ranks, never match). Returns 1 and the first such pair (*a < *b), else 0. */
int sd_devices_shared(const unsigned char *uuids, int n, int *a, int *b);

/* "cpu" or "cpu cuda" plus versions: the features compiled in, for --version. */
const char *sd_build_features(void);

#if defined(SD_HAVE_CUDA)
/* Implemented in src/nn/cuda/ (nvcc). Return the cudaError_t code; 0 = success. */
int sd_cuda_device_count(int *count, char *msg, size_t cap);
int sd_cuda_device_name(int device, char *name, size_t cap);
int sd_cuda_device_uuid(int device, unsigned char uuid[16]);
int sd_cuda_set_device(int device, char *msg, size_t cap);
/* Runtime versions of cudart, the driver, cuBLASLt, cuDNN and NCCL. */
void sd_cuda_runtime_versions(char *buf, size_t cap);
#endif

#ifdef __cplusplus
}
#endif
#endif
