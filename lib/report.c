/* Reporting a training run: the fan-out of events to sinks, and the two sinks rn-train
 * writes with (progress lines, the JSONL log). */
#include "rn/report.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "rn/err.h"
#include "rn/gpumon.h"
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
    int batch, workers, micro;
    int warned_wait;
    int advised_epoch; /* the epoch the GPU advice was last given in; 0: never */
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
    p->micro = run->micro;
    char amp_note[64] = "";
    if (run->amp == RN_F16) snprintf(amp_note, sizeof amp_note, ", AMP fp16 (loss scale %g)", run->loss_scale);
    else if (run->amp == RN_BF16) snprintf(amp_note, sizeof amp_note, ", AMP bf16");
    char world_note[64] = "", rec_note[96] = "", ra_note[64] = "";
    if (run->ra_reps > 1)
        snprintf(ra_note, sizeof ra_note, "; %d records x %d copies", run->batch / run->ra_reps, run->ra_reps);
    if (run->recompute)
        snprintf(rec_note, sizeof rec_note, ", recomputing blocks in backward (saves %.1f MiB)",
                 run->recompute_saved / 1048576.0);
    if (run->world > 1) snprintf(world_note, sizeof world_note, " on each of %d processes", run->world);
    fprintf(p->f, "rn-train: %s on %s%s: %lld steps per epoch of %d (%d x %d%s), network %.0f MiB%s%s\n", run->arch,
            run->device, world_note, (long long)run->steps_per_epoch, run->batch, run->accum, run->micro, ra_note,
            run->net_bytes / 1048576.0, rec_note, amp_note);
}

static void progress_step(void *ctx, const rn_step_info *s) {
    progress *p = ctx;
    char eta[32], scale_note[64] = "", rank_note[96] = "", gpu_note[32] = "";
    fmt_eta(s->steps_left * p->batch / (s->img_s > 0 ? s->img_s : 1e-9), eta, sizeof eta);
    if (s->scaled)
        snprintf(scale_note, sizeof scale_note, " loss-scale %g (%lld skipped)", s->loss_scale,
                 (long long)s->skipped);
    if (s->world > 1)
        snprintf(rank_note, sizeof rank_note, " ranks %.3f-%.3f s/step (slowest %d)", s->step_s_min, s->step_s_max,
                 s->slow_rank);
    if (s->gpu && !isnan(s->gpu_util)) snprintf(gpu_note, sizeof gpu_note, " GPU %.0f%%", s->gpu_util);
    char top1[32] = "";
    if (s->train_top1 >= 0) snprintf(top1, sizeof top1, " top1 %.3f", s->train_top1);
    fprintf(p->f, "%sepoch %d step %lld (%lld/%lld) loss %.4f%s lr %.4g%s %.1f img/s data-wait %.0f%%%s%s ETA %s%s",
            p->tty ? "\r" : "", s->epoch, (long long)s->step, (long long)s->epoch_step,
            (long long)s->steps_per_epoch, s->loss, top1, s->lr, scale_note, s->img_s, 100 * s->data_wait, gpu_note,
            rank_note, eta, p->tty ? "   " : "\n");
    char advice[512];
    if (gpu_note[0]) {
        /* the GPU's own figure decides: at most once an epoch */
        if (p->advised_epoch != s->epoch &&
            rn_gpumon_advice(s->gpu_util, s->data_wait, p->workers, p->micro, advice, sizeof advice)) {
            p->advised_epoch = s->epoch;
            fprintf(p->f, "%s%s\n", p->tty ? "\n" : "", advice);
        }
    } else if (s->data_wait > 0.2 && !p->warned_wait++)
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
    if (e->has_ema_val)
        fprintf(p->f, "epoch %d: val EMA top1=%.4f top5=%.4f loss=%.4f n=%lld\n", e->epoch, e->ema_top1, e->ema_top5,
                e->ema_loss, (long long)e->val_n);
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
    if (s->train_top1 >= 0) fprintf(f, ",\"train_top1\":%.6f", s->train_top1);
    fprintf(f, ",\"lr\":");
    rn_json_number(f, s->lr);
    fprintf(f, ",\"img_s\":%.2f,\"data_wait\":%.4f,\"loss_scale\":", s->img_s, s->data_wait);
    rn_json_number(f, s->loss_scale);
    fprintf(f, ",\"skipped\":%lld,\"world_size\":%d", (long long)s->skipped, s->world > 1 ? s->world : 1);
    if (s->has_grad_norm) {
        fprintf(f, ",\"grad_norm\":");
        rn_json_number(f, s->grad_norm);
    }
    if (s->world > 1)
        fprintf(f, ",\"step_s_min\":%.4f,\"step_s_max\":%.4f,\"fast_rank\":%d,\"slow_rank\":%d,"
                   "\"data_wait_min\":%.4f,\"data_wait_max\":%.4f",
                s->step_s_min, s->step_s_max, s->fast_rank, s->slow_rank, s->wait_min, s->wait_max);
    /* a figure the device did not give is left out, never written as a number */
    if (s->gpu && !isnan(s->gpu_util)) fprintf(f, ",\"gpu_util\":%.1f", s->gpu_util);
    if (s->gpu && !isnan(s->gpu_mem_used)) fprintf(f, ",\"gpu_mem_used\":%.0f", s->gpu_mem_used);
    if (s->gpu && !isnan(s->gpu_power_w)) fprintf(f, ",\"gpu_power_w\":%.1f", s->gpu_power_w);
    if (s->buckets > 0) /* (the sum ran: many processes, or RN_DIST_SOLO=1) */
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
    if (e->crop > 0) fprintf(f, ",\"crop\":%d", e->crop);
    if (e->has_val)
        fprintf(f, ",\"val_top1\":%.6f,\"val_top5\":%.6f,\"val_loss\":%.6f", e->val_top1, e->val_top5, e->val_loss);
    if (e->has_ema_val)
        fprintf(f, ",\"ema_val_top1\":%.6f,\"ema_val_top5\":%.6f,\"ema_val_loss\":%.6f", e->ema_top1, e->ema_top5,
                e->ema_loss);
    fprintf(f, "}\n");
    fflush(f);
}

static void jsonl_close(void *ctx) { fclose(ctx); }

int rn_report_jsonl(FILE *f, rn_reporter *out) {
    *out = (rn_reporter){.step = jsonl_step, .epoch = jsonl_epoch, .close = jsonl_close, .ctx = f};
    return RN_OK;
}
