/* &data filter's text into conditions (include/sdtrain/metafilter.h has the syntax). */
#include "sdtrain/metafilter.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *sd_filter_op_name(sd_filter_op op)
{
    static const char *const names[] = {"<", "<=", ">", ">=", "==", "!="};
    return (unsigned)op < sizeof names / sizeof names[0] ? names[op] : "?";
}

static const char *skip_blanks(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static int key_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.';
}

/* 'and' as a word at p (any case), followed by a blank */
static int and_word(const char *p)
{
    return strncasecmp(p, "and", 3) == 0 && (p[3] == ' ' || p[3] == '\t' || p[3] == '\n' ||
                                             p[3] == '\r');
}

/* where: the text from p, cut for a message */
static int fail_at(sd_err *err, const char *p, const char *what)
{
    if (!*p)
        return sd_err_set(err, "filter: %s at the end of the text", what);
    return sd_err_set(err, "filter: %s at '%.24s%s'", what, p, strlen(p) > 24 ? "..." : "");
}

static int parse_key(const char **pp, sd_filter_cond *c, sd_err *err)
{
    const char *p = *pp, *q = p;
    while (key_char(*q))
        q++;
    if (q == p)
        return fail_at(err, p, "expected a key (a metadata field name)");
    if ((size_t)(q - p) >= sizeof c->key)
        return sd_err_set(err, "filter: the key '%.24s...' is longer than %zu bytes", p,
                          sizeof c->key - 1);
    memcpy(c->key, p, (size_t)(q - p));
    c->key[q - p] = '\0';
    if (c->key[0] == '.' || q[-1] == '.' || strstr(c->key, ".."))
        return sd_err_set(err, "filter: the key '%s' has an empty part between dots", c->key);
    *pp = q;
    return 0;
}

static int parse_op(const char **pp, sd_filter_cond *c, sd_err *err)
{
    const char *p = *pp;
    if (p[0] == '<' && p[1] == '=')
        c->op = SD_FILTER_LE, p += 2;
    else if (p[0] == '>' && p[1] == '=')
        c->op = SD_FILTER_GE, p += 2;
    else if (p[0] == '=' && p[1] == '=')
        c->op = SD_FILTER_EQ, p += 2;
    else if (p[0] == '!' && p[1] == '=')
        c->op = SD_FILTER_NE, p += 2;
    else if (p[0] == '<')
        c->op = SD_FILTER_LT, p += 1;
    else if (p[0] == '>')
        c->op = SD_FILTER_GT, p += 1;
    else if (p[0] == '=')
        return fail_at(err, p, "'=' is no comparison (equal is '==')");
    else
        return fail_at(err, p, "expected a comparison (< <= > >= == !=)");
    *pp = p;
    return 0;
}

static int parse_value(const char **pp, sd_filter_cond *c, sd_err *err)
{
    const char *p = *pp;
    if (*p == '"') {
        size_t n = 0;
        const char *start = p++;
        for (;; p++) {
            if (!*p)
                return fail_at(err, start, "a string without its closing '\"'");
            if (*p == '"')
                break;
            if (*p == '\\' && (p[1] == '"' || p[1] == '\\'))
                p++;
            if (n + 1 >= sizeof c->str)
                return sd_err_set(err, "filter: a string longer than %zu bytes at '%.24s...'",
                                  sizeof c->str - 1, start);
            c->str[n++] = *p;
        }
        c->str[n] = '\0';
        if (c->op != SD_FILTER_EQ && c->op != SD_FILTER_NE)
            return sd_err_set(err, "filter: '%s %s \"%s\"': strings compare only with == and !=",
                              c->key, sd_filter_op_name(c->op), c->str);
        c->is_string = 1;
        *pp = p + 1;
        return 0;
    }
    char *end;
    const char *q = p;
    /* strtod's own words (inf, nan, hex) are not numbers here */
    if (*q == '+' || *q == '-')
        q++;
    if (!isdigit((unsigned char)*q) && !(*q == '.' && isdigit((unsigned char)q[1])))
        return fail_at(err, p, "expected a number or a string in double quotes");
    c->num = strtod(p, &end);
    if (end == p || !isfinite(c->num))
        return fail_at(err, p, "expected a finite number");
    for (const char *x = p; x < end; x++)
        if (*x == 'x' || *x == 'X' || *x == 'p' || *x == 'P')
            return fail_at(err, p, "expected a decimal number");
    c->is_string = 0;
    *pp = end;
    return 0;
}

int sd_meta_filter_parse(const char *text, sd_meta_filter *f, sd_err *err)
{
    const char *p = skip_blanks(text);
    memset(f, 0, sizeof *f);
    while (*p) {
        sd_filter_cond *c;
        if (f->n == SD_FILTER_MAX_CONDS)
            return sd_err_set(err, "filter: more than %d conditions", SD_FILTER_MAX_CONDS);
        c = &f->c[f->n];
        if (parse_key(&p, c, err))
            return -1;
        p = skip_blanks(p);
        if (parse_op(&p, c, err))
            return -1;
        p = skip_blanks(p);
        if (parse_value(&p, c, err))
            return -1;
        f->n++;
        p = skip_blanks(p);
        if (!*p)
            break;
        if (*p == ',')
            p = skip_blanks(p + 1);
        else if (and_word(p))
            p = skip_blanks(p + 3);
        else
            return fail_at(err, p, "expected ',' or 'and' between conditions");
        if (!*p)
            return fail_at(err, p, "expected a condition after ',' or 'and'");
    }
    return 0;
}

int sd_meta_filter_equal(const sd_meta_filter *a, const sd_meta_filter *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++) {
        const sd_filter_cond *x = &a->c[i], *y = &b->c[i];
        if (strcmp(x->key, y->key) || x->op != y->op || x->is_string != y->is_string ||
            (x->is_string ? strcmp(x->str, y->str) != 0 : x->num != y->num))
            return 0;
    }
    return 1;
}
