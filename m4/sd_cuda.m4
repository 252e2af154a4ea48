# SD_CHECK_CUDA: optional CUDA backend (nvcc, cudart, cuBLAS/cuBLASLt, cuDNN, NCCL).
# --with-cuda[=DIR] (default: off), --with-cuda-arch=LIST (default 90a; comma-separated).
AC_DEFUN([SD_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the CUDA backend; DIR is the CUDA toolkit (default: off; with no DIR: the directory of nvcc on PATH, else /usr/local/cuda)])],
    [], [with_cuda=no])
  AC_ARG_WITH([cuda-arch],
    [AS_HELP_STRING([--with-cuda-arch=LIST], [GPU architectures, comma-separated compute capabilities such as 90a or 80,90a (default: 90a = H100/H200)])],
    [], [with_cuda_arch=90a])
  AC_ARG_VAR([NVCC], [CUDA compiler])
  AC_ARG_VAR([NVCCFLAGS], [extra flags for nvcc])
  sd_cuda=no
  sd_cuda_version=disabled; sd_cudnn_version=disabled; sd_nccl_version=disabled; sd_cublas_version=disabled
  CUDA_CPPFLAGS=""; CUDA_LIBS=""; NVCC_GENCODE=""
  AS_IF([test "x$with_cuda" != xno], [
    AS_IF([test "x$with_cuda" = xyes], [
      AC_PATH_PROG([sd_nvcc_on_path], [nvcc], [])
      AS_IF([test -n "$sd_nvcc_on_path"], [with_cuda=`dirname "$sd_nvcc_on_path"`; with_cuda=`dirname "$with_cuda"`],
            [with_cuda=/usr/local/cuda])])
    AS_IF([test -z "$NVCC"], [AC_PATH_PROG([NVCC], [nvcc], [], [$with_cuda/bin])])
    AS_IF([test -z "$NVCC" || test ! -x "$NVCC"],
      [AC_MSG_ERROR([--with-cuda: nvcc not found in $with_cuda/bin. Install the CUDA toolkit or give --with-cuda=DIR])])
    sd_cuda_version=`$NVCC --version | sed -n 's/.*release \(@<:@0-9.@:>@*\).*/\1/p'`

    for sd_arch in `echo "$with_cuda_arch" | tr ',' ' '`; do
      AS_CASE([$sd_arch], [@<:@1-9@:>@@<:@0-9@:>@|@<:@1-9@:>@@<:@0-9@:>@a|@<:@1-9@:>@@<:@0-9@:>@@<:@0-9@:>@|@<:@1-9@:>@@<:@0-9@:>@@<:@0-9@:>@a|@<:@1-9@:>@@<:@0-9@:>@f|@<:@1-9@:>@@<:@0-9@:>@@<:@0-9@:>@f], [],
        [AC_MSG_ERROR([--with-cuda-arch: '$sd_arch' is not a compute capability like 80, 90 or 90a])])
      NVCC_GENCODE="$NVCC_GENCODE -gencode=arch=compute_$sd_arch,code=sm_$sd_arch"
    done

    sd_cuda_libdir="$with_cuda/lib64"
    AS_IF([test -d "$sd_cuda_libdir"], [], [sd_cuda_libdir="$with_cuda/lib"])
    CUDA_CPPFLAGS="-I$with_cuda/include"
    CUDA_LIBS="-L$sd_cuda_libdir -Wl,-rpath,$sd_cuda_libdir -lnccl -lcudnn -lcublasLt -lcublas -lcudart -lstdc++ -lm"
    sd_save_CPPFLAGS="$CPPFLAGS"; sd_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS $CUDA_CPPFLAGS"
    for sd_h in cuda_runtime.h cublasLt.h cudnn.h nccl.h; do
      AC_MSG_CHECKING([for $sd_h])
      AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[#include <$sd_h>]], [[]])], [AC_MSG_RESULT([yes])],
        [AC_MSG_RESULT([no])
         AC_MSG_ERROR([--with-cuda: $sd_h not found under $with_cuda/include (cuDNN and NCCL must be installed beside the toolkit or on the default include path)])])
    done
    LIBS="$CUDA_LIBS $LIBS"
    AC_MSG_CHECKING([whether cudart, cuBLAS, cuBLASLt, cuDNN and NCCL link])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublasLt.h>
#include <cudnn.h>
#include <nccl.h>]], [[int n; cudaGetDeviceCount(&n); (void)cublasLtGetVersion(); (void)cudnnGetVersion(); ncclGetVersion(&n);]])],
      [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no])
       AC_MSG_ERROR([--with-cuda: cannot link '$CUDA_LIBS'])])
    AC_COMPUTE_INT([sd_cudnn_major], [CUDNN_MAJOR], [[#include <cudnn.h>]], [sd_cudnn_major=?])
    AC_COMPUTE_INT([sd_cudnn_minor], [CUDNN_MINOR], [[#include <cudnn.h>]], [sd_cudnn_minor=?])
    AC_COMPUTE_INT([sd_cudnn_patch], [CUDNN_PATCHLEVEL], [[#include <cudnn.h>]], [sd_cudnn_patch=?])
    AC_COMPUTE_INT([sd_nccl_major], [NCCL_MAJOR], [[#include <nccl.h>]], [sd_nccl_major=?])
    AC_COMPUTE_INT([sd_nccl_minor], [NCCL_MINOR], [[#include <nccl.h>]], [sd_nccl_minor=?])
    AC_COMPUTE_INT([sd_nccl_patch], [NCCL_PATCH], [[#include <nccl.h>]], [sd_nccl_patch=?])
    AC_COMPUTE_INT([sd_cublas_v], [CUBLAS_VERSION], [[#include <cublasLt.h>]], [sd_cublas_v=?])
    sd_cudnn_version="$sd_cudnn_major.$sd_cudnn_minor.$sd_cudnn_patch"
    sd_nccl_version="$sd_nccl_major.$sd_nccl_minor.$sd_nccl_patch"
    sd_cublas_version="$sd_cublas_v"
    CPPFLAGS="$sd_save_CPPFLAGS"; LIBS="$sd_save_LIBS"
    sd_cuda=yes
    AC_DEFINE([SD_HAVE_CUDA], [1], [Define to 1 when the CUDA backend is built])
    AC_DEFINE_UNQUOTED([SD_CUDA_ARCHS], ["$with_cuda_arch"], [GPU architectures compiled in])
  ])
  AM_CONDITIONAL([SD_HAVE_CUDA], [test "$sd_cuda" = yes])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_LIBS])
  AC_SUBST([NVCC_GENCODE])
])
