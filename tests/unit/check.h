/* Minimal C test harness: CHECK records a failure and goes on; each test binary
 * prints one line per failure and a closing "name: N passed, N failed" line. */
#ifndef RN_TEST_CHECK_H
#define RN_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

#define CHECK(cond, ...) do { \
    if (cond) check_passed++; \
    else { check_failed++; fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #cond); \
           fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* a status-returning call that must succeed */
#define CHECK_OK(call) do { int rc_ = (call); \
    CHECK(rc_ == 0, "%s returned %d: %s", #call, rc_, rn_last_error()); } while (0)

static inline int check_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
