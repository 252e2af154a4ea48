/* Progress marks and the stall watchdog (include/sdtrain/progress.h). */
#include "sdtrain/progress.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/log.h"
#include "sdtrain/timer.h"

/* What the marks record. Each field is atomic on its own; a report read while the main thread
 * changes phase may pair a phase with the previous one's number, which is harmless. */
static atomic_uint_fast64_t ticks;
static _Atomic(const char *) phase_what;
static atomic_int_fast64_t phase_n = -1;
static _Atomic double phase_t0;
static _Atomic(const char *) wait_what;
static _Atomic(const char *) mpi_call;
static _Atomic(const char *) mpi_file;
static atomic_int mpi_line;
static _Atomic double mpi_t0;
static _Thread_local int on_main;
static atomic_int report_asked; /* set by a signal handler (lock-free: async-signal-safe) */

void sd_progress_tick(void)
{
    atomic_fetch_add_explicit(&ticks, 1, memory_order_relaxed);
}

void sd_progress_phase(const char *what, int64_t n)
{
    if (on_main) {
        atomic_store_explicit(&phase_n, n, memory_order_relaxed);
        atomic_store_explicit(&phase_t0, sd_time_now(), memory_order_relaxed);
        atomic_store_explicit(&phase_what, what, memory_order_release);
    }
    sd_progress_tick();
}

void sd_progress_sleep_ms(long ms)
{
    for (long left = ms; left > 0; left -= 100) {
        usleep((useconds_t)(left < 100 ? left : 100) * 1000);
        sd_progress_tick();
    }
}

int sd_progress_is_straggler(double slowest, double mean, double span)
{
    const double excess = slowest - mean;
    return excess >= 1.0 && excess >= 0.1 * span;
}

long sd_progress_test_delay_ms(const char *name, int world_rank, int warn)
{
    const char *env = getenv(name), *text;
    char *end;
    long ms, who = -1;
    if (!env || !*env)
        return 0;
    text = env;
    if (strchr(env, ':')) {
        who = strtol(env, &end, 10);
        text = end == env || *end != ':' || who < 0 ? "" : end + 1;
    }
    ms = strtol(text, &end, 10);
    if (end == text || *end || ms < 0 || ms > 3600000) {
        if (warn)
            sd_warn("%s = '%s' is not a delay in ms (MS, or RANK:MS for one rank); ignored", name,
                    env);
        return 0;
    }
    return who < 0 || who == world_rank ? ms : 0;
}

void sd_progress_wait_begin(const char *what)
{
    if (on_main)
        atomic_store_explicit(&wait_what, what ? what : "waiting", memory_order_release);
}

void sd_progress_wait_end(void)
{
    if (on_main)
        atomic_store_explicit(&wait_what, NULL, memory_order_release);
    sd_progress_tick();
}

/* Nested: a polled wait (sd_mpi_wait_idle) marks itself around the MPI_Test calls it makes.
 * Leaving MPI is no progress in itself (a polled MPI_Test leaves at once, done or not): what
 * the rank does next with the result ticks. The slot holds one thread's call: the main thread's,
 * or a helper's (mode 'process''s shard writer) while the main thread waits for it; under
 * MPI_THREAD_SERIALIZED no two are inside MPI at once. */
static _Thread_local int mpi_depth;
static _Thread_local char mpi_token; /* its address names the thread */
static _Atomic(void *) mpi_owner;

void sd_progress_mpi_enter(const char *call, const char *file, int line)
{
    void *none = NULL;
    if (mpi_depth++ > 0 || !atomic_compare_exchange_strong(&mpi_owner, &none, (void *)&mpi_token))
        return;
    atomic_store_explicit(&mpi_file, file, memory_order_relaxed);
    atomic_store_explicit(&mpi_line, line, memory_order_relaxed);
    atomic_store_explicit(&mpi_t0, sd_time_now(), memory_order_relaxed);
    atomic_store_explicit(&mpi_call, call, memory_order_release);
}

void sd_progress_mpi_leave(void)
{
    if (--mpi_depth > 0 || atomic_load(&mpi_owner) != (void *)&mpi_token)
        return;
    atomic_store_explicit(&mpi_call, NULL, memory_order_release);
    atomic_store(&mpi_owner, NULL);
}

/* The file-system call slots: one per thread inside a marked call (the outermost of nested
 * marks), so that a helper thread's call stuck for good is seen whatever the other threads mark
 * meanwhile (with one slot, the main thread's short reads of images could hold it while the shard
 * writer's call hung unseen). A thread claims a free slot at its outermost enter (first the one
 * it had last: uncontended, one compare-and-swap) and frees it at the leave; with every slot
 * taken the call goes unmarked. A report reads a slot's fields between two reads of its seq (odd
 * while they change), so that it never pairs a call with another call's descriptor. */
#define IO_SLOTS 64
/* the path of a call without a descriptor, copied in (relaxed atomics: the report reads it while
 * the owner may be changing it, and seq tells it whether it got a whole one) */
#define IO_PATH_MAX 512
typedef struct io_slot {
    atomic_int busy;
    atomic_uint seq;
    _Atomic(const char *) call;
    atomic_int fd; /* -1: the call is on path */
    _Atomic double t0;
    _Atomic char path[IO_PATH_MAX];
} io_slot;
static io_slot io_slots[IO_SLOTS];
static _Thread_local int io_depth;
static _Thread_local int io_mine = -1; /* the slot this thread holds while inside a call */
static _Thread_local int io_hint;      /* the slot it held last */

/* The clock of a file-system call's start: CLOCK_MONOTONIC as the kernel last ticked it (a few
 * ms behind sd_time_now at most, without reading the time source), since a report gives seconds */
static double coarse_now(void)
{
#ifdef CLOCK_MONOTONIC_COARSE
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) == 0)
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
#endif
    return sd_time_now();
}

static int io_claim(void)
{
    for (int k = 0; k < IO_SLOTS; k++) {
        const int i = (io_hint + k) % IO_SLOTS;
        int free_ = 0;
        if (atomic_load_explicit(&io_slots[i].busy, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_strong(&io_slots[i].busy, &free_, 1)) {
            io_hint = i;
            return i;
        }
    }
    return -1;
}

static void io_enter(const char *call, int fd, const char *path)
{
    if (io_depth++ > 0 || (io_mine = io_claim()) < 0)
        return;
    io_slot *o = &io_slots[io_mine];
    /* A seqlock's writer: only the slot's holder changes seq, so plain stores do; the release
     * fence keeps the fields' stores after the odd count, the release store the even one after
     * them (on x86 no locked instruction beyond the claim) */
    const unsigned s = atomic_load_explicit(&o->seq, memory_order_relaxed);
    atomic_store_explicit(&o->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&o->fd, fd, memory_order_relaxed);
    if (path) {
        size_t i = 0;
        for (; path[i] && i < IO_PATH_MAX - 1; i++)
            atomic_store_explicit(&o->path[i], path[i], memory_order_relaxed);
        atomic_store_explicit(&o->path[i], '\0', memory_order_relaxed);
    }
    atomic_store_explicit(&o->t0, coarse_now(), memory_order_relaxed);
    atomic_store_explicit(&o->call, call, memory_order_relaxed);
    atomic_store_explicit(&o->seq, s + 2, memory_order_release);
}

void sd_progress_io_enter(const char *call, int fd)
{
    io_enter(call, fd, NULL);
}

void sd_progress_io_enter_path(const char *call, const char *path)
{
    io_enter(call, -1, path ? path : "");
}

void sd_progress_io_leave(void)
{
    if (--io_depth > 0 || io_mine < 0)
        return;
    io_slot *o = &io_slots[io_mine];
    const unsigned s = atomic_load_explicit(&o->seq, memory_order_relaxed);
    atomic_store_explicit(&o->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&o->call, NULL, memory_order_relaxed);
    atomic_store_explicit(&o->seq, s + 2, memory_order_release);
    atomic_store_explicit(&o->busy, 0, memory_order_release);
    io_mine = -1;
}


/* Slot i's call, when one is in it and was read whole: its start in *t0, its path (or
 * descriptor) in path when path is not NULL. Returns the call, or NULL. */
static const char *io_read(int i, double *t0, char *path, size_t size)
{
    const io_slot *o = &io_slots[i];
    const unsigned s0 = atomic_load(&o->seq);
    const char *call = atomic_load(&o->call);
    const int fd = atomic_load(&o->fd);
    char link[64];
    *t0 = atomic_load(&o->t0);
    if ((s0 & 1) || !call)
        return NULL;
    if (path && fd < 0) {
        size_t k = 0;
        for (; k < size - 1 && k < IO_PATH_MAX; k++)
            if ((path[k] = atomic_load_explicit(&o->path[k], memory_order_relaxed)) == '\0')
                break;
        path[k] = '\0';
    } else if (path) {
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        const ssize_t n = readlink(link, path, size - 1);
        if (n > 0)
            path[n] = '\0';
        else
            snprintf(path, size, "descriptor %d", fd);
    }
    atomic_thread_fence(memory_order_acquire); /* the reads above before the check below */
    return atomic_load(&o->seq) == s0 ? call : NULL;
}

/* The oldest call inside a slot (the one most likely stuck): its slot, *t0 its start; -1 when
 * there is none. *others := how many other calls are inside slots. */
static int io_oldest(double *t0, int *others)
{
    int best = -1, n = 0;
    for (int i = 0; i < IO_SLOTS; i++) {
        double t;
        if (!atomic_load_explicit(&io_slots[i].busy, memory_order_acquire) ||
            !io_read(i, &t, NULL, 0))
            continue;
        n++;
        if (best < 0 || t < *t0) {
            best = i;
            *t0 = t;
        }
    }
    if (others)
        *others = n > 0 ? n - 1 : 0;
    return best;
}

static const char *secs(char *buf, size_t size, double s);

/* ", in CALL of 'PATH' for T" for the oldest file-system call inside a slot (PATH from
 * /proc/self/fd; "descriptor N" where it cannot be read), with "(and K more calls)" when other
 * threads are in calls too, or "" (also when the call ended while it was being read). Returns T,
 * or -1 when there was none. */
static double describe_io(char *buf, size_t size, double now)
{
    double t0 = 0;
    int others = 0;
    char path[1024], a[32], more[48] = "";
    const int i = io_oldest(&t0, &others);
    const char *call = i < 0 ? NULL : io_read(i, &t0, path, sizeof path);
    buf[0] = '\0';
    if (!call)
        return -1;
    if (others)
        snprintf(more, sizeof more, " (and %d more call%s)", others, others > 1 ? "s" : "");
    snprintf(buf, size, ", in %s of '%s' for %s%s", call, path, secs(a, sizeof a, now - t0), more);
    return now - t0;
}

/* How long the oldest file-system call inside a slot has lasted; -1 when none is inside one. */
static double io_inside_s(double now)
{
    double t0 = 0;
    return io_oldest(&t0, NULL) < 0 ? -1 : now - t0;
}

/* ---- the watchdog ------------------------------------------------------------------------- */

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop;
    double timeout, grace;
    char setting[64];
    sd_stall_fn fn;
    void *user;
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER};

double sd_watchdog_default_grace(double timeout_s)
{
    const double g = 0.1 * timeout_s;
    return g < 2 ? 2 : g > 300 ? 300 : g;
}

/* The statement's function name: "MPI_Allreduce(&a, ...)" -> "MPI_Allreduce". */
static int call_name_len(const char *call)
{
    const char *paren = strchr(call, '(');
    const size_t n = paren ? (size_t)(paren - call) : strlen(call);
    return (int)(n > 48 ? 48 : n);
}

/* Whether a file-system call that has lasted io_s seconds (-1: none) spans the stall: as long as
 * the timeout, less a tenth for the watchdog's own lateness in seeing the last progress (the
 * call may have begun just after it). */
static int io_covers_stall(double io_s)
{
    return io_s >= 0 && io_s >= 0.9 * wd.timeout;
}

/* "1805 s", "2.0 s", "0.21 s": whole seconds where they are enough */
static const char *secs(char *buf, size_t size, double s)
{
    snprintf(buf, size, s >= 100 ? "%.0f s" : s >= 10 ? "%.1f s" : "%.2f s", s);
    return buf;
}

/* What the rank is doing: "its work: PHASE N (for T), inside CALL at FILE:LINE for T: ..." or
 * ", outside MPI..." (`stalled`: the outside text says the rank is stuck). */
static void describe_work(char *msg, size_t size, int stalled)
{
    const char *what = atomic_load_explicit(&phase_what, memory_order_acquire);
    const int64_t n = atomic_load_explicit(&phase_n, memory_order_relaxed);
    const double now = sd_time_now();
    const double since = now - atomic_load_explicit(&phase_t0, memory_order_relaxed);
    const char *call = atomic_load_explicit(&mpi_call, memory_order_acquire);
    char num[32] = "", a[32], io[1200];
    const double in_io = describe_io(io, sizeof io, now);
    int len;
    if (n >= 0)
        snprintf(num, sizeof num, " %lld", (long long)n);
    len = snprintf(msg, size, "its work: %s%s (for %s)", what ? what : "start-up", num,
                   secs(a, sizeof a, since));
    if (len < 0 || (size_t)len >= size)
        return;
    if (call)
        len += snprintf(msg + len, size - (size_t)len, ", inside %.*s at %s:%d for %s",
                        call_name_len(call), call,
                        atomic_load_explicit(&mpi_file, memory_order_relaxed),
                        atomic_load_explicit(&mpi_line, memory_order_relaxed),
                        secs(a, sizeof a,
                             now - atomic_load_explicit(&mpi_t0, memory_order_relaxed)));
    else
        len += snprintf(msg + len, size - (size_t)len, ", outside MPI");
    if (len >= 0 && (size_t)len < size)
        len += snprintf(msg + len, size - (size_t)len, "%s", io);
    if (len < 0 || (size_t)len >= size || !stalled)
        return;
    /* a file-system call as old as the stall is what is stuck, whatever else waits */
    snprintf(msg + len, size - (size_t)len, "%s",
             io_covers_stall(in_io) ? ": this rank is stuck in the file system (a call on it that "
                                   "does not return: a hung server or disk?)"
             : call ? ": waiting for another rank, which is stuck or gone (its own report says "
                      "where)"
                    : ": this rank is stuck (a file-system, device or library call that does not "
                      "return)");
}

static void describe(char *msg, size_t size, double stalled)
{
    const char *waiting = atomic_load_explicit(&wait_what, memory_order_acquire);
    char a[32];
    int len = snprintf(msg, size, "no progress on this rank for %s (%s = %g s); ",
                       secs(a, sizeof a, stalled), wd.setting, wd.timeout);
    if (len >= 0 && (size_t)len < size)
        describe_work(msg + len, size - (size_t)len, 1);
    len = (int)strlen(msg);
    if (waiting && (size_t)len < size)
        snprintf(msg + len, size - (size_t)len, "; in a bounded wait: %s", waiting);
}

void sd_progress_report_request(void)
{
    atomic_store_explicit(&report_asked, 1, memory_order_relaxed);
}

/* The answer to sd_progress_report_request, on this rank's stderr. idle < 0: there was
 * progress within the last poll interval (-idle). */
static void report(double idle)
{
    const char *waiting = atomic_load_explicit(&wait_what, memory_order_acquire);
    char msg[1024], a[32], when[64];
    describe_work(msg, sizeof msg, 0);
    if (idle < 0)
        snprintf(when, sizeof when, "less than %s ago", secs(a, sizeof a, -idle));
    else
        snprintf(when, sizeof when, "%s ago", secs(a, sizeof a, idle));
    fprintf(stderr, "[rank %d] [%9.3fs] progress: %s; the last progress %s%s%s\n",
            sd_log_rank(), sd_log_elapsed(), msg, when, waiting ? "; in a bounded wait: " : "",
            waiting ? waiting : "");
    fflush(stderr);
}

static void deadline_after(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)s;
    ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static void *watch(void *arg)
{
    /* the timeout's eighth, 20 ms to 1 s (a report asked for comes within one poll) */
    double poll = wd.timeout > 0 && wd.timeout / 8 < 1 ? wd.timeout / 8 : 1;
    uint64_t seen = atomic_load_explicit(&ticks, memory_order_relaxed);
    double last = sd_time_now();
    (void)arg;
    if (poll < 0.02)
        poll = 0.02;
    pthread_mutex_lock(&wd.mu);
    while (!wd.stop) {
        struct timespec until;
        uint64_t now_ticks;
        double now, stalled;
        int in_mpi;
        deadline_after(&until, poll);
        while (!wd.stop && pthread_cond_timedwait(&wd.cv, &wd.mu, &until) != ETIMEDOUT) {
        }
        if (wd.stop)
            break;
        now_ticks = atomic_load_explicit(&ticks, memory_order_relaxed);
        now = sd_time_now();
        if (atomic_exchange_explicit(&report_asked, 0, memory_order_relaxed)) {
            report(now_ticks != seen ? -poll : now - last);
        }
        const char *waiting = atomic_load_explicit(&wait_what, memory_order_acquire);
        char msg[1024];
        if (now_ticks != seen || waiting) {
            seen = now_ticks;
            last = now;
            /* A bounded wait does not count, but a file-system call made in it (the loader's
             * poll of the shard manifest, say) that has not returned for the whole timeout
             * does: the wait's own bound cannot end a call the kernel holds, and the rank
             * would wait for good, and with it the ranks that wait for it. */
            if (!waiting || wd.timeout <= 0 || (stalled = io_inside_s(now)) < wd.timeout)
                continue;
        } else {
            if (wd.timeout <= 0)
                continue; /* reports only */
            stalled = now - last;
            /* the grace is for a rank that waits for another; not for one whose own
             * file-system call (on a helper thread, say) is what is stuck */
            in_mpi = atomic_load_explicit(&mpi_call, memory_order_acquire) != NULL &&
                     !io_covers_stall(io_inside_s(now));
            if (stalled < wd.timeout + (in_mpi ? wd.grace : 0))
                continue;
        }
        describe(msg, sizeof msg, stalled);
        pthread_mutex_unlock(&wd.mu);
        wd.fn(msg, wd.user); /* the job's handler does not return */
        pthread_mutex_lock(&wd.mu);
        break;
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

int sd_watchdog_start(double timeout_s, double grace_s, const char *setting, sd_stall_fn fn,
                      void *user)
{
    pthread_condattr_t ca;
    int rc;
    on_main = 1;
    atomic_store(&phase_what, NULL);
    atomic_store(&phase_n, -1);
    atomic_store(&phase_t0, sd_time_now());
    if (wd.running || !fn)
        return 0;
    wd.timeout = timeout_s > 0 ? timeout_s : 0;
    wd.grace = grace_s < 0 ? sd_watchdog_default_grace(timeout_s) : grace_s;
    snprintf(wd.setting, sizeof wd.setting, "%s", setting ? setting : "the stall timeout");
    wd.fn = fn;
    wd.user = user;
    wd.stop = 0;
    if (pthread_condattr_init(&ca) != 0)
        return -1;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&wd.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    {
        /* signals are the main thread's (SIGUSR1's stop, SIGUSR2's report request) */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(&wd.thread, NULL, watch, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (rc != 0) {
        pthread_cond_destroy(&wd.cv);
        errno = rc;
        return -1;
    }
    wd.running = 1;
    return 0;
}

void sd_watchdog_stop(void)
{
    if (!wd.running)
        return;
    pthread_mutex_lock(&wd.mu);
    wd.stop = 1;
    pthread_cond_signal(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
    pthread_join(wd.thread, NULL);
    pthread_cond_destroy(&wd.cv);
    wd.running = 0;
}
