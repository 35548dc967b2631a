/* rn/dataset.h: rn datasets, LMDB databases of Sample records.
 *
 * A dataset is an LMDB environment directory (DATA.lmdb/data.mdb + lock.mdb, as Caffe
 * makes them; mdb_stat works on it) plus DATA.lmdb/classes.txt (one class name per
 * line, label = line number from 0). Keys: "%08llu" for record 0..count-1, each value a
 * serialized rn.Sample (proto/rn.proto); "__info__" holds a serialized rn.DatasetInfo.
 *
 * Readers open the environment MDB_RDONLY|MDB_NOTLS, so any number of threads, each
 * with its own rn_dataset_reader, read concurrently. The writer builds the database in
 * PATH.tmp and renames it to PATH only in rn_dataset_writer_finish: a killed writer
 * never leaves a half-written dataset under the final name.
 *
 * Errors: RN_EIO (file system), RN_EDATA (LMDB failure, missing or bad record; the
 * message names the path and the record key), RN_ENOMEM, RN_EINVAL. */
#ifndef RN_DATASET_H
#define RN_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Encodings: values match proto/rn.proto's Encoding. */
enum { RN_ENC_RAW = 1, RN_ENC_JPEG = 2 };

#define RN_DATASET_INFO_KEY "__info__"
#define RN_DATASET_CLASSES_FILE "classes.txt"

/* One record. Pointers borrow: from the reader (valid until the next read on that
 * reader or its close) or from the caller (for the writer). */
typedef struct {
    int32_t label;
    uint32_t height, width, channels; /* of the stored image */
    int enc;                          /* RN_ENC_RAW (u8 HWC) or RN_ENC_JPEG */
    const uint8_t *data;
    size_t len;
    const char *name; /* source file relative to the input root; may be "" */
} rn_sample;

/* What a dataset holds (rn.DatasetInfo as plain C). Owned strings and arrays. */
typedef struct {
    uint64_t count;        /* records */
    uint64_t skipped;      /* inputs rn-prep skipped */
    int n_classes;
    char **class_names;    /* (n_classes) */
    uint64_t *class_counts; /* (n_classes) records per label */
    int channels;          /* 1 or 3 */
    int enc;               /* RN_ENC_RAW or RN_ENC_JPEG */
    double mean[3], std[3]; /* per channel, pixel values scaled to [0, 1] */
    uint32_t min_width, min_height, max_width, max_height;
    uint64_t data_bytes;   /* sum of Sample.data lengths */
    char *command;         /* the rn-prep command line */
    char *rn_version;
} rn_dataset_info;

/* Decode and validate a serialized rn.DatasetInfo (the "__info__" record's value), as
 * rn_dataset_open does; path names the dataset in messages. On success info owns what it
 * holds (rn_dataset_info_clear); on failure it is zeroed. Errors: RN_EDATA, RN_ENOMEM. */
int rn_dataset_info_parse(const uint8_t *data, size_t len, const char *path, rn_dataset_info *info);
/* Free what an info holds (not the struct itself) and zero it. */
void rn_dataset_info_clear(rn_dataset_info *info);

typedef struct rn_dataset rn_dataset;
typedef struct rn_dataset_reader rn_dataset_reader;

/* Open a dataset directory read-only and load its DatasetInfo. Errors: RN_EIO if the
 * path is missing, RN_EDATA if it is not an rn dataset (no "__info__" record). */
int rn_dataset_open(const char *path, rn_dataset **out);
void rn_dataset_close(rn_dataset *ds);
const rn_dataset_info *rn_dataset_get_info(const rn_dataset *ds);
const char *rn_dataset_path(const rn_dataset *ds);

/* A per-thread reader (an LMDB read transaction). Close readers before the dataset. */
int rn_dataset_reader_open(rn_dataset *ds, rn_dataset_reader **out);
void rn_dataset_reader_close(rn_dataset_reader *r);

/* Read and validate record `index` (0..count-1): the label is within the class list,
 * raw data has height*width*channels bytes, sizes are non-zero. */
int rn_dataset_read(rn_dataset_reader *r, uint64_t index, rn_sample *out);

/* A record's value decoded and validated as rn_dataset_read does (label in 0..n_classes-1
 * when n_classes > 0, sizes, raw byte count, encoding, checksum); path and key name the
 * record in messages. *msg is the unpacked message (NULL if the bytes are not a Sample)
 * that out borrows from: free it with rn_dataset_sample_free, also after a failure.
 * Errors: RN_EDATA. */
typedef struct Rn__Sample rn_sample_msg;
int rn_dataset_sample_parse(const uint8_t *data, size_t len, int n_classes, const char *path, const char *key,
                            rn_sample_msg **msg, rn_sample *out);
void rn_dataset_sample_free(rn_sample_msg *msg);
/* Read a class list: a text file of one name per line, or a dataset directory (its
 * DatasetInfo class names). *names is malloc'ed (free each and the array). */
int rn_dataset_read_classes(const char *path, char ***names, int *n);

/* Print what a dataset holds: count, classes with counts, sizes, encoding, mean/std,
 * the command that made it; as text or as one JSON object. */
int rn_dataset_describe(const char *path, FILE *out, int json);

/* Print one line per record, "key label WxHxC enc bytes name", without decoding. */
int rn_dataset_list(const char *path, FILE *out);

typedef struct rn_dataset_writer rn_dataset_writer;

/* Start a new dataset at path (built under path.tmp; a stale path.tmp from a killed
 * run is removed first). map_size is the initial LMDB map size in bytes (0: 1 GiB); it
 * doubles whenever LMDB reports MDB_MAP_FULL. */
int rn_dataset_writer_create(const char *path, size_t map_size, rn_dataset_writer **out);

/* Append a record under the next key. Records are written in batched transactions. */
int rn_dataset_writer_put(rn_dataset_writer *w, const rn_sample *s);

/* Records put so far. */
uint64_t rn_dataset_writer_count(const rn_dataset_writer *w);

/* Write info (count is set from the records put), classes.txt, commit, sync, and
 * rename path.tmp to path (replacing an existing dataset atomically). Frees w, also
 * on failure (then path.tmp is removed and path is untouched). */
int rn_dataset_writer_finish(rn_dataset_writer *w, const rn_dataset_info *info);

/* Give up: remove path.tmp and free w. */
void rn_dataset_writer_abort(rn_dataset_writer *w);

#endif
