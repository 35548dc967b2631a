#include "rn/cli.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
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

int rn_parse_size(const char *flag, const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    static const char units[] = "KMGT";
    const char *u = *end ? strchr(units, *end >= 'a' ? *end - 32 : *end) : NULL;
    double mult = 1;
    if (u && *u) {
        mult = ldexp(1.0, 10 * (int)(u - units + 1));
        end++;
        if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0) end += strlen(end);
    } else if (strcmp(end, "B") == 0) {
        end++;
    }
    v *= mult;
    if (end == s || *end || !(v >= 1) || v > (double)SIZE_MAX / 2)
        return rn_errorf(RN_EINVAL, "%s: '%s' is not a size like 8G, 512M or 1048576 (bytes)", flag, s);
    *out = (size_t)v;
    return RN_OK;
}
