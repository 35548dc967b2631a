/* rn/fileio.h: whole-file reads and atomic writes.
 *
 * Atomic write: the bytes go to "PATH.tmp", are fsync'ed, renamed over PATH and the
 * directory is fsync'ed, so a killed tool leaves either the old PATH or the new one,
 * never a half-written file. The path "-" means stdout (write) or stdin (read). */
#ifndef RN_FILEIO_H
#define RN_FILEIO_H

#include <stddef.h>
#include <stdint.h>

/* Read all of path (or stdin for "-") into a malloc'ed buffer; caller frees *out.
 * Errors: RN_EIO (message names the file), RN_ENOMEM. */
int rn_file_read(const char *path, uint8_t **out, size_t *len);

/* Write len bytes to path atomically (or to stdout for "-"). On failure the previous
 * content of path is untouched and no PATH.tmp is left behind. Errors: RN_EIO. */
int rn_file_write_atomic(const char *path, const void *data, size_t len);

/* Before a run that ends by writing path with rn_file_write_atomic: fail now, not after
 * hours of work, when path is a directory or its folder is missing or not writable; and
 * remove a PATH.tmp that a killed run left (a plain file; *stale = 1 when there was one,
 * so the tool can say so). "-" (stdout) always passes. Errors: RN_EIO naming the path. */
int rn_output_check(const char *path, int *stale);

/* fsync the directory that holds path (after a rename). Errors: RN_EIO. */
int rn_fsync_dir_of(const char *path);

#endif
