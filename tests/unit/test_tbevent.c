/* TensorBoard event files (rn/tbevent.h): the framing's CRCs, a write read back, the
 * per-tag step rule across writers on one folder, damaged files, write errors. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "rn/crc32c.h"
#include "rn/err.h"
#include "rn/tbevent.h"

/* CRC32C bit by bit: an implementation independent of lib/crc32c.c's tables */
static uint32_t crc_bitwise(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

static void test_crc(void) {
    /* the Castagnoli check value (RFC 3720's CRC32C of "123456789") */
    CHECK(rn_crc32c(0, "123456789", 9) == 0xE3069283u, "%08x", rn_crc32c(0, "123456789", 9));
    uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7 + 3);
    CHECK(rn_crc32c(0, buf, 1000) == crc_bitwise(buf, 1000), "tables against bits");
    CHECK(rn_tb_mask(0) == 0xa282ead8u, "%08x", rn_tb_mask(0));
    CHECK(rn_tb_mask(0x12345678u) == 0x4f730f40u, "%08x", rn_tb_mask(0x12345678u));
}

/* what a read saw */
typedef struct {
    int n, versions, texts;
    char tag[64][32];
    int64_t step[64];
    double value[64];
} seen;

static int collect(void *ctx, const rn_tb_item *it) {
    seen *s = ctx;
    if (it->kind == RN_TB_VERSION) {
        s->versions += strcmp(it->text, RN_TB_FILE_VERSION) == 0;
        return 0;
    }
    if (s->n == 64) return 0;
    snprintf(s->tag[s->n], sizeof s->tag[0], "%s", it->tag);
    s->step[s->n] = it->step;
    s->value[s->n] = it->kind == RN_TB_SCALAR ? it->value : -1;
    if (it->kind == RN_TB_TEXT) s->texts += strcmp(it->text, "hello\n\n    world") == 0;
    s->n++;
    return 0;
}

/* every event file of dir, read in name order */
static int read_dir(const char *dir, seen *s, int *files) {
    char **p;
    int n, rc = rn_tb_list(dir, &p, &n);
    if (rc) return rc;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < n && rc == RN_OK; i++) rc = rn_tb_read(p[i], 0, collect, s);
    rn_tb_list_free(p, n);
    *files = n;
    return rc;
}

static void flip(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5A, f);
    fclose(f);
}

static void test_roundtrip_and_steps(const char *tmp) {
    char dir[512], copy[600];
    snprintf(dir, sizeof dir, "%s/a/b", tmp); /* parents made too */
    rn_tb_writer *w;
    CHECK_OK(rn_tb_open(dir, &w));
    CHECK(rn_tb_max_step(w) == -1, "fresh folder");
    CHECK_OK(rn_tb_text(w, "run/flags", 0, "hello\n\n    world"));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 1, 0.5));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 2, 0.25));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 2, 9.0)); /* a step the tag has: dropped */
    CHECK_OK(rn_tb_scalar(w, "train/lr", 2, 0.1));
    snprintf(copy, sizeof copy, "%s", rn_tb_path(w));
    CHECK(strstr(copy, "/events.out.tfevents.") != NULL, "%s", copy);
    CHECK_OK(rn_tb_close(w));
    seen s;
    int files;
    CHECK_OK(read_dir(dir, &s, &files));
    CHECK(files == 1 && s.versions == 1 && s.n == 4 && s.texts == 1, "%d files %d versions %d values", files,
          s.versions, s.n);
    CHECK(s.step[2] == 2 && s.value[2] == 0.25 && (float)s.value[3] == 0.1f, "values read back");

    /* a second writer on the folder: a new file; each tag goes on above its own steps */
    CHECK_OK(rn_tb_open(dir, &w));
    CHECK(rn_tb_max_step(w) == 2, "%lld", (long long)rn_tb_max_step(w));
    CHECK(strcmp(rn_tb_path(w), copy) != 0, "a new file");
    CHECK_OK(rn_tb_text(w, "run/flags", 0, "again"));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 1, 7));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 2, 7));
    CHECK_OK(rn_tb_scalar(w, "train/loss", 3, 0.125));
    CHECK_OK(rn_tb_scalar(w, "val/top1", 1, 0.75));
    CHECK_OK(rn_tb_close(w));
    CHECK_OK(read_dir(dir, &s, &files));
    CHECK(files == 2 && s.versions == 2 && s.n == 6, "%d files %d versions %d values", files, s.versions, s.n);
    CHECK(strcmp(s.tag[4], "train/loss") == 0 && s.step[4] == 3 && s.value[4] == 0.125, "%s %lld", s.tag[4],
          (long long)s.step[4]);
    CHECK(strcmp(s.tag[5], "val/top1") == 0 && s.step[5] == 1, "%s", s.tag[5]);

    /* a truncated last record (a writer killed mid-write): reported by a strict read,
       ignored by tail_ok and by the next writer's scan */
    struct stat st;
    stat(copy, &st);
    CHECK(truncate(copy, st.st_size - 3) == 0, "truncate");
    memset(&s, 0, sizeof s);
    CHECK(rn_tb_read(copy, 0, collect, &s) == RN_ECORRUPT, "strict read of a truncated file");
    CHECK(strstr(rn_last_error(), "truncated") != NULL, "%s", rn_last_error());
    memset(&s, 0, sizeof s);
    CHECK_OK(rn_tb_read(copy, 1, collect, &s));
    CHECK(s.n == 3, "%d values before the cut", s.n);
    CHECK_OK(rn_tb_open(dir, &w));
    CHECK_OK(rn_tb_close(w));
    /* an empty file (one a writer has just made): strict reading refuses it, the scan not */
    char empty[600];
    snprintf(empty, sizeof empty, "%s/events.out.tfevents.0000000000.empty", dir);
    fclose(fopen(empty, "w"));
    CHECK(rn_tb_read(empty, 0, collect, &s) == RN_ECORRUPT, "strict read of an empty file");
    CHECK_OK(rn_tb_open(dir, &w));
    CHECK_OK(rn_tb_close(w));

    /* a flipped byte in a record's data, then in its length: the CRC names it */
    flip(copy, 20);
    CHECK(rn_tb_read(copy, 1, collect, &s) == RN_ECORRUPT, "flipped data byte");
    CHECK(strstr(rn_last_error(), "the data fails its CRC32C") != NULL, "%s", rn_last_error());
    CHECK(rn_tb_open(dir, &w) == RN_ECORRUPT, "a damaged file in the folder stops the writer");
    CHECK(strstr(rn_last_error(), "move the file out of it") != NULL, "%s", rn_last_error());
    flip(copy, 20);
    flip(copy, 1);
    CHECK(rn_tb_read(copy, 1, collect, &s) == RN_ECORRUPT, "flipped length byte");
    CHECK(strstr(rn_last_error(), "record 0 at byte 0: the length fails its CRC32C") != NULL, "%s", rn_last_error());
}

static void test_write_errors(const char *tmp) {
    char path[512];
    rn_tb_writer *w;
    /* a folder that cannot be made: under a plain file */
    snprintf(path, sizeof path, "%s/plain", tmp);
    fclose(fopen(path, "w"));
    snprintf(path, sizeof path, "%s/plain/tb", tmp);
    CHECK(rn_tb_open(path, &w) == RN_EIO, "under a file");
    CHECK(strstr(rn_last_error(), "plain is not a folder") != NULL, "%s", rn_last_error());
    /* a full disk at the first flush */
    CHECK(rn_tb_open_file("/dev/full", &w) == RN_EIO, "/dev/full");
    CHECK(strstr(rn_last_error(), "/dev/full: cannot write: No space left on device") != NULL, "%s", rn_last_error());

    /* a write failing mid-run through the report sink (a file size limit, in a child):
       one message, and the sink goes on without writing */
    char err_path[512];
    snprintf(path, sizeof path, "%s/limited", tmp);
    snprintf(err_path, sizeof err_path, "%s/limited.err", tmp);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *err = fopen(err_path, "w");
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit lim = {600, 600};
        setrlimit(RLIMIT_FSIZE, &lim);
        rn_tb_writer *cw;
        rn_reporter r;
        char *argv[] = {"rn-train", "--epochs", "1"};
        if (rn_tb_open(path, &cw) || rn_report_tensorboard(cw, "rn-train", 3, argv, err, &r)) _exit(3);
        rn_run_info run = {.step = 0};
        r.begin(r.ctx, &run);
        for (int k = 1; k <= 20; k++) {
            rn_step_info st = {.step = k, .loss = 1.0 / k, .lr = 0.1, .img_s = 100, .data_wait = 0.01};
            r.step(r.ctx, &st);
        }
        r.close(r.ctx);
        fclose(err);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    char msg[1024] = "";
    FILE *f = fopen(err_path, "r");
    size_t got = f ? fread(msg, 1, sizeof msg - 1, f) : 0;
    msg[got] = 0;
    if (f) fclose(f);
    CHECK(strstr(msg, "rn-train: --tensorboard ") != NULL && strstr(msg, "File too large; no more events are written") != NULL,
          "%s", msg);
    CHECK(strchr(msg, '\n') == msg + strlen(msg) - 1, "one line: %s", msg);
    seen s;
    memset(&s, 0, sizeof s);
    /* what was flushed before the limit reads back (the cut record is the tail) */
    char **p;
    int n;
    CHECK_OK(rn_tb_list(path, &p, &n));
    CHECK(n == 1, "%d files", n);
    if (n == 1) CHECK_OK(rn_tb_read(p[0], 1, collect, &s));
    rn_tb_list_free(p, n);
    CHECK(s.n >= 1, "%d values kept", s.n);
}

int main(void) {
    char tmp[] = "/tmp/rn_test_tbevent_XXXXXX";
    if (!mkdtemp(tmp)) return 1;
    test_crc();
    test_roundtrip_and_steps(tmp);
    test_write_errors(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_done("test_tbevent");
}
