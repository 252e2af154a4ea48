/* Runs a libFuzzer harness (tests/fuzz/fuzz_*.c) without libFuzzer: each file named on the
 * command line, or each file inside a folder named there, is passed once to
 * LLVMFuzzerTestOneInput. `make check` uses it to replay the committed corpora and the inputs
 * that once crashed (tests/fuzz/replay.sh); a broken invariant aborts, as under the fuzzer.
 * Usage: replay_TARGET PATH...   Exit status: 0 all inputs ran, 2 an input could not be read. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f) {
        fprintf(stderr, "replay: %s: cannot open\n", path);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            uint8_t *nb;
            cap = cap ? 2 * cap : 65536;
            nb = realloc(buf, cap);
            if (!nb) {
                fprintf(stderr, "replay: %s: out of memory\n", path);
                free(buf);
                fclose(f);
                return -1;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    /* an exact-size copy, so that ASan sees reads past the input's end */
    {
        uint8_t *exact = malloc(n ? n : 1);
        if (!exact) {
            free(buf);
            return -1;
        }
        memcpy(exact, buf, n);
        free(buf);
        LLVMFuzzerTestOneInput(exact, n);
        free(exact);
    }
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
    long n_inputs = 0;
    int bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: not found\n", argv[i]);
            bad = 1;
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            struct dirent **list;
            int n = scandir(argv[i], &list, NULL, by_name);
            if (n < 0) {
                fprintf(stderr, "replay: %s: cannot list\n", argv[i]);
                bad = 1;
                continue;
            }
            for (int k = 0; k < n; k++) {
                char p[4096];
                struct stat fs;
                snprintf(p, sizeof p, "%s/%s", argv[i], list[k]->d_name);
                if (list[k]->d_name[0] != '.' && stat(p, &fs) == 0 && S_ISREG(fs.st_mode)) {
                    bad |= run_file(p) != 0;
                    n_inputs++;
                }
                free(list[k]);
            }
            free(list);
        } else {
            bad |= run_file(argv[i]) != 0;
            n_inputs++;
        }
    }
    printf("replay: %ld inputs\n", n_inputs);
    return bad ? 2 : 0;
}
