/* rn/tbevent.h: TensorBoard event files (rn-train --tensorboard DIR), written and read.
 *
 * The file is TensorFlow's record format: per record a little-endian uint64 length, the
 * masked CRC32C of those 8 bytes, the data (one serialized Event, proto/tensorboard.proto)
 * and the masked CRC32C of the data; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
 * The first record is an Event with file_version "brain.Event:2". Scalars are
 * Summary.Value simple_value (float32); text is a Summary.Value whose metadata names the
 * plugin "text" and whose tensor is a DT_STRING of one element.
 *
 * Steps in a folder: a writer opened on DIR reads every event file already there and
 * writes a value of a tag only at a step above the largest step that tag has in DIR (or
 * has been written by this writer): so resumed runs, one event file per invocation as
 * TensorBoard expects, never repeat a step, and a run resumed from an older checkpoint
 * adds its values only once it passes the steps DIR holds. Two writers open on one DIR at
 * the same time do not see each other's steps.
 *
 * Unlike rn's other outputs an event file is not written atomically: it grows as the run
 * goes (TensorBoard reads it live), each flush a whole number of records. A writer
 * killed mid-write leaves a truncated last record, which TensorBoard and the scan of
 * rn_tb_open ignore and rn_tb_read (tail_ok 0) reports. */
#ifndef RN_TBEVENT_H
#define RN_TBEVENT_H

#include <stdint.h>
#include <stdio.h>

#include "rn/report.h"

#define RN_TB_FILE_VERSION "brain.Event:2"
/* what an event file's name holds (TensorBoard finds its files by it) */
#define RN_TB_NAME "tfevents"

/* The mask TensorFlow's record format puts on a CRC32C. */
uint32_t rn_tb_mask(uint32_t crc);

typedef struct rn_tb_writer rn_tb_writer;

/* Make dir (and its parents) if missing, learn the steps of the event files in it, and
 * create a new file events.out.tfevents.<unix seconds>.<host>.<microseconds>.<pid> there
 * (never an existing one) holding the file_version record. Errors: RN_EIO (the folder or
 * the file cannot be made or written: the message names it and says why), RN_ECORRUPT
 * (an event file in dir fails a CRC or does not decode: the message names the file and
 * the record; move it away to go on), RN_ENOMEM. */
int rn_tb_open(const char *dir, rn_tb_writer **out);

/* Append to the file at path (made if missing) without reading any folder: for tools
 * and tests that name the file themselves. Errors as rn_tb_open. */
int rn_tb_open_file(const char *path, rn_tb_writer **out);

/* The event file being written (owned by w). */
const char *rn_tb_path(const rn_tb_writer *w);

/* The largest step of any tag in the folder when w was opened (-1: none). */
int64_t rn_tb_max_step(const rn_tb_writer *w);

/* Append one scalar (stored as float32) or one text value of tag at step, unless tag
 * already has a step >= step (then nothing is written and RN_OK returned). The record is
 * buffered until rn_tb_flush. Errors: RN_EIO naming the file (and from then on every
 * call fails the same way without writing), RN_ENOMEM. */
int rn_tb_scalar(rn_tb_writer *w, const char *tag, int64_t step, double value);
int rn_tb_text(rn_tb_writer *w, const char *tag, int64_t step, const char *text);

/* Hand the buffered records to the file, so a live TensorBoard sees them. Errors: RN_EIO. */
int rn_tb_flush(rn_tb_writer *w);

/* Flush, close and free w (NULL: nothing). Errors: RN_EIO (a write or the close failed). */
int rn_tb_close(rn_tb_writer *w);

/* One record of an event file, as rn_tb_read decodes it. */
enum { RN_TB_VERSION, RN_TB_SCALAR, RN_TB_TEXT, RN_TB_OTHER };
typedef struct {
    int64_t index;    /* 0-based record number in the file */
    double wall_time; /* unix seconds */
    int64_t step;
    int kind;        /* RN_TB_VERSION: text is the file_version; RN_TB_SCALAR: value;
                        RN_TB_TEXT: text; RN_TB_OTHER: an event or value rn does not read */
    const char *tag; /* of a value; NULL for RN_TB_VERSION */
    double value;
    const char *text;
} rn_tb_item;

/* Read the event file at path, checking both CRCs of every record and decoding each,
 * and call fn for the file_version and for each value of a summary, in file order; a
 * non-zero return from fn stops the read and is returned. The first record must be a
 * file_version "brain.Event:...". tail_ok: a truncated last record or an empty file (a
 * writer killed mid-write, or a file still being written) ends the file quietly instead
 * of failing.
 * Errors: RN_EIO (unreadable), RN_ECORRUPT (a CRC mismatch, a record that does not
 * decode, a truncated record: the message names the file, the record and its byte
 * offset), RN_ENOMEM. */
int rn_tb_read(const char *path, int tail_ok, int (*fn)(void *ctx, const rn_tb_item *it), void *ctx);

/* The event files in dir (names holding "tfevents"), sorted by name as TensorBoard reads
 * them; *paths and each string are malloc'ed (rn_tb_list_free). Errors: RN_EIO, RN_ENOMEM. */
int rn_tb_list(const char *dir, char ***paths, int *n);
void rn_tb_list_free(char **paths, int n);

/* A report sink (rn/report.h) that writes through w (the sink owns it): at begin the
 * command line argv as text under "run/flags" at the run's first step; at each step
 * event the scalars train/loss, train/lr, train/img_s, train/data_wait and, when fp16
 * scales the loss, train/loss_scale at the global optimiser step, then a flush; at each
 * epoch with validation val/top1, val/top5 and val/loss at the epoch's last step. A
 * failed write is reported once on err ("tool: --tensorboard FILE: why") and the sink
 * stops writing; the run goes on. A run that starts below the steps DIR holds is told
 * so on err. Errors: RN_ENOMEM (w is closed). */
int rn_report_tensorboard(rn_tb_writer *w, const char *tool, int argc, char **argv, FILE *err, rn_reporter *out);

#endif
