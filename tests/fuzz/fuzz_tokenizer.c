/* libFuzzer harness: the CLIP tokenizer and its text clean-up on arbitrary caption bytes.
 *
 * Vocabulary: OpenAI's merges file, tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz (or the
 * file or snapshot named by $SD_FUZZ_TOKENIZER). Invariants (include/sdtrain/tokenizer.h):
 *   - 77 ids: bos first, then the content ids, eos, and pad ids to the end; every id inside the
 *     vocabulary; the untruncated length is at least 2 and says where eos stands;
 *   - stopping early (no untruncated length asked for) gives the same ids;
 *   - the heap merge and the rescan merge give the same ids (a second tokenizer whose heap
 *     threshold is 1 byte merges every word with the heap);
 *   - the clean-up writes well-formed UTF-8 with single spaces between words and none at either
 *     end, and counts the same ill-formed subparts as the tokenizer.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh tokenizer [SECONDS]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/tokenizer.h"
#include "sdtrain/utf8.h"

#define FUZZ_NAME "fuzz_tokenizer"
#include "fuzz_util.h"
#include "fuzz_tokenizer_check.h"

#ifndef SD_FUZZ_TOP
#define SD_FUZZ_TOP "."
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static sd_tokenizer *tok, *tok_heap;

static void setup(void)
{
    const char *path = getenv("SD_FUZZ_TOKENIZER");
    char def[4096];
    sd_err err;
    if (!path) {
        snprintf(def, sizeof def, "%s/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz", SD_FUZZ_TOP);
        path = def;
    }
    if (sd_tokenizer_load(path, &tok, &err) != 0 || sd_tokenizer_load(path, &tok_heap, &err) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    sd_tokenizer_set_heap_threshold(tok_heap, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t ids[SD_TOKENIZER_LENGTH], ids_early[SD_TOKENIZER_LENGTH], ids_heap[SD_TOKENIZER_LENGTH];
    int n = 0, n_heap = 0, bad, bad_early, bad_heap, bad_clean;
    char *clean = NULL;
    size_t clean_len = 0;

    if (!tok)
        setup();
    bad = sd_tokenize(tok, (const char *)data, size, ids, &n);
    bad_early = sd_tokenize(tok, (const char *)data, size, ids_early, NULL);
    bad_heap = sd_tokenize(tok_heap, (const char *)data, size, ids_heap, &n_heap);

    fuzz_require(bad >= 0 && bad_early == bad && bad_heap == bad, "one count of ill-formed subparts",
                 NULL);
    fuzz_check_ids(tok, ids, n);
    fuzz_require(memcmp(ids, ids_early, sizeof ids) == 0, "stopping early gives the same ids", NULL);
    fuzz_require(n_heap == n && memcmp(ids, ids_heap, sizeof ids) == 0, "heap merge == rescan merge",
                 NULL);

    bad_clean = sd_tokenizer_clean_text((const char *)data, size, &clean, &clean_len);
    fuzz_require(clean != NULL && strlen(clean) == clean_len, "the clean text is NUL-terminated", NULL);
    fuzz_require(bad_clean == bad, "the clean-up counts the tokenizer's ill-formed subparts", NULL);
    fuzz_require(sd_utf8_is_valid(clean, clean_len), "the clean text is well-formed UTF-8", NULL);
    fuzz_require(clean_len == 0 || (clean[0] != ' ' && clean[clean_len - 1] != ' '),
                 "no space at the ends", NULL);
    fuzz_require(strstr(clean, "  ") == NULL, "single spaces between words", NULL);
    free(clean);
    return 0;
}
