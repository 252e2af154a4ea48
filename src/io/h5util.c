/* Parallel HDF5 helpers (include/sdtrain/h5util.h). */
#include "sdtrain/h5util.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/h5check.h"
#include "sdtrain/runtime.h"

hid_t sd_h5_create_parallel(const char *path, MPI_Comm comm, sd_err *e)
{
    hid_t fapl, file;
    int created, n_created, size;

    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    SD_H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
    SD_H5_CHECK(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
    SD_H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, 1));
    SD_H5_CHECK(H5Pset_coll_metadata_write(fapl, 1));
    file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    created = file >= 0;
    if (!created) {
        /* now: the next HDF5 call clears the error stack */
        char h5msg[512];
        sd_err_set(e, "cannot create '%s': %s", path, sd_h5_error_string(h5msg, sizeof h5msg));
    }
    SD_H5_CHECK(H5Pclose(fapl));
    SD_MPI_CHECK(MPI_Allreduce(&created, &n_created, 1, MPI_INT, MPI_SUM, comm));
    if (n_created != 0 && n_created != size)
        sd_fatalf(__FILE__, __LINE__, __func__, "H5Fcreate",
                  "'%s' was created on %d of %d ranks; cannot continue without a hang", path,
                  n_created, size);
    return created ? file : -1;
}

void sd_h5_end_job_if_write_failed(MPI_Comm comm, int failed, sd_err *e, const char *path,
                                   const char *what_stays)
{
    int rank;
    char space[4200] = "";
    if (sd_agree(comm, failed, e) == 0)
        return;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) { /* a full disk is the usual cause: say how full */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
        const double avail = sd_fs_free_bytes(dir);
        if (avail >= 0)
            snprintf(space, sizeof space, "; the file system of %s has %.1f MiB free", dir,
                     avail / 1048576.0);
    }
    /* one MPI_Abort, by rank 0 after its message (Open MPI can lose the output of ranks that
     * abort at once); the others follow should it not */
    struct timespec pause = {rank == 0 ? 0 : 5, rank == 0 ? 200000000 : 0};
    if (rank == 0)
        fprintf(stderr, "sdtrain: %s%s; ending the job (a parallel HDF5 file cannot be closed "
                        "after a failed collective write); %s\n", e->msg, space, what_stays);
    fflush(stdout);
    fflush(stderr);
    nanosleep(&pause, NULL);
    sd_abort(SD_EXIT_FAILURE);
}
