/* &data filter (include/sdtrain/metafilter.h): the parser's conditions and messages, and the
 * verdicts on img2dataset-style metadata: true, false, and cannot answer (missing field, wrong
 * kind, no .json, not JSON). */
#include <stdio.h>
#include <string.h>

#include "sdtrain/metafilter.h"
#include "tap.h"

static const char *const META =
    "{\"url\": \"http://x/y.jpg\", \"key\": \"000000012\", \"status\": \"success\", "
    "\"error_message\": null, \"width\": 256, \"height\": 256, \"original_width\": 1024, "
    "\"original_height\": 683, \"punsafe\": 0.0123, \"AESTHETIC_SCORE\": 5.25, "
    "\"watermark\": false, \"exif\": {\"Orientation\": 6, \"Make\": \"Canon\"}, "
    "\"caption\": \"a \\\"red\\\" car\"}\n";

/* verdict of `text` on META (parsed first; -2 when the text does not parse) */
static int verdict(const char *text, const char *json, char *why, size_t n)
{
    sd_meta_filter f;
    sd_err err;
    memset(&err, 0, sizeof err);
    if (sd_meta_filter_parse(text, &f, &err)) {
        snprintf(why, n, "%.300s", err.msg);
        return -2;
    }
    return sd_meta_filter_eval(&f, json, json ? strlen(json) : 0, why, n);
}

int main(void)
{
    sd_meta_filter f;
    sd_err err;
    char why[400];

    /* parsing */
    memset(&err, 0, sizeof err);
    tap_ok(sd_meta_filter_parse("", &f, &err) == 0 && f.n == 0, "'' is no filter");
    tap_ok(sd_meta_filter_parse("  \t ", &f, &err) == 0 && f.n == 0, "blanks are no filter");
    tap_ok(sd_meta_filter_parse("original_width >= 512, punsafe<0.1 AND status == \"success\"",
                                &f, &err) == 0 &&
               f.n == 3 && !strcmp(f.c[0].key, "original_width") && f.c[0].op == SD_FILTER_GE &&
               f.c[0].num == 512 && !f.c[0].is_string && !strcmp(f.c[1].key, "punsafe") &&
               f.c[1].op == SD_FILTER_LT && f.c[1].num == 0.1 && f.c[2].is_string &&
               f.c[2].op == SD_FILTER_EQ && !strcmp(f.c[2].str, "success"),
           "three conditions, ',' and 'AND', with and without blanks %s", err.msg);
    tap_ok(sd_meta_filter_parse("a.b-c_d != \"x\\\"y\\\\z\", n > -1.5e3, m <= +.5", &f, &err) == 0 &&
               f.n == 3 && !strcmp(f.c[0].key, "a.b-c_d") && f.c[0].op == SD_FILTER_NE &&
               !strcmp(f.c[0].str, "x\"y\\z") && f.c[1].num == -1500 && f.c[2].num == 0.5 &&
               f.c[2].op == SD_FILTER_LE,
           "dotted key, escapes in a string, signed and exponent numbers %s", err.msg);
    struct {
        const char *text, *msg;
    } bad[] = {
        {"width", "expected a comparison (< <= > >= == !=) at the end of the text"},
        {"width = 5", "'=' is no comparison (equal is '==') at '= 5'"},
        {"width >= ", "expected a number or a string in double quotes at the end of the text"},
        {"width > big", "expected a number or a string in double quotes at 'big'"},
        {"width > inf", "expected a number or a string in double quotes at 'inf'"},
        {"width > nan", "expected a number or a string in double quotes at 'nan'"},
        {"width > 0x10", "expected a decimal number at '0x10'"},
        {"width > 1e999", "expected a finite number at '1e999'"},
        {"status < \"a\"", "'status < \"a\"': strings compare only with == and !="},
        {"status == \"abc", "a string without its closing '\"' at '\"abc'"},
        {"width > 5,", "expected a condition after ',' or 'and' at the end of the text"},
        {"width > 5 and", "expected ',' or 'and' between conditions at 'and'"},
        {"width > 5 or height > 5", "expected ',' or 'and' between conditions at 'or height > 5'"},
        {", width > 5", "expected a key (a metadata field name) at ', width > 5'"},
        {"a..b > 1", "the key 'a..b' has an empty part between dots"},
        {".a > 1", "the key '.a' has an empty part between dots"},
        {"width > 5 height > 5", "expected ',' or 'and' between conditions at 'height > 5'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&err, 0, sizeof err);
        const int rc = sd_meta_filter_parse(bad[i].text, &f, &err);
        char want[300];
        snprintf(want, sizeof want, "filter: %s", bad[i].msg);
        tap_ok(rc != 0 && !strcmp(err.msg, want), "refused: [%s] -> %s", bad[i].text, err.msg);
    }
    {
        char many[600] = "";
        for (int i = 0; i <= SD_FILTER_MAX_CONDS; i++)
            snprintf(many + strlen(many), sizeof many - strlen(many), "%sk%d > %d", i ? ", " : "",
                     i, i);
        memset(&err, 0, sizeof err);
        tap_ok(sd_meta_filter_parse(many, &f, &err) != 0 && strstr(err.msg, "more than 16"),
               "17 conditions refused: %s", err.msg);
        char longkey[300];
        memset(longkey, 'k', 200);
        snprintf(longkey + 200, sizeof longkey - 200, " > 1");
        tap_ok(sd_meta_filter_parse(longkey, &f, &err) != 0 && strstr(err.msg, "longer than 127"),
               "a key of 200 bytes refused: %s", err.msg);
    }

    {
        sd_meta_filter a, b;
        tap_ok(sd_meta_filter_parse("a>1,b==\"x\"", &a, &err) == 0 &&
                   sd_meta_filter_parse(" a > 1.0 AND b == \"x\" ", &b, &err) == 0 &&
                   sd_meta_filter_equal(&a, &b),
               "equal: the same conditions spaced and joined otherwise");
        tap_ok(sd_meta_filter_parse("b==\"x\", a>1", &b, &err) == 0 && !sd_meta_filter_equal(&a, &b),
               "equal: not in another order");
        tap_ok(sd_meta_filter_parse("a>=1,b==\"x\"", &b, &err) == 0 && !sd_meta_filter_equal(&a, &b),
               "equal: not with another comparison");
        tap_ok(sd_meta_filter_parse("a>1", &b, &err) == 0 && !sd_meta_filter_equal(&a, &b),
               "equal: not with fewer conditions");
    }

    /* verdicts on META */
    struct {
        const char *text;
        int want;
        const char *why; /* a part of the reason, or NULL */
    } cases[] = {
        {"original_width >= 512, original_height >= 512", 1, NULL},
        {"original_width >= 512, original_height >= 1024", 0,
         "original_height >= 1024 is false (683)"},
        {"punsafe < 0.1", 1, NULL},
        {"punsafe < 0.01", 0, "punsafe < 0.01 is false (0.0123)"},
        {"AESTHETIC_SCORE >= 5.25", 1, NULL},
        {"AESTHETIC_SCORE > 5.25", 0, NULL},
        {"width == 256 and height != 255", 1, NULL},
        {"width <= 255", 0, NULL},
        {"status == \"success\"", 1, NULL},
        {"status != \"success\"", 0, "status != \"success\" is false (\"success\")"},
        {"caption == \"a \\\"red\\\" car\"", 1, NULL},
        {"watermark == 0", 1, NULL},
        {"watermark == 1", 0, NULL},
        {"exif.Orientation == 6, exif.Make == \"Canon\"", 1, NULL},
        {"exif.Orientation > 6", 0, NULL},
        {"aesthetic_score > 1", -1, "the metadata has no 'aesthetic_score'"},
        {"error_message == \"x\"", -1, "the metadata has no 'error_message'"},
        {"status > 1", -1, "metadata 'status' is no number"},
        {"width == \"256\"", -1, "metadata 'width' is no string"},
        {"exif > 1", -1, "metadata 'exif' is no number"},
        {"exif.Make.x == 1", -1, "the metadata has no 'exif.Make.x'"},
        {"width < 1, nothing > 1", 0, "width < 1 is false"}, /* the first false one says */
        {"nothing > 1, width < 1", -1, "no 'nothing'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int v = verdict(cases[i].text, META, why, sizeof why);
        tap_ok(v == cases[i].want && (!cases[i].why || strstr(why, cases[i].why)),
               "[%s] -> %d (%s)", cases[i].text, v, why);
    }
    tap_ok(verdict("width > 1", NULL, why, sizeof why) == -1 && strstr(why, "no .json"),
           "no .json: cannot answer (%s)", why);
    tap_ok(verdict("", NULL, why, sizeof why) == 1, "no filter: every sample passes, .json or not");
    tap_ok(verdict("width > 1", "{\"width\": 3", why, sizeof why) == -1 &&
               strstr(why, "not valid JSON (it ends inside the value)"),
           "cut JSON: cannot answer (%s)", why);
    tap_ok(verdict("width > 1", "{\"width\": 3,, }", why, sizeof why) == -1 &&
               strstr(why, "not valid JSON ("), "bad JSON: cannot answer (%s)", why);
    tap_ok(verdict("width > 1", "{\"width\": 3} {}", why, sizeof why) == -1 &&
               strstr(why, "not valid JSON"), "two values: cannot answer (%s)", why);
    tap_ok(verdict("width > 1", "[1, 2]", why, sizeof why) == -1 && strstr(why, "not a JSON object"),
           "an array: cannot answer (%s)", why);
    tap_ok(verdict("width > 1", "{\"width\": NaN}", why, sizeof why) == -1, "NaN: cannot answer (%s)",
           why);
    tap_ok(verdict("width > 1", "{\"width\": 3}\n\n", why, sizeof why) == 1,
           "blank lines after the object are fine (%s)", why);
    tap_ok(verdict("width > 1", "{\"width\": 1, \"width\": 3}", why, sizeof why) == 1,
           "a field given twice: the last one counts, as in Python's json (%s)", why);
    {
        const char nul[] = "{\"s\": \"a\\u0000b\"}";
        tap_ok(verdict("s != \"a\"", nul, why, sizeof why) == 1 &&
                   verdict("s == \"a\"", nul, why, sizeof why) == 0,
               "a string with U+0000 equals no filter string");
    }
    return tap_done();
}
