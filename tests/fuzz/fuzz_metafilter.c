/* libFuzzer harness: &data filter (include/sdtrain/metafilter.h), its text and a sample's .json
 * from arbitrary bytes.
 *
 * Input: up to the first newline the filter's text, the rest the .json (an empty rest: no .json).
 * Invariants:
 *   - a refused text gets a message starting "filter: "; an accepted one 0 to 16 conditions, each
 *     with a key of [A-Za-z0-9_.-] without empty parts between dots, a known comparison, a finite
 *     number or a string (strings only with == and !=);
 *   - the conditions printed back as a filter text parse to the same conditions;
 *   - the verdict is 1, 0 or -1, the same when asked twice, with a reason unless 1; no
 *     conditions pass everything;
 *   - the verdict of all conditions is that of each alone in turn: 1 when each gives 1, else
 *     that of the first that does not; sd_meta_filter_eval_each gives that verdict and reason
 *     and each condition's verdict alone.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh metafilter [SECONDS]. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/metafilter.h"

#define FUZZ_NAME "fuzz_metafilter"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int key_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || k[0] == '.' || k[n - 1] == '.' || strstr(k, ".."))
        return 0;
    for (size_t i = 0; i < n; i++) {
        const char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

static int same_cond(const sd_filter_cond *a, const sd_filter_cond *b)
{
    if (strcmp(a->key, b->key) || a->op != b->op || a->is_string != b->is_string)
        return 0;
    return a->is_string ? !strcmp(a->str, b->str) : a->num == b->num;
}

/* c as filter text (numbers with 17 digits, so that they read back the same) */
static void print_cond(const sd_filter_cond *c, char *out, size_t size)
{
    size_t n = (size_t)snprintf(out, size, "%s %s ", c->key, sd_filter_op_name(c->op));
    if (!c->is_string) {
        snprintf(out + n, size - n, "%.17g", c->num);
        return;
    }
    out[n++] = '"';
    for (const char *p = c->str; *p && n + 3 < size; p++) {
        if (*p == '"' || *p == '\\')
            out[n++] = '\\';
        out[n++] = *p;
    }
    out[n++] = '"';
    out[n] = '\0';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sd_meta_filter f, g, one;
    char why[512], why2[512], detail[600];
    const uint8_t *nl = memchr(data, '\n', size);
    const size_t tlen = nl ? (size_t)(nl - data) : size;
    char *text = malloc(tlen + 1);
    const char *json = nl ? (const char *)nl + 1 : NULL;
    size_t jlen = nl ? size - tlen - 1 : 0;
    sd_err err;
    memcpy(text, data, tlen);
    text[tlen] = '\0';
    if (jlen == 0)
        json = NULL;
    memset(&err, 0, sizeof err);
    if (sd_meta_filter_parse(text, &f, &err)) {
        fuzz_require(strncmp(err.msg, "filter: ", 8) == 0, "a refusal says 'filter: '", err.msg);
        free(text);
        return 0;
    }
    fuzz_require(f.n >= 0 && f.n <= SD_FILTER_MAX_CONDS, "0 to 16 conditions", text);
    /* the whole filter printed back */
    static char printed[SD_FILTER_MAX_CONDS * (SD_FILTER_KEY_MAX + 2 * SD_FILTER_STR_MAX + 40)];
    printed[0] = '\0';
    for (int i = 0; i < f.n; i++) {
        const sd_filter_cond *c = &f.c[i];
        fuzz_require(key_ok(c->key), "a key of [A-Za-z0-9_.-] without empty parts", c->key);
        fuzz_require((unsigned)c->op <= SD_FILTER_NE, "a known comparison", c->key);
        fuzz_require(c->is_string ? (c->op == SD_FILTER_EQ || c->op == SD_FILTER_NE)
                                  : isfinite(c->num),
                     "strings with == and != only, finite numbers", c->key);
        char one_text[SD_FILTER_KEY_MAX + 2 * SD_FILTER_STR_MAX + 40];
        print_cond(c, one_text, sizeof one_text);
        snprintf(printed + strlen(printed), sizeof printed - strlen(printed), "%s%s",
                 i ? ", " : "", one_text);
    }
    memset(&err, 0, sizeof err);
    fuzz_require(sd_meta_filter_parse(printed, &g, &err) == 0 && g.n == f.n, "printed back parses",
                 err.msg[0] ? err.msg : printed);
    for (int i = 0; i < f.n; i++)
        fuzz_require(same_cond(&f.c[i], &g.c[i]), "printed back gives the same conditions",
                     printed);

    const int v = sd_meta_filter_eval(&f, json, jlen, why, sizeof why);
    const int v2 = sd_meta_filter_eval(&f, json, jlen, why2, sizeof why2);
    snprintf(detail, sizeof detail, "%d then %d: %s", v, v2, why);
    fuzz_require(v >= -1 && v <= 1 && v == v2 && !strcmp(why, why2), "the same verdict twice",
                 detail);
    fuzz_require(v == 1 || why[0], "a reason unless it passes", detail);
    fuzz_require(f.n > 0 || v == 1, "no conditions pass everything", detail);
    /* conjunction: each condition alone, in turn; sd_meta_filter_eval_each gives the same
     * verdict and reason, and every condition's own verdict, from one parse */
    int expect = 1, each[SD_FILTER_MAX_CONDS];
    const int ve = sd_meta_filter_eval_each(&f, json, jlen, each, why2, sizeof why2);
    snprintf(detail, sizeof detail, "%d then %d: %.280s / %.280s", v, ve, why, why2);
    fuzz_require(ve == v && !strcmp(why, why2), "eval_each: the same verdict and reason", detail);
    for (int i = 0; i < f.n; i++) {
        one.n = 1;
        one.c[0] = f.c[i];
        const int vi = sd_meta_filter_eval(&one, json, jlen, why2, sizeof why2);
        /* a .json that is no JSON object answers nothing, whatever the condition */
        snprintf(detail, sizeof detail, "condition %d: %d alone, %d in eval_each: %s", i, vi,
                 each[i], text);
        fuzz_require(each[i] == vi, "eval_each: each condition as alone", detail);
        if (expect == 1)
            expect = vi;
    }
    snprintf(detail, sizeof detail, "all %d, one by one %d: %s", v, expect, text);
    fuzz_require(v == expect, "all conditions = each in turn", detail);
    free(text);
    return 0;
}
