/* Parallel HDF5 helpers shared by the shard writer and the checkpoint writer. */
#ifndef SDTRAIN_H5UTIL_H
#define SDTRAIN_H5UTIL_H

#include <hdf5.h>
#include <mpi.h>

#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The options of every parallel HDF5 file this process creates (&run io_hints, io_alignment):
 * MPI-IO hints given to MPI_File_open, and the alignment of datasets at least `alignment` bytes
 * long (H5Pset_alignment; 0 or 1 = none). sdtrain sets them once, after its configuration is
 * read and before any file is made; until then: no hints and 1 MiB, the namelist's defaults.
 * -1 with e when the hints do not parse (sd_io_hints_parse), the options unchanged. */
int sd_h5_set_file_options(const char *hints, int64_t alignment, sd_err *e);

/* Bytes the alignment can add for n_objects datasets or chunks of object_bytes each: each
 * starts up to one alignment unit later than packed when it is at least one unit long, else
 * nothing. For the free-space checks before a write. */
double sd_h5_alignment_slack(double object_bytes, double n_objects);

/* Creates (truncates) `path` on every rank of `comm` through the MPI-IO driver, with collective
 * metadata reads and writes and the options above. The first file made with hints has rank 0
 * of comm say, once per process, what MPI-IO reports for each hint (an implementation ignores
 * hints it does not know, and a file system ones it cannot use). Collective. Returns the file on every rank, or -1 on every rank with
 * `e` naming the file and HDF5's reason. A file created on some ranks only cannot be cleaned up
 * without a hang: that ends the job (MPI_Abort) with a message. */
hid_t sd_h5_create_parallel(const char *path, MPI_Comm comm, sd_err *e);

/* Creates (truncates) `path` on this rank alone with HDF5's POSIX driver and &run io_alignment;
 * with &run io_hints the file is first made through MPI-IO on MPI_COMM_SELF with them (Lustre
 * and GPFS set a file's layout when it is made; HDF5's truncation keeps it), the first such file
 * of the process reporting the hints as sd_h5_create_parallel does. A storage error then fails
 * this rank's calls alone, which no other rank waits in. Returns the file, or -1 with `e`. */
hid_t sd_h5_create_local(const char *path, sd_err *e);

/* H5Fopen marked for the stall watchdog as a file-system call on `path` (sdtrain/progress.h):
 * a rank held by a server that does not answer is reported with the file. */
hid_t sd_h5_fopen(const char *path, unsigned flags, hid_t fapl);

/* Closes a file of sd_h5_create_local. When that fails (the metadata HDF5 writes at the close
 * met a storage error), HDF5 keeps the file, tries again at exit and crashes there: the job ends
 * here instead (MPI_Abort), rank-local, after "sdtrain: creating '<path>' failed: <HDF5's
 * reason>; ending the job (...); <what_stays>". */
void sd_h5_close_local(hid_t file, const char *path, const char *what_stays);

/* Collective over comm, after a round of collective writes to a parallel HDF5 file: returns when
 * no rank's `failed` is set. When one is (its message in e), parallel HDF5's internal collectives
 * may be out of step between the ranks: after a full disk (ENOSPC), H5Fclose waits forever, each
 * rank in another barrier. Such a file can be neither closed nor removed safely, so the job ends
 * instead: rank 0 prints "sdtrain: <message>; <free space of path's file system>; <what_stays>"
 * and MPI_Abort ends every rank with SD_EXIT_FAILURE. What was committed before is untouched. */
void sd_h5_end_job_if_write_failed(MPI_Comm comm, int failed, sd_err *e, const char *path,
                                   const char *what_stays);

/* Scalar attributes of `loc` (a file or a dataset) as the shard and checkpoint formats store
 * them: a variable-length UTF-8 string (h5py reads it as str; variable-length types are barred
 * from parallel HDF5's raw data only, and attributes are metadata), a little-endian int32 or
 * int64, an IEEE float64. An HDF5 failure ends the job (SD_H5_CHECK). */
void sd_h5_attr_str(hid_t loc, const char *name, const char *value);
void sd_h5_attr_i32(hid_t loc, const char *name, int32_t v);
void sd_h5_attr_i64(hid_t loc, const char *name, int64_t v);
void sd_h5_attr_f64(hid_t loc, const char *name, double v);

#ifdef __cplusplus
}
#endif

#endif
