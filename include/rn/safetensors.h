/* rn/safetensors.h: read and write the safetensors format (the Hugging Face format
 * torch users exchange weights in): an 8-byte little-endian header length, a JSON
 * header {"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {str: str}},
 * then the raw little-endian tensor bytes. */
#ifndef RN_SAFETENSORS_H
#define RN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define RN_ST_MAX_DIMS 8

typedef struct {
    char *name;
    int dtype; /* rn_dtype */
    int ndim;
    int64_t shape[RN_ST_MAX_DIMS];
    const uint8_t *data; /* points into the file buffer (read) or the caller's memory (write) */
    size_t nbytes;
} rn_st_tensor;

typedef struct {
    uint8_t *file; /* whole file, owned */
    size_t len;
    uint8_t *owned; /* tensors copied out of the file (a .pth's strided views, rn/pth.h), owned; or NULL */
    int n;
    rn_st_tensor *t; /* in header order */
    int nmeta;
    char **meta_key, **meta_val;
} rn_safetensors;

/* Read and validate path ("-" = stdin): header JSON (read within its stated length,
 * nothing after its closing brace but padding), every name once, dtypes, shapes (each
 * dimension a non-negative integer, the element count checked against the bytes present
 * before it is multiplied) against byte ranges, ranges inside the file and not
 * overlapping. Errors: RN_EIO, RN_ECORRUPT (message names the file and the tensor),
 * RN_ENOMEM. */
int rn_st_read(const char *path, rn_safetensors **out);
/* The same on a file already read: takes buf (malloc'ed, len bytes) and frees it on
 * failure; path only names the file in messages. */
int rn_st_parse(const char *path, uint8_t *buf, size_t len, rn_safetensors **out);
void rn_st_free(rn_safetensors *st);
const rn_st_tensor *rn_st_find(const rn_safetensors *st, const char *name);
/* Metadata value for key, or NULL. */
const char *rn_st_meta(const rn_safetensors *st, const char *key);

/* Write n tensors (in the order given) and nmeta key/value string pairs atomically.
 * Errors: RN_EIO, RN_ENOMEM, RN_EINVAL (shape and nbytes disagree). */
int rn_st_write(const char *path, const rn_st_tensor *t, int n, const char *const *meta_key,
                const char *const *meta_val, int nmeta);

#endif
