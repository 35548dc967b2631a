/* rn/cli.h: the values of tool flags, parsed the same way by every tool.
 *
 * Each function reads the whole of TEXT as the value of FLAG (the flag's long name,
 * "--batch", or the variable's, "RN_CPU_MEMORY"). On success it stores the value in *out
 * and returns RN_OK. Otherwise *out is left as it was and it returns RN_EINVAL with a
 * message that names the flag and the value and says what is wanted, e.g.
 *   --batch: '2.5' is not a whole number
 *   --batch: '0' is too small: want 1 to 1048576
 *   --lr: '-1' is negative: want 0 to 1e+06
 * which a tool prints after its own name ("rn-train: ...") before exiting 2.
 *
 * Numbers are written in decimal. Leading or trailing junk (spaces, units, a second
 * value) is refused, as are values out of [min, max] (a value beyond the type's range
 * counts as out of range, never wraps) and, for floats, inf and nan. */
#ifndef RN_CLI_H
#define RN_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rn/backend.h"

/* A whole number: optional sign, then digits ("256", "+3", "-1"); "2.5", "1e3", "0x10"
 * and "" are refused. */
int rn_cli_int(const char *flag, const char *text, int min, int max, int *out);
int rn_cli_i64(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
/* As rn_cli_i64 for values up to UINT64_MAX (seeds); a leading '-' is refused. */
int rn_cli_u64(const char *flag, const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* A finite decimal number ("0.1", "1e-4", "5"), in [min, max]. */
int rn_cli_float(const char *flag, const char *text, double min, double max, double *out);

/* A byte count: a number (fractions allowed: "1.5G") with an optional binary suffix
 * K, M, G or T in either case (1K = 1024), which may be followed by "B" or "iB"
 * ("64MB", "3GiB"), or a plain count of bytes ("1048576", "100B"). The value is rounded
 * down to whole bytes and must be at least min bytes (and at least 1) and at most
 * SIZE_MAX/2. */
int rn_cli_size(const char *flag, const char *text, size_t min, size_t *out);

/* A comma-separated list of at most cap whole numbers, each in [min, max] ("30,60,80");
 * an empty list or an empty entry ("30,,60", "30,") is refused. The numbers go to
 * out[0..*n-1]. */
int rn_cli_list(const char *flag, const char *text, int min, int max, int *out, int cap, int *n);

/* An output the tool will write at the end of its run (path may be NULL: none), checked
 * before the run starts with rn_output_check (not a directory, its folder writable; a
 * PATH.tmp left by an interrupted run removed, saying so on notes as "TOOL: removed
 * PATH.tmp, left by an interrupted run"). Errors: RN_EIO naming the path. */
int rn_cli_output(const char *tool, const char *path, FILE *notes);

/* The backend settings that the environment overrides, into o (after
 * rn_backend_opts_init, before the tool's own flags): the one place rn reads them.
 *   RN_SYNC=1                 sync_each_op
 *   RN_CPU_MEMORY=SIZE        cpu_memory (sizes as rn_cli_size)
 *   RN_CUDA_TF32=1            cuda_tf32
 *   RN_CUDA_DETERMINISTIC=1   cuda_deterministic
 *   RN_CUDA_CONV_ALGO=find|heuristic   cuda_conv_heuristic
 *   RN_CUDA_BN=own|cudnn      cuda_bn_cudnn
 *   RN_CUDA_STEM=pad|plain    cuda_stem_plain
 *   RN_CUDA_WORKSPACE_MB=N    cuda_workspace (MiB, 0 or more)
 * Errors: RN_EINVAL naming the variable and its value. */
int rn_cli_backend_env(rn_backend_opts *o);

/* The number of processes a launcher started this one among, from the variables it
 * sets (Open MPI's mpirun: OMPI_COMM_WORLD_SIZE; PMIx/Slurm's srun --mpi=pmix:
 * PMIX_RANK with SLURM_STEP_NUM_TASKS; MPICH/Hydra: PMI_SIZE); 1 when started alone.
 * For rn_dist_open. */
int rn_cli_launcher_world(void);

/* The CPU threads of one of local_world ranks that share a machine
 * (rn_dist_local_world): threads 0 (all cores) becomes the online cores divided among
 * them, at least 1 each; other counts are kept. (The GPU of such a rank is
 * rn_backend_opts.cuda_index = rn_dist_local_rank.) */
int rn_cli_dist_threads(int threads, int local_world);

#endif
