/* Device selection: 'cpu', 'cuda' or 'auto' for each rank, with clear reasons when no GPU. */
#include "sd_config.h"

#include "sdtrain/device.h"

#include <stdio.h>
#include <string.h>

int sd_device_resolve(const char *requested, int node_rank, sd_device_info *out, sd_err *err)
{
    int want_cuda = strcmp(requested, "cuda") == 0;
    int auto_mode = strcmp(requested, "auto") == 0;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "cpu");
    if (!want_cuda && !auto_mode)
        return 0;
#if defined(SD_HAVE_CUDA)
    {
        char why[384];
        int code = sd_cuda_device_count(&out->n_devices, why, sizeof why);
        if (code == 0 && out->n_devices == 0)
            snprintf(why, sizeof why, "the CUDA driver reports no GPU");
        if (code != 0 || out->n_devices == 0) {
            out->n_devices = 0;
            if (want_cuda)
                return sd_err_set(err,
                                  "device = 'cuda' but no usable GPU: %s%s. Use device = 'cpu' or "
                                  "'auto', or run on a GPU node", why,
                                  code == 35 ? " (no NVIDIA driver on this machine)" : "");
            snprintf(out->notice, sizeof out->notice, "no usable GPU (%s); using the CPU", why);
            return 0;
        }
        out->use_cuda = 1;
        out->device_id = node_rank % out->n_devices;
        if (sd_cuda_set_device(out->device_id, why, sizeof why) != 0)
            return sd_err_set(err, "%s", why);
        sd_cuda_device_name(out->device_id, out->name, sizeof out->name);
        sd_cuda_device_uuid(out->device_id, out->uuid);
        return 0;
    }
#else
    (void)node_rank;
    if (want_cuda)
        return sd_err_set(err, "device = 'cuda' but this sdtrain was built without CUDA: reconfigure "
                               "with ./configure --with-cuda, or use device = 'cpu' or 'auto'");
    snprintf(out->notice, sizeof out->notice, "this build has no CUDA support; using the CPU");
    return 0;
#endif
}

int sd_devices_shared(const unsigned char *uuids, int n, int *a, int *b)
{
    static const unsigned char zero[16];
    for (int i = 0; i < n; i++) {
        if (!memcmp(uuids + 16 * (size_t)i, zero, 16))
            continue;
        for (int j = i + 1; j < n; j++)
            if (!memcmp(uuids + 16 * (size_t)i, uuids + 16 * (size_t)j, 16)) {
                *a = i;
                *b = j;
                return 1;
            }
    }
    return 0;
}

const char *sd_build_features(void)
{
    static char buf[1024];
    snprintf(buf, sizeof buf,
             "cpu (OpenMP, BLAS: %s), MPI: %s, HDF5: %s parallel"
#if defined(SD_HAVE_CUDA)
             ", cuda (toolkit %s, cuDNN %s, NCCL %s, archs %s)"
#else
             ", cuda: not built"
#endif
             ,
             SD_BUILD_BLAS, SD_BUILD_MPI, SD_BUILD_HDF5
#if defined(SD_HAVE_CUDA)
             , SD_BUILD_CUDA, SD_BUILD_CUDNN, SD_BUILD_NCCL, SD_CUDA_ARCHS
#endif
    );
    return buf;
}
