/* JSON configuration files (config.json, model_index.json, scheduler_config.json, vocab.json):
 * reading with errors that name the file, line and column, and typed access to an object's keys
 * with errors that name the file and key. */
#ifndef SDTRAIN_JSON_FILE_H
#define SDTRAIN_JSON_FILE_H

#include <stddef.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_object;

/* The largest JSON file read (configurations are a few KiB; a tokenizer's vocab.json ~2 MiB). */
#define SD_JSON_FILE_LIMIT ((size_t)64 << 20)

/* Parses len bytes of JSON text (one value, then only white space; text[len] must be '\0', as
 * after a file read into a NUL-terminated buffer). An error names `path` with
 * the line and column where the parser stopped ("path:3:14: invalid JSON: ..."). */
int sd_json_parse(const char *path, const char *text, size_t len, struct json_object **out,
                  sd_err *err);

/* Reads and parses a regular file whose top level must be an object. Errors: missing or
 * unreadable, not a regular file (a FIFO is not waited on), larger than SD_JSON_FILE_LIMIT, a NUL
 * byte, invalid JSON (line and column), another top-level value. */
int sd_json_read_object(const char *path, struct json_object **out, sd_err *err);

/* ---- typed keys of an object, with the first error kept ------------------------------------
 * Each accessor leaves *out as it was when the key is absent or JSON null, and on a wrong type
 * or value records an error (only the first one is kept) and sets `failed`. */
typedef struct sd_jconf {
    const char *path;
    struct json_object *root;
    sd_err *err;
    int failed;
} sd_jconf;

/* sd_json_read_object into j->root; 0 or -1 (then nothing to close). */
int sd_jconf_open(sd_jconf *j, const char *path, sd_err *err);
/* Frees the object; 0, or -1 when an accessor failed. */
int sd_jconf_close(sd_jconf *j);
/* Records an error (unless one is recorded): fmt takes three %s, the path, `key` and `detail`
 * ("" when NULL). Returns -1. */
int sd_jconf_fail(sd_jconf *j, const char *fmt, const char *key, const char *detail);
/* The key's value, JSON null included, or NULL when absent. */
struct json_object *sd_jconf_get(const sd_jconf *j, const char *key);
/* The key's value when present and not null, else NULL. */
struct json_object *sd_jconf_value(const sd_jconf *j, const char *key);
/* An integer (a number with an integral value within +-1e9). */
int sd_jconf_int_value(sd_jconf *j, const char *key, struct json_object *v, int *out);
void sd_jconf_int(sd_jconf *j, const char *key, int *out);
/* Any number (integer or not; JSON's non-standard NaN and Infinity included). */
void sd_jconf_double(sd_jconf *j, const char *key, double *out);
/* true or false only. */
void sd_jconf_bool(sd_jconf *j, const char *key, int *out);
/* A string; *out points into the object (valid until close). */
void sd_jconf_string(sd_jconf *j, const char *key, const char **out);
/* A string that must be one of `allowed` ("a|b|c"); *idx gets its index. */
void sd_jconf_choice(sd_jconf *j, const char *key, const char *allowed, int *idx);
/* A feature sdtrain does not implement: the key must be absent, null or false. */
void sd_jconf_absent(sd_jconf *j, const char *key);

#ifdef __cplusplus
}
#endif
#endif
