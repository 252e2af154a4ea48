/* UTF-8 validation and repair with the same result as Python's bytes.decode('utf-8', 'replace'). */
#include "sdtrain/utf8.h"

#include <string.h>

long sd_utf8_sequence(const unsigned char *s, size_t n, size_t i, uint32_t *cp)
{
    unsigned c = s[i];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t v;
    if (c < 0x80) {
        if (cp)
            *cp = c;
        return 1;
    }
    /* the second byte's range depends on the lead byte (Unicode Table 3-7): that rules out
     * overlong forms, surrogates and code points past U+10FFFF, and it decides where an
     * ill-formed subpart ends, so the replacement count matches CPython exactly */
    if (c >= 0xC2 && c <= 0xDF)
        need = 1, v = c & 0x1F;
    else if (c == 0xE0)
        need = 2, lo = 0xA0, v = c & 0x0F;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        need = 2, v = c & 0x0F;
    else if (c == 0xED)
        need = 2, hi = 0x9F, v = c & 0x0F;
    else if (c == 0xF0)
        need = 3, lo = 0x90, v = c & 0x07;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3, v = c & 0x07;
    else if (c == 0xF4)
        need = 3, hi = 0x8F, v = c & 0x07;
    else
        return -1; /* 0x80..0xC1, 0xF5..0xFF never start a sequence */
    size_t j = i + 1;
    for (int k = 0; k < need; k++, j++) {
        if (j >= n)
            return -(long)(j - i);
        unsigned b = s[j];
        if (b < (k == 0 ? lo : 0x80u) || b > (k == 0 ? hi : 0xBFu))
            return -(long)(j - i);
        v = (v << 6) | (b & 0x3F);
    }
    if (cp)
        *cp = v;
    return (long)(j - i);
}

size_t sd_utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        long len = sd_utf8_sequence(u, n, i, NULL);
        if (len < 0)
            return i;
        i += (size_t)len;
    }
    return n;
}

int sd_utf8_is_valid(const char *s, size_t n)
{
    return sd_utf8_valid_prefix(s, n) == n;
}

size_t sd_utf8_repair(const char *s, size_t n, char *out, size_t *n_replaced)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0, replaced = 0;
    while (i < n) {
        size_t good = sd_utf8_valid_prefix(s + i, n - i);
        memcpy(out + o, s + i, good);
        o += good;
        i += good;
        if (i >= n)
            break;
        long len = sd_utf8_sequence(u, n, i, NULL);
        memcpy(out + o, SD_UTF8_REPLACEMENT, 3);
        o += 3;
        replaced++;
        i += (size_t)(-len);
    }
    out[o] = '\0';
    if (n_replaced)
        *n_replaced = replaced;
    return o;
}

size_t sd_utf8_nul_to_symbol(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\0') {
            if (out)
                out[o] = s[i];
            o++;
        } else {
            if (out)
                memcpy(out + o, SD_UTF8_SYMBOL_FOR_NULL, 3);
            o += 3;
        }
    }
    if (out)
        out[o] = '\0';
    return o;
}
