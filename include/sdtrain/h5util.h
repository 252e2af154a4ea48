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

/* Collective over comm, after a round of collective writes to a parallel HDF5 file: returns when
 * no rank's `failed` is set. When one is (its message in e), parallel HDF5's internal collectives
 * may be out of step between the ranks: after a full disk (ENOSPC), H5Fclose waits forever, each
 * rank in another barrier. Such a file can be neither closed nor removed safely, so the job ends
 * instead: rank 0 prints "sdtrain: <message>; <free space of path's file system>; <what_stays>"
 * and MPI_Abort ends every rank with SD_EXIT_FAILURE. What was committed before is untouched. */
void sd_h5_end_job_if_write_failed(MPI_Comm comm, int failed, sd_err *e, const char *path,
                                   const char *what_stays);

#ifdef __cplusplus
}
#endif

#endif
