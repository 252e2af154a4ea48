/* The CLIP BPE tokenizer of SD2, reproducing transformers' slow CLIPTokenizer without ftfy. */
#include "sdtrain/tokenizer.h"
#include "sdtrain/utf8.h"

#include <errno.h>
#include <json.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "sdtrain/check.h"
#include "sdtrain/hash.h"
#include "sdtrain/json_file.h"
#include "unicode_tables.h"

/* The reference keeps merges lines [1, 49152 - 256 - 2 + 1) of the file: 48,894 merges. */
#define MERGES_FIRST_LINE 1
#define MERGES_END_LINE (49152 - 256 - 2 + 1)
#define CONTENT_MAX (SD_TOKENIZER_LENGTH - 2)
#define MAX_ADDED 16
#define NO_RANK UINT32_MAX
#define DEAD_SYM UINT32_MAX
#define FILE_LIMIT ((size_t)1 << 30)

static const char START_TEXT[] = "<|startoftext|>";
static const char END_TEXT[] = "<|endoftext|>";

typedef struct symbol {
    uint32_t off, len; /* the symbol's text (byte-level alphabet, UTF-8) in tok->pool */
    int32_t vocab_id;  /* id in vocab.json / the derived vocabulary, -1 when absent */
    int32_t out_id;    /* the id the reference emits for this symbol */
} symbol;

typedef struct added_token {
    uint32_t cps[64];
    size_t n;
    int32_t id;
} added_token;

struct sd_tokenizer {
    char *pool;
    size_t pool_len, pool_cap;
    symbol *syms;
    uint32_t n_syms, cap_syms;
    uint32_t *sym_slots; /* open addressing: symbol index + 1, 0 = empty */
    uint32_t sym_mask;
    uint64_t *pair_keys; /* open addressing: (left << 32 | right), UINT64_MAX = empty */
    uint32_t *pair_rank, *pair_res;
    uint32_t pair_mask;
    size_t n_pairs;
    uint32_t base[256], base_eow[256]; /* symbol of each byte, alone and word-final */
    added_token added[MAX_ADDED];
    size_t n_added;
    int32_t start_text_id, end_text_id; /* what the BPE cache gives the two specials */
    int32_t bos_id, eos_id, pad_id, unk_id;
    size_t vocab_size, n_merges;
    size_t heap_threshold;
    char source[4200];
};

/* ---- byte-level alphabet (spec 4.2) --------------------------------------------------------- */

/* The printable bytes map to themselves; the other 68 (0..32, 127..160, 173), in order, to
 * U+0100.. (so space is U+0120). */
static uint32_t byte_to_cp(unsigned b)
{
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    if (b <= 32)
        return 256 + b;
    if (b <= 160)
        return 256 + 33 + (b - 127);
    return 256 + 67; /* 173, the soft hyphen */
}

static size_t utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes s[0..n) into code points like Python's bytes.decode('utf-8', 'replace'): one U+FFFD
 * per maximal ill-formed subpart. out must hold n code points. Returns the count; *n_bad gets
 * the replacements. */
static size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *out, size_t *n_bad)
{
    size_t i = 0, o = 0, bad = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            out[o++] = s[i++];
            continue;
        }
        uint32_t cp;
        long len = sd_utf8_sequence(s, n, i, &cp);
        if (len > 0) {
            out[o++] = cp;
            i += (size_t)len;
        } else {
            out[o++] = 0xFFFD;
            bad++;
            i += (size_t)(-len);
        }
    }
    *n_bad = bad;
    return o;
}

/* ---- growable scratch buffers ------------------------------------------------------------- */

typedef struct u32buf {
    uint32_t *p;
    size_t n, cap;
} u32buf;

static void u32_reserve(u32buf *b, size_t need)
{
    if (need <= b->cap)
        return;
    size_t c = b->cap ? b->cap : 64;
    while (c < need)
        c *= 2;
    b->p = sd_xrealloc(b->p, c * sizeof *b->p);
    b->cap = c;
}

static void u32_push(u32buf *b, uint32_t v)
{
    u32_reserve(b, b->n + 1);
    b->p[b->n++] = v;
}

/* ---- the symbol table and the merge ranks ------------------------------------------------ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static void sym_rehash(sd_tokenizer *t, uint32_t cap)
{
    free(t->sym_slots);
    t->sym_slots = sd_xcalloc(cap, sizeof *t->sym_slots);
    t->sym_mask = cap - 1;
    for (uint32_t i = 0; i < t->n_syms; i++) {
        const symbol *s = &t->syms[i];
        uint32_t h = (uint32_t)hash_bytes(t->pool + s->off, s->len) & t->sym_mask;
        while (t->sym_slots[h])
            h = (h + 1) & t->sym_mask;
        t->sym_slots[h] = i + 1;
    }
}

static int64_t sym_find(const sd_tokenizer *t, const char *s, size_t n)
{
    if (!t->sym_slots)
        return -1;
    uint32_t h = (uint32_t)hash_bytes(s, n) & t->sym_mask;
    while (t->sym_slots[h]) {
        const symbol *y = &t->syms[t->sym_slots[h] - 1];
        if (y->len == n && memcmp(t->pool + y->off, s, n) == 0)
            return (int64_t)t->sym_slots[h] - 1;
        h = (h + 1) & t->sym_mask;
    }
    return -1;
}

/* Index of the symbol with text s[0..n), added when new. */
static uint32_t sym_intern(sd_tokenizer *t, const char *s, size_t n)
{
    int64_t found = sym_find(t, s, n);
    if (found >= 0)
        return (uint32_t)found;
    SD_CHECK(t->n_syms < UINT32_MAX - 1 && n < UINT32_MAX, "too many or too long BPE symbols");
    if ((size_t)(t->n_syms + 1) * 2 > (size_t)t->sym_mask + 1 || !t->sym_slots)
        sym_rehash(t, t->sym_slots ? (t->sym_mask + 1) * 2 : 1u << 17);
    if (t->n_syms == t->cap_syms) {
        t->cap_syms = t->cap_syms ? t->cap_syms * 2 : 1u << 16;
        t->syms = sd_xrealloc(t->syms, (size_t)t->cap_syms * sizeof *t->syms);
    }
    if (t->pool_len + n > t->pool_cap) {
        size_t c = t->pool_cap ? t->pool_cap : 1u << 20;
        while (c < t->pool_len + n)
            c *= 2;
        t->pool = sd_xrealloc(t->pool, c);
        t->pool_cap = c;
    }
    SD_CHECK(t->pool_len + n < UINT32_MAX, "BPE symbol pool over 4 GiB");
    if (n)
        memcpy(t->pool + t->pool_len, s, n);
    symbol *y = &t->syms[t->n_syms];
    y->off = (uint32_t)t->pool_len;
    y->len = (uint32_t)n;
    y->vocab_id = -1;
    y->out_id = -1;
    t->pool_len += n;
    uint32_t h = (uint32_t)hash_bytes(s, n) & t->sym_mask;
    while (t->sym_slots[h])
        h = (h + 1) & t->sym_mask;
    t->sym_slots[h] = t->n_syms + 1;
    return t->n_syms++;
}

static void pair_rehash(sd_tokenizer *t, uint32_t cap)
{
    uint64_t *keys = t->pair_keys;
    uint32_t *rank = t->pair_rank, *res = t->pair_res;
    uint32_t old_cap = keys ? t->pair_mask + 1 : 0;
    t->pair_keys = sd_xmalloc((size_t)cap * sizeof *t->pair_keys);
    t->pair_rank = sd_xmalloc((size_t)cap * sizeof *t->pair_rank);
    t->pair_res = sd_xmalloc((size_t)cap * sizeof *t->pair_res);
    memset(t->pair_keys, 0xFF, (size_t)cap * sizeof *t->pair_keys);
    t->pair_mask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (keys[i] == UINT64_MAX)
            continue;
        uint32_t h = (uint32_t)sd_fmix64(keys[i]) & t->pair_mask;
        while (t->pair_keys[h] != UINT64_MAX)
            h = (h + 1) & t->pair_mask;
        t->pair_keys[h] = keys[i];
        t->pair_rank[h] = rank[i];
        t->pair_res[h] = res[i];
    }
    free(keys);
    free(rank);
    free(res);
}

/* Records merge (a, b) -> res at `rank`; a repeated pair keeps the later rank, like the
 * reference's dict(zip(merges, range(...))). */
static void pair_put(sd_tokenizer *t, uint32_t a, uint32_t b, uint32_t rank, uint32_t res)
{
    if (!t->pair_keys || (t->n_pairs + 1) * 2 > (size_t)t->pair_mask + 1)
        pair_rehash(t, t->pair_keys ? (t->pair_mask + 1) * 2 : 1u << 17);
    uint64_t key = (uint64_t)a << 32 | b;
    uint32_t h = (uint32_t)sd_fmix64(key) & t->pair_mask;
    while (t->pair_keys[h] != UINT64_MAX && t->pair_keys[h] != key)
        h = (h + 1) & t->pair_mask;
    if (t->pair_keys[h] == UINT64_MAX)
        t->n_pairs++;
    t->pair_keys[h] = key;
    t->pair_rank[h] = rank;
    t->pair_res[h] = res;
}

static inline uint32_t pair_get(const sd_tokenizer *t, uint32_t a, uint32_t b, uint32_t *res)
{
    uint64_t key = (uint64_t)a << 32 | b;
    uint32_t h = (uint32_t)sd_fmix64(key) & t->pair_mask;
    if (!t->pair_keys) /* a merges.txt with no merge lines: no table (tests/fuzz/fuzz_tokenizerfiles.c) */
        return NO_RANK;
    for (;;) {
        uint64_t k = t->pair_keys[h];
        if (k == key) {
            *res = t->pair_res[h];
            return t->pair_rank[h];
        }
        if (k == UINT64_MAX)
            return NO_RANK;
        h = (h + 1) & t->pair_mask;
    }
}

/* ---- file reading ------------------------------------------------------------------------- */

/* Reads a whole file, gunzipping it when it is gzip data (zlib reads plain files as they are). */
static int read_file(const char *path, char **data, size_t *len, sd_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return sd_err_set(err, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return sd_err_set(err, "%s: is a directory, expected a file", path);
    gzFile f = gzopen(path, "rb");
    if (!f)
        return sd_err_set(err, "%s: cannot open: %s", path, errno ? strerror(errno) : "out of memory");
    size_t cap = 1u << 20, n = 0;
    char *buf = sd_xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap >= FILE_LIMIT) {
                gzclose_r(f);
                free(buf);
                return sd_err_set(err, "%s: larger than %zu MiB, not a tokenizer file", path, FILE_LIMIT >> 20);
            }
            cap *= 2;
            buf = sd_xrealloc(buf, cap + 1);
        }
        size_t want = cap - n > (1u << 30) ? (1u << 30) : cap - n;
        int got = gzread(f, buf + n, (unsigned)want);
        if (got < 0) {
            int zerr;
            const char *msg = gzerror(f, &zerr);
            sd_err_set(err, "%s: read error: %s", path, zerr == Z_ERRNO ? strerror(errno) : msg);
            gzclose_r(f);
            free(buf);
            return -1;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    int zerr;
    const char *msg = gzerror(f, &zerr);
    if (zerr != Z_OK) {
        sd_err_set(err, "%s: corrupt or truncated gzip data: %s", path, msg);
        gzclose_r(f);
        free(buf);
        return -1;
    }
    gzclose_r(f);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

/* Checks that buf is UTF-8 (the reference opens these files strictly) and says where not. */
static int check_utf8(const char *path, const char *buf, size_t len, sd_err *err)
{
    const unsigned char *s = (const unsigned char *)buf;
    size_t i = 0, line = 1, line_start = 0;
    while (i < len) {
        uint32_t cp;
        if (s[i] < 0x80) {
            if (s[i] == '\n')
                line++, line_start = i + 1;
            i++;
            continue;
        }
        long n = sd_utf8_sequence(s, len, i, &cp);
        if (n < 0)
            return sd_err_at(err, path, (int)line, (int)(i - line_start + 1), "invalid UTF-8 (byte 0x%02X)", s[i]);
        i += (size_t)n;
    }
    return 0;
}

/* Code point at s[i] of valid UTF-8 and its length. */
static uint32_t cp_at(const char *s, size_t len, size_t i, size_t *n)
{
    uint32_t cp = 0xFFFD;
    long k = sd_utf8_sequence((const unsigned char *)s, len, i, &cp);
    *n = k > 0 ? (size_t)k : (size_t)(-k);
    return cp;
}

static bool py_space_at(const char *s, size_t len, size_t i, size_t *n)
{
    uint32_t cp = cp_at(s, len, i, n);
    return (sd_uc_props(cp) & SD_UC_PYSPACE) != 0;
}

/* State while reading merge lines (ranks count every line of the reference's slice). */
typedef struct merge_ctx {
    sd_tokenizer *tok;
    bool derive_vocab;     /* OpenAI: the vocabulary is the merges' concatenations */
    uint32_t next_vocab_id;
    size_t rank;
    char *scratch;
    size_t scratch_cap;
} merge_ctx;

/* One merges line: Python's tuple(line.split()); pairs go into the rank table. */
static void merge_line(merge_ctx *m, const char *s, size_t len)
{
    size_t part_off[3], part_len[3], n_parts = 0, total = 0;
    size_t i = 0, w;
    while (i < len) {
        while (i < len && py_space_at(s, len, i, &w))
            i += w;
        if (i >= len)
            break;
        size_t start = i;
        while (i < len && !py_space_at(s, len, i, &w))
            i += w;
        if (n_parts < 3) {
            part_off[n_parts] = start;
            part_len[n_parts] = i - start;
        }
        n_parts++;
        total += i - start;
    }
    sd_tokenizer *t = m->tok;
    uint32_t rank = (uint32_t)m->rank++;
    if (n_parts == 2 || m->derive_vocab) {
        if (total >= m->scratch_cap) {
            m->scratch_cap = total * 2 + 64;
            m->scratch = sd_xrealloc(m->scratch, m->scratch_cap);
        }
        /* ''.join(parts): with more than two parts only the vocabulary sees it */
        size_t o = 0;
        i = 0;
        while (i < len) {
            while (i < len && py_space_at(s, len, i, &w))
                i += w;
            size_t start = i;
            while (i < len && !py_space_at(s, len, i, &w))
                i += w;
            memcpy(m->scratch + o, s + start, i - start);
            o += i - start;
        }
        uint32_t res = sym_intern(t, m->scratch, o);
        if (m->derive_vocab)
            t->syms[res].vocab_id = (int32_t)m->next_vocab_id++;
        if (n_parts == 2) {
            uint32_t a = sym_intern(t, s + part_off[0], part_len[0]);
            uint32_t b = sym_intern(t, s + part_off[1], part_len[1]);
            pair_put(t, a, b, rank, res);
        }
    }
}

static void read_merges(merge_ctx *m, const char *buf, size_t len)
{
    size_t line = 0, i = 0;
    while (i <= len && line < MERGES_END_LINE) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len;
        if (line >= MERGES_FIRST_LINE)
            merge_line(m, buf + i, end - i);
        line++;
        if (!nl)
            break;
        i = end + 1;
    }
    m->tok->n_merges = m->rank;
}

/* ---- set-up common to both formats -------------------------------------------------------- */

static sd_tokenizer *tokenizer_new(void)
{
    sd_tokenizer *t = sd_xcalloc(1, sizeof *t);
    t->heap_threshold = 64;
    return t;
}

static void intern_base_symbols(sd_tokenizer *t)
{
    for (unsigned b = 0; b < 256; b++) {
        char s[8];
        size_t n = utf8_put(byte_to_cp(b), s);
        t->base[b] = sym_intern(t, s, n);
        memcpy(s + n, "</w>", 4);
        t->base_eow[b] = sym_intern(t, s, n + 4);
    }
}

static int add_token(sd_tokenizer *t, const char *src, const char *content, int32_t id, sd_err *err)
{
    size_t len = strlen(content), n, bad;
    uint32_t cps[256];
    if (len == 0 || len > 64)
        return sd_err_set(err, "%s: added token '%s' is empty or longer than 64 bytes (not supported)", src,
                          content);
    n = utf8_decode((const unsigned char *)content, len, cps, &bad);
    if (bad)
        return sd_err_set(err, "%s: added token '%s' is not valid UTF-8", src, content);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].n == n && memcmp(t->added[i].cps, cps, n * sizeof *cps) == 0) {
            t->added[i].id = id;
            return 0;
        }
    }
    if (t->n_added == MAX_ADDED)
        return sd_err_set(err, "%s: more than %d added tokens (not supported)", src, MAX_ADDED);
    added_token *a = &t->added[t->n_added++];
    memcpy(a->cps, cps, n * sizeof *cps);
    a->n = n;
    a->id = id;
    return 0;
}

static int32_t vocab_id_of(const sd_tokenizer *t, const char *s)
{
    int64_t k = sym_find(t, s, strlen(s));
    return k < 0 ? -1 : t->syms[k].vocab_id;
}

static int32_t added_id_of(const sd_tokenizer *t, const char *s, size_t len)
{
    uint32_t cps[256];
    size_t bad, n;
    if (len > 256)
        return -1;
    n = utf8_decode((const unsigned char *)s, len, cps, &bad);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].n == n && memcmp(t->added[i].cps, cps, n * sizeof *cps) == 0)
            return t->added[i].id;
    return -1;
}

/* The id the reference gives a token string: added tokens first, then the vocabulary, then unk. */
static void resolve_out_ids(sd_tokenizer *t)
{
    /* the two specials come out of the reference's BPE cache as whole tokens */
    uint32_t start = sym_intern(t, START_TEXT, strlen(START_TEXT));
    uint32_t end = sym_intern(t, END_TEXT, strlen(END_TEXT));
    for (uint32_t i = 0; i < t->n_syms; i++) {
        symbol *s = &t->syms[i];
        int32_t a = added_id_of(t, t->pool + s->off, s->len);
        s->out_id = a >= 0 ? a : s->vocab_id >= 0 ? s->vocab_id : t->unk_id;
    }
    t->start_text_id = t->syms[start].out_id;
    t->end_text_id = t->syms[end].out_id;
}

void sd_tokenizer_free(sd_tokenizer *t)
{
    if (!t)
        return;
    free(t->pool);
    free(t->syms);
    free(t->sym_slots);
    free(t->pair_keys);
    free(t->pair_rank);
    free(t->pair_res);
    free(t);
}

/* ---- the OpenAI merges file ---------------------------------------------------------------- */

int sd_tokenizer_load_bpe_gz(const char *path, sd_tokenizer **out, sd_err *err)
{
    char *buf;
    size_t len;
    *out = NULL;
    if (read_file(path, &buf, &len, err) != 0)
        return -1;
    if (check_utf8(path, buf, len, err) != 0) {
        free(buf);
        return -1;
    }
    sd_tokenizer *t = tokenizer_new();
    snprintf(t->source, sizeof t->source, "%s", path);
    /* vocabulary: 256 byte symbols, the same with </w>, one entry per merge, two specials */
    intern_base_symbols(t);
    for (int pass = 0, id = 0; pass < 2; pass++) {
        for (unsigned b = 0; b < 256; b++) {
            bool printable = byte_to_cp(b) == b; /* printable bytes first, in byte order */
            if (printable == (pass == 0)) {
                t->syms[t->base[b]].vocab_id = id;
                t->syms[t->base_eow[b]].vocab_id = 256 + id;
                id++;
            }
        }
    }
    merge_ctx m = {.tok = t, .derive_vocab = true, .next_vocab_id = 512};
    read_merges(&m, buf, len); /* OpenAI splits on '\n' without stripping the file first */
    free(m.scratch);
    free(buf);
    if (t->n_pairs == 0) {
        sd_tokenizer_free(t);
        return sd_err_set(err, "%s: no merge pairs after the header line (not a BPE merges file)", path);
    }
    t->syms[sym_intern(t, START_TEXT, strlen(START_TEXT))].vocab_id = (int32_t)m.next_vocab_id++;
    t->syms[sym_intern(t, END_TEXT, strlen(END_TEXT))].vocab_id = (int32_t)m.next_vocab_id++;
    t->vocab_size = m.next_vocab_id;
    /* SD2's tokenizer: unk = eos = <|endoftext|>, bos = <|startoftext|>, pad = "!" */
    t->unk_id = vocab_id_of(t, END_TEXT);
    t->bos_id = vocab_id_of(t, START_TEXT);
    t->eos_id = t->unk_id;
    t->pad_id = vocab_id_of(t, "!");
    if (add_token(t, path, "!", t->pad_id, err) || add_token(t, path, START_TEXT, t->bos_id, err) ||
        add_token(t, path, END_TEXT, t->eos_id, err)) {
        sd_tokenizer_free(t);
        return -1;
    }
    resolve_out_ids(t);
    *out = t;
    return 0;
}

/* ---- the diffusers snapshot ---------------------------------------------------------------- */

static int load_json_file(const char *path, json_object **obj, sd_err *err)
{
    char *buf;
    size_t len;
    if (read_file(path, &buf, &len, err) != 0)
        return -1;
    if (strlen(buf) != len) {
        free(buf);
        return sd_err_set(err, "%s: contains a NUL byte, not a JSON text file", path);
    }
    int rc = sd_json_parse(path, buf, len, obj, err);
    free(buf);
    return rc;
}

static int read_vocab_json(sd_tokenizer *t, const char *path, sd_err *err)
{
    json_object *root;
    if (load_json_file(path, &root, err) != 0)
        return -1;
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return sd_err_set(err, "%s: expected a JSON object mapping token -> id", path);
    }
    size_t n = 0;
    int64_t max_id = -1;
    json_object_object_foreach(root, key, val)
    {
        if (!json_object_is_type(val, json_type_int)) {
            sd_err_set(err, "%s: the id of token '%.200s' is not an integer", path, key);
            json_object_put(root);
            return -1;
        }
        int64_t id = json_object_get_int64(val);
        if (id < 0 || id > INT32_MAX) {
            sd_err_set(err, "%s: the id of token '%.200s' is out of range (%lld)", path, key, (long long)id);
            json_object_put(root);
            return -1;
        }
        uint32_t k = sym_intern(t, key, strlen(key));
        t->syms[k].vocab_id = (int32_t)id;
        max_id = id > max_id ? id : max_id;
        n++;
    }
    json_object_put(root);
    if (n == 0)
        return sd_err_set(err, "%s: empty vocabulary", path);
    /* the ids need not be dense: what the text encoder's embedding must hold is the largest
     * one + 1 (found by tests/fuzz/fuzz_tokenizerfiles.c; counting entries let ids past the
     * embedding table through the load-time check) */
    t->vocab_size = (size_t)max_id + 1;
    return 0;
}

typedef struct special_spec {
    char content[4][128]; /* unk, bos, eos, pad */
    const char *from[4];  /* file each one came from */
} special_spec;

static const char *const SPECIAL_KEYS[4] = {"unk_token", "bos_token", "eos_token", "pad_token"};

/* Reads the content of a special token: a string, or an object with "content". */
static int special_content(const char *path, const char *key, json_object *v, char *out, size_t cap, sd_err *err)
{
    const char *s = NULL;
    if (json_object_is_type(v, json_type_string)) {
        s = json_object_get_string(v);
    } else if (json_object_is_type(v, json_type_object)) {
        json_object *c;
        if (!json_object_object_get_ex(v, "content", &c) || !json_object_is_type(c, json_type_string))
            return sd_err_set(err, "%s: %s has no string \"content\"", path, key);
        s = json_object_get_string(c);
        static const char *const flags[] = {"lstrip", "rstrip", "single_word"};
        for (size_t i = 0; i < 3; i++) {
            json_object *f;
            if (json_object_object_get_ex(v, flags[i], &f) && json_object_get_boolean(f))
                return sd_err_set(err, "%s: %s sets %s, which sdtrain's tokenizer does not support", path, key,
                                  flags[i]);
        }
    } else {
        return sd_err_set(err, "%s: %s must be a string or an object with \"content\"", path, key);
    }
    if (strlen(s) == 0 || strlen(s) >= cap)
        return sd_err_set(err, "%s: %s '%.100s' is empty or too long", path, key, s);
    snprintf(out, cap, "%s", s);
    return 0;
}

/* An optional JSON file of the tokenizer folder holding an object: 1 with *root (the caller
 * puts it), 0 when the file is absent, -1 with err (`what` says what the object should be). */
static int load_optional_object(const char *path, const char *what, json_object **root, sd_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    if (load_json_file(path, root, err) != 0)
        return -1;
    if (!json_object_is_type(*root, json_type_object)) {
        json_object_put(*root);
        return sd_err_set(err, "%s: expected %s", path, what);
    }
    return 1;
}

/* *has_decoder (when not NULL) tells whether the file has "added_tokens_decoder" at all. */
static int read_specials(const char *path, special_spec *sp, sd_tokenizer *t, bool *has_decoder, sd_err *err)
{
    json_object *root;
    if (has_decoder)
        *has_decoder = false;
    const int r = load_optional_object(path, "a JSON object", &root, err);
    if (r <= 0)
        return r;
    for (int i = 0; i < 4; i++) {
        json_object *v;
        if (!json_object_object_get_ex(root, SPECIAL_KEYS[i], &v) || json_object_is_type(v, json_type_null))
            continue;
        if (special_content(path, SPECIAL_KEYS[i], v, sp->content[i], sizeof sp->content[i], err) != 0) {
            json_object_put(root);
            return -1;
        }
        sp->from[i] = path;
    }
    json_object *dec;
    if (has_decoder && json_object_object_get_ex(root, "added_tokens_decoder", &dec)) {
        *has_decoder = true;
        if (!json_object_is_type(dec, json_type_object)) {
            json_object_put(root);
            return sd_err_set(err, "%s: added_tokens_decoder must be an object", path);
        }
        json_object_object_foreach(dec, key, val)
        {
            char content[128], *end;
            errno = 0;
            long id = strtol(key, &end, 10);
            if (errno || *end || end == key || id < 0 || id > INT32_MAX) {
                sd_err_set(err, "%s: added_tokens_decoder key '%.100s' is not an id", path, key);
                json_object_put(root);
                return -1;
            }
            if (special_content(path, "added_tokens_decoder entry", val, content, sizeof content, err) != 0 ||
                add_token(t, path, content, (int32_t)id, err) != 0) {
                json_object_put(root);
                return -1;
            }
        }
    }
    json_object_put(root);
    return 0;
}

/* added_tokens.json, {"content": id, ...}: the added tokens of tokenizers saved before
 * transformers 4.34 (textual-inversion pipelines among them), which transformers still reads
 * when tokenizer_config.json has no added_tokens_decoder. It fills a table by id, so of two
 * contents with the same id the later one is the token. */
static int read_added_tokens_json(const char *path, sd_tokenizer *t, sd_err *err)
{
    json_object *root;
    const int r = load_optional_object(path, "a JSON object of token: id", &root, err);
    if (r <= 0)
        return r;
    json_object_object_foreach(root, key, val)
    {
        if (!json_object_is_type(val, json_type_int) || json_object_get_int64(val) < 0 ||
            json_object_get_int64(val) > INT32_MAX) {
            sd_err_set(err, "%s: token '%.100s' has no valid id", path, key);
            json_object_put(root);
            return -1;
        }
        const int32_t id = (int32_t)json_object_get_int64(val);
        for (size_t i = 0; i < t->n_added; i++) {
            if (t->added[i].id == id) {
                t->added[i] = t->added[--t->n_added];
                break;
            }
        }
        if (add_token(t, path, key, id, err) != 0) {
            json_object_put(root);
            return -1;
        }
    }
    json_object_put(root);
    return 0;
}

static int path_join(char *out, size_t cap, const char *dir, const char *name, sd_err *err)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return sd_err_set(err, "%s: path too long", dir);
    return 0;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int sd_tokenizer_load_snapshot(const char *dir, sd_tokenizer **out, sd_err *err)
{
    char tdir[4096], vocab[4200], merges[4200], smap[4200], tcfg[4200], atok[4200];
    *out = NULL;
    if (path_join(tdir, sizeof tdir, dir, "tokenizer", err) || path_join(vocab, sizeof vocab, tdir, "vocab.json", err))
        return -1;
    if (!is_file(vocab)) {
        snprintf(tdir, sizeof tdir, "%s", dir);
        if (path_join(vocab, sizeof vocab, tdir, "vocab.json", err))
            return -1;
        if (!is_file(vocab)) {
            char tj[4200];
            snprintf(tj, sizeof tj, "%s/tokenizer/tokenizer.json", dir);
            return sd_err_set(err,
                              "%s: no tokenizer/vocab.json (nor vocab.json): not a diffusers snapshot or "
                              "tokenizer folder%s",
                              dir,
                              is_file(tj) ? " (only tokenizer.json is there; sdtrain needs the slow files "
                                            "vocab.json + merges.txt)"
                                          : "");
        }
    }
    if (path_join(merges, sizeof merges, tdir, "merges.txt", err) ||
        path_join(smap, sizeof smap, tdir, "special_tokens_map.json", err) ||
        path_join(tcfg, sizeof tcfg, tdir, "tokenizer_config.json", err) ||
        path_join(atok, sizeof atok, tdir, "added_tokens.json", err))
        return -1;
    if (!is_file(merges))
        return sd_err_set(err, "%s: missing (vocab.json is there but merges.txt is not)", merges);

    sd_tokenizer *t = tokenizer_new();
    snprintf(t->source, sizeof t->source, "%s", vocab);
    char *buf = NULL;
    size_t len;
    if (read_vocab_json(t, vocab, err) != 0 || read_file(merges, &buf, &len, err) != 0 ||
        check_utf8(merges, buf, len, err) != 0)
        goto fail;
    /* transformers: read().strip().split("\n")[1:48895] */
    {
        size_t a = 0, b = len, w;
        while (a < b && py_space_at(buf, len, a, &w))
            a += w;
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)buf[k] & 0xC0) == 0x80)
                k--;
            if (!py_space_at(buf, len, k, &w))
                break;
            b = k;
        }
        merge_ctx m = {.tok = t};
        read_merges(&m, buf + a, b - a);
        free(m.scratch);
    }
    free(buf);
    buf = NULL;
    intern_base_symbols(t);

    /* special tokens: CLIPTokenizer's defaults, then tokenizer_config.json. transformers 4.47
     * reads added_tokens.json and special_tokens_map.json (which then wins) only for a
     * tokenizer_config.json without "added_tokens_decoder" (files saved before 4.34); with
     * one, the config alone decides */
    special_spec sp = {.content = {"<|endoftext|>", "<|startoftext|>", "<|endoftext|>", "<|endoftext|>"}};
    bool has_decoder;
    if (read_specials(tcfg, &sp, t, &has_decoder, err) != 0 ||
        (!has_decoder && (read_added_tokens_json(atok, t, err) != 0 || read_specials(smap, &sp, t, NULL, err) != 0)))
        goto fail;
    int32_t ids[4];
    for (int i = 0; i < 4; i++) {
        int32_t id = added_id_of(t, sp.content[i], strlen(sp.content[i]));
        if (id < 0)
            id = vocab_id_of(t, sp.content[i]);
        if (id < 0) {
            sd_err_set(err, "%s: %s '%s' is not in vocab.json (adding new tokens is not supported)",
                       sp.from[i] ? sp.from[i] : vocab, SPECIAL_KEYS[i], sp.content[i]);
            goto fail;
        }
        ids[i] = id;
        if (add_token(t, sp.from[i] ? sp.from[i] : vocab, sp.content[i], id, err) != 0)
            goto fail;
    }
    t->unk_id = vocab_id_of(t, sp.content[0]);
    if (t->unk_id < 0) {
        sd_err_set(err, "%s: unk token '%s' is not in vocab.json", vocab, sp.content[0]);
        goto fail;
    }
    t->bos_id = ids[1];
    t->eos_id = ids[2];
    t->pad_id = ids[3];
    resolve_out_ids(t);
    *out = t;
    return 0;
fail:
    free(buf);
    sd_tokenizer_free(t);
    return -1;
}

int sd_tokenizer_load(const char *path, sd_tokenizer **out, sd_err *err)
{
    struct stat st;
    *out = NULL;
    if (stat(path, &st) != 0)
        return sd_err_set(err, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return sd_tokenizer_load_snapshot(path, out, err);
    return sd_tokenizer_load_bpe_gz(path, out, err);
}

int sd_tokenizer_check_model_vocab(const sd_tokenizer *t, int64_t model_vocab, sd_err *err)
{
    int64_t top = (int64_t)t->vocab_size - 1;
    top = t->bos_id > top ? t->bos_id : top;
    top = t->eos_id > top ? t->eos_id : top;
    top = t->pad_id > top ? t->pad_id : top;
    /* added tokens may lie past vocab.json (added_tokens.json of a textual-inversion tokenizer:
     * "<cat-toy>" = 49408); a caption naming one emits that id */
    for (size_t i = 0; i < t->n_added; i++)
        top = t->added[i].id > top ? t->added[i].id : top;
    if (top >= model_vocab)
        return sd_err_set(err, "tokenizer %s gives ids up to %lld, beyond the text encoder's "
                               "vocabulary of %lld: they do not belong together",
                          t->source, (long long)top, (long long)model_vocab);
    return 0;
}

void sd_tokenizer_get_info(const sd_tokenizer *t, sd_tokenizer_info *info)
{
    info->bos_id = t->bos_id;
    info->eos_id = t->eos_id;
    info->pad_id = t->pad_id;
    info->unk_id = t->unk_id;
    info->vocab_size = t->vocab_size;
    info->n_merges = t->n_merges;
    info->n_added = t->n_added;
    info->source = t->source;
}

void sd_tokenizer_set_heap_threshold(sd_tokenizer *t, size_t n_bytes)
{
    t->heap_threshold = n_bytes < 2 ? 2 : n_bytes;
}

/* ---- clean-up: BasicTokenizer(strip_accents=False, do_split_on_punc=False) ---------------- */

static bool is_cjk(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
           (cp >= 0x2B820 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

#define S_BASE 0xAC00u
#define L_BASE 0x1100u
#define V_BASE 0x1161u
#define T_BASE 0x11A7u
#define L_COUNT 19u
#define V_COUNT 21u
#define T_COUNT 28u
#define N_COUNT (V_COUNT * T_COUNT)
#define S_COUNT (L_COUNT * N_COUNT)

static const sd_uc_decomp *find_decomp(uint32_t cp)
{
    size_t lo = 0, hi = sd_uc_n_decomp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sd_uc_decomp_map[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < sd_uc_n_decomp && sd_uc_decomp_map[lo].cp == cp ? &sd_uc_decomp_map[lo] : NULL;
}

static uint32_t find_comp(uint32_t a, uint32_t b)
{
    size_t lo = 0, hi = sd_uc_n_comp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const sd_uc_comp *c = &sd_uc_comp_map[mid];
        if (c->first < a || (c->first == a && c->second < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < sd_uc_n_comp && sd_uc_comp_map[lo].first == a && sd_uc_comp_map[lo].second == b)
        return sd_uc_comp_map[lo].composite;
    return 0;
}

/* Stable sort of a run of non-starters by combining class: insertion sort for short runs,
 * a counting sort for long ones (a caption of thousands of marks in alternating classes made
 * the insertion sort quadratic: 0.3 s for 64 kB). `spare` is scratch space. */
static void sort_by_class(uint32_t *r, size_t n, u32buf *spare)
{
    if (n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = r[i];
            unsigned cc = sd_uc_ccc(c);
            size_t j = i;
            while (j > 0 && sd_uc_ccc(r[j - 1]) > cc) {
                r[j] = r[j - 1];
                j--;
            }
            r[j] = c;
        }
        return;
    }
    size_t start[257] = {0};
    for (size_t i = 0; i < n; i++)
        start[sd_uc_ccc(r[i]) + 1]++;
    for (size_t k = 1; k < 257; k++)
        start[k] += start[k - 1];
    spare->n = 0;
    u32_reserve(spare, n);
    for (size_t i = 0; i < n; i++)
        spare->p[start[sd_uc_ccc(r[i])]++] = r[i];
    memcpy(r, spare->p, n * sizeof *r);
}

/* NFC of in[0..n) into out (replaced). */
static void nfc(const uint32_t *in, size_t n, u32buf *tmp, u32buf *out)
{
    tmp->n = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = in[i];
        if (c >= S_BASE && c < S_BASE + S_COUNT) {
            uint32_t s = c - S_BASE;
            u32_push(tmp, L_BASE + s / N_COUNT);
            u32_push(tmp, V_BASE + (s % N_COUNT) / T_COUNT);
            if (s % T_COUNT)
                u32_push(tmp, T_BASE + s % T_COUNT);
        } else if (sd_uc_props(c) & SD_UC_DECOMP) {
            const sd_uc_decomp *d = find_decomp(c);
            if (d)
                for (uint32_t k = 0; k < d->n; k++)
                    u32_push(tmp, sd_uc_decomp_pool[d->offset + k]);
            else
                u32_push(tmp, c);
        } else {
            u32_push(tmp, c);
        }
    }
    /* canonical ordering: a stable sort of each run of non-starters by class */
    uint32_t *d = tmp->p;
    size_t m = tmp->n;
    for (size_t i = 0; i < m;) {
        if (sd_uc_ccc(d[i]) == 0) {
            i++;
            continue;
        }
        size_t end = i + 1;
        while (end < m && sd_uc_ccc(d[end]) != 0)
            end++;
        sort_by_class(d + i, end - i, out);
        i = end;
    }
    /* canonical composition */
    out->n = 0;
    u32_reserve(out, m);
    long starter = -1;
    unsigned last_ccc = 0;
    for (size_t i = 0; i < m; i++) {
        uint32_t c = d[i];
        unsigned cc = sd_uc_ccc(c);
        if (starter >= 0 && (out->n - 1 == (size_t)starter || (last_ccc != 0 && last_ccc < cc))) {
            uint32_t s = out->p[starter], composed = 0;
            if (s >= L_BASE && s < L_BASE + L_COUNT && c >= V_BASE && c < V_BASE + V_COUNT)
                composed = S_BASE + ((s - L_BASE) * V_COUNT + (c - V_BASE)) * T_COUNT;
            else if (s >= S_BASE && s < S_BASE + S_COUNT && (s - S_BASE) % T_COUNT == 0 && c > T_BASE &&
                     c < T_BASE + T_COUNT)
                composed = s + (c - T_BASE);
            else
                composed = find_comp(s, c);
            if (composed) {
                out->p[starter] = composed;
                continue;
            }
        }
        if (cc == 0)
            starter = (long)out->n;
        last_ccc = cc;
        out->p[out->n++] = c;
    }
}

static uint32_t lower_single(uint32_t cp)
{
    size_t lo = 0, hi = sd_uc_n_lower;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (sd_uc_lower[mid].cp < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < sd_uc_n_lower && sd_uc_lower[lo].cp == cp ? sd_uc_lower[lo].value : 0;
}

/* Python's str.lower() of w[0..n) appended to out (final sigma in the word's context). */
static void lower_word(const uint32_t *w, size_t n, u32buf *out)
{
    u32_reserve(out, out->n + 3 * n);
    for (size_t i = 0; i < n; i++) {
        uint32_t c = w[i];
        if (c < 0x80) {
            out->p[out->n++] = (c >= 'A' && c <= 'Z') ? c + 32 : c;
            continue;
        }
        if (!(sd_uc_props(c) & SD_UC_LOWER)) {
            out->p[out->n++] = c;
            continue;
        }
        if (c == 0x3A3) {
            long j = (long)i - 1;
            while (j >= 0 && (sd_uc_props(w[j]) & SD_UC_CASE_IGN))
                j--;
            bool final = j >= 0 && (sd_uc_props(w[j]) & SD_UC_CASED);
            if (final) {
                size_t k = i + 1;
                while (k < n && (sd_uc_props(w[k]) & SD_UC_CASE_IGN))
                    k++;
                final = k == n || !(sd_uc_props(w[k]) & SD_UC_CASED);
            }
            out->p[out->n++] = final ? 0x3C2 : 0x3C3;
            continue;
        }
        uint32_t l = lower_single(c);
        if (l) {
            out->p[out->n++] = l;
            continue;
        }
        for (size_t k = 0; k < sd_uc_n_lower_multi; k++) {
            if (sd_uc_lower_multi[k].cp == c) {
                for (uint32_t q = 0; q < sd_uc_lower_multi[k].n; q++)
                    out->p[out->n++] = sd_uc_lower_multi[k].cps[q];
                break;
            }
        }
    }
}

typedef struct scratch {
    u32buf cleaned, tmp, normal, lowered, word, rank, prev, next, heap;
    char *bytes;
    size_t bytes_cap;
    uint8_t *mark;
    size_t mark_cap;
} scratch;

static void scratch_free(scratch *s)
{
    free(s->cleaned.p);
    free(s->tmp.p);
    free(s->normal.p);
    free(s->lowered.p);
    free(s->word.p);
    free(s->rank.p);
    free(s->prev.p);
    free(s->next.p);
    free(s->heap.p);
    free(s->bytes);
    free(s->mark);
}

/* _clean_text, _tokenize_chinese_chars and NFC of one piece; returns the normalized text. */
static const u32buf *clean_piece(const uint32_t *cps, size_t n, scratch *s)
{
    u32buf *c = &s->cleaned;
    bool maybe = false;
    c->n = 0;
    u32_reserve(c, 3 * n);
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = cps[i];
        unsigned p = sd_uc_props(cp);
        if (p & SD_UC_DROP)
            continue;
        if (p & SD_UC_CSPACE) {
            c->p[c->n++] = ' ';
        } else if (cp >= 0x3400 && is_cjk(cp)) {
            c->p[c->n++] = ' ';
            c->p[c->n++] = cp;
            c->p[c->n++] = ' ';
            maybe |= (p & SD_UC_NFC_MAYBE) != 0;
        } else {
            c->p[c->n++] = cp;
            maybe |= (p & SD_UC_NFC_MAYBE) != 0;
        }
    }
    if (!maybe)
        return c;
    nfc(c->p, c->n, &s->tmp, &s->normal);
    return &s->normal;
}

/* ---- pre-tokenisation and BPE ------------------------------------------------------------- */

typedef struct emitter {
    int32_t *ids; /* ids[1..] receive the first CONTENT_MAX content ids */
    size_t count;
    bool stop_when_full;
} emitter;

static inline bool emitter_full(const emitter *e)
{
    return e->stop_when_full && e->count >= CONTENT_MAX;
}

static inline void emit(emitter *e, int32_t id)
{
    if (e->count < CONTENT_MAX)
        e->ids[1 + e->count] = id;
    e->count++;
}

/* The reference's merge loop on short words: find the lowest-ranked adjacent pair, merge all
 * its occurrences left to right, repeat. Pair ranks are cached and refreshed only next to
 * merged symbols. */
static size_t bpe_scan(const sd_tokenizer *t, uint32_t *w, size_t n, scratch *s)
{
    u32_reserve(&s->rank, n);
    if (s->mark_cap < n) {
        s->mark_cap = n * 2;
        s->mark = sd_xrealloc(s->mark, s->mark_cap);
    }
    uint32_t *r = s->rank.p, res;
    uint8_t *mark = s->mark;
    for (size_t i = 0; i + 1 < n; i++)
        r[i] = pair_get(t, w[i], w[i + 1], &res);
    while (n > 1) {
        uint32_t best = NO_RANK;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            if (r[i] < best) {
                best = r[i];
                at = i;
            }
        }
        if (best == NO_RANK)
            break;
        /* ranks are unique per pair, so `at` is the pair's first occurrence */
        uint32_t a = w[at], b = w[at + 1], merged = 0;
        pair_get(t, a, b, &merged);
        size_t j = at;
        for (size_t i = at; i < n; j++) {
            if (i + 1 < n && w[i] == a && w[i + 1] == b) {
                w[j] = merged;
                mark[j] = 1;
                i += 2;
            } else {
                w[j] = w[i];
                r[j] = r[i];
                mark[j] = 0;
                i++;
            }
        }
        n = j;
        size_t from = at;
        if (at > 0) {
            from = at - 1;
            mark[from] = 0;
        }
        for (size_t i = from; i + 1 < n; i++)
            if (mark[i] || mark[i + 1])
                r[i] = pair_get(t, w[i], w[i + 1], &res);
    }
    return n;
}

/* Binary heap of (rank, position), smallest rank first. */
static void heap_push(u32buf *h, uint32_t rank, uint32_t pos)
{
    u32_reserve(h, h->n + 2);
    size_t i = h->n / 2;
    h->n += 2;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->p[2 * p] < rank || (h->p[2 * p] == rank && h->p[2 * p + 1] <= pos))
            break;
        h->p[2 * i] = h->p[2 * p];
        h->p[2 * i + 1] = h->p[2 * p + 1];
        i = p;
    }
    h->p[2 * i] = rank;
    h->p[2 * i + 1] = pos;
}

static void heap_pop(u32buf *h, uint32_t *rank, uint32_t *pos)
{
    *rank = h->p[0];
    *pos = h->p[1];
    h->n -= 2;
    size_t n = h->n / 2;
    if (n == 0)
        return;
    uint32_t lr = h->p[2 * n], lp = h->p[2 * n + 1];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n &&
            (h->p[2 * (c + 1)] < h->p[2 * c] || (h->p[2 * (c + 1)] == h->p[2 * c] && h->p[2 * c + 3] < h->p[2 * c + 1])))
            c++;
        if (lr < h->p[2 * c] || (lr == h->p[2 * c] && lp <= h->p[2 * c + 1]))
            break;
        h->p[2 * i] = h->p[2 * c];
        h->p[2 * i + 1] = h->p[2 * c + 1];
        i = c;
    }
    h->p[2 * i] = lr;
    h->p[2 * i + 1] = lp;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The same merges as bpe_scan in O(n log n): each round takes the lowest-ranked pair present
 * and merges all its occurrences left to right, as the reference's loop does. */
static size_t bpe_heap(const sd_tokenizer *t, uint32_t *w, size_t n, scratch *s)
{
    u32_reserve(&s->prev, n);
    u32_reserve(&s->next, n);
    uint32_t *prev = s->prev.p, *next = s->next.p, res = 0;
    const uint32_t NONE = UINT32_MAX;
    u32buf *h = &s->heap;
    u32buf *batch = &s->tmp;
    h->n = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = i ? (uint32_t)(i - 1) : NONE;
        next[i] = i + 1 < n ? (uint32_t)(i + 1) : NONE;
        if (i + 1 < n) {
            uint32_t rk = pair_get(t, w[i], w[i + 1], &res);
            if (rk != NO_RANK)
                heap_push(h, rk, (uint32_t)i);
        }
    }
    while (h->n) {
        uint32_t rank, pos;
        heap_pop(h, &rank, &pos);
        if (w[pos] == DEAD_SYM || next[pos] == NONE || pair_get(t, w[pos], w[next[pos]], &res) != rank)
            continue;
        uint32_t a = w[pos], b = w[next[pos]], merged = res;
        batch->n = 0;
        u32_push(batch, pos);
        while (h->n && h->p[0] == rank) {
            uint32_t r2, p2;
            heap_pop(h, &r2, &p2);
            u32_push(batch, p2);
        }
        if (batch->n > 1)
            qsort(batch->p, batch->n, sizeof *batch->p, cmp_u32);
        for (size_t k = 0; k < batch->n; k++) {
            uint32_t p = batch->p[k];
            if (w[p] != a || next[p] == NONE || w[next[p]] != b)
                continue;
            uint32_t q = next[p];
            w[p] = merged;
            w[q] = DEAD_SYM;
            next[p] = next[q];
            if (next[q] != NONE)
                prev[next[q]] = p;
            uint32_t rk;
            if (prev[p] != NONE && (rk = pair_get(t, w[prev[p]], w[p], &res)) != NO_RANK)
                heap_push(h, rk, prev[p]);
            if (next[p] != NONE && (rk = pair_get(t, w[p], w[next[p]], &res)) != NO_RANK)
                heap_push(h, rk, p);
        }
    }
    size_t m = 0;
    for (uint32_t i = 0; i != NONE; i = next[i])
        w[m++] = w[i];
    return m;
}

/* BPE of one pre-token (its UTF-8 bytes), ids to the emitter. */
static void bpe_emit(const sd_tokenizer *t, const char *bytes, size_t nb, scratch *s, emitter *e)
{
    if (nb == sizeof START_TEXT - 1 && memcmp(bytes, START_TEXT, nb) == 0) {
        emit(e, t->start_text_id);
        return;
    }
    if (nb == sizeof END_TEXT - 1 && memcmp(bytes, END_TEXT, nb) == 0) {
        emit(e, t->end_text_id);
        return;
    }
    if (nb == 1) {
        emit(e, t->syms[t->base_eow[(unsigned char)bytes[0]]].out_id);
        return;
    }
    u32_reserve(&s->word, nb);
    uint32_t *w = s->word.p;
    for (size_t i = 0; i + 1 < nb; i++)
        w[i] = t->base[(unsigned char)bytes[i]];
    w[nb - 1] = t->base_eow[(unsigned char)bytes[nb - 1]];
    size_t n = nb >= t->heap_threshold ? bpe_heap(t, w, nb, s) : bpe_scan(t, w, nb, s);
    for (size_t i = 0; i < n; i++)
        emit(e, t->syms[w[i]].out_id);
}

static uint32_t ascii_fold(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    for (size_t i = 0; i < sd_uc_n_ascii_fold; i++)
        if (sd_uc_ascii_fold[i].cp == cp)
            return sd_uc_ascii_fold[i].value;
    return cp;
}

/* Length of a match of the literal `lit` at w[i] under the pattern's IGNORECASE, or 0. */
static size_t match_literal(const uint32_t *w, size_t n, size_t i, const char *lit)
{
    size_t k = 0;
    for (; lit[k]; k++) {
        if (i + k >= n)
            return 0;
        uint32_t c = w[i + k];
        unsigned char l = (unsigned char)lit[k];
        if (l >= 'a' && l <= 'z') {
            if (ascii_fold(c) != l)
                return 0;
        } else if (c != l) {
            return 0;
        }
    }
    return k;
}

/* Runs the pre-tokenisation regex over one lower-cased word and BPE-encodes each match. */
static void pretokenize(const sd_tokenizer *t, const uint32_t *w, size_t n, scratch *s, emitter *e)
{
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    size_t i = 0;
    while (i < n && !emitter_full(e)) {
        uint32_t c = w[i];
        size_t m = 0;
        if (c == '<') {
            m = match_literal(w, n, i, START_TEXT);
            if (!m)
                m = match_literal(w, n, i, END_TEXT);
        } else if (c == '\'') {
            for (size_t k = 0; k < 7 && !m; k++)
                m = match_literal(w, n, i, contractions[k]);
        }
        if (!m) {
            unsigned p = sd_uc_props(c);
            if (p & SD_UC_RX_L) {
                m = 1;
                while (i + m < n && (sd_uc_props(w[i + m]) & SD_UC_RX_L))
                    m++;
            } else if (p & SD_UC_RX_N) {
                m = 1;
            } else if (p & SD_UC_RX_O) {
                m = 1;
                while (i + m < n && (sd_uc_props(w[i + m]) & SD_UC_RX_O))
                    m++;
            } else {
                i++; /* whitespace, or a code point no alternative matches (U+0345) */
                continue;
            }
        }
        if (s->bytes_cap < 4 * m) {
            s->bytes_cap = 8 * m;
            s->bytes = sd_xrealloc(s->bytes, s->bytes_cap);
        }
        size_t nb = 0;
        for (size_t k = 0; k < m; k++)
            nb += utf8_put(w[i + k], s->bytes + nb);
        bpe_emit(t, s->bytes, nb, s, e);
        i += m;
    }
}

/* One piece of text between added tokens: clean, split on whitespace, lower, pre-tokenize. */
static void encode_piece(const sd_tokenizer *t, const uint32_t *cps, size_t n, scratch *s, emitter *e)
{
    const u32buf *c = clean_piece(cps, n, s);
    size_t i = 0;
    while (i < c->n && !emitter_full(e)) {
        while (i < c->n && (sd_uc_props(c->p[i]) & SD_UC_PYSPACE))
            i++;
        size_t start = i;
        while (i < c->n && !(sd_uc_props(c->p[i]) & SD_UC_PYSPACE))
            i++;
        if (i == start)
            break;
        s->lowered.n = 0;
        lower_word(c->p + start, i - start, &s->lowered);
        pretokenize(t, s->lowered.p, s->lowered.n, s, e);
    }
}

/* Longest added token starting at cps[i] (the reference's trie split), or NULL. */
static const added_token *match_added(const sd_tokenizer *t, const uint32_t *cps, size_t n, size_t i)
{
    const added_token *best = NULL;
    for (size_t k = 0; k < t->n_added; k++) {
        const added_token *a = &t->added[k];
        if (a->cps[0] != cps[i] || a->n > n - i || (best && best->n >= a->n))
            continue;
        if (memcmp(a->cps, cps + i, a->n * sizeof *cps) == 0)
            best = a;
    }
    return best;
}

int sd_tokenize(const sd_tokenizer *t, const char *text, size_t len, int32_t ids[SD_TOKENIZER_LENGTH],
                int *n_tokens_before_truncation)
{
    scratch s = {0};
    uint32_t stack_cps[512];
    uint32_t *cps = len <= 512 ? stack_cps : sd_xmalloc(len * sizeof *cps);
    size_t bad = 0;
    size_t n = text ? utf8_decode((const unsigned char *)text, len, cps, &bad) : 0;
    emitter e = {.ids = ids, .count = 0, .stop_when_full = n_tokens_before_truncation == NULL};

    size_t piece = 0;
    for (size_t i = 0; i < n && !emitter_full(&e);) {
        const added_token *a = match_added(t, cps, n, i);
        if (!a) {
            i++;
            continue;
        }
        if (i > piece)
            encode_piece(t, cps + piece, i - piece, &s, &e);
        if (!emitter_full(&e))
            emit(&e, a->id);
        i += a->n;
        piece = i;
    }
    if (piece < n && !emitter_full(&e))
        encode_piece(t, cps + piece, n - piece, &s, &e);

    size_t kept = e.count < CONTENT_MAX ? e.count : CONTENT_MAX;
    ids[0] = t->bos_id;
    ids[1 + kept] = t->eos_id;
    for (size_t k = 2 + kept; k < SD_TOKENIZER_LENGTH; k++)
        ids[k] = t->pad_id;
    if (n_tokens_before_truncation)
        *n_tokens_before_truncation = e.count + 2 > INT_MAX ? INT_MAX : (int)(e.count + 2);
    if (cps != stack_cps)
        free(cps);
    scratch_free(&s);
    return bad > INT_MAX ? INT_MAX : (int)bad;
}

int sd_tokenizer_clean_text(const char *text, size_t len, char **out, size_t *out_len)
{
    scratch s = {0};
    uint32_t *cps = sd_xmalloc((len ? len : 1) * sizeof *cps);
    size_t bad = 0;
    size_t n = text ? utf8_decode((const unsigned char *)text, len, cps, &bad) : 0;
    const u32buf *c = clean_piece(cps, n, &s);
    u32buf joined = {0};
    size_t i = 0;
    while (i < c->n) {
        while (i < c->n && (sd_uc_props(c->p[i]) & SD_UC_PYSPACE))
            i++;
        size_t start = i;
        while (i < c->n && !(sd_uc_props(c->p[i]) & SD_UC_PYSPACE))
            i++;
        if (i == start)
            break;
        if (joined.n)
            u32_push(&joined, ' ');
        lower_word(c->p + start, i - start, &joined);
    }
    char *o = sd_xmalloc(4 * joined.n + 1);
    size_t nb = 0;
    for (size_t k = 0; k < joined.n; k++)
        nb += utf8_put(joined.p[k], o + nb);
    o[nb] = '\0';
    *out = o;
    if (out_len)
        *out_len = nb;
    free(joined.p);
    free(cps);
    scratch_free(&s);
    return bad > INT_MAX ? INT_MAX : (int)bad;
}
