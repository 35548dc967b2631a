/* The adapter between a run's state (loop, optimiser, history, class names) and the
 * checkpoint's protobuf messages. */
#include "rn/state.h"

#include <stdlib.h>
#include <string.h>

#include "rn/err.h"
#include "rn/tensor.h"

void rn_state_get(const rn_ckpt *c, rn_run_state *s) {
    memset(s, 0, sizeof *s);
    const Rn__TrainState *t = c->train;
    if (!t) return;
    s->epoch = t->epoch;
    s->step = t->step;
    s->seed = t->seed;
    s->steps_per_epoch = t->steps_per_epoch;
    s->data_epoch = t->data_epoch;
    s->data_index = t->data_index;
    s->loss_scale = t->loss_scale;
    s->scale_growth_tracker = t->scale_growth_tracker;
    s->skipped_steps = t->skipped_steps;
    s->batch = t->batch;
    s->accum = t->accum;
}

int rn_state_put(rn_ckpt *c, const rn_run_state *s, const rn_lr_schedule *lr) {
    if (!c->train) {
        c->train = rn_malloc(sizeof *c->train);
        if (!c->train) return RN_ENOMEM;
        rn__train_state__init(c->train);
    }
    Rn__TrainState *t = c->train;
    t->epoch = s->epoch;
    t->step = s->step;
    t->seed = s->seed;
    t->steps_per_epoch = s->steps_per_epoch;
    t->data_epoch = s->data_epoch;
    t->data_index = s->data_index;
    t->loss_scale = s->loss_scale;
    t->scale_growth_tracker = s->scale_growth_tracker;
    t->skipped_steps = s->skipped_steps;
    t->batch = s->batch;
    t->accum = s->accum;
    int rc = rn_pb_set_string(&t->lr_schedule, rn_lr_schedule_name(lr->schedule));
    if (rc) return rc;
    t->lr_step = lr->step_epochs;
    t->lr_gamma = lr->gamma;
    t->warmup_epochs = lr->warmup_epochs;
    t->total_epochs = lr->total_epochs;
    t->lr_end = lr->schedule == RN_LR_POLY ? lr->lr_end : lr->schedule == RN_LR_COSINE ? lr->lr_min : 0;
    t->lr_power = lr->schedule == RN_LR_POLY ? lr->power : 0;
    t->lr_per_epoch = lr->per_epoch != 0;
    if ((rc = rn_pb_set_string(&t->warmup_method, rn_warmup_method_name(lr->warmup_method)))) return rc;
    t->warmup_decay = lr->warmup_method != RN_WARMUP_RAMP ? lr->warmup_decay : 0;
    free(t->lr_milestones);
    t->lr_milestones = NULL;
    t->n_lr_milestones = 0;
    if (lr->n_milestones) {
        t->lr_milestones = rn_malloc(sizeof(int32_t) * (size_t)lr->n_milestones);
        if (!t->lr_milestones) return RN_ENOMEM;
        memcpy(t->lr_milestones, lr->milestones, sizeof(int32_t) * (size_t)lr->n_milestones);
        t->n_lr_milestones = (size_t)lr->n_milestones;
    }
    return RN_OK;
}

int rn_state_put_sgd(rn_ckpt *c, double lr, double momentum, double weight_decay, int nesterov) {
    if (!c->optim) return RN_OK;
    c->optim->lr = lr;
    c->optim->momentum_coef = momentum;
    c->optim->weight_decay = weight_decay;
    c->optim->nesterov = nesterov;
    return rn_pb_set_string(&c->optim->kind, "sgd");
}

int rn_state_put_lars(rn_ckpt *c, double eta, double eps) {
    if (!c->optim) return RN_OK;
    c->optim->lars_eta = eta;
    c->optim->lars_eps = eps;
    c->optim->nesterov = 0;
    return rn_pb_set_string(&c->optim->kind, "lars");
}

const char *rn_state_optim_kind(const rn_ckpt *c) {
    if (!rn_state_has_momentum(c)) return NULL;
    return c->optim->kind && *c->optim->kind ? c->optim->kind : "sgd";
}

int rn_state_has_momentum(const rn_ckpt *c) {
    return c->optim && c->optim->n_momentum == c->n_params && c->n_params > 0;
}

rn_ptensor *rn_state_momentum(const rn_ckpt *c, const char *name) {
    if (!c->optim) return NULL;
    for (size_t k = 0; k < c->optim->n_momentum; k++)
        if (strcmp(c->optim->momentum[k]->name, name) == 0) return c->optim->momentum[k];
    return NULL;
}

int rn_state_momentum_alloc(rn_ckpt *c) {
    if (!c->optim) {
        c->optim = rn_malloc(sizeof *c->optim);
        if (!c->optim) return RN_ENOMEM;
        rn__optim_state__init(c->optim);
    }
    Rn__OptimState *o = c->optim;
    if (o->n_momentum == c->n_params) return RN_OK;
    for (size_t k = 0; k < o->n_momentum; k++) rn_ptensor_free(o->momentum[k]);
    free(o->momentum);
    o->n_momentum = 0;
    o->momentum = rn_calloc(c->n_params, sizeof(rn_ptensor *));
    if (!o->momentum) return RN_ENOMEM;
    for (size_t k = 0; k < c->n_params; k++) {
        const rn_ptensor *t = c->params[k];
        o->momentum[k] = rn_ptensor_new(t->name, RN_F32, (int)t->n_shape, t->shape);
        if (!o->momentum[k]) return RN_ENOMEM;
        o->n_momentum++;
    }
    return rn_pb_set_string(&o->kind, "sgd");
}

/* n zeroed tensors shaped and named like src's */
static int mirror(rn_ptensor *const *src, size_t n, rn_ptensor ***dst, size_t *ndst) {
    *dst = rn_calloc(n ? n : 1, sizeof(rn_ptensor *));
    if (!*dst) return RN_ENOMEM;
    for (size_t k = 0; k < n; k++) {
        (*dst)[k] = rn_ptensor_new(src[k]->name, (int)src[k]->dtype, (int)src[k]->n_shape, src[k]->shape);
        if (!(*dst)[k]) return RN_ENOMEM;
        (*ndst)++;
    }
    return RN_OK;
}

int rn_state_ema_alloc(rn_ckpt *c) {
    if (c->ema) return RN_OK;
    c->ema = rn_malloc(sizeof *c->ema);
    if (!c->ema) return RN_ENOMEM;
    rn__ema_state__init(c->ema);
    int rc = mirror(c->params, c->n_params, &c->ema->params, &c->ema->n_params);
    if (rc == RN_OK) rc = mirror(c->buffers, c->n_buffers, &c->ema->buffers, &c->ema->n_buffers);
    return rc;
}

void rn_state_ema_drop(rn_ckpt *c) {
    if (c->ema) rn__ema_state__free_unpacked(c->ema, NULL);
    c->ema = NULL;
}

int rn_state_use_ema(rn_ckpt *c, const char *what) {
    if (!c->ema)
        return rn_errorf(RN_EINVAL, "%s holds no EMA weights (--ema asks for them): train with rn-train --ema-decay D "
                         "to make them, or leave out --ema", what);
    rn_ptensor **p = c->params, **b = c->buffers;
    size_t np = c->n_params, nb = c->n_buffers;
    c->params = c->ema->params, c->n_params = c->ema->n_params;
    c->buffers = c->ema->buffers, c->n_buffers = c->ema->n_buffers;
    c->ema->params = p, c->ema->n_params = np;
    c->ema->buffers = b, c->ema->n_buffers = nb;
    return RN_OK;
}

int rn_state_add_epoch(rn_ckpt *c, const rn_epoch_info *e) {
    Rn__EpochMetrics **h = realloc(c->history, sizeof *h * (c->n_history + 1));
    if (!h) return rn_errorf(RN_ENOMEM, "out of memory");
    c->history = h;
    Rn__EpochMetrics *m = rn_malloc(sizeof *m);
    if (!m) return RN_ENOMEM;
    rn__epoch_metrics__init(m);
    m->epoch = e->epoch;
    m->step = e->step;
    m->train_loss = e->train_loss;
    m->lr = e->lr;
    m->seconds = e->seconds;
    m->images_per_second = e->img_s;
    m->val_top1 = e->val_top1;
    m->val_top5 = e->val_top5;
    m->val_loss = e->val_loss;
    m->val_n = e->val_n;
    if (e->has_ema_val) {
        m->ema_val_top1 = e->ema_top1;
        m->ema_val_top5 = e->ema_top5;
        m->ema_val_loss = e->ema_loss;
    }
    h[c->n_history++] = m;
    return RN_OK;
}

int rn_state_set_class_names(rn_ckpt *c, char *const *names, int n) {
    if (c->n_class_names || n <= 0) return RN_OK;
    c->class_names = rn_calloc((size_t)n, sizeof(char *));
    if (!c->class_names) return RN_ENOMEM;
    for (int i = 0; i < n; i++) {
        c->class_names[i] = strdup(names[i]);
        if (!c->class_names[i]) return rn_errorf(RN_ENOMEM, "out of memory");
        c->n_class_names++;
    }
    return RN_OK;
}

int rn_state_put_provenance(rn_ckpt *c, int argc, char **argv, const char *dataset) {
    int rc = rn_ckpt_set_provenance(c, argc, argv, NULL, 1);
    if (rc) return rc;
    return rn_pb_set_string(&c->provenance->dataset, dataset);
}
