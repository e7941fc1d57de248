/* libjpeg-turbo's decompressor, found at run time, decoding a JPEG's Y, Cb and Cr planes as they are
 * stored (no chroma upsampling, no colour conversion: _planar.h does both at the output's size),
 * or one region of it to RGB or gray at a DCT scale through the scanline calls (hx_jpeg_region).
 *
 * No libjpeg headers are needed to build this: the library is the one Pillow's wheels bring (its
 * ABI is libjpeg's version 6.2, which libjpeg-turbo keeps), opened with dlopen, and the decompressor
 * object is a block of the size that ABI gives it on 64-bit platforms, of which this file touches a
 * few fields by their byte offsets. A library of another ABI or struct size refuses the object in
 * jpeg_CreateDecompress, through the error handler below, so a mismatch is a failed decode (the
 * caller then takes another path), never a wrong one; tests/test_jpeglib.py checks the offsets
 * against a jpeglib.h where one is installed.
 *
 * Errors: libjpeg reports a fatal error by calling error_exit, which must not return; ours jumps
 * back to hx_jpeg_planes, which gives up on the image. Warnings (corrupt data it could step over,
 * a premature end) come through emit_message with level -1 and are treated the same way, so only
 * a clean decode produces planes.
 */
#ifndef HYDRAX_LIBJPEG_H
#define HYDRAX_LIBJPEG_H

#include <dlfcn.h>
#include <setjmp.h>
#include <stddef.h>
#include <string.h>

#define HX_JPEG_ABI 62           /* JPEG_LIB_VERSION of the ABI */
#define HX_JPEG_STRUCT_SIZE 632  /* sizeof(struct jpeg_decompress_struct), LP64 */
#define HX_JPEG_ERROR_SIZE 168   /* sizeof(struct jpeg_error_mgr), LP64 */
/* Byte offsets in struct jpeg_decompress_struct (LP64) */
#define HX_JPEG_ERR 0
#define HX_JPEG_IMAGE_WIDTH 48
#define HX_JPEG_IMAGE_HEIGHT 52
#define HX_JPEG_NUM_COMPONENTS 56
#define HX_JPEG_COLOR_SPACE 60
#define HX_JPEG_OUT_COLOR_SPACE 64
#define HX_JPEG_SCALE_NUM 68
#define HX_JPEG_SCALE_DENOM 72
#define HX_JPEG_RAW_DATA_OUT 92
#define HX_JPEG_DCT_METHOD 96
#define HX_JPEG_OUTPUT_WIDTH 136
#define HX_JPEG_OUTPUT_HEIGHT 140
#define HX_JPEG_OUTPUT_COMPONENTS 148
#define HX_JPEG_OUTPUT_SCANLINE 168
#define HX_JPEG_COMP_INFO 304
/* Size of jpeg_component_info, and byte offsets in it */
#define HX_JPEG_COMPONENT_SIZE 96
#define HX_JPEG_H_SAMP 8
#define HX_JPEG_V_SAMP 12
#define HX_JPEG_COMPONENT_NEEDED 48
/* Byte offsets in struct jpeg_error_mgr */
#define HX_JPEG_ERROR_EXIT 0
#define HX_JPEG_EMIT_MESSAGE 8
#define HX_JCS_GRAYSCALE 1
#define HX_JCS_RGB 2
#define HX_JCS_YCBCR 3
#define HX_JDCT_ISLOW 0
#define HX_MAX_COMPONENTS 3
/* Rows of a component in one iMCU row: 8 x its vertical sampling factor, at most 4 */
#define HX_JPEG_MAX_LINES 32

/* The library's entry points; boolean is int in libjpeg's ABI on every platform but Windows. */
typedef struct {
    void *(*std_error)(void *err);
    void (*create)(void *cinfo, int version, size_t size);
    void (*destroy)(void *cinfo);
    void (*mem_src)(void *cinfo, const unsigned char *buffer, unsigned long size);
    int (*read_header)(void *cinfo, int require_image);
    int (*start)(void *cinfo);
    unsigned int (*read_raw)(void *cinfo, unsigned char ***planes, unsigned int max_lines);
    int (*finish)(void *cinfo);
    /* The scanline calls the region decoder needs (libjpeg-turbo 1.5 and later): NULL where the
     * library lacks them, and hx_jpeg_region then declines every file. */
    unsigned int (*read_scanlines)(void *cinfo, unsigned char **rows, unsigned int max_lines);
    unsigned int (*skip_scanlines)(void *cinfo, unsigned int num_lines);
    void (*crop_scanline)(void *cinfo, unsigned int *xoffset, unsigned int *width);
    void *handle;
} hx_jpeg_api;

/* The decompressor, its error manager and where to jump on an error, in one block. The
 * decompressor comes first, so the pointer libjpeg hands the callbacks is the block's. */
typedef struct {
    union {
        unsigned char bytes[HX_JPEG_STRUCT_SIZE];
        double align;
    } cinfo;
    union {
        unsigned char bytes[256]; /* more than HX_JPEG_ERROR_SIZE */
        double align;
    } err;
    jmp_buf jump;
} hx_jpeg_job;

#define HX_JPEG_FIELD(job, type, offset) (*(type *)((job)->cinfo.bytes + (offset)))

static void hx_jpeg_error_exit(void *cinfo)
{
    longjmp(((hx_jpeg_job *)cinfo)->jump, 1);
}

static void hx_jpeg_emit_message(void *cinfo, int level)
{
    if (level < 0) /* a warning: the data is damaged */
        longjmp(((hx_jpeg_job *)cinfo)->jump, 1);
}

/* A fresh job whose error manager jumps back to the caller's setjmp on any error or warning
 * (the setjmp itself must stay in the caller's frame). */
static void hx_jpeg_clear(const hx_jpeg_api *api, hx_jpeg_job *job)
{
    memset(job, 0, sizeof(*job));
    HX_JPEG_FIELD(job, void *, HX_JPEG_ERR) = api->std_error(job->err.bytes);
    *(void (**)(void *))(job->err.bytes + HX_JPEG_ERROR_EXIT) = hx_jpeg_error_exit;
    *(void (**)(void *, int))(job->err.bytes + HX_JPEG_EMIT_MESSAGE) = hx_jpeg_emit_message;
}

/* Opens the library at path and finds its entry points: 0, or 1 with api->handle NULL. */
static int hx_jpeg_bind(const char *path, hx_jpeg_api *api)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    memset(api, 0, sizeof(*api));
    if (handle == NULL)
        return 1;
#define HX_FIND(field, name)                                          \
    do {                                                              \
        *(void **)(&api->field) = dlsym(handle, name);                \
        if (api->field == NULL) {                                     \
            dlclose(handle);                                          \
            memset(api, 0, sizeof(*api));                             \
            return 1;                                                 \
        }                                                             \
    } while (0)
    HX_FIND(std_error, "jpeg_std_error");
    HX_FIND(create, "jpeg_CreateDecompress");
    HX_FIND(destroy, "jpeg_destroy_decompress");
    HX_FIND(mem_src, "jpeg_mem_src");
    HX_FIND(read_header, "jpeg_read_header");
    HX_FIND(start, "jpeg_start_decompress");
    HX_FIND(read_raw, "jpeg_read_raw_data");
    HX_FIND(finish, "jpeg_finish_decompress");
#undef HX_FIND
    *(void **)(&api->read_scanlines) = dlsym(handle, "jpeg_read_scanlines");
    *(void **)(&api->skip_scanlines) = dlsym(handle, "jpeg_skip_scanlines");
    *(void **)(&api->crop_scanline) = dlsym(handle, "jpeg_crop_scanline");
    api->handle = handle;
    return 0;
}

/* Whether the components libjpeg read have the sampling factors the caller sized the planes for
 * (sampling: h, v of each), so no component can write past its rows. */
static int hx_jpeg_sampled_as(const hx_jpeg_job *job, const int *sampling)
{
    const unsigned char *components = HX_JPEG_FIELD(job, const unsigned char *, HX_JPEG_COMP_INFO);
    int c;
    if (components == NULL)
        return 0;
    for (c = 0; c < HX_MAX_COMPONENTS; c++) {
        const unsigned char *component = components + c * HX_JPEG_COMPONENT_SIZE;
        if (*(const int *)(component + HX_JPEG_H_SAMP) != sampling[2 * c] ||
            *(const int *)(component + HX_JPEG_V_SAMP) != sampling[2 * c + 1])
            return 0;
    }
    return 1;
}

/* Decodes the three planes of the YCbCr JPEG in data (size bytes), width x height, into rows:
 * for component c, rows[c] is an array of imcu_rows * HX_JPEG_MAX_LINES row pointers, of which
 * iMCU row m uses the HX_JPEG_MAX_LINES from m * HX_JPEG_MAX_LINES (the caller points each at a
 * row of its plane, long enough for the component's width in whole blocks). max_lines is 8 x the
 * largest vertical sampling factor. Decoding stops after the iMCU row that holds luma row stop - 1
 * (stop at most height): the decompressor is then destroyed without reading the rest, so the rows
 * below are neither decoded nor checked. Returns 0, or 1 where libjpeg reported anything, or 2 where
 * the file is not what the caller said (size, components, colour space, sampling factors). */
static int hx_jpeg_planes(const hx_jpeg_api *api, hx_jpeg_job *job, const unsigned char *data, size_t size,
                          unsigned int width, unsigned int height, const int *sampling,
                          unsigned char **rows[HX_MAX_COMPONENTS], ptrdiff_t imcu_rows, unsigned int max_lines,
                          unsigned int stop, ptrdiff_t skip)
{
    volatile int created = 0;
    volatile int status = 2;
    hx_jpeg_clear(api, job);
    if (setjmp(job->jump)) {
        if (created)
            api->destroy(job->cinfo.bytes);
        return 1;
    }
    api->create(job->cinfo.bytes, HX_JPEG_ABI, HX_JPEG_STRUCT_SIZE);
    created = 1;
    api->mem_src(job->cinfo.bytes, data, (unsigned long)size);
    api->read_header(job->cinfo.bytes, 1);
    if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_IMAGE_WIDTH) == width &&
        HX_JPEG_FIELD(job, unsigned int, HX_JPEG_IMAGE_HEIGHT) == height &&
        HX_JPEG_FIELD(job, int, HX_JPEG_NUM_COMPONENTS) == HX_MAX_COMPONENTS &&
        HX_JPEG_FIELD(job, int, HX_JPEG_COLOR_SPACE) == HX_JCS_YCBCR && max_lines <= HX_JPEG_MAX_LINES &&
        hx_jpeg_sampled_as(job, sampling)) {
        HX_JPEG_FIELD(job, int, HX_JPEG_RAW_DATA_OUT) = 1;
        HX_JPEG_FIELD(job, int, HX_JPEG_DCT_METHOD) = HX_JDCT_ISLOW;
        api->start(job->cinfo.bytes);
        if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_WIDTH) == width &&
            HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_HEIGHT) == height) {
            ptrdiff_t m;
            for (m = 0; m < imcu_rows && HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) < stop; m++) {
                unsigned char **planes[HX_MAX_COMPONENTS];
                int c;
                for (c = 0; c < HX_MAX_COMPONENTS; c++) {
                    planes[c] = rows[c] + m * HX_JPEG_MAX_LINES;
                    /* The first skip iMCU rows are entropy-decoded (the data must be read through,
                     * and damage there is still reported) but not transformed: the coefficient
                     * controller leaves a component whose component_needed is false out of the
                     * inverse DCT, and its rows in the planes unwritten. */
                    if (m == 0 || m == skip)
                        *(int *)(HX_JPEG_FIELD(job, unsigned char *, HX_JPEG_COMP_INFO) + c * HX_JPEG_COMPONENT_SIZE +
                                 HX_JPEG_COMPONENT_NEEDED) = m >= skip;
                }
                if (api->read_raw(job->cinfo.bytes, planes, max_lines) == 0)
                    break;
            }
            if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) >= height) {
                api->finish(job->cinfo.bytes);
                status = 0;
            } else if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) >= stop) {
                status = 0; /* every row asked for: the rest is left undecoded (destroy aborts) */
            }
        }
    }
    api->destroy(job->cinfo.bytes);
    return status;
}

/* Decodes part of the JPEG in data (size bytes; width x height, 1 or 3 components, gray or YCbCr)
 * scaled by 1/denom in the DCT domain (denom 1, 2, 4 or 8), as libjpeg-turbo's scanline decoder
 * makes it: gray, or RGB with the chroma upsampled ("fancy") and converted by libjpeg. Only the
 * output rows top..bottom-1 are produced (the rows above are skipped with jpeg_skip_scanlines,
 * which entropy-decodes them without the inverse DCT; decoding stops below bottom) and only the
 * columns from left, rounded down to libjpeg's iMCU column, to right-1 (jpeg_crop_scanline: the
 * others are entropy-decoded but not transformed). Output row r of the scaled image goes to
 * dest + r * stride, its column x at x * components bytes from there, so dest is laid out as the
 * whole scaled image would be and holds the region in place; nothing outside the rows and
 * columns decoded is written. The caller checks that dest holds that layout and that
 * left < right <= the scaled width, top < bottom <= the scaled height (sides rounded up).
 *
 * The first and last columns of a crop, and the first rows after a skip, are made as if they
 * were the image's edge by the chroma upsampling: callers ask for a margin around the pixels
 * they read. Returns 0, 1 where libjpeg reported anything, 2 where the file is not what the
 * caller said (size, components, colour space) or the library lacks the scanline calls or
 * scales otherwise; *first_column is set to the first column decoded. */
static int hx_jpeg_region(const hx_jpeg_api *api, hx_jpeg_job *job, const unsigned char *data, size_t size,
                          unsigned int width, unsigned int height, int components, unsigned int denom,
                          unsigned int left, unsigned int right, unsigned int top, unsigned int bottom,
                          unsigned char *dest, ptrdiff_t stride, unsigned int *first_column)
{
    volatile int created = 0;
    volatile int status = 2;
    unsigned int scaled_w = (width + denom - 1) / denom, scaled_h = (height + denom - 1) / denom;
    *first_column = left;
    if (api->read_scanlines == NULL || api->skip_scanlines == NULL || api->crop_scanline == NULL)
        return 2;
    hx_jpeg_clear(api, job);
    if (setjmp(job->jump)) {
        if (created)
            api->destroy(job->cinfo.bytes);
        return 1;
    }
    api->create(job->cinfo.bytes, HX_JPEG_ABI, HX_JPEG_STRUCT_SIZE);
    created = 1;
    api->mem_src(job->cinfo.bytes, data, (unsigned long)size);
    api->read_header(job->cinfo.bytes, 1);
    if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_IMAGE_WIDTH) == width &&
        HX_JPEG_FIELD(job, unsigned int, HX_JPEG_IMAGE_HEIGHT) == height &&
        HX_JPEG_FIELD(job, int, HX_JPEG_NUM_COMPONENTS) == components &&
        HX_JPEG_FIELD(job, int, HX_JPEG_COLOR_SPACE) == (components == 1 ? HX_JCS_GRAYSCALE : HX_JCS_YCBCR) &&
        (components == 1 || components == 3) && left < right && right <= scaled_w && top < bottom &&
        bottom <= scaled_h) {
        HX_JPEG_FIELD(job, int, HX_JPEG_OUT_COLOR_SPACE) = components == 1 ? HX_JCS_GRAYSCALE : HX_JCS_RGB;
        HX_JPEG_FIELD(job, unsigned int, HX_JPEG_SCALE_NUM) = 1;
        HX_JPEG_FIELD(job, unsigned int, HX_JPEG_SCALE_DENOM) = denom;
        HX_JPEG_FIELD(job, int, HX_JPEG_DCT_METHOD) = HX_JDCT_ISLOW;
        api->start(job->cinfo.bytes);
        if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_WIDTH) == scaled_w &&
            HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_HEIGHT) == scaled_h &&
            HX_JPEG_FIELD(job, int, HX_JPEG_OUTPUT_COMPONENTS) == components) {
            unsigned int x = left, span = right - left;
            api->crop_scanline(job->cinfo.bytes, &x, &span);
            /* libjpeg moves the left edge down to its iMCU column and keeps the right one */
            if (x <= left && x + span == right &&
                (top == 0 || api->skip_scanlines(job->cinfo.bytes, top) == top) &&
                HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) == top) {
                unsigned char *rows[HX_JPEG_MAX_LINES];
                unsigned int line;
                *first_column = x;
                while ((line = HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE)) < bottom) {
                    unsigned int k, count = bottom - line < HX_JPEG_MAX_LINES ? bottom - line : HX_JPEG_MAX_LINES;
                    for (k = 0; k < count; k++)
                        rows[k] = dest + (ptrdiff_t)(line + k) * stride + (ptrdiff_t)x * components;
                    if (api->read_scanlines(job->cinfo.bytes, rows, count) == 0)
                        break;
                }
                if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) >= scaled_h) {
                    api->finish(job->cinfo.bytes);
                    status = 0;
                } else if (HX_JPEG_FIELD(job, unsigned int, HX_JPEG_OUTPUT_SCANLINE) >= bottom) {
                    status = 0; /* the rows below are left undecoded (destroy aborts) */
                }
            }
        }
    }
    api->destroy(job->cinfo.bytes);
    return status;
}

#endif
