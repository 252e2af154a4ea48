/* The framing every tokenized caption has (include/sdtrain/tokenizer.h), checked by the two
 * tokenizer harnesses: 77 ids, bos first, eos where the untruncated length n says, pad after it,
 * every id inside the vocabulary. (The content may hold bos / eos ids too: "<|endoftext|>" in a
 * caption is that token.) Include after fuzz_util.h. */
#ifndef SDTRAIN_FUZZ_TOKENIZER_CHECK_H
#define SDTRAIN_FUZZ_TOKENIZER_CHECK_H

#include "sdtrain/tokenizer.h"

static inline void fuzz_check_ids(const sd_tokenizer *tok, const int32_t ids[SD_TOKENIZER_LENGTH],
                                  int n)
{
    sd_tokenizer_info info;
    sd_tokenizer_get_info(tok, &info);
    fuzz_require(n >= 2, "bos and eos at least", NULL);
    fuzz_require(ids[0] == info.bos_id, "bos first", NULL);
    const int eos_at = n - 1 < SD_TOKENIZER_LENGTH - 1 ? n - 1 : SD_TOKENIZER_LENGTH - 1;
    fuzz_require(ids[eos_at] == info.eos_id, "eos where the length says", NULL);
    for (int i = eos_at + 1; i < SD_TOKENIZER_LENGTH; i++)
        fuzz_require(ids[i] == info.pad_id, "pad after eos", NULL);
    for (int i = 0; i < SD_TOKENIZER_LENGTH; i++)
        fuzz_require(ids[i] >= 0 && (size_t)ids[i] < info.vocab_size, "ids inside the vocabulary",
                     NULL);
}

#endif
