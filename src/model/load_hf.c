/* load_hf.c — loader for Hugging Face model directories: config.json, model.safetensors or sharded
 * *.safetensors listed in model.safetensors.index.json, tokenizer.json / tokenizer_config.json.
 * The architecture-specific hyper-parameters are read here for LlamaForCausalLM; the config JSON
 * is kept on the model (m->config) for other architectures to read their own fields. */
#include "model/model.h"
#include "model/arch.h"
#include "base/status.h"
#include "format/hfconfig.h"
#include "model/hparams_check.h"
#include "format/safetensors.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int file_exists(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

static kiln_status load_shard(struct kiln_model *m, const char *path) {
    for (int i = 0; i < m->n_maps; i++)
        if (strcmp(m->maps[i].path, path) == 0) return KILN_OK;
    if (m->n_maps >= KILN_MAX_MAPS) return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: more than %d shards", path, KILN_MAX_MAPS);
    kiln_mapping *map = &m->maps[m->n_maps];
    KILN_TRY(kiln_map_file(path, map));
    m->n_maps++;
    return kiln_safetensors_parse(map, &m->tt);
}

static kiln_status load_tensors(struct kiln_model *m, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (file_exists(path)) {
        json_error_t e;
        json_t *idx = json_load_file(path, 0, &e);
        json_t *wm = idx ? json_object_get(idx, "weight_map") : NULL;
        if (!json_is_object(wm)) {
            if (idx) json_decref(idx);
            return kiln_fail(KILN_ERR_FORMAT, "%s: missing or malformed 'weight_map' (%s)", path, idx ? "not an object" : e.text);
        }
        const char *k;
        json_t *v;
        kiln_status st = KILN_OK;
        json_object_foreach(wm, k, v) {
            if (!json_is_string(v) || strchr(json_string_value(v), '/')) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", path, k);
                break;
            }
            char shard[4200];
            snprintf(shard, sizeof shard, "%s/%s", dir, json_string_value(v));
            if ((st = load_shard(m, shard)) != KILN_OK) break;
        }
        if (st == KILN_OK)
            json_object_foreach(wm, k, v) if (!kiln_tt_find(&m->tt, k)) {
                st = kiln_fail(KILN_ERR_FORMAT, "%s: weight_map names tensor '%s' but shard %s does not contain it", path, k, json_string_value(v));
                break;
            }
        json_decref(idx);
        return st;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (file_exists(path)) return load_shard(m, path);
    return kiln_fail(KILN_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
}

/* generation_config.json's sampling defaults (temperature, top_p, top_k, repetition_penalty), each
 * validated when present. */
static kiln_status read_gen_defaults(kiln_hparams *hp, json_t *g, const char *file) {
    static const struct { const char *key; unsigned bit; double lo, hi; } f[] = {
        {"temperature", 1, 0, 100}, {"top_p", 2, 0, 1}, {"top_k", 4, 0, 1 << 24}, {"repetition_penalty", 8, 0, 100}};
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        json_t *v = json_object_get(g, f[i].key);
        if (!v || json_is_null(v)) continue;
        if (!json_is_number(v) || (f[i].bit == 4 && !json_is_integer(v)))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' must be a %s", file, f[i].key, f[i].bit == 4 ? "integer" : "number");
        const double x = json_number_value(v);
        if (!(x >= f[i].lo && x <= f[i].hi) || ((f[i].bit == 2 || f[i].bit == 8) && !(x > 0)))
            return kiln_fail(KILN_ERR_FORMAT, "%s: field '%s' = %g is out of range", file, f[i].key, x);
        hp->gen_set |= f[i].bit;
        if (f[i].bit == 1) hp->gen_temperature = (float)x;
        else if (f[i].bit == 2) hp->gen_top_p = (float)x;
        else if (f[i].bit == 4) hp->gen_top_k = (int)x;
        else hp->gen_repetition_penalty = (float)x;
    }
    return KILN_OK;
}

kiln_status kiln_load_hf(struct kiln_model *m, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t e;
    json_t *cfg = json_load_file(path, 0, &e);
    if (!cfg) return kiln_fail(file_exists(path) ? KILN_ERR_FORMAT : KILN_ERR_IO, "%s: %s (line %d)", path, e.text, e.line);
    m->config = cfg;
    if (!json_is_object(cfg)) return kiln_fail(KILN_ERR_FORMAT, "%s: not a JSON object", path);
    snprintf(m->format, sizeof m->format, "hf");
    const char *mt = json_string_value(json_object_get(cfg, "model_type"));
    json_t *archs = json_object_get(cfg, "architectures");
    const char *arch0 = json_is_array(archs) ? json_string_value(json_array_get(archs, 0)) : NULL;
    if (!mt && !arch0) return kiln_fail(KILN_ERR_FORMAT, "%s: required field 'model_type' is missing", path);
    if ((m->arch = kiln_arch_find(mt, arch0)) != NULL) { /* every architecture is a row of model/arch.h */
        snprintf(m->hp.arch, sizeof m->hp.arch, "%s", m->arch->name);
        KILN_TRY(m->arch->read_hparams(m, cfg, path));
    } else {
        return kiln_fail(KILN_ERR_UNSUPPORTED, "%s: model_type '%s' (architecture '%s') is not supported (known: %s)", path,
                         mt ? mt : "?", arch0 ? arch0 : "?", kiln_arch_names());
    }
    KILN_TRY(kiln_check_quant_config(cfg, path));
    KILN_TRY(load_tensors(m, dir));

    char tj[4200], tc[4200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", dir);
    snprintf(tc, sizeof tc, "%s/tokenizer_config.json", dir);
    char tt[4200];
    snprintf(tt, sizeof tt, "%s/tiktoken.model", dir);
    if (file_exists(tj)) KILN_TRY(kiln_tok_load_hf(tj, file_exists(tc) ? tc : NULL, &m->tok));
    else if (file_exists(tt)) KILN_TRY(kiln_tok_load_tiktoken(tt, file_exists(tc) ? tc : NULL, &m->tok)); /* Kimi K2 */
    if (m->tok) {
        if (m->hp.bos_id < 0) m->hp.bos_id = kiln_tok_bos(m->tok);
        if (m->hp.eos_id < 0) m->hp.eos_id = kiln_tok_eos(m->tok);
    }
    /* generation_config.json: its eos_token_id (GLM-4.x: a list with the end-of-turn tokens <|user|>
     * and <|observation|>) ends generation too, as transformers' generate() and vLLM read it */
    char gc[4200];
    snprintf(gc, sizeof gc, "%s/generation_config.json", dir);
    if (file_exists(gc)) {
        json_error_t ge;
        json_t *g = json_load_file(gc, 0, &ge);
        if (!g || !json_is_object(g)) {
            json_decref(g);
            return kiln_fail(KILN_ERR_FORMAT, "%s: %s (line %d)", gc, g ? "not a JSON object" : ge.text, g ? 0 : ge.line);
        }
        kiln_status gst = kiln_cfg_token_ids(g, gc, "eos_token_id", m->hp.eos_ids, KILN_MAX_EOS, &m->hp.n_eos);
        if (gst == KILN_OK) gst = read_gen_defaults(&m->hp, g, gc);
        json_decref(g);
        KILN_TRY(gst);
        if (m->hp.eos_id < 0 && m->hp.n_eos > 0) m->hp.eos_id = m->hp.eos_ids[0];
    }
    if (m->hp.n_eos == 0 && m->hp.eos_id >= 0) m->hp.eos_ids[m->hp.n_eos++] = m->hp.eos_id;
    for (int i = 0; i < m->hp.n_eos; i++)
        if (m->hp.eos_ids[i] >= m->hp.vocab)
            return kiln_fail(KILN_ERR_FORMAT, "%s: eos_token_id %d (config.json or generation_config.json) is not below the vocabulary size %d",
                             path, m->hp.eos_ids[i], m->hp.vocab);
    /* every architecture: the ids a prompt starts with / generation stops at index the embedding */
    if (m->hp.bos_id >= m->hp.vocab || m->hp.eos_id >= m->hp.vocab)
        return kiln_fail(KILN_ERR_FORMAT, "%s: bos_token_id %d / eos_token_id %d must be below the vocabulary size %d", path,
                         m->hp.bos_id, m->hp.eos_id, m->hp.vocab);
    return KILN_OK;
}
