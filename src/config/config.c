/* Applies namelists and --set overrides to the typed configuration through the schema table,
 * checks the cross-key rules, and prints the result as namelist text and as Markdown. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/metafilter.h"
#include "sdtrain/unet.h"

/* ---- small helpers ---------------------------------------------------------------------- */

static size_t option_count(void)
{
    size_t n;
    sd_config_options(&n);
    return n;
}

static size_t option_index(const sd_option *o)
{
    size_t n;
    const sd_option *all = sd_config_options(&n);
    return (size_t)(o - all);
}

static void *field(sd_config *c, const sd_option *o) { return (char *)c + o->offset; }
static const void *cfield(const sd_config *c, const sd_option *o) { return (const char *)c + o->offset; }
static int *count_field(sd_config *c, const sd_option *o) { return (int *)((char *)c + o->count_offset); }
static int ccount(const sd_config *c, const sd_option *o) { return *(const int *)((const char *)c + o->count_offset); }

static int is_list(const sd_option *o)
{
    return o->type == SD_OPT_INT_LIST || o->type == SD_OPT_STRING_LIST;
}

/* Edit distance for "did you mean" suggestions. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t prev[64], cur[64];
    if (la >= 63 || lb >= 63)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

static int close_enough(const char *typed, size_t d)
{
    size_t len = strlen(typed);
    size_t limit = len / 3 > 2 ? len / 3 : 2;
    return d <= limit;
}

static const char *suggest_group(const char *name)
{
    size_t ng, best_d = 99;
    const char *const *gs = sd_config_groups(&ng);
    const char *best = NULL;
    for (size_t i = 0; i < ng; i++) {
        size_t d = edit_distance(name, gs[i]);
        if (d < best_d) {
            best_d = d;
            best = gs[i];
        }
    }
    return best && close_enough(name, best_d) ? best : NULL;
}

static const char *suggest_choice(const char *value, const char *choices, char *buf, size_t cap)
{
    size_t best_d = 99;
    const char *p = choices;
    buf[0] = '\0';
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        char cand[64];
        if (len < sizeof cand) {
            memcpy(cand, p, len);
            cand[len] = '\0';
            size_t d = edit_distance(value, cand);
            if (d < best_d && len < cap) {
                best_d = d;
                snprintf(buf, cap, "%s", cand);
            }
        }
        p += len + (bar ? 1 : 0);
    }
    return buf[0] && close_enough(value, best_d) ? buf : NULL;
}

/* "'a', 'b', 'c'" from "a|b|c" */
static void format_choices(const char *choices, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (const char *p = choices; *p && n + 8 < cap;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        n += (size_t)snprintf(out + n, cap - n, "%s'%.*s'", n ? ", " : "", (int)len, p);
        p += len + (bar ? 1 : 0);
    }
}

static int choice_allowed(const char *value, const char *choices)
{
    size_t vl = strlen(value);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == vl && strncasecmp(p, value, len) == 0)
            return 1;
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

static const char *type_phrase(sd_opt_type t)
{
    switch (t) {
    case SD_OPT_INT: return "an integer";
    case SD_OPT_REAL: return "a real number";
    case SD_OPT_LOGICAL: return "a logical (.true. or .false.)";
    case SD_OPT_STRING: return "a quoted string";
    case SD_OPT_CHOICE: return "a quoted string";
    case SD_OPT_INT_LIST: return "a list of integers";
    case SD_OPT_STRING_LIST: return "a list of quoted strings";
    }
    return "?";
}

static const char *type_name(sd_opt_type t)
{
    switch (t) {
    case SD_OPT_INT: return "integer";
    case SD_OPT_REAL: return "real";
    case SD_OPT_LOGICAL: return "logical";
    case SD_OPT_STRING: return "string";
    case SD_OPT_CHOICE: return "string";
    case SD_OPT_INT_LIST: return "integer list";
    case SD_OPT_STRING_LIST: return "string list";
    }
    return "?";
}

static void describe_value(const nl_value *v, char *buf, size_t cap)
{
    switch (v->kind) {
    case NL_INT: snprintf(buf, cap, "integer %lld", (long long)v->i); break;
    case NL_REAL: snprintf(buf, cap, "real %g", v->r); break;
    case NL_LOGICAL: snprintf(buf, cap, "logical %s", v->b ? ".true." : ".false."); break;
    case NL_STRING: snprintf(buf, cap, "string '%.60s'", v->s); break;
    case NL_NULL: snprintf(buf, cap, "an empty value"); break;
    }
}

/* Formats a real so that it re-parses to the same double and reads as a real. */
static void format_real(double x, char *buf, size_t cap)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    if (!strpbrk(buf, ".eEn")) {
        size_t n = strlen(buf);
        if (n + 3 < cap)
            memcpy(buf + n, ".0", 3);
    }
}

static void format_range(const sd_option *o, char *buf, size_t cap)
{
    char lo[32], hi[32];
    int has_lo = !isnan(o->min), has_hi = !isnan(o->max);
    if (o->type == SD_OPT_REAL) {
        format_real(o->min, lo, sizeof lo);
        format_real(o->max, hi, sizeof hi);
    } else {
        snprintf(lo, sizeof lo, "%.0f", o->min);
        snprintf(hi, sizeof hi, "%.0f", o->max);
    }
    if (has_lo && has_hi)
        snprintf(buf, cap, "%s to %s", lo, hi);
    else if (has_lo)
        snprintf(buf, cap, ">= %s", lo);
    else if (has_hi)
        snprintf(buf, cap, "<= %s", hi);
    else
        buf[0] = '\0';
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void sb_printf(strbuf *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        int k;
        size_t room = b->cap - b->n;
        va_start(ap, fmt);
        k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        SD_CHECK(k >= 0, "vsnprintf failed");
        if (b->p && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        b->cap = (b->cap + (size_t)k + 1) * 2;
        b->p = sd_xrealloc(b->p, b->cap);
    }
}

/* ---- applying values -------------------------------------------------------------------- */

/* State of one application pass (a file, or one --set). */
typedef struct apply_ctx {
    sd_run_config *rc;
    const char *source;
    sd_origin origin_kind_template;
    int check_duplicates;
    /* per option: which elements were set in this pass (bit i = element i+1), where first */
    uint64_t *set_mask;
    int *first_line;
    int *first_col;
} apply_ctx;

static int check_number_range(const apply_ctx *ax, const sd_option *o, const nl_value *v, double x,
                              sd_err *err)
{
    if ((!isnan(o->min) && x < o->min) || (!isnan(o->max) && x > o->max)) {
        char range[80], shown[40];
        format_range(o, range, sizeof range);
        if (o->type == SD_OPT_REAL)
            format_real(x, shown, sizeof shown);
        else
            snprintf(shown, sizeof shown, "%lld", (long long)v->i);
        return sd_err_at(err, ax->source, v->line, v->col,
                         "value out of range for &%s %s: %s (allowed: %s)", o->group, o->key,
                         shown, range);
    }
    return 0;
}

static int store_scalar(const apply_ctx *ax, const sd_option *o, void *dst, const nl_value *v,
                        sd_err *err)
{
    char got[96];
    if (v->kind == NL_NULL)
        return sd_err_at(err, ax->source, v->line, v->col, "no value given for &%s %s (expected %s)",
                         o->group, o->key, type_phrase(o->type));
    describe_value(v, got, sizeof got);
    switch (o->type) {
    case SD_OPT_INT:
    case SD_OPT_INT_LIST:
        if (v->kind != NL_INT)
            return sd_err_at(err, ax->source, v->line, v->col,
                             "wrong type for &%s %s: expected an integer, got %s", o->group, o->key, got);
        if (check_number_range(ax, o, v, (double)v->i, err))
            return -1;
        *(int64_t *)dst = v->i;
        return 0;
    case SD_OPT_REAL: {
        double x;
        if (v->kind == NL_INT)
            x = (double)v->i;
        else if (v->kind == NL_REAL)
            x = v->r;
        else
            return sd_err_at(err, ax->source, v->line, v->col,
                             "wrong type for &%s %s: expected a real number, got %s", o->group, o->key, got);
        if (!isfinite(x))
            return sd_err_at(err, ax->source, v->line, v->col, "&%s %s must be finite", o->group, o->key);
        if (check_number_range(ax, o, v, x, err))
            return -1;
        *(double *)dst = x;
        return 0;
    }
    case SD_OPT_LOGICAL:
        if (v->kind != NL_LOGICAL)
            return sd_err_at(err, ax->source, v->line, v->col,
                             "wrong type for &%s %s: expected a logical (.true. or .false.), got %s",
                             o->group, o->key, got);
        *(bool *)dst = v->b != 0;
        return 0;
    case SD_OPT_STRING:
    case SD_OPT_CHOICE:
    case SD_OPT_STRING_LIST: {
        size_t cap = o->type == SD_OPT_STRING_LIST ? o->elem_size : o->capacity;
        size_t len;
        if (v->kind != NL_STRING)
            return sd_err_at(err, ax->source, v->line, v->col,
                             "wrong type for &%s %s: expected a quoted string, got %s", o->group,
                             o->key, got);
        len = strlen(v->s);
        if (len >= cap)
            return sd_err_at(err, ax->source, v->line, v->col,
                             "value of &%s %s is too long: %zu bytes (at most %zu)", o->group, o->key,
                             len, cap - 1);
        if (o->type == SD_OPT_CHOICE) {
            char allowed[256], hint[64];
            if (!choice_allowed(v->s, o->choices)) {
                const char *s = suggest_choice(v->s, o->choices, hint, sizeof hint);
                format_choices(o->choices, allowed, sizeof allowed);
                return sd_err_at(err, ax->source, v->line, v->col,
                                 "invalid value '%s' for &%s %s: expected one of %s%s%s%s", v->s,
                                 o->group, o->key, allowed, s ? " (did you mean '" : "", s ? s : "",
                                 s ? "'?)" : "");
            }
            for (size_t i = 0; i <= len; i++)
                ((char *)dst)[i] = (char)tolower((unsigned char)v->s[i]);
            return 0;
        }
        memcpy(dst, v->s, len + 1);
        return 0;
    }
    }
    return sd_err_at(err, ax->source, v->line, v->col, "internal error: unknown option type");
}

static int apply_assign(apply_ctx *ax, const sd_option *o, const nl_assign *a, sd_err *err)
{
    size_t oi = option_index(o);
    sd_config *c = &ax->rc->cfg;
    if (a->n_values == 0)
        return sd_err_at(err, ax->source, a->line, a->col, "no value given for &%s %s", o->group, o->key);

    if (!is_list(o)) {
        if (a->index != 0)
            return sd_err_at(err, ax->source, a->line, a->col,
                             "&%s %s is not an array: remove the index (%lld)", o->group, o->key,
                             (long long)a->index);
        if (a->n_values > 1)
            return sd_err_at(err, ax->source, a->values[1].line, a->values[1].col,
                             "&%s %s takes one value, %zu given", o->group, o->key, a->n_values);
        if (ax->check_duplicates && (ax->set_mask[oi] & 1u))
            return sd_err_at(err, ax->source, a->line, a->col,
                             "duplicate key '%s' in &%s (first set at line %d)", o->key, o->group,
                             ax->first_line[oi]);
        if (store_scalar(ax, o, field(c, o), &a->values[0], err))
            return -1;
        ax->set_mask[oi] |= 1u;
    } else {
        int count = *count_field(c, o);
        int64_t start = a->index ? a->index : 1;
        size_t elem = o->type == SD_OPT_INT_LIST ? sizeof(int64_t) : o->elem_size;
        if (a->index > (int64_t)o->capacity)
            return sd_err_at(err, ax->source, a->line, a->col,
                             "index (%lld) out of range for &%s %s: at most %zu elements",
                             (long long)a->index, o->group, o->key, o->capacity);
        if (a->index > count + 1 && a->index > 1)
            return sd_err_at(err, ax->source, a->line, a->col,
                             "&%s %s(%lld) set, but element %d has no value (elements must be "
                             "contiguous from 1)", o->group, o->key, (long long)a->index, count + 1);
        if ((size_t)(start - 1) + a->n_values > o->capacity)
            return sd_err_at(err, ax->source, a->line, a->col,
                             "too many values for &%s %s: %zu given from element %lld, at most %zu "
                             "elements", o->group, o->key, a->n_values, (long long)start, o->capacity);
        for (size_t j = 0; j < a->n_values; j++) {
            size_t e = (size_t)(start - 1) + j;
            if (ax->check_duplicates && (ax->set_mask[oi] >> e & 1u))
                return sd_err_at(err, ax->source, a->line, a->col,
                                 "duplicate key '%s' in &%s: element %zu already set at line %d",
                                 o->key, o->group, e + 1, ax->first_line[oi]);
            if (store_scalar(ax, o, (char *)field(c, o) + e * elem, &a->values[j], err))
                return -1;
            ax->set_mask[oi] |= (uint64_t)1 << e;
        }
        if (a->index == 0)
            *count_field(c, o) = (int)a->n_values;
        else if ((int)(start - 1 + (int64_t)a->n_values) > count)
            *count_field(c, o) = (int)(start - 1 + (int64_t)a->n_values);
    }
    if (!ax->first_line[oi]) {
        ax->first_line[oi] = a->line;
        ax->first_col[oi] = a->col;
    }
    ax->rc->origin[oi] = ax->origin_kind_template;
    if (ax->origin_kind_template.kind == SD_ORIGIN_FILE) {
        ax->rc->origin[oi].line = a->line;
        ax->rc->origin[oi].col = a->col;
    }
    return 0;
}

static int apply_file(sd_run_config *rc, const nl_file *f, sd_origin tmpl, int check_duplicates,
                      sd_err *err)
{
    size_t nopt = option_count(), ng;
    const char *const *gs = sd_config_groups(&ng);
    apply_ctx ax = {rc, f->source, tmpl, check_duplicates, NULL, NULL, NULL};
    int rc_ = 0;
    ax.set_mask = sd_xcalloc(nopt, sizeof *ax.set_mask);
    ax.first_line = sd_xcalloc(nopt, sizeof *ax.first_line);
    ax.first_col = sd_xcalloc(nopt, sizeof *ax.first_col);

    for (size_t gi = 0; gi < f->n_groups && rc_ == 0; gi++) {
        const nl_group *g = &f->groups[gi];
        int known = 0;
        for (size_t k = 0; k < ng; k++)
            known |= strcmp(gs[k], g->name) == 0;
        if (!known) {
            const char *s = suggest_group(g->name);
            char list[200];
            size_t n = 0;
            list[0] = '\0';
            for (size_t k = 0; k < ng; k++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s&%s", k ? ", " : "", gs[k]);
            rc_ = sd_err_at(err, f->source, g->line, g->col, "unknown group '&%s'%s%s%s (groups: %s)",
                            g->name, s ? " (did you mean '&" : "", s ? s : "", s ? "'?)" : "", list);
            break;
        }
        if (tmpl.kind == SD_ORIGIN_FILE)
            for (size_t k = 0; k < ng; k++)
                if (strcmp(gs[k], g->name) == 0) {
                    rc->group_line[k] = g->line;
                    rc->group_col[k] = g->col;
                }
        for (size_t gj = 0; gj < gi; gj++)
            if (strcmp(f->groups[gj].name, g->name) == 0) {
                rc_ = sd_err_at(err, f->source, g->line, g->col,
                                "group &%s appears twice (first at line %d): merge them into one",
                                g->name, f->groups[gj].line);
                break;
            }
        for (size_t ai = 0; ai < g->n_assigns && rc_ == 0; ai++) {
            const nl_assign *a = &g->assigns[ai];
            const sd_option *o = sd_config_find(g->name, a->key);
            if (!o) {
                /* The closest key of this group, or the group that has this exact key. */
                size_t n, best_d = 99;
                const sd_option *all = sd_config_options(&n), *best = NULL, *elsewhere = NULL;
                for (size_t k = 0; k < n; k++) {
                    if (strcmp(all[k].group, g->name) == 0) {
                        size_t d = edit_distance(a->key, all[k].key);
                        if (d < best_d) {
                            best_d = d;
                            best = &all[k];
                        }
                    } else if (strcasecmp(all[k].key, a->key) == 0 && !elsewhere) {
                        elsewhere = &all[k];
                    }
                }
                if (best && close_enough(a->key, best_d))
                    rc_ = sd_err_at(err, f->source, a->line, a->col,
                                    "unknown key '%s' in &%s (did you mean '%s'?)", a->key, g->name,
                                    best->key);
                else if (elsewhere)
                    rc_ = sd_err_at(err, f->source, a->line, a->col,
                                    "unknown key '%s' in &%s (it belongs to group &%s)", a->key,
                                    g->name, elsewhere->group);
                else
                    rc_ = sd_err_at(err, f->source, a->line, a->col,
                                    "unknown key '%s' in &%s (see doc/namelist.md for the keys)",
                                    a->key, g->name);
                break;
            }
            rc_ = apply_assign(&ax, o, a, err);
        }
    }
    free(ax.set_mask);
    free(ax.first_line);
    free(ax.first_col);
    return rc_;
}

void sd_run_config_init(sd_run_config *rc)
{
    size_t n, ng;
    const sd_option *all = sd_config_options(&n);
    const char *const *gs = sd_config_groups(&ng);
    sd_origin tmpl = {SD_ORIGIN_DEFAULT, 0, 0, 0};
    strbuf b = {NULL, 0, 0};
    nl_file f;
    sd_err err;
    memset(rc, 0, sizeof *rc);
    rc->origin = sd_xcalloc(n, sizeof *rc->origin);
    /* The defaults go through the same parser and checks as user input, so a bad default
     * in the schema is caught the first time any program starts. */
    for (size_t g = 0; g < ng; g++) {
        sb_printf(&b, "&%s\n", gs[g]);
        for (size_t i = 0; i < n; i++)
            if (strcmp(all[i].group, gs[g]) == 0 && all[i].def[0])
                sb_printf(&b, "  %s = %s\n", all[i].key, all[i].def);
        sb_printf(&b, "/\n");
    }
    SD_CHECK(nl_parse(b.p, b.n, "<schema defaults>", &f, &err) == 0, "%s", err.msg);
    SD_CHECK(apply_file(rc, &f, tmpl, 1, &err) == 0, "%s", err.msg);
    nl_free(&f);
    free(b.p);
}

void sd_run_config_free(sd_run_config *rc)
{
    free(rc->origin);
    rc->origin = NULL;
}

int sd_config_apply(sd_run_config *rc, const nl_file *f, sd_err *err)
{
    sd_origin tmpl = {SD_ORIGIN_FILE, 0, 0, 0};
    return apply_file(rc, f, tmpl, 1, err);
}

/* --set's argument without the blanks before it, around its first '=' and after it: they are
 * the user's spacing ("run.mode = train"), not part of the key or of an unquoted value. */
static char *set_normalize(const char *given)
{
    const char *b = given + strspn(given, " \t");
    const char *eq = strchr(b, '=');
    char *out = sd_xmalloc(strlen(b) + 1);
    size_t n = 0;
    if (eq) {
        size_t k = (size_t)(eq - b);
        while (k > 0 && (b[k - 1] == ' ' || b[k - 1] == '\t'))
            k--;
        memcpy(out, b, k);
        n = k;
        out[n++] = '=';
        b = eq + 1;
        b += strspn(b, " \t");
    }
    memcpy(out + n, b, strlen(b) + 1);
    n += strlen(b);
    while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\t'))
        out[--n] = '\0';
    return out;
}

static int apply_set(sd_run_config *rc, const char *arg, const char *given, int index, sd_err *err);

int sd_config_apply_set(sd_run_config *rc, const char *given, int index, sd_err *err)
{
    char *arg = set_normalize(given);
    const int r = apply_set(rc, arg, given, index, err);
    free(arg);
    return r;
}

/* arg: the normalized form of `given`, which the messages quote */
static int apply_set(sd_run_config *rc, const char *arg, const char *given, int index, sd_err *err)
{
    const char *dot = strchr(arg, '.'), *eq = strchr(arg, '=');
    char group[64], *text;
    const sd_option *o;
    nl_file f;
    int rc_;
    sd_origin tmpl = {SD_ORIGIN_SET, 0, 0, index};

    if (!eq || !dot || dot > eq || dot == arg || (size_t)(dot - arg) >= sizeof group)
        return sd_err_set(err, "command line: --set '%s': expected group.key=value, e.g. --set "
                               "train.learning_rate=2e-4", given);
    memcpy(group, arg, (size_t)(dot - arg));
    group[dot - arg] = '\0';
    {
        /* the key without an index, to find its type */
        char key[64];
        size_t kl = 0;
        const char *p = dot + 1;
        while (p < eq && *p != '(' && !isspace((unsigned char)*p) && kl + 1 < sizeof key)
            key[kl++] = *p++;
        key[kl] = '\0';
        o = sd_config_find(group, key);
    }
    {
        /* Strings may be given without quotes on the command line: quote them here (a string
         * list's unquoted value is one string, commas and all; several need quotes each). */
        const char *val = eq + 1;
        size_t vl = strlen(val), cap = strlen(arg) * 2 + 64;
        size_t n = 0;
        int quote = o &&
                    (o->type == SD_OPT_STRING || o->type == SD_OPT_CHOICE ||
                     o->type == SD_OPT_STRING_LIST) &&
                    val[strspn(val, " \t")] != '\'' && val[strspn(val, " \t")] != '"';
        text = sd_xmalloc(cap);
        n += (size_t)snprintf(text, cap, "&%s\n%.*s=", group, (int)(eq - dot - 1), dot + 1);
        if (quote) {
            text[n++] = '\'';
            for (size_t i = 0; i < vl; i++) {
                if (val[i] == '\'')
                    text[n++] = '\'';
                text[n++] = val[i];
            }
            text[n++] = '\'';
        } else {
            memcpy(text + n, val, vl);
            n += vl;
        }
        memcpy(text + n, "\n/\n", 4);
    }
    rc_ = nl_parse(text, strlen(text), "<set>", &f, err);
    if (rc_ == 0) {
        /* One argument sets one key: a comment character in the key, or a value that ends
         * the group and starts another, would otherwise set nothing or something else. */
        if (f.n_groups != 1 || f.groups[0].n_assigns != 1)
            rc_ = sd_err_set(err, "expected one group.key=value (it reads as %zu assignments "
                                  "in %zu groups)",
                             f.n_groups ? f.groups[0].n_assigns : 0, f.n_groups);
        else
            rc_ = apply_file(rc, &f, tmpl, 1, err);
        nl_free(&f);
    }
    free(text);
    if (rc_ && err) {
        /* "<set>:L:C: message" -> "command line: --set 'arg': message" */
        char msg[sizeof err->msg];
        const char *m = err->msg;
        if (strncmp(m, "<set>:", 6) == 0) {
            m = strchr(m + 6, ':');
            m = m ? strchr(m + 1, ':') : NULL;
            m = m ? m + 2 : err->msg;
        }
        snprintf(msg, sizeof msg, "command line: --set '%.200s': %.780s", given, m);
        memcpy(err->msg, msg, sizeof msg);
        err->line = err->col = 0;
    }
    return rc_;
}

/* ---- cross-key validation --------------------------------------------------------------- */

int sd_config_error_at(const sd_run_config *rc, const char *group, const char *key, sd_err *err,
                       const char *fmt, ...)
{
    size_t ng;
    const char *const *gs = sd_config_groups(&ng);
    char msg[900];
    va_list ap;
    const sd_option *o = sd_config_find(group, key);
    const sd_origin *org = o ? &rc->origin[option_index(o)] : NULL;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (org && org->kind == SD_ORIGIN_SET)
        return sd_err_set(err, "command line: --set #%d: %s", org->set_index, msg);
    if (org && org->kind == SD_ORIGIN_FILE)
        return sd_err_at(err, rc->source, org->line, org->col, "%s", msg);
    for (size_t i = 0; i < ng; i++)
        if (strcmp(gs[i], group) == 0 && rc->group_line[i])
            return sd_err_at(err, rc->source, rc->group_line[i], rc->group_col[i], "%s", msg);
    return sd_err_at(err, rc->source, 1, 1, "%s", msg);
}

static int divisible_list(const sd_run_config *rc, const char *key,
                          const int64_t *v, int n, int64_t by, const char *by_name, sd_err *err)
{
    for (int i = 0; i < n; i++)
        if (v[i] % by != 0)
            return sd_config_error_at(rc, "model", key, err,
                                      "&model %s(%d) = %lld is not a multiple of %s = %lld", key, i + 1,
                                      (long long)v[i], by_name, (long long)by);
    return 0;
}

void sd_config_checkpoint_dir(const sd_config *c, char *buf, size_t size)
{
    if (c->checkpoint.dir[0])
        snprintf(buf, size, "%s", c->checkpoint.dir);
    else
        snprintf(buf, size, "%s/checkpoints", c->run.output_dir);
}

int sd_config_check_mode_inputs(const sd_run_config *rc, sd_err *err)
{
    const sd_config *c = &rc->cfg;
    const char *mode = c->run.mode;
    int needs_input = !strcmp(mode, "process") || !strcmp(mode, "pipeline");
    int needs_shards = strcmp(mode, "sample") != 0;
    if (needs_input && !c->data.input[0])
        return sd_config_error_at(rc, "data", "input", err,
                                  "missing required key 'input' in &data (needed when mode = '%s')", mode);
    if (needs_shards && !c->data.shard_dir[0])
        return sd_config_error_at(rc, "data", "shard_dir", err,
                                  "missing required key 'shard_dir' in &data (needed when mode = '%s')", mode);
    if (!strcmp(mode, "sample") && c->sample.n_prompts == 0 && !c->sample.prompts_file[0])
        return sd_config_error_at(rc, "sample", "prompts", err,
                                  "missing required key 'prompts' in &sample (needed when mode = 'sample'; "
                                  "or give prompts_file)");
    if (!strcmp(mode, "sample") && c->sample.n_negative_prompts > 1 &&
        c->sample.n_negative_prompts != c->sample.n_prompts)
        return sd_config_error_at(rc, "sample", "negative_prompts", err,
                                  "&sample negative_prompts has %d entries for %d prompts: give one "
                                  "(for every prompt) or one per prompt",
                                  c->sample.n_negative_prompts, c->sample.n_prompts);
    return 0;
}

/* Copies [b, e) without the blanks at either end into out (size bytes, the text at most
 * size - 1); 0, or -1 when it is longer. */
static int trimmed(const char *b, const char *e, char *out, size_t size)
{
    while (b < e && (*b == ' ' || *b == '\t'))
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    if ((size_t)(e - b) >= size)
        return -1;
    memcpy(out, b, (size_t)(e - b));
    out[e - b] = '\0';
    return 0;
}

int sd_io_hints_parse(const char *text, sd_io_hint *out, int max, int *n, sd_err *err)
{
    const char *p = text;
    *n = 0;
    for (const char *c = text; *c; c++)
        if (((unsigned char)*c < 0x20 && *c != '\t') || *c == 0x7f)
            return sd_err_set(err, "io_hints holds a control character (byte 0x%02x at %d)",
                              (unsigned)(unsigned char)*c, (int)(c - text) + 1);
    if (!text[strspn(text, " \t")])
        return 0; /* none */
    for (;;) {
        const char *end = strchr(p, ','), *eq;
        char piece[SD_IO_HINT_KEY_MAX + SD_IO_HINT_VALUE_MAX + 8];
        if (!end)
            end = p + strlen(p);
        if (trimmed(p, end, piece, sizeof piece) != 0)
            return sd_err_set(err, "io_hints: '%.40s...' is longer than a hint can be", p);
        eq = memchr(p, '=', (size_t)(end - p));
        if (!piece[0]) {
            return sd_err_set(err, "io_hints: an empty entry (two commas, or one at an end)");
        } else if (!eq) {
            /* a value that holds commas, as cb_config_list's "host1:1,host2:1" */
            sd_io_hint *h = *n > 0 ? &out[*n - 1] : NULL;
            if (!h)
                return sd_err_set(err, "io_hints: '%s' is not key=value", piece);
            if (strlen(h->value) + 1 + strlen(piece) > SD_IO_HINT_VALUE_MAX)
                return sd_err_set(err, "io_hints: the value of '%s' is longer than MPI's %d "
                                  "bytes", h->key, SD_IO_HINT_VALUE_MAX);
            strcat(h->value, ",");
            strcat(h->value, piece);
        } else {
            sd_io_hint h;
            if (*n == max)
                return sd_err_set(err, "io_hints: more than %d hints", max);
            if (trimmed(p, eq, h.key, sizeof h.key) != 0)
                return sd_err_set(err, "io_hints: the key '%.*s...' is longer than MPI's %d bytes",
                                  40, p, SD_IO_HINT_KEY_MAX);
            if (trimmed(eq + 1, end, h.value, sizeof h.value) != 0)
                return sd_err_set(err, "io_hints: the value of '%s' is longer than MPI's %d bytes",
                                  h.key, SD_IO_HINT_VALUE_MAX);
            if (!h.key[0] || !h.value[0])
                return sd_err_set(err, "io_hints: '%s' has an empty %s", piece,
                                  h.key[0] ? "value" : "key");
            if (strpbrk(h.key, " \t"))
                return sd_err_set(err, "io_hints: the key '%s' holds a blank", h.key);
            for (int i = 0; i < *n; i++)
                if (!strcmp(out[i].key, h.key))
                    return sd_err_set(err, "io_hints: '%s' is given twice", h.key);
            out[(*n)++] = h;
        }
        if (!*end)
            return 0;
        p = end + 1;
    }
}

int sd_config_validate(const sd_run_config *rc, sd_err *err)
{
    const sd_config *c = &rc->cfg;
    const char *mode = c->run.mode;

    if (!mode[0])
        return sd_config_error_at(rc, "run", "mode", err,
                                  "missing required key 'mode' in &run (one of 'process', 'train', "
                                  "'pipeline', 'sample')");
    if (!c->run.output_dir[0])
        return sd_config_error_at(rc, "run", "output_dir", err,
                                  "&run output_dir = '' names no directory (used.nml, metrics.jsonl "
                                  "and the run's other files go there)");
    {
        sd_io_hint *hints = sd_xmalloc(SD_IO_HINTS_MAX * sizeof *hints);
        sd_err why;
        int n_hints, bad;
        bad = sd_io_hints_parse(c->run.io_hints, hints, SD_IO_HINTS_MAX, &n_hints, &why);
        free(hints);
        if (bad)
            return sd_config_error_at(rc, "run", "io_hints", err, "&run %s", why.msg);
    }
    if (c->data.filter[0]) {
        sd_meta_filter f;
        sd_err why;
        if (sd_meta_filter_parse(c->data.filter, &f, &why))
            return sd_config_error_at(rc, "data", "filter", err, "&data %s", why.msg);
        if (!strcmp(c->data.input_format, "tsv") &&
            (!strcmp(mode, "process") || !strcmp(mode, "pipeline")))
            return sd_config_error_at(rc, "data", "filter", err,
                                      "&data filter needs each sample's .json metadata, which "
                                      "input_format = 'tsv' has none of");
    }
    if (!strcmp(mode, "pipeline") && c->run.n_process_ranks < 1)
        return sd_config_error_at(rc, "run", "n_process_ranks", err,
                                  "mode = 'pipeline' needs n_process_ranks >= 1 (ranks that preprocess "
                                  "while the others train)");
    if (c->model.resolution % 8 != 0)
        return sd_config_error_at(rc, "model", "resolution", err,
                                  "&model resolution = %lld is not a multiple of 8 (the VAE downsamples by 8)",
                                  (long long)c->model.resolution);
    if (c->sample.width % 8 != 0)
        return sd_config_error_at(rc, "sample", "width", err,
                                  "&sample width = %lld is not a multiple of 8 (the VAE downsamples "
                                  "by 8)", (long long)c->sample.width);
    if (c->sample.height % 8 != 0)
        return sd_config_error_at(rc, "sample", "height", err,
                                  "&sample height = %lld is not a multiple of 8 (the VAE downsamples "
                                  "by 8)", (long long)c->sample.height);
    if (c->model.n_attention_head_dim != 1 &&
        c->model.n_attention_head_dim != c->model.n_block_out_channels)
        return sd_config_error_at(rc, "model", "attention_head_dim", err,
                                  "&model attention_head_dim has %d values: give one, or one per entry of "
                                  "block_out_channels (%d)", c->model.n_attention_head_dim,
                                  c->model.n_block_out_channels);
    /* the U-Net built from these keys (without a snapshot) must be one the forward takes:
     * refused here, at --check, rather than after its weights were allocated */
    if (!c->model.pretrained[0]) {
        if (c->model.block_out_channels[0] > SD_UNET_MAX_TIME_PROJ_DIM)
            return sd_config_error_at(rc, "model", "block_out_channels", err,
                                      "&model block_out_channels(1) = %lld is more than %d (the "
                                      "U-Net's time embedding is 4 x block_out_channels(1) wide)",
                                      (long long)c->model.block_out_channels[0],
                                      SD_UNET_MAX_TIME_PROJ_DIM);
        for (int i = 0; i < c->model.n_block_out_channels; i++) {
            const int64_t heads = c->model.attention_head_dim[c->model.n_attention_head_dim == 1 ? 0 : i];
            if (heads > c->model.block_out_channels[i])
                return sd_config_error_at(rc, "model", "attention_head_dim", err,
                                          "&model attention_head_dim = %lld heads is more than the "
                                          "%lld channels of level %d (block_out_channels(%d))",
                                          (long long)heads, (long long)c->model.block_out_channels[i],
                                          i + 1, i + 1);
        }
    }
    if (divisible_list(rc, "block_out_channels", c->model.block_out_channels,
                       c->model.n_block_out_channels, c->model.norm_num_groups, "norm_num_groups", err) ||
        divisible_list(rc, "vae_block_out_channels", c->model.vae_block_out_channels,
                       c->model.n_vae_block_out_channels, c->model.norm_num_groups, "norm_num_groups", err))
        return -1;
    if (c->model.text_hidden_size % c->model.text_heads != 0)
        return sd_config_error_at(rc, "model", "text_heads", err,
                                  "&model text_hidden_size = %lld is not divisible by text_heads = %lld",
                                  (long long)c->model.text_hidden_size, (long long)c->model.text_heads);
    if (!c->model.pretrained[0] && c->model.cross_attention_dim != c->model.text_hidden_size)
        return sd_config_error_at(rc, "model", "cross_attention_dim", err,
                                  "&model cross_attention_dim = %lld must equal text_hidden_size = %lld "
                                  "(the U-Net attends to the text encoder's output)",
                                  (long long)c->model.cross_attention_dim,
                                  (long long)c->model.text_hidden_size);
    /* diffusers takes equal ends (constant betas); the cosine schedule uses neither end */
    if (strcmp(c->diffusion.beta_schedule, "squaredcos_cap_v2") != 0 &&
        !(c->diffusion.beta_start > 0 && c->diffusion.beta_start <= c->diffusion.beta_end &&
          c->diffusion.beta_end < 1))
        return sd_config_error_at(rc, "diffusion", "beta_end", err,
                                  "&diffusion beta_schedule '%s' needs 0 < beta_start <= beta_end "
                                  "< 1 (beta_start %g, beta_end %g)", c->diffusion.beta_schedule,
                                  c->diffusion.beta_start, c->diffusion.beta_end);
    if (!strcmp(c->train.lr_schedule, "polynomial") && c->train.learning_rate <= 1e-7)
        return sd_config_error_at(rc, "train", "learning_rate", err,
                                  "&train lr_schedule = 'polynomial' decays to 1e-7: learning_rate "
                                  "must be larger");
    if (!strcmp(c->train.lr_schedule, "polynomial") && c->train.max_steps <= c->train.warmup_steps)
        return sd_config_error_at(rc, "train", "warmup_steps", err,
                                  "&train lr_schedule = 'polynomial' needs max_steps > warmup_steps "
                                  "(it decays over the steps after the warmup)");
    if (c->diffusion.rescale_betas_zero_snr && !strcmp(c->diffusion.prediction_type, "epsilon"))
        return sd_config_error_at(rc, "diffusion", "rescale_betas_zero_snr", err,
                                  "&diffusion rescale_betas_zero_snr needs prediction_type = "
                                  "'v_prediction' (at zero SNR the last timestep is pure noise, from "
                                  "which an epsilon prediction gives no image)");
    if (c->sample.prompts_file[0] && c->sample.n_prompts > 0)
        return sd_config_error_at(rc, "sample", "prompts_file", err,
                                  "&sample has both prompts and prompts_file: give one of them");
    if (c->sample.prompts_file[0] && c->sample.n_negative_prompts > 1)
        return sd_config_error_at(rc, "sample", "negative_prompts", err,
                                  "&sample negative_prompts has %d entries, but with prompts_file it "
                                  "takes one (for every prompt)", c->sample.n_negative_prompts);
    if ((!strcmp(mode, "train") || !strcmp(mode, "pipeline")) && c->sample.every_n_steps > 0) {
        if (c->sample.n_prompts == 0 && !c->sample.prompts_file[0])
            return sd_config_error_at(rc, "sample", "every_n_steps", err,
                                      "&sample every_n_steps = %lld needs &sample prompts (the images "
                                      "to make during training)", (long long)c->sample.every_n_steps);
        if (c->checkpoint.every_n_steps == 0 ||
            c->sample.every_n_steps % c->checkpoint.every_n_steps != 0)
            return sd_config_error_at(rc, "sample", "every_n_steps", err,
                                      "&sample every_n_steps = %lld must be a multiple of &checkpoint "
                                      "every_n_steps = %lld (the images come from the checkpoints)",
                                      (long long)c->sample.every_n_steps,
                                      (long long)c->checkpoint.every_n_steps);
    }
    if (c->train.batch_size_per_rank * c->train.grad_accum_steps > 2147483647)
        return sd_config_error_at(rc, "train", "batch_size_per_rank", err,
                                  "&train batch_size_per_rank x grad_accum_steps = %lld x %lld is "
                                  "more than 2147483647 samples per rank and step",
                                  (long long)c->train.batch_size_per_rank,
                                  (long long)c->train.grad_accum_steps);
    /* the &sample keys that only some samplers take: refused here, at --check, where they are
     * used (mode 'sample', images during training), not when the images are made (mode_sample.c
     * repeats the checks with the samplers' own list) */
    if (!strcmp(mode, "sample") ||
        ((!strcmp(mode, "train") || !strcmp(mode, "pipeline")) && c->sample.every_n_steps > 0)) {
        static const char *const sigma_schedulers =
            "|euler|heun|lms|dpm2|dpm2_a|dpmpp_2m|dpmpp_2m_sde|dpmpp_sde|unipc|";
        static const char *const order_schedulers = "|dpmpp_2m|dpmpp_2m_sde|unipc|";
        char bar[80];
        const int sigmas = c->sample.use_karras_sigmas + c->sample.use_exponential_sigmas +
                           c->sample.use_beta_sigmas;
        snprintf(bar, sizeof bar, "|%s|", c->sample.scheduler);
        if (sigmas > 1)
            return sd_config_error_at(rc, "sample", c->sample.use_beta_sigmas ? "use_beta_sigmas"
                                                                               : "use_exponential_sigmas",
                                      err, "&sample: more than one of use_karras_sigmas, "
                                      "use_exponential_sigmas and use_beta_sigmas is .true.: choose one");
        if (sigmas == 1 && !strstr(sigma_schedulers, bar)) {
            const char *key = c->sample.use_karras_sigmas        ? "use_karras_sigmas"
                              : c->sample.use_exponential_sigmas ? "use_exponential_sigmas"
                                                                 : "use_beta_sigmas";
            return sd_config_error_at(rc, "sample", key, err,
                                      "&sample %s = .true. needs scheduler = 'euler', 'heun', 'lms', "
                                      "'dpm2', 'dpm2_a', 'dpmpp_2m', 'dpmpp_2m_sde', 'dpmpp_sde' or "
                                      "'unipc', not '%s'", key, c->sample.scheduler);
        }
        if (c->sample.solver_order > 0 && !strstr(order_schedulers, bar))
            return sd_config_error_at(rc, "sample", "solver_order", err,
                                      "&sample solver_order = %lld needs scheduler = 'dpmpp_2m', "
                                      "'dpmpp_2m_sde' or 'unipc', not '%s'",
                                      (long long)c->sample.solver_order, c->sample.scheduler);
    }
    if ((!strcmp(mode, "process") || !strcmp(mode, "pipeline")) &&
        !strcmp(c->data.encode_precision, "bf16") && !strcmp(c->run.device, "cpu"))
        return sd_config_error_at(rc, "data", "encode_precision", err,
                                  "&data encode_precision = 'bf16' needs a GPU, and &run device = "
                                  "'cpu' encodes in fp32 on the CPU: set device = 'cuda' (or "
                                  "'auto' on a GPU node) or encode_precision = 'auto'");
    if (!strcmp(c->model.unet_init, "pretrained") && !c->model.pretrained[0])
        return sd_config_error_at(rc, "model", "unet_init", err,
                                  "&model unet_init = 'pretrained' needs &model pretrained (a diffusers snapshot)");
    return 0;
}

int sd_config_load(sd_run_config *rc, const char *path, int n_set, char *const *sets, sd_err *err)
{
    nl_file f;
    int r;
    snprintf(rc->source, sizeof rc->source, "%s", path);
    if (nl_parse_file(path, &f, err))
        return -1;
    r = sd_config_apply(rc, &f, err);
    for (int i = 0; r == 0 && i < n_set; i++)
        r = sd_config_apply_set(rc, sets[i], i + 1, err);
    if (r == 0)
        r = sd_config_validate(rc, err);
    nl_free(&f);
    return r;
}

/* ---- printing --------------------------------------------------------------------------- */

static void sb_quoted(strbuf *b, const char *s)
{
    sb_printf(b, "'");
    for (; *s; s++)
        sb_printf(b, *s == '\'' ? "''" : "%c", *s);
    sb_printf(b, "'");
}

/* A byte of a '!' comment's text: a line break (any control character) would end the comment
 * and make the rest namelist text. */
static char comment_byte(char c)
{
    return (unsigned char)c < 0x20 || c == 0x7f ? '?' : c;
}

static void sb_comment(strbuf *b, const char *s)
{
    for (; *s; s++)
        sb_printf(b, "%c", comment_byte(*s));
}

void sd_config_put_comment(FILE *f, const char *s)
{
    for (; *s; s++)
        fputc(comment_byte(*s), f);
}

/* The value of option `o` as namelist text. */
static void sb_value(strbuf *b, const sd_config *c, const sd_option *o)
{
    const void *p = cfield(c, o);
    char num[40];
    switch (o->type) {
    case SD_OPT_INT: sb_printf(b, "%lld", (long long)*(const int64_t *)p); break;
    case SD_OPT_REAL:
        format_real(*(const double *)p, num, sizeof num);
        sb_printf(b, "%s", num);
        break;
    case SD_OPT_LOGICAL: sb_printf(b, "%s", *(const bool *)p ? ".true." : ".false."); break;
    case SD_OPT_STRING:
    case SD_OPT_CHOICE: sb_quoted(b, (const char *)p); break;
    case SD_OPT_INT_LIST:
        for (int i = 0; i < ccount(c, o); i++)
            sb_printf(b, "%s%lld", i ? ", " : "", (long long)((const int64_t *)p)[i]);
        break;
    case SD_OPT_STRING_LIST:
        for (int i = 0; i < ccount(c, o); i++) {
            if (i)
                sb_printf(b, ", ");
            sb_quoted(b, (const char *)p + (size_t)i * o->elem_size);
        }
        break;
    }
}

char *sd_config_to_namelist(const sd_run_config *rc, bool annotate)
{
    size_t n, ng;
    const sd_option *all = sd_config_options(&n);
    const char *const *gs = sd_config_groups(&ng);
    strbuf b = {NULL, 0, 0};
    sb_printf(&b, "%s", "");
    for (size_t g = 0; g < ng; g++) {
        sb_printf(&b, "&%s\n", gs[g]);
        for (size_t i = 0; i < n; i++) {
            const sd_option *o = &all[i];
            size_t start;
            if (strcmp(o->group, gs[g]) != 0)
                continue;
            start = b.n;
            if (is_list(o) && ccount(&rc->cfg, o) == 0)
                sb_printf(&b, "  ! %s = (empty)", o->key);
            else if (o->type == SD_OPT_CHOICE && !*(const char *)cfield(&rc->cfg, o))
                /* an unset choice (no default, e.g. &run mode before validation): '' is not
                 * one of its values, so it is written as a comment and stays unset on reading */
                sb_printf(&b, "  ! %s = (unset)", o->key);
            else {
                sb_printf(&b, "  %s = ", o->key);
                sb_value(&b, &rc->cfg, o);
            }
            if (annotate) {
                const sd_origin *org = &rc->origin[i];
                size_t width = b.n - start;
                sb_printf(&b, "%*s ! ", width < 40 ? (int)(40 - width) : 0, "");
                if (org->kind == SD_ORIGIN_FILE) {
                    sb_comment(&b, rc->source);
                    sb_printf(&b, ":%d", org->line);
                } else if (org->kind == SD_ORIGIN_SET)
                    sb_printf(&b, "--set #%d", org->set_index);
                else
                    sb_printf(&b, "default");
            }
            sb_printf(&b, "\n");
        }
        sb_printf(&b, "/\n");
    }
    return b.p;
}

int sd_config_from_text(sd_run_config *rc, const char *text, size_t len, sd_err *err)
{
    nl_file f;
    int r;
    if (nl_parse(text, len, rc->source[0] ? rc->source : "<config>", &f, err))
        return -1;
    r = sd_config_apply(rc, &f, err);
    nl_free(&f);
    return r;
}

static void sb_md_escape(strbuf *b, const char *s)
{
    for (; *s; s++)
        sb_printf(b, *s == '|' ? "\\|" : "%c", *s);
}

char *sd_config_reference_markdown(void)
{
    size_t n, ng;
    const sd_option *all = sd_config_options(&n);
    const char *const *gs = sd_config_groups(&ng);
    strbuf b = {NULL, 0, 0};
    sd_run_config rc;
    sd_run_config_init(&rc);
    sb_printf(&b, "# sdtrain namelist reference\n\n"
                  "Generated by `sdtool namelist-doc` from the schema in `src/config/schema.c`; "
                  "do not edit by hand (`make check` fails when this file is stale).\n"
                  "Syntax of the file: [namelist-syntax.md](namelist-syntax.md). "
                  "Any key can also be set on the command line: "
                  "`sdtrain input.nml --set group.key=value`.\n");
    for (size_t g = 0; g < ng; g++) {
        sb_printf(&b, "\n## &%s\n\n| key | type | default | allowed | unit | meaning |\n"
                      "|---|---|---|---|---|---|\n", gs[g]);
        for (size_t i = 0; i < n; i++) {
            const sd_option *o = &all[i];
            char allowed[256];
            if (strcmp(o->group, gs[g]) != 0)
                continue;
            if (o->type == SD_OPT_CHOICE)
                format_choices(o->choices, allowed, sizeof allowed);
            else if (o->type == SD_OPT_STRING || o->type == SD_OPT_STRING_LIST)
                snprintf(allowed, sizeof allowed, "at most %zu bytes%s",
                         (o->type == SD_OPT_STRING ? o->capacity : o->elem_size) - 1,
                         o->type == SD_OPT_STRING_LIST ? "" : "");
            else
                format_range(o, allowed, sizeof allowed);
            if (o->type == SD_OPT_INT_LIST || o->type == SD_OPT_STRING_LIST) {
                size_t l = strlen(allowed);
                snprintf(allowed + l, sizeof allowed - l, "%s1 to %zu values", l ? "; " : "", o->capacity);
            }
            sb_printf(&b, "| `%s` | %s | ", o->key, type_name(o->type));
            if (o->type == SD_OPT_CHOICE && !o->def[0])
                sb_printf(&b, "(required)");
            else if (is_list(o) && ccount(&rc.cfg, o) == 0)
                sb_printf(&b, "(none)");
            else {
                sb_printf(&b, "`");
                sb_value(&b, &rc.cfg, o);
                sb_printf(&b, "`");
            }
            sb_printf(&b, " | ");
            sb_md_escape(&b, allowed);
            sb_printf(&b, " | %s | ", o->unit);
            sb_md_escape(&b, o->help);
            sb_printf(&b, " |\n");
        }
    }
    sd_run_config_free(&rc);
    return b.p;
}

void sd_config_print_keys(FILE *out)
{
    size_t n;
    const sd_option *all = sd_config_options(&n);
    sd_run_config rc;
    sd_run_config_init(&rc);
    for (size_t i = 0; i < n; i++) {
        strbuf b = {NULL, 0, 0};
        char name[64];
        sb_printf(&b, "%s", "");
        if (is_list(&all[i]) && ccount(&rc.cfg, &all[i]) == 0)
            sb_printf(&b, "(none)");
        else
            sb_value(&b, &rc.cfg, &all[i]);
        snprintf(name, sizeof name, "%s.%s", all[i].group, all[i].key);
        fprintf(out, "  %-32s %-12s default %s\n", name, type_name(all[i].type), b.p);
        free(b.p);
    }
    sd_run_config_free(&rc);
}
