/* Small file-system helpers shared by the programs and the writers of files. */
#ifndef SDTRAIN_FSUTIL_H
#define SDTRAIN_FSUTIL_H

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mkdir -p: creates `path` and any missing parents. `what` names the directory in messages
 * ("directory", "shard directory"): "cannot create <what> '<prefix>': <reason>". */
int sd_mkdir_p(const char *path, const char *what, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
