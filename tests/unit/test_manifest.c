/* The shard manifest's two readers (src/io/shards.c): the scanner of the writer's own layout and
 * the json-c reader. The scanner must accept what the writer prints (else every follow-mode
 * reread pays json-c's whole tree again) and read back exactly the entries written; for any text
 * at all, sd_shard_manifest_parse (scanner, then json-c) must give the json-c reader's verdict,
 * entries and message. Checked on the writer's text, on hand-made edits of it, and on 3000
 * random one- and two-byte edits of it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/shards.h"
#include "tap.h"

static const char *const PATH = "/nowhere/manifest.json";

/* n entries with the fields varied: index gaps, empty shards, ranges on some, large values. */
static void make_manifest(sd_shard_manifest *m, int64_t n, uint64_t seed)
{
    uint64_t x = seed;
    memset(m, 0, sizeof *m);
    m->n = n;
    m->entries = calloc((size_t)n + 1, sizeof *m->entries);
    int64_t index = 0;
    for (int64_t k = 0; k < n; k++) {
        sd_shard_entry *e = &m->entries[k];
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        index += 1 + (int64_t)(x >> 62); /* gaps of 0-3 */
        e->index = index;
        e->samples = k % 7 == 3 ? 0 : (int64_t)(x >> 40 & 4095);
        e->bytes = k == 1 ? INT64_MAX : (int64_t)(x >> 8);
        e->resolution = k % 2 ? 512 : 8;
        e->checksum = x ^ (x << 17);
        sd_shard_file_name(e->index, e->file, sizeof e->file);
        if (k % 3) {
            e->has_range = 1;
            e->range.first = (int64_t)(x >> 30);
            e->range.samples = e->samples + 2;
            e->range.key_hash = ~x;
        }
        m->total_samples += e->samples;
    }
}

static int same_entries(const sd_shard_manifest *a, const sd_shard_manifest *b)
{
    if (a->n != b->n || a->total_samples != b->total_samples)
        return 0;
    for (int64_t k = 0; k < a->n; k++) {
        const sd_shard_entry *x = &a->entries[k], *y = &b->entries[k];
        if (x->index != y->index || x->samples != y->samples || x->bytes != y->bytes ||
            x->checksum != y->checksum || x->resolution != y->resolution ||
            strcmp(x->file, y->file) != 0 || x->has_range != y->has_range ||
            (x->has_range && (x->range.first != y->range.first ||
                              x->range.samples != y->range.samples ||
                              x->range.key_hash != y->range.key_hash)))
            return 0;
    }
    return 1;
}

/* parse(text) against parse_json(text): the same verdict, entries and message. Returns 1 when
 * they agree; *scanned := whether the scanner alone accepted it. */
static int agree(const char *text, size_t len, int *scanned, char *why, size_t why_size)
{
    sd_shard_manifest a, b, c;
    sd_err ea, eb;
    why[0] = '\0';
    memset(&ea, 0, sizeof ea);
    memset(&eb, 0, sizeof eb);
    *scanned = sd_shard_manifest_scan(text, len, &c);
    const int ra = sd_shard_manifest_parse(PATH, text, len, &a, &ea);
    const int rb = sd_shard_manifest_parse_json(PATH, text, len, &b, &eb);
    int ok = ra == rb;
    if (!ok)
        snprintf(why, why_size, "verdicts %d (parse) and %d (json-c): %s / %s", ra, rb, ea.msg,
                 eb.msg);
    else if (ra != 0 && strcmp(ea.msg, eb.msg) != 0)
        ok = 0, snprintf(why, why_size, "messages differ: %s / %s", ea.msg, eb.msg);
    else if (ra == 0 && !same_entries(&a, &b))
        ok = 0, snprintf(why, why_size, "entries differ");
    else if (*scanned && (rb != 0 || !same_entries(&c, &b)))
        ok = 0, snprintf(why, why_size, "the scanner accepted what json-c reads otherwise (%s)",
                         eb.msg);
    else if (ra != 0 && (a.n != 0 || a.entries != NULL))
        ok = 0, snprintf(why, why_size, "a refusal left entries");
    if (*scanned)
        sd_shard_manifest_free(&c);
    sd_shard_manifest_free(&a);
    sd_shard_manifest_free(&b);
    return ok;
}

/* text with `from` (its first occurrence) replaced by `to` */
static char *edit(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (!at)
        return NULL;
    const size_t n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

int main(void)
{
    char why[4096];
    int scanned;

    /* the writer's text, read back exactly, by the scanner */
    for (int64_t n = 0; n <= 40; n += 20) {
        sd_shard_manifest m, r;
        sd_err err;
        size_t len;
        make_manifest(&m, n, (uint64_t)n + 1);
        char *text = sd_shard_manifest_text(&m, &len);
        tap_ok(strlen(text) == len, "%lld entries: the text is %zu bytes", (long long)n, len);
        tap_ok(sd_shard_manifest_scan(text, len, &r) == 1 && same_entries(&m, &r),
               "%lld entries: the scanner reads the writer's text back exactly", (long long)n);
        sd_shard_manifest_free(&r);
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_parse_json(PATH, text, len, &r, &err) == 0 && same_entries(&m, &r),
               "%lld entries: so does json-c %s", (long long)n, err.msg);
        sd_shard_manifest_free(&r);
        tap_ok(agree(text, len, &scanned, why, sizeof why) && scanned,
               "%lld entries: parse == json-c, by the scanner %s", (long long)n, why);
        free(text);
        free(m.entries);
    }

    /* hand-made edits: the scanner declines each, and parse says what json-c says */
    sd_shard_manifest m;
    size_t len;
    make_manifest(&m, 6, 7);
    char *text = sd_shard_manifest_text(&m, &len);
    char total[64], total1[64];
    snprintf(total, sizeof total, "\"total_samples\": %lld", (long long)m.total_samples);
    snprintf(total1, sizeof total1, "\"total_samples\": %lld", (long long)m.total_samples + 1);
    char file1[80];
    snprintf(file1, sizeof file1, "\"%s\"", m.entries[1].file);
    struct {
        const char *label, *from, *to;
        int json_ok; /* json-c accepts the edit */
    } edits[] = {
        {"compact spacing", "\"version\": 1", "\"version\":1", 1},
        {"keys in another order", "\"format\": \"sdtrain-shard-manifest\",\n  \"version\": 1",
         "\"version\": 1,\n  \"format\": \"sdtrain-shard-manifest\"", 1},
        {"a tab for spaces", "    {\n      \"index\"", "\t{\n      \"index\"", 1},
        {"total_samples off by one", total, total1, 0},
        {"a leading zero (json-c reads it as 512)", "\"resolution\": 512", "\"resolution\": 0512", 1},
        {"a negative count", "\"samples\": 0", "\"samples\": -1", 0},
        {"upper-case hex", "\"checksum\": \"", "\"checksum\": \"A", 0},
        {"a file name not the index's", file1, "\"../etc/passwd\"", 0},
        {"an escaped name", "\"file\": \"shard-", "\"file\": \"\\u0073hard-", 1},
        {"resolution past 4096", "\"resolution\": 512", "\"resolution\": 4097", 0},
        {"a format from elsewhere", "sdtrain-shard-manifest", "other-shards", 0},
        {"trailing data", "  ]\n}\n", "  ]\n}\n}", 0},
        {"truncated", "  ]\n}\n", "  ]\n", 0},
        {"another checksum algorithm", "sd-hash64-v1", "sd-hash64-v9", 1},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        char *t = edit(text, edits[i].from, edits[i].to);
        if (!tap_ok(t != NULL, "edit '%s' applies", edits[i].label))
            continue;
        sd_shard_manifest r;
        sd_err err;
        memset(&err, 0, sizeof err);
        const int rj = sd_shard_manifest_parse_json(PATH, t, strlen(t), &r, &err);
        if (rj == 0)
            sd_shard_manifest_free(&r);
        tap_ok((rj == 0) == edits[i].json_ok, "%s: json-c %s it (%s)", edits[i].label,
               edits[i].json_ok ? "reads" : "refuses", err.msg);
        tap_ok(agree(t, strlen(t), &scanned, why, sizeof why) && !scanned,
               "%s: the scanner declines, parse says what json-c says %s", edits[i].label, why);
        free(t);
    }
    /* entries out of order or repeated: json-c sorts, or refuses the repeat; never the scanner */
    {
        sd_shard_manifest sw = m;
        sd_shard_entry tmp[6];
        memcpy(tmp, m.entries, sizeof tmp);
        sw.entries = tmp;
        sd_shard_entry e = tmp[2];
        tmp[2] = tmp[3];
        tmp[3] = e;
        size_t l2;
        char *t = sd_shard_manifest_text(&sw, &l2);
        tap_ok(agree(t, l2, &scanned, why, sizeof why) && !scanned,
               "entries out of order: read by json-c, sorted %s", why);
        free(t);
        tmp[3] = tmp[2];
        t = sd_shard_manifest_text(&sw, &l2);
        tap_ok(agree(t, l2, &scanned, why, sizeof why) && !scanned,
               "an entry repeated: refused as json-c refuses it %s", why);
        free(t);
    }

    /* random edits of one or two bytes: parse always says what json-c says */
    {
        uint64_t x = 12345;
        int bad = 0, n_scanned = 0, n_ok = 0;
        const char alphabet[] = "0123456789abcdefABCDEF\"{}[],: \n-+.eE\\x";
        for (int i = 0; i < 3000 && bad < 5; i++) {
            char *t = malloc(len + 1);
            memcpy(t, text, len + 1);
            for (int j = 0; j < 1 + i % 2; j++) {
                x = x * 6364136223846793005ULL + 1442695040888963407ULL;
                t[(x >> 33) % len] = alphabet[(x >> 20) % (sizeof alphabet - 1)];
            }
            if (!agree(t, len, &scanned, why, sizeof why)) {
                bad++;
                tap_diag("edit %d disagrees: %s", i, why);
            }
            n_scanned += scanned;
            sd_shard_manifest r;
            sd_err err;
            if (sd_shard_manifest_parse(PATH, t, len, &r, &err) == 0) {
                n_ok++;
                sd_shard_manifest_free(&r);
            }
            free(t);
        }
        tap_ok(bad == 0, "3000 random edits: parse agrees with json-c on every one (%d read, %d "
               "of them by the scanner)", n_ok, n_scanned);
    }

    /* sd_shard_manifest_read: the file in a folder; none (nothing committed), empty, a folder
     * or a FIFO in its place refused with the file's name, without waiting on the FIFO */
    {
        char dir[] = "/tmp/sdtrain-test-manifest-XXXXXX", path[128];
        sd_shard_manifest r;
        sd_err err;
        alarm(20); /* a blocked open would otherwise hang the test */
        if (!tap_ok(mkdtemp(dir) != NULL, "read: a temporary folder"))
            return tap_done();
        snprintf(path, sizeof path, "%s/%s", dir, SD_SHARD_MANIFEST);
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_read(dir, &r, &err) == 0 && r.n == 0,
               "read: no manifest is no committed shard %s", err.msg);
        sd_shard_manifest_free(&r);
        FILE *f = fopen(path, "wb");
        tap_ok(f && fwrite(text, 1, len, f) == len && fclose(f) == 0, "read: manifest written");
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_read(dir, &r, &err) == 0 && same_entries(&m, &r),
               "read: the writer's text reads back %s", err.msg);
        sd_shard_manifest_free(&r);
        f = fopen(path, "wb");
        if (f)
            fclose(f);
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_read(dir, &r, &err) != 0 && strstr(err.msg, path) &&
                   strstr(err.msg, "the file is empty"), "read: empty: %s", err.msg);
        unlink(path);
        tap_ok(mkdir(path, 0700) == 0, "read: a folder in its place");
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_read(dir, &r, &err) != 0 && strstr(err.msg, path) &&
                   strstr(err.msg, "not a regular file"), "read: a folder: %s", err.msg);
        rmdir(path);
        tap_ok(mkfifo(path, 0600) == 0, "read: a FIFO in its place");
        memset(&err, 0, sizeof err);
        tap_ok(sd_shard_manifest_read(dir, &r, &err) != 0 && strstr(err.msg, path) &&
                   strstr(err.msg, "not a regular file"), "read: a FIFO, not waited on: %s",
               err.msg);
        unlink(path);
        rmdir(dir);
        alarm(0);
    }
    free(text);
    free(m.entries);
    return tap_done();
}
