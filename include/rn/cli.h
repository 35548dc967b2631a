/* rn/cli.h: parsing of tool flag values, shared by the tools' main()s. */
#ifndef RN_CLI_H
#define RN_CLI_H

#include <stddef.h>

/* The whole of s as an integer (or number) in [lo, hi]. Errors: RN_EINVAL with the
 * message "FLAG: 'S' is not an integer in [LO, HI]". */
int rn_parse_long(const char *flag, const char *s, long lo, long hi, long *out);
int rn_parse_int(const char *flag, const char *s, int lo, int hi, int *out);
int rn_parse_double(const char *flag, const char *s, double lo, double hi, double *out);
/* A byte count: a number with an optional binary suffix K, M, G or T (also KiB, MB, ...;
 * 1K = 1024), at least 1 byte. Errors: RN_EINVAL ("FLAG: 'S' is not a size like 8G"). */
int rn_parse_size(const char *flag, const char *s, size_t *out);

#endif
