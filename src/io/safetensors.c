/* safetensors reader (mmap + validation), sharded index sets, writer (sdtrain/safetensors.h). */
#include "sdtrain/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/progress.h"

/* Tensor bytes are copied or reinterpreted as they lie in the file. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; a big-endian host needs byte swaps here"
#endif

/* JSON nesting the reader accepts: the format needs 3 levels (header, entry, shape); a little
 * slack for ignored extra fields, yet small enough that nothing recurses deeply. */
#define ST_JSON_MAX_DEPTH 16
/* Longest part of a name quoted in a message (names can be as long as the header). */
#define ST_NAME_SHOWN 160

/* ---- dtypes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    unsigned bits;
} st_dtypes[SD_ST_DTYPE_COUNT] = {
    [SD_ST_BOOL] = {"BOOL", 8},
    [SD_ST_F4] = {"F4", 4},
    [SD_ST_F6_E2M3] = {"F6_E2M3", 6},
    [SD_ST_F6_E3M2] = {"F6_E3M2", 6},
    [SD_ST_U8] = {"U8", 8},
    [SD_ST_I8] = {"I8", 8},
    [SD_ST_F8_E5M2] = {"F8_E5M2", 8},
    [SD_ST_F8_E4M3] = {"F8_E4M3", 8},
    [SD_ST_F8_E8M0] = {"F8_E8M0", 8},
    [SD_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8},
    [SD_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8},
    [SD_ST_I16] = {"I16", 16},
    [SD_ST_U16] = {"U16", 16},
    [SD_ST_F16] = {"F16", 16},
    [SD_ST_BF16] = {"BF16", 16},
    [SD_ST_I32] = {"I32", 32},
    [SD_ST_U32] = {"U32", 32},
    [SD_ST_F32] = {"F32", 32},
    [SD_ST_C64] = {"C64", 64},
    [SD_ST_F64] = {"F64", 64},
    [SD_ST_I64] = {"I64", 64},
    [SD_ST_U64] = {"U64", 64},
};

static int st_dtype_valid(sd_st_dtype d)
{
    return (int)d >= 0 && d < SD_ST_DTYPE_COUNT;
}

const char *sd_st_dtype_name(sd_st_dtype dtype)
{
    return st_dtype_valid(dtype) ? st_dtypes[dtype].name : "?";
}

int sd_st_dtype_from_name(const char *name, sd_st_dtype *out)
{
    if (!name)
        return -1;
    for (int d = 0; d < SD_ST_DTYPE_COUNT; d++) {
        if (strcmp(name, st_dtypes[d].name) == 0) {
            *out = (sd_st_dtype)d;
            return 0;
        }
    }
    return -1;
}

unsigned sd_st_dtype_bits(sd_st_dtype dtype)
{
    return st_dtype_valid(dtype) ? st_dtypes[dtype].bits : 0;
}

int sd_st_dtype_to_sd(sd_st_dtype dtype, sd_dtype *out)
{
    switch (dtype) {
    case SD_ST_F32: *out = SD_F32; return 0;
    case SD_ST_F16: *out = SD_F16; return 0;
    case SD_ST_BF16: *out = SD_BF16; return 0;
    case SD_ST_I32: *out = SD_I32; return 0;
    case SD_ST_I64: *out = SD_I64; return 0;
    case SD_ST_U8: *out = SD_U8; return 0;
    default: return -1;
    }
}

sd_st_dtype sd_st_dtype_from_sd(sd_dtype dtype)
{
    switch (dtype) {
    case SD_F32: return SD_ST_F32;
    case SD_F16: return SD_ST_F16;
    case SD_BF16: return SD_ST_BF16;
    case SD_I32: return SD_ST_I32;
    case SD_I64: return SD_ST_I64;
    case SD_U8: return SD_ST_U8;
    default: return SD_ST_DTYPE_COUNT;
    }
}

/* ---- messages ----------------------------------------------------------------------------- */

/* "path: <message>"; returns -1. */
static int st_fail(sd_err *err, const char *path, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static int st_fail(sd_err *err, const char *path, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sd_err_set(err, "%s: %s", path ? path : "<safetensors>", msg);
}

/* Offset of the first byte that is not valid RFC 3629 UTF-8 (overlong forms, surrogates and
 * code points past U+10FFFF included), or n when all is valid. JSON text must be UTF-8 and the
 * reference (Rust's from_utf8) is this strict; json-c's own check lets overlong forms through. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (size_t j = 1; j < len; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += len;
    }
    return n;
}

static int utf8_valid(const unsigned char *s, size_t n)
{
    return utf8_check(s, n) == n;
}

/* A name as it may be quoted in a message: control bytes and invalid UTF-8 escaped, long names
 * cut, so that a hostile name cannot flood or garble a terminal or a log. */
static const char *shown(const char *s, size_t len, char *buf, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= ST_NAME_SHOWN) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        size_t seq = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                   : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (c >= 0x80 && seq && i + seq <= len && o + seq + 8 < size &&
            utf8_check((const unsigned char *)s + i, seq) == seq) {
            memcpy(buf + o, s + i, seq); /* keep valid UTF-8 readable */
            o += seq;
            i += seq - 1;
        } else if (c < 0x20 || c >= 0x7f || c == '\\') {
            o += (size_t)snprintf(buf + o, size - o, c == '\\' ? "\\\\" : "\\x%02x", c);
        } else {
            buf[o++] = (char)c;
        }
    }
    buf[o] = '\0';
    return buf;
}
#define SHOWN_SIZE (4 * ST_NAME_SHOWN + 16)

/* ---- JSON --------------------------------------------------------------------------------- */



/* A decoded object key seen by the strict scan. */
typedef struct {
    const char *s;
    size_t len;
    char *owned; /* set when the key had escapes and was decoded by json-c */
} scan_key;

typedef struct {
    int is_object;
    int expect_key;
    size_t first_key; /* index in the key stack of this object's first key */
    size_t last_key;  /* index of the key whose value is being read, SIZE_MAX if none */
} scan_frame;

static int key_cmp(const void *a, const void *b)
{
    const scan_key *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c)
        return c;
    return (x->len > y->len) - (x->len < y->len);
}

/* The value of the 4 hex digits of a "\\uXXXX" escape whose 'u' is at text[at - 1], or -1 when
 * the escape is not a \\u one. */
static long hex4(const char *text, size_t len, size_t at)
{
    long v = 0;
    if (at < 1 || text[at - 1] != 'u' || at + 4 > len)
        return -1;
    for (size_t k = at; k < at + 4; k++) {
        char h = text[k];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/*
 * json-c parses the JSON, but is more lenient than the reference in ways that matter here:
 * it keeps the last of duplicate keys silently (so two entries could claim one name, and
 * other readers might take the first), stores keys as C strings (so "a\u0000b" would become
 * "a"), accepts raw control characters inside strings, unpaired UTF-16 surrogates, NaN and
 * Infinity literals and (even in strict mode) single-quoted keys. This scan
 * walks text json-c has already accepted (so it is well formed) and rejects those. It does
 * not parse values; escaped keys are decoded by json-c.
 */
static int json_strict_scan(const char *text, size_t len, const char *path, const char *what,
                            const char *top_key_kind, sd_err *err)
{
    scan_frame frames[ST_JSON_MAX_DEPTH + 1];
    size_t depth = 0;
    scan_key *keys = NULL;
    size_t n_keys = 0, cap_keys = 0;
    struct json_tokener *tok = NULL;
    int rc = 0;
    char b1[SHOWN_SIZE], b2[SHOWN_SIZE];

    for (size_t i = 0; i < len && rc == 0; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '"') {
            size_t start = i++;
            int escaped = 0;
            for (; i < len && text[i] != '"'; i++) {
                if ((unsigned char)text[i] < 0x20) {
                    rc = st_fail(err, path, "%s is not valid JSON: raw control character 0x%02x "
                                 "in a string at byte %zu", what, (unsigned char)text[i], i);
                    break;
                }
                if (text[i] != '\\')
                    continue;
                escaped = 1;
                i++;
                /* json-c turns unpaired UTF-16 surrogates into U+FFFD; the reference (and
                 * JSON's UTF-8 rule) rejects them. json-c has checked the 4 hex digits. */
                long u = hex4(text, len, i + 1);
                if (u >= 0xDC00 && u <= 0xDFFF) {
                    rc = st_fail(err, path, "%s is not valid JSON: unpaired surrogate \\u%04lx "
                                 "at byte %zu", what, u, i - 1);
                    break;
                }
                if (u >= 0xD800 && u <= 0xDBFF) {
                    long lo = i + 6 < len && text[i + 5] == '\\' && text[i + 6] == 'u'
                                  ? hex4(text, len, i + 7) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        rc = st_fail(err, path, "%s is not valid JSON: unpaired surrogate "
                                     "\\u%04lx at byte %zu", what, u, i - 1);
                        break;
                    }
                    i += 6; /* the low half is consumed with the high one */
                }
            }
            if (rc)
                break;
            if (i >= len) {
                rc = st_fail(err, path, "%s is not valid JSON: unterminated string", what);
                break;
            }
            if (depth == 0 || !frames[depth - 1].is_object || !frames[depth - 1].expect_key)
                continue;
            scan_key k = {text + start + 1, i - start - 1, NULL};
            if (escaped) {
                if (!tok)
                    tok = json_tokener_new();
                SD_CHECK(tok, "json_tokener_new failed");
                json_tokener_reset(tok);
                json_object *js = json_tokener_parse_ex(tok, text + start, (int)(i + 1 - start));
                if (!js || !json_object_is_type(js, json_type_string)) {
                    json_object_put(js);
                    rc = st_fail(err, path, "%s is not valid JSON: bad key at byte %zu", what,
                                 start);
                    break;
                }
                k.len = (size_t)json_object_get_string_len(js);
                k.owned = sd_xmalloc(k.len + 1);
                memcpy(k.owned, json_object_get_string(js), k.len + 1);
                k.s = k.owned;
                json_object_put(js);
            }
            if (memchr(k.s, '\0', k.len)) {
                rc = st_fail(err, path, "%s has a key with a NUL character (\\u0000): '%s'", what,
                             shown(k.s, k.len, b1, sizeof b1));
                free(k.owned);
                break;
            }
            if (n_keys == cap_keys) {
                cap_keys = cap_keys ? 2 * cap_keys : 64;
                keys = sd_xrealloc(keys, cap_keys * sizeof *keys);
            }
            frames[depth - 1].expect_key = 0;
            frames[depth - 1].last_key = n_keys;
            keys[n_keys++] = k;
        } else if (c == '{' || c == '[') {
            if (depth == ST_JSON_MAX_DEPTH) {
                rc = st_fail(err, path, "%s is nested too deeply", what);
                break;
            }
            frames[depth].is_object = c == '{';
            frames[depth].expect_key = c == '{';
            frames[depth].first_key = n_keys;
            frames[depth].last_key = SIZE_MAX;
            depth++;
        } else if (c == '}' || c == ']') {
            if (depth == 0) {
                rc = st_fail(err, path, "%s is not valid JSON: unbalanced '%c'", what, c);
                break;
            }
            scan_frame *fr = &frames[--depth];
            if (!fr->is_object)
                continue;
            size_t m = n_keys - fr->first_key;
            if (m > 1) { /* (with fewer keys, `keys` may still be NULL) */
                scan_key *mine = keys + fr->first_key;
                /* Sorting reorders only this object's keys, which are discarded below. */
                qsort(mine, m, sizeof *mine, key_cmp);
                for (size_t j = 1; j < m && rc == 0; j++) {
                    if (key_cmp(&mine[j - 1], &mine[j]) != 0)
                        continue;
                    if (depth == 0) {
                        rc = st_fail(err, path, "%s has a duplicate %s '%s'", what, top_key_kind,
                                     shown(mine[j].s, mine[j].len, b1, sizeof b1));
                    } else {
                        const scan_frame *parent = &frames[depth - 1];
                        if (parent->last_key != SIZE_MAX) {
                            const scan_key *pk = &keys[parent->last_key];
                            rc = st_fail(err, path, "%s has a duplicate key '%s' in '%s'", what,
                                         shown(mine[j].s, mine[j].len, b1, sizeof b1),
                                         shown(pk->s, pk->len, b2, sizeof b2));
                        } else {
                            rc = st_fail(err, path, "%s has a duplicate key '%s'", what,
                                         shown(mine[j].s, mine[j].len, b1, sizeof b1));
                        }
                    }
                }
            }
            for (size_t j = fr->first_key; j < n_keys; j++)
                free(keys[j].owned);
            n_keys = fr->first_key;
        } else if (c == ',') {
            if (depth > 0 && frames[depth - 1].is_object)
                frames[depth - 1].expect_key = 1;
        } else if (c == '\'') {
            /* json-c takes single-quoted keys even in strict mode. */
            rc = st_fail(err, path, "%s is not valid JSON: single-quoted string at byte %zu",
                         what, i);
        } else if (c == 'N' || c == 'I' || c == 'n' || c == 'i') {
            /* Outside strings JSON has only true, false and null; json-c also takes NaN and
             * Infinity (any case when not strict), which the reference rejects. */
            if (c == 'n' && i + 3 < len && memcmp(text + i, "null", 4) == 0) {
                i += 3;
                continue;
            }
            rc = st_fail(err, path, "%s is not valid JSON: NaN or Infinity literal at byte %zu",
                         what, i);
        }
    }
    for (size_t j = 0; j < n_keys; j++)
        free(keys[j].owned);
    free(keys);
    if (tok)
        json_tokener_free(tok);
    return rc;
}

static int is_json_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Parses `len` bytes as one JSON object (surrounding JSON whitespace allowed, as in the
 * reference), with the strict scan above. `what` names the text in messages ("header"). */
static int json_parse_object(const char *text, size_t len, const char *path, const char *what,
                             const char *top_key_kind, json_object **out, sd_err *err)
{
    *out = NULL;
    if (len > (size_t)INT32_MAX)
        return st_fail(err, path, "%s is too large (%zu bytes)", what, len);
    size_t bad = utf8_check((const unsigned char *)text, len);
    if (bad != len)
        return st_fail(err, path, "%s is not valid JSON: invalid UTF-8 at byte %zu", what, bad);
    struct json_tokener *tok = json_tokener_new_ex(ST_JSON_MAX_DEPTH);
    SD_CHECK(tok, "json_tokener_new_ex failed");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *root = json_tokener_parse_ex(tok, text, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (jerr == json_tokener_continue || (jerr == json_tokener_success && !root)) {
        json_object_put(root);
        return st_fail(err, path, "%s is not valid JSON: it ends before the JSON value does "
                       "(%zu bytes)", what, len);
    }
    if (jerr != json_tokener_success) {
        json_object_put(root);
        return st_fail(err, path, "%s is not valid JSON: %s at byte %zu", what,
                       json_tokener_error_desc(jerr), end);
    }
    for (size_t i = end; i < len; i++) {
        if (!is_json_ws((unsigned char)text[i])) {
            json_object_put(root);
            return st_fail(err, path, "%s is not valid JSON: byte 0x%02x after the JSON value "
                           "at byte %zu (only JSON whitespace may follow it)", what,
                           (unsigned char)text[i], i);
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return st_fail(err, path, "%s is not a JSON object", what);
    }
    if (json_strict_scan(text, end, path, what, top_key_kind, err)) {
        json_object_put(root);
        return -1;
    }
    *out = root;
    return 0;
}

/* A JSON integer in [0, INT64_MAX). json-c saturates larger numbers at INT64_MAX or UINT64_MAX,
 * so INT64_MAX itself counts as out of range (no valid size or offset comes near it).
 * Returns 0, -1 (not an integer), -2 (negative) or -3 (too large). */
static int json_size_value(json_object *v, uint64_t *out)
{
    if (!json_object_is_type(v, json_type_int))
        return -1;
    int64_t x = json_object_get_int64(v);
    if (x < 0)
        return -2;
    if (x == INT64_MAX)
        return -3;
    *out = (uint64_t)x;
    return 0;
}

/* ---- reader ------------------------------------------------------------------------------- */

typedef struct {
    uint64_t begin, end;
    size_t header_index;
    sd_st_tensor t;
} st_entry;

static int entry_cmp(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return (x->header_index > y->header_index) - (x->header_index < y->header_index);
}

static int tensor_ptr_name_cmp(const void *a, const void *b)
{
    const sd_st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int meta_cmp(const void *a, const void *b)
{
    const sd_st_meta *x = a, *y = b;
    return strcmp(x->key, y->key);
}

/* Bump allocation of the file's strings from one block sized in advance. */
typedef struct {
    char *base;
    size_t used, cap;
} str_pool;

static const char *pool_add(str_pool *p, const char *s, size_t len)
{
    SD_CHECK(p->used + len + 1 <= p->cap, "string pool too small (%zu + %zu > %zu)", p->used,
             len + 1, p->cap);
    char *d = p->base + p->used;
    memcpy(d, s, len);
    d[len] = '\0';
    p->used += len + 1;
    return d;
}

/* Reads one tensor entry of the header into *e. */
static int parse_entry(const char *path, const char *name, json_object *v, uint64_t buffer_len,
                       st_entry *e, sd_err *err)
{
    char nb[SHOWN_SIZE], sb[256];
    const char *nm = shown(name, strlen(name), nb, sizeof nb);
    json_object *jd, *js, *jo;

    if (!json_object_is_type(v, json_type_object))
        return st_fail(err, path, "tensor '%s': entry is not a JSON object", nm);
    if (!json_object_object_get_ex(v, "dtype", &jd))
        return st_fail(err, path, "tensor '%s': no \"dtype\"", nm);
    if (!json_object_object_get_ex(v, "shape", &js))
        return st_fail(err, path, "tensor '%s': no \"shape\"", nm);
    if (!json_object_object_get_ex(v, "data_offsets", &jo))
        return st_fail(err, path, "tensor '%s': no \"data_offsets\"", nm);

    if (!json_object_is_type(jd, json_type_string))
        return st_fail(err, path, "tensor '%s': \"dtype\" is not a string", nm);
    const char *dname = json_object_get_string(jd);
    size_t dlen = (size_t)json_object_get_string_len(jd);
    if (strlen(dname) != dlen || sd_st_dtype_from_name(dname, &e->t.dtype) != 0)
        return st_fail(err, path, "tensor '%s': unknown dtype '%s'", nm,
                       shown(dname, dlen, sb, sizeof sb));

    if (!json_object_is_type(js, json_type_array))
        return st_fail(err, path, "tensor '%s': \"shape\" is not an array", nm);
    size_t nd = json_object_array_length(js);
    if (nd > SD_TENSOR_MAX_DIMS)
        return st_fail(err, path, "tensor '%s': shape has %zu dimensions; sdtrain reads at most %d",
                       nm, nd, SD_TENSOR_MAX_DIMS);
    e->t.ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d = 0;
        json_object *jv = json_object_array_get_idx(js, i);
        int r = json_size_value(jv, &d);
        if (r == -1)
            return st_fail(err, path, "tensor '%s': shape[%zu] is not an integer", nm, i);
        if (r == -2)
            return st_fail(err, path, "tensor '%s': shape[%zu] = %" PRId64 " is negative", nm, i,
                           json_object_get_int64(jv));
        if (r == -3)
            return st_fail(err, path, "tensor '%s': shape[%zu] is too large", nm, i);
        e->t.shape[i] = (int64_t)d;
    }
    const char *shape_s = sd_shape_str(e->t.ndim, e->t.shape, sb, sizeof sb);

    /* Bits of the non-zero dimensions must fit in int64: the reference only checks the full
     * product, which a zero dimension makes 0 whatever the others are, but code that computes
     * strides from such a shape would overflow. */
    uint64_t bits = sd_st_dtype_bits(e->t.dtype), capacity = bits;
    int64_t numel = 1;
    for (int i = 0; i < e->t.ndim; i++) {
        uint64_t d = (uint64_t)e->t.shape[i];
        if (d == 0) {
            numel = 0;
            continue;
        }
        if (capacity > (uint64_t)INT64_MAX / d)
            return st_fail(err, path, "tensor '%s': shape %s is too large (its byte size "
                           "overflows)", nm, shape_s);
        capacity *= d;
        numel = numel == 0 ? 0 : numel * (int64_t)d;
    }
    uint64_t total_bits = (uint64_t)numel * bits;
    if (total_bits % 8 != 0)
        return st_fail(err, path, "tensor '%s': %s %s is %" PRIu64 " bits, not a whole number of "
                       "bytes", nm, sd_st_dtype_name(e->t.dtype), shape_s, total_bits);
    e->t.numel = numel;

    if (!json_object_is_type(jo, json_type_array) || json_object_array_length(jo) != 2)
        return st_fail(err, path, "tensor '%s': \"data_offsets\" is not an array of two integers",
                       nm);
    uint64_t off[2];
    for (size_t i = 0; i < 2; i++) {
        json_object *jv = json_object_array_get_idx(jo, i);
        int r = json_size_value(jv, &off[i]);
        if (r == -1)
            return st_fail(err, path, "tensor '%s': data_offsets[%zu] is not an integer", nm, i);
        if (r == -2)
            return st_fail(err, path, "tensor '%s': data_offsets[%zu] = %" PRId64 " is negative",
                           nm, i, json_object_get_int64(jv));
        if (r == -3)
            return st_fail(err, path, "tensor '%s': data_offsets[%zu] is too large", nm, i);
    }
    e->begin = off[0];
    e->end = off[1];
    if (off[1] < off[0])
        return st_fail(err, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end "
                       "before they begin", nm, off[0], off[1]);
    if (off[1] > buffer_len)
        return st_fail(err, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past "
                       "the end of the %" PRIu64 "-byte data buffer (truncated file?)", nm, off[0],
                       off[1], buffer_len);
    if (off[1] - off[0] != total_bits / 8)
        return st_fail(err, path, "tensor '%s': %s %s needs %" PRIu64 " bytes but data_offsets "
                       "[%" PRIu64 ", %" PRIu64 "] hold %" PRIu64, nm,
                       sd_st_dtype_name(e->t.dtype), shape_s, total_bits / 8, off[0], off[1],
                       off[1] - off[0]);
    e->t.nbytes = (size_t)(off[1] - off[0]);
    return 0;
}

static int parse_metadata(const char *path, json_object *v, json_object **meta, sd_err *err)
{
    char b[SHOWN_SIZE];
    *meta = NULL;
    if (json_object_is_type(v, json_type_null))
        return 0; /* the reference reads null as "no metadata" */
    if (!json_object_is_type(v, json_type_object))
        return st_fail(err, path, "\"__metadata__\" is not an object of strings");
    json_object_object_foreach(v, key, val) {
        if (!json_object_is_type(val, json_type_string))
            return st_fail(err, path, "\"__metadata__\" value of '%s' is not a string",
                           shown(key, strlen(key), b, sizeof b));
        const char *s = json_object_get_string(val);
        if (strlen(s) != (size_t)json_object_get_string_len(val))
            return st_fail(err, path, "\"__metadata__\" value of '%s' contains a NUL character",
                           shown(key, strlen(key), b, sizeof b));
    }
    *meta = v;
    return 0;
}

/* Everything after the mapping: header parse and validation. */
static int st_validate(sd_st_file *f, sd_err *err)
{
    const char *path = f->path;
    char b1[SHOWN_SIZE], b2[SHOWN_SIZE];
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | f->map[i];
    f->header_len = n;
    if (n > SD_ST_MAX_HEADER)
        return st_fail(err, path, "header length %" PRIu64 " exceeds the limit of %u bytes "
                       "(not a safetensors file?)", n, SD_ST_MAX_HEADER);
    if (n > f->size - 8)
        return st_fail(err, path, "header length %" PRIu64 " runs past the end of the %zu-byte "
                       "file (truncated or not a safetensors file?)", n, f->size);
    if (n == 0)
        return st_fail(err, path, "header length is 0 (not a safetensors file?)");
    uint64_t buffer_len = f->size - 8 - n;
    const unsigned char *buffer = f->map + 8 + n;

    json_object *root = NULL, *meta = NULL;
    if (json_parse_object((const char *)f->map + 8, (size_t)n, path, "header", "tensor name",
                          &root, err))
        return -1;

    int rc = 0;
    size_t n_entries = 0;
    size_t pool_size = 1;
    json_object_object_foreach(root, key0, val0) {
        pool_size += strlen(key0) + 1;
        if (strcmp(key0, "__metadata__") == 0) {
            if (parse_metadata(path, val0, &meta, err)) {
                json_object_put(root);
                return -1;
            }
            f->has_meta = meta != NULL;
        } else {
            n_entries++;
        }
    }
    if (meta) {
        json_object_object_foreach(meta, mk, mv) {
            pool_size += strlen(mk) + 1 + (size_t)json_object_get_string_len(mv) + 1;
        }
    }

    st_entry *entries = sd_xcalloc(n_entries ? n_entries : 1, sizeof *entries);
    str_pool pool = {sd_xmalloc(pool_size), 0, pool_size};
    f->strings = pool.base;
    size_t k = 0;
    json_object_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        st_entry *e = &entries[k];
        e->header_index = k;
        if (parse_entry(path, key, val, buffer_len, e, err)) {
            rc = -1;
            break;
        }
        e->t.name = pool_add(&pool, key, strlen(key));
        e->t.file = path;
        e->t.data = buffer + e->begin;
        e->t.file_offset = 8 + n + e->begin;
        k++;
    }

    if (rc == 0 && meta) {
        f->n_meta = (size_t)json_object_object_length(meta);
        f->meta = sd_xcalloc(f->n_meta ? f->n_meta : 1, sizeof *f->meta);
        size_t m = 0;
        json_object_object_foreach(meta, mk, mv) {
            f->meta[m].key = pool_add(&pool, mk, strlen(mk));
            f->meta[m].value = pool_add(&pool, json_object_get_string(mv),
                                        (size_t)json_object_get_string_len(mv));
            m++;
        }
        qsort(f->meta, f->n_meta, sizeof *f->meta, meta_cmp);
    }
    json_object_put(root);

    if (rc == 0) {
        /* The reference's layout rule: sorted by offset, the tensors tile the buffer exactly,
         * so no byte is shared by two tensors and none is left over (no polyglot files). */
        qsort(entries, n_entries, sizeof *entries, entry_cmp);
        uint64_t pos = 0;
        for (size_t i = 0; i < n_entries && rc == 0; i++) {
            const st_entry *e = &entries[i];
            const char *nm = shown(e->t.name, strlen(e->t.name), b1, sizeof b1);
            if (e->begin < pos) {
                const st_entry *p = &entries[i - 1];
                rc = st_fail(err, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] "
                             "overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]", nm, e->begin,
                             e->end, shown(p->t.name, strlen(p->t.name), b2, sizeof b2),
                             p->begin, p->end);
            } else if (e->begin > pos) {
                if (i == 0)
                    rc = st_fail(err, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] "
                                 "leave the first %" PRIu64 " bytes of the data buffer unused",
                                 nm, e->begin, e->end, e->begin);
                else
                    rc = st_fail(err, path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] "
                                 "leave a gap of %" PRIu64 " bytes after tensor '%s'", nm,
                                 e->begin, e->end, e->begin - pos,
                                 shown(entries[i - 1].t.name, strlen(entries[i - 1].t.name), b2,
                                       sizeof b2));
            }
            pos = e->end;
        }
        if (rc == 0 && pos != buffer_len)
            rc = st_fail(err, path, "%" PRIu64 " bytes after the last tensor's data are not "
                         "part of any tensor (the tensors cover %" PRIu64 " of %" PRIu64 " data "
                         "bytes)", buffer_len - pos, pos, buffer_len);
    }
    if (rc) {
        free(entries);
        return -1;
    }

    f->n_tensors = n_entries;
    f->tensors = sd_xcalloc(n_entries ? n_entries : 1, sizeof *f->tensors);
    f->by_name = sd_xcalloc(n_entries ? n_entries : 1, sizeof *f->by_name);
    for (size_t i = 0; i < n_entries; i++) {
        f->tensors[i] = entries[i].t;
        f->by_name[i] = &f->tensors[i];
    }
    free(entries);
    qsort(f->by_name, n_entries, sizeof *f->by_name, tensor_ptr_name_cmp);
    return 0;
}

int sd_st_open(const char *path, sd_st_file *f, sd_err *err)
{
    struct stat st;
    memset(f, 0, sizeof *f);
    if (!path)
        return sd_err_set(err, "safetensors: no file name given");
    int fd = sd_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return st_fail(err, path, "cannot open: %s", strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return st_fail(err, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return st_fail(err, path, "not a regular file");
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return st_fail(err, path, "file too large to map");
    }
    f->size = (size_t)st.st_size;
    if (f->size < 8) {
        close(fd);
        memset(f, 0, sizeof *f);
        return st_fail(err, path, "file is %zu bytes, too short for a safetensors file (it starts "
                       "with an 8-byte header length)", (size_t)st.st_size);
    }
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) {
        memset(f, 0, sizeof *f);
        return st_fail(err, path, "cannot map %zu bytes: %s", (size_t)st.st_size,
                       strerror(map_errno));
    }
    f->map = map;
    f->path = sd_xstrdup(path);
    if (st_validate(f, err)) {
        sd_st_close(f);
        return -1;
    }
    return 0;
}

void sd_st_close(sd_st_file *f)
{
    if (!f)
        return;
    if (f->map)
        munmap((void *)f->map, f->size);
    free(f->path);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->strings);
    memset(f, 0, sizeof *f);
}

size_t sd_st_count(const sd_st_file *f)
{
    return f ? f->n_tensors : 0;
}

const sd_st_tensor *sd_st_tensor_at(const sd_st_file *f, size_t i)
{
    return f && i < f->n_tensors ? &f->tensors[i] : NULL;
}

static const sd_st_tensor *find_in(const sd_st_tensor *const *by_name, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    if (!name)
        return NULL;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, by_name[mid]->name);
        if (c == 0)
            return by_name[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

const sd_st_tensor *sd_st_find(const sd_st_file *f, const char *name)
{
    return f ? find_in(f->by_name, f->n_tensors, name) : NULL;
}

const char *sd_st_metadata(const sd_st_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    sd_st_meta probe = {key, NULL};
    const sd_st_meta *m = f->n_meta ? bsearch(&probe, f->meta, f->n_meta, sizeof *f->meta,
                                              meta_cmp) : NULL;
    return m ? m->value : NULL;
}

size_t sd_st_metadata_count(const sd_st_file *f)
{
    return f ? f->n_meta : 0;
}

const sd_st_meta *sd_st_metadata_at(const sd_st_file *f, size_t i)
{
    return f && i < f->n_meta ? &f->meta[i] : NULL;
}

/* sd_st_tensor_read_f32 once the counts agree (n > 0). */
static int read_f32(const sd_st_tensor *t, float *dst, size_t n, sd_err *err)
{
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case SD_ST_F32:
        memcpy(dst, src, n * sizeof(float));
        return 0;
    case SD_ST_F16:
    case SD_ST_BF16: {
        void (*conv)(const uint16_t *, float *, size_t) =
            t->dtype == SD_ST_F16 ? sd_f16_to_f32_array : sd_bf16_to_f32_array;
        if ((uintptr_t)src % _Alignof(uint16_t) == 0) {
            conv((const uint16_t *)(const void *)src, dst, n);
            return 0;
        }
        /* Unpadded headers (other writers) leave the data unaligned. */
        uint16_t tmp[1024];
        for (size_t i = 0; i < n; i += 1024) {
            size_t m = n - i < 1024 ? n - i : 1024;
            memcpy(tmp, src + 2 * i, 2 * m);
            conv(tmp, dst + i, m);
        }
        return 0;
    }
    case SD_ST_F64: {
        double tmp[512];
        for (size_t i = 0; i < n; i += 512) {
            size_t m = n - i < 512 ? n - i : 512;
            memcpy(tmp, src + 8 * i, 8 * m);
            for (size_t j = 0; j < m; j++)
                dst[i + j] = (float)tmp[j];
        }
        return 0;
    }
    default: {
        char nb[SHOWN_SIZE];
        return st_fail(err, t->file, "tensor '%s' is %s; only F32, F16, BF16 and F64 convert to "
                       "float", shown(t->name, strlen(t->name), nb, sizeof nb),
                       sd_st_dtype_name(t->dtype));
    }
    }
}

int sd_st_tensor_read_f32(const sd_st_tensor *t, float *dst, size_t n, sd_err *err)
{
    char nb[SHOWN_SIZE];
    if (!t)
        return sd_err_set(err, "safetensors: no tensor given");
    const char *nm = shown(t->name, strlen(t->name), nb, sizeof nb);
    if ((uint64_t)t->numel != (uint64_t)n)
        return st_fail(err, t->file, "tensor '%s' has %" PRId64 " elements but the destination "
                       "holds %zu", nm, t->numel, n);
    if (n == 0)
        return 0;
    /* the mapping's pages come in as they are touched: a hung file system holds the copy */
    sd_progress_io_enter_path("read (mapped)", t->file);
    const int rc = read_f32(t, dst, n, err);
    sd_progress_io_leave();
    return rc;
}

int sd_st_tensor_read_raw(const sd_st_tensor *t, void *dst, size_t nbytes, sd_err *err)
{
    char nb[SHOWN_SIZE];
    if (!t)
        return sd_err_set(err, "safetensors: no tensor given");
    if (nbytes != t->nbytes)
        return st_fail(err, t->file, "tensor '%s' has %zu bytes but the destination holds %zu",
                       shown(t->name, strlen(t->name), nb, sizeof nb), t->nbytes, nbytes);
    if (nbytes) {
        sd_progress_io_enter_path("read (mapped)", t->file);
        memcpy(dst, t->data, nbytes);
        sd_progress_io_leave();
    }
    return 0;
}

int sd_st_tensor_check_shape(const sd_st_tensor *t, int ndim, const int64_t *shape, sd_err *err)
{
    char nb[SHOWN_SIZE], s1[256], s2[256];
    int same = t && ndim == t->ndim;
    for (int i = 0; same && i < ndim; i++)
        same = shape[i] == t->shape[i];
    if (same)
        return 0;
    if (!t)
        return sd_err_set(err, "safetensors: no tensor given");
    return st_fail(err, t->file, "tensor '%s' has shape %s, expected %s",
                   shown(t->name, strlen(t->name), nb, sizeof nb),
                   sd_shape_str(t->ndim, t->shape, s1, sizeof s1),
                   sd_shape_str(ndim >= 0 && ndim <= SD_TENSOR_MAX_DIMS ? ndim : 0, shape, s2,
                                sizeof s2));
}

int sd_st_read_f32(const sd_st_file *f, const char *name, float *dst, size_t n, sd_err *err)
{
    char nb[SHOWN_SIZE];
    const sd_st_tensor *t = sd_st_find(f, name);
    if (!t)
        return st_fail(err, f ? f->path : NULL, "no tensor '%s'",
                       name ? shown(name, strlen(name), nb, sizeof nb) : "(null)");
    return sd_st_tensor_read_f32(t, dst, n, err);
}

/* ---- sets of shards ----------------------------------------------------------------------- */

static void set_finish(sd_st_set *s)
{
    size_t total = 0;
    for (size_t i = 0; i < s->n_files; i++)
        total += s->files[i].n_tensors;
    s->n_tensors = total;
    s->order = sd_xcalloc(total ? total : 1, sizeof *s->order);
    s->by_name = sd_xcalloc(total ? total : 1, sizeof *s->by_name);
    size_t k = 0;
    for (size_t i = 0; i < s->n_files; i++)
        for (size_t j = 0; j < s->files[i].n_tensors; j++)
            s->order[k++] = &s->files[i].tensors[j];
    memcpy(s->by_name, s->order, total * sizeof *s->order);
    qsort(s->by_name, total, sizeof *s->by_name, tensor_ptr_name_cmp);
}

int sd_st_set_open_file(sd_st_set *s, const char *path, sd_err *err)
{
    memset(s, 0, sizeof *s);
    s->files = sd_xcalloc(1, sizeof *s->files);
    if (sd_st_open(path, &s->files[0], err)) {
        free(s->files);
        memset(s, 0, sizeof *s);
        return -1;
    }
    s->n_files = 1;
    s->source = sd_xstrdup(path);
    set_finish(s);
    return 0;
}

/* Shard names come from the file: keep them inside the index's folder. */
static int shard_name_ok(const char *name)
{
    if (name[0] == '\0' || name[0] == '/')
        return 0;
    for (const char *p = name; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return 0;
        if (!slash)
            break;
        p = slash + 1;
    }
    return 1;
}

static int cstr_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int sd_st_set_open_index(sd_st_set *s, const char *index_path, sd_err *err)
{
    char *text = NULL, b1[SHOWN_SIZE], b2[SHOWN_SIZE];
    size_t len = 0;
    json_object *root = NULL, *wm = NULL;
    const char **shards = NULL;
    char *dir = NULL;
    int rc = -1;

    memset(s, 0, sizeof *s);
    if (!index_path)
        return sd_err_set(err, "safetensors: no index file name given");
    if (sd_read_regular_file(index_path, SD_ST_MAX_HEADER, "a safetensors index", &text, &len,
                             err))
        return -1;
    if (json_parse_object(text, len, index_path, "index", "key", &root, err))
        goto out;
    if (!json_object_object_get_ex(root, "weight_map", &wm)) {
        st_fail(err, index_path, "index has no \"weight_map\"");
        goto out;
    }
    if (!json_object_is_type(wm, json_type_object)) {
        st_fail(err, index_path, "\"weight_map\" is not an object");
        goto out;
    }
    size_t n_map = (size_t)json_object_object_length(wm), k = 0;
    shards = sd_xcalloc(n_map ? n_map : 1, sizeof *shards);
    {
        json_object_object_foreach(wm, name, val) {
            const char *nm = shown(name, strlen(name), b1, sizeof b1);
            if (!json_object_is_type(val, json_type_string)) {
                st_fail(err, index_path, "weight_map entry of tensor '%s' is not a string", nm);
                goto out;
            }
            const char *sh = json_object_get_string(val);
            if (strlen(sh) != (size_t)json_object_get_string_len(val) || !shard_name_ok(sh)) {
                st_fail(err, index_path, "tensor '%s': shard file name '%s' is not a name inside "
                        "the index's folder", nm, shown(sh, strlen(sh), b2, sizeof b2));
                goto out;
            }
            shards[k++] = sh;
        }
    }
    /* Distinct shard names in name order: the set's iteration order. */
    qsort(shards, n_map, sizeof *shards, cstr_ptr_cmp);
    size_t n_shards = 0;
    for (size_t i = 0; i < n_map; i++)
        if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0)
            shards[n_shards++] = shards[i];

    dir = sd_xstrdup(index_path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[1] = '\0';
    else
        dir[0] = '\0';

    s->source = sd_xstrdup(index_path);
    s->files = sd_xcalloc(n_shards ? n_shards : 1, sizeof *s->files);
    for (size_t i = 0; i < n_shards; i++) {
        size_t plen = strlen(dir) + strlen(shards[i]) + 1;
        char *p = sd_xmalloc(plen);
        snprintf(p, plen, "%s%s", dir, shards[i]);
        sd_err sub;
        if (sd_st_open(p, &s->files[i], &sub)) {
            st_fail(err, index_path, "shard '%s': %s", shown(shards[i], strlen(shards[i]), b1,
                    sizeof b1), sub.msg);
            free(p);
            goto out;
        }
        free(p);
        s->n_files++;
    }

    /* Index and shards must agree entry for entry, in both directions. */
    {
        json_object_object_foreach(wm, name, val) {
            const char *sh = json_object_get_string(val);
            const char **hit = bsearch(&sh, shards, n_shards, sizeof *shards, cstr_ptr_cmp);
            SD_CHECK(hit, "shard '%s' vanished from the list", sh);
            sd_st_file *f = &s->files[hit - shards];
            if (!sd_st_find(f, name)) {
                st_fail(err, index_path, "lists tensor '%s' in shard %s, which has no such tensor",
                        shown(name, strlen(name), b1, sizeof b1), f->path);
                goto out;
            }
        }
    }
    for (size_t i = 0; i < s->n_files; i++) {
        const sd_st_file *f = &s->files[i];
        for (size_t j = 0; j < f->n_tensors; j++) {
            json_object *v;
            const char *nm = f->tensors[j].name;
            if (!json_object_object_get_ex(wm, nm, &v)) {
                st_fail(err, f->path, "tensor '%s' is not listed in the index %s",
                        shown(nm, strlen(nm), b1, sizeof b1), index_path);
                goto out;
            }
            if (strcmp(json_object_get_string(v), shards[i]) != 0) {
                st_fail(err, f->path, "tensor '%s' is listed in the index %s for another shard, "
                        "'%s'", shown(nm, strlen(nm), b1, sizeof b1), index_path,
                        shown(json_object_get_string(v), strlen(json_object_get_string(v)), b2,
                              sizeof b2));
                goto out;
            }
        }
    }
    set_finish(s);
    rc = 0;
out:
    json_object_put(root);
    free(shards);
    free(text);
    free(dir);
    if (rc)
        sd_st_set_close(s);
    return rc;
}

static int path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

int sd_st_set_open_dir(sd_st_set *s, const char *dir, const char *basename, sd_err *err)
{
    static const char *const defaults[] = {"diffusion_pytorch_model.safetensors",
                                           "model.safetensors"};
    const char *const *names = basename ? &basename : defaults;
    size_t n_names = basename ? 1 : sizeof defaults / sizeof defaults[0];
    char tried[600] = "";

    memset(s, 0, sizeof *s);
    if (!dir)
        return sd_err_set(err, "safetensors: no folder given");
    for (size_t i = 0; i < n_names; i++) {
        size_t plen = strlen(dir) + strlen(names[i]) + sizeof "/.index.json";
        char *p = sd_xmalloc(plen);
        snprintf(p, plen, "%s/%s", dir, names[i]);
        if (path_exists(p)) {
            int rc = sd_st_set_open_file(s, p, err);
            free(p);
            return rc;
        }
        snprintf(p, plen, "%s/%s.index.json", dir, names[i]);
        if (path_exists(p)) {
            int rc = sd_st_set_open_index(s, p, err);
            free(p);
            return rc;
        }
        free(p);
        size_t u = strlen(tried);
        snprintf(tried + u, sizeof tried - u, "%s%s[.index.json]", i ? ", " : "", names[i]);
    }
    return st_fail(err, dir, "no safetensors weights found (looked for %s)", tried);
}

void sd_st_set_close(sd_st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n_files; i++)
        sd_st_close(&s->files[i]);
    free(s->files);
    free(s->order);
    free(s->by_name);
    free(s->source);
    memset(s, 0, sizeof *s);
}

const char *sd_st_set_source(const sd_st_set *s)
{
    return s ? s->source : NULL;
}

size_t sd_st_set_count(const sd_st_set *s)
{
    return s ? s->n_tensors : 0;
}

const sd_st_tensor *sd_st_set_tensor_at(const sd_st_set *s, size_t i)
{
    return s && i < s->n_tensors ? s->order[i] : NULL;
}

const sd_st_tensor *sd_st_set_find(const sd_st_set *s, const char *name)
{
    return s ? find_in(s->by_name, s->n_tensors, name) : NULL;
}

int sd_st_set_read_f32(const sd_st_set *s, const char *name, float *dst, size_t n, sd_err *err)
{
    char nb[SHOWN_SIZE];
    const sd_st_tensor *t = sd_st_set_find(s, name);
    if (!t)
        return st_fail(err, s ? s->source : NULL, "no tensor '%s'",
                       name ? shown(name, strlen(name), nb, sizeof nb) : "(null)");
    return sd_st_tensor_read_f32(t, dst, n, err);
}

/* ---- writer ------------------------------------------------------------------------------- */

typedef struct {
    char *name;
    sd_st_dtype dtype;
    int ndim;
    int64_t shape[SD_TENSOR_MAX_DIMS];
    const void *data;
    size_t nbytes;
} wr_tensor;

struct sd_st_writer {
    wr_tensor *t;
    size_t n, cap;
    sd_st_meta *meta; /* owned strings (cast away on free) */
    size_t n_meta, cap_meta;
};

sd_st_writer *sd_st_writer_new(void)
{
    return sd_xcalloc(1, sizeof(sd_st_writer));
}

void sd_st_writer_free(sd_st_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    for (size_t i = 0; i < w->n_meta; i++) {
        free((char *)w->meta[i].key);
        free((char *)w->meta[i].value);
    }
    free(w->t);
    free(w->meta);
    free(w);
}

size_t sd_st_writer_count(const sd_st_writer *w)
{
    return w ? w->n : 0;
}

int sd_st_writer_add(sd_st_writer *w, const char *name, sd_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, size_t nbytes, sd_err *err)
{
    char nb[SHOWN_SIZE], sb[256];
    if (!w || !name)
        return sd_err_set(err, "safetensors writer: no writer or name given");
    const char *nm = shown(name, strlen(name), nb, sizeof nb);
    if (!utf8_valid((const unsigned char *)name, strlen(name)))
        return sd_err_set(err, "safetensors writer: tensor name '%s' is not valid UTF-8", nm);
    if (strcmp(name, "__metadata__") == 0)
        return sd_err_set(err, "safetensors writer: '__metadata__' cannot name a tensor");
    if (!st_dtype_valid(dtype))
        return sd_err_set(err, "safetensors writer: tensor '%s': invalid dtype %d", nm, (int)dtype);
    if (ndim < 0 || ndim > SD_TENSOR_MAX_DIMS || (ndim > 0 && !shape))
        return sd_err_set(err, "safetensors writer: tensor '%s': %d dimensions (0..%d allowed)",
                          nm, ndim, SD_TENSOR_MAX_DIMS);
    uint64_t bits = sd_st_dtype_bits(dtype), capacity = bits, numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return sd_err_set(err, "safetensors writer: tensor '%s': shape[%d] = %" PRId64
                              " is negative", nm, i, shape[i]);
        uint64_t d = (uint64_t)shape[i];
        if (d == 0) {
            numel = 0;
            continue;
        }
        if (capacity > (uint64_t)INT64_MAX / d)
            return sd_err_set(err, "safetensors writer: tensor '%s': shape %s is too large", nm,
                              sd_shape_str(ndim, shape, sb, sizeof sb));
        capacity *= d;
        numel *= d;
    }
    if ((numel * bits) % 8 != 0 || numel * bits / 8 != nbytes)
        return sd_err_set(err, "safetensors writer: tensor '%s': %s %s is %" PRIu64 " bits but "
                          "%zu bytes were given", nm, sd_st_dtype_name(dtype),
                          sd_shape_str(ndim, shape, sb, sizeof sb), numel * bits, nbytes);
    if (nbytes > 0 && !data)
        return sd_err_set(err, "safetensors writer: tensor '%s': no data", nm);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return sd_err_set(err, "safetensors writer: tensor '%s' added twice", nm);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = sd_xrealloc(w->t, w->cap * sizeof *w->t);
    }
    wr_tensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = sd_xstrdup(name);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->data = data;
    t->nbytes = nbytes;
    return 0;
}

int sd_st_writer_set_metadata(sd_st_writer *w, const char *key, const char *value, sd_err *err)
{
    char nb[SHOWN_SIZE];
    if (!w || !key || !value)
        return sd_err_set(err, "safetensors writer: no writer, key or value given");
    if (!utf8_valid((const unsigned char *)key, strlen(key)) ||
        !utf8_valid((const unsigned char *)value, strlen(value)))
        return sd_err_set(err, "safetensors writer: metadata '%s' is not valid UTF-8",
                          shown(key, strlen(key), nb, sizeof nb));
    for (size_t i = 0; i < w->n_meta; i++) {
        if (strcmp(w->meta[i].key, key) == 0) {
            free((char *)w->meta[i].value);
            w->meta[i].value = sd_xstrdup(value);
            return 0;
        }
    }
    if (w->n_meta == w->cap_meta) {
        w->cap_meta = w->cap_meta ? 2 * w->cap_meta : 8;
        w->meta = sd_xrealloc(w->meta, w->cap_meta * sizeof *w->meta);
    }
    w->meta[w->n_meta].key = sd_xstrdup(key);
    w->meta[w->n_meta].value = sd_xstrdup(value);
    w->n_meta++;
    return 0;
}

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap)
            b->cap = b->cap ? 2 * b->cap : 4096;
        b->buf = sd_xrealloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void sb_printf(sbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    SD_CHECK(n >= 0 && (size_t)n < sizeof tmp, "number too long for the header");
    sb_put(b, tmp, (size_t)n);
}

/* A JSON string as serde_json writes it: '"', '\\' and control characters escaped (short forms
 * where JSON has them, else \u00xx in lower-case hex), everything else (including '/' and
 * non-ASCII) as is. Matching it makes our headers byte-identical to the reference's. */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        switch (c) {
        case '"': sb_put(b, "\\\"", 2); break;
        case '\\': sb_put(b, "\\\\", 2); break;
        case '\b': sb_put(b, "\\b", 2); break;
        case '\f': sb_put(b, "\\f", 2); break;
        case '\n': sb_put(b, "\\n", 2); break;
        case '\r': sb_put(b, "\\r", 2); break;
        case '\t': sb_put(b, "\\t", 2); break;
        default:
            if (c < 0x20)
                sb_printf(b, "\\u%04x", c);
            else
                sb_put(b, (const char *)&c, 1);
        }
    }
    sb_put(b, "\"", 1);
}

static int wr_order_cmp(const void *a, const void *b)
{
    const wr_tensor *x = *(const wr_tensor *const *)a;
    const wr_tensor *y = *(const wr_tensor *const *)b;
    if (x->dtype != y->dtype)
        return x->dtype > y->dtype ? -1 : 1; /* larger alignment first */
    return strcmp(x->name, y->name);
}

int sd_st_writer_write(const sd_st_writer *w, const char *path, sd_err *err)
{
    if (!w || !path)
        return sd_err_set(err, "safetensors writer: no writer or path given");

    const wr_tensor **order = sd_xmalloc((w->n ? w->n : 1) * sizeof *order);
    for (size_t i = 0; i < w->n; i++)
        order[i] = &w->t[i];
    qsort(order, w->n, sizeof *order, wr_order_cmp);

    sd_st_meta *meta = NULL;
    if (w->n_meta) {
        meta = sd_xmalloc(w->n_meta * sizeof *meta);
        memcpy(meta, w->meta, w->n_meta * sizeof *meta);
        qsort(meta, w->n_meta, sizeof *meta, meta_cmp);
    }

    sbuf h = {NULL, 0, 0};
    sb_put(&h, "{", 1);
    int first = 1;
    if (w->n_meta) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; i < w->n_meta; i++) {
            if (i)
                sb_put(&h, ",", 1);
            sb_json_string(&h, meta[i].key);
            sb_put(&h, ":", 1);
            sb_json_string(&h, meta[i].value);
        }
        sb_put(&h, "}", 1);
        first = 0;
    }
    uint64_t offset = 0;
    for (size_t k = 0; k < w->n; k++) {
        const wr_tensor *t = order[k];
        if (!first)
            sb_put(&h, ",", 1);
        first = 0;
        sb_json_string(&h, t->name);
        sb_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", sd_st_dtype_name(t->dtype));
        for (int i = 0; i < t->ndim; i++)
            sb_printf(&h, "%s%" PRId64, i ? "," : "", t->shape[i]);
        sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset,
                  offset + t->nbytes);
        offset += t->nbytes;
    }
    sb_put(&h, "}", 1);
    free(meta);
    while (h.len % 8 != 0)
        sb_put(&h, " ", 1); /* so the data buffer starts 8-byte aligned, as the reference does */
    if (h.len > SD_ST_MAX_HEADER) {
        free(h.buf);
        free((void *)order);
        return st_fail(err, path, "header would be %zu bytes, more than the %u readers accept",
                       h.len, SD_ST_MAX_HEADER);
    }

    size_t tlen = strlen(path) + sizeof ".tmp-XXXXXX";
    char *tmp = sd_xmalloc(tlen);
    snprintf(tmp, tlen, "%s.tmp-XXXXXX", path);
    sd_progress_io_enter_path("mkstemp", tmp);
    int rc = -1, fd = mkstemp(tmp);
    sd_progress_io_leave();
    if (fd < 0) {
        st_fail(err, path, "cannot create a temporary file %s: %s", tmp, strerror(errno));
        goto out_free;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    int ok = fchmod(fd, 0644) == 0 && sd_pio_all(fd, len8, 8, 0, 1, NULL) == 0 &&
             sd_pio_all(fd, h.buf, h.len, 8, 1, NULL) == 0;
    uint64_t at = 8 + (uint64_t)h.len;
    sd_writeback wb;
    sd_writeback_init(&wb, fd);
    for (size_t k = 0; ok && k < w->n; k++) {
        const wr_tensor *t = order[k];
        ok = sd_pwrite_streamed(&wb, t->data, t->nbytes, at) == 0;
        at += t->nbytes;
    }
    ok = ok && sd_fsync_fd(fd) == 0;
    int saved = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        st_fail(err, path, "cannot write %s: %s", tmp, strerror(saved));
        unlink(tmp);
        goto out_free;
    }
    if (sd_rename(tmp, path) != 0) {
        st_fail(err, path, "cannot rename %s to it: %s", tmp, strerror(errno));
        unlink(tmp);
        goto out_free;
    }
    /* The rename is durable only once the folder is synced. */
    rc = sd_fsync_parent(path, err) ? -1 : 0;
out_free:
    free(tmp);
    free(h.buf);
    free((void *)order);
    return rc;
}
