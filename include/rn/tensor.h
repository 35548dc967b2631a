/* rn/tensor.h: element types and half-precision conversions. */
#ifndef RN_TENSOR_H
#define RN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

/* Values match proto/rn.proto's DType. */
typedef enum {
    RN_F32 = 1,
    RN_F16 = 2,
    RN_BF16 = 3,
    RN_U8 = 4,
    RN_I32 = 5,
    RN_I64 = 6,
} rn_dtype;

/* Bytes per element; 0 for an unknown dtype. */
size_t rn_dtype_size(int dtype);
/* "F32", "F16", "BF16", "U8", "I32", "I64" (safetensors spelling); "?" if unknown. */
const char *rn_dtype_name(int dtype);
/* Inverse of rn_dtype_name; 0 if unknown. */
int rn_dtype_from_name(const char *name);

/* IEEE half and bfloat16 conversions, round to nearest even. */
float rn_f16_to_f32(uint16_t h);
uint16_t rn_f32_to_f16(float f);
float rn_bf16_to_f32(uint16_t h);
uint16_t rn_f32_to_bf16(float f);

/* Product of shape[0..ndim-1] (1 for ndim 0); -1 if a dimension is negative or the
 * product overflows int64. */
int64_t rn_numel(const int64_t *shape, size_t ndim);

/* Host-side conv weight layout conversion, fp32: torchvision's (k, c, kh, kw) "OIHW" <->
 * the backends' (k, kh, kw, c) "OHWI". src and dst must not overlap. For kh = kw = 1 the
 * layouts are identical. */
void rn_conv_oihw_to_ohwi(const float *oihw, float *ohwi, int k, int c, int kh, int kw);
void rn_conv_ohwi_to_oihw(const float *ohwi, float *oihw, int k, int c, int kh, int kw);

#endif
