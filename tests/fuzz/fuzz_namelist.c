/* libFuzzer harness: the namelist reader and the run configuration from arbitrary bytes.
 *
 * Each input is tried four ways:
 *   1. as a namelist file: nl_parse, then the schema (sd_config_apply) and the cross-key checks
 *      (sd_config_validate). A refusal must come with a message that names the file, and a
 *      parse error with its line and column inside the text.
 *   2. a configuration the schema accepted is written back (sd_config_to_namelist, as used.nml
 *      and the broadcast to the other ranks do) and read again: the copy must be accepted and
 *      must write the same text. This checks the writer's quoting of strings and its number
 *      formatting against the reader.
 *   3. the first line, as one `--set group.key=value` argument on top of the defaults: accepted
 *      (then it set exactly one key) or refused with a message naming the command line;
 *   4. the first line as an SDTRAIN_FAULT specification: every parsed fault complete, or a message.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh namelist [SECONDS]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/config.h"
#include "sdtrain/fault.h"
#include "sdtrain/namelist.h"

#define FUZZ_NAME "fuzz_namelist"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SOURCE "fuzz.nml"

/* Lines in the text, for the position check of parse errors. */
static int count_lines(const uint8_t *data, size_t size)
{
    int n = 1;
    for (size_t i = 0; i < size; i++)
        n += data[i] == '\n';
    return n;
}

static void written_text_reads_back(const sd_run_config *rc)
{
    char *text = sd_config_to_namelist(rc, true);
    char *plain = sd_config_to_namelist(rc, false);
    sd_run_config copy;
    sd_err err;
    fuzz_require(text && plain, "the configuration is written", NULL);
    sd_run_config_init(&copy);
    memset(&err, 0, sizeof err);
    fuzz_require(sd_config_from_text(&copy, text, strlen(text), &err) == 0,
            "the written namelist reads back", err.msg);
    {
        char *again = sd_config_to_namelist(&copy, false);
        if (strcmp(again, plain) != 0) {
            fprintf(stderr, "--- written\n%s\n--- read back and written again\n%s\n", plain, again);
            fuzz_require(0, "the configuration survives writing and reading", NULL);
        }
        free(again);
    }
    sd_run_config_free(&copy);
    free(text);
    free(plain);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    nl_file f;
    sd_err err;
    sd_run_config rc;

    /* 1. as a namelist file */
    memset(&err, 0, sizeof err);
    if (nl_parse((const char *)data, size, SOURCE, &f, &err) != 0) {
        fuzz_require(strncmp(err.msg, SOURCE ":", strlen(SOURCE) + 1) == 0, "a parse error names the file",
                err.msg);
        fuzz_require(err.line >= 1 && err.line <= count_lines(data, size) && err.col >= 1,
                "a parse error has a line and column inside the text", err.msg);
        fuzz_require(f.n_groups == 0 && f.groups == NULL, "a failed parse leaves nothing behind", NULL);
    } else {
        for (size_t g = 0; g < f.n_groups; g++) {
            const nl_group *gr = &f.groups[g];
            fuzz_require(gr->name != NULL && gr->line >= 1 && gr->col >= 1, "group position", gr->name);
            for (size_t a = 0; a < gr->n_assigns; a++) {
                const nl_assign *as = &gr->assigns[a];
                fuzz_require(as->key != NULL && as->line >= 1 && as->index >= 0, "assignment", as->key);
                for (size_t v = 0; v < as->n_values; v++)
                    fuzz_require(as->values[v].kind != NL_STRING || as->values[v].s != NULL,
                            "a string value has its text", as->key);
            }
        }
        sd_run_config_init(&rc);
        snprintf(rc.source, sizeof rc.source, "%s", SOURCE);
        memset(&err, 0, sizeof err);
        if (sd_config_apply(&rc, &f, &err) != 0) {
            fuzz_require(strstr(err.msg, SOURCE) != NULL, "a schema error names the file", err.msg);
        } else {
            /* 2. written back and read again, whether or not the cross-key checks pass */
            memset(&err, 0, sizeof err);
            if (sd_config_validate(&rc, &err) != 0)
                fuzz_require(err.msg[0] != 0, "a refused configuration says why", NULL);
            written_text_reads_back(&rc);
        }
        sd_run_config_free(&rc);
        nl_free(&f);
    }

    /* 3. the first line as a --set argument */
    {
        size_t n = 0;
        char *arg;
        while (n < size && data[n] != '\n' && n < 4096)
            n++;
        arg = malloc(n + 1);
        fuzz_require(arg != NULL, "memory", NULL);
        memcpy(arg, data, n);
        arg[n] = 0;
        sd_run_config_init(&rc);
        memset(&err, 0, sizeof err);
        if (sd_config_apply_set(&rc, arg, 1, &err) != 0)
            fuzz_require(strncmp(err.msg, "command line", 12) == 0 || strstr(err.msg, "--set") != NULL,
                    "a refused --set names the command line", err.msg);
        else {
            /* one argument sets one key: a value must not end its group and start another */
            size_t n_opts, n_set = 0;
            sd_config_options(&n_opts);
            for (size_t i = 0; i < n_opts; i++)
                n_set += rc.origin[i].kind == SD_ORIGIN_SET;
            fuzz_require(n_set == 1, "an accepted --set sets exactly one key", arg);
            written_text_reads_back(&rc);
        }
        sd_run_config_free(&rc);

        /* 4. the same line as an SDTRAIN_FAULT specification (tests set it; a typo must be
         * refused, never half-applied) */
        {
            sd_fault faults[SD_FAULT_MAX];
            int n_faults = -1;
            memset(&err, 0, sizeof err);
            if (sd_fault_parse(arg, faults, &n_faults, &err) == 0) {
                fuzz_require(n_faults >= 0 && n_faults <= SD_FAULT_MAX, "fault count", arg);
                for (int i = 0; i < n_faults; i++)
                    fuzz_require(faults[i].rank >= 0 && faults[i].action <= SD_FAULT_USR1 &&
                                (faults[i].step >= 0 || faults[i].phase[0]) &&
                                memchr(faults[i].phase, 0, sizeof faults[i].phase),
                            "a parsed fault is complete", arg);
            } else {
                fuzz_require(err.msg[0] != 0, "a refused fault specification says why", arg);
            }
        }
        free(arg);
    }
    return 0;
}
