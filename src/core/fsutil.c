/* File-system helpers: mkdir -p with a message that names the directory. */
#include "sdtrain/fsutil.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

int sd_mkdir_p(const char *path, const char *what, sd_err *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return sd_err_set(err, "invalid %s '%s'", what, path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return sd_err_set(err, "cannot create %s '%s': %s", what, buf, strerror(errno));
            buf[i] = saved;
        }
    }
    return 0;
}
