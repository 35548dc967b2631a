#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rn/ckpt.h"
#include "rn/convert.h"
#include "rn/err.h"
#include "rn/fileio.h"
#include "rn/resnet.h"
#include "rn/safetensors.h"
#include "rn/tensor.h"

static void test_spec(void) {
    rn_resnet net;
    CHECK_OK(rn_resnet_build(&net, "resnet50", 1000));
    CHECK(rn_resnet_param_count(&net) == 25557032, "resnet50 params %lld", (long long)rn_resnet_param_count(&net));
    CHECK(net.nunits == 53 && net.nblocks == 16, "resnet50 units %d blocks %d", net.nunits, net.nblocks);
    /* v1.5: stride 2 sits on the 3x3 conv of layer2.0 */
    const rn_block *b = &net.blocks[3];
    CHECK(strcmp(net.units[b->conv[1]].conv, "layer2.0.conv2") == 0 && net.units[b->conv[1]].stride == 2 &&
              net.units[b->conv[0]].stride == 1,
          "v1.5 stride placement");
    CHECK(b->down >= 0 && strcmp(net.units[b->down].bn, "layer2.0.downsample.1") == 0 && net.units[b->down].pad == 0,
          "downsample unit");
    rn_tensor_desc *d = NULL;
    int n = 0;
    CHECK_OK(rn_resnet_tensors(&net, &d, &n));
    CHECK(n == 320, "resnet50 state_dict has 320 entries, got %d", n);
    CHECK(strcmp(d[0].name, "conv1.weight") == 0 && strcmp(d[5].name, "bn1.num_batches_tracked") == 0 &&
              strcmp(d[n - 1].name, "fc.bias") == 0,
          "order");
    free(d);
    CHECK_OK(rn_resnet_build(&net, "resnet18", 10));
    CHECK(net.blocks[0].down == -1 && net.blocks[2].down >= 0, "resnet18 shortcuts");
    CHECK(rn_resnet_build(&net, "vgg16", 10) == RN_EINVAL && strstr(rn_last_error(), "vgg16"), "unknown arch");
}

static void test_roundtrip(void) {
    char path[] = "/tmp/rn-test-ckpt-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    rn_resnet net;
    rn_ckpt *c = NULL, *r = NULL;
    CHECK_OK(rn_resnet_build(&net, "resnet18", 5));
    CHECK_OK(rn_ckpt_new(&net, &c));
    CHECK_OK(rn_ckpt_init(c, &net, 1, 1));
    CHECK(rn_ckpt_find(c, "layer1.0.bn2.weight") && rn_ptensor_f32(rn_ckpt_find(c, "layer1.0.bn2.weight"))[0] == 0.0f,
          "zero-init-residual on the last BN");
    CHECK(rn_ptensor_f32(rn_ckpt_find(c, "layer1.0.bn1.weight"))[0] == 1.0f, "other BN gamma 1");
    CHECK_OK(rn_ckpt_write(path, c));
    CHECK_OK(rn_ckpt_read(path, &r));
    CHECK(r && r->n_params == c->n_params && r->n_buffers == c->n_buffers, "counts survive");
    if (r) {
        rn_ptensor *a = rn_ckpt_find(c, "fc.weight"), *b = rn_ckpt_find(r, "fc.weight");
        CHECK(b && a->data.len == b->data.len && memcmp(a->data.data, b->data.data, a->data.len) == 0, "fc survives");
    }
    /* corrupting one value in memory is caught by the checksum and named */
    rn_ptensor_f32(rn_ckpt_find(r, "layer2.1.conv1.weight"))[3] += 1.0f;
    CHECK(rn_ckpt_validate(r) == RN_ECORRUPT && strstr(rn_last_error(), "layer2.1.conv1.weight"), "crc names tensor: %s",
          rn_last_error());
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "no tmp file left");
    rn_ckpt_free(c);
    rn_ckpt_free(r);
    unlink(path);
}

static void test_safetensors(void) {
    char path[] = "/tmp/rn-test-st-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t b[1] = {42};
    rn_st_tensor t[2] = {{.name = "w\"q", .dtype = 1, .ndim = 2, .shape = {2, 3}, .data = (void *)a, .nbytes = 24},
                         {.name = "n", .dtype = 6, .ndim = 0, .data = (void *)b, .nbytes = 8}};
    const char *k[] = {"arch"}, *v[] = {"res\\net"};
    CHECK_OK(rn_st_write(path, t, 2, k, v, 1));
    rn_safetensors *st = NULL;
    CHECK_OK(rn_st_read(path, &st));
    if (st) {
        CHECK(st->n == 2 && strcmp(st->t[0].name, "w\"q") == 0 && st->t[0].ndim == 2 && st->t[0].shape[1] == 3,
              "tensor header");
        CHECK(memcmp(st->t[0].data, a, 24) == 0 && st->t[1].ndim == 0 && memcmp(st->t[1].data, b, 8) == 0, "data");
        CHECK(rn_st_meta(st, "arch") && strcmp(rn_st_meta(st, "arch"), "res\\net") == 0, "metadata escapes");
        CHECK(((uintptr_t)(st->t[0].data - st->file)) % 8 == 0, "data aligned to 8");
    }
    rn_st_free(st);
    /* a truncated file is refused with its name */
    uint8_t *buf;
    size_t len;
    CHECK_OK(rn_file_read(path, &buf, &len));
    CHECK_OK(rn_file_write_atomic(path, buf, len - 4));
    st = NULL;
    CHECK(rn_st_read(path, &st) == RN_ECORRUPT && strstr(rn_last_error(), path), "truncated: %s", rn_last_error());
    free(buf);
    unlink(path);
}

/* A safetensors file of the given header and data bytes, exactly sized (no slack after
 * the header, so a parser reading past it is caught by ASan), then read: RN_ECORRUPT and
 * a message holding want. */
static void st_hostile(const char *header, size_t data_len, const char *want) {
    char path[] = "/tmp/rn-test-sth-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    size_t hl = strlen(header), total = 8 + hl + data_len;
    uint8_t *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)(i * 7 + 1);
    CHECK_OK(rn_file_write_atomic(path, buf, total));
    rn_safetensors *st = NULL;
    int rc = rn_st_read(path, &st);
    CHECK(rc == RN_ECORRUPT && st == NULL && strstr(rn_last_error(), want),
          "%s: rc %d, message '%s' (want '%s')", header, rc, rn_last_error(), want);
    rn_st_free(st);
    free(buf);
    unlink(path);
}

/* headers an attacker would write: each refused with a message, none read out of bounds */
static void test_safetensors_hostile(void) {
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlapping");
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "appears twice");
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}xyz", 8, "after its closing");
    /* an element count that wraps to 0 bytes */
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
               "do not match its shape");
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,0]}}", 0,
               "over 2^63");
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,0]}}", 0, "non-negative number");
    /* the header ends inside a number: strtoll would read on into the data */
    st_hostile("{\"a\":{\"dtype\":\"F32\",\"shape\":[1", 4, "bad safetensors header");
}

/* Counters, kinds and counts that a hostile or corrupt checkpoint may hold are refused
 * when loading, each named: an epoch of INT_MAX overflowed rn-train's epoch + 1. */
static void test_state_checks(void) {
    rn_resnet net;
    rn_ckpt *c = NULL;
    CHECK_OK(rn_resnet_build(&net, "resnet18", 5));
    CHECK_OK(rn_ckpt_new(&net, &c));
    CHECK_OK(rn_ckpt_init(c, &net, 1, 0));
    if (!c) return;
    char ck_path[] = "/tmp/rn-test-ckst-XXXXXX";
    int cfd = mkstemp(ck_path);
    close(cfd);
    CHECK_OK(rn_ckpt_write(ck_path, c)); /* seals the tensors' checksums */
    unlink(ck_path);
    Rn__TrainState *t = malloc(sizeof *t);
    rn__train_state__init(t);
    c->train = t;
    CHECK_OK(rn_ckpt_validate(c));
    t->epoch = 2147483647;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "epoch is 2147483647"), "epoch INT_MAX: %s",
          rn_last_error());
    t->epoch = 3;
    t->step = -1;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "step is -1"), "negative step: %s",
          rn_last_error());
    t->step = 12;
    t->loss_scale = 1.0 / 0.0;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "loss scale"), "infinite scale: %s",
          rn_last_error());
    t->loss_scale = 65536;
    CHECK_OK(rn_ckpt_validate(c));
    t->warmup_decay = 1.5;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "warm-up start factor 1.5"),
          "warm-up decay: %s", rn_last_error());
    t->warmup_decay = 0.0 / 0.0;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT, "NaN warm-up decay");
    t->warmup_decay = 0.01;
    /* the method's name, like the schedule's, is a record for rn-info (rn-train takes the
     * schedule from its flags): a name a later version adds is read, not refused */
    t->warmup_method = strdup("exp");
    CHECK_OK(rn_ckpt_validate(c));
    Rn__OptimState *o = malloc(sizeof *o);
    rn__optim_state__init(o);
    o->kind = strdup("adam");
    c->optim = o;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "adam"), "optimiser kind: %s", rn_last_error());
    free(o->kind);
    o->kind = strdup("sgd");
    CHECK_OK(rn_ckpt_validate(c));
    c->class_names = malloc(2 * sizeof(char *));
    c->class_names[0] = strdup("cat"), c->class_names[1] = strdup("dog");
    c->n_class_names = 2;
    CHECK(rn_ckpt_validate(c) == RN_ECORRUPT && strstr(rn_last_error(), "2 class names for 5 classes"),
          "class names: %s", rn_last_error());
    rn_ckpt_free(c);
    CHECK(rn_resnet_build(&net, "resnet50", RN_MAX_CLASSES + 1) == RN_EINVAL, "over RN_MAX_CLASSES accepted");

    /* a safetensors fc.weight of (3000000, 0): refused before anything is sized by it */
    char path[] = "/tmp/rn-test-stfc-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    uint8_t dummy = 0;
    rn_st_tensor fc = {.name = "fc.weight", .dtype = RN_F32, .ndim = 2, .shape = {3000000, 0}, .data = &dummy,
                       .nbytes = 0};
    CHECK_OK(rn_st_write(path, &fc, 1, NULL, NULL, 0));
    rn_safetensors *st = NULL;
    CHECK_OK(rn_st_read(path, &st));
    rn_ckpt *imp = NULL;
    if (st)
        CHECK(rn_ckpt_from_safetensors(st, "resnet18", 0, 0, &imp) == RN_ECORRUPT &&
                  strstr(rn_last_error(), "fc.weight has shape (3000000, 0)"),
              "fc (3000000, 0): %s", rn_last_error());
    rn_ckpt_free(imp);
    rn_st_free(st);
    unlink(path);
}

int main(void) {
    test_spec();
    test_state_checks();
    test_roundtrip();
    test_safetensors();
    test_safetensors_hostile();
    return check_done("test_ckpt");
}
