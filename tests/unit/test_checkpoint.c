/* The checkpoint helpers that need no MPI: the checksum's algebra, directory names, the atomic
 * file replacement, the metrics rollback on resume and the configuration comparison. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/checkpoint.h"
#include "sdtrain/fsutil.h"
#include "tap.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = calloc(1, 1 << 16);
    if (f) {
        size_t n = fread(buf, 1, (1 << 16) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

int main(void)
{
    enum { N = 1000 };
    float x[N];
    char name[64], dir[] = "/tmp/sd_test_checkpoint_XXXXXX", path[256], *text;
    sd_err err;
    uint64_t whole, parts;

    for (int i = 0; i < N; i++)
        x[i] = (float)i * 0.25f - 7.0f;
    whole = sd_ckpt_checksum(x, 0, N);
    parts = sd_ckpt_checksum(x, 0, 333) + sd_ckpt_checksum(x + 333, 333, 1) +
            sd_ckpt_checksum(x + 334, 334, N - 334);
    tap_ok(whole == parts, "checksums of a partition add up to the whole's");
    tap_ok(sd_ckpt_checksum(x, 0, 0) == 0, "an empty range adds nothing");
    {
        uint32_t b;
        memcpy(&b, &x[500], 4);
        b ^= 1u;
        memcpy(&x[500], &b, 4);
        tap_ok(sd_ckpt_checksum(x, 0, N) != whole, "one flipped bit changes it");
        b ^= 1u;
        memcpy(&x[500], &b, 4);
    }
    {
        float t = x[10];
        x[10] = x[11];
        x[11] = t;
        tap_ok(sd_ckpt_checksum(x, 0, N) != whole, "two swapped elements change it");
        x[11] = x[10];
        x[10] = t;
    }
    tap_ok(sd_ckpt_checksum(x, 1, N) != whole, "the index is part of it");

    sd_ckpt_dir_name(12, name, sizeof name);
    tap_ok(!strcmp(name, "step-00000012"), "directory name zero-padded: %s", name);
    sd_ckpt_dir_name(123456789012LL, name, sizeof name);
    tap_ok(!strcmp(name, "step-123456789012"), "long step numbers grow: %s", name);

    if (!mkdtemp(dir)) {
        tap_skip_all("no temporary directory");
        return 0;
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    tap_ok(sd_write_file_atomic(path, "step-00000004\n", 14, &err) == 0, "atomic write");
    tap_ok(sd_write_file_atomic(path, "step-00000008\n", 14, &err) == 0, "atomic replace");
    text = slurp(path);
    tap_ok(!strcmp(text, "step-00000008\n"), "the new content is there");
    free(text);
    snprintf(path, sizeof path, "%s/latest.tmp", dir);
    tap_ok(access(path, F_OK) != 0, "no temporary file left");

    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    {
        const char *m = "{\"step\": 0, \"val_loss\": 1.5}\n{\"step\": 1, \"loss\": 1}\n"
                        "{\"step\": 2, \"loss\": 2}\n{\"step\": 2, \"val_loss\": 1.2}\n"
                        "{\"step\": 3, \"loss\": 3}\n{\"step\": 12, \"loss\": 4}\n";
        tap_ok(sd_write_file_atomic(path, m, strlen(m), &err) == 0, "metrics written");
    }
    tap_ok(sd_ckpt_metrics_rollback(path, 2, &err) == 0, "metrics rolled back to step 2");
    text = slurp(path);
    tap_ok(!strcmp(text, "{\"step\": 0, \"val_loss\": 1.5}\n{\"step\": 1, \"loss\": 1}\n"
                         "{\"step\": 2, \"loss\": 2}\n{\"step\": 2, \"val_loss\": 1.2}\n"),
           "lines after step 2 dropped, the others kept in order");
    free(text);
    /* A line that a full disk or a crash cut short has no newline: kept, it ran into the next
     * line the resumed run appends, and metrics.jsonl was no longer JSON Lines. */
    {
        const char *m[] = {"{\"step\": 1, \"loss\": 1}\n{\"st",
                           "{\"step\": 1, \"loss\": 1}\n{\"step\": 1",
                           "{\"step\": 1, \"loss\": 1}\n{\"step\": 1, \"loss\": 1}"};
        for (int i = 0; i < 3; i++) {
            sd_write_file_atomic(path, m[i], strlen(m[i]), &err);
            tap_ok(sd_ckpt_metrics_rollback(path, 2, &err) == 0, "metrics rolled back (%d)", i);
            text = slurp(path);
            tap_ok(!strcmp(text, "{\"step\": 1, \"loss\": 1}\n"),
                   "a last line without its newline is dropped (%d): '%s'", i, text);
            free(text);
        }
    }
    snprintf(path, sizeof path, "%s/none.jsonl", dir);
    tap_ok(sd_ckpt_metrics_rollback(path, 2, &err) == 0, "a missing metrics file is fine");

    {
        const char *a = "&run\n  seed = 11\n  output_dir = 'a'\n/\n&train\n  learning_rate = 0.001\n"
                        "  max_steps = 10\n/\n";
        const char *b = "&run\n  seed = 11\n  output_dir = 'b'\n/\n&train\n  learning_rate = 0.001\n"
                        "  max_steps = 20\n/\n";
        const char *c = "&run\n  seed = 12\n  output_dir = 'a'\n/\n&train\n  learning_rate = 0.001\n"
                        "  max_steps = 10\n/\n";
        tap_ok(sd_ckpt_check_config(a, b, &err) == 0, "output_dir and max_steps may change");
        tap_ok(sd_ckpt_check_config(a, c, &err) != 0 && strstr(err.msg, "seed = 11"),
               "another seed is refused");
    }
    snprintf(path, sizeof path, "%s/sub/deeper", dir);
    sd_mkdir_p(path, "directory", &err);
    tap_ok(sd_remove_tree(dir, &err) == 0 && access(dir, F_OK) != 0, "rm -r");
    tap_ok(sd_remove_tree(dir, &err) == 0, "rm -r of a missing path is fine");
    return tap_done();
}
