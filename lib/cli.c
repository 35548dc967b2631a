#include "rn/cli.h"

#include <errno.h>
#include <stdlib.h>

#include "rn/err.h"

int rn_parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return rn_errorf(RN_EINVAL, "%s: '%s' is not an integer in [%ld, %ld]", flag, s, lo, hi);
    *out = v;
    return RN_OK;
}

int rn_parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    long v;
    int rc = rn_parse_long(flag, s, lo, hi, &v);
    if (rc == RN_OK) *out = (int)v;
    return rc;
}

int rn_parse_double(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v >= lo && v <= hi))
        return rn_errorf(RN_EINVAL, "%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
    *out = v;
    return RN_OK;
}
