/* Tar header scanner: lists each member's name, data offset and size so it can be read by pread. */
#include "sdtrain/tar.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"

#define BLOCK 512
#define READ_CHUNK (1u << 20)
/* Extension headers (pax records, GNU long names) larger than this are taken as damage:
 * real ones hold a path or two. */
#define MAX_EXT_DATA (1u << 20)

typedef struct reader {
    int fd;
    uint64_t file_size;
    unsigned char *buf;
    uint64_t buf_off;
    size_t buf_len;
    int err; /* errno of a failed read, else 0 */
} reader;

/* Bytes [off, off + len) of the file (len <= READ_CHUNK), served from one buffer that is
 * refilled at `off` when it does not hold them. *got < len at the end of the file. */
static const unsigned char *reader_get(reader *r, uint64_t off, size_t len, size_t *got)
{
    if (!(off >= r->buf_off && off + len <= r->buf_off + r->buf_len)) {
        size_t filled = 0;
        if (sd_pio_all(r->fd, r->buf, READ_CHUNK, off, 0, &filled) && errno)
            r->err = errno; /* else the end of the file: filled < READ_CHUNK */
        r->buf_off = off;
        r->buf_len = filled;
    }
    size_t avail = (size_t)(r->buf_off + r->buf_len - off);
    *got = avail < len ? avail : len;
    return r->buf + (off - r->buf_off);
}

const char *sd_tar_compression_name(const unsigned char *b, size_t n)
{
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
        return "gzip";
    if (n >= 3 && b[0] == 'B' && b[1] == 'Z' && b[2] == 'h')
        return "bzip2";
    if (n >= 6 && memcmp(b, "\xfd" "7zXZ\0", 6) == 0)
        return "xz";
    if (n >= 4 && memcmp(b, "\x28\xb5\x2f\xfd", 4) == 0)
        return "zstd";
    if (n >= 4 && memcmp(b, "\x04\x22\x4d\x18", 4) == 0)
        return "lz4";
    return NULL;
}

/* Octal (space/NUL terminated, leading spaces allowed) or GNU base-256 (high bit of the first
 * byte set). Returns 0, or -1 for a malformed or negative value. */
static int parse_number(const unsigned char *f, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    size_t i = 0;
    if (f[0] & 0x80) {
        if (f[0] == 0xff)
            return -1; /* negative base-256 */
        v = f[0] & 0x7f;
        for (i = 1; i < n; i++) {
            if (v > (UINT64_MAX >> 8))
                return -1;
            v = (v << 8) | f[i];
        }
        *out = v;
        return 0;
    }
    while (i < n && (f[i] == ' ' || f[i] == '\0'))
        i++;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
        if (v > (UINT64_MAX >> 3))
            return -1;
        v = (v << 3) | (uint64_t)(f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != ' ' && f[i] != '\0')
            return -1;
    *out = v;
    return 0;
}

/* Sum of the 512 header bytes as unsigned chars: a plain loop the compiler vectorises, which
 * matters because indexing a tar of small members is mostly this sum. */
static uint32_t byte_sum(const unsigned char *h)
{
    uint32_t s = 0;
    for (int i = 0; i < BLOCK; i++)
        s += h[i];
    return s;
}

/* `sum` = byte_sum(h); 0 means an all-zero block (end of archive), tested by the caller. */
static int checksum_ok(const unsigned char *h, uint32_t sum)
{
    uint64_t stored;
    if (parse_number(h + 148, 8, &stored) != 0)
        return 0;
    uint32_t field = 0;
    for (int i = 148; i < 156; i++)
        field += h[i];
    uint32_t usum = sum - field + 8 * ' ';
    if (stored == usum)
        return 1;
    /* Some old writers summed signed chars. */
    long ssum = 8 * ' ';
    for (int i = 0; i < BLOCK; i++)
        if (i < 148 || i >= 156)
            ssum += (signed char)h[i];
    return (long)stored == ssum;
}

static uint64_t round_block(uint64_t n)
{
    return (n + BLOCK - 1) / BLOCK * BLOCK;
}

typedef struct pending {
    char *path;        /* pax 'path' or GNU long name, malloc'd */
    char *sparse_name; /* pax 'GNU.sparse.name': the real name of a sparse member whose 'path'
                          is GNU tar's ./GNUSparseFile.PID/NAME (formats 0.1, 1.0); malloc'd */
    int have_size;
    uint64_t size;     /* pax 'size' */
    int sparse;        /* pax GNU.sparse.* seen */
} pending;

static void pending_clear(pending *p)
{
    free(p->path);
    free(p->sparse_name);
    memset(p, 0, sizeof *p);
}

static void set_str(char **dst, const char *val, size_t vlen)
{
    free(*dst);
    *dst = sd_xmalloc(vlen + 1);
    memcpy(*dst, val, vlen);
    (*dst)[vlen] = '\0';
}

/* Parses pax records "LEN key=value\n" (LEN counts the whole record). Returns 0 or -1. */
static int parse_pax(const unsigned char *d, size_t n, pending *p)
{
    size_t i = 0;
    while (i < n) {
        if (d[i] == '\0')
            break; /* padding some writers leave */
        size_t len = 0, j = i;
        while (j < n && d[j] >= '0' && d[j] <= '9') {
            len = len * 10 + (size_t)(d[j] - '0');
            if (len > n)
                return -1;
            j++;
        }
        if (j == i || j >= n || d[j] != ' ' || len < 5 || i + len > n || d[i + len - 1] != '\n')
            return -1;
        const unsigned char *kv = d + j + 1, *end = d + i + len - 1;
        const unsigned char *eq = memchr(kv, '=', (size_t)(end - kv));
        if (!eq)
            return -1;
        size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
        const char *val = (const char *)eq + 1;
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            set_str(&p->path, val, vlen);
        } else if (klen == 15 && memcmp(kv, "GNU.sparse.name", 15) == 0) {
            set_str(&p->sparse_name, val, vlen); /* wins over 'path', as in Python's tarfile */
            p->sparse = 1;
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19)
                return -1;
            for (size_t k = 0; k < vlen; k++) {
                if (val[k] < '0' || val[k] > '9')
                    return -1;
                v = v * 10 + (uint64_t)(val[k] - '0');
            }
            p->have_size = 1;
            p->size = v;
        } else if (klen > 11 && memcmp(kv, "GNU.sparse.", 11) == 0) {
            p->sparse = 1;
        }
        i += len;
    }
    return 0;
}

int sd_tar_scan(const char *path, sd_tar_member_fn fn, void *ctx, sd_err *err)
{
    reader r = {0};
    pending pend = {0};
    struct stat st = {0};
    char *ustar_name = NULL;
    int rc = SD_TAR_OK;

    r.fd = sd_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0); /* a FIFO: refused below, not waited on */
    if (r.fd < 0) { /* marked a storage failure where it is one, not the tar's */
        sd_err_input_errno(err, errno, "%s", path);
        return SD_TAR_UNREADABLE;
    }
    int stat_errno = sd_fstat(r.fd, &st) != 0 ? errno : 0;
    if (stat_errno || !S_ISREG(st.st_mode)) {
        sd_err_set(err, "%s: %s", path, stat_errno ? strerror(stat_errno) : "not a regular file");
        if (sd_input_storage_errno(stat_errno))
            sd_err_storage_errno(err, stat_errno);
        close(r.fd);
        return SD_TAR_UNREADABLE;
    }
    r.file_size = (uint64_t)st.st_size;
    r.buf = sd_xmalloc(READ_CHUNK);
    ustar_name = sd_xmalloc(100 + 1 + 155 + 1);

    uint64_t off = 0, member_start = 0;
    for (;;) {
        size_t got;
        if (off >= r.file_size)
            break; /* no end-of-archive blocks: accepted, as GNU tar does */
        const unsigned char *h = reader_get(&r, off, BLOCK, &got);
        if (got < BLOCK) {
            if (r.err)
                sd_err_input_errno(err, r.err, "%s: read error at offset %" PRIu64, path, off);
            else
                sd_err_set(err, "%s: truncated tar header at offset %" PRIu64 " (%zu of 512 bytes)",
                           path, off, got);
            rc = off == 0 && r.err ? SD_TAR_UNREADABLE : SD_TAR_DAMAGED;
            break;
        }
        if (off == 0) {
            const char *comp = sd_tar_compression_name(h, BLOCK);
            if (comp) {
                sd_err_set(err, "%s: %s-compressed data; shards must be uncompressed .tar files so that "
                           "a member can be read by offset (decompress it first)", path, comp);
                rc = SD_TAR_COMPRESSED;
                break;
            }
        }
        uint32_t sum = byte_sum(h);
        if (sum == 0)
            break; /* an all-zero block: end-of-archive marker */
        if (!checksum_ok(h, sum)) {
            sd_err_set(err, "%s: bad tar header checksum at offset %" PRIu64 "%s", path, off,
                       off == 0 ? " (not a tar file?)" : " (damaged archive)");
            rc = SD_TAR_DAMAGED;
            break;
        }
        uint64_t size;
        if (parse_number(h + 124, 12, &size) != 0) {
            sd_err_set(err, "%s: bad size field in the tar header at offset %" PRIu64, path, off);
            rc = SD_TAR_DAMAGED;
            break;
        }
        char type = (char)h[156];
        uint64_t data = off + BLOCK;

        if (type == 'x' || type == 'L') {
            if (size > MAX_EXT_DATA) {
                sd_err_set(err, "%s: %s header of %" PRIu64 " bytes at offset %" PRIu64 " (damaged archive?)",
                           path, type == 'x' ? "pax" : "GNU long-name", size, off);
                rc = SD_TAR_DAMAGED;
                break;
            }
            const unsigned char *d = reader_get(&r, data, (size_t)size, &got);
            if (got < size) {
                sd_err_set(err, "%s: truncated %s header at offset %" PRIu64, path,
                           type == 'x' ? "pax" : "GNU long-name", off);
                rc = SD_TAR_DAMAGED;
                break;
            }
            if (type == 'x') {
                if (parse_pax(d, (size_t)size, &pend) != 0) {
                    sd_err_set(err, "%s: malformed pax header at offset %" PRIu64, path, off);
                    rc = SD_TAR_DAMAGED;
                    break;
                }
            } else {
                size_t len = strnlen((const char *)d, (size_t)size);
                free(pend.path);
                pend.path = sd_xmalloc(len + 1);
                memcpy(pend.path, d, len);
                pend.path[len] = '\0';
            }
            off = data + round_block(size);
            continue;
        }
        if (type == 'K') { /* GNU long link target: not needed */
            off = data + round_block(size);
            continue;
        }
        if (type == 'g') { /* pax global header: applies to no one member */
            off = data + round_block(size);
            member_start = off;
            continue;
        }

        /* Old GNU sparse members carry extra blocks of sparse map before the data. */
        if (type == 'S' && h[482]) {
            const unsigned char *x;
            do {
                x = reader_get(&r, data, BLOCK, &got);
                if (got < BLOCK)
                    break;
                data += BLOCK;
            } while (x[504]);
            if (got < BLOCK) {
                sd_err_set(err, "%s: truncated sparse map at offset %" PRIu64, path, data);
                rc = SD_TAR_DAMAGED;
                break;
            }
        }

        /* Links, devices, fifos and directories have no data blocks whatever size says. */
        if (type == '2' || type == '3' || type == '4' || type == '5' || type == '6')
            size = 0;
        if (pend.have_size)
            size = pend.size;
        if (size > UINT64_MAX - data - BLOCK) {
            sd_err_set(err, "%s: impossible member size %" PRIu64 " at offset %" PRIu64, path, size, off);
            rc = SD_TAR_DAMAGED;
            break;
        }

        sd_tar_member m;
        memset(&m, 0, sizeof m);
        if (pend.sparse_name) {
            m.name = pend.sparse_name;
        } else if (pend.path) {
            m.name = pend.path;
        } else {
            size_t nlen = strnlen((const char *)h, 100), plen = 0;
            if (memcmp(h + 257, "ustar\0", 6) == 0)
                plen = strnlen((const char *)h + 345, 155);
            size_t k = 0;
            if (plen) {
                memcpy(ustar_name, h + 345, plen);
                k = plen;
                ustar_name[k++] = '/';
            }
            memcpy(ustar_name + k, h, nlen);
            ustar_name[k + nlen] = '\0';
            m.name = ustar_name;
        }
        m.name_len = strlen(m.name);
        m.type = (type == '\0' || type == '7' || type == 'S') ? '0' : type;
        m.header_offset = member_start;
        m.data_offset = data;
        m.size = size;
        m.truncated = data + size > r.file_size;
        m.sparse = type == 'S' || pend.sparse;
        int stop = fn ? fn(&m, ctx) : 0;
        if (m.truncated) {
            /* before pending_clear: m.name may be the pax / GNU long name it frees */
            sd_err_set(err, "%s: member '%s' is truncated: %" PRIu64 " of %" PRIu64 " bytes present",
                       path, m.name, data < r.file_size ? r.file_size - data : 0, size);
            rc = SD_TAR_DAMAGED;
            break;
        }
        pending_clear(&pend);
        if (stop) {
            rc = SD_TAR_STOPPED;
            break;
        }
        off = data + round_block(size);
        member_start = off;
    }
    pending_clear(&pend);
    free(ustar_name);
    free(r.buf);
    close(r.fd);
    return rc;
}
