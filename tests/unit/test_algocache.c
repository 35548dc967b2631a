/* The cuDNN algorithm cache file (rn/algocache.h): round trip, the last line winning,
 * malformed and stale lines ignored and counted, a file that cannot be written, binary
 * junk, and whole lines from processes appending at once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "rn/algocache.h"
#include "rn/err.h"

static rn_algo_key key_of(int i) {
    rn_algo_key k;
    memset(&k, 0, sizeof k);
    snprintf(k.device, sizeof k.device, "NVIDIA_H200_sm90");
    k.cudnn = 91300;
    int s[12] = {i % 3, 256, 56, 56, 64, 64 + i, 3, 3, 1, 1, 1, 1};
    memcpy(k.shape, s, sizeof s);
    k.dir = 1 << (i % 3);
    k.flags = i % 4;
    k.ws_limit = (uint64_t)1 << 30;
    return k;
}

static rn_algo_val val_of(int i) { return (rn_algo_val){.algo = i % 8, .math = i % 3, .ws = (uint64_t)i * 4096}; }

static size_t count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    size_t n = 0;
    int ch;
    while (f && (ch = fgetc(f)) != EOF) n += ch == '\n';
    if (f) fclose(f);
    return n;
}

int main(void) {
    char dir[] = "/tmp/rn-algocache-XXXXXX", path[256], buf[512];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/new/folder/algos.txt", dir);

    /* a missing file is an empty cache; puts create the folders and the file */
    rn_algocache *c = NULL;
    CHECK_OK(rn_algocache_open(path, &c));
    CHECK(c && rn_algocache_size(c) == 0 && rn_algocache_ignored(c) == 0, "a missing file: empty");
    rn_algo_val v;
    rn_algo_key k0 = key_of(0);
    CHECK(c && !rn_algocache_get(c, &k0, &v), "nothing found in an empty cache");
    for (int i = 0; c && i < 5; i++) {
        rn_algo_key k = key_of(i);
        rn_algo_val w = val_of(i);
        CHECK_OK(rn_algocache_put(c, &k, &w));
    }
    CHECK(count_lines(path) == 5, "5 puts: %zu lines in %s", count_lines(path), path);
    rn_algocache_free(c);

    /* read back; a key met again takes the later line */
    CHECK_OK(rn_algocache_open(path, &c));
    CHECK(c && rn_algocache_size(c) == 5 && rn_algocache_ignored(c) == 0, "read back 5, got %zu",
          rn_algocache_size(c));
    for (int i = 0; c && i < 5; i++) {
        rn_algo_key k = key_of(i);
        rn_algo_val want = val_of(i);
        int hit = rn_algocache_get(c, &k, &v);
        CHECK(hit && v.algo == want.algo && v.math == want.math && v.ws == want.ws, "entry %d: hit %d algo %d", i, hit,
              hit ? v.algo : -1);
    }
    rn_algo_key k2 = key_of(2);
    k2.ws_limit /= 2; /* another workspace limit is another key */
    CHECK(c && !rn_algocache_get(c, &k2, &v), "a different workspace limit is a miss");
    k2 = key_of(2);
    rn_algo_val nv = {.algo = 7, .math = 1, .ws = 123};
    CHECK_OK(rn_algocache_put(c, &k2, &nv));
    rn_algocache_free(c);
    CHECK_OK(rn_algocache_open(path, &c));
    CHECK(c && rn_algocache_size(c) == 5 && rn_algocache_get(c, &k2, &v) && v.algo == 7 && v.ws == 123,
          "the last line for a key wins");
    rn_algocache_free(c);

    /* another device's and another cuDNN's choices are kept (a shared cache) and counted
       apart once the note knows this process's */
    CHECK_OK(rn_algocache_open(path, &c));
    rn_algo_key ko = key_of(0);
    snprintf(ko.device, sizeof ko.device, "NVIDIA_A100-SXM4-80GB_sm80");
    CHECK_OK(rn_algocache_put(c, &ko, &nv));
    ko = key_of(1);
    ko.cudnn = 90100;
    CHECK_OK(rn_algocache_put(c, &ko, &nv));
    CHECK(c && strstr(rn_algocache_note(c), ": 7 choices") && !strstr(rn_algocache_note(c), "for others"),
          "before set_here: %s", rn_algocache_note(c));
    rn_algocache_set_here(c, key_of(0).device, key_of(0).cudnn);
    CHECK(c && strstr(rn_algocache_note(c), ": 7 choices (5 for this device and cuDNN, 2 for others)"), "note: %s",
          rn_algocache_note(c));
    rn_algocache_set_here(c, "NVIDIA_A100-SXM4-80GB_sm80", 91300);
    CHECK(c && strstr(rn_algocache_note(c), "(1 for this device and cuDNN, 6 for others)"), "note: %s",
          rn_algocache_note(c));
    rn_algocache_free(c);
    CHECK_OK(rn_algocache_open(path, &c));
    rn_algocache_set_here(c, key_of(0).device, key_of(0).cudnn);
    CHECK(c && rn_algocache_size(c) == 7 && strstr(rn_algocache_note(c), "(5 for this device and cuDNN, 2 for others)"),
          "read back: %s", rn_algocache_note(c));
    rn_algocache_free(c);

    /* damage: each bad line is ignored and counted, the good ones stay */
    FILE *f = fopen(path, "a");
    fputs("garbage\n", f);
    fputs("rn-algo-0 NVIDIA_H200_sm90 91300 0 256 56 56 64 64 3 3 1 1 1 1 1 0 1073741824 1 0 0\n", f); /* old tag */
    fputs("rn-algo-1 NVIDIA_H200_sm90 91300 0 256 56 56 64 64 3 3 1 1 1 1 1 0 1073741824 99 0 0\n", f); /* algo 99 */
    fputs("rn-algo-1 NVIDIA_H200_sm90 91300 0 256 56 56 64 64 3 3 1 1 1 1 3 0 1073741824 1 0 0\n", f);  /* dir 3 */
    fputs("rn-algo-1 NVIDIA_H200_sm90 91300 0 256 56 56 64 64 3 3 1 1 1 1 1 0 1073741824 1 0 0 extra\n", f);
    memset(buf, 'x', sizeof buf - 1);
    buf[sizeof buf - 1] = 0;
    fputs(buf, f), fputs(buf, f), fputs("\n", f); /* one line of 1022 characters */
    fputs("rn-algo-1 NVIDIA_H200_sm90 91300 0 256 56 56 64 64 3 3 1 1 1 1 1 0 107374", f); /* cut short */
    fclose(f);
    CHECK_OK(rn_algocache_open(path, &c));
    CHECK(c && rn_algocache_size(c) == 7, "after damage: %zu entries", rn_algocache_size(c));
    CHECK(c && rn_algocache_ignored(c) == 7, "7 bad lines, %zu ignored", rn_algocache_ignored(c));
    CHECK(c && strstr(rn_algocache_note(c), "7 malformed or stale lines ignored"), "note: %s", rn_algocache_note(c));
    rn_algocache_free(c);

    /* binary junk, NULs included */
    char junk[256];
    snprintf(junk, sizeof junk, "%s/junk.txt", dir);
    f = fopen(junk, "wb");
    for (int i = 0; i < 4096; i++) fputc((i * 2654435761u) >> 13 & 0xff, f);
    fclose(f);
    CHECK_OK(rn_algocache_open(junk, &c));
    CHECK(c && rn_algocache_size(c) == 0 && rn_algocache_ignored(c) > 0, "junk: %zu entries, %zu ignored",
          rn_algocache_size(c), rn_algocache_ignored(c));
    rn_algocache_free(c);

    /* a path that cannot be written (its folder is a file): works from memory, says so */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/sub/algos.txt", junk);
    CHECK_OK(rn_algocache_open(bad, &c));
    CHECK_OK(rn_algocache_put(c, &k0, &nv));
    CHECK(c && rn_algocache_get(c, &k0, &v) && v.algo == 7, "kept in memory when the file cannot be written");
    CHECK(c && strstr(rn_algocache_note(c), "not written: Not a directory"), "note: %s", rn_algocache_note(c));
    rn_algocache_free(c);
    rn_algo_key sp = key_of(1);
    strcpy(sp.device, "two words");
    CHECK_OK(rn_algocache_open(path, &c));
    CHECK(c && rn_algocache_put(c, &sp, &nv) == RN_EINVAL, "a device name with a space is refused");
    rn_algocache_free(c);

    /* four processes appending at once: every line whole */
    char shared[256];
    snprintf(shared, sizeof shared, "%s/shared.txt", dir);
    enum { PROCS = 4, EACH = 300 };
    for (int p = 0; p < PROCS; p++) {
        pid_t pid = fork();
        if (pid == 0) {
            rn_algocache *pc = NULL;
            if (rn_algocache_open(shared, &pc) != RN_OK) _exit(1);
            for (int i = 0; i < EACH; i++) {
                rn_algo_key k = key_of(p * EACH + i);
                rn_algo_val w = val_of(i);
                if (rn_algocache_put(pc, &k, &w) != RN_OK) _exit(1);
            }
            rn_algocache_free(pc);
            _exit(0);
        }
    }
    int ok = 1, st;
    while (wait(&st) > 0) ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    CHECK(ok, "an appending process failed");
    CHECK_OK(rn_algocache_open(shared, &c));
    CHECK(c && rn_algocache_size(c) == PROCS * EACH && rn_algocache_ignored(c) == 0,
          "%d concurrent appends: %zu entries, %zu ignored", PROCS * EACH, rn_algocache_size(c), rn_algocache_ignored(c));
    rn_algocache_free(c);

    snprintf(buf, sizeof buf, "rm -rf '%s'", dir);
    if (system(buf) != 0) fprintf(stderr, "test_algocache: could not remove %s\n", dir);
    return check_done("test_algocache");
}
