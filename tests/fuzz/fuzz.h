/* tests/fuzz/fuzz.h: what the harnesses share. Each harness defines
 * LLVMFuzzerTestOneInput; built with libFuzzer by `make fuzz`, or with replay.c by the
 * normal build to replay tests/fuzz/regress/<name>/ in `make test`. */
#ifndef RN_FUZZ_H
#define RN_FUZZ_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The readers under test take a path: the bytes go to an in-memory file (one per
 * process, rewritten each time), named by its /proc/self/fd path. NULL on failure. */
static inline const char *fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        if ((fd = memfd_create("rn-fuzz", 0)) < 0) return NULL;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0) return NULL;
    for (size_t off = 0; off < size;) {
        ssize_t n = pwrite(fd, data + off, size - off, (off_t)off);
        if (n <= 0) return NULL;
        off += (size_t)n;
    }
    return path;
}

/* Parameters taken from the first bytes of an input (0 when it is shorter). */
static inline unsigned fuzz_byte(const uint8_t *data, size_t size, size_t i) { return i < size ? data[i] : 0; }
#endif
