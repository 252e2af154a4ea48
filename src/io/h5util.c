/* Parallel HDF5 helpers (include/sdtrain/h5util.h). */
#include "sdtrain/h5util.h"

#include "sdtrain/check.h"
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
