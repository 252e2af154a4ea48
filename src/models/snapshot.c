/* Diffusers snapshots: find a component's folder, read its config.json, build its parameter
 * table and load its safetensors weights, with errors that name the file. */
#include "sdtrain/snapshot.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sdtrain/check.h"
#include "sdtrain/json_file.h"
#include "sdtrain/safetensors.h"

static const char *const component_names[SD_COMPONENT_COUNT] = {"unet", "vae", "text_encoder"};

/* The classes we implement, per component (NULL-terminated). */
static const char *const component_classes[SD_COMPONENT_COUNT][3] = {
    {"UNet2DConditionModel", NULL, NULL},
    {"AutoencoderKL", NULL, NULL},
    {"CLIPTextModel", "CLIPTextModelWithProjection", NULL},
};

const char *sd_component_name(sd_component c)
{
    return (unsigned)c < SD_COMPONENT_COUNT ? component_names[c] : "?";
}

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static int known_class(sd_component c, const char *cls)
{
    for (int i = 0; cls && component_classes[c][i]; i++)
        if (!strcmp(cls, component_classes[c][i]))
            return 1;
    return 0;
}

static const char *json_string_at(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* Which component a config.json describes, or -1. */
static int component_of_config(json_object *root)
{
    const char *cls = json_string_at(root, "_class_name"), *mt;
    json_object *arch;
    for (int c = 0; c < SD_COMPONENT_COUNT; c++)
        if (known_class((sd_component)c, cls))
            return c;
    mt = json_string_at(root, "model_type");
    if (mt && !strcmp(mt, "clip_text_model"))
        return SD_COMPONENT_TEXT_ENCODER;
    if (json_object_object_get_ex(root, "architectures", &arch) &&
        json_object_is_type(arch, json_type_array) && json_object_array_length(arch) > 0) {
        json_object *a0 = json_object_array_get_idx(arch, 0);
        if (json_object_is_type(a0, json_type_string) &&
            known_class(SD_COMPONENT_TEXT_ENCODER, json_object_get_string(a0)))
            return SD_COMPONENT_TEXT_ENCODER;
    }
    return -1;
}

/* What a config.json names itself, for messages. */
static const char *class_of_config(json_object *root)
{
    const char *cls = json_string_at(root, "_class_name");
    json_object *arch;
    if (cls)
        return cls;
    if (json_object_object_get_ex(root, "architectures", &arch) &&
        json_object_is_type(arch, json_type_array) && json_object_array_length(arch) > 0) {
        json_object *a0 = json_object_array_get_idx(arch, 0);
        if (json_object_is_type(a0, json_type_string))
            return json_object_get_string(a0);
    }
    cls = json_string_at(root, "model_type");
    return cls ? cls : "no _class_name";
}

static char *path_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = sd_xmalloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static int read_model_index(sd_snapshot *s, const char *path, sd_err *err)
{
    json_object *root;
    if (sd_json_read_object(path, &root, err))
        return -1;
    s->has_model_index = 1;
    for (int c = 0; c < SD_COMPONENT_COUNT; c++) {
        json_object *v, *cls;
        if (!json_object_object_get_ex(root, component_names[c], &v) ||
            json_object_is_type(v, json_type_null))
            continue;
        if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != 2) {
            json_object_put(root);
            return sd_err_set(err, "%s: '%s' must be a [library, class] pair", path,
                              component_names[c]);
        }
        cls = json_object_array_get_idx(v, 1);
        if (json_object_is_type(cls, json_type_null))
            continue;
        if (!json_object_is_type(cls, json_type_string) ||
            !known_class((sd_component)c, json_object_get_string(cls))) {
            int rc = sd_err_set(err, "%s: '%s' is %s; sdtrain implements %s%s%s", path,
                                component_names[c],
                                json_object_is_type(cls, json_type_string)
                                    ? json_object_get_string(cls)
                                    : "not a class name",
                                component_classes[c][0],
                                component_classes[c][1] ? " or " : "",
                                component_classes[c][1] ? component_classes[c][1] : "");
            json_object_put(root);
            return rc;
        }
        s->listed[c] = 1;
    }
    json_object_put(root);
    return 0;
}

int sd_snapshot_open(sd_snapshot *s, const char *path, sd_err *err)
{
    char *p, *index, *config;
    size_t n;
    int rc = 0;
    memset(s, 0, sizeof *s);
    if (!path || !*path)
        return sd_err_set(err, "snapshot: no folder given");
    p = sd_xstrdup(path);
    n = strlen(p);
    while (n > 1 && p[n - 1] == '/')
        p[--n] = '\0';
    if (!exists(p)) {
        rc = sd_err_set(err, "%s: no such snapshot folder", p);
        free(p);
        return rc;
    }
    if (!is_dir(p)) {
        rc = sd_err_set(err, "%s: not a folder (give a diffusers snapshot folder or one of its "
                        "unet/, vae/, text_encoder/ folders)", p);
        free(p);
        return rc;
    }
    s->path = p;
    index = path_join(p, "model_index.json");
    config = path_join(p, "config.json");
    if (exists(index)) {
        rc = read_model_index(s, index, err);
    } else if (exists(config)) {
        json_object *root;
        rc = sd_json_read_object(config, &root, err);
        if (rc == 0) {
            int c = component_of_config(root);
            if (c < 0)
                rc = sd_err_set(err, "%s: not a component sdtrain loads (%s; expected "
                                "UNet2DConditionModel, AutoencoderKL or CLIPTextModel)",
                                config, class_of_config(root));
            s->is_component = 1;
            s->component = c < 0 ? SD_COMPONENT_UNET : (sd_component)c;
            json_object_put(root);
        }
    } else {
        int any = 0;
        for (int c = 0; c < SD_COMPONENT_COUNT; c++) {
            char *d = path_join(p, component_names[c]);
            any |= is_dir(d);
            free(d);
        }
        if (!any)
            rc = sd_err_set(err, "%s: not a diffusers snapshot (no model_index.json, no unet/, "
                            "vae/ or text_encoder/ folder) nor a component folder (no "
                            "config.json)", p);
    }
    free(index);
    free(config);
    if (rc)
        sd_snapshot_close(s);
    return rc;
}

void sd_snapshot_close(sd_snapshot *s)
{
    if (!s)
        return;
    free(s->path);
    memset(s, 0, sizeof *s);
}

int sd_snapshot_component_dir(const sd_snapshot *s, sd_component c, char *buf, size_t size,
                              sd_err *err)
{
    int n;
    if ((unsigned)c >= SD_COMPONENT_COUNT)
        return sd_err_set(err, "snapshot: invalid component %d", (int)c);
    if (s->is_component) {
        if (s->component != c)
            return sd_err_set(err, "%s: this is a %s folder, not a %s folder", s->path,
                              component_names[s->component], component_names[c]);
        n = snprintf(buf, size, "%s", s->path);
    } else {
        n = snprintf(buf, size, "%s/%s", s->path, component_names[c]);
    }
    if (n < 0 || (size_t)n >= size)
        return sd_err_set(err, "%s: path too long", s->path);
    if (!is_dir(buf)) {
        if (s->has_model_index && !s->listed[c])
            return sd_err_set(err, "%s: no such folder (the snapshot has no %s: "
                              "model_index.json does not list one)", buf, component_names[c]);
        return sd_err_set(err, "%s: no such folder (the snapshot has no %s)", buf,
                          component_names[c]);
    }
    return 0;
}

/* Appends " (shapes from CONFIG)" to a weights error; when the message is full, the list it
 * ends with is cut at an entry boundary to make room. */
static void name_config(sd_err *err, const char *config)
{
    char tail[600];
    size_t n = (size_t)snprintf(tail, sizeof tail, " (shapes from %s)", config), len;
    if (!err || n + 8 >= sizeof err->msg || n >= sizeof tail)
        return;
    len = strlen(err->msg);
    if (len + n >= sizeof err->msg) {
        size_t cut = sizeof err->msg - 1 - n - 5;
        while (cut > 0 && strncmp(err->msg + cut, ", ", 2) != 0)
            cut--;
        memcpy(err->msg + cut, ", ...", 6);
        len = cut + 5;
    }
    memcpy(err->msg + len, tail, n + 1);
}

/* Reads the component's config.json twice: once here for what the typed loaders do not keep
 * (the class name, to catch a folder of the wrong kind; eos_token_id), once by the loader. */
static int check_component_config(const char *config, sd_component c, int *eos_token_id,
                                  sd_err *err)
{
    json_object *root, *v;
    int kind, rc = 0;
    if (!exists(config))
        return sd_err_set(err, "%s: missing (every component folder needs its config.json)",
                          config);
    if (sd_json_read_object(config, &root, err))
        return -1;
    kind = component_of_config(root);
    if (kind >= 0 && kind != (int)c)
        rc = sd_err_set(err, "%s: describes a %s (%s), expected a %s", config,
                        component_names[kind], class_of_config(root), component_names[c]);
    else if (kind < 0 && json_string_at(root, "_class_name"))
        rc = sd_err_set(err, "%s: _class_name is %s; sdtrain implements %s here", config,
                        json_string_at(root, "_class_name"), component_classes[c][0]);
    if (rc == 0 && eos_token_id) {
        *eos_token_id = 49407; /* CLIPTextConfig's default */
        if (json_object_object_get_ex(root, "eos_token_id", &v)) {
            if (json_object_is_type(v, json_type_null))
                *eos_token_id = -1;
            else if (json_object_is_type(v, json_type_int))
                *eos_token_id = (int)json_object_get_int64(v);
            else
                rc = sd_err_set(err, "%s: 'eos_token_id' must be an integer or null", config);
        }
    }
    json_object_put(root);
    return rc;
}

/* A component's folder into dir, its config.json checked (the class) and read into `config`,
 * and the parameter table that configuration makes. Returns the config.json path (malloc'ed)
 * or NULL with a message. */
static char *component_table(const sd_snapshot *s, sd_component c, void *config,
                             int *eos_token_id, sd_param_table *table, char *dir, size_t dir_size,
                             sd_err *err)
{
    char *cfg_path;
    int rc;
    if (sd_snapshot_component_dir(s, c, dir, dir_size, err))
        return NULL;
    cfg_path = path_join(dir, "config.json");
    rc = check_component_config(cfg_path, c, eos_token_id, err);
    if (rc == 0) {
        switch (c) {
        case SD_COMPONENT_UNET:
            rc = sd_unet_config_load(cfg_path, config, err);
            if (rc == 0)
                sd_unet_params(config, table);
            break;
        case SD_COMPONENT_VAE:
            rc = sd_vae_config_load(cfg_path, config, err);
            if (rc == 0)
                sd_vae_params(config, table);
            break;
        default:
            rc = sd_clip_config_load(cfg_path, config, err);
            if (rc == 0)
                sd_clip_params(config, table);
            break;
        }
    }
    if (rc) {
        free(cfg_path);
        return NULL;
    }
    return cfg_path;
}

int sd_snapshot_component_table(const sd_snapshot *s, sd_component c, void *config,
                                sd_param_table *table, sd_err *err)
{
    char dir[4096];
    char *cfg_path = component_table(s, c, config, NULL, table, dir, sizeof dir, err);
    free(cfg_path);
    return cfg_path ? 0 : -1;
}

static int load_component(const sd_snapshot *s, sd_component c, const char *weights_name,
                          void *config, int *eos_token_id, sd_weights *w, sd_err *err)
{
    char dir[4096], *cfg_path;
    sd_param_table table;
    sd_st_set set;
    int rc;
    memset(w, 0, sizeof *w);
    memset(&table, 0, sizeof table);
    cfg_path = component_table(s, c, config, eos_token_id, &table, dir, sizeof dir, err);
    if (!cfg_path)
        return -1;
    /* before the allocation: a config.json of absurd sizes is refused, not attempted */
    if (sd_weights_check_size(&table, cfg_path, err)) {
        sd_param_table_free(&table);
        free(cfg_path);
        return -1;
    }
    sd_weights_init(w, &table);
    rc = sd_st_set_open_dir(&set, dir, weights_name, err);
    if (rc == 0) {
        rc = sd_weights_load(w, &set, err);
        if (rc)
            name_config(err, cfg_path);
        sd_st_set_close(&set);
    }
    if (rc)
        sd_weights_free(w);
    free(cfg_path);
    return rc;
}

int sd_snapshot_load_unet(const sd_snapshot *s, const char *weights_name, sd_unet_config *c,
                          sd_weights *w, sd_err *err)
{
    return load_component(s, SD_COMPONENT_UNET, weights_name, c, NULL, w, err);
}

int sd_snapshot_load_vae(const sd_snapshot *s, const char *weights_name, sd_vae_config *c,
                         sd_weights *w, sd_err *err)
{
    return load_component(s, SD_COMPONENT_VAE, weights_name, c, NULL, w, err);
}

int sd_snapshot_load_text_encoder(const sd_snapshot *s, const char *weights_name,
                                  sd_clip_config *c, int *eos_token_id, sd_weights *w,
                                  sd_err *err)
{
    int eos = 49407;
    int rc = load_component(s, SD_COMPONENT_TEXT_ENCODER, weights_name, c, &eos, w, err);
    if (rc == 0 && eos_token_id)
        *eos_token_id = eos;
    return rc;
}
