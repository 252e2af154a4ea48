# SD_CHECK_HDF5_PARALLEL: find parallel HDF5 and prove it is the parallel build.
# Order: --with-hdf5=DIR, pkg-config (hdf5-openmpi, hdf5-mpi), h5pcc -shlib -show.
AC_DEFUN([SD_CHECK_HDF5_PARALLEL], [
  AC_ARG_WITH([hdf5],
    [AS_HELP_STRING([--with-hdf5=DIR], [parallel HDF5 installation prefix (default: pkg-config hdf5-openmpi, then h5pcc)])],
    [], [with_hdf5=check])
  AS_IF([test "x$with_hdf5" = xno],
    [AC_MSG_ERROR([HDF5 cannot be disabled: sdtrain writes and reads parallel HDF5 shards])])
  sd_hdf5_how=""
  AS_IF([test "x$with_hdf5" != xcheck && test "x$with_hdf5" != xyes], [
    HDF5_CPPFLAGS="-I$with_hdf5/include"
    HDF5_LIBS="-L$with_hdf5/lib -Wl,-rpath,$with_hdf5/lib -lhdf5"
    sd_hdf5_how="--with-hdf5=$with_hdf5"
  ], [
    PKG_CHECK_MODULES([HDF5_PC], [hdf5-openmpi], [sd_hdf5_how="pkg-config hdf5-openmpi"],
      [PKG_CHECK_MODULES([HDF5_PC], [hdf5-mpi], [sd_hdf5_how="pkg-config hdf5-mpi"], [:])])
    AS_IF([test -n "$sd_hdf5_how"], [
      HDF5_CPPFLAGS="$HDF5_PC_CFLAGS"
      HDF5_LIBS="$HDF5_PC_LIBS"
    ], [
      AC_PATH_PROG([H5PCC], [h5pcc], [])
      AS_IF([test -n "$H5PCC"], [
        sd_h5show=`$H5PCC -shlib -show 2>/dev/null`
        HDF5_CPPFLAGS=`for w in $sd_h5show; do case $w in -I*|-D*) printf '%s ' "$w";; esac; done`
        HDF5_LIBS=`for w in $sd_h5show; do case $w in -L*|-l*|-Wl*) printf '%s ' "$w";; esac; done`
        sd_hdf5_how="$H5PCC -shlib"
      ])
    ])
  ])
  AS_IF([test -z "$sd_hdf5_how"],
    [AC_MSG_ERROR([parallel HDF5 not found.
  On Debian/Ubuntu: apt-get install libhdf5-openmpi-dev
  elsewhere: ./configure --with-hdf5=DIR (an HDF5 built with --enable-parallel)])])

  sd_save_CPPFLAGS="$CPPFLAGS"; sd_save_LIBS="$LIBS"
  CPPFLAGS="$CPPFLAGS $HDF5_CPPFLAGS"; LIBS="$HDF5_LIBS $LIBS"
  AC_MSG_CHECKING([for hdf5.h ($sd_hdf5_how)])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>]], [[]])], [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([hdf5.h not usable with HDF5 flags '$HDF5_CPPFLAGS'. On Debian: apt-get install libhdf5-openmpi-dev])])
  AC_MSG_CHECKING([whether HDF5 is the parallel (MPI-IO) build])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>
#ifndef H5_HAVE_PARALLEL
#error "serial HDF5"
#endif]], [[]])], [AC_MSG_RESULT([yes]); sd_hdf5_parallel=yes],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([the HDF5 found ($sd_hdf5_how) is a serial build (H5_HAVE_PARALLEL undefined).
  sdtrain writes shards collectively and needs parallel HDF5. On Debian/Ubuntu: apt-get install libhdf5-openmpi-dev
  (and make sure HDF5 flags do not point at libhdf5-dev's serial headers), or ./configure --with-hdf5=DIR])])
  AC_MSG_CHECKING([for H5Pset_fapl_mpio in the HDF5 library])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <hdf5.h>]],
      [[hid_t p = H5Pcreate(H5P_FILE_ACCESS); H5Pset_fapl_mpio(p, MPI_COMM_WORLD, MPI_INFO_NULL);]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([cannot link a parallel HDF5 program with '$HDF5_LIBS'. On Debian: apt-get install libhdf5-openmpi-dev])])
  AC_COMPUTE_INT([sd_h5_major], [H5_VERS_MAJOR], [[#include <hdf5.h>]], [sd_h5_major=?])
  AC_COMPUTE_INT([sd_h5_minor], [H5_VERS_MINOR], [[#include <hdf5.h>]], [sd_h5_minor=?])
  AC_COMPUTE_INT([sd_h5_release], [H5_VERS_RELEASE], [[#include <hdf5.h>]], [sd_h5_release=?])
  sd_hdf5_version="$sd_h5_major.$sd_h5_minor.$sd_h5_release"
  CPPFLAGS="$sd_save_CPPFLAGS"; LIBS="$sd_save_LIBS"
  AC_SUBST([HDF5_CPPFLAGS])
  AC_SUBST([HDF5_LIBS])
])
