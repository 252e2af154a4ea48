/* Parallel HDF5 helpers (include/sdtrain/h5util.h). */
#include "sdtrain/h5util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/h5check.h"
#include "sdtrain/log.h"
#include "sdtrain/progress.h"
#include "sdtrain/runtime.h"

/* A hint that passes sd_io_hints_parse must pass MPI_Info_set too, or the job would end at its
 * first file instead of at --check. */
_Static_assert(SD_IO_HINT_KEY_MAX < MPI_MAX_INFO_KEY && SD_IO_HINT_VALUE_MAX < MPI_MAX_INFO_VAL,
               "&run io_hints accepts keys or values longer than this MPI's MPI_Info_set");

static struct {
    sd_io_hint *hints; /* room for SD_IO_HINTS_MAX, from sd_h5_set_file_options */
    int n_hints;
    int64_t alignment;
    int reported;
} file_options = {NULL, 0, 1048576, 0};

int sd_h5_set_file_options(const char *hints, int64_t alignment, sd_err *e)
{
    sd_io_hint *parsed = sd_xmalloc(SD_IO_HINTS_MAX * sizeof *parsed);
    int n;
    SD_CHECK(alignment >= 0, "alignment %lld", (long long)alignment);
    if (sd_io_hints_parse(hints ? hints : "", parsed, SD_IO_HINTS_MAX, &n, e) != 0) {
        free(parsed);
        return -1;
    }
    free(file_options.hints);
    file_options.hints = parsed;
    file_options.n_hints = n;
    file_options.alignment = alignment;
    file_options.reported = 0;
    return 0;
}

double sd_h5_alignment_slack(double object_bytes, double n_objects)
{
    const double unit = (double)file_options.alignment;
    return unit > 1 && object_bytes >= unit ? n_objects * unit : 0.0;
}

/* Rank 0 of the first file's communicator: each hint with what the opened file reports for it
 * (MPI_File_get_info). What a hint does is up to the MPI-IO layer and the file system: an
 * implementation may report a hint it does not act on, or drop one it does not know. */
static void report_hints_info(MPI_Info info) /* frees info */
{
    char line[4096] = "", *value = sd_xmalloc(MPI_MAX_INFO_VAL + 1);
    size_t len = 0;
    for (int i = 0; i < file_options.n_hints && len < sizeof line - 1; i++) {
        const sd_io_hint *h = &file_options.hints[i];
        int flag = 0;
        if (info != MPI_INFO_NULL)
            MPI_Info_get(info, h->key, MPI_MAX_INFO_VAL, value, &flag);
        if (!flag)
            snprintf(value, MPI_MAX_INFO_VAL + 1, "not reported");
        len += (size_t)snprintf(line + len, sizeof line - len, "%s%s=%s (reported: %s)",
                                i ? ", " : "", h->key, h->value, value);
    }
    if (info != MPI_INFO_NULL)
        MPI_Info_free(&info);
    free(value);
    sd_info("parallel HDF5 files: io_hints %s", line);
}

static void report_hints(hid_t file)
{
    void *handle = NULL;
    MPI_Info info = MPI_INFO_NULL;
    if (H5Fget_vfd_handle(file, H5P_DEFAULT, &handle) < 0 || !handle ||
        MPI_File_get_info(*(MPI_File *)handle, &info) != MPI_SUCCESS)
        info = MPI_INFO_NULL;
    report_hints_info(info);
}

/* &run io_hints as an MPI_Info (the caller frees it), or MPI_INFO_NULL without hints. */
static MPI_Info hints_info(void)
{
    MPI_Info info = MPI_INFO_NULL;
    if (file_options.n_hints > 0) {
        SD_MPI_CHECK(MPI_Info_create(&info));
        for (int i = 0; i < file_options.n_hints; i++) {
            const sd_io_hint *h = &file_options.hints[i];
            SD_MPI_CHECK(MPI_Info_set(info, h->key, h->value));
        }
    }
    return info;
}

/* &run io_alignment on a file-access property list: datasets below one unit are packed. */
static void set_alignment(hid_t fapl)
{
    if (file_options.alignment > 1)
        SD_H5_CHECK(H5Pset_alignment(fapl, (hsize_t)file_options.alignment,
                                     (hsize_t)file_options.alignment));
}

hid_t sd_h5_create_parallel(const char *path, MPI_Comm comm, sd_err *e)
{
    hid_t fapl, file;
    MPI_Info info = MPI_INFO_NULL;
    int created, n_created, size, rank;

    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
    info = hints_info();
    SD_H5_CHECK(H5Pset_fapl_mpio(fapl, comm, info)); /* HDF5 keeps its own copy of info */
    if (info != MPI_INFO_NULL)
        SD_MPI_CHECK(MPI_Info_free(&info));
    SD_H5_CHECK(H5Pset_all_coll_metadata_ops(fapl, 1));
    SD_H5_CHECK(H5Pset_coll_metadata_write(fapl, 1));
    set_alignment(fapl);
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
    if (created && file_options.n_hints > 0 && !file_options.reported) {
        file_options.reported = 1;
        if (rank == 0)
            report_hints(file);
    }
    return created ? file : -1;
}

hid_t sd_h5_create_local(const char *path, sd_err *e)
{
    hid_t fapl, file;
    if (file_options.n_hints > 0) {
        /* the hints act where the file is made (Lustre sets a file's stripes at its creation):
         * made through MPI-IO with them; HDF5 then truncates it, which keeps its layout */
        MPI_Info info = hints_info();
        MPI_File fh;
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0, rc;
        rc = MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_CREATE | MPI_MODE_WRONLY, info, &fh);
        SD_MPI_CHECK(MPI_Info_free(&info));
        if (rc != MPI_SUCCESS) {
            if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
                snprintf(msg, sizeof msg, "MPI error %d", rc);
            return sd_err_set(e, "cannot create '%s' (MPI-IO, with &run io_hints): %s", path, msg);
        }
        if (!file_options.reported) {
            MPI_Info got = MPI_INFO_NULL;
            file_options.reported = 1;
            if (MPI_File_get_info(fh, &got) == MPI_SUCCESS)
                report_hints_info(got);
        }
        MPI_File_close(&fh);
    }
    SD_H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
    SD_H5_CHECK(H5Pset_fapl_sec2(fapl));
    set_alignment(fapl);
    sd_progress_io_enter_path("H5Fcreate", path);
    file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    sd_progress_io_leave();
    if (file < 0) {
        char h5msg[512];
        sd_err_set(e, "cannot create '%s': %s", path, sd_h5_error_string(h5msg, sizeof h5msg));
    }
    SD_H5_CHECK(H5Pclose(fapl));
    return file < 0 ? -1 : file;
}

hid_t sd_h5_fopen(const char *path, unsigned flags, hid_t fapl)
{
    hid_t f;
    sd_progress_io_enter_path("H5Fopen", path);
    f = H5Fopen(path, flags, fapl);
    sd_progress_io_leave();
    return f;
}

void sd_h5_close_local(hid_t file, const char *path, const char *what_stays)
{
    char h5msg[512];
    if (H5Fclose(file) >= 0)
        return;
    fprintf(stderr, "sdtrain: creating '%s' failed: %s; ending the job (HDF5 cannot let go of a "
            "file whose metadata it could not write); %s\n", path,
            sd_h5_error_string(h5msg, sizeof h5msg), what_stays);
    fflush(stdout);
    fflush(stderr);
    sd_abort(SD_EXIT_FAILURE);
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

static void scalar_attr(hid_t loc, const char *name, hid_t file_type, hid_t mem_type,
                        const void *value)
{
    hid_t space, a;
    SD_H5_CHECK(space = H5Screate(H5S_SCALAR));
    SD_H5_CHECK(a = H5Acreate2(loc, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT));
    SD_H5_CHECK(H5Awrite(a, mem_type, value));
    SD_H5_CHECK(H5Aclose(a));
    SD_H5_CHECK(H5Sclose(space));
}

void sd_h5_attr_str(hid_t loc, const char *name, const char *value)
{
    hid_t t;
    SD_H5_CHECK(t = H5Tcopy(H5T_C_S1));
    SD_H5_CHECK(H5Tset_size(t, H5T_VARIABLE));
    SD_H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8));
    scalar_attr(loc, name, t, t, &value);
    SD_H5_CHECK(H5Tclose(t));
}

void sd_h5_attr_i32(hid_t loc, const char *name, int32_t v)
{
    scalar_attr(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &v);
}

void sd_h5_attr_i64(hid_t loc, const char *name, int64_t v)
{
    scalar_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
}

void sd_h5_attr_f64(hid_t loc, const char *name, double v)
{
    scalar_attr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}
