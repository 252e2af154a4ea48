/* sdtool plot: the curves of a metrics.jsonl as a PNG (software rasterization, a built-in 5x7
 * font) or as a compact text summary with sparklines. */
#include "sd_config.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"

#define MAX_SERIES 32

static void plot_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool plot METRICS.jsonl [--out FILE.png] [--metric NAME[,NAME...]]\n"
            "                   [--smooth N] [--logy] [--size WxH] [--text]\n"
            "\n"
            "Draws the curves of a metrics.jsonl (one JSON object per line with \"step\"; the\n"
            "validation lines carry \"val_loss\") into a PNG: one panel per metric, the losses\n"
            "(names containing \"loss\") sharing one, with axes, ticks, labels and a legend.\n"
            "\n"
            "  --out FILE     the PNG to write (default: METRICS with .png for .jsonl); a name\n"
            "                 ending in .ppm writes a binary PPM of the same pixels\n"
            "  --metric LIST  metrics to draw (default for the PNG: loss,val_loss; for --text:\n"
            "                 every numeric key but step and epoch)\n"
            "  --smooth N     trailing moving average over N points\n"
            "  --logy         logarithmic y axes (values <= 0 are left out)\n"
            "  --size WxH     image size in pixels (default 800x500)\n"
            "  --text         print min, max, last and a sparkline per metric instead (no --out)\n"
            "\n"
            "exit status: 0 done, 1 the image cannot be written, 2 bad usage (--out the same file as\n"
            "METRICS included) or a malformed file (the message gives file:line).\n");
}

/* ---- the metrics --------------------------------------------------------------------------- */

typedef struct series {
    char name[64];
    double *x, *y;
    size_t n, cap;
} series;

typedef struct metrics {
    series s[MAX_SERIES];
    int n;
    size_t lines;
    double step_min, step_max;
} metrics;

static series *find_series(metrics *m, const char *name, int create)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->s[i].name, name))
            return &m->s[i];
    if (!create || m->n == MAX_SERIES || strlen(name) >= sizeof m->s[0].name)
        return NULL;
    snprintf(m->s[m->n].name, sizeof m->s[0].name, "%s", name);
    return &m->s[m->n++];
}

static void push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->x = sd_xrealloc(s->x, s->cap * sizeof *s->x);
        s->y = sd_xrealloc(s->y, s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
}

static int is_number(json_object *v)
{
    return v && (json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double));
}

/* Wanted metric names: the comma list, or NULL for "every numeric key but step and epoch". */
static int wanted(const char *list, const char *key)
{
    size_t n = strlen(key);
    if (!list)
        return strcmp(key, "step") != 0 && strcmp(key, "epoch") != 0;
    for (const char *p = list; *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && !strncmp(p, key, n))
            return 1;
        p += len + (c ? 1 : 0);
    }
    return 0;
}

static int read_metrics(const char *path, const char *list, metrics *m, sd_err *err)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    memset(m, 0, sizeof *m);
    if (!f)
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    m->step_min = INFINITY;
    m->step_max = -INFINITY;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        json_object *o, *step;
        json_tokener *tok;
        enum json_tokener_error jerr;
        double x;
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' '))
            line[--len] = '\0';
        if (len == 0)
            continue;
        tok = json_tokener_new();
        o = json_tokener_parse_ex(tok, line, (int)len);
        jerr = json_tokener_get_error(tok);
        if (o && jerr == json_tokener_success && json_tokener_get_parse_end(tok) < (size_t)len)
            jerr = json_tokener_error_parse_unexpected;
        json_tokener_free(tok);
        if (!o || jerr != json_tokener_success || !json_object_is_type(o, json_type_object)) {
            rc = sd_err_at(err, path, lineno, 1, "not a JSON object (%s)",
                           jerr == json_tokener_continue ? "the line ends inside it"
                           : !o || jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                                                                : "another JSON value");
            json_object_put(o);
            break;
        }
        if (!json_object_object_get_ex(o, "step", &step) || !is_number(step)) {
            rc = sd_err_at(err, path, lineno, 1, "no numeric \"step\"");
            json_object_put(o);
            break;
        }
        x = json_object_get_double(step);
        m->lines++;
        m->step_min = fmin(m->step_min, x);
        m->step_max = fmax(m->step_max, x);
        {
            json_object_object_foreach(o, key, val)
            {
                series *s;
                double y;
                if (!is_number(val) || !wanted(list, key))
                    continue;
                y = json_object_get_double(val);
                /* sdtrain writes -1 for a loss or gradient norm that was not finite (a skipped
                 * step): no value, not a point at -1 */
                if ((strstr(key, "loss") || !strcmp(key, "grad_norm")) && y == -1.0)
                    continue;
                if (!isfinite(y) || !(s = find_series(m, key, 1)))
                    continue;
                push(s, x, y);
            }
        }
        json_object_put(o);
    }
    /* a read error (a directory given: EISDIR) is not the end of an empty file */
    if (!rc && ferror(f))
        rc = sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (!rc && m->lines == 0)
        rc = sd_err_set(err, "%s: no metrics lines", path);
    return rc;
}

static void free_metrics(metrics *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->s[i].x);
        free(m->s[i].y);
    }
}

/* Trailing moving average over n points, in place. */
static void smooth(series *s, int n)
{
    double sum = 0, *y;
    if (n <= 1 || s->n == 0)
        return;
    y = sd_xmalloc(s->n * sizeof *y);
    for (size_t i = 0; i < s->n; i++) {
        sum += s->y[i];
        if (i >= (size_t)n)
            sum -= s->y[i - (size_t)n];
        y[i] = sum / (double)(i + 1 < (size_t)n ? i + 1 : (size_t)n);
    }
    memcpy(s->y, y, s->n * sizeof *y);
    free(y);
}

/* Tick labels: short, and no exponent for the usual learning rates. */
static void fmt_tick(double v, char *buf, size_t size)
{
    if (v != 0 && (fabs(v) < 1e-4 || fabs(v) >= 1e6))
        snprintf(buf, size, "%.1e", v);
    else
        snprintf(buf, size, "%.4g", v);
}

static void fmt_num(double v, char *buf, size_t size)
{
    if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e5))
        snprintf(buf, size, "%.2e", v);
    else
        snprintf(buf, size, "%.4g", v);
}

/* ---- text summary -------------------------------------------------------------------------- */

static void print_text(const char *path, const metrics *m, const int *order)
{
    static const char ramp[] = "_.-~=+*#";
    const int width = m->lines < 40 ? (int)m->lines : 40;
    printf("%s: %zu lines, steps %.0f..%.0f\n", path, m->lines, m->step_min, m->step_max);
    int nw = 14; /* the name column: as wide as the longest name */
    for (int i = 0; i < m->n; i++)
        if ((int)strlen(m->s[i].name) > nw)
            nw = (int)strlen(m->s[i].name);
    printf("%-*s %6s %11s %11s %11s  %s\n", nw, "metric", "points", "min", "max", "last",
           "sparkline (by step)");
    for (int i = 0; i < m->n; i++) {
        const series *s = &m->s[order[i]];
        double lo = INFINITY, hi = -INFINITY, bins[64];
        int cnt[64] = {0};
        char a[32], b[32], c[32], line[65];
        for (size_t k = 0; k < s->n; k++) {
            lo = fmin(lo, s->y[k]);
            hi = fmax(hi, s->y[k]);
        }
        memset(bins, 0, sizeof bins);
        for (size_t k = 0; k < s->n; k++) {
            double span = m->step_max - m->step_min;
            int bi = span > 0 ? (int)((s->x[k] - m->step_min) / span * (width - 1) + 0.5) : 0;
            bins[bi] += s->y[k];
            cnt[bi]++;
        }
        for (int k = 0; k < width; k++) {
            if (!cnt[k]) {
                line[k] = ' ';
                continue;
            }
            double v = bins[k] / cnt[k];
            int level = hi > lo ? (int)((v - lo) / (hi - lo) * 7 + 0.5) : 3;
            line[k] = ramp[level];
        }
        line[width] = '\0';
        fmt_num(lo, a, sizeof a);
        fmt_num(hi, b, sizeof b);
        fmt_num(s->y[s->n - 1], c, sizeof c);
        printf("%-*s %6zu %11s %11s %11s  |%s|\n", nw, s->name, s->n, a, b, c, line);
    }
}

/* ---- rasterization ------------------------------------------------------------------------- */

typedef struct canvas {
    uint8_t *px;
    int w, h;
} canvas;

static void put(canvas *c, int x, int y, const uint8_t rgb[3])
{
    if (x < 0 || y < 0 || x >= c->w || y >= c->h)
        return;
    memcpy(c->px + ((size_t)y * (size_t)c->w + (size_t)x) * 3, rgb, 3);
}

static void rect(canvas *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3])
{
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++)
            put(c, x, y, rgb);
}

/* Bresenham, `thick` pixels wide. */
static void line(canvas *c, int x0, int y0, int x1, int y1, int thick, const uint8_t rgb[3])
{
    int dx = abs(x1 - x0), dy = -abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int e = dx + dy;
    for (;;) {
        rect(c, x0 - thick / 2, y0 - thick / 2, x0 + (thick - 1) / 2, y0 + (thick - 1) / 2, rgb);
        if (x0 == x1 && y0 == y1)
            break;
        int e2 = 2 * e;
        if (e2 >= dy) {
            e += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            e += dx;
            y0 += sy;
        }
    }
}

/* 5x7 glyphs, rows top to bottom, bit 4 = leftmost column. Lower-case letters are drawn with
 * the capitals. */
static const struct glyph {
    char ch;
    uint8_t rows[7];
} font[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},
    {'2', {14, 17, 1, 2, 4, 8, 31}},     {'3', {31, 2, 4, 2, 1, 17, 14}},
    {'4', {2, 6, 10, 18, 31, 2, 2}},     {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},
    {'8', {14, 17, 17, 14, 17, 17, 14}}, {'9', {14, 17, 17, 15, 1, 2, 12}},
    {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}}, {'D', {28, 18, 17, 17, 17, 18, 28}},
    {'E', {31, 16, 16, 30, 16, 16, 31}}, {'F', {31, 16, 16, 30, 16, 16, 16}},
    {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},      {'J', {7, 2, 2, 2, 2, 18, 12}},
    {'K', {17, 18, 20, 24, 20, 18, 17}}, {'L', {16, 16, 16, 16, 16, 16, 31}},
    {'M', {17, 27, 21, 21, 17, 17, 17}}, {'N', {17, 17, 25, 21, 19, 17, 17}},
    {'O', {14, 17, 17, 17, 17, 17, 14}}, {'P', {30, 17, 17, 30, 16, 16, 16}},
    {'Q', {14, 17, 17, 17, 21, 18, 13}}, {'R', {30, 17, 17, 30, 20, 18, 17}},
    {'S', {15, 16, 16, 14, 1, 1, 30}},   {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}}, {'V', {17, 17, 17, 17, 17, 10, 4}},
    {'W', {17, 17, 17, 21, 21, 21, 10}}, {'X', {17, 17, 10, 4, 10, 17, 17}},
    {'Y', {17, 17, 17, 10, 4, 4, 4}},    {'Z', {31, 1, 2, 4, 8, 16, 31}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},      {'-', {0, 0, 0, 31, 0, 0, 0}},
    {'+', {0, 4, 4, 31, 4, 4, 0}},       {'_', {0, 0, 0, 0, 0, 0, 31}},
    {':', {0, 12, 12, 0, 12, 12, 0}},    {',', {0, 0, 0, 0, 12, 4, 8}},
    {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},
    {'/', {0, 1, 2, 4, 8, 16, 0}},       {'=', {0, 0, 31, 0, 31, 0, 0}},
    {'%', {24, 25, 2, 4, 8, 19, 3}},     {'?', {14, 17, 1, 2, 4, 0, 4}},
};

static const uint8_t *glyph_rows(char ch)
{
    if (ch >= 'a' && ch <= 'z')
        ch = (char)(ch - 'a' + 'A');
    for (size_t i = 0; i < sizeof font / sizeof font[0]; i++)
        if (font[i].ch == ch)
            return font[i].rows;
    return ch == ' ' ? NULL : font[sizeof font / sizeof font[0] - 1].rows;
}

#define CHAR_W 6 /* 5 columns and a space */
#define CHAR_H 7

static int text_width(const char *s) { return (int)strlen(s) * CHAR_W - 1; }

static void text(canvas *c, int x, int y, const char *s, const uint8_t rgb[3])
{
    for (; *s; s++, x += CHAR_W) {
        const uint8_t *r = glyph_rows(*s);
        for (int row = 0; r && row < CHAR_H; row++)
            for (int col = 0; col < 5; col++)
                if (r[row] >> (4 - col) & 1)
                    put(c, x + col, y + row, rgb);
    }
}

/* About `want` round tick values covering [lo, hi]: *first and *step. */
static void nice_ticks(double lo, double hi, int want, double *first, double *step)
{
    double span = hi - lo, raw = span / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    *step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    *first = ceil(lo / *step - 1e-9) * *step;
}

static const uint8_t WHITE[3] = {255, 255, 255}, BLACK[3] = {0, 0, 0}, GRID[3] = {225, 225, 225};
static const uint8_t PALETTE[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},
                                     {214, 39, 40},  {148, 103, 189}, {140, 86, 75},
                                     {227, 119, 194}, {127, 127, 127}};

typedef struct panel {
    int members[MAX_SERIES];
    int n;
} panel;

static void draw_panel(canvas *c, const metrics *m, const panel *p, int top, int height,
                       int logy, int last)
{
    const int left = 78, right = c->w - 16, ptop = top + 14, pbot = top + height - 24;
    double ylo = INFINITY, yhi = -INFINITY, xlo = m->step_min, xhi = m->step_max, first, step;
    char buf[48];
    if (right - left < 40 || pbot - ptop < 30)
        return;
    for (int k = 0; k < p->n; k++) {
        const series *s = &m->s[p->members[k]];
        for (size_t i = 0; i < s->n; i++) {
            double v = s->y[i];
            if (logy && v <= 0)
                continue;
            v = logy ? log10(v) : v;
            ylo = fmin(ylo, v);
            yhi = fmax(yhi, v);
        }
    }
    if (!(ylo <= yhi)) {
        ylo = 0;
        yhi = 1;
    }
    if (yhi - ylo < 1e-12 * fmax(1, fabs(yhi))) {
        double d = fabs(yhi) > 0 ? fabs(yhi) * 0.05 : 0.5;
        ylo -= d;
        yhi += d;
    } else {
        double pad = (yhi - ylo) * 0.05;
        ylo -= pad;
        yhi += pad;
    }
    if (xhi <= xlo) {
        xlo -= 1;
        xhi += 1;
    }
#define PX(x) (left + (int)lround(((x) - xlo) / (xhi - xlo) * (right - left)))
#define PY(y) (pbot - (int)lround(((y) - ylo) / (yhi - ylo) * (pbot - ptop)))
    /* grid, ticks and their labels */
    nice_ticks(ylo, yhi, 5, &first, &step);
    for (double t = first; t <= yhi + 1e-9 * step; t += step) {
        int y = PY(t);
        line(c, left, y, right, y, 1, GRID);
        line(c, left - 4, y, left, y, 1, BLACK);
        fmt_tick(logy ? pow(10, t) : (fabs(t) < step * 1e-6 ? 0 : t), buf, sizeof buf);
        text(c, left - 7 - text_width(buf), y - 3, buf, BLACK);
    }
    nice_ticks(xlo, xhi, 8, &first, &step);
    for (double t = first; t <= xhi + 1e-9 * step; t += step) {
        int x = PX(t);
        line(c, x, ptop, x, pbot, 1, GRID);
        line(c, x, pbot, x, pbot + 4, 1, BLACK);
        fmt_tick(fabs(t) < step * 1e-6 ? 0 : t, buf, sizeof buf);
        text(c, x - text_width(buf) / 2, pbot + 7, buf, BLACK);
    }
    line(c, left, ptop, left, pbot, 1, BLACK);
    line(c, left, pbot, right, pbot, 1, BLACK);
    line(c, left, ptop, right, ptop, 1, BLACK);
    line(c, right, ptop, right, pbot, 1, BLACK);
    if (last)
        text(c, (left + right) / 2 - text_width("step") / 2, pbot + 16, "step", BLACK);
    if (logy)
        text(c, 4, ptop, "log", BLACK);
    /* the curves: lines, and a marker on every point of a sparse series */
    for (int k = 0; k < p->n; k++) {
        const series *s = &m->s[p->members[k]];
        const uint8_t *col = PALETTE[p->members[k] % 8];
        int px = 0, py = 0, have = 0, sparse = s->n * 8 < (size_t)(right - left);
        for (size_t i = 0; i < s->n; i++) {
            double v = s->y[i];
            if (logy && v <= 0) {
                have = 0;
                continue;
            }
            int x = PX(s->x[i]), y = PY(logy ? log10(v) : v);
            if (have)
                line(c, px, py, x, y, 2, col);
            if (sparse)
                rect(c, x - 2, y - 2, x + 2, y + 2, col);
            px = x;
            py = y;
            have = 1;
        }
    }
    /* the legend, top right inside the frame */
    {
        int wmax = 0, x, y = ptop + 5;
        for (int k = 0; k < p->n; k++)
            if (text_width(m->s[p->members[k]].name) > wmax)
                wmax = text_width(m->s[p->members[k]].name);
        x = right - wmax - 30;
        rect(c, x - 4, ptop + 2, right - 3, ptop + 8 + 11 * p->n, WHITE);
        for (int k = 0; k < p->n; k++, y += 11) {
            const uint8_t *col = PALETTE[p->members[k] % 8];
            line(c, x, y + 3, x + 16, y + 3, 2, col);
            text(c, x + 21, y, m->s[p->members[k]].name, BLACK);
        }
    }
#undef PX
#undef PY
}

static int write_ppm(const char *path, const canvas *c, sd_err *err)
{
    FILE *f = fopen(path, "wb");
    size_t n = (size_t)c->w * (size_t)c->h * 3;
    if (!f || fprintf(f, "P6\n%d %d\n255\n", c->w, c->h) < 0 || fwrite(c->px, 1, n, f) != n ||
        fclose(f) != 0)
        return sd_err_set(err, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

int sd_cmd_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *list = NULL;
    int smooth_n = 0, logy = 0, as_text = 0, w = 800, h = 500, code = SD_EXIT_OK, order[MAX_SERIES];
    char out_buf[4200], list_buf[512];
    metrics m;
    sd_err err;
    panel panels[MAX_SERIES];
    int n_panels = 0, loss_panel = -1;
    canvas c;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plot_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(a, "--logy")) {
            logy = 1;
        } else if (!strcmp(a, "--text")) {
            as_text = 1;
        } else if (i + 1 < argc && !strcmp(a, "--out")) {
            out = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--metric")) {
            list = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--smooth")) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 1000000) {
                fprintf(stderr, "sdtool plot: --smooth wants a point count >= 1, not '%s'\n", argv[i]);
                return SD_EXIT_USAGE;
            }
            smooth_n = (int)v;
        } else if (i + 1 < argc && !strcmp(a, "--size")) {
            int used = -1;
            if (sscanf(argv[++i], "%dx%d%n", &w, &h, &used) != 2 || argv[i][used] != '\0' ||
                w < 200 || h < 120 || w > 8000 || h > 8000) {
                fprintf(stderr, "sdtool plot: --size wants WxH within 200x120..8000x8000, not '%s'\n",
                        argv[i]);
                return SD_EXIT_USAGE;
            }
        } else if (a[0] == '-' || in) {
            fprintf(stderr, "sdtool plot: unexpected argument '%s'\n", a);
            plot_usage(stderr);
            return SD_EXIT_USAGE;
        } else {
            in = a;
        }
    }
    if (!in) {
        plot_usage(stderr);
        return SD_EXIT_USAGE;
    }
    if (as_text && out) {
        fprintf(stderr, "sdtool plot: --text prints to standard output: --out '%s' would not be "
                        "written (give one of the two)\n", out);
        return SD_EXIT_USAGE;
    }
    if (list && strlen(list) >= sizeof list_buf) {
        fprintf(stderr, "sdtool plot: --metric: a list of %zu bytes (at most %zu)\n", strlen(list),
                sizeof list_buf - 1);
        return SD_EXIT_USAGE;
    }
    if (!list && !as_text)
        list = "loss,val_loss";
    if (read_metrics(in, list, &m, &err)) {
        fprintf(stderr, "sdtool plot: %s\n", err.msg);
        free_metrics(&m);
        return SD_EXIT_USAGE;
    }
    /* the order asked for (--metric), else the file's */
    for (int i = 0; i < m.n; i++)
        order[i] = i;
    if (list) {
        int k = 0;
        snprintf(list_buf, sizeof list_buf, "%s", list);
        for (char *save = NULL, *t = strtok_r(list_buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
            for (int i = 0; i < m.n; i++) {
                int dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= order[j] == i;
                if (!dup && !strcmp(m.s[i].name, t))
                    order[k++] = i;
            }
        if (k == 0) {
            fprintf(stderr, "sdtool plot: %s: none of the metrics '%s' occurs in the file\n", in,
                    list);
            free_metrics(&m);
            return SD_EXIT_USAGE;
        }
    }
    for (int i = 0; i < m.n; i++)
        smooth(&m.s[i], smooth_n);
    if (as_text) {
        print_text(in, &m, order);
        free_metrics(&m);
        return SD_EXIT_OK;
    }
    for (int k = 0; k < m.n; k++) {
        int i = order[k], is_loss = strstr(m.s[i].name, "loss") != NULL;
        panel *p;
        if (is_loss && loss_panel >= 0) {
            p = &panels[loss_panel];
        } else {
            p = &panels[n_panels];
            p->n = 0;
            if (is_loss)
                loss_panel = n_panels;
            n_panels++;
        }
        p->members[p->n++] = i;
    }
    if (!out) {
        size_t n = strlen(in);
        if (n > 6 && !strcmp(in + n - 6, ".jsonl"))
            n -= 6;
        snprintf(out_buf, sizeof out_buf, "%.*s.png", (int)n, in);
        out = out_buf;
    }
    if (sd_same_file(in, out)) {
        fprintf(stderr, "sdtool plot: the output '%s' is the input '%s': it would be overwritten\n", out, in);
        free_metrics(&m);
        return SD_EXIT_USAGE;
    }
    c.w = w;
    c.h = h;
    c.px = sd_xmalloc((size_t)w * (size_t)h * 3);
    memset(c.px, 255, (size_t)w * (size_t)h * 3);
    text(&c, 78, 3, in, BLACK);
    {
        int top = 12, avail = h - top - 12;
        for (int k = 0; k < n_panels; k++)
            draw_panel(&c, &m, &panels[k], top + avail * k / n_panels, avail / n_panels,
                       logy, k == n_panels - 1);
    }
    {
        size_t n = strlen(out);
        int rc = n > 4 && !strcmp(out + n - 4, ".ppm") ? write_ppm(out, &c, &err)
                                                        : sd_image_write_png(out, c.px, w, h, &err);
        if (rc) {
            fprintf(stderr, "sdtool plot: %s\n", err.msg);
            code = SD_EXIT_FAILURE;
        } else {
            printf("wrote %s (%dx%d): ", out, w, h);
            for (int k = 0; k < m.n; k++)
                printf("%s%s (%zu points)", k ? ", " : "", m.s[order[k]].name, m.s[order[k]].n);
            printf("\n");
        }
    }
    free(c.px);
    free_metrics(&m);
    return code;
}
