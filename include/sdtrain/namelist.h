/* Fortran-namelist reader: text -> groups of assignments with source positions (no schema). */
#ifndef SDTRAIN_NAMELIST_H
#define SDTRAIN_NAMELIST_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NL_NULL = 0, /* an empty slot: "a = 1, , 3" or "3*" (value left unchanged in Fortran) */
    NL_INT,
    NL_REAL,
    NL_LOGICAL,
    NL_STRING
} nl_kind;

typedef struct nl_value {
    nl_kind kind;
    int64_t i;   /* NL_INT */
    double r;    /* NL_REAL */
    int b;       /* NL_LOGICAL: 0 or 1 */
    char *s;     /* NL_STRING: UTF-8, quotes removed, doubled quotes collapsed, NUL-terminated */
    int line;    /* 1-based position of the value's first character (of "3*x": of the "3") */
    int col;
} nl_value;

typedef struct nl_assign {
    char *key;        /* lower-cased */
    int64_t index;    /* 1-based element index of "key(i) = ...", or 0 when no index was given */
    int line, col;    /* position of the key's first character */
    size_t n_values;  /* repeat counts already expanded: "3*0.5" gives three values */
    nl_value *values;
} nl_assign;

typedef struct nl_group {
    char *name;       /* lower-cased, without the leading & or $ */
    int line, col;    /* position of the & or $ */
    int end_line, end_col; /* position of the terminating / or &end or $end */
    size_t n_assigns;
    nl_assign *assigns; /* in source order; the same key may appear more than once */
} nl_group;

typedef struct nl_file {
    char *source;     /* name used in messages (a path, or e.g. "--set[1]") */
    size_t n_groups;
    nl_group *groups; /* in source order; the same group name may appear more than once */
} nl_file;

/* Parses `len` bytes of namelist text. `source` names the text in error messages.
 * Returns 0 on success; on failure returns -1, fills `err` with "source:line:col: message"
 * (err->line/col set) and leaves `out` empty (nothing to free). */
int nl_parse(const char *text, size_t len, const char *source, nl_file *out, sd_err *err);

/* Reads the file at `path` and parses it; I/O errors name the path. */
int nl_parse_file(const char *path, nl_file *out, sd_err *err);

void nl_free(nl_file *f);

/* Human-readable name of a value kind ("integer", "real", "logical", "string", "null"). */
const char *nl_kind_name(nl_kind k);

#ifdef __cplusplus
}
#endif
#endif
