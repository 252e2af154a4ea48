/* The CLIP BPE tokenizer of SD2, id for id the same as the reference (transformers'
 * CLIPTokenizer without ftfy, SD2 tokenizer files; doc/tokenizer.md). */
#ifndef SDTRAIN_TOKENIZER_H
#define SDTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every caption becomes exactly this many ids: bos, at most 75 content ids, eos, pad. */
#define SD_TOKENIZER_LENGTH 77

/* Environment variable naming the vocabulary sdtool uses when none is given: a diffusers
 * snapshot, its tokenizer/ folder, or an OpenAI bpe_simple_vocab_16e6.txt.gz file. */
#define SD_TOKENIZER_ENV "SDTRAIN_TOKENIZER"

typedef struct sd_tokenizer sd_tokenizer;

typedef struct sd_tokenizer_info {
    int32_t bos_id, eos_id, pad_id, unk_id;
    size_t vocab_size;  /* one more than the largest id: of vocab.json (whose ids need not be
                           dense), or the size of the vocabulary derived from the merges */
    size_t n_merges;    /* merge lines read (the reference keeps at most 48,894) */
    size_t n_added;     /* added tokens the text is split on first (SD2: "!", bos, eos) */
    const char *source; /* what was loaded: the vocab.json path or the .gz path */
} sd_tokenizer_info;

/* Loads tokenizer/vocab.json + merges.txt of a diffusers snapshot. `dir` is the snapshot
 * root (it has tokenizer/) or the tokenizer folder itself. The special tokens are
 * CLIPTokenizer's defaults (all <|endoftext|> but bos), overridden by tokenizer_config.json
 * and then, when that has no "added_tokens_decoder", by special_tokens_map.json, as
 * transformers 4.47 does: an SD2 snapshot sets pad "!" (id 0) there. Returns 0, or -1 with a message naming the file and the problem.
 * The tokenizer is immutable afterwards: one may be shared by any number of threads. */
int sd_tokenizer_load_snapshot(const char *dir, sd_tokenizer **tok, sd_err *err);

/* Loads the OpenAI / OpenCLIP merges file (gzip'ed text, first line a header). The
 * vocabulary is derived from the first 48,894 merges as the reference does; framing and
 * added tokens are SD2's (bos 49406, eos 49407, pad "!" = 0). Plain text also works. */
int sd_tokenizer_load_bpe_gz(const char *path, sd_tokenizer **tok, sd_err *err);

/* Loads whatever `path` is: a .gz / merges file, a snapshot root or a tokenizer folder. */
int sd_tokenizer_load(const char *path, sd_tokenizer **tok, sd_err *err);

void sd_tokenizer_free(sd_tokenizer *tok);

void sd_tokenizer_get_info(const sd_tokenizer *tok, sd_tokenizer_info *info);

/* 0 when every id the tokenizer can give is below `model_vocab` (the text encoder's
 * vocab_size, the rows of its embedding table); else -1 with a message naming the tokenizer. */
int sd_tokenizer_check_model_vocab(const sd_tokenizer *tok, int64_t model_vocab, sd_err *err);

/* Tokenizes one caption of `len` bytes (UTF-8; NUL bytes are characters, as in Python) into
 * exactly SD_TOKENIZER_LENGTH ids: bos, the first 75 content ids, eos, then pad ids.
 * *n_tokens_before_truncation (may be NULL) receives the length the caption would have
 * without truncation, bos and eos included (>= 2). When it is NULL, work stops once the 75
 * content ids are known.
 * Ill-formed UTF-8 is decoded like Python's bytes.decode('utf-8', 'replace') (one U+FFFD
 * per maximal ill-formed subpart), and the clean-up then drops every U+FFFD, exactly as the
 * reference does with such a string. Returns the number of replaced subparts (0 for valid
 * UTF-8); never fails. Thread-safe. */
int sd_tokenize(const sd_tokenizer *tok, const char *text, size_t len, int32_t ids[SD_TOKENIZER_LENGTH],
                int *n_tokens_before_truncation);

/* The reference's text clean-up of one piece of text (transformers' BasicTokenizer as
 * CLIPTokenizer configures it without ftfy): drop NUL, U+FFFD and control/format/unassigned
 * characters, map \t \n \r and space separators to ' ', put spaces around CJK ideographs, NFC,
 * split on whitespace, lower-case each word (Python str.lower), join with one space.
 * Ill-formed UTF-8 is handled as in sd_tokenize. *out is malloc'ed, NUL-terminated UTF-8
 * (free it); returns the number of replaced subparts. For debugging and tests: sd_tokenize
 * applies this to each piece of text between added tokens. */
int sd_tokenizer_clean_text(const char *text, size_t len, char **out, size_t *out_len);

/* Words of at least this many bytes are merged with a heap (O(n log n)) instead of the plain
 * rescan (O(n^2), faster on short words); both give the reference's result. Default 64;
 * for tests and benchmarks. */
void sd_tokenizer_set_heap_threshold(sd_tokenizer *tok, size_t n_bytes);

#ifdef __cplusplus
}
#endif
#endif
