/* rn/json.h: writing JSON values to a stream (tools' --json output, JSONL logs). */
#ifndef RN_JSON_H
#define RN_JSON_H

#include <stdio.h>

/* s as a JSON string literal, quotes included; control characters escaped. */
void rn_json_string(FILE *f, const char *s);
/* a double as a JSON number; NaN and infinities, which JSON lacks, as null. */
void rn_json_number(FILE *f, double v);

/* For values that may be unknown, written as null (rn-gpuinfo's report):
 * s as a JSON string, null when s is NULL or "". */
void rn_json_string_or_null(FILE *f, const char *s);
/* v as a JSON integer, null when v < 0: a quantity that is never negative (a size, a
 * count, a clock), for which -1 stands for unknown. */
void rn_json_count(FILE *f, long long v);
/* v to 6 significant digits (a measured figure, watts or GB/s, whose further digits are
 * noise), null when v < 0 (unknown, as for rn_json_count) or not finite. */
void rn_json_reading(FILE *f, double v);

#endif
