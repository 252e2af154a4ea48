#!/bin/sh
# doc/namelist.md must be what the schema generates (regenerate with: make namelist-doc).
. "$top_srcdir/tests/lib.sh"

run gen "$SDTOOL" namelist-doc --out "$TMP/namelist.md"
expect_rc gen 0
diff -u "$top_srcdir/doc/namelist.md" "$TMP/namelist.md" >"$TMP/diff" ||
    { cat "$TMP/diff" >&2; fail "doc/namelist.md is stale: run 'make namelist-doc' and commit it"; }
pass "doc/namelist.md is current"
