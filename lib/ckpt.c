#include "rn/ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/rng.h"
#include "rn/tensor.h"

int rn_pb_set_string(char **field, const char *s) {
    char *copy = strdup(s ? s : "");
    if (!copy) return rn_errorf(RN_ENOMEM, "out of memory");
    if (*field && *field != protobuf_c_empty_string) free(*field);
    *field = copy;
    return RN_OK;
}

rn_ptensor *rn_ptensor_new(const char *name, int dtype, int ndim, const int64_t *shape) {
    int64_t numel = rn_numel(shape, (size_t)ndim);
    size_t esize = rn_dtype_size(dtype);
    if (numel < 0 || esize == 0) {
        rn_errorf(RN_EINVAL, "tensor %s: bad shape or dtype", name);
        return NULL;
    }
    rn_ptensor *t = rn_malloc(sizeof *t);
    if (!t) return NULL;
    rn__tensor__init(t);
    t->dtype = (Rn__DType)dtype;
    t->name = strdup(name);
    t->shape = rn_malloc(sizeof(int64_t) * (size_t)(ndim ? ndim : 1));
    t->data.data = rn_calloc((size_t)numel, esize);
    if (!t->name || !t->shape || !t->data.data) {
        rn_ptensor_free(t);
        rn_errorf(RN_ENOMEM, "tensor %s: out of memory for %lld bytes", name, (long long)numel * (long long)esize);
        return NULL;
    }
    t->n_shape = (size_t)ndim;
    if (ndim > 0) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim); /* a scalar may pass NULL */
    t->data.len = (size_t)numel * esize;
    return t;
}

void rn_ptensor_free(rn_ptensor *t) {
    if (t) rn__tensor__free_unpacked(t, NULL);
}

void rn_ckpt_free(rn_ckpt *c) {
    if (c) rn__checkpoint__free_unpacked(c, NULL);
}

static int fill_spec(rn_ckpt *c, const rn_resnet *net) {
    if (!c->model) {
        c->model = rn_malloc(sizeof *c->model);
        if (!c->model) return RN_ENOMEM;
        rn__model_spec__init(c->model);
    }
    c->model->num_classes = net->num_classes;
    return rn_pb_set_string(&c->model->arch, net->arch);
}

int rn_ckpt_new(const rn_resnet *net, rn_ckpt **out) {
    rn_tensor_desc *d = NULL;
    int n = 0, rc;
    rn_ckpt *c = rn_malloc(sizeof *c);
    if (!c) return RN_ENOMEM;
    rn__checkpoint__init(c);
    c->format_version = RN_FORMAT_VERSION;
    if ((rc = fill_spec(c, net)) != RN_OK) goto fail;
    if ((rc = rn_resnet_tensors(net, &d, &n)) != RN_OK) goto fail;
    c->params = rn_calloc((size_t)n, sizeof(rn_ptensor *));
    c->buffers = rn_calloc((size_t)n, sizeof(rn_ptensor *));
    if (!c->params || !c->buffers) {
        rc = RN_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        int dtype = d[i].kind == RN_T_BN_COUNT ? RN_I64 : RN_F32;
        rn_ptensor *t = rn_ptensor_new(d[i].name, dtype, d[i].ndim, d[i].shape);
        if (!t) {
            rc = RN_ENOMEM;
            goto fail;
        }
        if (d[i].is_buffer) c->buffers[c->n_buffers++] = t;
        else c->params[c->n_params++] = t;
    }
    free(d);
    *out = c;
    return RN_OK;
fail:
    free(d);
    rn_ckpt_free(c);
    return rc;
}

rn_ptensor *rn_ckpt_find(const rn_ckpt *c, const char *name) {
    for (size_t i = 0; i < c->n_params; i++)
        if (strcmp(c->params[i]->name, name) == 0) return c->params[i];
    for (size_t i = 0; i < c->n_buffers; i++)
        if (strcmp(c->buffers[i]->name, name) == 0) return c->buffers[i];
    return NULL;
}

static void init_tensor(rn_ptensor *t, const rn_tensor_desc *d, uint64_t seed, int zero_gamma, int fan_in) {
    float *x = rn_ptensor_f32(t);
    int64_t n = rn_numel(d->shape, (size_t)d->ndim);
    /* the key depends on the tensor's name, not its position, so adding or resizing
     * another tensor (a new classifier) never changes this one */
    uint64_t key = rn_rng_key(seed, rn_crc32c(0, d->name, strlen(d->name)));
    switch (d->kind) {
    case RN_T_CONV_W: {
        /* kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / fan_out) */
        double fan_out = (double)d->shape[0] * d->shape[2] * d->shape[3];
        rn_rng_normal(key, x, n, 0.0f, (float)sqrt(2.0 / fan_out));
        break;
    }
    case RN_T_BN_W:
        for (int64_t i = 0; i < n; i++) x[i] = zero_gamma ? 0.0f : 1.0f;
        break;
    case RN_T_BN_VAR:
        for (int64_t i = 0; i < n; i++) x[i] = 1.0f;
        break;
    case RN_T_BN_B:
    case RN_T_BN_MEAN:
        memset(x, 0, (size_t)n * sizeof *x);
        break;
    case RN_T_BN_COUNT:
        memset(t->data.data, 0, t->data.len);
        break;
    case RN_T_FC_W:
    case RN_T_FC_B: {
        /* nn.Linear.reset_parameters: kaiming_uniform(a=sqrt(5)) on the weight is
         * U(-1/sqrt(fan_in), +1/sqrt(fan_in)), and the bias uses the same bound */
        float bound = (float)(1.0 / sqrt((double)fan_in));
        rn_rng_uniform(key, x, n, -bound, bound);
        break;
    }
    }
}

static int init_matching(rn_ckpt *c, const rn_resnet *net, uint64_t seed, int zero_init_residual, const char *prefix) {
    rn_tensor_desc *d = NULL;
    int n = 0, rc;
    if ((rc = rn_resnet_tensors(net, &d, &n)) != RN_OK) return rc;
    /* the last BN of each residual branch, for zero_init_residual */
    char *last_bn = rn_calloc((size_t)net->nunits, 1);
    if (!last_bn) {
        free(d);
        return RN_ENOMEM;
    }
    for (int b = 0; b < net->nblocks; b++) last_bn[net->blocks[b].conv[net->blocks[b].nconv - 1]] = 1;
    for (int i = 0; i < n; i++) {
        if (prefix && strncmp(d[i].name, prefix, strlen(prefix)) != 0) continue;
        rn_ptensor *t = rn_ckpt_find(c, d[i].name);
        if (!t) {
            rc = rn_errorf(RN_EINVAL, "checkpoint has no tensor %s", d[i].name);
            break;
        }
        init_tensor(t, &d[i], seed, zero_init_residual && d[i].unit >= 0 && last_bn[d[i].unit], net->fc_in);
    }
    free(last_bn);
    free(d);
    return rc;
}

int rn_ckpt_init(rn_ckpt *c, const rn_resnet *net, uint64_t seed, int zero_init_residual) {
    if (c->model) c->model->zero_init_residual = zero_init_residual != 0;
    return init_matching(c, net, seed, zero_init_residual, NULL);
}

int rn_ckpt_init_prefix(rn_ckpt *c, const rn_resnet *net, uint64_t seed, const char *prefix) {
    return init_matching(c, net, seed, 0, prefix);
}

int rn_ckpt_net(const rn_ckpt *c, rn_resnet *net) {
    if (!c->model || !c->model->arch) return rn_errorf(RN_ECORRUPT, "no model spec");
    int rc = rn_resnet_build(net, c->model->arch, c->model->num_classes);
    if (rc != RN_OK) return rn_error_context(RN_ECORRUPT, "model spec");
    return RN_OK;
}

static int check_tensor(const rn_ptensor *t, const char *what, const rn_tensor_desc *d, int dtype) {
    if (!t->name || strcmp(t->name, d->name) != 0)
        return rn_errorf(RN_ECORRUPT, "%s: tensor '%s' where '%s' was expected (wrong arch or order)", what,
                         t->name ? t->name : "", d->name);
    int shape_ok = (int)t->n_shape == d->ndim;
    for (int i = 0; shape_ok && i < d->ndim; i++) shape_ok = t->shape[i] == d->shape[i];
    if (!shape_ok) {
        char got[96] = "", want[96] = "";
        for (size_t i = 0; i < t->n_shape && i < 8; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? "," : "", (long long)t->shape[i]);
        for (int i = 0; i < d->ndim; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? "," : "", (long long)d->shape[i]);
        return rn_errorf(RN_ECORRUPT, "%s: tensor %s has shape (%s), expected (%s)", what, d->name, got, want);
    }
    if ((int)t->dtype != dtype)
        return rn_errorf(RN_ECORRUPT, "%s: tensor %s has dtype %s, expected %s", what, d->name,
                         rn_dtype_name((int)t->dtype), rn_dtype_name(dtype));
    size_t want_len = (size_t)rn_numel(d->shape, (size_t)d->ndim) * rn_dtype_size(dtype);
    if (t->data.len != want_len)
        return rn_errorf(RN_ECORRUPT, "%s: tensor %s has %zu data bytes, expected %zu (truncated?)", what, d->name,
                         t->data.len, want_len);
    uint32_t crc = rn_crc32c(0, t->data.data, t->data.len);
    if (crc != t->crc32c)
        return rn_errorf(RN_ECORRUPT, "%s: tensor %s fails its checksum (crc32c %08x, stored %08x): the file is corrupt",
                         what, d->name, crc, t->crc32c);
    return RN_OK;
}

/* The training state's counters within what a real run can reach, so that arithmetic on
 * them (epoch + 1, step * batch, ...) cannot overflow. */
static int check_train_state(const Rn__TrainState *t) {
    const struct { const char *name; int64_t v, max; } f[] = {
        {"epoch", t->epoch, RN_CKPT_MAX_EPOCHS},
        {"total_epochs", t->total_epochs, RN_CKPT_MAX_EPOCHS},
        {"warmup_epochs", t->warmup_epochs, RN_CKPT_MAX_EPOCHS},
        {"lr_step", t->lr_step, RN_CKPT_MAX_EPOCHS},
        {"data_epoch", t->data_epoch, RN_CKPT_MAX_EPOCHS},
        {"step", t->step, RN_CKPT_MAX_STEPS},
        {"skipped_steps", t->skipped_steps, RN_CKPT_MAX_STEPS},
        {"steps_per_epoch", t->steps_per_epoch, RN_CKPT_MAX_STEPS},
        {"data_index", t->data_index, RN_CKPT_MAX_STEPS},
        {"scale_growth_tracker", t->scale_growth_tracker, INT32_MAX},
        {"batch", t->batch, INT32_MAX},
        {"accum", t->accum, INT32_MAX},
    };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (f[i].v < 0 || f[i].v > f[i].max)
            return rn_errorf(RN_ECORRUPT, "training state: %s is %lld, outside 0..%lld", f[i].name, (long long)f[i].v,
                             (long long)f[i].max);
    for (size_t i = 0; i < t->n_lr_milestones; i++)
        if (t->lr_milestones[i] < 0 || t->lr_milestones[i] > RN_CKPT_MAX_EPOCHS)
            return rn_errorf(RN_ECORRUPT, "training state: lr milestone %d outside 0..%d", t->lr_milestones[i],
                             RN_CKPT_MAX_EPOCHS);
    if (!(t->lr_end >= 0) || isinf(t->lr_end) || !(t->lr_power >= 0) || isinf(t->lr_power))
        return rn_errorf(RN_ECORRUPT, "training state: schedule end rate %g, power %g: not finite non-negative "
                         "numbers", t->lr_end, t->lr_power);
    if (!(t->warmup_decay >= 0 && t->warmup_decay <= 1))
        return rn_errorf(RN_ECORRUPT, "training state: warm-up start factor %g is outside 0..1", t->warmup_decay);
    if (!(t->loss_scale >= 0) || isinf(t->loss_scale))
        return rn_errorf(RN_ECORRUPT, "training state: loss scale %g is not a finite non-negative number",
                         t->loss_scale);
    return RN_OK;
}

/* The EMA set: its settings in range and a tensor for every parameter and buffer (np and
 * nb of them), named, shaped and checksummed as the model's own. */
static int check_ema(const Rn__EmaState *e, const rn_tensor_desc *d, int n, size_t np, size_t nb) {
    if (!(e->decay >= 0 && e->decay <= 1) || !(e->alpha >= 0 && e->alpha <= 1) || e->every < 1 || e->updates < 0 ||
        e->updates > RN_CKPT_MAX_STEPS)
        return rn_errorf(RN_ECORRUPT, "EMA: decay %g, alpha %g, every %d, updates %lld out of range", e->decay,
                         e->alpha, e->every, (long long)e->updates);
    if (e->n_params != np || e->n_buffers != nb)
        return rn_errorf(RN_ECORRUPT, "EMA: %zu parameters and %zu buffers, expected %zu and %zu", e->n_params,
                         e->n_buffers, np, nb);
    size_t kp = 0, kb = 0;
    for (int i = 0; i < n; i++) {
        int dtype = d[i].kind == RN_T_BN_COUNT ? RN_I64 : RN_F32;
        int rc = d[i].is_buffer ? check_tensor(e->buffers[kb++], "EMA buffers", &d[i], dtype)
                                : check_tensor(e->params[kp++], "EMA params", &d[i], dtype);
        if (rc) return rc;
    }
    return RN_OK;
}

int rn_ckpt_validate(const rn_ckpt *c) {
    if (c->format_version == 0) return rn_errorf(RN_ECORRUPT, "no format version: not an rn checkpoint");
    if (c->format_version != RN_FORMAT_VERSION)
        return rn_errorf(RN_ECORRUPT, "format version %u, this build reads version %d (use a matching rn)",
                         c->format_version, RN_FORMAT_VERSION);
    rn_resnet net;
    int rc = rn_ckpt_net(c, &net);
    if (rc != RN_OK) return rc;
    if (c->train && (rc = check_train_state(c->train)) != RN_OK) return rc;
    if (c->optim && c->optim->kind && *c->optim->kind && strcmp(c->optim->kind, "sgd") != 0 &&
        strcmp(c->optim->kind, "lars") != 0)
        return rn_errorf(RN_ECORRUPT, "optimiser '%.32s': this build knows sgd and lars", c->optim->kind);
    if (c->n_class_names != 0 && c->n_class_names != (size_t)net.num_classes)
        return rn_errorf(RN_ECORRUPT, "%zu class names for %d classes", c->n_class_names, net.num_classes);
    rn_tensor_desc *d = NULL;
    int n = 0;
    if ((rc = rn_resnet_tensors(&net, &d, &n)) != RN_OK) return rc;
    size_t np = 0, nb = 0;
    for (int i = 0; i < n && rc == RN_OK; i++) {
        int dtype = d[i].kind == RN_T_BN_COUNT ? RN_I64 : RN_F32;
        if (d[i].is_buffer) {
            if (nb >= c->n_buffers) rc = rn_errorf(RN_ECORRUPT, "buffer %s is missing", d[i].name);
            else rc = check_tensor(c->buffers[nb++], "buffers", &d[i], dtype);
        } else {
            if (np >= c->n_params) rc = rn_errorf(RN_ECORRUPT, "parameter %s is missing", d[i].name);
            else if ((rc = check_tensor(c->params[np], "params", &d[i], dtype)) == RN_OK && c->optim &&
                     c->optim->n_momentum > 0) {
                if (np >= c->optim->n_momentum)
                    rc = rn_errorf(RN_ECORRUPT, "optimiser momentum for %s is missing", d[i].name);
                else rc = check_tensor(c->optim->momentum[np], "momentum", &d[i], dtype);
            }
            np++;
        }
    }
    if (rc == RN_OK && np != c->n_params)
        rc = rn_errorf(RN_ECORRUPT, "%zu parameters where %s has %zu (extra tensor %s)", c->n_params, net.arch, np,
                       c->params[np]->name);
    if (rc == RN_OK && nb != c->n_buffers)
        rc = rn_errorf(RN_ECORRUPT, "%zu buffers where %s has %zu (extra tensor %s)", c->n_buffers, net.arch, nb,
                       c->buffers[nb]->name);
    if (rc == RN_OK && c->optim && c->optim->n_momentum > 0 && c->optim->n_momentum != np)
        rc = rn_errorf(RN_ECORRUPT, "%zu momentum tensors for %zu parameters", c->optim->n_momentum, np);
    if (rc == RN_OK && c->ema) rc = check_ema(c->ema, d, n, np, nb);
    free(d);
    return rc;
}

/* protobuf-c's allocations through rn_malloc, so that a tensor's bytes get huge pages
 * (rn_advise_huge); freed with free(), as rn_ckpt_free's default allocator does */
static void *pb_alloc(void *ctx, size_t n) {
    (void)ctx;
    return rn_malloc(n);
}
static void pb_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}
static ProtobufCAllocator pb_allocator = {pb_alloc, pb_free, NULL};

int rn_ckpt_parse(const uint8_t *buf, size_t len, const char *name, rn_ckpt **out) {
    if (len == 0) return rn_errorf(RN_ECORRUPT, "%s: empty file, not a checkpoint", name);
    rn_ckpt *c = rn__checkpoint__unpack(&pb_allocator, len, buf);
    if (!c)
        return rn_errorf(RN_ECORRUPT, "%s: not a valid rn checkpoint (%zu bytes; truncated or corrupt protobuf)", name,
                         len);
    int rc = rn_ckpt_validate(c);
    if (rc != RN_OK) {
        rn_ckpt_free(c);
        return rn_error_context(rc, "%s", name);
    }
    *out = c;
    return RN_OK;
}

int rn_ckpt_read(const char *path, rn_ckpt **out) {
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = rn_file_read(path, &buf, &len);
    if (rc != RN_OK) return rc;
    rc = rn_ckpt_parse(buf, len, path, out);
    free(buf);
    return rc;
}

static void seal(rn_ptensor **t, size_t n) {
    for (size_t i = 0; i < n; i++) t[i]->crc32c = rn_crc32c(0, t[i]->data.data, t[i]->data.len);
}

int rn_ckpt_write(const char *path, rn_ckpt *c) {
    c->format_version = RN_FORMAT_VERSION;
    seal(c->params, c->n_params);
    seal(c->buffers, c->n_buffers);
    if (c->optim) seal(c->optim->momentum, c->optim->n_momentum);
    if (c->ema) {
        seal(c->ema->params, c->ema->n_params);
        seal(c->ema->buffers, c->ema->n_buffers);
    }
    size_t len = rn__checkpoint__get_packed_size(c);
    uint8_t *buf = rn_malloc(len);
    if (!buf) return rn_errorf(RN_ENOMEM, "%s: out of memory packing %zu bytes", path, len);
    rn__checkpoint__pack(c, buf);
    int rc = rn_file_write_atomic(path, buf, len);
    free(buf);
    return rc;
}

int rn_ckpt_set_provenance(rn_ckpt *c, int argc, char **argv, const char *parent, int with_time) {
    if (!c->provenance) {
        c->provenance = rn_malloc(sizeof *c->provenance);
        if (!c->provenance) return RN_ENOMEM;
        rn__provenance__init(c->provenance);
    }
    Rn__Provenance *p = c->provenance;
    size_t n = 1;
    for (int i = 0; i < argc; i++) n += strlen(argv[i]) + 1;
    char *cmd = rn_malloc(n);
    if (!cmd) return RN_ENOMEM;
    size_t pos = 0;
    for (int i = 0; i < argc; i++) {
        size_t k = strlen(argv[i]);
        if (i) cmd[pos++] = ' ';
        memcpy(cmd + pos, argv[i], k);
        pos += k;
    }
    cmd[pos] = 0;
    char when[32], host[256] = "";
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    gethostname(host, sizeof host - 1);
    int rc = rn_pb_set_string(&p->rn_version, RN_VERSION);
    if (rc == RN_OK) rc = rn_pb_set_string(&p->command, cmd);
    if (rc == RN_OK) rc = rn_pb_set_string(&p->created, with_time ? when : "");
    if (rc == RN_OK) rc = rn_pb_set_string(&p->host, host);
    if (rc == RN_OK && parent) rc = rn_pb_set_string(&p->parent, parent);
    free(cmd);
    return rc;
}
