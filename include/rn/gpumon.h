/* rn/gpumon.h: the GPU's utilisation, memory and power while a run trains (rn-train's
 * gpu_util, gpu_mem_used and gpu_power_w), and the advice drawn from them.
 *
 * A source reads one sample of the device: rn_gpumon_nvml() binds one to NVML
 * (libnvidia-ml.so.1, loaded with dlopen at run time, as rn-gpuinfo does), and tests bind
 * their own scripted readers. rn_gpumon_start() reads the source in a background thread
 * every interval_s seconds; rn_gpumon_take() returns the means of the samples since the
 * previous take (an interval mean per log line) and starts a new interval.
 *
 *   rn_gpumon_source src;
 *   rn_gpumon *m;
 *   if (rn_gpumon_nvml("0000:3B:00.0", &src) == RN_OK && rn_gpumon_start(&src, 0.1, &m) == RN_OK) {
 *       ... rn_gpumon_take(m, &mean); ... rn_gpumon_stop(m);
 *   }
 *
 * A value a device does not report (a GPU without power readings) is NaN in a sample and
 * in a mean, as is every value of an interval in which no sample succeeded: a log leaves
 * such a field out rather than writing a number nobody measured. */
#ifndef RN_GPUMON_H
#define RN_GPUMON_H

#include <stddef.h>
#include <stdint.h>

/* One reading of the device, or the mean of several. NaN: not known. */
typedef struct {
    double util;     /* percent of the time a kernel ran (NVML's utilization.gpu) */
    double mem_used; /* bytes of device memory in use (by every process) */
    double power_w;  /* board power draw, watts */
} rn_gpumon_sample;

/* What a sampler reads. read fills *s (NaN for what it cannot tell) and returns RN_OK or
 * an rn_errorf code; it is called from the sampler's thread, one call at a time. close
 * (may be NULL) releases ctx once the sampler has stopped. */
typedef struct {
    int (*read)(void *ctx, rn_gpumon_sample *s);
    void (*close)(void *ctx);
    void *ctx;
} rn_gpumon_source;

/* Sums of the samples of an interval, per field: a field's mean is over the samples that
 * knew it. */
typedef struct {
    double util, mem_used, power_w;
    int64_t n_util, n_mem, n_power;
} rn_gpumon_acc;

/* Add s to a (its NaN fields are skipped). */
void rn_gpumon_acc_add(rn_gpumon_acc *a, const rn_gpumon_sample *s);
/* The means of a's samples; NaN for a field without any. */
void rn_gpumon_acc_mean(const rn_gpumon_acc *a, rn_gpumon_sample *mean);

/* A source reading the device at PCI bus id pci_bus_id ("0000:3B:00.0", as
 * cudaDeviceGetPCIBusId writes it) through NVML: utilisation rates, memory information
 * and power usage. Errors: RN_ENOTSUP when libnvidia-ml.so.1 cannot be loaded or lacks
 * nvmlInit_v2 / nvmlDeviceGetHandleByPciBusId_v2, RN_EGPU when NVML does not initialise
 * or does not know the device (the message says which call and NVML's reason). On
 * success *out owns the library; its close shuts NVML down. */
int rn_gpumon_nvml(const char *pci_bus_id, rn_gpumon_source *out);

typedef struct rn_gpumon rn_gpumon;

/* The default and the bounds of the sampling interval (rn-train --gpu-sample). */
#define RN_GPUMON_INTERVAL 0.1
#define RN_GPUMON_INTERVAL_MIN 0.01
#define RN_GPUMON_INTERVAL_MAX 60.0

/* Read src once (so a source that cannot read fails here, once, and not in every
 * interval), then every interval_s seconds in a thread of its own. The sampler owns src
 * from here, failure included (src->close is called). Errors: RN_EINVAL (interval_s
 * outside [RN_GPUMON_INTERVAL_MIN, RN_GPUMON_INTERVAL_MAX]), the first read's error,
 * RN_ENOMEM, RN_EIO (the thread did not start). */
int rn_gpumon_start(const rn_gpumon_source *src, double interval_s, rn_gpumon **out);

/* The means of the samples read since the previous take (or the start) in *mean, and a
 * new interval begins. An interval shorter than the sampling period, which holds no
 * sample yet, is read once on the spot. */
void rn_gpumon_take(rn_gpumon *m, rn_gpumon_sample *mean);

/* Samples read and reads that failed since the start (a failed read is left out of the
 * means; the run goes on). */
void rn_gpumon_counts(const rn_gpumon *m, int64_t *reads, int64_t *failed);

/* Stop the thread, close the source and free m. NULL is fine. */
void rn_gpumon_stop(rn_gpumon *m);

/* The advice (rn-train's progress lines) from an interval's GPU utilisation (percent)
 * and data-wait (the fraction of the time the step waited for the loader):
 *   RN_GPUMON_ADVICE_LOADER  util < RN_GPUMON_BUSY and data_wait > RN_GPUMON_WAIT_HIGH:
 *                            the loader starves the GPU (more workers, smaller stored
 *                            images, raw encoding)
 *   RN_GPUMON_ADVICE_HOST    util < RN_GPUMON_BUSY and data_wait < RN_GPUMON_WAIT_LOW:
 *                            the GPU waits on the host's own work (synchronisations) or
 *                            has too little to do per launch (a small batch)
 *   RN_GPUMON_ADVICE_NONE    otherwise, and when util is NaN
 * Between the two data-wait thresholds neither cause dominates and nothing is said. The
 * line (without a trailing newline) goes to buf (cap bytes; "" for NONE); workers and
 * micro are the run's loader threads and images per forward pass. */
enum { RN_GPUMON_ADVICE_NONE = 0, RN_GPUMON_ADVICE_LOADER = 1, RN_GPUMON_ADVICE_HOST = 2 };
#define RN_GPUMON_BUSY 90.0
#define RN_GPUMON_WAIT_HIGH 0.2
#define RN_GPUMON_WAIT_LOW 0.05
int rn_gpumon_advice(double util, double data_wait, int workers, int micro, char *buf, size_t cap);

#endif
