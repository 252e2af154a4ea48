/* The stall watchdog (sdtrain/progress.h): ticks keep it quiet, a stall fires it once with a
 * message naming the phase, a rank inside MPI gets the grace, bounded waits do not count (but a
 * file-system call in one that does not return does), and stop joins its thread. Times are generous: a loaded machine only makes the watchdog later,
 * so "not yet fired" is checked at instants before the deadline and "fired" with a long limit. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/progress.h"
#include "sdtrain/timer.h"
#include "tap.h"

static atomic_int fired;
static char message[1024];
static double fired_at;

static void on_stall(const char *msg, void *user)
{
    snprintf(message, sizeof message, "%s", msg);
    fired_at = sd_time_now();
    atomic_store(&fired, 1);
    (void)user;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Waits at most `limit` seconds for the watchdog to fire; 1 when it did. */
static int wait_fired(double limit)
{
    const double t0 = sd_time_now();
    while (!atomic_load(&fired) && sd_time_now() - t0 < limit)
        sleep_s(0.01);
    return atomic_load(&fired);
}

static void start(double timeout, double grace)
{
    atomic_store(&fired, 0);
    message[0] = '\0';
    tap_ok(sd_watchdog_start(timeout, grace, "&run stall_timeout", on_stall, NULL) == 0,
           "watchdog started (timeout %g s, grace %g s)", timeout, grace);
}

static void *helper_in_mpi(void *arg)
{
    sd_progress_mpi_enter("MPI_Allreduce(a, b, 1, MPI_INT, MPI_MAX, comm)", "src/x.c", 42);
    sleep_s(*(double *)arg);
    sd_progress_mpi_leave();
    return NULL;
}

typedef struct {
    int fd;
    double hold;
} io_hold;

static void *helper_in_io(void *arg)
{
    const io_hold *h = arg;
    sd_progress_io_enter("fsync", h->fd);
    sleep_s(h->hold);
    sd_progress_io_leave();
    return NULL;
}

/* The test hooks' delays: MS for every rank, RANK:MS for one, anything else ignored. */
static void test_delays(void)
{
    static const char *const bad[] = {"x", "5ms", "2:", ":5", "-1:5", "2:-3", "2:5:1",
                                      "3600001", "-4", "1:2x"};
    int ok = 1;
    unsetenv("SD_TEST_HOOK");
    tap_ok(sd_progress_test_delay_ms("SD_TEST_HOOK", 0, 1) == 0, "delay hook: unset is 0");
    setenv("SD_TEST_HOOK", "250", 1);
    tap_ok(sd_progress_test_delay_ms("SD_TEST_HOOK", 0, 1) == 250 &&
               sd_progress_test_delay_ms("SD_TEST_HOOK", 7, 1) == 250,
           "delay hook: MS on every rank");
    setenv("SD_TEST_HOOK", "2:300", 1);
    tap_ok(sd_progress_test_delay_ms("SD_TEST_HOOK", 2, 1) == 300 &&
               sd_progress_test_delay_ms("SD_TEST_HOOK", 1, 1) == 0 &&
               sd_progress_test_delay_ms("SD_TEST_HOOK", 20, 1) == 0,
           "delay hook: RANK:MS on that world rank only");
    tap_diag("warnings for %zu malformed values follow on stderr; they are expected",
             sizeof bad / sizeof *bad);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("SD_TEST_HOOK", bad[i], 1);
        if (sd_progress_test_delay_ms("SD_TEST_HOOK", 2, 1) != 0 ||
            sd_progress_test_delay_ms("SD_TEST_HOOK", 5, 0) != 0) {
            tap_diag("'%s' was taken", bad[i]);
            ok = 0;
        }
    }
    tap_ok(ok, "delay hook: malformed values are 0 on every rank");
    unsetenv("SD_TEST_HOOK");
}

int main(void)
{
    double t0;

    test_delays();

    tap_ok(sd_progress_is_straggler(5.0, 3.9, 10.0) && sd_progress_is_straggler(5.0, 4.0, 10.0) &&
               !sd_progress_is_straggler(5.0, 4.1, 10.0),
           "straggler rule: an excess of 1 s over the mean counts, less does not");
    tap_ok(sd_progress_is_straggler(50.0, 45.0, 50.0) && !sd_progress_is_straggler(50.0, 45.5, 50.0) &&
               !sd_progress_is_straggler(3.0, 3.0, 1.0),
           "straggler rule: and a tenth of the span (5 s of 50); no excess is none");

    tap_ok(sd_watchdog_default_grace(1800) == 180 && sd_watchdog_default_grace(5) == 2 &&
               sd_watchdog_default_grace(1e5) == 300,
           "default grace: a tenth of the timeout, 2 to 300 s");
    /* timeout 0: never fires, but answers report requests (SIGUSR2) on stderr */
    start(0, -1);
    sd_progress_phase("training step", 9);
    sleep_s(0.5);
    {
        char path[] = "/tmp/sd-progress-XXXXXX", text[2048] = "";
        const int fd = mkstemp(path), saved = dup(2);
        FILE *f;
        size_t got;
        dup2(fd, 2);
        sd_progress_report_request();
        sleep_s(1.5);
        sd_progress_mpi_enter("MPI_Bcast(buf, 4, MPI_BYTE, 0, comm)", "src/y.c", 7);
        sd_progress_report_request();
        sleep_s(1.5);
        sd_progress_mpi_leave();
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        f = fdopen(fd, "r");
        rewind(f);
        got = fread(text, 1, sizeof text - 1, f);
        text[got] = '\0';
        fclose(f);
        unlink(path);
        tap_ok(strstr(text, "progress: its work: training step 9 (for") != NULL &&
                   strstr(text, "), outside MPI; the last progress") != NULL,
               "a report request: the phase, outside MPI");
        tap_ok(strstr(text, "inside MPI_Bcast at src/y.c:7 for") != NULL,
               "a second one: inside the MPI call");
        tap_ok(!strstr(text, "stuck"), "reports say nothing of a stall");
        tap_diag("%s", text);
    }
    tap_ok(!atomic_load(&fired), "timeout 0: never fires");
    sd_watchdog_stop();

    /* ticks every 20 ms for 0.6 s: no stall at a 0.2 s timeout */
    start(0.2, 0.5);
    sd_progress_phase("training step", 7);
    for (int i = 0; i < 30; i++) {
        sd_progress_tick();
        sleep_s(0.02);
    }
    tap_ok(!atomic_load(&fired), "ticking: no stall");
    /* then nothing: it fires, once, naming the phase and saying the rank is outside MPI */
    t0 = sd_time_now();
    tap_ok(wait_fired(30), "no ticks: fired");
    tap_ok(fired_at - t0 >= 0.2 - 0.03, "not before the timeout (%.3f s)", fired_at - t0);
    tap_ok(strstr(message, "no progress on this rank for") != NULL &&
               strstr(message, "(&run stall_timeout = 0.2 s)") != NULL &&
               strstr(message, "its work: training step 7 (for") != NULL &&
               strstr(message, "outside MPI: this rank is stuck") != NULL,
           "message: %s", message);
    sd_watchdog_stop();

    /* inside MPI: the grace first (0.2 + 1.5 s) */
    start(0.2, 1.5);
    sd_progress_phase("validation", -1);
    sd_progress_mpi_enter("MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_SUM, comm)", "src/t.c", 12);
    t0 = sd_time_now();
    sleep_s(1.0);
    tap_ok(!atomic_load(&fired), "inside MPI: not at the timeout (grace)");
    tap_ok(wait_fired(30), "inside MPI: fired after the grace");
    tap_ok(fired_at - t0 >= 1.7 - 0.03, "not before timeout + grace (%.3f s)", fired_at - t0);
    tap_ok(strstr(message, "its work: validation (for") != NULL &&
               strstr(message, "inside MPI_Allreduce at src/t.c:12 for") != NULL &&
               strstr(message, "waiting for another rank") != NULL,
           "message: %s", message);
    sd_progress_mpi_leave();
    sd_watchdog_stop();

    /* nested marks keep the outer call; leaving it is no tick */
    start(0.2, 1.0);
    sd_progress_mpi_enter("MPI_Wait, polled", "src/loader.c", 900);
    sd_progress_mpi_enter("MPI_Test(req, &done, MPI_STATUS_IGNORE)", "src/runtime.c", 170);
    sd_progress_mpi_leave();
    tap_ok(wait_fired(30), "a polled wait: fired");
    tap_ok(strstr(message, "inside MPI_Wait, polled at src/loader.c:900") != NULL,
           "the outer call is named: %s", message);
    sd_progress_mpi_leave();
    sd_watchdog_stop();

    /* a helper thread inside MPI while the main thread waits for it (mode 'process''s writer) */
    start(0.2, 1.0);
    {
        pthread_t th;
        double hold = 5.0;
        sd_progress_phase("waiting for the writer of shard", 3);
        pthread_create(&th, NULL, helper_in_mpi, &hold);
        tap_ok(wait_fired(30), "helper inside MPI: fired");
        tap_ok(strstr(message, "waiting for the writer of shard 3") != NULL &&
                   strstr(message, "inside MPI_Allreduce at src/x.c:42") != NULL,
               "the helper's call is named: %s", message);
        pthread_join(th, NULL);
    }
    sd_watchdog_stop();

    /* a bounded wait does not count; the clock starts again when it ends */
    start(0.2, 0.2);
    sd_progress_wait_begin("waiting for the preprocessing half's shards");
    sd_progress_mpi_enter("MPI_Wait, polled", "src/loader.c", 900);
    sleep_s(1.0);
    tap_ok(!atomic_load(&fired), "a bounded wait of 5 timeouts: no stall");
    sd_progress_mpi_leave();
    sd_progress_wait_end();
    t0 = sd_time_now();
    tap_ok(wait_fired(30), "after the wait: fired");
    tap_ok(fired_at - t0 >= 0.2 - 0.03, "a timeout after the wait ended (%.3f s)", fired_at - t0);
    sd_watchdog_stop();

    /* a helper thread inside a file-system call: the report names the call and the file (from
     * the descriptor), and says the rank is stuck in the file system, with no grace although
     * the main thread waits inside MPI (the rank that is stuck is this one) */
    {
        char path[] = "/tmp/sd-progress-io-XXXXXX";
        const int fd = mkstemp(path);
        pthread_t th;
        io_hold h = {fd, 5.0};
        start(0.3, 3.0);
        sd_progress_phase("writing the checkpoint of step", 8);
        sd_progress_mpi_enter("MPI_Allreduce(&f, &g, 1, MPI_INT, MPI_MAX, comm)", "src/c.c", 5);
        t0 = sd_time_now();
        pthread_create(&th, NULL, helper_in_io, &h);
        tap_ok(wait_fired(30), "helper inside fsync: fired");
        tap_ok(fired_at - t0 < 3.0, "no grace for a stuck file-system call (%.3f s)",
               fired_at - t0);
        tap_ok(strstr(message, "its work: writing the checkpoint of step 8") != NULL &&
                   strstr(message, "inside MPI_Allreduce at src/c.c:5") != NULL &&
                   strstr(message, ", in fsync of '") != NULL && strstr(message, path) != NULL &&
                   strstr(message, ": this rank is stuck in the file system") != NULL,
               "the call and its file are named: %s", message);
        pthread_join(th, NULL);
        sd_progress_mpi_leave();
        sd_watchdog_stop();

        /* the main thread itself inside pread, outside MPI */
        start(0.2, 1.0);
        sd_progress_phase("reading shard", 2);
        sd_progress_io_enter("pread", fd);
        sd_progress_io_enter("pread", fd); /* nested: the outer one stays */
        sd_progress_io_leave();
        tap_ok(wait_fired(30), "inside pread: fired");
        tap_ok(strstr(message, "outside MPI, in pread of '") != NULL &&
                   strstr(message, path) != NULL &&
                   strstr(message, ": this rank is stuck in the file system") != NULL,
               "the main thread's call, stuck: %s", message);
        sd_progress_io_leave();
        sd_watchdog_stop();

        /* a call on a path (no descriptor): the path is copied in, and may change after */
        start(0.2, 1.0);
        {
            char p2[600];
            snprintf(p2, sizeof p2, "/lustre/run/shards/shard-000007.h5");
            sd_progress_io_enter_path("H5Fopen", p2);
            memset(p2, 'x', sizeof p2 - 1); /* the caller's buffer reused */
            p2[sizeof p2 - 1] = '\0';
            tap_ok(wait_fired(30), "inside H5Fopen: fired");
            tap_ok(strstr(message, "outside MPI, in H5Fopen of '/lustre/run/shards/shard-000007.h5'"
                                   " for ") != NULL &&
                       strstr(message, ": this rank is stuck in the file system") != NULL,
                   "a path's call, named with the path as it was: %s", message);
            sd_progress_io_leave();
            sd_watchdog_stop();
            /* a path longer than the slot: its first 511 bytes */
            start(0.2, 1.0);
            sd_progress_io_enter_path("rename", p2);
            tap_ok(wait_fired(30), "inside rename: fired");
            {
                const char *q = strstr(message, "in rename of '");
                size_t xs = 0;
                if (q)
                    for (q += strlen("in rename of '"); q[xs] == 'x'; xs++) {
                    }
                tap_ok(q && xs == 511 && q[xs] == '\'', "a long path: its first 511 bytes (%zu)",
                       xs);
            }
            sd_progress_io_leave();
            sd_watchdog_stop();
        }

        /* a bounded wait does not count, but a file-system call made in it that lasts the
         * whole timeout does (the wait's bound cannot end it): named, with the wait */
        start(0.3, 1.0);
        sd_progress_phase("training set-up", -1);
        sd_progress_wait_begin("waiting for shard 0");
        for (int i = 0; i < 10; i++) { /* polls, each a short call: no stall */
            sd_progress_io_enter_path("stat", "/lustre/run/shards/manifest.json");
            sleep_s(0.1);
            sd_progress_io_leave();
        }
        tap_ok(!atomic_load(&fired), "a bounded wait polling with short calls (1 s): no stall");
        t0 = sd_time_now();
        sd_progress_io_enter_path("stat", "/lustre/run/shards/manifest.json");
        tap_ok(wait_fired(30), "a call that does not return in a bounded wait: fired");
        tap_ok(fired_at - t0 >= 0.3 - 0.03, "after the timeout (%.3f s)", fired_at - t0);
        tap_ok(strstr(message, "outside MPI, in stat of '/lustre/run/shards/manifest.json' for") &&
                   strstr(message, ": this rank is stuck in the file system") &&
                   strstr(message, "; in a bounded wait: waiting for shard 0"),
               "named, with the wait: %s", message);
        sd_progress_io_leave();
        sd_progress_wait_end();
        sd_watchdog_stop();

        /* two threads in calls at once: a helper's call that hangs is named although the main
         * thread made short calls of its own meanwhile (one at the helper's start, then others
         * while it hangs), and another thread's call is counted */
        {
            pthread_t th2;
            io_hold h2 = {fd, 3.0};
            start(0.4, 1.0);
            sd_progress_phase("waiting for the writer of shard", 0);
            sd_progress_io_enter_path("read", "/data/00000/000000001.jpg");
            pthread_create(&th2, NULL, helper_in_io, &h2);
            sleep_s(0.05); /* the helper enters while the main thread is in its call */
            sd_progress_io_leave();
            for (int i = 0; i < 5; i++) { /* more short calls: ticks, no stall yet */
                sd_progress_io_enter_path("read", "/data/00000/000000002.jpg");
                sleep_s(0.02);
                sd_progress_io_leave();
                sd_progress_tick();
            }
            tap_ok(wait_fired(30), "a helper's call hangs beside the main thread's calls: fired");
            tap_ok(strstr(message, ", in fsync of '") != NULL && strstr(message, path) != NULL &&
                       strstr(message, "more call") == NULL &&
                       strstr(message, ": this rank is stuck in the file system") != NULL,
                   "the helper's call is named: %s", message);
            sd_watchdog_stop();
            /* the main thread in a call too, newer than the helper's: the helper's (the oldest)
             * is named and the other counted */
            start(0.2, 1.0);
            sd_progress_io_enter_path("stat", "/lustre/run/x");
            tap_ok(wait_fired(30), "two calls inside: fired");
            tap_ok(strstr(message, ", in fsync of '") != NULL &&
                       strstr(message, " (and 1 more call)") != NULL,
                   "the oldest named, the other counted: %s", message);
            sd_progress_io_leave();
            sd_watchdog_stop();
            pthread_join(th2, NULL);
        }

        /* once left, no call is named */
        start(0.2, 1.0);
        sd_progress_io_enter("fsync", fd);
        sd_progress_io_leave();
        tap_ok(wait_fired(30), "after the call: fired");
        tap_ok(strstr(message, ", in ") == NULL &&
                   strstr(message, "outside MPI: this rank is stuck (a file-system") != NULL,
               "no call named after it ended: %s", message);
        sd_watchdog_stop();
        close(fd);
        unlink(path);
    }

    /* stop joins a watchdog that has not fired, at once */
    start(3600, -1);
    t0 = sd_time_now();
    sd_watchdog_stop();
    tap_ok(sd_time_now() - t0 < 5 && !atomic_load(&fired), "stop ends the watch (%.3f s)",
           sd_time_now() - t0);
    return tap_done();
}
