/* UTF-8 validation and repair with the same result as Python's bytes.decode('utf-8', 'replace'). */
#include "sdtrain/utf8.h"

#include <string.h>

/* Length of the well-formed sequence starting at s[i], or -(bytes of the maximal ill-formed
 * subpart) when there is none. The second byte's range depends on the lead byte (Unicode
 * Table 3-7): that is what rules out overlong forms, surrogates and code points past U+10FFFF,
 * and it decides where a subpart ends, so the replacement count matches CPython exactly. */
static long sequence_length(const unsigned char *s, size_t n, size_t i)
{
    unsigned c = s[i];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c == 0xE0)
        need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        need = 2;
    else if (c == 0xED)
        need = 2, hi = 0x9F;
    else if (c == 0xF0)
        need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
        need = 3;
    else if (c == 0xF4)
        need = 3, hi = 0x8F;
    else
        return -1; /* 0x80..0xC1, 0xF5..0xFF never start a sequence */
    size_t j = i + 1;
    for (int k = 0; k < need; k++, j++) {
        if (j >= n)
            return -(long)(j - i);
        unsigned b = s[j];
        unsigned blo = k == 0 ? lo : 0x80, bhi = k == 0 ? hi : 0xBF;
        if (b < blo || b > bhi)
            return -(long)(j - i);
    }
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
        long len = sequence_length(u, n, i);
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
        long len = sequence_length(u, n, i);
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
