/* Reporting a training run: the fan-out of events to sinks, and the two sinks rn-train
 * writes with (progress lines, the JSONL log). */
#include "rn/report.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "rn/err.h"
#include "rn/json.h"
#include "rn/tensor.h"

double rn_report_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int rn_report_add(rn_report *rep, const rn_reporter *s) {
    if (rep->n == RN_REPORT_SINKS) {
        if (s->close) s->close(s->ctx);
        return rn_errorf(RN_EINVAL, "a report takes at most %d sinks", RN_REPORT_SINKS);
    }
    rep->sink[rep->n++] = *s;
    return RN_OK;
}

/* every sink's callback `fn`, where it has one */
#define EACH(rep, fn, ...) \
    for (int i_ = 0; i_ < (rep)->n; i_++) \
        if ((rep)->sink[i_].fn) (rep)->sink[i_].fn((rep)->sink[i_].ctx, __VA_ARGS__)

void rn_report_begin(rn_report *rep, const rn_run_info *run) { EACH(rep, begin, run); }
void rn_report_step(rn_report *rep, const rn_step_info *s) { EACH(rep, step, s); }
void rn_report_epoch(rn_report *rep, const rn_epoch_info *e) { EACH(rep, epoch, e); }
void rn_report_end(rn_report *rep, int64_t unreported) { EACH(rep, end, unreported); }

void rn_report_close(rn_report *rep) {
    for (int i = 0; i < rep->n; i++)
        if (rep->sink[i].close) rep->sink[i].close(rep->sink[i].ctx);
    rep->n = 0;
}

/* ---- progress lines ---- */

typedef struct {
    FILE *f;
    int tty;
    int batch, workers;
    int warned_wait;
} progress;

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!isfinite(s) || s < 0) snprintf(buf, cap, "?");
    else if (s < 3600) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

static void progress_begin(void *ctx, const rn_run_info *run) {
    progress *p = ctx;
    p->batch = run->batch;
    p->workers = run->workers;
    char amp_note[64] = "";
    if (run->amp == RN_F16) snprintf(amp_note, sizeof amp_note, ", AMP fp16 (loss scale %g)", run->loss_scale);
    else if (run->amp == RN_BF16) snprintf(amp_note, sizeof amp_note, ", AMP bf16");
    char world_note[64] = "";
    if (run->world > 1) snprintf(world_note, sizeof world_note, " on each of %d processes", run->world);
    fprintf(p->f, "rn-train: %s on %s%s: %lld steps per epoch of %d (%d x %d), network %.0f MiB%s\n", run->arch,
            run->device, world_note, (long long)run->steps_per_epoch, run->batch, run->accum, run->micro,
            run->net_bytes / 1048576.0, amp_note);
}

static void progress_step(void *ctx, const rn_step_info *s) {
    progress *p = ctx;
    char eta[32], scale_note[64] = "", rank_note[96] = "";
    fmt_eta(s->steps_left * p->batch / (s->img_s > 0 ? s->img_s : 1e-9), eta, sizeof eta);
    if (s->scaled)
        snprintf(scale_note, sizeof scale_note, " loss-scale %g (%lld skipped)", s->loss_scale,
                 (long long)s->skipped);
    if (s->world > 1)
        snprintf(rank_note, sizeof rank_note, " ranks %.3f-%.3f s/step (slowest %d)", s->step_s_min, s->step_s_max,
                 s->slow_rank);
    fprintf(p->f, "%sepoch %d step %lld (%lld/%lld) loss %.4f lr %.4g%s %.1f img/s data-wait %.0f%%%s ETA %s%s",
            p->tty ? "\r" : "", s->epoch, (long long)s->step, (long long)s->epoch_step,
            (long long)s->steps_per_epoch, s->loss, s->lr, scale_note, s->img_s, 100 * s->data_wait, rank_note, eta,
            p->tty ? "   " : "\n");
    if (s->data_wait > 0.2 && !p->warned_wait++)
        fprintf(p->f, "%srn-train: the loader held back %.0f%% of the step time: add --workers (now %d)\n",
                p->tty ? "\n" : "", 100 * s->data_wait, p->workers);
    /* the epoch's last line stays on screen above validation's */
    if (s->last && p->tty) fputc('\n', p->f);
}

static void progress_epoch(void *ctx, const rn_epoch_info *e) {
    progress *p = ctx;
    if (e->has_val)
        fprintf(p->f, "epoch %d: val top1=%.4f top5=%.4f loss=%.4f n=%lld\n", e->epoch, e->val_top1, e->val_top5,
                e->val_loss, (long long)e->val_n);
}

static void progress_end(void *ctx, int64_t unreported) {
    progress *p = ctx;
    if (p->tty && unreported) fputc('\n', p->f);
}

int rn_report_progress(FILE *f, int tty, rn_reporter *out) {
    progress *p = rn_calloc(1, sizeof *p);
    if (!p) return RN_ENOMEM;
    p->f = f;
    p->tty = tty;
    *out = (rn_reporter){.begin = progress_begin, .step = progress_step, .epoch = progress_epoch,
                         .end = progress_end, .close = free, .ctx = p};
    return RN_OK;
}

/* ---- JSONL log ---- */

static void jsonl_step(void *ctx, const rn_step_info *s) {
    FILE *f = ctx;
    fprintf(f, "{\"kind\":\"step\",\"epoch\":%d,\"step\":%lld,\"loss\":", s->epoch, (long long)s->step);
    rn_json_number(f, s->loss);
    fprintf(f, ",\"lr\":");
    rn_json_number(f, s->lr);
    fprintf(f, ",\"img_s\":%.2f,\"data_wait\":%.4f,\"loss_scale\":", s->img_s, s->data_wait);
    rn_json_number(f, s->loss_scale);
    fprintf(f, ",\"skipped\":%lld,\"world_size\":%d", (long long)s->skipped, s->world > 1 ? s->world : 1);
    if (s->world > 1)
        fprintf(f, ",\"step_s_min\":%.4f,\"step_s_max\":%.4f,\"fast_rank\":%d,\"slow_rank\":%d,"
                   "\"data_wait_min\":%.4f,\"data_wait_max\":%.4f",
                s->step_s_min, s->step_s_max, s->fast_rank, s->slow_rank, s->wait_min, s->wait_max);
    if (s->world > 1 && s->buckets > 0)
        fprintf(f, ",\"buckets\":%d,\"buckets_early\":%d,\"buckets_done_early\":%d", s->buckets, s->buckets_early,
                s->buckets_done_early);
    fprintf(f, "}\n");
    fflush(f);
}

static void jsonl_epoch(void *ctx, const rn_epoch_info *e) {
    FILE *f = ctx;
    fprintf(f, "{\"kind\":\"epoch\",\"epoch\":%d,\"step\":%lld,\"train_loss\":", e->epoch, (long long)e->step);
    rn_json_number(f, e->train_loss);
    fprintf(f, ",\"lr\":");
    rn_json_number(f, e->lr);
    fprintf(f, ",\"seconds\":%.2f,\"img_s\":%.2f", e->seconds, e->img_s);
    if (e->has_val)
        fprintf(f, ",\"val_top1\":%.6f,\"val_top5\":%.6f,\"val_loss\":%.6f", e->val_top1, e->val_top5, e->val_loss);
    fprintf(f, "}\n");
    fflush(f);
}

static void jsonl_close(void *ctx) { fclose(ctx); }

int rn_report_jsonl(FILE *f, rn_reporter *out) {
    *out = (rn_reporter){.step = jsonl_step, .epoch = jsonl_epoch, .close = jsonl_close, .ctx = f};
    return RN_OK;
}
