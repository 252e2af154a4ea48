#include "sdtrain/commands.h"
#include "sdtrain/error.h"
int sd_cmd_score_demo(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return SD_EXIT_NOT_IMPLEMENTED;
}
