/* Fault injection for tests (SDTRAIN_FAULT), e.g. "kill:rank=2:step=7,nan:rank=1:step=5",
 * "kill:rank=1:phase=ckpt-write:step=8" (during the checkpoint of step 8), "usr1:rank=0:step=5",
 * "flip:rank=1:phase=ckpt-write" (a byte of the checkpoint file changed behind the writer's back),
 * "nan:rank=0:phase=encode:step=3" (preprocessing: global sample 3 encodes to NaN),
 * "eio:rank=1:phase=ckpt-load" (reading a checkpoint's state file fails as EIO),
 * "hang:rank=1:step=5" (the rank stops making progress without dying: the stall watchdog's case). */
#ifndef SDTRAIN_FAULT_H
#define SDTRAIN_FAULT_H

#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kill: SIGKILL this rank; nan: a NaN gradient (phase encode: a NaN encoding of sample `step`);
 * usr1: this rank sends itself SIGUSR1 (what Slurm sends ahead of the time limit) at the end of
 * the step (in mode 'process' and a pipeline's preprocessing ranks: once shard `step` is encoded;
 * in mode 'sample': once image `step`, p * images_per_prompt + j, is written;
 * phase shard-wait: when a pipeline's training rank 0 waits for a shard, for the inputs of
 * step `step` or, without a step, at its first wait; phase encode: preprocessing, once global
 * sample `step` is read, in the middle of its shard); flip: silent storage corruption, one bit
 * of the data this rank wrote changed on disk after the write was synced (phase ckpt-write), or
 * of the pretrained U-Net weights this rank read (phase unet-load); eio:
 * the storage fails this rank's read of a checkpoint being resumed (phase ckpt-load); hang: the
 * rank sleeps forever, alive but making no progress (at the start of training step `step` (mode
 * 'sample': before the batch of image `step`), in
 * the middle of a checkpoint write (phase ckpt-write, optionally of step `step`) or of a shard
 * write (phase shard-write)). */
typedef enum {
    SD_FAULT_KILL = 0,
    SD_FAULT_NAN = 1,
    SD_FAULT_USR1 = 2,
    SD_FAULT_FLIP = 3,
    SD_FAULT_EIO = 4,
    SD_FAULT_HANG = 5
} sd_fault_action;

#define SD_FAULT_MAX 8

typedef struct sd_fault {
    sd_fault_action action;
    int rank;            /* world rank that fails */
    int64_t step;        /* training step, or -1 when triggered by phase */
    char phase[32];      /* e.g. "ckpt-write", "ckpt-commit", "shard-commit"; "" when by step */
} sd_fault;

/* Parses a specification: comma-separated faults, each ACTION(:key=value)+ with ACTION kill, nan,
 * usr1, flip, eio or hang and keys rank (required), step, phase (kill: any phase; nan: encode
 * only, step required; usr1: step required, or phase shard-wait, or phase encode with a step;
 * flip: ckpt-write or unet-load, required; eio: ckpt-load only, required; hang: step, ckpt-write
 * or shard-write). Errors name the offending part. */
int sd_fault_parse(const char *spec, sd_fault *faults, int *n, sd_err *err);

/* Reads SDTRAIN_FAULT once at start-up (absent or empty: no faults). */
int sd_fault_init_from_env(sd_err *err);

/* 1 when a fault of `action` is armed for this rank at this step or phase (phase may be NULL). */
int sd_fault_armed(sd_fault_action action, int rank, int64_t step, const char *phase);
/* 1 when such a fault is armed for any rank: the same answer on every rank (all read the same
 * SDTRAIN_FAULT), so a collective step that only a fault needs may depend on it. */
int sd_fault_armed_any_rank(sd_fault_action action, int64_t step, const char *phase);

/* The hang fault's action: reports "[rank R] SDTRAIN_FAULT: this rank stops making progress
 * (where n)" (n < 0: without it) and sleeps forever. */
void sd_fault_hang(int rank, const char *where, int64_t n)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;

/* The phases the code base announces; a specification naming another phase is rejected. */
extern const char *const sd_fault_phases[];

#ifdef __cplusplus
}
#endif
#endif
