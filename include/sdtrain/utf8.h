/* UTF-8 validation and repair with the same result as Python's bytes.decode('utf-8', 'replace'). */
#ifndef SDTRAIN_UTF8_H
#define SDTRAIN_UTF8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* UTF-8 encoding of U+FFFD REPLACEMENT CHARACTER. */
#define SD_UTF8_REPLACEMENT "\xEF\xBF\xBD"

/* The UTF-8 sequence at s[i] (i < n): its length, with *cp (when not NULL) set to its code
 * point; or minus the length of its maximal ill-formed subpart (Unicode Table 3-7 decides where
 * one ends: overlong forms, surrogates and code points past U+10FFFF are ill-formed), as
 * CPython's decoder does. */
long sd_utf8_sequence(const unsigned char *s, size_t n, size_t i, uint32_t *cp);

/* Length of the longest prefix of s[0..n) that is well-formed UTF-8 (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF); n when all of it is. NUL bytes are valid
 * (U+0000), as in Python. */
size_t sd_utf8_valid_prefix(const char *s, size_t n);

/* 1 when s[0..n) is well-formed UTF-8, else 0. */
int sd_utf8_is_valid(const char *s, size_t n);

/* Writes s[0..n) to out with every maximal ill-formed subpart replaced by one U+FFFD (the
 * Unicode "maximal subpart" practice, which CPython's decoder follows), NUL-terminates it and
 * returns its length. out must hold 3 * n + 1 bytes (each bad byte can become 3). When
 * n_replaced is not NULL it receives the number of U+FFFD inserted. */
size_t sd_utf8_repair(const char *s, size_t n, char *out, size_t *n_replaced);

/* UTF-8 encoding of U+2400 SYMBOL FOR NULL. */
#define SD_UTF8_SYMBOL_FOR_NULL "\xE2\x90\x80"

/* s[0..n) as a C string, for stores whose strings end at the first NUL (HDF5): each NUL byte
 * written as U+2400 SYMBOL FOR NULL, NUL-terminated in out. Returns the length; out may be NULL
 * to get only that, else it holds the length + 1 bytes (at most 3 * n + 1). */
size_t sd_utf8_nul_to_symbol(const char *s, size_t n, char *out);

#ifdef __cplusplus
}
#endif
#endif
