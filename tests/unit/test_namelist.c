/* Tests of the namelist reader (src/config/namelist.c):
 *   - parity corpus: every tests/namelist/valid/NAME.nml is parsed, converted to the structure
 *     f90nml gives (see tests/reference/make_namelist_goldens.py) and compared with NAME.json;
 *   - error corpus: every tests/namelist/invalid/NAME.nml must fail with exactly the message on
 *     the first line of NAME.err;
 *   - direct API tests (positions, indices, repeat counts, CRLF, NUL bytes, long lines...);
 *   - robustness: truncated and mutated corpus files must never crash the reader.
 * Usage: test_namelist [CORPUS_DIR]  (default: $srcdir/tests/namelist, else tests/namelist). */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sdtrain/error.h"
#include "sdtrain/namelist.h"
#include "tap.h"

/* Largest array the converter builds (a guard against absurd indices in a corpus file). */
#define MAX_ELEMENTS 1000000

/* ---- small helpers ---- */

static char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!fp)
        return NULL;
    for (;;) {
        size_t got;
        if (n == cap) {
            char *nb = realloc(buf, cap ? cap * 2 : 4096);
            if (!nb) {
                free(buf);
                fclose(fp);
                return NULL;
            }
            buf = nb;
            cap = cap ? cap * 2 : 4096;
        }
        got = fread(buf + n, 1, cap - n - 1, fp);
        n += got;
        if (got == 0)
            break;
    }
    fclose(fp);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorted names of the files in dir ending in suffix; returns the count (-1 if dir is missing). */
static int list_files(const char *dir, const char *suffix, char ***out)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    int n = 0, cap = 0;
    size_t sl = strlen(suffix);
    *out = NULL;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0)
            continue;
        if (n == cap) {
            char **nn = realloc(names, (size_t)(cap ? cap * 2 : 16) * sizeof *names);
            if (!nn)
                break;
            names = nn;
            cap = cap ? cap * 2 : 16;
        }
        names[n] = malloc(l + 1);
        if (!names[n])
            break;
        memcpy(names[n], e->d_name, l + 1);
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, (size_t)n, sizeof *names, cmp_str);
    *out = names;
    return n;
}

static void free_list(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static char *path_join3(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + strlen(c) + 3;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s%s%s", a, b, *c ? "/" : "", c);
    return p;
}

/* Same file name with another suffix (".nml" -> ".json"). */
static char *swap_suffix(const char *name, const char *from, const char *to)
{
    size_t l = strlen(name), fl = strlen(from), tl = strlen(to);
    char *p = malloc(l - fl + tl + 1);
    if (p) {
        memcpy(p, name, l - fl);
        memcpy(p + l - fl, to, tl + 1);
    }
    return p;
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ---- nl_file -> f90nml-like JSON ---- */

static json_object *value_json(const nl_value *v)
{
    if (!v)
        return NULL;
    switch (v->kind) {
    case NL_INT:
        return json_object_new_int64(v->i);
    case NL_REAL:
        return json_object_new_double(v->r);
    case NL_LOGICAL:
        return json_object_new_boolean(v->b);
    case NL_STRING:
        return json_object_new_string_len(v->s, (int)strlen(v->s));
    case NL_NULL:
        break;
    }
    return NULL;
}

typedef struct {
    const char *key;
    const nl_value **slot; /* NULL: unset (null) */
    size_t n;
    int indexed;
} var_acc;

/* One group as f90nml represents it: assignments are applied in order with Fortran semantics
 * (values go to successive elements from the index, 1 when none is given; a null value leaves the
 * element as it was); a variable is a list when it was ever indexed or has more than one element,
 * else a scalar.  Returns NULL and fills why on failure. */
static json_object *group_json(const nl_group *g, char *why, size_t whysz)
{
    var_acc *vars = calloc(g->n_assigns ? g->n_assigns : 1, sizeof *vars);
    size_t nv = 0;
    json_object *obj = NULL;

    if (!vars) {
        snprintf(why, whysz, "out of memory");
        return NULL;
    }
    for (size_t a = 0; a < g->n_assigns; a++) {
        const nl_assign *as = &g->assigns[a];
        var_acc *v = NULL;
        size_t start = as->index > 0 ? (size_t)as->index - 1 : 0;
        for (size_t i = 0; i < nv; i++)
            if (strcmp(vars[i].key, as->key) == 0)
                v = &vars[i];
        if (!v) {
            v = &vars[nv++];
            v->key = as->key;
        }
        if (as->index > 0)
            v->indexed = 1;
        if (as->index > MAX_ELEMENTS || as->n_values > MAX_ELEMENTS - start) {
            snprintf(why, whysz, "'%s' has more than %d elements", as->key, MAX_ELEMENTS);
            goto fail;
        }
        if (start + as->n_values > v->n) {
            const nl_value **ns = realloc(v->slot, (start + as->n_values) * sizeof *ns);
            if (!ns) {
                snprintf(why, whysz, "out of memory");
                goto fail;
            }
            for (size_t i = v->n; i < start + as->n_values; i++)
                ns[i] = NULL;
            v->slot = ns;
            v->n = start + as->n_values;
        }
        for (size_t i = 0; i < as->n_values; i++)
            if (as->values[i].kind != NL_NULL)
                v->slot[start + i] = &as->values[i];
    }
    obj = json_object_new_object();
    for (size_t i = 0; i < nv; i++) {
        json_object *val;
        if (vars[i].indexed || vars[i].n != 1) {
            val = json_object_new_array();
            for (size_t k = 0; k < vars[i].n; k++)
                json_object_array_add(val, value_json(vars[i].slot[k]));
        } else {
            val = value_json(vars[i].slot[0]);
        }
        json_object_object_add(obj, vars[i].key, val);
    }
fail:
    for (size_t i = 0; i < nv; i++)
        free(vars[i].slot);
    free(vars);
    return obj;
}

/* The whole file: one member per group name; a name that occurs more than once gives a list of
 * objects in file order (f90nml's cogroups). */
static json_object *file_json(const nl_file *f, char *why, size_t whysz)
{
    json_object *top = json_object_new_object();
    for (size_t g = 0; g < f->n_groups; g++) {
        const char *name = f->groups[g].name;
        size_t count = 0;
        int first = 1;
        for (size_t h = 0; h < f->n_groups; h++)
            if (strcmp(f->groups[h].name, name) == 0) {
                if (h < g)
                    first = 0;
                count++;
            }
        if (!first)
            continue;
        if (count == 1) {
            json_object *o = group_json(&f->groups[g], why, whysz);
            if (!o) {
                json_object_put(top);
                return NULL;
            }
            json_object_object_add(top, name, o);
        } else {
            json_object *list = json_object_new_array();
            json_object_object_add(top, name, list);
            for (size_t h = g; h < f->n_groups; h++) {
                json_object *o;
                if (strcmp(f->groups[h].name, name) != 0)
                    continue;
                o = group_json(&f->groups[h], why, whysz);
                if (!o) {
                    json_object_put(top);
                    return NULL;
                }
                json_object_array_add(list, o);
            }
        }
    }
    return top;
}

/* ---- semantic comparison ---- */

static const char *jtype(json_object *o)
{
    switch (json_object_get_type(o)) {
    case json_type_null:
        return "null";
    case json_type_boolean:
        return "logical";
    case json_type_int:
        return "integer";
    case json_type_double:
        return "real";
    case json_type_string:
        return "string";
    case json_type_array:
        return "list";
    case json_type_object:
        return "object";
    }
    return "?";
}

static const char *jtext(json_object *o)
{
    return o ? json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                     JSON_C_TO_STRING_NOSLASHESCAPE)
             : "null";
}

/* Compares golden (f90nml) and ours; on the first difference writes where and what into why. */
static int same_json(json_object *want, json_object *got, const char *path, char *why,
                     size_t whysz)
{
    json_type tw = json_object_get_type(want), tg = json_object_get_type(got);
    char sub[512];

    if (tw != tg) {
        snprintf(why, whysz, "at %s: f90nml has %s %s, we have %s %s", path, jtype(want),
                 jtext(want), jtype(got), jtext(got));
        return 0;
    }
    switch (tw) {
    case json_type_null:
        return 1;
    case json_type_boolean:
        if (json_object_get_boolean(want) == json_object_get_boolean(got))
            return 1;
        break;
    case json_type_int:
        if (json_object_get_int64(want) == json_object_get_int64(got))
            return 1;
        break;
    case json_type_double: {
        /* Exact: both sides are the correctly rounded double of the same decimal text. */
        double a = json_object_get_double(want), b = json_object_get_double(got);
        if (memcmp(&a, &b, sizeof a) == 0)
            return 1;
        snprintf(why, whysz, "at %s: f90nml has %.17g, we have %.17g (not bit-identical)", path,
                 a, b);
        return 0;
    }
    case json_type_string: {
        int la = json_object_get_string_len(want), lb = json_object_get_string_len(got);
        if (la == lb && memcmp(json_object_get_string(want), json_object_get_string(got),
                               (size_t)la) == 0)
            return 1;
        break;
    }
    case json_type_array: {
        size_t na = json_object_array_length(want), nb = json_object_array_length(got);
        if (na != nb) {
            snprintf(why, whysz, "at %s: f90nml has %zu elements %s, we have %zu %s", path, na,
                     jtext(want), nb, jtext(got));
            return 0;
        }
        for (size_t i = 0; i < na; i++) {
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            if (!same_json(json_object_array_get_idx(want, i), json_object_array_get_idx(got, i),
                           sub, why, whysz))
                return 0;
        }
        return 1;
    }
    case json_type_object: {
        json_object_object_foreach(want, k, v) {
            json_object *o;
            snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k);
            if (!json_object_object_get_ex(got, k, &o)) {
                snprintf(why, whysz, "at %s: missing in ours (f90nml has %s)", sub, jtext(v));
                return 0;
            }
            if (!same_json(v, o, sub, why, whysz))
                return 0;
        }
        json_object_object_foreach(got, k2, v2) {
            if (!json_object_object_get_ex(want, k2, NULL)) {
                snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", k2);
                snprintf(why, whysz, "at %s: not in f90nml's result (we have %s)", sub,
                         jtext(v2));
                return 0;
            }
        }
        return 1;
    }
    }
    snprintf(why, whysz, "at %s: f90nml has %s, we have %s", path, jtext(want), jtext(got));
    return 0;
}

/* ---- corpus ---- */

static void run_valid(const char *dir)
{
    char **names;
    int n = list_files(dir, ".nml", &names);
    tap_ok(n >= 32, "valid corpus %s has at least 32 cases (found %d)", dir, n);
    for (int i = 0; i < n; i++) {
        char *path = path_join3(dir, names[i], "");
        char *jname = swap_suffix(names[i], ".nml", ".json");
        char *jpath = path_join3(dir, jname, "");
        size_t len = 0;
        char *text = read_all(path, &len);
        json_object *want = json_object_from_file(jpath);
        json_object *got = NULL;
        nl_file f;
        sd_err err;
        char why[2048] = "";
        int ok = 0;

        sd_err_clear(&err);
        if (!text) {
            snprintf(why, sizeof why, "cannot read %s", path);
        } else if (!want) {
            snprintf(why, sizeof why, "cannot load golden %s: %s", jpath, json_util_get_last_err());
        } else if (nl_parse(text, len, names[i], &f, &err) != 0) {
            snprintf(why, sizeof why, "parse failed: %s", err.msg);
        } else {
            got = file_json(&f, why, sizeof why);
            if (got)
                ok = same_json(want, got, "", why, sizeof why);
            nl_free(&f);
        }
        if (!tap_ok(ok, "valid/%s matches f90nml", names[i])) {
            tap_diag("%s", why);
            if (got) {
                tap_diag("f90nml: %s", jtext(want));
                tap_diag("ours:   %s", jtext(got));
            }
        }
        json_object_put(got);
        json_object_put(want);
        free(text);
        free(jpath);
        free(jname);
        free(path);
    }
    free_list(names, n > 0 ? n : 0);
}

static void run_invalid(const char *dir)
{
    char **names;
    int n = list_files(dir, ".nml", &names);
    tap_ok(n >= 18, "invalid corpus %s has at least 18 cases (found %d)", dir, n);
    for (int i = 0; i < n; i++) {
        char *path = path_join3(dir, names[i], "");
        char *ename = swap_suffix(names[i], ".nml", ".err");
        char *epath = path_join3(dir, ename, "");
        size_t len = 0, elen = 0;
        char *text = read_all(path, &len);
        char *expect = read_all(epath, &elen);
        nl_file f;
        sd_err err;
        int ok = 0, rc = 0;

        sd_err_clear(&err);
        if (text && expect) {
            expect[strcspn(expect, "\r\n")] = '\0';
            rc = nl_parse(text, len, names[i], &f, &err);
            if (rc == 0)
                nl_free(&f);
            ok = rc != 0 && strcmp(err.msg, expect) == 0 && f.n_groups == 0 && f.groups == NULL;
        }
        if (!tap_ok(ok, "invalid/%s is rejected with the expected message", names[i])) {
            if (!text || !expect)
                tap_diag("cannot read %s or %s", path, epath);
            else if (rc == 0)
                tap_diag("parsed without error; expected: %s", expect);
            else
                tap_diag("expected: %s\n#      got: %s", expect, err.msg);
        }
        free(expect);
        free(text);
        free(epath);
        free(ename);
        free(path);
    }
    free_list(names, n > 0 ? n : 0);
}

/* ---- direct API tests ---- */

static int parse_str(const char *text, nl_file *f, sd_err *err)
{
    sd_err_clear(err);
    return nl_parse(text, strlen(text), "t.nml", f, err);
}

/* Expects nl_parse to fail with exactly msg at line:col; len 0 means strlen(text). */
static int expect_error(const char *text, size_t len, const char *msg, int line, int col)
{
    nl_file f;
    sd_err err;
    int rc;
    if (len == 0)
        len = strlen(text);
    sd_err_clear(&err);
    memset(&f, 0xAB, sizeof f); /* nl_parse must empty it on failure */
    rc = nl_parse(text, len, "t.nml", &f, &err);
    if (rc == 0) {
        nl_free(&f);
        tap_diag("parsed without error; expected: %s", msg);
        return 0;
    }
    if (strcmp(err.msg, msg) != 0 || err.line != line || err.col != col || f.n_groups != 0 ||
        f.groups != NULL || f.source != NULL) {
        tap_diag("expected: %s (line %d col %d)", msg, line, col);
        tap_diag("     got: %s (line %d col %d)", err.msg, err.line, err.col);
        return 0;
    }
    return 1;
}

static int has_pos(int line, int col, int want_line, int want_col, const char *what)
{
    if (line == want_line && col == want_col)
        return 1;
    tap_diag("%s at %d:%d, expected %d:%d", what, line, col, want_line, want_col);
    return 0;
}

static void test_positions(void)
{
    const char *text = "! header\n"
                       "&Run  ! the run group\n"
                       "  LR = 1.0e-4, steps=100\n"
                       "  name = 'x'\n"
                       "/\n"
                       "$data path=\"p\" $END\n";
    nl_file f;
    sd_err err;
    int ok = parse_str(text, &f, &err) == 0;
    if (ok) {
        const nl_group *g = &f.groups[0];
        ok = f.n_groups == 2 && strcmp(f.source, "t.nml") == 0 && strcmp(g->name, "run") == 0 &&
             g->n_assigns == 3 && strcmp(g->assigns[0].key, "lr") == 0;
        ok = ok && has_pos(g->line, g->col, 2, 1, "group &run");
        ok = ok && has_pos(g->end_line, g->end_col, 5, 1, "end of &run");
        ok = ok && has_pos(g->assigns[0].line, g->assigns[0].col, 3, 3, "key lr");
        ok = ok && has_pos(g->assigns[0].values[0].line, g->assigns[0].values[0].col, 3, 8,
                           "value of lr");
        ok = ok && has_pos(g->assigns[1].line, g->assigns[1].col, 3, 16, "key steps");
        ok = ok && has_pos(g->assigns[1].values[0].line, g->assigns[1].values[0].col, 3, 22,
                           "value of steps");
        ok = ok && has_pos(g->assigns[2].values[0].line, g->assigns[2].values[0].col, 4, 10,
                           "string value (its opening quote)");
        ok = ok && strcmp(f.groups[1].name, "data") == 0 &&
             has_pos(f.groups[1].line, f.groups[1].col, 6, 1, "group $data") &&
             has_pos(f.groups[1].end_line, f.groups[1].end_col, 6, 16, "$END");
        nl_free(&f);
    } else {
        tap_diag("%s", err.msg);
    }
    tap_ok(ok, "positions of groups, group ends, keys and values");
}

static void test_index_and_repeat(void)
{
    nl_file f;
    sd_err err;
    int ok = parse_str("&g\n x(3) = 7, 8\n r = 3*0.5, 2*'ab', 2*, 9\n n = 1, , 3 /", &f, &err) ==
             0;
    if (ok) {
        const nl_group *g = &f.groups[0];
        const nl_assign *x = &g->assigns[0], *r = &g->assigns[1], *n = &g->assigns[2];
        ok = g->n_assigns == 3 && x->index == 3 && x->n_values == 2 && x->values[0].kind == NL_INT &&
             x->values[0].i == 7 && x->values[1].i == 8 && r->index == 0 && r->n_values == 8;
        ok = ok && has_pos(x->line, x->col, 2, 2, "key x(3)");
        for (size_t i = 0; ok && i < 3; i++)
            ok = r->values[i].kind == NL_REAL && r->values[i].r == 0.5 &&
                 has_pos(r->values[i].line, r->values[i].col, 3, 6, "repeated 0.5");
        for (size_t i = 3; ok && i < 5; i++)
            ok = r->values[i].kind == NL_STRING && strcmp(r->values[i].s, "ab") == 0 &&
                 has_pos(r->values[i].line, r->values[i].col, 3, 13, "repeated 'ab'");
        ok = ok && r->values[3].s != r->values[4].s; /* each value owns its string */
        ok = ok && r->values[5].kind == NL_NULL && r->values[6].kind == NL_NULL &&
             has_pos(r->values[5].line, r->values[5].col, 3, 21, "null from 2*") &&
             r->values[7].kind == NL_INT && r->values[7].i == 9;
        ok = ok && n->n_values == 3 && n->values[1].kind == NL_NULL &&
             has_pos(n->values[1].line, n->values[1].col, 4, 9, "empty slot (its closing comma)");
        nl_free(&f);
    } else {
        tap_diag("%s", err.msg);
    }
    tap_ok(ok, "indexed element, repeat expansion, null slots");
}

static void test_kinds_and_numbers(void)
{
    nl_file f;
    sd_err err;
    const char *text = "&g i = 0, -5, +3, 007, 9223372036854775807, -9223372036854775808\n"
                       " r = 1e-4, 1.0d-4, 1.D0, .5, 5., -2.5E+3, 0.1, 1e-400, -0.0, 4.9e-324\n"
                       " b = .true., .false., T, F, .t., .F., .TRUE., true, FALSE, t /";
    int ok = parse_str(text, &f, &err) == 0;
    if (ok) {
        const nl_assign *i = &f.groups[0].assigns[0], *r = &f.groups[0].assigns[1],
                        *b = &f.groups[0].assigns[2];
        const int64_t iv[] = {0, -5, 3, 7, INT64_MAX, INT64_MIN};
        const double rv[] = {1e-4, 1.0e-4, 1.0, 0.5, 5.0, -2.5e3, 0.1, 0.0, -0.0, 4.9e-324};
        const int bv[] = {1, 0, 1, 0, 1, 0, 1, 1, 0, 1};
        ok = i->n_values == 6 && r->n_values == 10 && b->n_values == 10;
        for (size_t k = 0; ok && k < 6; k++)
            ok = i->values[k].kind == NL_INT && i->values[k].i == iv[k];
        for (size_t k = 0; ok && k < 10; k++) {
            ok = r->values[k].kind == NL_REAL && memcmp(&r->values[k].r, &rv[k], sizeof(double)) == 0;
            if (!ok)
                tap_diag("real %zu: got %.17g, expected %.17g", k, r->values[k].r, rv[k]);
        }
        for (size_t k = 0; ok && k < 10; k++)
            ok = b->values[k].kind == NL_LOGICAL && b->values[k].b == bv[k];
        nl_free(&f);
    } else {
        tap_diag("%s", err.msg);
    }
    tap_ok(ok, "integers, reals (bit-exact) and logicals");
    tap_ok(strcmp(nl_kind_name(NL_NULL), "null") == 0 && strcmp(nl_kind_name(NL_INT), "integer") == 0 &&
               strcmp(nl_kind_name(NL_REAL), "real") == 0 &&
               strcmp(nl_kind_name(NL_LOGICAL), "logical") == 0 &&
               strcmp(nl_kind_name(NL_STRING), "string") == 0,
           "nl_kind_name");
}

static void test_line_endings(void)
{
    nl_file f;
    sd_err err;
    const char *crlf = "&g\r\n a = 1,\r\n\t2\r\n s = 'x y'\r\n/\r\n";
    int ok = parse_str(crlf, &f, &err) == 0;
    if (ok) {
        const nl_group *g = &f.groups[0];
        ok = g->n_assigns == 2 && g->assigns[0].n_values == 2 &&
             strcmp(g->assigns[1].values[0].s, "x y") == 0 &&
             has_pos(g->assigns[1].line, g->assigns[1].col, 4, 2, "key s (CRLF)") &&
             has_pos(g->assigns[0].values[1].line, g->assigns[0].values[1].col, 3, 2,
                     "value after a tab") &&
             has_pos(g->end_line, g->end_col, 5, 1, "group end (CRLF)");
        nl_free(&f);
    } else {
        tap_diag("%s", err.msg);
    }
    tap_ok(ok, "CRLF line endings and tabs");
    tap_ok(expect_error("&g\r\n a = 'x\r\n/\r\n", 0,
                        "t.nml:2:6: unterminated string: no closing ' on this line (strings "
                        "cannot continue onto the next line)",
                        2, 6),
           "unterminated string before CRLF");

    ok = parse_str("&g a=1 /", &f, &err) == 0 && f.n_groups == 1 && f.groups[0].end_col == 8;
    if (ok)
        nl_free(&f);
    tap_ok(ok, "no final newline");
    tap_ok(expect_error("&g a=1\n", 0,
                        "t.nml:1:1: group '&g' is not terminated: no '/' found before the end of "
                        "the input",
                        1, 1),
           "unterminated group reported at its '&'");
    tap_ok(expect_error("&g a='abc", 0,
                        "t.nml:1:6: unterminated string: no closing ' on this line (strings "
                        "cannot continue onto the next line)",
                        1, 6),
           "unterminated string at end of input");
}

static void test_nul_and_empty(void)
{
    static const char with_nul[] = "&g a=1\n b=\0 /\n";
    static const char nul_in_string[] = "&g s='ab\0c' /";
    nl_file f;
    sd_err err;
    tap_ok(expect_error(with_nul, sizeof with_nul - 1,
                        "t.nml:2:4: NUL byte in input (a namelist must be text)", 2, 4),
           "embedded NUL rejected with its position");
    tap_ok(expect_error(nul_in_string, sizeof nul_in_string - 1,
                        "t.nml:1:9: NUL byte in input (a namelist must be text)", 1, 9),
           "NUL inside a string rejected");
    sd_err_clear(&err);
    tap_ok(nl_parse(NULL, 0, "empty", &f, &err) == 0 && f.n_groups == 0 &&
               strcmp(f.source, "empty") == 0,
           "empty input (NULL, 0) gives no groups");
    nl_free(&f);
    nl_free(&f); /* nl_free leaves the file empty, so a second call is harmless */
    tap_ok(f.groups == NULL && f.source == NULL, "nl_free empties the file");
    sd_err_clear(&err);
    tap_ok(nl_parse("\n  ! only a comment\n\n", 21, NULL, &f, &err) == 0 && f.n_groups == 0 &&
               strcmp(f.source, "<input>") == 0,
           "comment-only input; NULL source is named <input>");
    nl_free(&f);
    tap_ok(expect_error("&g a=1 /\n# note\n", 0,
                        "t.nml:2:1: '#' does not start a comment in a namelist (use '!')", 2, 1),
           "'#' comment outside a group");
}

static void test_long_lines(void)
{
    size_t nvals = 200000, slen = 300000, cap = nvals * 3 + slen + 64, n = 0;
    char *text = malloc(cap);
    nl_file f;
    sd_err err;
    int ok;
    size_t last_col = 0;
    if (!text) {
        tap_ok(0, "long lines (out of memory)");
        return;
    }
    n += (size_t)sprintf(text + n, "&g a = ");
    for (size_t i = 0; i < nvals; i++) {
        if (i == nvals - 1)
            last_col = n + 1;
        n += (size_t)sprintf(text + n, "%d,", (int)(i % 10));
    }
    n += (size_t)sprintf(text + n, " s = '");
    memset(text + n, 'x', slen);
    n += slen;
    n += (size_t)sprintf(text + n, "' /");
    sd_err_clear(&err);
    ok = nl_parse(text, n, "long", &f, &err) == 0;
    if (ok) {
        const nl_assign *a = &f.groups[0].assigns[0], *s = &f.groups[0].assigns[1];
        ok = a->n_values == nvals && a->values[nvals - 1].i == (int64_t)((nvals - 1) % 10) &&
             has_pos(a->values[nvals - 1].line, a->values[nvals - 1].col, 1, (int)last_col,
                     "last value of a long line") &&
             strlen(s->values[0].s) == slen;
        nl_free(&f);
    } else {
        tap_diag("%s", err.msg);
    }
    tap_ok(ok, "a 900 kB line with 200000 values and a 300000-byte string");

    /* The error position at the end of a long line. */
    n = (size_t)sprintf(text, "&g a = ");
    memset(text + n, ' ', slen);
    n += slen;
    n += (size_t)sprintf(text + n, "1.2.3 /");
    {
        char msg[128];
        snprintf(msg, sizeof msg, "t.nml:1:%zu: invalid number '1.2.3'", slen + 8);
        tap_ok(expect_error(text, n, msg, 1, (int)(slen + 8)), "error column on a long line");
    }
    free(text);
}

static void test_errors(void)
{
    nl_file f;
    sd_err err;
    char big[64];
    tap_ok(expect_error("&g a = 1\n  b 2 /", 0, "t.nml:2:5: expected '=' after 'b', found '2'", 2,
                        5),
           "missing '=' (line and column in sd_err)");
    tap_ok(expect_error("&g a=1000001*0 /", 0,
                        "t.nml:1:6: repeat count '1000001*' is too large (at most 1000000)", 1, 6),
           "repeat count limit");
    tap_ok(expect_error("&g a(2147483648)=1 /", 0,
                        "t.nml:1:6: index '2147483648' for 'a' is too large (at most "
                        "2147483647)",
                        1, 6),
           "index limit");
    snprintf(big, sizeof big, "&g a=1 &h b=2 /");
    tap_ok(expect_error(big, 0,
                        "t.nml:1:8: group '&h' starts inside group '&g' (is the '/' that ends "
                        "'&g' missing?)",
                        1, 8),
           "nested group");
    tap_ok(expect_error("&g a = 1; b = 2 /", 0,
                        "t.nml:1:9: unexpected ';' after a value (separate values with commas "
                        "or blanks)",
                        1, 9),
           "unexpected character after a value");
    tap_ok(expect_error("&g a = 1 ; b = 2 /", 0,
                        "t.nml:1:10: unexpected ';' where a value was expected", 1, 10),
           "unexpected character where a value was expected");
    tap_ok(expect_error("&g\n a = 'ok'\n b = caf\xc3\xa9 /", 0,
                        "t.nml:3:6: unquoted string caf\xc3\xa9: strings must be quoted, e.g. "
                        "'caf\xc3\xa9'",
                        3, 6),
           "unquoted UTF-8 word");
    tap_ok(expect_error("&g a = 1 \xc3\xa9 /", 0,
                        "t.nml:1:10: unexpected byte 0xC3 (non-ASCII text must be inside quotes) "
                        "where a value was expected",
                        1, 10),
           "non-ASCII byte where a value is expected");

    /* Duplicates are kept in order; the layer above decides what they mean. */
    sd_err_clear(&err);
    if (parse_str("&g a=1 A=2 / &G a(2)=3 /", &f, &err) == 0) {
        tap_ok(f.n_groups == 2 && f.groups[0].n_assigns == 2 &&
                   f.groups[0].assigns[1].values[0].i == 2 && strcmp(f.groups[1].name, "g") == 0 &&
                   f.groups[1].assigns[0].index == 2,
               "duplicate keys and groups are kept in source order");
        nl_free(&f);
    } else {
        tap_ok(0, "duplicate keys and groups are kept in source order");
        tap_diag("%s", err.msg);
    }
}

static void test_parse_file(const char *corpus)
{
    nl_file f;
    sd_err err;
    char *path = path_join3(corpus, "valid", "sdtrain_full.nml");
    sd_err_clear(&err);
    tap_ok(nl_parse_file("no/such/dir/x.nml", &f, &err) == -1 &&
               strcmp(err.msg, "cannot read 'no/such/dir/x.nml': No such file or directory") ==
                   0 &&
               f.n_groups == 0,
           "nl_parse_file names the missing path");
    sd_err_clear(&err);
    tap_ok(nl_parse_file(corpus, &f, &err) == -1 && strstr(err.msg, "cannot read '") == err.msg,
           "nl_parse_file on a directory fails cleanly");
    sd_err_clear(&err);
    if (path && nl_parse_file(path, &f, &err) == 0) {
        tap_ok(strcmp(f.source, path) == 0 && f.n_groups >= 6,
               "nl_parse_file reads a corpus file (source is the path)");
        nl_free(&f);
    } else {
        tap_ok(0, "nl_parse_file reads a corpus file (source is the path)");
        tap_diag("%s", err.msg);
    }
    free(path);
}

/* ---- robustness ---- */

/* Parses text and checks the invariants of either outcome. */
static int parse_checked(const char *text, size_t len)
{
    nl_file f;
    sd_err err;
    sd_err_clear(&err);
    if (nl_parse(text, len, "fuzz", &f, &err) != 0)
        return strncmp(err.msg, "fuzz:", 5) == 0 && err.line >= 1 && err.col >= 1 &&
               f.n_groups == 0 && f.groups == NULL;
    for (size_t g = 0; g < f.n_groups; g++)
        for (size_t a = 0; a < f.groups[g].n_assigns; a++) {
            const nl_assign *as = &f.groups[g].assigns[a];
            if (as->n_values == 0 || as->index < 0 || as->line < 1 || as->col < 1) {
                nl_free(&f);
                return 0;
            }
        }
    nl_free(&f);
    return 1;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint32_t rng(void)
{
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return (uint32_t)(rng_state >> 33);
}

static void test_robustness(const char *corpus)
{
    static const char alphabet[] = "&$/!'\",=*()%:.+-0123456789eEdDtTfF_ab \t\r\n\xc3\xa9#;";
    const char *sub[2] = {"valid", "invalid"};
    long prefixes = 0, mutants = 0, bad_prefix = 0, bad_mutant = 0;
    for (int s = 0; s < 2; s++) {
        char *dir = path_join3(corpus, sub[s], "");
        char **names;
        int n = list_files(dir, ".nml", &names);
        for (int i = 0; i < n; i++) {
            char *path = path_join3(dir, names[i], "");
            size_t len = 0;
            char *text = read_all(path, &len);
            if (text) {
                /* Every prefix, as a separate allocation so ASan sees any over-read. */
                for (size_t k = 0; k <= len; k++) {
                    char *cut = malloc(k ? k : 1);
                    if (!cut)
                        break;
                    memcpy(cut, text, k);
                    bad_prefix += !parse_checked(cut, k);
                    prefixes++;
                    free(cut);
                }
                /* Random byte mutations. */
                for (int m = 0; len > 0 && m < 300; m++) {
                    char *mut = malloc(len);
                    if (!mut)
                        break;
                    memcpy(mut, text, len);
                    for (int e = 0, ne = 1 + (int)(rng() % 4); e < ne; e++)
                        mut[rng() % len] = alphabet[rng() % (sizeof alphabet - 1)];
                    bad_mutant += !parse_checked(mut, len);
                    mutants++;
                    free(mut);
                }
            }
            free(text);
            free(path);
        }
        free_list(names, n > 0 ? n : 0);
        free(dir);
    }
    tap_ok(prefixes > 0 && bad_prefix == 0, "%ld truncated corpus files parse or fail cleanly",
           prefixes);
    tap_ok(mutants > 0 && bad_mutant == 0, "%ld mutated corpus files parse or fail cleanly",
           mutants);
    {
        long bad = 0;
        for (int m = 0; m < 20000; m++) {
            size_t len = rng() % 64;
            char *buf = malloc(len ? len : 1);
            if (!buf)
                break;
            for (size_t k = 0; k < len; k++)
                buf[k] = alphabet[rng() % (sizeof alphabet - 1)];
            if (len > 0 && m % 2 == 0)
                buf[0] = '&';
            bad += !parse_checked(buf, len);
            free(buf);
        }
        tap_ok(bad == 0, "20000 random short inputs parse or fail cleanly");
    }
}

int main(int argc, char **argv)
{
    char corpus[4096];
    const char *srcdir = getenv("srcdir");
    char *valid, *invalid;

    (void)tap_skip_all; /* part of tap.h; this program always runs */
    if (argc > 1)
        snprintf(corpus, sizeof corpus, "%s", argv[1]);
    else if (srcdir && *srcdir)
        snprintf(corpus, sizeof corpus, "%s/tests/namelist", srcdir);
    else
        snprintf(corpus, sizeof corpus, "tests/namelist");
    if (!tap_ok(is_dir(corpus), "corpus directory %s exists", corpus))
        tap_diag("pass the corpus directory (tests/namelist) as the first argument");

    valid = path_join3(corpus, "valid", "");
    invalid = path_join3(corpus, "invalid", "");
    run_valid(valid);
    run_invalid(invalid);
    free(valid);
    free(invalid);

    test_positions();
    test_index_and_repeat();
    test_kinds_and_numbers();
    test_line_endings();
    test_nul_and_empty();
    test_long_lines();
    test_errors();
    test_parse_file(corpus);
    test_robustness(corpus);
    return tap_done();
}
