/* libFuzzer harness: a snapshot's tokenizer files (vocab.json, merges.txt, tokenizer_config.json,
 * special_tokens_map.json) from arbitrary bytes, split at NUL bytes into those four files in that
 * order (missing parts: the optional files are left out).
 * Invariants (include/sdtrain/tokenizer.h):
 *   - a refusal names a file of the tokenizer folder;
 *   - a loaded tokenizer turns a few fixed captions and the input itself into 77 ids, bos first,
 *     eos where the untruncated length says, pad after it, every id inside the vocabulary;
 *   - the heap merge and the rescan merge agree (a second load with a 1-byte heap threshold).
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh tokenizerfiles [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/tokenizer.h"

#define FUZZ_NAME "fuzz_tokenizerfiles"
#include "fuzz_util.h"
#include "fuzz_tokenizer_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const file_names[4] = {"vocab.json", "merges.txt", "tokenizer_config.json",
                                          "special_tokens_map.json"};
static char dir[256], paths[4][320];

static void cleanup(void)
{
    for (int i = 0; i < 4; i++)
        unlink(paths[i]);
    rmdir(dir);
}

/* The framing of one caption's ids, and the heap merge against the rescan merge. */
static void check_ids(const sd_tokenizer *a, const sd_tokenizer *b, const char *text, size_t len)
{
    int32_t ids[SD_TOKENIZER_LENGTH], ids_b[SD_TOKENIZER_LENGTH];
    int n = 0, n_b = 0;
    sd_tokenize(a, text, len, ids, &n);
    sd_tokenize(b, text, len, ids_b, &n_b);
    fuzz_check_ids(a, ids, n);
    fuzz_require(n_b == n && memcmp(ids, ids_b, sizeof ids) == 0, "heap merge == rescan merge", NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const captions[] = {"a photo of a cat", "Hello, WORLD!! 123 ünïcödé 漢字",
                                           "<|startoftext|>x<|endoftext|> y", ""};
    sd_tokenizer *tok = NULL, *tok_heap = NULL;
    sd_err err;
    size_t start = 0;

    if (!dir[0]) {
        fuzz_scratch_dir(dir, sizeof dir, "fuzz-tk");
        for (int i = 0; i < 4; i++)
            snprintf(paths[i], sizeof paths[i], "%s/%s", dir, file_names[i]);
        atexit(cleanup);
    }
    for (int i = 0; i < 4; i++) {
        unlink(paths[i]);
        if (start > size || (i >= 2 && start == size))
            continue; /* vocab.json and merges.txt always exist (maybe empty) */
        const uint8_t *end = start < size ? memchr(data + start, 0, size - start) : NULL;
        size_t stop = end ? (size_t)(end - data) : size;
        fuzz_put_file(paths[i], data + start, stop - start);
        start = stop + 1;
    }

    memset(&err, 0, sizeof err);
    if (sd_tokenizer_load_snapshot(dir, &tok, &err) != 0) {
        fuzz_require(tok == NULL && strstr(err.msg, dir) != NULL, "a refusal names the folder's file",
                     err.msg);
        return 0;
    }
    fuzz_require(sd_tokenizer_load_snapshot(dir, &tok_heap, &err) == 0, "the same files load twice", err.msg);
    sd_tokenizer_set_heap_threshold(tok_heap, 1);
    for (size_t c = 0; c < sizeof captions / sizeof captions[0]; c++)
        check_ids(tok, tok_heap, captions[c], strlen(captions[c]));
    check_ids(tok, tok_heap, (const char *)data, size < 512 ? size : 512);
    sd_tokenizer_free(tok);
    sd_tokenizer_free(tok_heap);
    return 0;
}
