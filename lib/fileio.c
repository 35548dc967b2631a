#include "rn/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rn/err.h"

/* cap: the first buffer's size (a regular file's size + 1 reads it in one buffer) */
static int read_fd(int fd, const char *path, size_t cap, uint8_t **out, size_t *len) {
    size_t n = 0;
    uint8_t *buf = rn_malloc(cap);
    if (!buf) return RN_ENOMEM;
    for (;;) {
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return rn_errorf(RN_ENOMEM, "%s: out of memory reading %zu bytes", path, cap * 2);
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            return rn_errorf(RN_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    *out = buf;
    *len = n;
    return RN_OK;
}

int rn_file_read(const char *path, uint8_t **out, size_t *len) {
    if (strcmp(path, "-") == 0) return read_fd(0, "<stdin>", 1 << 16, out, len);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rn_errorf(RN_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    size_t cap = 1 << 16;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size < SIZE_MAX / 2)
        cap = (size_t)st.st_size + 1; /* +1: the read that finds the end needs room; without
                                         the size (a pipe) the buffer grows as it fills */
    int rc = read_fd(fd, path, cap, out, len);
    close(fd);
    return rc;
}

static int write_all(int fd, const char *path, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return rn_errorf(RN_EIO, "%s: write failed: %s", path, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return RN_OK;
}

int rn_output_check(const char *path, int *stale) {
    *stale = 0;
    if (strcmp(path, "-") == 0) return RN_OK;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return rn_errorf(RN_EIO, "%s: is a directory (give a file name for the output)", path);
    char *copy = strdup(path);
    if (!copy) return rn_errorf(RN_ENOMEM, "out of memory");
    const char *dir = dirname(copy);
    int rc = RN_OK;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        rc = rn_errorf(RN_EIO, "%s: its folder %s does not exist (create it first)", path, dir);
    else if (access(dir, W_OK) != 0)
        rc = rn_errorf(RN_EIO, "%s: cannot write in %s: %s", path, dir, strerror(errno));
    free(copy);
    if (rc != RN_OK) return rc;
    size_t n = strlen(path);
    char *tmp = rn_malloc(n + 5);
    if (!tmp) return RN_ENOMEM;
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    if (lstat(tmp, &st) == 0 && S_ISREG(st.st_mode)) {
        if (unlink(tmp) != 0) rc = rn_errorf(RN_EIO, "%s: cannot remove: %s", tmp, strerror(errno));
        else *stale = 1;
    }
    free(tmp);
    return rc;
}

int rn_fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return rn_errorf(RN_ENOMEM, "out of memory");
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = RN_OK;
    if (fd < 0) rc = rn_errorf(RN_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    else if (fsync(fd) != 0 && errno != EINVAL)
        rc = rn_errorf(RN_EIO, "%s: fsync of directory failed: %s", dir, strerror(errno));
    if (fd >= 0) close(fd);
    free(copy);
    return rc;
}

int rn_file_write_atomic(const char *path, const void *data, size_t len) {
    if (strcmp(path, "-") == 0) {
        int rc = write_all(1, "<stdout>", data, len);
        return rc;
    }
    size_t n = strlen(path);
    char *tmp = rn_malloc(n + 5);
    if (!tmp) return RN_ENOMEM;
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    int rc = RN_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = rn_errorf(RN_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    if ((rc = write_all(fd, tmp, data, len)) != RN_OK) goto fail;
    if (fsync(fd) != 0) {
        rc = rn_errorf(RN_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = rn_errorf(RN_EIO, "%s: close failed: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = rn_errorf(RN_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    rc = rn_fsync_dir_of(path);
    goto out;
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
out:
    free(tmp);
    return rc;
}
