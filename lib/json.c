#include "rn/json.h"

#include <math.h>

void rn_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void rn_json_number(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.17g", v);
    else fputs("null", f);
}

void rn_json_string_or_null(FILE *f, const char *s) {
    if (!s || !s[0]) fputs("null", f);
    else rn_json_string(f, s);
}

void rn_json_count(FILE *f, long long v) {
    if (v < 0) fputs("null", f);
    else fprintf(f, "%lld", v);
}

void rn_json_reading(FILE *f, double v) {
    if (v < 0 || !isfinite(v)) fputs("null", f);
    else fprintf(f, "%.6g", v);
}
