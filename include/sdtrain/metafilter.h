/* &data filter: which samples preprocessing keeps, by their metadata (the .json beside each image
 * of an img2dataset folder or webdataset tar: width, original_width, punsafe, AESTHETIC_SCORE,
 * status, ...). doc/datasets.md "Filtering by metadata".
 *
 * Syntax: conditions joined by ',' or 'and' (all must hold), each KEY OP VALUE:
 *   KEY    a member of the JSON object: letters, digits, '_' and '-'; '.' steps into a nested
 *          object (exif.Orientation)
 *   OP     < <= > >= == !=
 *   VALUE  a finite number, or a string in double quotes (\" and \\ inside) for == and != only
 * e.g.  original_width >= 512, original_height >= 512, punsafe < 0.1, status == "success"
 *
 * A JSON number compares as a double, true and false as 1 and 0; a string compares byte for
 * byte. A member that is missing or null, of the other kind (a string where a number is asked,
 * an object), a .json that is missing, unreadable or no JSON object: the sample's metadata
 * cannot answer, which sd_meta_filter_eval tells apart from a condition that is false. */
#ifndef SDTRAIN_METAFILTER_H
#define SDTRAIN_METAFILTER_H

#include <stddef.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_FILTER_MAX_CONDS 16
#define SD_FILTER_KEY_MAX 128
#define SD_FILTER_STR_MAX 256

typedef enum sd_filter_op {
    SD_FILTER_LT,
    SD_FILTER_LE,
    SD_FILTER_GT,
    SD_FILTER_GE,
    SD_FILTER_EQ,
    SD_FILTER_NE
} sd_filter_op;

typedef struct sd_filter_cond {
    char key[SD_FILTER_KEY_MAX]; /* as written, dots included */
    sd_filter_op op;
    int is_string;               /* compares with str, else with num */
    double num;
    char str[SD_FILTER_STR_MAX]; /* unescaped, NUL-terminated (no NUL inside) */
} sd_filter_cond;

typedef struct sd_meta_filter {
    int n; /* 0: no filter, every sample passes */
    sd_filter_cond c[SD_FILTER_MAX_CONDS];
} sd_meta_filter;

/* Parses `text` ('' or blanks only: no filter). -1 with a message that quotes the text near the
 * problem and says what was expected (src/config/metafilter.c). */
int sd_meta_filter_parse(const char *text, sd_meta_filter *f, sd_err *err);

/* 1 when a and b hold the same conditions in the same order (the same filter however it was
 * spaced or joined: 'a>1,b<2' and 'a > 1 and b < 2'), else 0. */
int sd_meta_filter_equal(const sd_meta_filter *a, const sd_meta_filter *b);

/* "<=" etc. */
const char *sd_filter_op_name(sd_filter_op op);

/* Verdict of f on one sample's JSON bytes (json NULL: the sample has no .json):
 * 1 every condition holds, 0 one does not (why: the first that fails, with the value found),
 * -1 the metadata cannot answer (why says what is missing or wrong). Thread-safe
 * (src/data/metafilter_eval.c, json-c). */
int sd_meta_filter_eval(const sd_meta_filter *f, const char *json, size_t len, char *why,
                        size_t why_size);

/* The same verdict and reason, and with each (f->n entries, may be NULL) the verdict of every
 * condition alone, from one parse of the JSON (sdtool filter's table): -1 for all of them when
 * the metadata is missing or no JSON object. */
int sd_meta_filter_eval_each(const sd_meta_filter *f, const char *json, size_t len, int *each,
                             char *why, size_t why_size);

#ifdef __cplusplus
}
#endif

#endif
