/* Parallel HDF5 helpers shared by the shard writer and the checkpoint writer. */
#ifndef SDTRAIN_H5UTIL_H
#define SDTRAIN_H5UTIL_H

#include <hdf5.h>
#include <mpi.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Creates (truncates) `path` on every rank of `comm` through the MPI-IO driver, with collective
 * metadata reads and writes. Collective. Returns the file on every rank, or -1 on every rank with
 * `e` naming the file and HDF5's reason. A file created on some ranks only cannot be cleaned up
 * without a hang: that ends the job (MPI_Abort) with a message. */
hid_t sd_h5_create_parallel(const char *path, MPI_Comm comm, sd_err *e);

#ifdef __cplusplus
}
#endif

#endif
