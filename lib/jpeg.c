#include "rn/jpeg.h"

#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "rn/err.h"

#ifdef RN_HAVE_LIBJPEG
#include <stdio.h> /* jpeglib.h needs FILE */
#include <jerror.h>
#include <jpeglib.h>
#include <setjmp.h>

/* progressive files with more scans than this are refused (TJFLAG_LIMITSCANS's limit) */
#define MAX_SCANS 500

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char msg[JMSG_LENGTH_MAX + 64]; /* libjpeg's message and what it means */
} jerr_mgr;
#endif

struct rn_jpeg {
    tjhandle dec, enc;
    uint8_t *tmp; /* CMYK staging, grown on demand */
    size_t tmp_cap;
    uint8_t *region; /* rn_jpeg_decode_region's output */
    size_t region_cap;
    uint64_t max_pixels; /* rn_jpeg_set_max_pixels */
#ifdef RN_HAVE_LIBJPEG
    struct jpeg_decompress_struct cinfo;
    jerr_mgr jerr;
    struct jpeg_progress_mgr progress;
    int cinfo_ok;
#endif
};

int rn_jpeg_create(rn_jpeg **out) {
    *out = NULL;
    rn_jpeg *j = rn_calloc(1, sizeof *j);
    if (!j) return RN_ENOMEM;
    j->dec = tjInitDecompress();
    if (!j->dec) {
        int rc = rn_errorf(RN_EDATA, "tjInitDecompress: %s", tjGetErrorStr2(NULL));
        free(j);
        return rc;
    }
    j->max_pixels = RN_JPEG_MAX_PIXELS;
    *out = j;
    return RN_OK;
}

void rn_jpeg_set_max_pixels(rn_jpeg *j, uint64_t max_pixels) { j->max_pixels = max_pixels; }
uint64_t rn_jpeg_max_pixels(const rn_jpeg *j) { return j->max_pixels; }

/* the header's size within the handle's limit, before anything is sized by it */
static int check_pixels(const rn_jpeg *j, const rn_jpeg_info *info) {
    if ((uint64_t)info->width * (uint64_t)info->height > j->max_pixels)
        return rn_errorf(RN_EDATA, "JPEG header says %dx%d (%llu pixels), over the limit of %llu pixels",
                         info->width, info->height, (unsigned long long)info->width * (unsigned long long)info->height,
                         (unsigned long long)j->max_pixels);
    return RN_OK;
}

void rn_jpeg_destroy(rn_jpeg *j) {
    if (!j) return;
    if (j->dec) tjDestroy(j->dec);
    if (j->enc) tjDestroy(j->enc);
#ifdef RN_HAVE_LIBJPEG
    if (j->cinfo_ok) jpeg_destroy_decompress(&j->cinfo);
#endif
    free(j->region);
    free(j->tmp);
    free(j);
}

/* Walk the marker segments before the first scan for what TurboJPEG 2.1 does not
 * report: progressive mode, the component count and the Adobe marker. */
static void scan_markers(const uint8_t *d, size_t n, rn_jpeg_info *info) {
    size_t p = 2;
    while (p + 4 <= n) {
        if (d[p] != 0xFF) return;
        uint8_t m = d[p + 1];
        if (m == 0xFF) { p++; continue; }
        if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) { p += 2; continue; }
        size_t len = ((size_t)d[p + 2] << 8) | d[p + 3];
        if (len < 2 || p + 2 + len > n) return;
        const uint8_t *s = d + p + 4;
        if (m == 0xC2 || m == 0xC6 || m == 0xCA || m == 0xCE) info->progressive = 1;
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC && len >= 8)
            info->components = s[5];
        if (m == 0xEE && len >= 7 && memcmp(s, "Adobe", 5) == 0) info->adobe = 1;
        if (m == 0xDA) return;
        p += 2 + len;
    }
}

int rn_jpeg_header(rn_jpeg *j, const uint8_t *data, size_t len, rn_jpeg_info *info) {
    memset(info, 0, sizeof *info);
    info->subsamp = -1;
    if (len < 4 || data[0] != 0xFF || data[1] != 0xD8)
        return rn_errorf(RN_EDATA, "not a JPEG file (no SOI marker)");
    if (len > (size_t)0xFFFFFFFFu) return rn_errorf(RN_EDATA, "JPEG data over 4 GiB");
    int w, h, ss, cs;
    if (!j->dec && !(j->dec = tjInitDecompress()))
        return rn_errorf(RN_EDATA, "tjInitDecompress: %s", tjGetErrorStr2(NULL));
    if (tjDecompressHeader3(j->dec, data, (unsigned long)len, &w, &h, &ss, &cs) != 0) {
        int rc = rn_errorf(RN_EDATA, "bad JPEG header: %s", tjGetErrorStr2(j->dec));
        /* A failed header read leaves TurboJPEG's decompressor mid-header (it does not
         * abort it), and the next image on this handle then fails too: start afresh. */
        tjDestroy(j->dec);
        j->dec = tjInitDecompress();
        return rc;
    }
    if (w <= 0 || h <= 0) return rn_errorf(RN_EDATA, "JPEG header says %dx%d pixels", w, h);
    info->width = w;
    info->height = h;
    info->subsamp = ss;
    info->cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
    info->components = cs == TJCS_GRAY ? 1 : info->cmyk ? 4 : 3;
    scan_markers(data, len, info);
    return RN_OK;
}

void rn_jpeg_scaled_size(const rn_jpeg_info *info, int need_w, int need_h, int *w, int *h) {
    *w = info->width;
    *h = info->height;
    /* only 1/8, 1/4 and 1/2: libjpeg-turbo has SIMD IDCTs for those; the 3/8..7/8
     * IDCTs are plain C and slower than a full-size decode plus a resize */
    static const int nums[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        tjscalingfactor sf = {nums[k], 8};
        int sw = TJSCALED(info->width, sf), sh = TJSCALED(info->height, sf);
        if (sw >= need_w && sh >= need_h) {
            *w = sw;
            *h = sh;
            return;
        }
    }
}

/* libjpeg reports truncated files and corrupt entropy-coded data ("premature end of data
 * segment", "bad Huffman code", ...) as warnings and fills the damage with grey. Every
 * warning is a failure here (TJFLAG_STOPONWARNING; on_message for libjpeg): a training
 * set must not learn from half-decoded pictures. Stricter than PIL, which decodes many
 * of these. The library's error state decides, never its message text. */
static int tj_fail(tjhandle t, const char *what) {
    const char *msg = tjGetErrorStr2(t);
    if (tjGetErrorCode(t) == TJERR_WARNING)
        return rn_errorf(RN_EDATA, "%s: corrupt or truncated JPEG data (libjpeg: %s)", what, msg);
    return rn_errorf(RN_EDATA, "%s: %s", what, msg);
}

static inline uint8_t muldiv255(int a, int b) {
    int t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

int rn_jpeg_decode(rn_jpeg *j, const uint8_t *data, size_t len, int channels, int w, int h,
                   uint8_t *dst) {
    rn_jpeg_info info;
    int rc = rn_jpeg_header(j, data, len, &info);
    if (rc || (rc = check_pixels(j, &info))) return rc;
    if (channels != 1 && channels != 3)
        return rn_errorf(RN_EINVAL, "decode to %d channels (1 or 3 supported)", channels);
    int sw = info.width, sh = info.height;
    if (w != sw || h != sh) rn_jpeg_scaled_size(&info, w, h, &sw, &sh);
    if (w != sw || h != sh)
        return rn_errorf(RN_EINVAL, "%dx%d is not a DCT-scaled size of this %dx%d JPEG", w, h,
                         info.width, info.height);
    /* TJFLAG_LIMITSCANS: refuse progressive files with absurd scan counts (a known
     * denial-of-service pattern) instead of spending minutes on them. */
    int flags = TJFLAG_LIMITSCANS | TJFLAG_STOPONWARNING;
    if (!info.cmyk) {
        int pf = channels == 3 ? TJPF_RGB : TJPF_GRAY;
        if (tjDecompress2(j->dec, data, (unsigned long)len, dst, w, 0, h, pf, flags) != 0)
            return tj_fail(j->dec, "JPEG decode");
        return RN_OK;
    }
    size_t need = (size_t)w * h * 4;
    if (need > j->tmp_cap) {
        uint8_t *p = realloc(j->tmp, need);
        if (!p) return rn_errorf(RN_ENOMEM, "out of memory decoding a %dx%d CMYK JPEG", w, h);
        j->tmp = p;
        j->tmp_cap = need;
    }
    if (tjDecompress2(j->dec, data, (unsigned long)len, j->tmp, w, 0, h, TJPF_CMYK, flags) != 0)
        return tj_fail(j->dec, "JPEG decode (CMYK)");
    /* PIL: Adobe files hold inverted CMYK; RGB = (255-C)(255-K)/255 on true values. */
    size_t n = (size_t)w * h;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = j->tmp + 4 * i;
        int c = s[0], m = s[1], y = s[2], k = s[3];
        if (!info.adobe) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        /* now c, m, y, k hold 255 - true value */
        uint8_t r = (uint8_t)(k - muldiv255(255 - c, k));
        uint8_t g = (uint8_t)(k - muldiv255(255 - m, k));
        uint8_t b = (uint8_t)(k - muldiv255(255 - y, k));
        if (channels == 3) {
            dst[3 * i] = r;
            dst[3 * i + 1] = g;
            dst[3 * i + 2] = b;
        } else {
            dst[i] = (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
        }
    }
    return RN_OK;
}

static int grow_region(rn_jpeg *j, size_t n) {
    if (n <= j->region_cap) return RN_OK;
    uint8_t *p = realloc(j->region, n);
    if (!p) return rn_errorf(RN_ENOMEM, "out of memory decoding a JPEG (%zu bytes)", n);
    j->region = p;
    j->region_cap = n;
    return RN_OK;
}

#ifdef RN_HAVE_LIBJPEG
static void on_error(j_common_ptr c) {
    jerr_mgr *e = (jerr_mgr *)c->err;
    c->err->format_message(c, e->msg);
    longjmp(e->jb, 1);
}

/* every warning is corrupt or truncated data (tj_fail says why) */
static void on_message(j_common_ptr c, int level) {
    if (level < 0) {
        jerr_mgr *e = (jerr_mgr *)c->err;
        char lib[JMSG_LENGTH_MAX];
        c->err->format_message(c, lib);
        snprintf(e->msg, sizeof e->msg, "corrupt or truncated JPEG data (libjpeg: %s)", lib);
        longjmp(e->jb, 1);
    }
}

static void on_progress(j_common_ptr c) {
    j_decompress_ptr d = (j_decompress_ptr)c;
    if (d->input_scan_number > MAX_SCANS) {
        jerr_mgr *e = (jerr_mgr *)c->err;
        snprintf(e->msg, sizeof e->msg, "progressive JPEG with over %d scans refused", MAX_SCANS);
        longjmp(e->jb, 1);
    }
}

/* the window with libjpeg's partial decoding; an iMCU of margin around it keeps the
 * fancy-upsampled pixels identical to those of a full decode */
static int region_libjpeg(rn_jpeg *j, const uint8_t *data, size_t len, int channels, int num,
                          int sw, int sh, const int want[4], const uint8_t **px, int got[4]) {
    struct jpeg_decompress_struct *ci = &j->cinfo;
    if (!j->cinfo_ok) {
        ci->err = jpeg_std_error(&j->jerr.pub);
        j->jerr.pub.error_exit = on_error;
        j->jerr.pub.emit_message = on_message;
        jpeg_create_decompress(ci);
        j->progress.progress_monitor = on_progress;
        ci->progress = &j->progress;
        j->cinfo_ok = 1;
    }
    /* a progressive image keeps all its coefficients (2 bytes per sample, up to 4
       components): past what max_pixels needs, libjpeg fails instead of allocating */
    uint64_t mem = j->max_pixels < (uint64_t)1 << 36 ? j->max_pixels * 8 + (64 << 20) : (uint64_t)1 << 39;
    ci->mem->max_memory_to_use = (long)mem;
    volatile int rc = RN_OK;
    if (setjmp(j->jerr.jb)) {
        jpeg_abort_decompress(ci);
        return rn_errorf(RN_EDATA, "JPEG decode: %s", j->jerr.msg);
    }
    jpeg_mem_src(ci, data, (unsigned long)len);
    jpeg_read_header(ci, TRUE);
    ci->out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    ci->scale_num = (unsigned)num;
    ci->scale_denom = 8;
    jpeg_start_decompress(ci);
    if ((int)ci->output_width != sw || (int)ci->output_height != sh || ci->output_components != channels) {
        jpeg_abort_decompress(ci);
        return rn_errorf(RN_EDATA, "JPEG decode: libjpeg scales to %ux%u, TurboJPEG to %dx%d", ci->output_width,
                         ci->output_height, sw, sh);
    }
    int mw = ci->max_h_samp_factor * ci->min_DCT_scaled_size, mh = ci->max_v_samp_factor * ci->min_DCT_scaled_size;
    int x0 = want[0] - mw, x1 = want[0] + want[2] + mw, y0 = want[1] - mh, y1 = want[1] + want[3] + mh;
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > sw) x1 = sw;
    if (y1 > sh) y1 = sh;
    JDIMENSION xo = (JDIMENSION)x0, cw = (JDIMENSION)(x1 - x0);
    if (x0 > 0 || x1 < sw) jpeg_crop_scanline(ci, &xo, &cw);
    size_t stride = (size_t)cw * channels;
    if ((rc = grow_region(j, stride * (size_t)(y1 - y0))) != RN_OK) {
        jpeg_abort_decompress(ci);
        return rc;
    }
    if (y0 > 0 && jpeg_skip_scanlines(ci, (JDIMENSION)y0) != (JDIMENSION)y0) {
        jpeg_abort_decompress(ci);
        return rn_errorf(RN_EDATA, "JPEG decode: could not skip to row %d", y0);
    }
    while ((int)ci->output_scanline < y1) {
        JSAMPROW row = j->region + stride * (ci->output_scanline - (JDIMENSION)y0);
        jpeg_read_scanlines(ci, &row, 1);
    }
    /* the rows below the window are never decoded */
    jpeg_abort_decompress(ci);
    *px = j->region;
    got[0] = (int)xo;
    got[1] = y0;
    got[2] = (int)cw;
    got[3] = y1 - y0;
    return RN_OK;
}
#endif

int rn_jpeg_decode_region(rn_jpeg *j, const uint8_t *data, size_t len, int channels, int sw,
                          int sh, const int want[4], const uint8_t **px, int got[4]) {
    rn_jpeg_info info;
    int rc = rn_jpeg_header(j, data, len, &info);
    if (rc || (rc = check_pixels(j, &info))) return rc;
    if (want[0] < 0 || want[1] < 0 || want[2] <= 0 || want[3] <= 0 || want[0] + want[2] > sw ||
        want[1] + want[3] > sh)
        return rn_errorf(RN_EINVAL, "window %dx%d at (%d,%d) outside the %dx%d image", want[2], want[3],
                         want[0], want[1], sw, sh);
#ifdef RN_HAVE_LIBJPEG
    if (!info.cmyk && (channels == 1 || channels == 3)) {
        for (int num = 1; num <= 8; num++) {
            tjscalingfactor sf = {num, 8};
            if (TJSCALED(info.width, sf) == sw && TJSCALED(info.height, sf) == sh)
                return region_libjpeg(j, data, len, channels, num, sw, sh, want, px, got);
        }
    }
#endif
    if ((rc = grow_region(j, (size_t)sw * sh * (channels > 0 ? channels : 1))) != RN_OK) return rc;
    if ((rc = rn_jpeg_decode(j, data, len, channels, sw, sh, j->region)) != RN_OK) return rc;
    *px = j->region;
    got[0] = got[1] = 0;
    got[2] = sw;
    got[3] = sh;
    return RN_OK;
}

int rn_jpeg_encode(rn_jpeg *j, const uint8_t *src, int w, int h, int channels, int quality,
                   uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (w <= 0 || h <= 0 || (channels != 1 && channels != 3) || quality < 1 || quality > 100)
        return rn_errorf(RN_EINVAL, "JPEG encode of %dx%dx%d at quality %d: bad arguments", w, h,
                         channels, quality);
    if (!j->enc && !(j->enc = tjInitCompress()))
        return rn_errorf(RN_EDATA, "tjInitCompress: %s", tjGetErrorStr2(NULL));
    unsigned char *buf = NULL;
    unsigned long size = 0;
    int pf = channels == 3 ? TJPF_RGB : TJPF_GRAY, ss = channels == 3 ? TJSAMP_420 : TJSAMP_GRAY;
    if (tjCompress2(j->enc, src, w, 0, h, pf, &buf, &size, ss, quality, 0) != 0) {
        int rc = rn_errorf(RN_EDATA, "JPEG encode: %s", tjGetErrorStr2(j->enc));
        tjFree(buf);
        return rc;
    }
    uint8_t *copy = rn_malloc(size);
    if (!copy) {
        tjFree(buf);
        return RN_ENOMEM;
    }
    memcpy(copy, buf, size);
    tjFree(buf);
    *out = copy;
    *out_len = size;
    return RN_OK;
}
