/* sdtool score-demo: does each image show what its demo caption says ("a red square on a blue
 * background", as sdtool make-demo-data draws them)? Colours of the object and the background
 * and the shape are read off the pixels deterministically; accuracies come with chance levels. */
#include "sd_config.h"

#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sdtrain/check.h"
#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"

/* The palette and shapes of cmd_make_demo_data.c (same order, same RGB). */
static const struct {
    const char *name;
    int rgb[3];
} colours[] = {{"red", {220, 30, 30}},     {"green", {30, 180, 50}},  {"blue", {40, 60, 220}},
               {"yellow", {240, 220, 40}}, {"white", {245, 245, 245}}, {"black", {15, 15, 15}},
               {"purple", {140, 40, 170}}, {"orange", {250, 140, 20}}};
#define N_COLOURS 8
static const char *const shapes[] = {"square", "circle", "triangle", "stripe"};
#define N_SHAPES 4
enum { SQUARE = 0, CIRCLE, TRIANGLE, STRIPE };

static void score_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool score-demo --samples DIR [--captions FILE] [--json]\n"
            "\n"
            "Scores images against captions of the demo data (\"a COLOUR SHAPE [on a COLOUR\n"
            "background]\", colours red green blue yellow white black purple orange, shapes\n"
            "square circle triangle stripe): the object's colour is read from the centre of the\n"
            "image, the background's from its border, the shape from the mask of object-coloured\n"
            "pixels against the shapes make-demo-data draws. Prints per-prompt scores, the\n"
            "accuracies and their chance levels.\n"
            "\n"
            "  --samples DIR   the output directory of mode 'sample' (DIR/samples.jsonl lists\n"
            "                  prompt and file), or a make-demo-data 'files' directory (images\n"
            "                  with .txt captions beside them)\n"
            "  --captions FILE lines IMAGE<TAB>CAPTION (IMAGE relative to DIR; a 'path<TAB>caption'\n"
            "                  header is skipped, as in make-demo-data's manifest.tsv) instead\n"
            "  --json          one JSON object on standard output instead of the table\n"
            "\n"
            "exit status: 0 scored, 2 bad usage or input (no images, an unreadable image or list,\n"
            "no caption the scorer understands).\n");
}

/* ---- captions ------------------------------------------------------------------------------ */

typedef struct caption {
    int fg, bg, shape; /* bg = -1 when the caption does not say */
} caption;

static int word_index(const char *w, size_t n, const char *const *names, int count, int plural)
{
    for (int i = 0; i < count; i++) {
        size_t k = strlen(names[i]);
        if ((n == k || (plural && n == k + 1 && w[k] == 's')) && !strncmp(w, names[i], k))
            return i;
    }
    return -1;
}

/* "a red square", "a red square on a blue background" (case-insensitive). 0, or -1. */
static int parse_caption(const char *text, caption *c)
{
    char buf[256], *words[12], *save = NULL;
    const char *cn[N_COLOURS];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", text);
    for (char *p = buf; *p; p++)
        *p = (char)(*p >= 'A' && *p <= 'Z' ? *p - 'A' + 'a' : *p == '.' || *p == ',' ? ' ' : *p);
    for (char *t = strtok_r(buf, " \t\r\n", &save); t && n < 12; t = strtok_r(NULL, " \t\r\n", &save))
        words[n++] = t;
    for (int i = 0; i < N_COLOURS; i++)
        cn[i] = colours[i].name;
    if (n < 2)
        return -1;
    {
        int i = (!strcmp(words[0], "a") || !strcmp(words[0], "an")) ? 1 : 0;
        if (i + 2 > n)
            return -1;
        c->fg = word_index(words[i], strlen(words[i]), cn, N_COLOURS, 0);
        c->shape = word_index(words[i + 1], strlen(words[i + 1]), shapes, N_SHAPES, 1);
        c->bg = -1;
        if (c->fg < 0 || c->shape < 0)
            return -1;
        i += 2;
        if (i == n)
            return 0;
        if (strcmp(words[i], "on") != 0)
            return -1;
        i++;
        if (i < n && (!strcmp(words[i], "a") || !strcmp(words[i], "an")))
            i++;
        if (i >= n)
            return -1;
        c->bg = word_index(words[i], strlen(words[i]), cn, N_COLOURS, 0);
        if (c->bg < 0 || c->bg == c->fg || (i + 1 < n && strcmp(words[i + 1], "background")))
            return -1;
        return 0;
    }
}

/* ---- reading an image ---------------------------------------------------------------------- */

typedef struct reading {
    double centre[N_COLOURS], border[N_COLOURS]; /* fractions of pixels nearest each colour */
    int fg, bg, shape;                           /* the reading */
    double border_fg, iou[3];                    /* shape evidence */
} reading;

static int nearest(const uint8_t *p)
{
    int best = 0;
    long bd = -1;
    for (int i = 0; i < N_COLOURS; i++) {
        long d = 0;
        for (int c = 0; c < 3; c++) {
            long e = (long)p[c] - colours[i].rgb[c];
            d += e * e;
        }
        if (bd < 0 || d < bd) {
            bd = d;
            best = i;
        }
    }
    return best;
}

static long dist2(const uint8_t *p, int col)
{
    long d = 0;
    for (int c = 0; c < 3; c++) {
        long e = (long)p[c] - colours[col].rgb[c];
        d += e * e;
    }
    return d;
}

/* The shapes as make-demo-data draws them: centre (w/2, h/2), "radius" min(w, h)/3. */
static int in_shape(int shape, int x, int y, int cx, int cy, int rad)
{
    switch (shape) {
    case SQUARE: return abs(x - cx) < rad && abs(y - cy) < rad;
    case CIRCLE: return (x - cx) * (x - cx) + (y - cy) * (y - cy) < rad * rad;
    default: return y > cy - rad && y < cy + rad && abs(x - cx) < (y - (cy - rad)) / 2;
    }
}

static void read_image(const uint8_t *px, int w, int h, reading *r)
{
    int s = w < h ? w : h, cx = w / 2, cy = h / 2, rad = s / 3;
    int half = s / 12 > 1 ? s / 12 : 1, b = s / 10 > 1 ? s / 10 : 1;
    long nc = 0, nb = 0, inter[3] = {0}, uni[3] = {0}, bfg = 0;
    double best = -1;
    memset(r, 0, sizeof *r);
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int k = nearest(px + ((size_t)y * (size_t)w + (size_t)x) * 3);
            if (abs(x - cx) <= half && abs(y - cy) <= half) {
                r->centre[k]++;
                nc++;
            }
            if (x < b || y < b || x >= w - b || y >= h - b) {
                r->border[k]++;
                nb++;
            }
        }
    for (int k = 0; k < N_COLOURS; k++) {
        r->centre[k] /= (double)(nc ? nc : 1);
        r->border[k] /= (double)(nb ? nb : 1);
    }
    /* the colour pair that explains centre and border best */
    for (int f = 0; f < N_COLOURS; f++)
        for (int g = 0; g < N_COLOURS; g++)
            if (f != g && r->centre[f] + r->border[g] > best) {
                best = r->centre[f] + r->border[g];
                r->fg = f;
                r->bg = g;
            }
    /* the object mask (nearer the object's colour than the background's) against the shapes */
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            const uint8_t *p = px + ((size_t)y * (size_t)w + (size_t)x) * 3;
            int m = dist2(p, r->fg) < dist2(p, r->bg);
            if (m && (x < b || y < b || x >= w - b || y >= h - b))
                bfg++;
            for (int t = 0; t < 3; t++) {
                int in = in_shape(t, x, y, cx, cy, rad);
                inter[t] += m && in;
                uni[t] += m || in;
            }
        }
    r->border_fg = (double)bfg / (double)(nb ? nb : 1);
    r->shape = SQUARE;
    for (int t = 0; t < 3; t++) {
        r->iou[t] = uni[t] ? (double)inter[t] / (double)uni[t] : 0;
        if (r->iou[t] > r->iou[r->shape])
            r->shape = t;
    }
    /* stripes run over the whole picture: object colour in the border too */
    if (r->border_fg > 0.25)
        r->shape = STRIPE;
}

/* ---- the list of images -------------------------------------------------------------------- */

typedef struct item {
    char *file, *prompt;
} item;

typedef struct item_list {
    item *v;
    size_t n, cap;
} item_list;

static void add_item(item_list *l, const char *file, const char *prompt)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->v = sd_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n].file = sd_xstrdup(file);
    l->v[l->n].prompt = sd_xstrdup(prompt);
    l->n++;
}

static void strip(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' '))
        s[--n] = '\0';
}

static int read_samples_jsonl(const char *dir, const char *path, item_list *l, sd_err *err)
{
    FILE *f = fopen(path, "r");
    char *line = NULL, file[8192];
    size_t cap = 0;
    int lineno = 0, rc = 0;
    if (!f)
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    while (!rc && getline(&line, &cap, f) >= 0) {
        json_object *o, *p, *fl;
        lineno++;
        strip(line);
        if (!line[0])
            continue;
        o = json_tokener_parse(line);
        if (!o || !json_object_is_type(o, json_type_object) ||
            !json_object_object_get_ex(o, "prompt", &p) ||
            !json_object_object_get_ex(o, "file", &fl) || !json_object_is_type(p, json_type_string) ||
            !json_object_is_type(fl, json_type_string)) {
            rc = sd_err_at(err, path, lineno, 1, "not a samples.jsonl line (a JSON object with "
                                                 "\"prompt\" and \"file\")");
        } else {
            snprintf(file, sizeof file, "%s/%s", dir, json_object_get_string(fl));
            add_item(l, file, json_object_get_string(p));
        }
        json_object_put(o);
    }
    if (!rc && ferror(f)) /* a directory given (EISDIR) is not an empty list */
        rc = sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    free(line);
    fclose(f);
    return rc;
}

static int read_captions(const char *dir, const char *path, item_list *l, sd_err *err)
{
    FILE *f = fopen(path, "r");
    char *line = NULL, file[8192];
    size_t cap = 0;
    int lineno = 0, rc = 0;
    if (!f)
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    while (!rc && getline(&line, &cap, f) >= 0) {
        char *tab;
        lineno++;
        strip(line);
        if (!line[0] || (lineno == 1 && !strcmp(line, "path\tcaption")))
            continue;
        tab = strchr(line, '\t');
        if (!tab) {
            rc = sd_err_at(err, path, lineno, 1, "expected IMAGE<TAB>CAPTION");
            break;
        }
        *tab = '\0';
        snprintf(file, sizeof file, "%s%s%s", line[0] == '/' ? "" : dir, line[0] == '/' ? "" : "/",
                 line);
        add_item(l, file, tab + 1);
    }
    if (!rc && ferror(f)) /* a directory given (EISDIR) is not an empty list */
        rc = sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    free(line);
    fclose(f);
    return rc;
}

static int is_image_name(const char *n)
{
    const char *dot = strrchr(n, '.');
    return dot && (!strcmp(dot, ".png") || !strcmp(dot, ".jpg") || !strcmp(dot, ".jpeg"));
}

/* make-demo-data's 'files' layout: DIR/00000/000000012.jpg + .txt (and images in DIR itself). */
static int scan_files(const char *dir, item_list *l, int depth, sd_err *err)
{
    size_t n;
    char **names = sd_list_names(dir, &n);
    int rc = 0;
    if (!names)
        return sd_err_set(err, "%s: cannot read folder: %s", dir, strerror(errno));
    for (size_t i = 0; i < n; i++) {
        char path[8192], txt[8192], *cap_text = NULL;
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            if (depth == 0 && !rc)
                rc = scan_files(path, l, 1, err);
        } else if (!rc && is_image_name(names[i])) {
            FILE *f;
            long len;
            snprintf(txt, sizeof txt, "%s", path);
            *strrchr(txt, '.') = '\0';
            strncat(txt, ".txt", sizeof txt - strlen(txt) - 1);
            f = fopen(txt, "rb");
            if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && len < 4096 &&
                fseek(f, 0, SEEK_SET) == 0) {
                cap_text = sd_xcalloc((size_t)len + 1, 1);
                if (fread(cap_text, 1, (size_t)len, f) != (size_t)len)
                    cap_text[0] = '\0';
            }
            if (f)
                fclose(f);
            if (cap_text) {
                strip(cap_text);
                add_item(l, path, cap_text);
                free(cap_text);
            }
        }
    }
    sd_free_names(names, n);
    return rc;
}

/* ---- scoring ------------------------------------------------------------------------------- */

typedef struct result {
    int scored;
    caption cap;
    reading rd;
    int colours_ok, shape_ok, all_ok;
    double score;                      /* the caption's colours' share of centre and border */
    double chance_colours, chance_all; /* of a uniform guess, for this caption */
} result;

static void judge(result *r)
{
    const caption *c = &r->cap;
    const reading *d = &r->rd;
    int stripe = c->shape == STRIPE;
    if (c->bg >= 0) {
        /* stripes alternate the two colours over the whole picture: which one is the object
         * cannot be seen, so the pair counts in either order */
        r->colours_ok = (d->fg == c->fg && d->bg == c->bg) ||
                        (stripe && d->fg == c->bg && d->bg == c->fg);
        r->score = (d->centre[c->fg] + d->border[c->bg]) / 2;
        if (stripe)
            r->score = fmax(r->score, (d->centre[c->bg] + d->border[c->fg]) / 2);
        r->chance_colours = (stripe ? 2.0 : 1.0) / (N_COLOURS * (N_COLOURS - 1));
    } else {
        r->colours_ok = d->fg == c->fg || (stripe && d->bg == c->fg);
        r->score = stripe ? fmax(d->centre[c->fg], d->border[c->fg]) : d->centre[c->fg];
        r->chance_colours = (stripe ? 2.0 : 1.0) / N_COLOURS;
    }
    r->shape_ok = d->shape == c->shape;
    r->all_ok = r->colours_ok && r->shape_ok;
    r->chance_all = r->chance_colours / N_SHAPES;
}

static void describe(const reading *d, char *buf, size_t size)
{
    snprintf(buf, size, "%s %s on %s", colours[d->fg].name, shapes[d->shape], colours[d->bg].name);
}

int sd_cmd_score_demo(int argc, char **argv)
{
    const char *dir = NULL, *captions = NULL;
    int as_json = 0, code = SD_EXIT_OK;
    item_list l = {NULL, 0, 0};
    result *res = NULL;
    sd_err err;
    char list_path[8192], src[8192];
    size_t n_scored = 0, n_colours = 0, n_shape = 0, n_all = 0;
    double chance_colours = 0, chance_all = 0, score_sum = 0;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            score_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            as_json = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--samples")) {
            dir = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--captions")) {
            captions = argv[++i];
        } else {
            fprintf(stderr, "sdtool score-demo: unexpected argument '%s'\n", argv[i]);
            score_usage(stderr);
            return SD_EXIT_USAGE;
        }
    }
    if (!dir) {
        fprintf(stderr, "sdtool score-demo: --samples DIR is required\n");
        score_usage(stderr);
        return SD_EXIT_USAGE;
    }
    snprintf(list_path, sizeof list_path, "%s/samples.jsonl", dir);
    {
        struct stat st;
        int rc;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "sdtool score-demo: --samples %s: no such folder\n", dir);
            return SD_EXIT_USAGE;
        }
        if (captions) {
            rc = read_captions(dir, captions, &l, &err);
            snprintf(src, sizeof src, "%s", captions);
        } else if (stat(list_path, &st) == 0) {
            rc = read_samples_jsonl(dir, list_path, &l, &err);
            snprintf(src, sizeof src, "%s", list_path);
        } else {
            rc = scan_files(dir, &l, 0, &err);
            snprintf(src, sizeof src, "%s (images with .txt captions)", dir);
        }
        if (!rc && l.n == 0)
            rc = sd_err_set(&err, "%s: no images to score", src);
        if (rc) {
            fprintf(stderr, "sdtool score-demo: %s\n", err.msg);
            code = SD_EXIT_USAGE;
            goto done;
        }
    }
    res = sd_xcalloc(l.n, sizeof *res);
    for (size_t i = 0; i < l.n; i++) {
        sd_image img = SD_IMAGE_INIT;
        if (parse_caption(l.v[i].prompt, &res[i].cap) != 0)
            continue;
        if (sd_image_decode_file(l.v[i].file, NULL, &img, &err) != SD_IMG_OK) {
            fprintf(stderr, "sdtool score-demo: %s\n", err.msg);
            sd_image_free(&img);
            code = SD_EXIT_USAGE;
            goto done;
        }
        read_image(img.data, img.width, img.height, &res[i].rd);
        sd_image_free(&img);
        res[i].scored = 1;
        judge(&res[i]);
        n_scored++;
        n_colours += (size_t)res[i].colours_ok;
        n_shape += (size_t)res[i].shape_ok;
        n_all += (size_t)res[i].all_ok;
        chance_colours += res[i].chance_colours;
        chance_all += res[i].chance_all;
        score_sum += res[i].score;
    }
    if (n_scored == 0) {
        fprintf(stderr, "sdtool score-demo: %s: none of the %zu captions reads as 'a COLOUR SHAPE "
                        "[on a COLOUR background]' with the demo's colours and shapes\n", src, l.n);
        code = SD_EXIT_USAGE;
        goto done;
    }
    {
        double k = (double)n_scored;
        json_object *root = as_json ? json_object_new_object() : NULL, *prompts = NULL;
        if (root) {
            prompts = json_object_new_array();
            json_object_object_add(root, "source", json_object_new_string(src));
            json_object_object_add(root, "images", json_object_new_int64((int64_t)l.n));
            json_object_object_add(root, "scored", json_object_new_int64((int64_t)n_scored));
        } else {
            printf("score-demo: %zu images from %s, %zu with a demo caption\n", l.n, src, n_scored);
            printf("%-44s %6s %8s %6s %6s %6s  %s\n", "prompt", "images", "colours", "shape", "all",
                   "score", "read as (first image)");
        }
        /* per prompt, in order of first appearance */
        for (size_t i = 0; i < l.n; i++) {
            size_t n = 0, c = 0, s = 0, a = 0, first = i;
            double sc = 0;
            char seen = 0, what[96];
            if (!res[i].scored)
                continue;
            for (size_t j = 0; j < i && !seen; j++)
                seen = res[j].scored && !strcmp(l.v[j].prompt, l.v[i].prompt);
            if (seen)
                continue;
            for (size_t j = i; j < l.n; j++)
                if (res[j].scored && !strcmp(l.v[j].prompt, l.v[i].prompt)) {
                    n++;
                    c += (size_t)res[j].colours_ok;
                    s += (size_t)res[j].shape_ok;
                    a += (size_t)res[j].all_ok;
                    sc += res[j].score;
                }
            describe(&res[first].rd, what, sizeof what);
            if (root) {
                json_object *o = json_object_new_object();
                json_object_object_add(o, "prompt", json_object_new_string(l.v[i].prompt));
                json_object_object_add(o, "images", json_object_new_int64((int64_t)n));
                json_object_object_add(o, "colours", json_object_new_double((double)c / (double)n));
                json_object_object_add(o, "shape", json_object_new_double((double)s / (double)n));
                json_object_object_add(o, "all", json_object_new_double((double)a / (double)n));
                json_object_object_add(o, "score", json_object_new_double(sc / (double)n));
                json_object_object_add(o, "read_as", json_object_new_string(what));
                json_object_object_add(o, "file", json_object_new_string(l.v[first].file));
                json_object_array_add(prompts, o);
            } else {
                printf("%-44.44s %6zu %8.2f %6.2f %6.2f %6.3f  %s\n", l.v[i].prompt, n,
                       (double)c / (double)n, (double)s / (double)n, (double)a / (double)n,
                       sc / (double)n, what);
            }
        }
        if (root) {
            json_object *acc = json_object_new_object(), *ch = json_object_new_object();
            json_object_object_add(acc, "colours", json_object_new_double((double)n_colours / k));
            json_object_object_add(acc, "shape", json_object_new_double((double)n_shape / k));
            json_object_object_add(acc, "all", json_object_new_double((double)n_all / k));
            json_object_object_add(ch, "colours", json_object_new_double(chance_colours / k));
            json_object_object_add(ch, "shape", json_object_new_double(1.0 / N_SHAPES));
            json_object_object_add(ch, "all", json_object_new_double(chance_all / k));
            json_object_object_add(root, "accuracy", acc);
            json_object_object_add(root, "chance", ch);
            json_object_object_add(root, "mean_score", json_object_new_double(score_sum / k));
            json_object_object_add(root, "prompts", prompts);
            printf("%s\n", json_object_to_json_string_ext(root, JSON_C_TO_STRING_SPACED |
                                                                    JSON_C_TO_STRING_NOSLASHESCAPE));
            json_object_put(root);
        } else {
            printf("accuracy: colours %.3f (chance %.3f), shape %.3f (chance %.3f), "
                   "all %.3f (chance %.3f); mean score %.3f\n",
                   (double)n_colours / k, chance_colours / k, (double)n_shape / k, 1.0 / N_SHAPES,
                   (double)n_all / k, chance_all / k, score_sum / k);
            printf("overall accuracy %.3f, chance level %.3f (%zu of %zu images match their "
                   "caption)\n", (double)n_all / k, chance_all / k, n_all, n_scored);
        }
    }
done:
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].file);
        free(l.v[i].prompt);
    }
    free(l.v);
    free(res);
    return code;
}
