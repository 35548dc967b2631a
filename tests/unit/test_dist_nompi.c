/* rn_dist_open in a build without MPI: lib/dist.c compiled here with RN_HAVE_MPI undefined
 * (this object's functions stand in for librn's, which the link then never pulls in), so
 * that `make test`, whose build has MPI wherever Open MPI is installed, checks what a
 * USE_MPI=0 build does: started as one of several processes it refuses, saying to rebuild
 * or run one; alone it is a world of one whose collectives are copies or nothing;
 * RN_DIST_SOLO=1 is refused, and so is a value other than 0 or 1. */
#undef RN_HAVE_MPI
#include "../../lib/dist.c"

#include "check.h"

static int open_with(int launched, rn_dist **d) {
    char arg0[] = "test_dist_nompi", *args[] = {arg0, NULL}, **argv = args;
    int argc = 1;
    return rn_dist_open(&argc, &argv, launched, 60, d);
}

int main(void) {
    rn_dist *d = NULL;
    CHECK(unsetenv("RN_DIST_SOLO") == 0, "unsetenv");
    CHECK(!rn_dist_built(), "rn_dist_built says MPI in a build without it");
    int rc = open_with(2, &d);
    CHECK(rc == RN_ENOTSUP && d == NULL, "one of 2 processes without MPI: rc %d", rc);
    CHECK(strstr(rn_last_error(), "started as one of 2 processes, but this build has no MPI (USE_MPI=0)") != NULL,
          "its message: %s", rn_last_error());
    CHECK(strstr(rn_last_error(), "or run one process") != NULL, "its advice: %s", rn_last_error());
    /* alone: a world of one, no MPI; the collectives copy or do nothing */
    CHECK_OK(open_with(1, &d));
    if (d) {
        CHECK(rn_dist_world(d) == 1 && rn_dist_rank(d) == 0 && !rn_dist_many(d), "world %d rank %d many %d",
              rn_dist_world(d), rn_dist_rank(d), rn_dist_many(d));
        int64_t v = 7, mine[2] = {3, 4}, all[2] = {0, 0};
        CHECK_OK(rn_dist_max_i64(d, &v, "test"));
        CHECK_OK(rn_dist_allgather(d, mine, sizeof mine, all, "test"));
        CHECK(v == 7 && all[0] == 3 && all[1] == 4, "max %lld, gathered %lld %lld", (long long)v,
              (long long)all[0], (long long)all[1]);
        CHECK(rn_dist_agree(d, RN_EIO, "test") == RN_EIO && rn_dist_agree(d, RN_OK, "test") == RN_OK,
              "rn_dist_agree alone passes rc through");
    }
    rn_dist_close(d);
    d = NULL;
    CHECK(setenv("RN_DIST_SOLO", "1", 1) == 0, "setenv");
    rc = open_with(1, &d);
    CHECK(rc == RN_ENOTSUP && strstr(rn_last_error(), "RN_DIST_SOLO=1") && strstr(rn_last_error(), "no MPI"),
          "RN_DIST_SOLO=1 without MPI: rc %d: %s", rc, rn_last_error());
    rn_dist_close(d);
    d = NULL;
    CHECK(setenv("RN_DIST_SOLO", "2", 1) == 0, "setenv");
    rc = open_with(1, &d);
    CHECK(rc == RN_EINVAL && strstr(rn_last_error(), "RN_DIST_SOLO=2: give 1"), "RN_DIST_SOLO=2: rc %d: %s", rc,
          rn_last_error());
    rn_dist_close(d);
    unsetenv("RN_DIST_SOLO");
    return check_done("test_dist_nompi");
}
