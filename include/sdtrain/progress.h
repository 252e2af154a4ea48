/* Progress marks and the stall watchdog behind &run stall_timeout.
 *
 * A job that stops making progress without dying (a rank stuck on a hung file system, a GPU that
 * never finishes a kernel, a collective one rank never joins) would hold its whole allocation
 * until the time limit. Code that works ticks a counter (every op, every file read and write);
 * a thread of its own watches that counter and, when it has not moved for the timeout, reports
 * what this rank was doing and ends the job, which a batch script then restarts from the newest
 * checkpoint.
 *
 * What the rank is doing (a phase such as "training step", with a number) and the MPI call its
 * main thread is inside are recorded too, so that the report tells a rank stuck in its own work
 * from one waiting in a collective for it. A rank inside an MPI call waits `grace` seconds longer
 * before it ends the job, so that a stuck rank outside MPI is normally the one that reports.
 *
 * Every function here is safe to call from any thread and costs a few nanoseconds; the phase
 * and wait marks are kept only from the thread that started the watchdog (the main thread), the
 * ticks and MPI marks from every thread. */
#ifndef SDTRAIN_PROGRESS_H
#define SDTRAIN_PROGRESS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Something was done: the watchdog's clock starts again. */
void sd_progress_tick(void);

/* The main thread's current work: `what` must be a string that outlives the call (a literal),
 * `n` a number shown after it (a step, a shard) or -1 for none. Ticks too. */
void sd_progress_phase(const char *what, int64_t n);

/* Sleeps `ms` milliseconds counted as work (a tick every 0.1 s): the test hooks that stand for
 * slow work (a slow shard, index or input). */
void sd_progress_sleep_ms(long ms);
/* Such a test hook's delay: environment variable `name` = MS (0 to 3600000) on every rank, or
 * RANK:MS on world rank RANK only (a straggler); 0 when unset, on the other ranks, or malformed
 * (then with a warning naming it when `warn`). */
long sd_progress_test_delay_ms(const char *name, int world_rank, int warn);

/* The straggler rule of the training and preprocessing reports: over a span of `span` seconds
 * (an interval of steps or shards), a rank whose time `slowest` exceeds the ranks' `mean` by at
 * least 1 s and a tenth of the span is named (every rank waits for it, so it costs them all);
 * smaller gaps are noise, and a larger share of a short span would flood the log. */
int sd_progress_is_straggler(double slowest, double mean, double span);

/* A wait that something else bounds (a timeout of its own, another part of the job with its own
 * watchdog): while it lasts the watchdog does not count. Main thread; not nested. */
void sd_progress_wait_begin(const char *what);
void sd_progress_wait_end(void);

/* Around every MPI call (SD_MPI_CHECK): `call` the statement's text, whose function name is
 * reported. Nested marks keep the outermost (a polled wait around its tests); one thread's call
 * is kept at a time; leaving is no tick. */
void sd_progress_mpi_enter(const char *call, const char *file, int line);
void sd_progress_mpi_leave(void);

/* Around a file-system call that may block for long (pread/pwrite of a block, fsync, a wait for
 * writeback): `call` a literal ("fsync"), `fd` the descriptor, whose path the report looks up
 * (/proc/self/fd) only when it is made. Each thread's call has a slot of its own (64 of them; a
 * thread that finds none free goes unmarked), and the report names the oldest call (the one
 * most likely stuck) and counts the others; nested marks keep the outermost; leaving is no
 * tick. A rank stuck inside one gets no grace: it is the rank that is stuck. */
void sd_progress_io_enter(const char *call, int fd);
/* The same for a call on a path that has no descriptor yet or none at all (open, H5Fopen,
 * rename): the path (its first 511 bytes) is copied into the slot, so it need not outlive the
 * call. */
void sd_progress_io_enter_path(const char *call, const char *path);
void sd_progress_io_leave(void);

/* Called once, from the watchdog's thread, when the rank has made no progress for the timeout
 * (plus the grace inside MPI). `message` describes the stall in one line. The job's handler
 * ends the process; a handler that returns ends the watch. */
typedef void (*sd_stall_fn)(const char *message, void *user);

/* Starts watching from the calling thread, which becomes the main thread of the marks above.
 * timeout_s <= 0: the thread only answers report requests, never ends the job. grace_s < 0
 * picks the default (a tenth of the timeout, 2 to 300 s). `setting` names the setting in the
 * message (e.g. "&run stall_timeout"). Returns 0, or -1 when the thread cannot be started
 * (errno set). */
int sd_watchdog_start(double timeout_s, double grace_s, const char *setting, sd_stall_fn fn,
                      void *user);
/* Async-signal-safe (sdtrain's SIGUSR2 handler): the watchdog thread prints, within a second,
 * "[rank r] [t] progress: its work: PHASE N (for T), inside CALL at FILE:LINE for T | outside
 * MPI[, in CALL of 'PATH' for T]; the last progress T ago" on stderr; the job goes on. */
void sd_progress_report_request(void);

/* Stops the watch and joins its thread (no-op when none runs). */
void sd_watchdog_stop(void);

/* The grace a rank inside MPI gets for a timeout (what grace_s < 0 chooses). */
double sd_watchdog_default_grace(double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
