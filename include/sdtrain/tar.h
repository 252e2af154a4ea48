/* Tar header scanner: lists each member's name, data offset and size so it can be read by pread. */
#ifndef SDTRAIN_TAR_H
#define SDTRAIN_TAR_H

/*
 * Why not libarchive for this: the dataset index needs the exact byte offset of each member's
 * data in the file, so that any rank can later pread one member without scanning the tar.
 * libarchive exposes the header position (archive_read_header_position) but the data offset
 * only indirectly (archive_filter_bytes after the header, which is "bytes consumed so far", a
 * property of its tar reader rather than a promise of its API), and it hides which member a
 * pax or GNU long-name header belongs to. Here the offset is exact by construction: the data
 * starts right after the member's last header block. The scanner reads headers sequentially
 * through a 1 MiB buffer and jumps over large members, so indexing costs about one read of the
 * headers. The tests compare every offset and every member's bytes with libarchive's reading.
 *
 * Understood: POSIX ustar (name + prefix), pax extended headers ('x': path, size; 'g' global
 * headers are skipped), GNU long names ('L', 'K'), base-256 sizes, v7 headers without magic.
 * Members that cannot be read by offset (GNU sparse 'S', pax GNU.sparse.*) are reported with
 * `sparse` set. Compressed archives (gzip, bzip2, xz, zstd, lz4) are recognised by their magic
 * bytes and rejected: a compressed member cannot be reached without decompressing all before it.
 */

#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_tar_member {
    const char *name;        /* NUL-terminated; valid only during the callback */
    size_t name_len;
    char type;               /* typeflag: '0' regular file ('\0', '7' and GNU sparse 'S' are
                                reported as '0'; see `sparse`),
                                '1' hard link, '2' symlink, '5' directory, ... */
    uint64_t header_offset;  /* first header block of the member (pax/long-name ones included) */
    uint64_t data_offset;    /* first byte of the member's data */
    uint64_t size;           /* bytes of data */
    int truncated;           /* the file ends before data_offset + size */
    int sparse;              /* GNU sparse member: data is not stored contiguously */
} sd_tar_member;

/* Called for each member in archive order; a non-zero return stops the scan (sd_tar_scan then
 * returns SD_TAR_STOPPED). */
typedef int (*sd_tar_member_fn)(const sd_tar_member *m, void *ctx);

enum {
    SD_TAR_OK = 0,          /* read to the end-of-archive blocks or to the exact end of file */
    SD_TAR_STOPPED = 1,     /* the callback asked to stop */
    SD_TAR_DAMAGED = 2,     /* members up to a bad or truncated header were reported; err says where */
    SD_TAR_UNREADABLE = -1, /* cannot open or read the file (err has strerror) */
    SD_TAR_COMPRESSED = -2  /* gzip/bzip2/xz/zstd/lz4 data, not a plain tar */
};

/* Scans the tar at `path`. A member whose data runs past the end of the file is reported
 * once with truncated = 1, and the scan then ends with SD_TAR_DAMAGED. An empty file is an
 * empty archive. Returns one of the codes above. */
int sd_tar_scan(const char *path, sd_tar_member_fn fn, void *ctx, sd_err *err);

/* Name of the compression whose magic bytes start buf[0..n), or NULL. */
const char *sd_tar_compression_name(const unsigned char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
