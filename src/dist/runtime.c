/* MPI start-up, communicator split by role and node, and MPI error handling. */
#include "sdtrain/runtime.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/checkpoint.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/log.h"

const char *sd_role_name(sd_role r)
{
    switch (r) {
    case SD_ROLE_PROCESS: return "preprocess";
    case SD_ROLE_TRAIN: return "train";
    case SD_ROLE_SAMPLE: return "sample";
    }
    return "?";
}

int sd_layout_compute(const sd_config *c, int world_size, sd_layout *out, sd_err *err)
{
    const char *m = c->run.mode;
    out->world_size = world_size;
    if (world_size < 1)
        return sd_err_set(err, "the job needs at least one rank (got %d)", world_size);
    if (!strcmp(m, "process")) {
        out->n_process = world_size;
        out->n_train = 0;
    } else if (!strcmp(m, "train") || !strcmp(m, "sample")) {
        out->n_process = 0;
        out->n_train = world_size;
    } else if (!strcmp(m, "pipeline")) {
        if (c->run.n_process_ranks >= world_size)
            return sd_err_set(err,
                              "mode = 'pipeline' with n_process_ranks = %lld needs at least %lld "
                              "ranks (one or more must train), but the job has %d: start more ranks "
                              "or lower &run n_process_ranks",
                              (long long)c->run.n_process_ranks, (long long)c->run.n_process_ranks + 1,
                              world_size);
        out->n_process = (int)c->run.n_process_ranks;
        out->n_train = world_size - out->n_process;
    } else {
        return sd_err_set(err, "unknown mode '%s'", m);
    }
    return 0;
}

sd_role sd_layout_role(const sd_config *c, const sd_layout *l, int world_rank)
{
    if (world_rank < l->n_process)
        return SD_ROLE_PROCESS;
    return strcmp(c->run.mode, "sample") == 0 ? SD_ROLE_SAMPLE : SD_ROLE_TRAIN;
}

static void mpi_abort_handler(int exit_code)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) {
        /* From any thread: a fatal error on the main thread of mode 'process' may come while its
         * shard writer is inside a collective (outside MPI_THREAD_SERIALIZED's rule, but the job
         * ends either way). MPI_Abort does not return; if it did, no exit handler (HDF5's among
         * them) may run beside a thread still in the library. */
        MPI_Abort(MPI_COMM_WORLD, exit_code);
        _exit(exit_code);
    }
    exit(exit_code);
}

void sd_fatal_mpi(const char *file, int line, const char *func, const char *stmt, int code)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error %d", code);
    sd_fatal_report(file, line, func, stmt, msg, NULL);
}

void sd_mpi_start(int *argc, char ***argv)
{
    int provided, rank, size;
    /* SERIALIZED: one thread of a rank at a time calls MPI. That is the main thread, except for
     * mode 'process''s shard writer (src/app/mode_process.c), which writes a shard while the
     * main thread, making no MPI call meanwhile, encodes the next; helper threads (decode,
     * prefetch) hand their results to the main thread. */
    /* Open MPI's OMPIO names a POSIX semaphore after every file it opens (its sharedfp/sm
     * component: /dev/shm/sem.OMPIO_<base name>, e.g. OMPIO_state.h5); one left at 0 by a
     * process killed during an open makes every later open of a file of that name on that node
     * wait forever. sdtrain never uses shared file pointers, so that component is left out,
     * unless the user chose the components (OMPI_MCA_sharedfp set). */
    setenv("OMPI_MCA_sharedfp", "^sm", 0);
    SD_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    /* Errors come back as codes to SD_MPI_CHECK, which reports them and aborts the job. */
    SD_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    sd_log_init(rank, size);
    sd_set_abort_handler(mpi_abort_handler);
    if (provided < MPI_THREAD_FUNNELED)
        sd_warn("the MPI library provides thread level %d < MPI_THREAD_FUNNELED", provided);
}

int sd_mpi_serialized(void)
{
    int provided = MPI_THREAD_SINGLE;
    SD_MPI_CHECK(MPI_Query_thread(&provided));
    return provided >= MPI_THREAD_SERIALIZED;
}

int sd_any_failed(int failed)
{
    int any = 0, mine = failed != 0;
    SD_MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD));
    return any;
}

int sd_device_mix(MPI_Comm comm, int on_gpu, const char *notice, char *why, size_t why_size)
{
    int rank, kinds[2] = {on_gpu != 0, on_gpu == 0}, all[2], cand, first;
    char buf[512];
    SD_MPI_CHECK(MPI_Allreduce(kinds, all, 2, MPI_INT, MPI_MAX, comm));
    if (!all[0] || !all[1])
        return -1;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    cand = on_gpu ? INT_MAX : rank;
    SD_MPI_CHECK(MPI_Allreduce(&cand, &first, 1, MPI_INT, MPI_MIN, comm));
    snprintf(buf, sizeof buf, "%s", notice);
    SD_MPI_CHECK(MPI_Bcast(buf, (int)sizeof buf, MPI_CHAR, first, comm));
    snprintf(why, why_size, "%s", buf);
    return first;
}

int sd_agree(MPI_Comm comm, int failed, sd_err *err)
{
    int rank, size, mine, first;
    struct {
        char msg[sizeof err->msg];
        int storage;
    } what;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    mine = failed ? rank : size;
    SD_MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
    if (first == size)
        return 0;
    if (rank == first) {
        snprintf(what.msg, sizeof what.msg, "%s", err->msg[0] ? err->msg : "unknown error");
        what.storage = err->storage;
    }
    SD_MPI_CHECK(MPI_Bcast(&what, (int)sizeof what, MPI_BYTE, first, comm));
    snprintf(err->msg, sizeof err->msg, "%s", what.msg);
    err->storage = what.storage;
    return -1;
}

void sd_mpi_wait_idle_at(MPI_Request *req, const char *file, int line)
{
    long ns = 1000000;
    sd_progress_mpi_enter("MPI_Wait, polled", file, line);
    for (;;) {
        int done = 0;
        struct timespec ts;
        SD_MPI_CHECK(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) {
            sd_progress_mpi_leave();
            return;
        }
        ts.tv_sec = 0;
        ts.tv_nsec = ns;
        nanosleep(&ts, NULL);
        if (ns < 50000000)
            ns *= 2;
    }
}

void sd_pipeline_send_plan(const sd_runtime *rt, const sd_pipeline_plan *plan)
{
    int64_t msg[2] = {plan->n_shards, plan->max_samples};
    if (rt->role != SD_ROLE_PROCESS || rt->role_rank != 0 || rt->layout.n_train == 0)
        return;
    SD_MPI_CHECK(MPI_Send(msg, 2, MPI_INT64_T, rt->layout.n_process, SD_PIPELINE_PLAN_TAG,
                          MPI_COMM_WORLD));
}

void sd_pipeline_send_trained(const sd_runtime *rt)
{
    if (rt->role != SD_ROLE_TRAIN || rt->role_rank != 0 || rt->layout.n_process == 0)
        return;
    SD_MPI_CHECK(MPI_Send(NULL, 0, MPI_BYTE, 0, SD_PIPELINE_TRAINED_TAG, MPI_COMM_WORLD));
}

void sd_pipeline_trained_listen(const sd_runtime *rt, MPI_Request *req)
{
    *req = MPI_REQUEST_NULL;
    if (rt->role != SD_ROLE_PROCESS || rt->role_rank != 0 || rt->layout.n_train == 0)
        return;
    SD_MPI_CHECK(MPI_Irecv(NULL, 0, MPI_BYTE, rt->layout.n_process, SD_PIPELINE_TRAINED_TAG,
                           MPI_COMM_WORLD, req));
}

int sd_pipeline_trained(const sd_runtime *rt, MPI_Request *req)
{
    int flag = 0;
    if (rt->role != SD_ROLE_PROCESS || rt->layout.n_train == 0)
        return 0;
    if (rt->role_rank == 0 && *req != MPI_REQUEST_NULL)
        SD_MPI_CHECK(MPI_Test(req, &flag, MPI_STATUS_IGNORE));
    SD_MPI_CHECK(MPI_Bcast(&flag, 1, MPI_INT, 0, rt->role_comm));
    return flag;
}

/* The stop word's receive on rank 0 of a half (runtime.h); one pipeline job a process. */
static struct {
    int listening;     /* the receive was posted (req is valid until closed) */
    MPI_Request req;
    int word;          /* its buffer: the other half's signal */
    int heard;         /* the word came: word holds it */
    int told;          /* this half's word was sent */
} stop_word;

/* World rank of the other half's rank 0, for a rank 0 of a pipeline job's half; else -1. */
static int stop_peer(const sd_runtime *rt)
{
    if (rt->role_rank != 0 || rt->layout.n_process == 0 || rt->layout.n_train == 0)
        return -1;
    if (rt->role == SD_ROLE_PROCESS)
        return rt->layout.n_process;
    return rt->role == SD_ROLE_TRAIN ? 0 : -1;
}

void sd_pipeline_stop_listen(const sd_runtime *rt)
{
    const int peer = stop_peer(rt);
    if (peer < 0 || stop_word.listening)
        return;
    memset(&stop_word, 0, sizeof stop_word);
    SD_MPI_CHECK(MPI_Irecv(&stop_word.word, 1, MPI_INT, peer, SD_PIPELINE_STOP_TAG, MPI_COMM_WORLD,
                           &stop_word.req));
    stop_word.listening = 1;
}

int sd_pipeline_stop_heard(const sd_runtime *rt)
{
    int flag = 0;
    if (stop_peer(rt) < 0 || !stop_word.listening)
        return 0;
    if (!stop_word.heard) {
        SD_MPI_CHECK(MPI_Test(&stop_word.req, &flag, MPI_STATUS_IGNORE));
        stop_word.heard = flag;
    }
    return stop_word.heard ? stop_word.word : 0;
}

int sd_pipeline_stop_tell(const sd_runtime *rt, int sig)
{
    const int peer = stop_peer(rt);
    if (peer < 0 || !stop_word.listening || stop_word.told || sd_pipeline_stop_heard(rt))
        return 0;
    /* the other half's rank 0 posted its receive before its half started: no wait here */
    SD_MPI_CHECK(MPI_Send(&sig, 1, MPI_INT, peer, SD_PIPELINE_STOP_TAG, MPI_COMM_WORLD));
    stop_word.told = 1;
    return 1;
}

int sd_pipeline_wait_watching(const sd_runtime *rt, MPI_Request *req)
{
    int told = 0;
    for (;;) {
        int mine[2] = {0, sd_ckpt_signal_pending()}, all[2];
        MPI_Request round;
        const struct timespec pause = {0, 200000000};
        SD_MPI_CHECK(MPI_Test(req, &mine[0], MPI_STATUS_IGNORE)); /* MPI_REQUEST_NULL: 1 */
        mine[0] = !mine[0];
        SD_MPI_CHECK(MPI_Iallreduce(mine, all, 2, MPI_INT, MPI_MAX, rt->role_comm, &round));
        sd_mpi_wait_idle(&round);
        if (all[1] && sd_pipeline_stop_tell(rt, all[1]))
            told = all[1];
        if (!all[0])
            return told;
        nanosleep(&pause, NULL);
    }
}

void sd_pipeline_stop_close(const sd_runtime *rt)
{
    /* [0]: preprocessing rank 0 sent its word; [1]: training rank 0 did */
    int told[2] = {0, 0}, all[2];
    const int me = rt->role == SD_ROLE_PROCESS ? 0 : 1;
    if (rt->layout.n_process == 0 || rt->layout.n_train == 0)
        return;
    if (stop_peer(rt) >= 0)
        told[me] = stop_word.told;
    SD_MPI_CHECK(MPI_Allreduce(told, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (stop_peer(rt) < 0 || !stop_word.listening)
        return;
    if (!stop_word.heard) {
        /* a word sent was sent before the reduction: it comes; none will come otherwise */
        if (!all[1 - me])
            SD_MPI_CHECK(MPI_Cancel(&stop_word.req));
        SD_MPI_CHECK(MPI_Wait(&stop_word.req, MPI_STATUS_IGNORE));
    }
    stop_word.listening = 0;
}

void sd_runtime_split(const sd_config *c, const sd_layout *layout, sd_runtime *rt)
{
    int leader, n_nodes = 0;
    memset(rt, 0, sizeof *rt);
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rt->world_rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &rt->world_size));
    SD_CHECK(rt->world_size == layout->world_size, "layout computed for %d ranks, job has %d",
             layout->world_size, rt->world_size);
    rt->layout = *layout;
    rt->role = sd_layout_role(c, layout, rt->world_rank);
    /* Key = world rank keeps the order of ranks inside each side. */
    SD_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, rt->role == SD_ROLE_PROCESS ? 0 : 1, rt->world_rank,
                                &rt->role_comm));
    SD_MPI_CHECK(MPI_Comm_set_errhandler(rt->role_comm, MPI_ERRORS_RETURN));
    SD_MPI_CHECK(MPI_Comm_rank(rt->role_comm, &rt->role_rank));
    SD_MPI_CHECK(MPI_Comm_size(rt->role_comm, &rt->role_size));
    SD_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rt->world_rank,
                                     MPI_INFO_NULL, &rt->node_comm));
    SD_MPI_CHECK(MPI_Comm_rank(rt->node_comm, &rt->node_rank));
    SD_MPI_CHECK(MPI_Comm_size(rt->node_comm, &rt->node_size));
    leader = rt->node_rank == 0;
    SD_MPI_CHECK(MPI_Allreduce(&leader, &n_nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    rt->n_nodes = n_nodes;
    if (gethostname(rt->hostname, sizeof rt->hostname - 1) != 0)
        snprintf(rt->hostname, sizeof rt->hostname, "unknown");
}

void sd_bcast_bytes(void *buf, size_t bytes, MPI_Comm comm)
{
    for (size_t off = 0; off < bytes; off += (size_t)1 << 30) {
        const size_t n = bytes - off < ((size_t)1 << 30) ? bytes - off : ((size_t)1 << 30);
        SD_MPI_CHECK(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, 0, comm));
    }
}

/* Whether the file system that will hold a shared window of `size` bytes (Open MPI's
 * osc_sm_backing_directory, else /dev/shm, where MPICH's and Open MPI's windows live on Linux)
 * lacks the room, with why: the window plus a sixteenth and 1 MiB to spare (the MPI's own
 * segments were made at start-up). A /dev/shm that is not there says nothing: the MPI then puts
 * the window elsewhere. */
static int shm_lacks_room(size_t size, sd_err *why)
{
    const char *dir = getenv("OMPI_MCA_osc_sm_backing_directory");
    const int named = dir && *dir;
    const double need = (double)size + (double)(size / 16) + 1048576.0;
    double avail;
    if (!named)
        dir = "/dev/shm";
    if ((avail = sd_fs_free_bytes(dir)) < 0) {
        if (named)
            sd_err_set(why, "%s: %s", dir, strerror(errno));
        return named;
    }
    if (avail >= need)
        return 0;
    sd_err_set(why, "%s has %.1f MiB free, the window needs %.1f MiB with some to spare", dir,
               avail / (1 << 20), need / (1 << 20));
    return 1;
}

int sd_node_buffer_alloc(MPI_Comm comm, size_t size, int try_shared, sd_node_buffer *b,
                         sd_err *why)
{
    int rank, want;
    memset(b, 0, sizeof *b);
    b->size = size;
    b->win = MPI_WIN_NULL;
    sd_err_clear(why);
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    /* keyed by rank: comm's rank 0 is its node's leader and rank 0 among the leaders */
    SD_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &b->node_comm));
    SD_MPI_CHECK(MPI_Comm_rank(b->node_comm, &b->node_rank));
    SD_MPI_CHECK(MPI_Comm_size(b->node_comm, &b->node_size));
    SD_MPI_CHECK(MPI_Comm_split(comm, b->node_rank == 0 ? 0 : MPI_UNDEFINED, rank, &b->leader_comm));
    /* the node's ranks try together or not at all: the allocation is collective */
    want = try_shared && b->node_size > 1 && size > 0;
    SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_INT, MPI_MIN, b->node_comm));
    if (!want && b->node_size > 1)
        sd_err_set(why, size > 0 ? "shared memory switched off" : "nothing to share");
    /* Open MPI 4.1 leaves the node's other ranks waiting forever in MPI_Win_allocate_shared when
     * its leader cannot make the window's file (osc/sm broadcasts the segment only on success),
     * so what makes it fail most often, a shared-memory file system without room for it (a
     * container's 64 MiB /dev/shm), is checked before the call (a check of a moment: what fills
     * the file system afterwards still fails the call) */
    if (want)
        want = sd_agree(b->node_comm, b->node_rank == 0 && shm_lacks_room(size, why), why) == 0;
    if (want) {
        MPI_Win win = MPI_WIN_NULL;
        void *base = NULL;
        /* comm inherits MPI_ERRORS_RETURN from MPI_COMM_WORLD (sd_mpi_start): a failed
         * allocation comes back as a code */
        int rc = MPI_Win_allocate_shared(b->node_rank == 0 ? (MPI_Aint)size : 0, 1, MPI_INFO_NULL,
                                         b->node_comm, &base, &win);
        int got[2] = {rc == MPI_SUCCESS, 0}; /* a window; its leader's bytes in reach */
        if (got[0] && b->node_rank != 0) {
            MPI_Aint sz = 0;
            int unit = 0;
            rc = MPI_Win_shared_query(win, 0, &sz, &unit, &base);
            got[1] = rc == MPI_SUCCESS && (size_t)sz == size && base != NULL;
        } else
            got[1] = got[0] && base != NULL;
        if (!got[1]) {
            char msg[MPI_MAX_ERROR_STRING] = "a window of another size";
            int len = 0;
            if (rc != MPI_SUCCESS && MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
                snprintf(msg, sizeof msg, "MPI error %d", rc);
            sd_err_set(why, "MPI_Win_allocate_shared of %zu bytes: %s", size, msg);
        }
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, got, 2, MPI_INT, MPI_MIN, b->node_comm));
        if (got[1]) {
            b->win = win;
            b->data = base;
            b->shared = 1;
            SD_MPI_CHECK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
            /* one passive epoch for the window's life: what MPI_Win_sync needs */
            SD_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
        } else {
            /* every rank of the node holds a window it cannot use: give it back; a window on
             * some ranks only is left (freeing it would wait for the others forever) */
            if (got[0])
                SD_MPI_CHECK(MPI_Win_free(&win));
            if (sd_agree(b->node_comm, why->msg[0] != 0, why) == 0)
                sd_err_set(why, "MPI_Win_allocate_shared of %zu bytes failed", size);
        }
    }
    if (!b->shared)
        b->data = sd_xmalloc(size ? size : 1);
    return b->shared || b->node_size == 1 ? 0 : -1;
}

void sd_node_buffer_publish(sd_node_buffer *b)
{
    if (b->leader_comm != MPI_COMM_NULL)
        sd_bcast_bytes(b->data, b->size, b->leader_comm);
    if (b->shared) {
        /* the leader's stores before the barrier, the others' loads after it */
        SD_MPI_CHECK(MPI_Win_sync(b->win));
        SD_MPI_CHECK(MPI_Barrier(b->node_comm));
        SD_MPI_CHECK(MPI_Win_sync(b->win));
    } else if (b->node_size > 1)
        sd_bcast_bytes(b->data, b->size, b->node_comm);
}

void sd_node_buffer_free(sd_node_buffer *b)
{
    if (!b->data)
        return;
    if (b->shared) {
        SD_MPI_CHECK(MPI_Win_unlock_all(b->win));
        SD_MPI_CHECK(MPI_Win_free(&b->win));
    } else
        free(b->data);
    if (b->leader_comm != MPI_COMM_NULL)
        SD_MPI_CHECK(MPI_Comm_free(&b->leader_comm));
    SD_MPI_CHECK(MPI_Comm_free(&b->node_comm));
    memset(b, 0, sizeof *b);
    b->win = MPI_WIN_NULL;
}

void sd_runtime_report(const sd_runtime *rt)
{
    /* Gather what each rank actually got, so the report shows the real split. */
    int mine[5] = {(int)rt->role, rt->role_rank, rt->role_size, rt->node_rank, rt->node_size};
    int *all = NULL;
    char *hosts = NULL;
    if (rt->world_rank == 0) {
        all = malloc(sizeof(int) * 5 * (size_t)rt->world_size);
        hosts = malloc(64 * (size_t)rt->world_size);
        SD_CHECK(all && hosts, "out of memory for %d ranks", rt->world_size);
    }
    char host[64];
    snprintf(host, sizeof host, "%.63s", rt->hostname);
    SD_MPI_CHECK(MPI_Gather(mine, 5, MPI_INT, all, 5, MPI_INT, 0, MPI_COMM_WORLD));
    SD_MPI_CHECK(MPI_Gather(host, 64, MPI_CHAR, hosts, 64, MPI_CHAR, 0, MPI_COMM_WORLD));
    if (rt->world_rank == 0) {
        int n_proc = 0, n_train = 0;
        for (int r = 0; r < rt->world_size; r++) {
            if (all[5 * r] == SD_ROLE_PROCESS)
                n_proc++;
            else
                n_train++;
        }
        printf("communicators: world %d ranks on %d node(s); preprocessing communicator %d ranks; "
               "training communicator %d ranks\n", rt->world_size, rt->n_nodes, n_proc, n_train);
        printf("  %-6s %-11s %-10s %-24s %s\n", "rank", "role", "role rank", "node", "node rank");
        for (int r = 0; r < rt->world_size; r++) {
            char rr[32], nr[32];
            snprintf(rr, sizeof rr, "%d/%d", all[5 * r + 1], all[5 * r + 2]);
            snprintf(nr, sizeof nr, "%d/%d", all[5 * r + 3], all[5 * r + 4]);
            printf("  %-6d %-11s %-10s %-24.24s %s\n", r, sd_role_name((sd_role)all[5 * r]), rr,
                   hosts + 64 * r, nr);
        }
        fflush(stdout);
    }
    free(all);
    free(hosts);
}

void sd_mpi_finish(sd_runtime *rt)
{
    if (rt) {
        if (rt->role_comm != MPI_COMM_NULL && rt->role_comm != 0)
            MPI_Comm_free(&rt->role_comm);
        if (rt->node_comm != MPI_COMM_NULL && rt->node_comm != 0)
            MPI_Comm_free(&rt->node_comm);
    }
    MPI_Finalize();
}
