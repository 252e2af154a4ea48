/* SDTRAIN_FAULT parsing and lookup; the injection points call sd_fault_armed(). */
#include "sdtrain/fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *const sd_fault_phases[] = {"step", "ckpt-write", "ckpt-commit", "shard-write",
                                       "shard-commit", "encode", "ckpt-load", "unet-load",
                                       "shard-wait", NULL};

static sd_fault armed[SD_FAULT_MAX];
static int n_armed = 0;

static int parse_int(const char *s, size_t len, int64_t *out)
{
    char buf[32], *end;
    if (len == 0 || len >= sizeof buf)
        return -1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    *out = strtoll(buf, &end, 10);
    return (*end || *out < 0) ? -1 : 0;
}

static int parse_one(const char *s, size_t len, sd_fault *f, sd_err *err)
{
    const char *end = s + len, *p = s;
    const char *colon = memchr(p, ':', len);
    size_t alen = colon ? (size_t)(colon - p) : len;
    int have_rank = 0;
    memset(f, 0, sizeof *f);
    f->step = -1;
    if (alen == 4 && !strncmp(p, "kill", 4))
        f->action = SD_FAULT_KILL;
    else if (alen == 3 && !strncmp(p, "nan", 3))
        f->action = SD_FAULT_NAN;
    else if (alen == 4 && !strncmp(p, "usr1", 4))
        f->action = SD_FAULT_USR1;
    else if (alen == 4 && !strncmp(p, "flip", 4))
        f->action = SD_FAULT_FLIP;
    else if (alen == 3 && !strncmp(p, "eio", 3))
        f->action = SD_FAULT_EIO;
    else if (alen == 4 && !strncmp(p, "hang", 4))
        f->action = SD_FAULT_HANG;
    else
        return sd_err_set(err, "SDTRAIN_FAULT: unknown action '%.*s' in '%.*s' (expected kill, nan, usr1, flip, eio or hang)",
                          (int)alen, p, (int)len, s);
    p += alen;
    while (p < end) {
        const char *item = p + 1, *next = memchr(item, ':', (size_t)(end - item));
        const char *iend = next ? next : end;
        const char *eq = memchr(item, '=', (size_t)(iend - item));
        int64_t v;
        size_t klen;
        if (!eq)
            return sd_err_set(err, "SDTRAIN_FAULT: expected key=value, got '%.*s' in '%.*s'",
                              (int)(iend - item), item, (int)len, s);
        klen = (size_t)(eq - item);
        if (klen == 4 && !strncmp(item, "rank", 4)) {
            if (parse_int(eq + 1, (size_t)(iend - eq - 1), &v) || v > 0x7fffffff)
                return sd_err_set(err, "SDTRAIN_FAULT: rank must be a non-negative integer in '%.*s'",
                                  (int)len, s);
            f->rank = (int)v;
            have_rank = 1;
        } else if (klen == 4 && !strncmp(item, "step", 4)) {
            if (parse_int(eq + 1, (size_t)(iend - eq - 1), &v))
                return sd_err_set(err, "SDTRAIN_FAULT: step must be a non-negative integer in '%.*s'",
                                  (int)len, s);
            f->step = v;
        } else if (klen == 5 && !strncmp(item, "phase", 5)) {
            size_t vlen = (size_t)(iend - eq - 1);
            int ok = 0;
            for (int i = 0; sd_fault_phases[i]; i++)
                ok |= strlen(sd_fault_phases[i]) == vlen && !strncmp(sd_fault_phases[i], eq + 1, vlen);
            if (!ok)
                return sd_err_set(err, "SDTRAIN_FAULT: unknown phase '%.*s' (known: step, ckpt-write, "
                                       "ckpt-commit, shard-write, shard-commit, encode, ckpt-load, "
                                       "unet-load, shard-wait)", (int)vlen, eq + 1);
            memcpy(f->phase, eq + 1, vlen);
            f->phase[vlen] = '\0';
        } else {
            return sd_err_set(err, "SDTRAIN_FAULT: unknown key '%.*s' in '%.*s' (expected rank, step, phase)",
                              (int)klen, item, (int)len, s);
        }
        p = iend;
    }
    if (!have_rank)
        return sd_err_set(err, "SDTRAIN_FAULT: '%.*s' needs rank=N", (int)len, s);
    if (f->step < 0 && !f->phase[0])
        return sd_err_set(err, "SDTRAIN_FAULT: '%.*s' needs step=N or phase=NAME", (int)len, s);
    if (f->action == SD_FAULT_FLIP) {
        if (strcmp(f->phase, "ckpt-write") != 0 && strcmp(f->phase, "unet-load") != 0)
            return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': flip faults need phase=ckpt-write or "
                              "unet-load", (int)len, s);
        return 0;
    }
    if (f->action == SD_FAULT_EIO) {
        if (strcmp(f->phase, "ckpt-load") != 0)
            return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': eio faults need phase=ckpt-load",
                              (int)len, s);
        return 0;
    }
    if (f->action == SD_FAULT_HANG) {
        if (f->phase[0] && strcmp(f->phase, "step") != 0 && strcmp(f->phase, "ckpt-write") != 0 &&
            strcmp(f->phase, "shard-write") != 0)
            return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': hang faults take step=N, or phase=step, "
                              "ckpt-write or shard-write", (int)len, s);
        if (!strcmp(f->phase, "step") && f->step < 0)
            return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': hang faults at phase step need step=N",
                              (int)len, s);
        return 0;
    }
    if (f->action == SD_FAULT_USR1 && !strcmp(f->phase, "shard-wait"))
        return 0; /* a pipeline's trainers waiting for a shard: at step S's wait, or at any */
    if (f->action == SD_FAULT_USR1 && !strcmp(f->phase, "encode")) {
        if (f->step < 0)
            return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': usr1 faults at phase encode need step=N "
                              "(the global sample)", (int)len, s);
        return 0; /* preprocessing: once global sample S is read, in the middle of its shard */
    }
    if (f->action != SD_FAULT_KILL && f->step < 0)
        return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': %s faults need step=N", (int)len, s,
                          f->action == SD_FAULT_NAN ? "nan" : "usr1");
    if (f->action == SD_FAULT_NAN && f->phase[0] && strcmp(f->phase, "encode") != 0)
        return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': nan faults take no phase but 'encode'",
                          (int)len, s);
    if (f->action != SD_FAULT_KILL && f->action != SD_FAULT_NAN && f->phase[0])
        return sd_err_set(err, "SDTRAIN_FAULT: '%.*s': only kill and nan faults take a phase "
                          "(and usr1 the phases shard-wait and encode)", (int)len, s);
    return 0;
}

int sd_fault_parse(const char *spec, sd_fault *faults, int *n, sd_err *err)
{
    const char *p = spec;
    *n = 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (*n == SD_FAULT_MAX)
            return sd_err_set(err, "SDTRAIN_FAULT: more than %d faults", SD_FAULT_MAX);
        if (len == 0)
            return sd_err_set(err, "SDTRAIN_FAULT: empty fault in '%s'", spec);
        if (parse_one(p, len, &faults[*n], err))
            return -1;
        (*n)++;
        p += len + (comma ? 1 : 0);
    }
    return 0;
}

int sd_fault_init_from_env(sd_err *err)
{
    const char *spec = getenv("SDTRAIN_FAULT");
    n_armed = 0;
    if (!spec || !*spec)
        return 0;
    return sd_fault_parse(spec, armed, &n_armed, err);
}

static int armed_for(sd_fault_action action, int rank, int64_t step, const char *phase)
{
    for (int i = 0; i < n_armed; i++) {
        const sd_fault *f = &armed[i];
        if (f->action != action || (rank >= 0 && f->rank != rank))
            continue;
        if (f->phase[0] ? (phase && !strcmp(phase, f->phase) && (f->step < 0 || f->step == step))
                        : (f->step == step && (!phase || !strcmp(phase, "step"))))
            return 1;
    }
    return 0;
}

int sd_fault_armed(sd_fault_action action, int rank, int64_t step, const char *phase)
{
    return rank >= 0 && armed_for(action, rank, step, phase);
}

int sd_fault_armed_any_rank(sd_fault_action action, int64_t step, const char *phase)
{
    return armed_for(action, -1, step, phase);
}

void sd_fault_hang(int rank, const char *where, int64_t n)
{
    if (n >= 0)
        fprintf(stderr, "[rank %d] SDTRAIN_FAULT: this rank stops making progress (%s %lld)\n", rank,
                where, (long long)n);
    else
        fprintf(stderr, "[rank %d] SDTRAIN_FAULT: this rank stops making progress (%s)\n", rank,
                where);
    fflush(stderr);
    for (;;) {
        const struct timespec second = {1, 0};
        nanosleep(&second, NULL);
    }
}
