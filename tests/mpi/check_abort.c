/* Helper for check_abort.sh: one rank fails a check while the others wait in a collective;
 * the whole job must end (MPI_Abort), with one report naming rank, file, function and line. */
#include <stdio.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/runtime.h"

int main(int argc, char **argv)
{
    int rank, size;
    const char *what = argc > 1 ? argv[1] : "check";
    sd_mpi_start(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == size - 1) {
        if (!strcmp(what, "check")) {
            int shards = 0;
            SD_CHECK(shards > 0, "no shards in '%s'", "/data/x");
        } else if (!strcmp(what, "mpi")) {
            int x = 0;
            /* an invalid destination rank: the MPI library reports an error code */
            SD_MPI_CHECK(MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD));
        } else if (!strcmp(what, "alloc")) {
            void *p = sd_xmalloc((size_t)1 << 62);
            printf("unexpected allocation %p\n", p);
        }
    }
    /* The others wait here forever unless the failing rank takes the job down. */
    SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    printf("rank %d passed the barrier\n", rank);
    MPI_Finalize();
    return 0;
}
