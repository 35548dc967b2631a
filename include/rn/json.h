/* rn/json.h: writing JSON values to a stream (tools' --json output, JSONL logs). */
#ifndef RN_JSON_H
#define RN_JSON_H

#include <stdio.h>

/* s as a JSON string literal, quotes included; control characters escaped. */
void rn_json_string(FILE *f, const char *s);
/* a double as a JSON number; NaN and infinities, which JSON lacks, as null. */
void rn_json_number(FILE *f, double v);

#endif
