/* Image files other than JPEG (PNG: libspng, WebP: libwebp, PPM/PGM and BMP: here), decoded to PIL's convert("RGB") / convert("L") pixels. */
#include "rn/imgfile.h"

#include <string.h>

#include "rn/err.h"

#ifdef RN_HAVE_SPNG
#include <spng.h>
#endif
#ifdef RN_HAVE_WEBP
#include <webp/decode.h>
#endif

/* A PNG side longer than this is refused whatever --max-pixels says (libspng's own
 * default limit is 2^31 - 1). */
#define PNG_MAX_SIDE (1u << 24)
/* The longest chunk besides image data accepted, and the most memory kept for the
 * ancillary chunks (text, ICC profiles) of one file: a length field is the file's word.
 * libspng refuses a chunk limit over the cache limit. */
#define PNG_MAX_CHUNK (16u << 20)
#define PNG_MAX_CACHE (64u << 20)

rn_img_format rn_imgfile_format(const uint8_t *d, size_t n) {
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return RN_IMG_JPEG;
    if (n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return RN_IMG_PNG;
    if (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0) return RN_IMG_WEBP;
    if (n >= 6 && (memcmp(d, "GIF87a", 6) == 0 || memcmp(d, "GIF89a", 6) == 0)) return RN_IMG_GIF;
    if (n >= 2 && d[0] == 'B' && d[1] == 'M') return RN_IMG_BMP;
    if (n >= 4 && (memcmp(d, "II*", 4) == 0 || memcmp(d, "MM\0*", 4) == 0)) return RN_IMG_TIFF;
    if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' &&
        (d[2] == ' ' || d[2] == '\n' || d[2] == '\r' || d[2] == '\t'))
        return RN_IMG_PNM;
    return RN_IMG_UNKNOWN;
}

const char *rn_imgfile_name(rn_img_format f) {
    switch (f) {
    case RN_IMG_JPEG: return "JPEG";
    case RN_IMG_PNG: return "PNG";
    case RN_IMG_WEBP: return "WebP";
    case RN_IMG_GIF: return "GIF";
    case RN_IMG_BMP: return "BMP";
    case RN_IMG_TIFF: return "TIFF";
    case RN_IMG_PNM: return "PPM/PGM";
    default: return "unknown";
    }
}

int rn_imgfile_can_decode(rn_img_format f) {
    if (f == RN_IMG_PNM || f == RN_IMG_BMP) return 1;
#ifdef RN_HAVE_SPNG
    if (f == RN_IMG_PNG) return 1;
#endif
#ifdef RN_HAVE_WEBP
    if (f == RN_IMG_WEBP) return 1;
#endif
    return 0;
}

const char *rn_imgfile_missing(rn_img_format f) {
    if (rn_imgfile_can_decode(f) || f == RN_IMG_JPEG) return "";
    switch (f) {
    case RN_IMG_PNG:
        return "this build has no PNG support: it was built without libspng (make deps installs libspng-dev; "
               "then rebuild)";
    case RN_IMG_WEBP:
        return "this build has no WebP support: it was built without libwebp (make deps installs libwebp-dev; "
               "then rebuild)";
    default: return NULL;
    }
}

#ifdef RN_HAVE_SPNG
#define PNG_NAME ", PNG"
#else
#define PNG_NAME ""
#endif
#ifdef RN_HAVE_WEBP
#define WEBP_NAME ", WebP"
#else
#define WEBP_NAME ""
#endif

const char *rn_imgfile_formats(void) { return "JPEG" PNG_NAME WEBP_NAME ", PPM/PGM, BMP"; }

/* PIL's convert("L") of RGB (Pillow's L24 rounding) */
static inline uint8_t luma(const uint8_t *p) {
    return (uint8_t)((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
}

static inline void rgb_to_gray(uint8_t *px, size_t n) {
    for (size_t i = 0; i < n; i++) px[i] = luma(px + 3 * i);
}

/* n gray values at the start of px to RGB, in place (from the end: 3i >= i) */
static inline void gray_to_rgb(uint8_t *px, size_t n) {
    for (size_t i = n; i-- > 0;) px[3 * i] = px[3 * i + 1] = px[3 * i + 2] = px[i];
}

static int unsupported(rn_img_format f) {
    const char *miss = rn_imgfile_missing(f);
    return rn_errorf(RN_EDATA, "%s: %s", rn_imgfile_name(f), miss ? miss : "rn reads no such files");
}

/* ------------------------------------------------------------ PPM/PGM (binary) */

/* Netpbm P5 (grey) and P6 (RGB) files of maxval 255 or 65535, read as PIL reads them:
 * whitespace-separated decimal tokens, '#' comments to the end of the line, one
 * whitespace byte after maxval, then the samples (big-endian when 16-bit). */
typedef struct {
    int w, h, ch, maxval;
    size_t off; /* first sample byte */
} pnm_hdr;

static int pnm_token(const uint8_t *d, size_t n, size_t *pos, long *val) {
    size_t i = *pos;
    for (;;) {
        while (i < n && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r' || d[i] == '\v' || d[i] == '\f'))
            i++;
        if (i < n && d[i] == '#') {
            while (i < n && d[i] != '\n' && d[i] != '\r') i++;
            continue;
        }
        break;
    }
    long v = 0;
    int digits = 0;
    /* PIL takes tokens of at most 10 characters */
    while (i < n && d[i] >= '0' && d[i] <= '9' && digits < 10) v = v * 10 + (d[i++] - '0'), digits++;
    if (!digits || (i < n && d[i] >= '0' && d[i] <= '9')) return rn_errorf(RN_EDATA, "PPM/PGM header: bad number");
    if (i >= n) return rn_errorf(RN_EDATA, "PPM/PGM header: truncated");
    if (d[i] != ' ' && d[i] != '\t' && d[i] != '\n' && d[i] != '\r' && d[i] != '\v' && d[i] != '\f' && d[i] != '#')
        return rn_errorf(RN_EDATA, "PPM/PGM header: bad number");
    *pos = i;
    *val = v;
    return RN_OK;
}

static int pnm_header(const uint8_t *d, size_t n, pnm_hdr *ph) {
    if (n < 3 || d[0] != 'P' || (d[1] != '5' && d[1] != '6'))
        return rn_errorf(RN_EDATA, "PPM/PGM: only binary P5 (grey) and P6 (RGB) files are read, not P%c",
                         n > 1 ? d[1] : '?');
    size_t pos = 2;
    long w, h, maxval;
    int rc;
    if ((rc = pnm_token(d, n, &pos, &w)) || (rc = pnm_token(d, n, &pos, &h)) || (rc = pnm_token(d, n, &pos, &maxval)))
        return rc;
    if (w <= 0 || h <= 0 || w > (1L << 24) || h > (1L << 24))
        return rn_errorf(RN_EDATA, "PPM/PGM header: size %ldx%ld", w, h);
    if (maxval != 255 && maxval != 65535)
        return rn_errorf(RN_EDATA, "PPM/PGM: maxval %ld (rn reads maxval 255 and 65535: convert it)", maxval);
    if (d[pos] == '#') return rn_errorf(RN_EDATA, "PPM/PGM header: a comment after maxval");
    ph->w = (int)w, ph->h = (int)h, ph->ch = d[1] == '6' ? 3 : 1, ph->maxval = (int)maxval;
    ph->off = pos + 1;
    return RN_OK;
}

static int pnm_decode(const uint8_t *d, size_t n, int channels, uint64_t max_pixels, uint8_t *dst) {
    pnm_hdr ph;
    int rc = pnm_header(d, n, &ph);
    if (rc) return rc;
    if ((uint64_t)ph.w * ph.h > max_pixels)
        return rn_errorf(RN_EDATA, "PPM/PGM of %dx%d pixels is over the limit of %llu", ph.w, ph.h,
                         (unsigned long long)max_pixels);
    size_t np = (size_t)ph.w * ph.h, bytes = ph.maxval > 255 ? 2 : 1, ns = np * ph.ch;
    if (n - ph.off < ns * bytes)
        return rn_errorf(RN_EDATA, "PPM/PGM: truncated (%zu bytes of samples, %zu needed)", n - ph.off, ns * bytes);
    const uint8_t *s = d + ph.off;
    if (bytes == 1) {
        memcpy(dst, s, ns);
    } else if (ph.ch == 1) {
        /* PIL's mode I: clipped to 0..255, as 16-bit grey PNG */
        for (size_t i = 0; i < ns; i++) {
            unsigned v = (unsigned)s[2 * i] << 8 | s[2 * i + 1];
            dst[i] = v > 255 ? 255 : (uint8_t)v;
        }
    } else {
        /* PIL's round(v / 65535 * 255) = round(v / 257), never a tie */
        for (size_t i = 0; i < ns; i++) {
            unsigned v = (unsigned)s[2 * i] << 8 | s[2 * i + 1];
            dst[i] = (uint8_t)((2 * v + 257) / 514);
        }
    }
    if (ph.ch == 1 && channels == 3) gray_to_rgb(dst, np);
    if (ph.ch == 3 && channels == 1) rgb_to_gray(dst, np);
    return RN_OK;
}

/* ------------------------------------------------------------ BMP */

/* Uncompressed BMPs as PIL's BmpImagePlugin reads them: headers of 12 (OS/2), 40, 64, 108
 * and 124 bytes; 1/4/8-bit palettes (BGR for OS/2, BGRX otherwise), 24-bit BGR, 32-bit
 * BGRX, and the BITFIELDS masks PIL knows for 24 and 32 bits (alpha dropped); rows
 * bottom-up unless the height is negative, each padded to 4 bytes; the pixels at the
 * offset the file header gives (past the palette when that offset points at it). RLE
 * and 16-bit files are refused with the reason. */
typedef struct {
    int w, h, bits, topdown;
    int r, g, b;              /* byte of each channel in a 24/32-bit pixel */
    const uint8_t *pal;       /* palette entries, pal_step bytes each (B, G, R) */
    uint32_t ncolors, pal_step;
    size_t off, stride;
} bmp_hdr;

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static unsigned le16(const uint8_t *p) { return p[0] | p[1] << 8; }

static int bmp_header(const uint8_t *d, size_t n, bmp_hdr *bh) {
    memset(bh, 0, sizeof *bh);
    if (n < 18 || d[0] != 'B' || d[1] != 'M') return rn_errorf(RN_EDATA, "BMP header: truncated");
    uint32_t off = le32(d + 10), hs = le32(d + 14);
    if (hs != 12 && hs != 40 && hs != 64 && hs != 108 && hs != 124)
        return rn_errorf(RN_EDATA, "BMP: unsupported header size %u", hs);
    if (n < 14 + (size_t)hs) return rn_errorf(RN_EDATA, "BMP header: truncated");
    const uint8_t *h = d + 18; /* the header after its size field */
    size_t pos = 14 + hs;
    uint32_t comp = 0, ncolors = 0;
    int64_t w, ht;
    if (hs == 12) {
        w = le16(h), ht = le16(h + 2), bh->bits = (int)le16(h + 6);
        bh->pal_step = 3;
    } else {
        w = le32(h), ht = (int32_t)le32(h + 4), bh->bits = (int)le16(h + 10);
        comp = le32(h + 12), ncolors = le32(h + 28);
        bh->pal_step = 4;
    }
    if (ht < 0) bh->topdown = 1, ht = -ht;
    if (w <= 0 || ht <= 0 || w > (1 << 24) || ht > (1 << 24))
        return rn_errorf(RN_EDATA, "BMP header: size %lldx%lld", (long long)w, (long long)ht);
    bh->w = (int)w, bh->h = (int)ht;
    int bits = bh->bits;
    if (bits != 1 && bits != 4 && bits != 8 && bits != 24 && bits != 32)
        return rn_errorf(RN_EDATA, "BMP: %d bits per pixel (rn reads 1, 4, 8, 24 and 32: convert it)", bits);
    bh->r = 2, bh->g = 1, bh->b = 0; /* BGR(X) */
    if (comp == 3) {
        uint32_t m[4] = {0, 0, 0, 0};
        if (hs >= 52) {
            for (int i = 0; i < 4; i++) m[i] = le32(h + 36 + 4 * i);
        } else {
            if (n < pos + 12) return rn_errorf(RN_EDATA, "BMP header: truncated");
            for (int i = 0; i < 3; i++) m[i] = le32(d + pos + 4 * i);
            pos += 12;
        }
        if (bits == 32 && ((m[0] == 0xFF0000 && m[1] == 0xFF00 && m[2] == 0xFF && (m[3] == 0 || m[3] == 0xFF000000)) ||
                           (m[0] == 0 && m[1] == 0 && m[2] == 0 && m[3] == 0))) {
            /* BGRX, BGRA */
        } else if (bits == 32 && m[0] == 0xFF000000 && m[1] == 0xFF0000 && m[2] == 0xFF00 && (m[3] == 0 || m[3] == 0xFF)) {
            bh->r = 3, bh->g = 2, bh->b = 1; /* XBGR, ABGR */
        } else if (bits == 32 && m[0] == 0xFF && m[1] == 0xFF00 && m[2] == 0xFF0000 && m[3] == 0xFF000000) {
            bh->r = 0, bh->g = 1, bh->b = 2; /* RGBA */
        } else if (bits == 24 && m[0] == 0xFF0000 && m[1] == 0xFF00 && m[2] == 0xFF) {
            /* BGR */
        } else {
            return rn_errorf(RN_EDATA, "BMP: unsupported bitfields layout");
        }
    } else if (comp == 1 || comp == 2) {
        return rn_errorf(RN_EDATA, "BMP: RLE compression (rn reads uncompressed BMPs: convert it)");
    } else if (comp != 0) {
        return rn_errorf(RN_EDATA, "BMP: unsupported compression %u", comp);
    }
    if (bits <= 8) {
        if (!ncolors) ncolors = 1u << bits;
        if (ncolors > 65536) return rn_errorf(RN_EDATA, "BMP: palette of %u colours", ncolors);
        if (n - pos < (size_t)ncolors * bh->pal_step) return rn_errorf(RN_EDATA, "BMP: truncated palette");
        bh->pal = d + pos;
        bh->ncolors = ncolors;
        /* PIL: an offset that points at the palette means the pixels follow it */
        if (off == 14 + hs) off += 4 * ncolors;
        pos += (size_t)ncolors * bh->pal_step;
    }
    bh->off = off ? off : pos;
    bh->stride = (((size_t)bh->w * bits + 31) >> 3) & ~(size_t)3;
    return RN_OK;
}

static int bmp_decode(const uint8_t *d, size_t n, int channels, uint64_t max_pixels, uint8_t *dst) {
    bmp_hdr bh;
    int rc = bmp_header(d, n, &bh);
    if (rc) return rc;
    if ((uint64_t)bh.w * bh.h > max_pixels)
        return rn_errorf(RN_EDATA, "BMP of %dx%d pixels is over the limit of %llu", bh.w, bh.h,
                         (unsigned long long)max_pixels);
    if (bh.off > n || (n - bh.off) / bh.stride < (size_t)bh.h)
        return rn_errorf(RN_EDATA, "BMP: truncated (%zu bytes of pixels, %zu needed)", bh.off > n ? 0 : n - bh.off,
                         bh.stride * bh.h);
    /* palette indices past the palette's end are black */
    uint8_t lut[256][3];
    memset(lut, 0, sizeof lut);
    for (uint32_t i = 0; bh.pal && i < bh.ncolors && i < 256; i++) {
        const uint8_t *e = bh.pal + (size_t)i * bh.pal_step;
        lut[i][0] = e[2], lut[i][1] = e[1], lut[i][2] = e[0];
    }
    int bpp = bh.bits / 8;
    for (int y = 0; y < bh.h; y++) {
        const uint8_t *row = d + bh.off + (size_t)(bh.topdown ? y : bh.h - 1 - y) * bh.stride;
        uint8_t *o = dst + (size_t)y * bh.w * 3;
        for (int x = 0; x < bh.w; x++, o += 3) {
            if (bh.bits >= 24) {
                const uint8_t *p = row + (size_t)x * bpp;
                o[0] = p[bh.r], o[1] = p[bh.g], o[2] = p[bh.b];
            } else {
                int per = 8 / bh.bits;
                unsigned v = row[x / per] >> (8 - bh.bits * (x % per + 1)) & ((1u << bh.bits) - 1);
                memcpy(o, lut[v], 3);
            }
        }
    }
    if (channels == 1) rgb_to_gray(dst, (size_t)bh.w * bh.h);
    return RN_OK;
}

#ifdef RN_HAVE_SPNG
static int png_open(const uint8_t *d, size_t n, spng_ctx **out, struct spng_ihdr *ihdr) {
    *out = NULL;
    spng_ctx *ctx = spng_ctx_new(0);
    if (!ctx) return rn_errorf(RN_ENOMEM, "out of memory (PNG decoder)");
    int e = spng_set_image_limits(ctx, PNG_MAX_SIDE, PNG_MAX_SIDE);
    if (!e) e = spng_set_chunk_limits(ctx, PNG_MAX_CHUNK, PNG_MAX_CACHE);
    if (!e) e = spng_set_png_buffer(ctx, d, n);
    if (!e) e = spng_get_ihdr(ctx, ihdr);
    if (e) {
        spng_ctx_free(ctx);
        return rn_errorf(RN_EDATA, "PNG header: %s (libspng)", spng_strerror(e));
    }
    *out = ctx;
    return RN_OK;
}

static int png_decode(const uint8_t *d, size_t n, int channels, uint64_t max_pixels, uint8_t *dst) {
    spng_ctx *ctx;
    struct spng_ihdr ih;
    int rc = png_open(d, n, &ctx, &ih);
    if (rc) return rc;
    size_t np = (size_t)ih.width * ih.height, want, got = 0;
    if ((uint64_t)ih.width * ih.height > max_pixels) {
        rc = rn_errorf(RN_EDATA, "PNG of %ux%u pixels is over the limit of %llu", ih.width, ih.height,
                       (unsigned long long)max_pixels);
        goto fail;
    }
    /* 16-bit grey is PIL's mode "I": its values are clipped to 0..255, not scaled, so it
     * is decoded as it is stored (big-endian) and clipped here */
    int grey16 = ih.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ih.bit_depth == 16;
    int fmt = grey16 ? SPNG_FMT_RAW : SPNG_FMT_RGB8;
    want = np * (grey16 ? 2 : 3);
    int e = spng_decoded_image_size(ctx, fmt, &got);
    if (!e && got != want) e = SPNG_EINTERNAL;
    /* no SPNG_DECODE_TRNS, no SPNG_DECODE_GAMMA: alpha and gamma are ignored, as PIL's
     * convert("RGB") ignores them */
    if (!e) e = spng_decode_image(ctx, dst, want, fmt, 0);
    if (e) {
        rc = rn_errorf(RN_EDATA, "PNG decode: %s (libspng)", spng_strerror(e));
        goto fail;
    }
    if (grey16) {
        for (size_t i = 0; i < np; i++) {
            unsigned v = (unsigned)dst[2 * i] << 8 | dst[2 * i + 1];
            dst[i] = v > 255 ? 255 : (uint8_t)v;
        }
        if (channels == 3) gray_to_rgb(dst, np);
    } else if (channels == 1) {
        rgb_to_gray(dst, np);
    }
fail:
    spng_ctx_free(ctx);
    return rc;
}
#endif

#ifdef RN_HAVE_WEBP
static const char *webp_status(VP8StatusCode s) {
    switch (s) {
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "corrupt data";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "unsupported feature";
    case VP8_STATUS_SUSPENDED: return "suspended";
    case VP8_STATUS_USER_ABORT: return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "truncated data";
    default: return "unknown error";
    }
}

static int webp_header(const uint8_t *d, size_t n, WebPBitstreamFeatures *ft) {
    VP8StatusCode s = WebPGetFeatures(d, n, ft);
    if (s != VP8_STATUS_OK) return rn_errorf(RN_EDATA, "WebP header: %s (libwebp)", webp_status(s));
    /* PIL shows the first frame of an animation composited on its canvas; rn has no
     * animation decoder */
    if (ft->has_animation) return rn_errorf(RN_EDATA, "animated WebP: rn reads still images only");
    if (ft->width <= 0 || ft->height <= 0) return rn_errorf(RN_EDATA, "WebP header: no pixels");
    return RN_OK;
}

static int webp_decode(const uint8_t *d, size_t n, int channels, uint64_t max_pixels, uint8_t *dst) {
    WebPDecoderConfig cfg;
    if (!WebPInitDecoderConfig(&cfg)) return rn_errorf(RN_EDATA, "WebP: libwebp version mismatch");
    int rc = webp_header(d, n, &cfg.input);
    if (rc) return rc;
    size_t np = (size_t)cfg.input.width * cfg.input.height;
    if ((uint64_t)np > max_pixels)
        return rn_errorf(RN_EDATA, "WebP of %dx%d pixels is over the limit of %llu", cfg.input.width,
                         cfg.input.height, (unsigned long long)max_pixels);
    /* straight into dst: libwebp allocates nothing the size of the image; alpha is not
     * asked for (MODE_RGB), the colour of an alpha image is what PIL's RGBA decode gives */
    cfg.output.colorspace = MODE_RGB;
    cfg.output.is_external_memory = 1;
    cfg.output.u.RGBA.rgba = dst;
    cfg.output.u.RGBA.stride = cfg.input.width * 3;
    cfg.output.u.RGBA.size = np * 3;
    VP8StatusCode s = WebPDecode(d, n, &cfg);
    WebPFreeDecBuffer(&cfg.output);
    if (s != VP8_STATUS_OK) return rn_errorf(RN_EDATA, "WebP decode: %s (libwebp)", webp_status(s));
    if (channels == 1) rgb_to_gray(dst, np);
    return RN_OK;
}
#endif

int rn_imgfile_header(rn_img_format f, const uint8_t *d, size_t n, int *w, int *h) {
    *w = *h = 0;
    if (f == RN_IMG_BMP) {
        bmp_hdr bh;
        int rc = bmp_header(d, n, &bh);
        if (rc) return rc;
        *w = bh.w, *h = bh.h;
        return RN_OK;
    }
    if (f == RN_IMG_PNM) {
        pnm_hdr ph;
        int rc = pnm_header(d, n, &ph);
        if (rc) return rc;
        *w = ph.w, *h = ph.h;
        return RN_OK;
    }
#ifdef RN_HAVE_SPNG
    if (f == RN_IMG_PNG) {
        spng_ctx *ctx;
        struct spng_ihdr ih;
        int rc = png_open(d, n, &ctx, &ih);
        if (rc) return rc;
        spng_ctx_free(ctx);
        *w = (int)ih.width, *h = (int)ih.height;
        return RN_OK;
    }
#endif
#ifdef RN_HAVE_WEBP
    if (f == RN_IMG_WEBP) {
        WebPBitstreamFeatures ft;
        int rc = webp_header(d, n, &ft);
        if (rc) return rc;
        *w = ft.width, *h = ft.height;
        return RN_OK;
    }
#endif
    return unsupported(f);
}

int rn_imgfile_decode(rn_img_format f, const uint8_t *d, size_t n, int channels, uint64_t max_pixels,
                      uint8_t *dst) {
    if (channels != 1 && channels != 3) return rn_errorf(RN_EINVAL, "rn_imgfile_decode: %d channels", channels);
    if (f == RN_IMG_PNM) return pnm_decode(d, n, channels, max_pixels, dst);
    if (f == RN_IMG_BMP) return bmp_decode(d, n, channels, max_pixels, dst);
#ifdef RN_HAVE_SPNG
    if (f == RN_IMG_PNG) return png_decode(d, n, channels, max_pixels, dst);
#endif
#ifdef RN_HAVE_WEBP
    if (f == RN_IMG_WEBP) return webp_decode(d, n, channels, max_pixels, dst);
#endif
    return unsupported(f);
}
