/* Version, git revision and compiled-in features, for --version and file attributes. */
#ifndef SDTRAIN_VERSION_H
#define SDTRAIN_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

const char *sd_version(void);       /* "0.1.0" */
const char *sd_git_revision(void);  /* `git describe --always --dirty`, or "unknown" */
/* Prints "<program> <version> (git <rev>)" and the features line to stdout. */
void sd_print_version(const char *program);

/* The rank this process will have, read from the launcher's environment before MPI starts
 * (Open MPI, PMIx, PMI, Slurm); 0 when not launched by one. Lets --help print once. */
int sd_launcher_rank(void);

#ifdef __cplusplus
}
#endif
#endif
