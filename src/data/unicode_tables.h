/* Unicode property tables of the CLIP tokenizer (generated into unicode_tables.c). */
#ifndef SDTRAIN_DATA_UNICODE_TABLES_H
#define SDTRAIN_DATA_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

/* Property bits, probed from the reference environment (see
 * tests/reference/make_tokenizer_unicode_tables.py, which must agree with this list). */
enum {
    SD_UC_RX_L = 1 << 0,        /* matched by [\p{L}] under IGNORECASE (regex module) */
    SD_UC_RX_N = 1 << 1,        /* matched by [\p{N}] */
    SD_UC_RX_O = 1 << 2,        /* matched by [^\s\p{L}\p{N}]; none of the three: skipped */
    SD_UC_DROP = 1 << 3,        /* BasicTokenizer._clean_text removes it (NUL, U+FFFD, C*) */
    SD_UC_CSPACE = 1 << 4,      /* _clean_text turns it into ' ' (\t \n \r and Zs) */
    SD_UC_PYSPACE = 1 << 5,     /* Python str.isspace(): what str.split() splits on */
    SD_UC_CASED = 1 << 6,       /* CPython Cased (consulted only when not case-ignorable) */
    SD_UC_CASE_IGN = 1 << 7,    /* CPython Case_Ignorable */
    SD_UC_LOWER = 1 << 8,       /* str.lower() changes it (U+03A3 depends on context) */
    SD_UC_NFC_MAYBE = 1 << 9,   /* NFC may change a string that contains it */
    SD_UC_DECOMP = 1 << 10      /* has a canonical decomposition (Hangul syllables excluded) */
};

typedef struct sd_uc_pair {
    uint32_t cp, value;
} sd_uc_pair;

typedef struct sd_uc_multi {
    uint32_t cp;
    uint32_t n;
    uint32_t cps[3];
} sd_uc_multi;

typedef struct sd_uc_decomp {
    uint32_t cp;
    uint32_t offset; /* into sd_uc_decomp_pool */
    uint32_t n;
} sd_uc_decomp;

typedef struct sd_uc_comp {
    uint32_t first, second, composite;
} sd_uc_comp;

extern const uint16_t sd_uc_prop_stage1[];
extern const uint16_t sd_uc_prop_stage2[];
extern const uint16_t sd_uc_ccc_stage1[];
extern const uint8_t sd_uc_ccc_stage2[];
extern const sd_uc_pair sd_uc_lower[];      /* sorted by cp: one-code-point lower-case mappings */
extern const size_t sd_uc_n_lower;
extern const sd_uc_multi sd_uc_lower_multi[]; /* sorted by cp: longer mappings (U+0130) */
extern const size_t sd_uc_n_lower_multi;
extern const uint32_t sd_uc_decomp_pool[];
extern const sd_uc_decomp sd_uc_decomp_map[]; /* sorted by cp: full canonical decompositions */
extern const size_t sd_uc_n_decomp;
extern const sd_uc_comp sd_uc_comp_map[];     /* sorted by (first, second): primary composites */
extern const size_t sd_uc_n_comp;
extern const sd_uc_pair sd_uc_ascii_fold[];   /* sorted by cp: code points that match ASCII letter
                                                 `value` under the regex module's IGNORECASE */
extern const size_t sd_uc_n_ascii_fold;

#define SD_UC_MAX 0x10FFFFu

/* Property bits of a code point (cp <= SD_UC_MAX). */
static inline unsigned sd_uc_props(uint32_t cp)
{
    uint32_t block = sd_uc_prop_stage1[cp >> 7];
    return sd_uc_prop_stage2[(block << 7) | (cp & 127u)];
}

/* Canonical combining class of a code point (cp <= SD_UC_MAX). */
static inline unsigned sd_uc_ccc(uint32_t cp)
{
    uint32_t block = sd_uc_ccc_stage1[cp >> 7];
    return sd_uc_ccc_stage2[(block << 7) | (cp & 127u)];
}

#endif
