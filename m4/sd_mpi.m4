# SD_PROG_MPICC: use the MPI compiler wrapper as CC (MPI is mandatory).
# Honours a CC given by the user (it must still compile and link MPI programs).
AC_DEFUN([SD_PROG_MPICC], [
  AC_ARG_VAR([MPICC], [MPI C compiler wrapper (default: mpicc)])
  AS_IF([test -z "$CC"], [
    AS_IF([test -n "$MPICC"], [CC="$MPICC"], [
      AC_CHECK_PROGS([sd_mpicc], [mpicc mpicc.openmpi], [])
      AS_IF([test -z "$sd_mpicc"],
        [AC_MSG_ERROR([no MPI C compiler wrapper (mpicc) found.
  sdtrain needs MPI. On Debian/Ubuntu: apt-get install libopenmpi-dev openmpi-bin
  or point to one with ./configure MPICC=/path/to/mpicc])])
      CC="$sd_mpicc"])])
])

# SD_CHECK_MPI_WORKS: after AC_PROG_CC, prove that CC compiles and links MPI code.
AC_DEFUN([SD_CHECK_MPI_WORKS], [
  AC_MSG_CHECKING([whether $CC compiles and links MPI programs])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
      [[int p; MPI_Init_thread(0, 0, MPI_THREAD_FUNNELED, &p); MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, 0); MPI_Finalize();]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([$CC cannot build MPI-3 programs (mpi.h, MPI_Comm_split_type).
  sdtrain must be compiled with the MPI compiler wrapper: apt-get install libopenmpi-dev])])
  sd_mpi_version=`( $CC --showme:version 2>/dev/null || mpirun --version 2>/dev/null ) | head -n 1 | sed 's/^mpicc: *//'`
  AS_IF([test -z "$sd_mpi_version"], [sd_mpi_version="unknown MPI"])

  # One launcher for the MPI tests, overridable: make check MPIEXEC="srun -n"
  AC_ARG_VAR([MPIEXEC], [launcher for MPI tests (default: mpirun --oversubscribe, plus the root flags as root)])
  AS_IF([test -z "$MPIEXEC"], [
    AC_PATH_PROGS([sd_mpirun], [mpirun mpiexec], [])
    AS_IF([test -z "$sd_mpirun"], [AC_MSG_WARN([mpirun not found: MPI tests will be skipped])
                                   MPIEXEC=""],
          [MPIEXEC="$sd_mpirun --oversubscribe"
           AS_IF([test "`id -u`" = 0], [MPIEXEC="$MPIEXEC --allow-run-as-root"])])])
])
