/* Fortran-namelist reader: text -> groups of assignments with source positions (no schema).
 *
 * The accepted syntax and the deliberate differences from gfortran and f90nml are described in
 * doc/namelist-syntax.md.  The reader is a hand-written scanner over a byte buffer: every read
 * goes through peek(), which returns 0 past the end, and NUL bytes are rejected before parsing,
 * so no input can make it read out of bounds. */
#include "sdtrain/namelist.h"
#include "sdtrain/utf8.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits that keep hostile or mistyped input from exhausting memory. */
#define NL_MAX_REPEAT 1000000L   /* largest repeat count r in "r*value" */
#define NL_MAX_VALUES 4000000UL  /* most values (after repeat expansion) in one input */
#define NL_MAX_INDEX 2147483647L /* largest element index in "key(i) = ..." */

/* How much of the offending text an error message quotes. */
#define NL_SHOW_MAX 40

typedef struct {
    size_t pos;        /* byte offset into the text */
    int line;          /* 1-based line of pos */
    size_t line_start; /* byte offset of the first byte of that line */
} cursor;

typedef struct {
    int line, col;
} srcpos;

typedef struct {
    const char *t;
    size_t len;
    cursor c;
    const char *source; /* name used in messages */
    sd_err *err;
    nl_file *f;
    size_t cap_groups;  /* capacity of f->groups */
    size_t cap_assigns; /* capacity of the last group's assigns */
    size_t cap_values;  /* capacity of the last assignment's values */
    size_t total_values;
} parser;

/* ---- character classes (ASCII only, independent of the C locale) ---- */

static int is_alpha(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int is_name_char(int c)
{
    return is_alpha(c) || is_digit(c) || c == '_';
}

static int is_blank(int c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

static int to_lower(int c)
{
    return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c;
}

/* ---- small string helpers ---- */

static char *dup_range(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d)
        return NULL;
    if (n)
        memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static char *dup_lower(const char *s, size_t n)
{
    char *d = dup_range(s, n);
    if (d)
        for (size_t i = 0; i < n; i++)
            d[i] = (char)to_lower((unsigned char)d[i]);
    return d;
}

/* Case-insensitive comparison of s[0..n) with the lower-case word w. */
static int word_is(const char *s, size_t n, const char *w)
{
    size_t wn = strlen(w);
    if (n != wn)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (to_lower((unsigned char)s[i]) != w[i])
            return 0;
    return 1;
}

/* Copies s[0..n) into buf for quoting in a message: at most NL_SHOW_MAX bytes (cut on a UTF-8
 * boundary, then "..."), control bytes shown as '?'. */
static const char *show(char *buf, size_t bufsz, const char *s, size_t n)
{
    size_t m = n, o = 0;
    int cut = 0;
    if (m > NL_SHOW_MAX) {
        m = NL_SHOW_MAX;
        while (m > 0 && ((unsigned char)s[m] & 0xC0) == 0x80)
            m--;
        cut = 1;
    }
    for (size_t i = 0; i < m && o + 4 < bufsz; i++) {
        unsigned char ch = (unsigned char)s[i];
        buf[o++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (cut && o + 4 < bufsz) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* Describes a single unexpected byte. */
static const char *show_char(char *buf, size_t bufsz, unsigned char c)
{
    if (c == '\t')
        snprintf(buf, bufsz, "tab");
    else if (c >= 0x80)
        snprintf(buf, bufsz, "byte 0x%02X (non-ASCII text must be inside quotes)", c);
    else if (c < 0x20 || c == 0x7f)
        snprintf(buf, bufsz, "control character 0x%02X", c);
    else
        snprintf(buf, bufsz, "'%c'", c);
    return buf;
}

/* Users coming from shell or Python configs often write '#' comments; say so plainly. */
static int hash_comment_error(const char *source, sd_err *err, int line, int col)
{
    return sd_err_at(err, source, line, col,
                     "'#' does not start a comment in a namelist (use '!')");
}

/* ---- cursor movement ---- */

static int peek_at(const parser *p, size_t k)
{
    size_t i = p->c.pos + k;
    if (i < p->c.pos || i >= p->len)
        return 0;
    return (unsigned char)p->t[i];
}

static int peek(const parser *p)
{
    return peek_at(p, 0);
}

static int at_eof(const parser *p)
{
    return p->c.pos >= p->len;
}

static void adv(parser *p)
{
    if (p->c.pos < p->len) {
        if (p->t[p->c.pos] == '\n') {
            if (p->c.line < INT_MAX)
                p->c.line++;
            p->c.line_start = p->c.pos + 1;
        }
        p->c.pos++;
    }
}

static void adv_n(parser *p, size_t n)
{
    while (n--)
        adv(p);
}

static srcpos pos_of(const cursor *c)
{
    srcpos s;
    size_t col = c->pos - c->line_start + 1;
    s.line = c->line;
    s.col = col > (size_t)INT_MAX ? INT_MAX : (int)col;
    return s;
}

static srcpos here(const parser *p)
{
    return pos_of(&p->c);
}

/* Skips blanks, line ends and '!' comments. */
static void skip_space(parser *p)
{
    for (;;) {
        int c = peek(p);
        if (at_eof(p))
            return;
        if (is_blank(c) || c == '\n') {
            adv(p);
        } else if (c == '!') {
            while (!at_eof(p) && peek(p) != '\n')
                adv(p);
        } else {
            return;
        }
    }
}

/* Length of the name starting at the cursor (0 when it does not start with a letter). */
static size_t name_len_at(const parser *p, size_t k)
{
    size_t n = 0;
    if (!is_alpha(peek_at(p, k)))
        return 0;
    while (is_name_char(peek_at(p, k + n)))
        n++;
    return n;
}

/* Characters that end an unquoted token. */
static int is_separator(int c)
{
    return c == 0 || is_blank(c) || c == '\n' || c == ',' || c == '/' || c == '!' || c == '&' ||
           c == '$';
}

/* Length of the run of bytes from the cursor up to a blank, a line end, a comma, a comment, a
 * quote or an '=' (used to quote the offending text in messages). */
static size_t word_len_at(const parser *p, size_t k, int stop_at_slash)
{
    size_t n = 0;
    for (;;) {
        int c = peek_at(p, k + n);
        if (c == 0 || is_blank(c) || c == '\n' || c == ',' || c == '!' || c == '=' || c == '\'' ||
            c == '"' || (stop_at_slash && c == '/'))
            return n;
        n++;
    }
}

/* ---- building the result ---- */

static int oom(parser *p)
{
    return sd_err_at(p->err, p->source, p->c.line, here(p).col, "out of memory");
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    size_t ncap;
    void *n;
    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap : 4;
    while (ncap < need) {
        if (ncap > ((size_t)-1) / 2 / elem)
            return -1;
        ncap *= 2;
    }
    n = realloc(*arr, ncap * elem);
    if (!n)
        return -1;
    *arr = n;
    *cap = ncap;
    return 0;
}

static nl_group *cur_group(parser *p)
{
    return &p->f->groups[p->f->n_groups - 1];
}

static nl_assign *cur_assign(parser *p)
{
    nl_group *g = cur_group(p);
    return &g->assigns[g->n_assigns - 1];
}

static int add_group(parser *p, const char *name, size_t n, srcpos at)
{
    nl_group *g;
    void *arr = p->f->groups;
    if (grow(&arr, &p->cap_groups, p->f->n_groups + 1, sizeof(nl_group)))
        return oom(p);
    p->f->groups = arr;
    g = &p->f->groups[p->f->n_groups];
    memset(g, 0, sizeof *g);
    g->name = dup_lower(name, n);
    if (!g->name)
        return oom(p);
    g->line = at.line;
    g->col = at.col;
    p->f->n_groups++;
    p->cap_assigns = 0;
    return 0;
}

static int add_assign(parser *p, const char *key, size_t n, int64_t index, srcpos at)
{
    nl_group *g = cur_group(p);
    nl_assign *a;
    void *arr = g->assigns;
    if (grow(&arr, &p->cap_assigns, g->n_assigns + 1, sizeof(nl_assign)))
        return oom(p);
    g->assigns = arr;
    a = &g->assigns[g->n_assigns];
    memset(a, 0, sizeof *a);
    a->key = dup_lower(key, n);
    if (!a->key)
        return oom(p);
    a->index = index;
    a->line = at.line;
    a->col = at.col;
    g->n_assigns++;
    p->cap_values = 0;
    return 0;
}

/* Appends `count` copies of v to the current assignment (strings are duplicated; v.s stays
 * owned by the caller). */
static int add_values(parser *p, const nl_value *v, size_t count, srcpos at)
{
    nl_assign *a = cur_assign(p);
    void *arr = a->values;
    if (count > NL_MAX_VALUES - p->total_values)
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "too many values (more than %lu in one input)", NL_MAX_VALUES);
    if (grow(&arr, &p->cap_values, a->n_values + count, sizeof(nl_value)))
        return oom(p);
    a->values = arr;
    for (size_t i = 0; i < count; i++) {
        nl_value *d = &a->values[a->n_values];
        *d = *v;
        d->s = NULL;
        d->line = at.line;
        d->col = at.col;
        if (v->kind == NL_STRING) {
            d->s = dup_range(v->s, strlen(v->s));
            if (!d->s)
                return oom(p);
        }
        a->n_values++;
    }
    p->total_values += count;
    return 0;
}

static int add_null(parser *p, srcpos at)
{
    nl_value v;
    memset(&v, 0, sizeof v);
    v.kind = NL_NULL;
    return add_values(p, &v, 1, at);
}

/* ---- scalar values ---- */

/* Parses an unsigned decimal digit string into *out; returns -1 on overflow past `limit`. */
static int parse_digits(const char *s, size_t n, uint64_t limit, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (limit - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* Checks the syntax of a number token s[0..n); sets *is_real. Returns 0 when valid. */
static int check_number(const char *s, size_t n, int *is_real)
{
    size_t i = 0, idig = 0, fdig = 0, edig = 0;
    *is_real = 0;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    for (; i < n && is_digit((unsigned char)s[i]); i++)
        idig++;
    if (i < n && s[i] == '.') {
        *is_real = 1;
        i++;
        for (; i < n && is_digit((unsigned char)s[i]); i++)
            fdig++;
    }
    if (idig + fdig == 0)
        return -1;
    if (i < n && (s[i] == 'e' || s[i] == 'E' || s[i] == 'd' || s[i] == 'D')) {
        *is_real = 1;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        for (; i < n && is_digit((unsigned char)s[i]); i++)
            edig++;
        if (edig == 0)
            return -1;
    }
    return i == n ? 0 : -1;
}

/* Converts a syntactically valid integer token. */
static int convert_int(const char *s, size_t n, int64_t *out)
{
    int neg = 0;
    uint64_t u;
    if (n && (*s == '+' || *s == '-')) {
        neg = *s == '-';
        s++;
        n--;
    }
    if (parse_digits(s, n, neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX, &u))
        return -1;
    if (neg)
        *out = u == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)u;
    else
        *out = (int64_t)u;
    return 0;
}

/* Converts a syntactically valid real token to the nearest double.  The decimal point is
 * removed (its effect folded into the exponent) so that strtod never depends on the C locale;
 * strtod rounds correctly, so the result is the same as Python's float() of the same text. */
static int convert_real(const char *s, size_t n, double *out)
{
    char small[128];
    char *buf = small;
    size_t o = 0, i = 0;
    long long exp = 0, frac = 0;
    int eneg = 0;
    double v;

    if (n + 32 > sizeof small) {
        buf = malloc(n + 32);
        if (!buf)
            return -2;
    }
    if (s[i] == '+' || s[i] == '-')
        buf[o++] = s[i++];
    while (i < n && is_digit((unsigned char)s[i]))
        buf[o++] = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && is_digit((unsigned char)s[i])) {
            buf[o++] = s[i++];
            if (frac < 1000000000LL)
                frac++;
            else
                frac = 1000000000LL; /* saturate: strtod sees a huge exponent either way */
        }
    }
    if (i < n) { /* exponent letter e, E, d or D */
        i++;
        if (s[i] == '+' || s[i] == '-')
            eneg = s[i++] == '-';
        while (i < n) {
            if (exp < 1000000000LL)
                exp = exp * 10 + (s[i] - '0');
            i++;
        }
        if (eneg)
            exp = -exp;
    }
    snprintf(buf + o, 32, "e%lld", exp - frac);
    v = strtod(buf, NULL);
    if (buf != small)
        free(buf);
    if (isinf(v))
        return -1;
    *out = v;
    return 0;
}

/* True when s[0..n) is one of the logical spellings f90nml and gfortran both accept. */
static int logical_word(const char *s, size_t n, int *b)
{
    static const char *const yes[] = {".true.", ".t.", "true", "t"};
    static const char *const no[] = {".false.", ".f.", "false", "f"};
    for (size_t i = 0; i < 4; i++) {
        if (word_is(s, n, yes[i])) {
            *b = 1;
            return 1;
        }
        if (word_is(s, n, no[i])) {
            *b = 0;
            return 1;
        }
    }
    return 0;
}

/* Parses a quoted string at the cursor into v (v->s allocated). */
static int parse_string(parser *p, nl_value *v)
{
    srcpos at = here(p);
    const size_t open = p->c.pos;
    int q = peek(p);
    size_t n = 0;
    char *d;

    adv(p);
    /* First pass: find the end and the unescaped length. */
    for (size_t k = 0;; k++) {
        int c = peek_at(p, k);
        if (p->c.pos + k >= p->len || c == '\n')
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "unterminated string: no closing %c on this line (strings cannot "
                             "continue onto the next line)",
                             q);
        if (c == q) {
            if (peek_at(p, k + 1) != q)
                break;
            k++;
        }
        n++;
    }
    d = malloc(n + 1);
    if (!d)
        return oom(p);
    n = 0;
    for (;;) {
        int c = (unsigned char)p->t[p->c.pos];
        adv(p);
        if (c == q) {
            if (peek(p) != q)
                break;
            adv(p);
        }
        d[n++] = (char)c;
    }
    d[n] = '\0';
    /* Text, as JSON (checkpoint manifests, summaries) and f90nml need it: the first ill-formed
     * byte is refused where it stands (its column found again over the doubled quotes). */
    {
        const size_t good = sd_utf8_valid_prefix(d, n);
        if (good < n) {
            size_t k = open + 1;
            for (size_t o = 0; o < good; o++)
                k += (unsigned char)p->t[k] == q ? 2 : 1;
            const unsigned char bad = (unsigned char)d[good];
            free(d);
            return sd_err_at(p->err, p->source, at.line, at.col + (int)(k - open),
                             "a string that is not UTF-8: byte 0x%02X here starts no valid UTF-8 "
                             "character (a namelist is UTF-8 text: convert Latin-1 and other "
                             "encodings, e.g. with iconv)",
                             bad);
        }
    }
    v->kind = NL_STRING;
    v->s = d;
    return 0;
}

/* Parses a number or a ".true."-style logical at the cursor (which is at a digit, a sign or a
 * period). */
static int parse_number_or_dot_logical(parser *p, nl_value *v)
{
    srcpos at = here(p);
    const char *s = p->t + p->c.pos;
    char sb[NL_SHOW_MAX * 2];
    size_t n = 0;
    int is_real;

    if (peek(p) == '.' && is_alpha(peek_at(p, 1))) {
        n = 1 + name_len_at(p, 1);
        if (peek_at(p, n) == '.')
            n++;
        if (!logical_word(s, n, &v->b)) {
            size_t w = word_len_at(p, 0, 1);
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "invalid logical '%s' (write .true. or .false., .t. or .f., T or F)",
                             show(sb, sizeof sb, s, w > n ? w : n));
        }
        v->kind = NL_LOGICAL;
        adv_n(p, n);
        return 0;
    }
    while (is_name_char(peek_at(p, n)) || peek_at(p, n) == '.' || peek_at(p, n) == '+' ||
           peek_at(p, n) == '-')
        n++;
    if (check_number(s, n, &is_real)) {
        size_t w = word_len_at(p, 0, 1);
        if (w < n)
            w = n;
        if (memchr(s, '_', n))
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "invalid number '%s' (kind suffixes such as _8 are not supported)",
                             show(sb, sizeof sb, s, w));
        return sd_err_at(p->err, p->source, at.line, at.col, "invalid number '%s'",
                         show(sb, sizeof sb, s, w));
    }
    if (is_real) {
        int rc = convert_real(s, n, &v->r);
        if (rc == -2)
            return oom(p);
        if (rc)
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "real number '%s' is out of range (too large for a double)",
                             show(sb, sizeof sb, s, n));
        v->kind = NL_REAL;
    } else {
        if (convert_int(s, n, &v->i))
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "integer '%s' is out of range (64-bit integers go from "
                             "-9223372036854775808 to 9223372036854775807)",
                             show(sb, sizeof sb, s, n));
        v->kind = NL_INT;
    }
    adv_n(p, n);
    return 0;
}

/* Error for an unquoted word (that is not a logical) used as a value. */
static int bare_word_error(parser *p)
{
    srcpos at = here(p);
    char sb[NL_SHOW_MAX * 2];
    size_t w = word_len_at(p, 0, 0);
    show(sb, sizeof sb, p->t + p->c.pos, w);
    return sd_err_at(p->err, p->source, at.line, at.col,
                     "unquoted string %s: strings must be quoted, e.g. '%s'", sb, sb);
}

/* Parses one scalar value at the cursor: string, number or logical. */
static int parse_scalar(parser *p, nl_value *v)
{
    int c = peek(p);
    char cb[80];
    srcpos at = here(p);

    memset(v, 0, sizeof *v);
    if (c == '\'' || c == '"')
        return parse_string(p, v);
    if (is_digit(c) || c == '+' || c == '-' || c == '.')
        return parse_number_or_dot_logical(p, v);
    if (is_alpha(c)) {
        size_t n = name_len_at(p, 0);
        if (!is_separator(peek_at(p, n)) || !logical_word(p->t + p->c.pos, n, &v->b))
            return bare_word_error(p);
        v->kind = NL_LOGICAL;
        adv_n(p, n);
        return 0;
    }
    if (c == '(') {
        char sb[NL_SHOW_MAX * 2];
        size_t n = 1;
        while (peek_at(p, n) && peek_at(p, n) != '\n' && peek_at(p, n) != ')')
            n++;
        if (peek_at(p, n) == ')')
            n++;
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "complex values such as '%s' are not supported",
                         show(sb, sizeof sb, p->t + p->c.pos, n));
    }
    if (c == '#')
        return hash_comment_error(p->source, p->err, at.line, at.col);
    return sd_err_at(p->err, p->source, at.line, at.col, "unexpected %s where a value was expected",
                     show_char(cb, sizeof cb, (unsigned char)c));
}

/* ---- statements ---- */

/* True when the name at the cursor is followed (after blanks, line ends and comments) by '=',
 * '(' or '%', i.e. it starts the next assignment rather than being a value. */
static int key_ahead(parser *p)
{
    cursor save = p->c;
    int c;
    adv_n(p, name_len_at(p, 0));
    skip_space(p);
    c = peek(p);
    p->c = save;
    return c == '=' || c == '(' || c == '%';
}

/* True when only blanks precede the cursor on its line. */
static int first_on_line(const parser *p)
{
    for (size_t i = p->c.line_start; i < p->c.pos; i++)
        if (!is_blank((unsigned char)p->t[i]))
            return 0;
    return 1;
}

/* Describes what is at the cursor ("'xyz'" or "end of input") for "expected ..., found ..." */
static const char *show_found(const parser *p, char *buf, size_t bufsz)
{
    size_t w;
    char sb[NL_SHOW_MAX * 2];
    if (at_eof(p)) {
        snprintf(buf, bufsz, "end of input");
        return buf;
    }
    w = word_len_at(p, 0, 0);
    if (w == 0)
        w = 1;
    snprintf(buf, bufsz, "'%s'", show(sb, sizeof sb, p->t + p->c.pos, w));
    return buf;
}

static int check_after_value(parser *p)
{
    char cb[80];
    srcpos at = here(p);
    if (is_separator(peek(p)))
        return 0;
    if (peek(p) == '#')
        return hash_comment_error(p->source, p->err, at.line, at.col);
    return sd_err_at(p->err, p->source, at.line, at.col,
                     "unexpected %s after a value (separate values with commas or blanks)",
                     show_char(cb, sizeof cb, (unsigned char)peek(p)));
}

/* Parses "r*" (at the cursor: optional sign, digits, '*') and what follows it. */
static int parse_repeat(parser *p, size_t count_len)
{
    srcpos at = here(p);
    const char *s = p->t + p->c.pos;
    char sb[NL_SHOW_MAX * 2];
    uint64_t r = 0;
    int neg = 0;
    size_t nd = count_len;
    const char *d = s;
    nl_value v;
    int c, rc;

    show(sb, sizeof sb, s, count_len + 1);
    if (*d == '+' || *d == '-') {
        neg = *d == '-';
        d++;
        nd--;
    }
    if (parse_digits(d, nd, (uint64_t)NL_MAX_REPEAT, &r))
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "repeat count '%s' is too large (at most %ld)", sb, NL_MAX_REPEAT);
    if (neg || r == 0)
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "repeat count '%s' must be at least 1", sb);
    adv_n(p, count_len + 1);
    c = peek(p);
    if (at_eof(p) || c == ',' || c == '/' || c == '&' || c == '$') {
        memset(&v, 0, sizeof v);
        return add_values(p, &v, (size_t)r, at);
    }
    if (is_blank(c) || c == '\n' || c == '!') {
        /* "r*" then a blank: r null values, unless a value follows, which f90nml and gfortran
         * read differently; refuse that rather than guess. */
        cursor save = p->c;
        int ok;
        skip_space(p);
        c = peek(p);
        ok = at_eof(p) || c == ',' || c == '/' || c == '&' || c == '$' ||
             (is_alpha(c) && key_ahead(p));
        p->c = save;
        if (!ok)
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "blank after repeat count '%s': write '%s' followed directly by the "
                             "value to repeat it, or '%s,' for null values",
                             sb, sb, sb);
        memset(&v, 0, sizeof v);
        return add_values(p, &v, (size_t)r, at);
    }
    if (parse_scalar(p, &v))
        return -1;
    rc = add_values(p, &v, (size_t)r, at);
    free(v.s);
    return rc;
}

/* Parses the value list after "key =" up to the next key, the group end or the end of input. */
static int parse_values(parser *p)
{
    enum { AFTER_EQUALS, AFTER_COMMA, AFTER_VALUE } prev = AFTER_EQUALS;

    for (;;) {
        srcpos at;
        int c;
        size_t k;

        skip_space(p);
        at = here(p);
        c = peek(p);
        if (at_eof(p))
            return 0;
        if (c == ',') {
            if (prev != AFTER_VALUE && add_null(p, at))
                return -1;
            prev = AFTER_COMMA;
            adv(p);
            continue;
        }
        if (c == '/' || c == '&' || c == '$' || (is_alpha(c) && key_ahead(p)))
            return prev == AFTER_EQUALS ? add_null(p, at) : 0;

        /* repeat count "r*" */
        k = (c == '+' || c == '-') ? 1 : 0;
        while (is_digit(peek_at(p, k)))
            k++;
        if (k > 0 && is_digit(peek_at(p, k - 1)) && peek_at(p, k) == '*') {
            if (parse_repeat(p, k))
                return -1;
        } else if (is_alpha(c)) {
            size_t n = name_len_at(p, 0);
            nl_value v;
            memset(&v, 0, sizeof v);
            if (is_separator(peek_at(p, n)) && logical_word(p->t + p->c.pos, n, &v.b)) {
                v.kind = NL_LOGICAL;
                adv_n(p, n);
                if (add_values(p, &v, 1, at))
                    return -1;
            } else if (prev == AFTER_VALUE && first_on_line(p)) {
                /* Most likely a key whose '=' was forgotten. */
                char fb[NL_SHOW_MAX * 2 + 8];
                char kb[NL_SHOW_MAX * 2];
                show(kb, sizeof kb, p->t + p->c.pos, n);
                adv_n(p, n);
                skip_space(p);
                at = here(p);
                return sd_err_at(p->err, p->source, at.line, at.col,
                                 "expected '=' after '%s', found %s", kb,
                                 show_found(p, fb, sizeof fb));
            } else {
                return bare_word_error(p);
            }
        } else {
            nl_value v;
            int rc;
            if (parse_scalar(p, &v))
                return -1;
            rc = add_values(p, &v, 1, at);
            free(v.s);
            if (rc)
                return -1;
        }
        if (check_after_value(p))
            return -1;
        prev = AFTER_VALUE;
    }
}

/* Parses "(i)" after a key; the cursor is at '('. */
static int parse_index(parser *p, const char *key, size_t key_len, srcpos key_at, int64_t *index)
{
    srcpos open = here(p), at;
    char kb[NL_SHOW_MAX * 2], sb[NL_SHOW_MAX * 2], ub[NL_SHOW_MAX * 2];
    const char *s;
    size_t n = 0, k;
    uint64_t u;
    int neg = 0;

    show(kb, sizeof kb, key, key_len);
    /* The construct as written, up to ')' on this line, for messages about it.  Once a ')' is
     * known to follow on this line, every scan below stops at or before it. */
    k = 1;
    while (peek_at(p, k) && peek_at(p, k) != '\n' && peek_at(p, k) != ')')
        k++;
    show(ub, sizeof ub, key, (size_t)(p->t + p->c.pos - key) + k + (peek_at(p, k) == ')'));
    if (peek_at(p, k) != ')')
        return sd_err_at(p->err, p->source, open.line, open.col,
                         "unclosed '(' in index of '%s' (no ')' on this line)", kb);

    adv(p);
    while (is_blank(peek(p)))
        adv(p);
    at = here(p);
    s = p->t + p->c.pos;
    if (peek_at(p, n) == '+' || peek_at(p, n) == '-') {
        neg = peek_at(p, n) == '-';
        n++;
    }
    while (is_digit(peek_at(p, n)))
        n++;
    if (n == 0 || !is_digit(peek_at(p, n - 1))) {
        int c = peek_at(p, n);
        if (n == 0 && c == ':')
            return sd_err_at(p->err, p->source, key_at.line, key_at.col,
                             "array slice '%s' is not supported", ub);
        if (n == 0 && c == ')')
            return sd_err_at(p->err, p->source, at.line, at.col, "empty index in '%s'", ub);
        if (n == 0 && c == ',')
            return sd_err_at(p->err, p->source, key_at.line, key_at.col,
                             "multi-dimensional index '%s' is not supported", ub);
        n = 0;
        while (peek_at(p, n) && !is_blank(peek_at(p, n)) && peek_at(p, n) != '\n' &&
               peek_at(p, n) != ')' && peek_at(p, n) != ',' && peek_at(p, n) != ':')
            n++;
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "invalid index '%s' for '%s': expected a positive integer",
                         show(sb, sizeof sb, s, n), kb);
    }
    show(sb, sizeof sb, s, n);
    adv_n(p, n);
    while (is_blank(peek(p)))
        adv(p);
    switch (peek(p)) {
    case ')':
        break;
    case ',':
        return sd_err_at(p->err, p->source, key_at.line, key_at.col,
                         "multi-dimensional index '%s' is not supported", ub);
    case ':':
        return sd_err_at(p->err, p->source, key_at.line, key_at.col,
                         "array slice '%s' is not supported", ub);
    default: {
        size_t w = 0;
        while (peek_at(p, w) && !is_blank(peek_at(p, w)) && peek_at(p, w) != '\n' &&
               peek_at(p, w) != ')' && peek_at(p, w) != ',' && peek_at(p, w) != ':')
            w++;
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "invalid index '%s' for '%s': expected a positive integer",
                         show(sb, sizeof sb, s, (size_t)(p->t + p->c.pos - s) + w), kb);
    }
    }
    if (neg)
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "invalid index '%s' for '%s': indices start at 1", sb, kb);
    {
        size_t skip = (s[0] == '+') ? 1 : 0;
        if (parse_digits(s + skip, n - skip, (uint64_t)NL_MAX_INDEX, &u))
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "index '%s' for '%s' is too large (at most %ld)", sb, kb,
                             NL_MAX_INDEX);
    }
    if (u == 0)
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "invalid index '%s' for '%s': indices start at 1", sb, kb);
    adv(p); /* ')' */
    *index = (int64_t)u;
    return 0;
}

/* Parses "key = values" or "key(i) = values"; the cursor is at the key's first letter. */
static int parse_assignment(parser *p)
{
    srcpos key_at = here(p);
    const char *key = p->t + p->c.pos;
    size_t n = name_len_at(p, 0);
    int64_t index = 0;
    char kb[NL_SHOW_MAX * 2], fb[NL_SHOW_MAX * 2 + 8], sb[NL_SHOW_MAX * 2];
    srcpos at;

    adv_n(p, n);
    if (peek(p) == '(' && parse_index(p, key, n, key_at, &index))
        return -1;
    if (peek(p) == '%') {
        size_t m = 1 + name_len_at(p, 1);
        return sd_err_at(p->err, p->source, key_at.line, key_at.col,
                         "derived-type component '%s' is not supported",
                         show(sb, sizeof sb, key, (size_t)(p->t + p->c.pos - key) + m));
    }
    show(kb, sizeof kb, key, (size_t)(p->t + p->c.pos - key));
    skip_space(p);
    if (peek(p) != '=') {
        at = here(p);
        return sd_err_at(p->err, p->source, at.line, at.col, "expected '=' after '%s', found %s",
                         kb, show_found(p, fb, sizeof fb));
    }
    adv(p);
    if (add_assign(p, key, n, index, key_at))
        return -1;
    return parse_values(p);
}

/* Parses a group; the cursor is at its '&' or '$'. */
static int parse_group(parser *p)
{
    srcpos gat = here(p), at;
    int lead = peek(p);
    const char *name = p->t + p->c.pos + 1;
    size_t n = name_len_at(p, 1);
    char gb[NL_SHOW_MAX * 2 + 2], sb[NL_SHOW_MAX * 2], cb[80];

    if (n == 0)
        return sd_err_at(p->err, p->source, gat.line, gat.col,
                         "expected a group name right after '%c'", lead);
    if (word_is(name, n, "end"))
        return sd_err_at(p->err, p->source, gat.line, gat.col,
                         "'%cend' outside a group (no group is open here)", lead);
    snprintf(gb, sizeof gb, "%c%s", lead, show(sb, sizeof sb, name, n));
    adv_n(p, n + 1);
    if (!is_separator(peek(p)) || peek(p) == ',') {
        at = here(p);
        return sd_err_at(p->err, p->source, at.line, at.col, "unexpected %s after group name '%s'",
                         show_char(cb, sizeof cb, (unsigned char)peek(p)), gb);
    }
    if (add_group(p, name, n, gat))
        return -1;

    for (;;) {
        int c;
        skip_space(p);
        at = here(p);
        c = peek(p);
        if (at_eof(p))
            return sd_err_at(p->err, p->source, gat.line, gat.col,
                             "group '%s' is not terminated: no '/' found before the end of the "
                             "input",
                             gb);
        if (c == '/') {
            cur_group(p)->end_line = at.line;
            cur_group(p)->end_col = at.col;
            adv(p);
            return 0;
        }
        if (c == '&' || c == '$') {
            size_t m = name_len_at(p, 1);
            if (m == 3 && word_is(p->t + p->c.pos + 1, m, "end")) {
                cur_group(p)->end_line = at.line;
                cur_group(p)->end_col = at.col;
                adv_n(p, m + 1);
                return 0;
            }
            if (m > 0)
                return sd_err_at(p->err, p->source, at.line, at.col,
                                 "group '%c%s' starts inside group '%s' (is the '/' that ends "
                                 "'%s' missing?)",
                                 c, show(sb, sizeof sb, p->t + p->c.pos + 1, m), gb, gb);
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "unexpected '%c' inside group '%s' (end a group with '/')", c, gb);
        }
        if (is_alpha(c)) {
            if (parse_assignment(p))
                return -1;
            continue;
        }
        if (c == '=')
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "'=' without a key (expected 'name = value')");
        if (c == '#')
            return hash_comment_error(p->source, p->err, at.line, at.col);
        if (is_digit(c) || c == '+' || c == '-' || c == '.' || c == '\'' || c == '"' ||
            c == '(' || c == '*') {
            size_t w = word_len_at(p, 0, 1);
            if (c == '\'' || c == '"') {
                /* Quote the whole string when it is closed on this line. */
                size_t k = 1;
                while (peek_at(p, k) && peek_at(p, k) != '\n' && peek_at(p, k) != c)
                    k++;
                w = k + (peek_at(p, k) == c);
            }
            return sd_err_at(p->err, p->source, at.line, at.col,
                             "value '%s' has no key (expected 'name = value')",
                             show(sb, sizeof sb, p->t + p->c.pos, w ? w : 1));
        }
        return sd_err_at(p->err, p->source, at.line, at.col,
                         "unexpected %s in group '%s' (expected 'name = value' or '/')",
                         show_char(cb, sizeof cb, (unsigned char)c), gb);
    }
}

/* ---- public API ---- */

int nl_parse(const char *text, size_t len, const char *source, nl_file *out, sd_err *err)
{
    parser p;
    const char *nul;
    nl_file f;

    if (!source)
        source = "<input>";
    if (!out)
        return sd_err_at(err, source, 1, 1, "internal error: nl_parse called without a result");
    memset(out, 0, sizeof *out);
    if (!text && len)
        return sd_err_at(err, source, 1, 1, "internal error: nl_parse called without text");

    memset(&p, 0, sizeof p);
    memset(&f, 0, sizeof f);
    p.t = text ? text : "";
    p.len = text ? len : 0;
    p.c.line = 1;
    p.source = source;
    p.err = err;
    p.f = &f;

    nul = p.len ? memchr(p.t, '\0', p.len) : NULL;
    if (nul) {
        /* Report the position of the first NUL byte; the text is not parsed. */
        cursor c = {0, 1, 0};
        srcpos at;
        for (size_t i = 0; i < (size_t)(nul - p.t); i++)
            if (p.t[i] == '\n') {
                if (c.line < INT_MAX)
                    c.line++;
                c.line_start = i + 1;
            }
        c.pos = (size_t)(nul - p.t);
        at = pos_of(&c);
        return sd_err_at(err, source, at.line, at.col,
                         "NUL byte in input (a namelist must be text)");
    }

    f.source = dup_range(source, strlen(source));
    if (!f.source)
        return sd_err_at(err, source, 1, 1, "out of memory");

    for (;;) {
        int c;
        srcpos at;
        skip_space(&p);
        if (at_eof(&p))
            break;
        c = peek(&p);
        at = here(&p);
        if (c == '&' || c == '$') {
            if (parse_group(&p))
                goto fail;
        } else {
            char sb[NL_SHOW_MAX * 2], cb[80];
            size_t w = word_len_at(&p, 0, 0);
            if (c == '#')
                hash_comment_error(source, err, at.line, at.col);
            else if (c >= 0x80 || c < 0x20 || c == 0x7f)
                sd_err_at(err, source, at.line, at.col, "text outside a group: %s",
                          show_char(cb, sizeof cb, (unsigned char)c));
            else
                sd_err_at(err, source, at.line, at.col,
                          "text outside a group: '%s' (only blank lines and '!' comments may "
                          "appear outside '&name ... /')",
                          show(sb, sizeof sb, p.t + p.c.pos, w ? w : 1));
            goto fail;
        }
    }
    *out = f;
    return 0;

fail:
    nl_free(&f);
    return -1;
}

int nl_parse_file(const char *path, nl_file *out, sd_err *err)
{
    FILE *fp;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc;

    if (out)
        memset(out, 0, sizeof *out);
    if (!path)
        return sd_err_set(err, "cannot read a namelist: no path given");
    errno = 0;
    fp = fopen(path, "rb");
    if (!fp)
        return sd_err_set(err, "cannot read '%s': %s", path,
                          errno ? strerror(errno) : "cannot open file");
    for (;;) {
        size_t got;
        if (len == cap) {
            char *nb;
            size_t ncap = cap ? cap * 2 : 65536;
            if (ncap < cap || !(nb = realloc(buf, ncap))) {
                free(buf);
                fclose(fp);
                return sd_err_set(err, "cannot read '%s': out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        errno = 0;
        got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) {
            if (ferror(fp)) {
                int e = errno;
                free(buf);
                fclose(fp);
                return sd_err_set(err, "cannot read '%s': %s", path,
                                  e ? strerror(e) : "read error");
            }
            break;
        }
    }
    fclose(fp);
    rc = nl_parse(buf ? buf : "", len, path, out, err);
    free(buf);
    return rc;
}

void nl_free(nl_file *f)
{
    if (!f)
        return;
    for (size_t g = 0; g < f->n_groups; g++) {
        nl_group *gr = &f->groups[g];
        for (size_t a = 0; a < gr->n_assigns; a++) {
            nl_assign *as = &gr->assigns[a];
            for (size_t v = 0; v < as->n_values; v++)
                free(as->values[v].s);
            free(as->values);
            free(as->key);
        }
        free(gr->assigns);
        free(gr->name);
    }
    free(f->groups);
    free(f->source);
    memset(f, 0, sizeof *f);
}

const char *nl_kind_name(nl_kind k)
{
    switch (k) {
    case NL_NULL:
        return "null";
    case NL_INT:
        return "integer";
    case NL_REAL:
        return "real";
    case NL_LOGICAL:
        return "logical";
    case NL_STRING:
        return "string";
    }
    return "unknown";
}
