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

int sd_meta_filter_eval(const sd_meta_filter *f, const char *json, size_t len, char *why,
                        size_t why_size)
{
    json_tokener *tok;
    json_object *root;
    int verdict = 1;
    if (why_size)
        why[0] = '\0';
    if (f->n == 0)
        return 1;
    if (!json) {
        snprintf(why, why_size, "no .json metadata");
        return -1;
    }
    tok = json_tokener_new();
    root = json_tokener_parse_ex(tok, json, (int)(len > 0x7fffffff ? 0x7fffffff : len));
    if (!root || json_tokener_get_error(tok) != json_tokener_success ||
        json_tokener_get_parse_end(tok) < len) {
        /* trailing blanks after the object are fine */
        size_t end = root ? json_tokener_get_parse_end(tok) : 0;
        while (root && end < len && (json[end] == ' ' || json[end] == '\n' || json[end] == '\r' ||
                                     json[end] == '\t'))
            end++;
        if (!root || end < len) {
            const enum json_tokener_error je = json_tokener_get_error(tok);
            snprintf(why, why_size, "the .json metadata is not valid JSON (%s)",
                     root ? "text after the value"
                     : je == json_tokener_continue ? "it ends inside the value"
                                                   : json_tokener_error_desc(je));
            json_object_put(root);
            json_tokener_free(tok);
            return -1;
        }
    }
    json_tokener_free(tok);
    if (!json_object_is_type(root, json_type_object)) {
        snprintf(why, why_size, "the .json metadata is not a JSON object");
        json_object_put(root);
        return -1;
    }
    for (int i = 0; i < f->n && verdict == 1; i++) {
        const sd_filter_cond *c = &f->c[i];
        json_object *v = member(root, c->key);
        if (!v) {
            snprintf(why, why_size, "the metadata has no '%s'", c->key);
            verdict = -1;
        } else if (c->is_string) {
            if (!json_object_is_type(v, json_type_string)) {
                snprintf(why, why_size, "metadata '%s' is no string", c->key);
                verdict = -1;
            } else {
                const char *s = json_object_get_string(v);
                const size_t n = (size_t)json_object_get_string_len(v);
                /* a string with a NUL inside equals no filter string (they have none) */
                const int cmp = strlen(s) == n ? strcmp(s, c->str) : 1;
                if (!holds(c->op, cmp)) {
                    snprintf(why, why_size, "%s %s \"%s\" is false (\"%.60s\")", c->key,
                             sd_filter_op_name(c->op), c->str, s);
                    verdict = 0;
                }
            }
        } else {
            double x;
            if (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) {
                x = json_object_get_double(v);
            } else if (json_object_is_type(v, json_type_boolean)) {
                x = json_object_get_boolean(v) ? 1.0 : 0.0;
            } else {
                snprintf(why, why_size, "metadata '%s' is no number", c->key);
                verdict = -1;
                break;
            }
            if (isnan(x)) { /* json-c reads NaN and Infinity: no comparison holds for NaN */
                snprintf(why, why_size, "metadata '%s' is NaN", c->key);
                verdict = -1;
            } else if (!holds(c->op, x < c->num ? -1 : x > c->num ? 1 : 0)) {
                snprintf(why, why_size, "%s %s %.10g is false (%.10g)", c->key,
                         sd_filter_op_name(c->op), c->num, x);
                verdict = 0;
            }
        }
    }
    json_object_put(root);
    return verdict;
}
