/* How the CUDA backend treats a failed cuDNN status. cuDNN 9 codes a status as a category
 * (a multiple of 1000) plus a detail, e.g. CUDNN_STATUS_NOT_SUPPORTED_SHAPE = 3002 and
 * CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004, and its old
 * CUDNN_STATUS_ALLOC_FAILED is now only the host-allocation detail: a status is compared
 * by CUDNN_STATUS_CATEGORY, never against one code. Needs <cudnn.h>; header-only, so the
 * unit test checks it on machines without a GPU. */
#ifndef RN_CUDNN_STATUS_H
#define RN_CUDNN_STATUS_H

#include <cudnn.h>

enum {
    RN_DNN_OK,          /* success */
    RN_DNN_UNSUPPORTED, /* this shape/type/layout is not implemented: use another way */
    RN_DNN_RESOURCES,   /* out of device or host memory, or a launch that did not fit */
    RN_DNN_FATAL,       /* a bad parameter (a bug in rn), a broken install, a fault */
};

static inline int rn_dnn_status_class(cudnnStatus_t s) {
    if (s == CUDNN_STATUS_SUCCESS) return RN_DNN_OK;
    switch (CUDNN_STATUS_CATEGORY(s)) {
    case CUDNN_STATUS_NOT_SUPPORTED: return RN_DNN_UNSUPPORTED;
    case CUDNN_STATUS_INTERNAL_ERROR:
        return s == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
                       s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED ||
                       s == CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM
                   ? RN_DNN_RESOURCES
                   : RN_DNN_FATAL;
    /* cudaMalloc's out-of-memory inside cuDNN comes back as a CUDA runtime failure */
    case CUDNN_STATUS_EXECUTION_FAILED:
        return s == CUDNN_STATUS_EXECUTION_FAILED_CUDART ? RN_DNN_RESOURCES : RN_DNN_FATAL;
    default: return RN_DNN_FATAL;
    }
}

/* Find (which runs every algorithm on scratch memory it allocates) may give way to the
 * heuristic, which runs nothing, when it cannot run here: unsupported or out of memory. */
static inline int rn_dnn_find_falls_back(cudnnStatus_t s) {
    int c = rn_dnn_status_class(s);
    return c == RN_DNN_UNSUPPORTED || c == RN_DNN_RESOURCES;
}

#endif
