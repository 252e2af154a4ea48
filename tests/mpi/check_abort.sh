#!/bin/sh
# A failed check, MPI call or allocation on one rank ends the whole job (no hang), reported
# once with the rank, file, function and line.
. "$top_srcdir/tests/lib.sh"
need_mpi
prog="$top_builddir/tests/mpi/check_abort"

mpi check 3 "$prog" check
[ "$RC" != 0 ] || fail "check: job exited 0"
expect_count check err "[rank 2]" 1
expect_in check err "fatal: "
expect_in check err "check_abort.c:main():"
expect_in check err "check failed: shards > 0: no shards in '/data/x'"
expect_not_in check out "passed the barrier"

mpi mpicall 3 "$prog" mpi
[ "$RC" != 0 ] || fail "mpi: job exited 0"
expect_in mpicall err "MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD)"
expect_in mpicall err "[rank 2]"
expect_not_in mpicall out "passed the barrier"

mpi alloc 2 "$prog" alloc
[ "$RC" != 0 ] || fail "alloc: job exited 0"
expect_in alloc err "out of memory: cannot allocate 4611686018427387904 bytes"
expect_not_in alloc out "passed the barrier"
pass "fatal errors end the whole job"
