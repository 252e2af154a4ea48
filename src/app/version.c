/* Version strings and launcher-rank detection shared by sdtrain and sdtool. */
#include "sd_config.h"

#include "sdtrain/version.h"

#include <stdio.h>
#include <stdlib.h>

#include "sd_revision.h"
#include "sdtrain/device.h"

const char *sd_version(void) { return PACKAGE_VERSION; }
const char *sd_git_revision(void) { return SD_GIT_REVISION; }

void sd_print_version(const char *program)
{
    printf("%s %s (git %s)\n", program, sd_version(), sd_git_revision());
    printf("features: %s\n", sd_build_features());
}

int sd_launcher_rank(void)
{
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return atoi(v);
    }
    return 0;
}
