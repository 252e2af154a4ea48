/* The work of each sdtrain mode, run by every rank after the configuration and the
 * communicators are set up. Each returns an exit code agreed by all ranks of the job. */
#ifndef SDTRAIN_MODES_H
#define SDTRAIN_MODES_H

#include "sdtrain/config.h"
#include "sdtrain/device.h"
#include "sdtrain/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* &run mode = 'process': every rank of the preprocessing communicator reads its part of the
 * dataset, decodes and transforms images, tokenizes captions, encodes both with the VAE and
 * the text encoder and writes latent shards collectively. Committed shards are skipped, so a
 * rerun continues a killed job. */
int sd_mode_process(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev);
/* &run mode = 'train' on the training communicator: 0 done, 1 failure, 2 bad input. */
int sd_mode_train(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev);
/* &run mode = 'sample': every rank of MPI_COMM_WORLD generates its share of the images of
 * &sample prompts (doc/sampling.md): 0 done, 1 failure, 2 bad input. */
int sd_mode_sample(const sd_run_config *rc, const sd_runtime *rt, const sd_device_info *dev);
/* Mode 'sample' over the ranks of `comm` (rank of size): what sd_mode_sample runs on
 * MPI_COMM_WORLD, and mode 'train' on its training ranks for &sample every_n_steps. With
 * `stoppable` a caught SIGUSR1 / SIGTERM stops each rank before its next batch (mode 'sample');
 * without, the images are all made (a training job stops after them). Returns an exit status;
 * rank 0 has reported a failure. */
int sd_sample_images(const sd_run_config *rc, MPI_Comm comm, int rank, int size,
                     const sd_device_info *dev, int stoppable);
/* The checkpoint root of the training output directory `run_dir` into root: the run's
 * &checkpoint dir, read from the namelist `nml` (NULL: run_dir/used.nml, when there), when it
 * set one and that folder exists here, else run_dir/checkpoints. For mode 'sample' and sdtool
 * export, which take a training output directory as their source. */
void sd_run_checkpoint_root(const char *run_dir, const char *nml, char *root, size_t size);

#ifdef __cplusplus
}
#endif
#endif
