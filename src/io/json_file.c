/* JSON configuration files: reading with located errors, typed keys with named errors. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/json_file.h"

int sd_json_parse(const char *path, const char *text, size_t len, json_object **out, sd_err *err)
{
    *out = NULL;
    if (len >= (size_t)INT32_MAX)
        return sd_err_set(err, "%s: larger than 2 GiB, not a JSON configuration", path);
    json_tokener *jt = json_tokener_new_ex(JSON_TOKENER_DEFAULT_DEPTH);
    SD_CHECK(jt != NULL, "json_tokener_new_ex failed");
    /* the terminating NUL too: it ends a top-level number or literal ("null", "12") */
    json_object *o = json_tokener_parse_ex(jt, text, (int)len + 1);
    enum json_tokener_error je = json_tokener_get_error(jt);
    size_t end = json_tokener_get_parse_end(jt);
    json_tokener_free(jt);
    if (je != json_tokener_success) { /* (success with NULL is the JSON value null) */
        int line = 1, col = 1;
        for (size_t i = 0; i < end && i < len; i++) {
            if (text[i] == '\n')
                line++, col = 1;
            else
                col++;
        }
        json_object_put(o);
        return sd_err_at(err, path, line, col, "invalid JSON: %s",
                         je == json_tokener_continue || end >= len ? "unexpected end of file"
                             : json_tokener_error_desc(je));
    }
    for (size_t i = end; i < len; i++)
        if (text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t') {
            json_object_put(o);
            return sd_err_set(err, "%s: invalid JSON: text after the top-level value at byte %zu",
                              path, i);
        }
    *out = o;
    return 0;
}

int sd_json_read_object(const char *path, json_object **out, sd_err *err)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    if (sd_read_regular_file(path, SD_JSON_FILE_LIMIT, "a JSON configuration", &text, &len, err) != 0)
        return -1;
    if (strlen(text) != len) {
        free(text);
        return sd_err_set(err, "%s: contains a NUL byte, not a JSON text file", path);
    }
    int rc = sd_json_parse(path, text, len, out, err);
    free(text);
    if (rc == 0 && !json_object_is_type(*out, json_type_object)) {
        json_object_put(*out);
        *out = NULL;
        return sd_err_set(err, "%s: invalid JSON (the top level must be an object)", path);
    }
    return rc;
}

/* ---- typed keys ---------------------------------------------------------------------------- */

int sd_jconf_open(sd_jconf *j, const char *path, sd_err *err)
{
    memset(j, 0, sizeof *j);
    j->path = path;
    j->err = err;
    return sd_json_read_object(path, &j->root, err);
}

int sd_jconf_close(sd_jconf *j)
{
    json_object_put(j->root);
    j->root = NULL;
    return j->failed ? -1 : 0;
}

int sd_jconf_fail(sd_jconf *j, const char *fmt, const char *key, const char *detail)
{
    if (!j->failed)
        sd_err_set(j->err, fmt, j->path, key, detail ? detail : "");
    j->failed = 1;
    return -1;
}

json_object *sd_jconf_get(const sd_jconf *j, const char *key)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(j->root, key, &v))
        return NULL;
    return v;
}

json_object *sd_jconf_value(const sd_jconf *j, const char *key)
{
    json_object *v = sd_jconf_get(j, key);
    return v && !json_object_is_type(v, json_type_null) ? v : NULL;
}

int sd_jconf_int_value(sd_jconf *j, const char *key, json_object *v, int *out)
{
    if (json_object_is_type(v, json_type_int)) {
        const int64_t x = json_object_get_int64(v);
        if (x < -1000000000 || x > 1000000000)
            return sd_jconf_fail(j, "%s: '%s' is out of range%s", key, NULL);
        *out = (int)x;
        return 0;
    }
    if (json_object_is_type(v, json_type_double)) {
        const double d = json_object_get_double(v);
        if (d == floor(d) && fabs(d) < 1e9) {
            *out = (int)d;
            return 0;
        }
    }
    return sd_jconf_fail(j, "%s: '%s' must be an integer%s", key, NULL);
}

void sd_jconf_int(sd_jconf *j, const char *key, int *out)
{
    json_object *v = sd_jconf_value(j, key);
    if (v)
        sd_jconf_int_value(j, key, v, out);
}

void sd_jconf_double(sd_jconf *j, const char *key, double *out)
{
    json_object *v = sd_jconf_value(j, key);
    if (!v)
        return;
    if (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double))
        *out = json_object_get_double(v);
    else
        sd_jconf_fail(j, "%s: '%s' must be a number%s", key, NULL);
}

void sd_jconf_bool(sd_jconf *j, const char *key, int *out)
{
    json_object *v = sd_jconf_value(j, key);
    if (!v)
        return;
    if (json_object_is_type(v, json_type_boolean))
        *out = json_object_get_boolean(v);
    else
        sd_jconf_fail(j, "%s: '%s' must be true or false%s", key, NULL);
}

void sd_jconf_string(sd_jconf *j, const char *key, const char **out)
{
    json_object *v = sd_jconf_value(j, key);
    if (!v)
        return;
    if (json_object_is_type(v, json_type_string))
        *out = json_object_get_string(v);
    else
        sd_jconf_fail(j, "%s: '%s' must be a string%s", key, NULL);
}

void sd_jconf_choice(sd_jconf *j, const char *key, const char *allowed, int *idx)
{
    const char *s = NULL, *p = allowed;
    int i = 0;
    sd_jconf_string(j, key, &s);
    if (!s)
        return;
    while (*p) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (strlen(s) == len && strncmp(s, p, len) == 0) {
            *idx = i;
            return;
        }
        p += len + (bar ? 1 : 0);
        i++;
    }
    char detail[256];
    snprintf(detail, sizeof detail, " (value '%.80s'; sdtrain implements: %s)", s, allowed);
    sd_jconf_fail(j, "%s: unsupported setting '%s'%s", key, detail);
}

void sd_jconf_absent(sd_jconf *j, const char *key)
{
    json_object *v = sd_jconf_value(j, key);
    if (v && !(json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v)))
        sd_jconf_fail(j, "%s: '%s' is set, but sdtrain does not implement that feature%s", key,
                      NULL);
}
