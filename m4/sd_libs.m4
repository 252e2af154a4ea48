# Detection of the required libraries other than MPI and HDF5.
# Each macro sets <NAME>_CFLAGS/<NAME>_LIBS and fails with the Debian package to install.

# SD_REQUIRE_PKG(VAR, pkg-config module, header, function, fallback -l, debian package, purpose)
AC_DEFUN([SD_REQUIRE_PKG], [
  PKG_CHECK_MODULES([$1], [$2], [sd_found=yes], [sd_found=no])
  AS_IF([test "$sd_found" = no], [
    $1_CFLAGS=""
    $1_LIBS="$5"
  ])
  sd_save_CPPFLAGS="$CPPFLAGS"; sd_save_LIBS="$LIBS"
  CPPFLAGS="$CPPFLAGS $$1_CFLAGS"; LIBS="$$1_LIBS $LIBS"
  AC_MSG_CHECKING([for $4 in $3 ($7)])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <$3>]], [[void *p = (void *)&$4; (void)p;]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([$7 is required: cannot compile and link against $3 / $4.
  On Debian/Ubuntu: apt-get install $6])])
  CPPFLAGS="$sd_save_CPPFLAGS"; LIBS="$sd_save_LIBS"
  AC_SUBST([$1_CFLAGS])
  AC_SUBST([$1_LIBS])
])

AC_DEFUN([SD_CHECK_TURBOJPEG], [
  SD_REQUIRE_PKG([TURBOJPEG], [libturbojpeg], [turbojpeg.h], [tjDecompress2], [-lturbojpeg],
                 [libturbojpeg0-dev], [libjpeg-turbo (TurboJPEG API)])
  sd_turbojpeg_version=`$PKG_CONFIG --modversion libturbojpeg 2>/dev/null || echo found`
])

AC_DEFUN([SD_CHECK_PNG], [
  SD_REQUIRE_PKG([PNG], [libpng], [png.h], [png_create_read_struct], [-lpng],
                 [libpng-dev], [libpng])
  sd_png_version=`$PKG_CONFIG --modversion libpng 2>/dev/null || echo found`
])

AC_DEFUN([SD_CHECK_JSONC], [
  SD_REQUIRE_PKG([JSONC], [json-c], [json-c/json.h], [json_tokener_parse_verbose], [-ljson-c],
                 [libjson-c-dev], [json-c (diffusers config.json files)])
  sd_jsonc_version=`$PKG_CONFIG --modversion json-c 2>/dev/null || echo found`
])

AC_DEFUN([SD_CHECK_LIBARCHIVE], [
  SD_REQUIRE_PKG([LIBARCHIVE], [libarchive], [archive.h], [archive_read_new], [-larchive],
                 [libarchive-dev], [libarchive (webdataset tar shards)])
  sd_libarchive_version=`$PKG_CONFIG --modversion libarchive 2>/dev/null || echo found`
])

# SD_CHECK_CBLAS: a CBLAS with cblas_sgemm; OpenBLAS preferred.
AC_DEFUN([SD_CHECK_CBLAS], [
  AC_ARG_WITH([blas],
    [AS_HELP_STRING([--with-blas=LIBS], [link flags of a CBLAS library (default: pkg-config openblas, then -lopenblas, -lcblas, -lblas)])],
    [], [with_blas=check])
  sd_save_CPPFLAGS="$CPPFLAGS"; sd_save_LIBS="$LIBS"
  BLAS_CFLAGS=""; BLAS_LIBS=""
  AS_IF([test "x$with_blas" != xcheck && test "x$with_blas" != xyes], [BLAS_LIBS="$with_blas"], [
    PKG_CHECK_MODULES([OPENBLAS_PC], [openblas], [BLAS_CFLAGS="$OPENBLAS_PC_CFLAGS"; BLAS_LIBS="$OPENBLAS_PC_LIBS"], [:])
  ])
  CPPFLAGS="$CPPFLAGS $BLAS_CFLAGS"
  AC_CHECK_HEADER([cblas.h], [],
    [AC_MSG_ERROR([cblas.h not found. On Debian/Ubuntu: apt-get install libopenblas-dev])])
  sd_blas_name=""
  AS_IF([test -n "$BLAS_LIBS"], [
    LIBS="$BLAS_LIBS $sd_save_LIBS"
    AC_MSG_CHECKING([for cblas_sgemm in $BLAS_LIBS])
    AC_LINK_IFELSE([AC_LANG_CALL([], [cblas_sgemm])], [AC_MSG_RESULT([yes]); sd_blas_name="$BLAS_LIBS"],
                   [AC_MSG_RESULT([no])])
  ])
  AS_IF([test -z "$sd_blas_name"], [
    LIBS="$sd_save_LIBS"
    AC_SEARCH_LIBS([cblas_sgemm], [openblas cblas blas], [
      AS_CASE([$ac_cv_search_cblas_sgemm], ["none required"], [BLAS_LIBS=""], [BLAS_LIBS="$ac_cv_search_cblas_sgemm"])
      sd_blas_name="$ac_cv_search_cblas_sgemm"],
      [AC_MSG_ERROR([no CBLAS library with cblas_sgemm found. On Debian/Ubuntu: apt-get install libopenblas-dev
  or name one with ./configure --with-blas="-L/path -lopenblas"])])
  ])
  AS_CASE([$sd_blas_name], [*openblas*], [sd_blas_name="OpenBLAS ($sd_blas_name)"])
  CPPFLAGS="$sd_save_CPPFLAGS"; LIBS="$sd_save_LIBS"
  AC_SUBST([BLAS_CFLAGS])
  AC_SUBST([BLAS_LIBS])
])

AC_DEFUN([SD_CHECK_ZLIB], [
  SD_REQUIRE_PKG([ZLIB], [zlib], [zlib.h], [gzopen], [-lz], [zlib1g-dev],
                 [zlib (the CLIP tokenizer's .gz vocabulary)])
  sd_zlib_version=`$PKG_CONFIG --modversion zlib 2>/dev/null || echo found`
])
