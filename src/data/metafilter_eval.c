/* &data filter's verdict on one sample's .json (include/sdtrain/metafilter.h). */
#include "sdtrain/metafilter.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The member at the dotted path `key` of obj, or NULL (missing, null, or a step that is no
 * object). */
static json_object *member(json_object *obj, const char *key)
{
    char part[SD_FILTER_KEY_MAX];
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        const size_t n = dot ? (size_t)(dot - p) : strlen(p);
        json_object *next;
        memcpy(part, p, n);
        part[n] = '\0';
        if (!json_object_is_type(obj, json_type_object) ||
            !json_object_object_get_ex(obj, part, &next) || next == NULL)
            return NULL;
        obj = next;
        if (!dot)
            return obj;
        p = dot + 1;
    }
}

static int holds(sd_filter_op op, int cmp)
{
    switch (op) {
    case SD_FILTER_LT: return cmp < 0;
    case SD_FILTER_LE: return cmp <= 0;
    case SD_FILTER_GT: return cmp > 0;
    case SD_FILTER_GE: return cmp >= 0;
    case SD_FILTER_EQ: return cmp == 0;
    case SD_FILTER_NE: return cmp != 0;
    }
    return 0;
}

/* The JSON object of json[0..len) (blanks may follow it), or NULL with why saying what it is
 * instead. */
static json_object *parse_object(const char *json, size_t len, char *why, size_t why_size)
{
    json_tokener *tok = json_tokener_new();
    json_object *root = json_tokener_parse_ex(tok, json, (int)(len > 0x7fffffff ? 0x7fffffff : len));
    const enum json_tokener_error je = json_tokener_get_error(tok);
    size_t end = root ? json_tokener_get_parse_end(tok) : 0;
    json_tokener_free(tok);
    while (root && end < len &&
           (json[end] == ' ' || json[end] == '\n' || json[end] == '\r' || json[end] == '\t'))
        end++;
    if (!root || je != json_tokener_success || end < len) {
        snprintf(why, why_size, "the .json metadata is not valid JSON (%s)",
                 root ? "text after the value"
                 : je == json_tokener_continue ? "it ends inside the value"
                                               : json_tokener_error_desc(je));
        json_object_put(root);
        return NULL;
    }
    if (!json_object_is_type(root, json_type_object)) {
        snprintf(why, why_size, "the .json metadata is not a JSON object");
        json_object_put(root);
        return NULL;
    }
    return root;
}

/* One condition's verdict on the object root: 1, 0, or -1 (cannot answer); why (NULL: not
 * wanted) says why when not 1. */
static int cond_verdict(json_object *root, const sd_filter_cond *c, char *why, size_t why_size)
{
    json_object *v = member(root, c->key);
    double x;
    if (!why)
        why_size = 0;
    if (!v) {
        snprintf(why, why_size, "the metadata has no '%s'", c->key);
        return -1;
    }
    if (c->is_string) {
        if (!json_object_is_type(v, json_type_string)) {
            snprintf(why, why_size, "metadata '%s' is no string", c->key);
            return -1;
        }
        const char *s = json_object_get_string(v);
        const size_t n = (size_t)json_object_get_string_len(v);
        /* a string with a NUL inside equals no filter string (they have none) */
        const int cmp = strlen(s) == n ? strcmp(s, c->str) : 1;
        if (holds(c->op, cmp))
            return 1;
        snprintf(why, why_size, "%s %s \"%s\" is false (\"%.60s\")", c->key,
                 sd_filter_op_name(c->op), c->str, s);
        return 0;
    }
    if (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) {
        x = json_object_get_double(v);
    } else if (json_object_is_type(v, json_type_boolean)) {
        x = json_object_get_boolean(v) ? 1.0 : 0.0;
    } else {
        snprintf(why, why_size, "metadata '%s' is no number", c->key);
        return -1;
    }
    if (isnan(x)) { /* json-c reads NaN and Infinity: no comparison holds for NaN */
        snprintf(why, why_size, "metadata '%s' is NaN", c->key);
        return -1;
    }
    if (holds(c->op, x < c->num ? -1 : x > c->num ? 1 : 0))
        return 1;
    snprintf(why, why_size, "%s %s %.10g is false (%.10g)", c->key, sd_filter_op_name(c->op),
             c->num, x);
    return 0;
}

int sd_meta_filter_eval_each(const sd_meta_filter *f, const char *json, size_t len, int *each,
                             char *why, size_t why_size)
{
    json_object *root;
    int verdict = 1;
    if (why_size)
        why[0] = '\0';
    if (f->n == 0)
        return 1;
    if (!json)
        snprintf(why, why_size, "no .json metadata");
    root = json ? parse_object(json, len, why, why_size) : NULL;
    if (!root) {
        for (int i = 0; each && i < f->n; i++)
            each[i] = -1;
        return -1;
    }
    /* the first condition that does not hold decides, and says why */
    for (int i = 0; i < f->n && (each || verdict == 1); i++) {
        const int v = cond_verdict(root, &f->c[i], verdict == 1 ? why : NULL, why_size);
        if (each)
            each[i] = v;
        if (verdict == 1)
            verdict = v;
    }
    json_object_put(root);
    return verdict;
}

int sd_meta_filter_eval(const sd_meta_filter *f, const char *json, size_t len, char *why,
                        size_t why_size)
{
    return sd_meta_filter_eval_each(f, json, len, NULL, why, why_size);
}
