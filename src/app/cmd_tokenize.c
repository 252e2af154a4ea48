/* sdtool tokenize: the 77 CLIP token ids SD2 sees for each caption, one line per caption. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/tokenizer.h"

static void tokenize_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool tokenize [--snapshot DIR | --vocab FILE] [options] [CAPTION...]\n"
            "\n"
            "Prints, for each caption, the 77 token ids the SD2 text encoder sees, space separated on\n"
            "one line: <|startoftext|> 49406, at most 75 content ids, <|endoftext|> 49407, then pad\n"
            "id 0, exactly as transformers' CLIPTokenizer (no ftfy) with SD2's tokenizer files gives\n"
            "them (doc/tokenizer.md).\n"
            "\n"
            "vocabulary (the first of):\n"
            "  --snapshot DIR   a diffusers snapshot (DIR/tokenizer/vocab.json + merges.txt) or its\n"
            "                   tokenizer folder\n"
            "  --vocab FILE     OpenAI's bpe_simple_vocab_16e6.txt.gz (the merges; gzip or plain)\n"
            "  $%s   a snapshot, tokenizer folder or .gz file\n"
#ifdef SD_DEFAULT_TOKENIZER
            "  built-in         %s\n"
#endif
            "\n"
            "captions:\n"
            "  CAPTION...       each argument is one caption\n"
            "  --file F         one caption per line of F ('-' = standard input), after the arguments\n"
            "  --escaped        captions use \\\\ \\t \\n \\r and \\xHH escapes (for captions with newlines\n"
            "                   or arbitrary bytes; tests/data/tokenizer/golden.tsv uses them)\n"
            "\n"
            "output:\n"
            "  --count          start each line with the caption's length before truncation (bos and\n"
            "                   eos included) and a tab\n"
            "  --clean          print the reference's cleaned text instead of ids (debugging)\n"
            "\n"
            "Ill-formed UTF-8 is decoded as Python's errors='replace' does and then dropped, as the\n"
            "reference drops U+FFFD; a note on standard error says how many sequences were dropped.\n"
            "\n"
            "exit status: 0 done, 1 the vocabulary or a file cannot be read, 2 bad usage.\n",
            SD_TOKENIZER_ENV
#ifdef SD_DEFAULT_TOKENIZER
            ,
            SD_DEFAULT_TOKENIZER
#endif
    );
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Undoes the escapes in place; returns the new length, or -1 with the offending column. */
static long unescape(char *s, size_t n, size_t *bad_col)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            s[o++] = s[i];
            continue;
        }
        *bad_col = i + 1;
        if (i + 1 >= n)
            return -1;
        char c = s[++i];
        if (c == '\\')
            s[o++] = '\\';
        else if (c == 't')
            s[o++] = '\t';
        else if (c == 'n')
            s[o++] = '\n';
        else if (c == 'r')
            s[o++] = '\r';
        else if (c == 'x' && i + 2 < n && hex_value((unsigned char)s[i + 1]) >= 0 &&
                 hex_value((unsigned char)s[i + 2]) >= 0) {
            s[o++] = (char)(hex_value((unsigned char)s[i + 1]) * 16 + hex_value((unsigned char)s[i + 2]));
            i += 2;
        } else {
            return -1;
        }
    }
    return (long)o;
}

typedef struct tokenize_opts {
    bool escaped, count, clean;
} tokenize_opts;

/* Writes one caption's line; returns 0, or 2 for a bad escape. */
static int tokenize_one(const sd_tokenizer *tok, const tokenize_opts *o, char *text, size_t len,
                        const char *where, FILE *out)
{
    if (o->escaped) {
        size_t col = 0;
        long n = unescape(text, len, &col);
        if (n < 0) {
            fprintf(stderr, "sdtool tokenize: %s, column %zu: bad escape (use \\\\ \\t \\n \\r or \\xHH)\n", where,
                    col);
            return SD_EXIT_USAGE;
        }
        len = (size_t)n;
    }
    int bad;
    if (o->clean) {
        char *clean;
        size_t clean_len;
        bad = sd_tokenizer_clean_text(text, len, &clean, &clean_len);
        fwrite(clean, 1, clean_len, out);
        fputc('\n', out);
        free(clean);
    } else {
        int32_t ids[SD_TOKENIZER_LENGTH];
        int n_tokens = 0;
        char line[SD_TOKENIZER_LENGTH * 12 + 32];
        size_t p = 0;
        bad = sd_tokenize(tok, text, len, ids, o->count ? &n_tokens : NULL);
        if (o->count)
            p += (size_t)snprintf(line, sizeof line, "%d\t", n_tokens);
        for (int k = 0; k < SD_TOKENIZER_LENGTH; k++)
            p += (size_t)snprintf(line + p, sizeof line - p, k ? " %d" : "%d", (int)ids[k]);
        line[p++] = '\n';
        fwrite(line, 1, p, out);
    }
    if (bad)
        fprintf(stderr, "sdtool tokenize: %s: %d ill-formed UTF-8 sequence%s dropped\n", where, bad,
                bad == 1 ? "" : "s");
    return SD_EXIT_OK;
}

static int load_tokenizer(const char *snapshot, const char *vocab, sd_tokenizer **tok)
{
    sd_err err;
    int rc;
    const char *env = getenv(SD_TOKENIZER_ENV);
    if (snapshot)
        rc = sd_tokenizer_load_snapshot(snapshot, tok, &err);
    else if (vocab)
        rc = sd_tokenizer_load_bpe_gz(vocab, tok, &err);
    else if (env && *env)
        rc = sd_tokenizer_load(env, tok, &err);
    else {
#ifdef SD_DEFAULT_TOKENIZER
        rc = sd_tokenizer_load(SD_DEFAULT_TOKENIZER, tok, &err);
#else
        fprintf(stderr,
                "sdtool tokenize: no vocabulary: give --snapshot DIR or --vocab FILE.gz, or set %s "
                "(see sdtool tokenize --help)\n",
                SD_TOKENIZER_ENV);
        return SD_EXIT_USAGE;
#endif
    }
    if (rc != 0) {
        fprintf(stderr, "sdtool tokenize: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    return SD_EXIT_OK;
}

int sd_cmd_tokenize(int argc, char **argv)
{
    const char *snapshot = NULL, *vocab = NULL, *file = NULL;
    tokenize_opts o = {0};
    int first_caption = argc;
    bool dashdash = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            tokenize_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(a, "--snapshot") || !strcmp(a, "--vocab") || !strcmp(a, "--file")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sdtool tokenize: %s needs a value (see sdtool tokenize --help)\n", a);
                return SD_EXIT_USAGE;
            }
            const char **dst = a[2] == 's' ? &snapshot : a[2] == 'v' ? &vocab : &file;
            *dst = argv[++i];
        } else if (!strcmp(a, "--escaped")) {
            o.escaped = true;
        } else if (!strcmp(a, "--count")) {
            o.count = true;
        } else if (!strcmp(a, "--clean")) {
            o.clean = true;
        } else if (!strcmp(a, "--")) {
            first_caption = i + 1;
            dashdash = true;
            break;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "sdtool tokenize: unknown option '%s' (see sdtool tokenize --help)\n", a);
            return SD_EXIT_USAGE;
        } else {
            first_caption = i;
            break;
        }
    }
    if (snapshot && vocab) {
        fprintf(stderr, "sdtool tokenize: give --snapshot or --vocab, not both\n");
        return SD_EXIT_USAGE;
    }
    if (first_caption >= argc && !file) {
        fprintf(stderr, "sdtool tokenize: no caption (give CAPTION... or --file F; see sdtool tokenize --help)\n");
        return SD_EXIT_USAGE;
    }
    for (int i = first_caption; i < argc && !dashdash; i++) {
        if (argv[i][0] == '-' && argv[i][1] == '-' && argv[i][2]) {
            fprintf(stderr, "sdtool tokenize: options go before the captions ('%s'; use -- to pass a caption "
                            "that starts with --)\n", argv[i]);
            return SD_EXIT_USAGE;
        }
    }

    sd_tokenizer *tok = NULL;
    int rc = o.clean ? SD_EXIT_OK : load_tokenizer(snapshot, vocab, &tok);
    if (rc != SD_EXIT_OK)
        return rc;
    for (int i = first_caption; i < argc && rc == SD_EXIT_OK; i++) {
        char where[64];
        snprintf(where, sizeof where, "argument %d", i - first_caption + 1);
        rc = tokenize_one(tok, &o, argv[i], strlen(argv[i]), where, stdout);
    }
    if (file && rc == SD_EXIT_OK) {
        FILE *in = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!in) {
            fprintf(stderr, "sdtool tokenize: cannot open '%s': %s\n", file, strerror(errno));
            sd_tokenizer_free(tok);
            return SD_EXIT_FAILURE;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        long lineno = 0;
        while (rc == SD_EXIT_OK && (n = getline(&line, &cap, in)) >= 0) {
            char where[4200];
            lineno++;
            if (n > 0 && line[n - 1] == '\n')
                n--;
            snprintf(where, sizeof where, "%.4000s:%ld", strcmp(file, "-") ? file : "<stdin>", lineno);
            rc = tokenize_one(tok, &o, line, (size_t)n, where, stdout);
        }
        if (ferror(in)) {
            fprintf(stderr, "sdtool tokenize: error reading '%s': %s\n", file, strerror(errno));
            rc = SD_EXIT_FAILURE;
        }
        free(line);
        if (in != stdin)
            fclose(in);
    }
    sd_tokenizer_free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sdtool tokenize: cannot write the output: %s\n", strerror(errno));
        return SD_EXIT_FAILURE;
    }
    return rc;
}
