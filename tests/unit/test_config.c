/* Schema-level tests: defaults, every error message of tests/config/invalid, --set, printing
 * and re-reading the effective configuration, and the reference document. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/config.h"
#include "sdtrain/diffusion.h"
#include "tap.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n;
    char *buf;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads a namelist file the way sdtrain does, with the file's base name as the source. */
static int load_named(const char *dir, const char *name, int n_set, char *const *sets,
                      sd_run_config *rc, sd_err *err)
{
    char path[2048], cwd[2048];
    int r;
    snprintf(path, sizeof path, "%s", dir);
    if (!getcwd(cwd, sizeof cwd) || chdir(path) != 0)
        return sd_err_set(err, "cannot enter %s", dir);
    r = sd_config_load(rc, name, n_set, sets, err);
    if (r == 0) /* as sdtrain does before it starts a job */
        r = sd_config_check_mode_inputs(rc, err);
    if (chdir(cwd) != 0)
        return sd_err_set(err, "cannot return to %s", cwd);
    return r;
}

static void test_invalid_corpus(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char *names[256];
    int n = 0;
    if (!tap_ok(d != NULL, "open %s", dir))
        return;
    while ((e = readdir(d)) && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 4 && !strcmp(e->d_name + l - 4, ".nml"))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_names);
    tap_ok(n >= 25, "at least 25 schema error cases (%d)", n);
    for (int i = 0; i < n; i++) {
        char errpath[2048], *want, *nl;
        sd_run_config rc;
        sd_err err;
        int r;
        snprintf(errpath, sizeof errpath, "%s/%.*s.err", dir, (int)strlen(names[i]) - 4, names[i]);
        want = slurp(errpath);
        if (!want) {
            tap_ok(0, "%s: missing expected message %s", names[i], errpath);
            continue;
        }
        if ((nl = strchr(want, '\n')))
            *nl = '\0';
        sd_run_config_init(&rc);
        sd_err_clear(&err);
        r = load_named(dir, names[i], 0, NULL, &rc, &err);
        if (!tap_ok(r != 0 && strcmp(err.msg, want) == 0, "error message of %s", names[i])) {
            tap_diag("want: %s", want);
            tap_diag("got:  %s", r ? err.msg : "(no error)");
        }
        sd_run_config_free(&rc);
        free(want);
        free(names[i]);
    }
}

static void test_defaults(void)
{
    sd_run_config rc;
    size_t n;
    const sd_option *all = sd_config_options(&n);
    int choices_ok = 1, help_ok = 1;
    sd_run_config_init(&rc);
    tap_ok(rc.cfg.train.learning_rate == 1e-4, "default learning_rate 1e-4");
    tap_ok(rc.cfg.model.n_block_out_channels == 4 && rc.cfg.model.block_out_channels[3] == 1280,
           "default block_out_channels 320,640,1280,1280");
    tap_ok(!strcmp(rc.cfg.run.device, "auto"), "default device 'auto'");
    tap_ok(rc.cfg.run.mode[0] == '\0', "mode has no default (required)");
    tap_ok(rc.cfg.sample.n_prompts == 0, "no default prompts");
    for (size_t i = 0; i < n; i++) {
        help_ok &= all[i].help && strlen(all[i].help) > 10;
        choices_ok &= all[i].type != SD_OPT_CHOICE || (all[i].choices && all[i].choices[0]);
    }
    tap_ok(help_ok, "every key has help text");
    tap_ok(choices_ok, "every choice key lists its choices");
    tap_ok(sd_config_find("TRAIN", "Learning_Rate") != NULL, "lookup is case-insensitive");
    tap_ok(sd_config_find("train", "seed") == NULL, "lookup respects the group");
    sd_run_config_free(&rc);
}

static void test_set(void)
{
    sd_run_config rc;
    sd_err err;
    sd_run_config_init(&rc);
    tap_ok(sd_config_apply_set(&rc, "run.mode=train", 1, &err) == 0 && !strcmp(rc.cfg.run.mode, "train"),
           "--set of a choice without quotes");
    tap_ok(sd_config_apply_set(&rc, "run.output_dir=/tmp/it's here", 2, &err) == 0 &&
               !strcmp(rc.cfg.run.output_dir, "/tmp/it's here"),
           "--set of a string with a quote, no quoting needed");
    tap_ok(sd_config_apply_set(&rc, "run.output_dir='quoted'", 3, &err) == 0 &&
               !strcmp(rc.cfg.run.output_dir, "quoted"),
           "--set of an already quoted string");
    tap_ok(sd_config_apply_set(&rc, "train.learning_rate=3.0d-5", 4, &err) == 0 &&
               rc.cfg.train.learning_rate == 3e-5,
           "--set of a real in Fortran d-notation");
    tap_ok(rc.origin[sd_config_find("train", "learning_rate") - sd_config_options(&(size_t){0})].kind ==
               SD_ORIGIN_SET, "--set origin recorded");
    tap_ok(sd_config_apply_set(&rc, "train.learning_rate=1e-3", 5, &err) == 0 &&
               rc.cfg.train.learning_rate == 1e-3, "a later --set overrides an earlier one");
    tap_ok(sd_config_apply_set(&rc, "model.block_out_channels(2)=96", 6, &err) == 0 &&
               rc.cfg.model.block_out_channels[1] == 96 && rc.cfg.model.n_block_out_channels == 4,
           "--set of one list element");
    tap_ok(sd_config_apply_set(&rc, "sample.prompts='a', 'b'", 7, &err) == 0 && rc.cfg.sample.n_prompts == 2,
           "--set of a string list");
    tap_ok(sd_config_apply_set(&rc, "sample.prompts=a cat, on a mat", 7, &err) == 0 &&
               rc.cfg.sample.n_prompts == 1 && !strcmp(rc.cfg.sample.prompts[0], "a cat, on a mat"),
           "--set of a string list without quotes: one string, commas and all (%d: '%s')",
           rc.cfg.sample.n_prompts, rc.cfg.sample.prompts[0]);
    tap_ok(sd_config_apply_set(&rc, " run.output_dir = out2 ", 7, &err) == 0 &&
               !strcmp(rc.cfg.run.output_dir, "out2"),
           "--set with blanks around the key, the '=' and the value: they are not the value's "
           "('%s')", rc.cfg.run.output_dir);
    tap_ok(sd_config_apply_set(&rc, "run.mode = sample", 7, &err) == 0 &&
               !strcmp(rc.cfg.run.mode, "sample"), "--set of a choice with blanks around '='");
    tap_ok(sd_config_apply_set(&rc, "run.output_dir=' spaced '", 7, &err) == 0 &&
               !strcmp(rc.cfg.run.output_dir, " spaced "), "--set keeps the blanks inside quotes");
    tap_ok(sd_config_apply_set(&rc, "train.max_steps", 8, &err) != 0 &&
               strstr(err.msg, "expected group.key=value") != NULL, "--set without '=' refused");
    tap_ok(sd_config_apply_set(&rc, "max_steps=3", 9, &err) != 0 &&
               strstr(err.msg, "expected group.key=value") != NULL, "--set without a group refused");
    tap_ok(sd_config_apply_set(&rc, "train.max_steps=abc", 10, &err) != 0 &&
               strncmp(err.msg, "command line: --set 'train.max_steps=abc': ", 43) == 0,
           "--set of a bare word for an integer refused (%s)", err.msg);
    tap_ok(sd_config_apply_set(&rc, "trian.max_steps=3", 11, &err) != 0 &&
               strstr(err.msg, "--set 'trian.max_steps=3': unknown group '&trian' (did you mean '&train'?)"),
           "--set with a misspelled group: %s", err.msg);
    tap_ok(sd_config_apply_set(&rc, "run.mode=bogus", 12, &err) != 0 &&
               strstr(err.msg, "invalid value 'bogus' for &run mode"), "--set of an invalid choice");
    /* found by tests/fuzz/fuzz_namelist.c: a '!' in the key made the rest a comment, and a value
     * could close the group and open another; both were accepted */
    tap_ok(sd_config_apply_set(&rc, "train.!max_steps=3", 13, &err) != 0 &&
               strstr(err.msg, "--set 'train.!max_steps=3': expected one group.key=value (it reads as 0 "
                               "assignments in 1 groups)"),
           "--set whose key is a comment refused: %s", err.msg);
    tap_ok(sd_config_apply_set(&rc, "train.max_steps=3 / &run seed=9", 14, &err) != 0 &&
               strstr(err.msg, "expected one group.key=value") && rc.cfg.run.seed != 9,
           "--set whose value opens another group refused: %s", err.msg);
    tap_ok(sd_config_apply_set(&rc, "train.max_steps=3, warmup_steps=2", 15, &err) != 0 &&
               strstr(err.msg, "expected one group.key=value (it reads as 2 assignments in 1 groups)"),
           "--set of two keys refused: %s", err.msg);
    sd_run_config_free(&rc);
}

/* Found by tests/fuzz/fuzz_namelist.c: the defaults wrote "mode = ''", which does not read back
 * ('' is not a mode); an unset choice is now written as a comment. */
static void test_unset_choice_round_trip(void)
{
    sd_run_config a, b;
    sd_err err;
    char *ta, *tb;
    sd_run_config_init(&a);
    sd_run_config_init(&b);
    ta = sd_config_to_namelist(&a, false);
    tap_ok(strstr(ta, "! mode = (unset)") != NULL, "an unset &run mode is written as a comment");
    tap_ok(sd_config_from_text(&b, ta, strlen(ta), &err) == 0, "the defaults read back: %s",
           err.msg);
    tb = sd_config_to_namelist(&b, false);
    tap_ok(strcmp(ta, tb) == 0 && b.cfg.run.mode[0] == 0, "and stay the defaults");
    free(ta);
    free(tb);
    sd_run_config_free(&a);
    sd_run_config_free(&b);
}

static void test_round_trip(void)
{
    sd_run_config a, b;
    sd_err err;
    char *ta, *tb;
    sd_run_config_init(&a);
    sd_run_config_init(&b);
    sd_config_apply_set(&a, "run.mode=train", 1, &err);
    sd_config_apply_set(&a, "sample.prompts='it''s \"fine\"', '! not a comment', 'x/y'", 2, &err);
    sd_config_apply_set(&a, "train.learning_rate=0.1", 3, &err);
    sd_config_apply_set(&a, "diffusion.beta_start=0.000850000000001", 4, &err);
    sd_config_apply_set(&a, "data.exif_transpose=T", 5, &err);
    sd_config_apply_set(&a, "run.seed=4294967295", 6, &err);
    ta = sd_config_to_namelist(&a, true);
    tap_ok(sd_config_from_text(&b, ta, strlen(ta), &err) == 0, "printed configuration re-parses (%s)",
           err.msg);
    tap_ok(memcmp(&a.cfg, &b.cfg, sizeof a.cfg) == 0, "re-parsed configuration is identical");
    tb = sd_config_to_namelist(&b, false);
    tap_ok(strstr(tb, "beta_start = 0.000850000000001") != NULL, "reals print shortest round-trip");
    tap_ok(strstr(tb, "learning_rate = 0.1\n") != NULL, "0.1 prints as 0.1");
    tap_ok(strstr(tb, "weight_decay = 0.01\n") != NULL, "defaults print");
    tap_ok(strstr(tb, "grad_clip = 1.0\n") != NULL, "integral reals keep a decimal point");
    tap_ok(strstr(ta, "! --set #3") != NULL && strstr(ta, "! default") != NULL, "annotations say where values came from");
    free(ta);
    free(tb);
    sd_run_config_free(&a);
    sd_run_config_free(&b);
}

/* The annotations of used.nml quote the input's path: a line break in it (a legal file name)
 * ended the comment and the rest of the path became namelist text, so used.nml did not read
 * back. */
static void test_annotation_with_line_break(void)
{
    sd_run_config a, b;
    sd_err err;
    char *ta;
    static const char text[] = "&run\n  mode = 'train'\n  seed = 7\n/\n";
    sd_run_config_init(&a);
    sd_run_config_init(&b);
    snprintf(a.source, sizeof a.source, "%s", "runs/x\n&bogus y=1 /\r\n/in.nml");
    tap_ok(sd_config_from_text(&a, text, strlen(text), &err) == 0, "a file's values apply (%s)",
           err.msg);
    ta = sd_config_to_namelist(&a, true);
    tap_ok(sd_config_from_text(&b, ta, strlen(ta), &err) == 0,
           "annotations naming a path with line breaks re-parse (%s)", err.msg);
    tap_ok(memcmp(&a.cfg, &b.cfg, sizeof a.cfg) == 0 && b.cfg.run.seed == 7,
           "and give the same configuration");
    free(ta);
    sd_run_config_free(&a);
    sd_run_config_free(&b);
}

/* &diffusion's beta ends: equal ends are constant betas (diffusers takes them), the cosine
 * schedule uses neither, a decreasing or zero linear schedule is refused (and what passes here
 * must pass sd_diffusion_init, which a run calls later) */
static void test_beta_ends(void)
{
    static const struct {
        const char *text;
        int ok;
    } cases[] = {
        {"&diffusion beta_start = 0.001, beta_end = 0.001 /\n", 1},
        {"&diffusion beta_schedule = 'linear', beta_start = 0.0001, beta_end = 0.02 /\n", 1},
        {"&diffusion beta_schedule = 'squaredcos_cap_v2', beta_start = 0.5, beta_end = 0.1 /\n", 1},
        {"&diffusion beta_start = 0.02, beta_end = 0.01 /\n", 0},
        {"&diffusion beta_schedule = 'linear', beta_start = 0, beta_end = 0 /\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sd_run_config rc;
        sd_err err = {0};
        char text[256];
        snprintf(text, sizeof text, "&run mode = 'train' /\n%s", cases[i].text);
        sd_run_config_init(&rc);
        int rc_ = sd_config_from_text(&rc, text, strlen(text), &err);
        if (rc_ == 0)
            rc_ = sd_config_validate(&rc, &err);
        if (rc_ == 0) {
            sd_diffusion d;
            rc_ = sd_diffusion_init_config(&d, &rc.cfg, &err);
            if (rc_ == 0)
                sd_diffusion_free(&d);
        }
        tap_ok(cases[i].ok ? rc_ == 0 : rc_ != 0 && strstr(err.msg, "beta_end") != NULL,
               "%.*s %s: %s", (int)strlen(cases[i].text) - 1, cases[i].text,
               cases[i].ok ? "is valid" : "is refused", rc_ ? err.msg : "(valid)");
        sd_run_config_free(&rc);
    }
}

/* &run io_hints: pairs, blanks, values with commas, and each refusal */
static void test_io_hints(void)
{
    static const struct {
        const char *text;
        int n;            /* pairs, or -1 when refused */
        const char *last; /* the last pair as "key=value", or the reason */
    } cases[] = {
        {"", 0, ""},
        {"  ", 0, ""},
        {"a=1", 1, "a=1"},
        {" striping_factor = 16 ,striping_unit=4194304 ", 2, "striping_unit=4194304"},
        {"cb_config_list=node1:1, node2:1,cb_nodes=2", 2, "cb_nodes=2"},
        {"cb_config_list=node1:1, node2:1", 1, "cb_config_list=node1:1,node2:1"},
        {"a=b=c", 1, "a=b=c"},
        {"a=1,", -1, "an empty entry"},
        {",a=1", -1, "an empty entry"},
        {"a=1,,b=2", -1, "an empty entry"},
        {"=1", -1, "empty key"},
        {"a= ", -1, "empty value"},
        {"a=1,a=2", -1, "given twice"},
        {"a b=1", -1, "holds a blank"},
        {"novalue", -1, "is not key=value"},
        {"a=1\tb", 1, "a=1\tb"},
        {"a=1\nb=2", -1, "control character"},
    };
    sd_io_hint *h = malloc(SD_IO_HINTS_MAX * sizeof *h);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sd_err err = {0};
        int n = -2, ok;
        const int rc_ = sd_io_hints_parse(cases[i].text, h, SD_IO_HINTS_MAX, &n, &err);
        if (cases[i].n < 0) {
            ok = rc_ != 0 && strstr(err.msg, cases[i].last) != NULL;
        } else {
            char last[2100] = "";
            if (rc_ == 0 && n > 0)
                snprintf(last, sizeof last, "%s=%s", h[n - 1].key, h[n - 1].value);
            ok = rc_ == 0 && n == cases[i].n && !strcmp(last, cases[i].last);
        }
        tap_ok(ok, "io_hints '%s': %s", cases[i].text, rc_ ? err.msg : "parsed");
    }
    /* MPI's limits (Open MPI's, the smallest: MPI_Info_set refuses a key of 36 bytes or a value
     * of 256, which once passed here and ended the job at its first file): a key of 35 bytes and
     * a value of 255 pass, one more byte does not; at most SD_IO_HINTS_MAX pairs */
    {
        enum { K = SD_IO_HINT_KEY_MAX, V = SD_IO_HINT_VALUE_MAX };
        char text[4096], want[64];
        sd_err err = {0};
        int n;
        memset(text, 'k', K);
        text[K] = '=';
        memset(text + K + 1, 'v', V);
        text[K + 1 + V] = '\0';
        tap_ok(K == 35 && V == 255 && sd_io_hints_parse(text, h, SD_IO_HINTS_MAX, &n, &err) == 0 &&
                   n == 1 && strlen(h[0].key) == K && strlen(h[0].value) == V,
               "io_hints: a key of %d and a value of %d bytes pass", K, V);
        memmove(text + 1, text, K + V + 2);
        snprintf(want, sizeof want, "longer than MPI's %d", K);
        tap_ok(sd_io_hints_parse(text, h, SD_IO_HINTS_MAX, &n, &err) != 0 && strstr(err.msg, want) != NULL,
               "io_hints: a key of %d bytes is refused: %s", K + 1, err.msg);
        memmove(text, text + 1, K + V + 2);
        strcat(text, "v");
        snprintf(want, sizeof want, "longer than MPI's %d", V);
        tap_ok(sd_io_hints_parse(text, h, SD_IO_HINTS_MAX, &n, &err) != 0 && strstr(err.msg, want) != NULL,
               "io_hints: a value of %d bytes is refused: %s", V + 1, err.msg);
        /* a value with commas (cb_config_list of many hosts) counts whole */
        strcpy(text, "cb_config_list=h00:1");
        for (int i = 1; i < 45; i++)
            snprintf(text + strlen(text), sizeof text - strlen(text), ", h%02d:1", i);
        tap_ok(sd_io_hints_parse(text, h, SD_IO_HINTS_MAX, &n, &err) != 0 && strstr(err.msg, want) != NULL,
               "io_hints: a cb_config_list of 44 hosts is refused: %s", err.msg);
        text[0] = '\0';
        for (int i = 0; i <= SD_IO_HINTS_MAX; i++)
            snprintf(text + strlen(text), sizeof text - strlen(text), "%sk%d=1", i ? "," : "", i);
        tap_ok(sd_io_hints_parse(text, h, SD_IO_HINTS_MAX, &n, &err) != 0 &&
                   strstr(err.msg, "more than") != NULL,
               "io_hints: %d pairs are refused: %s", SD_IO_HINTS_MAX + 1, err.msg);
    }
    free(h);
}

static void test_reference_doc(void)
{
    char *md = sd_config_reference_markdown();
    size_t n;
    const sd_option *all = sd_config_options(&n);
    int all_listed = 1;
    for (size_t i = 0; i < n; i++) {
        char row[128];
        snprintf(row, sizeof row, "| `%s` |", all[i].key);
        all_listed &= strstr(md, row) != NULL;
    }
    tap_ok(all_listed, "reference lists every key");
    tap_ok(strstr(md, "## &train") != NULL && strstr(md, "## &checkpoint") != NULL, "reference has every group");
    free(md);
}

int main(int argc, char **argv)
{
    const char *srcdir = getenv("srcdir");
    char dir[2048];
    if (argc > 1)
        snprintf(dir, sizeof dir, "%s", argv[1]);
    else
        snprintf(dir, sizeof dir, "%s/tests/config/invalid", srcdir ? srcdir : ".");
    test_defaults();
    test_set();
    test_round_trip();
    test_unset_choice_round_trip();
    test_annotation_with_line_break();
    test_beta_ends();
    test_io_hints();
    test_reference_doc();
    test_invalid_corpus(dir);
    return tap_done();
}
