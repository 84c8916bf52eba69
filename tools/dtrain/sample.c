/* dtrain sample: text from a byte-level GPT or Llama-style model. */
#include "cli.h"
#include "dtrain/dtrain.h"
#include "dtrain/llama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char help[] =
    "usage: dtrain sample CONFIG --checkpoint WEIGHTS [--prompt TEXT] [-n N]\n"
    "                    [--temperature T] [--top-k K] [--seed S] [--set S.K=V]...\n"
    "                    [--memory-limit SIZE]\n"
    "\n"
    "Generates N (default 200) tokens after TEXT with the GPT or Llama-style\n"
    "model that CONFIG describes and WEIGHTS holds (a run's model.safetensors,\n"
    "one of its checkpoints, verified first; for a GPT an llm.c checkpoint,\n"
    "for a Llama Hugging Face's weights, of the same sizes), and prints the\n"
    "prompt and the sample.\n"
    "Tokens are bytes, so the model must be byte-level (vocab_size 256, as\n"
    "'dtrain prepare-text' makes). Each next token is drawn from\n"
    "softmax(logits / T) (T 0 = always the most likely; default 0.8),\n"
    "restricted to the K most likely when --top-k is given, with a generator\n"
    "seeded by S (default 1): the same arguments give the same text. When the\n"
    "text outgrows the model's context (block_size), the last block_size\n"
    "tokens are the context; a prompt longer than that is an error.\n"
    "\n"
    "options:\n"
    CLI_MEMORY_LIMIT_HELP;

// The two language models behind one forward: logits of a window.
typedef struct {
    dt_gpt *gpt;
    dt_llama *llama;
} lm;

static dt_status lm_open(lm *m, const dt_config *c, const char *weights) {
    *m = (lm){0};
    if (c->arch == DT_ARCH_LLAMA) {
        dt_llama_config lc = dt_config_llama(c);
        dt_status st = dt_llama_create(&m->llama, &lc, 1, c->block_size);
        return st == DT_OK ? dt_llama_load(m->llama, weights) : st;
    }
    dt_gpt_config gc = dt_config_gpt(c);
    dt_status st = dt_gpt_create(&m->gpt, &gc, 1, c->block_size);
    return st == DT_OK ? dt_gpt_load(m->gpt, weights) : st;
}

static const float *lm_logits(lm *m, const int32_t *w, int T) {
    if (m->llama) return dt_llama_forward(m->llama, w, NULL, 1, T, NULL) == DT_OK ? dt_llama_logits(m->llama) : NULL;
    return dt_gpt_forward(m->gpt, w, NULL, 1, T, NULL) == DT_OK ? dt_gpt_logits(m->gpt) : NULL;
}

static void lm_close(lm *m) {
    dt_gpt_free(m->gpt);
    dt_llama_free(m->llama);
}

int cmd_sample(int argc, char **argv) {
    const char *config = NULL, *ckpt = NULL, *prompt = "", *sets[256];
    int nsets = 0;
    double n = 200, temp = 0.8, topk = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(s, "--checkpoint")) {
            if (!v) return cli_error("--checkpoint needs a file"), EXIT_USAGE;
            ckpt = argv[++i];
        } else if (!strcmp(s, "--prompt")) {
            if (!v) return cli_error("--prompt needs text"), EXIT_USAGE;
            prompt = argv[++i];
        } else if (!strcmp(s, "-n")) {
            if (parse_number(s, v, 0, 1e7, 1, &n)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--temperature")) {
            if (parse_number(s, v, 0, 100, 0, &temp)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--top-k")) {
            if (parse_number(s, v, 0, 65536, 1, &topk)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--seed")) {
            if (dt_parse_u64(s, v, UINT64_MAX, &seed) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--memory-limit")) {
            if (cli_memory_limit(v)) return EXIT_USAGE;
            i++;
        } else if (!strcmp(s, "--set")) {
            if (!v || nsets == 256) return cli_error("--set needs SECTION.KEY=VALUE"), EXIT_USAGE;
            sets[nsets++] = argv[++i];
        } else if (s[0] == '-' && s[1]) {
            return cli_error("unknown option '%s' (see 'dtrain sample --help')", s), EXIT_USAGE;
        } else if (!config) {
            config = s;
        } else {
            return cli_error("unexpected argument '%s' (one CONFIG only)", s), EXIT_USAGE;
        }
    }
    if (!config || !ckpt) return cli_error("need CONFIG and --checkpoint WEIGHTS (see 'dtrain sample --help')"), EXIT_USAGE;
    dt_config c;
    if (dt_config_load(&c, config, sets, nsets) != DT_OK) return cli_error("%s", dt_last_error()), EXIT_RUNTIME;
    if (!c.gpt)
        return cli_error("%s: [model] is not a language model (a gpt-* or llama-* preset, gpt or llama)", config),
               EXIT_RUNTIME;
    if (c.vocab_size > 256)
        return cli_error("%s: vocab_size %d: sample reads and prints bytes, so it needs a byte-level model (vocab_size <= 256)",
                         config, c.vocab_size), EXIT_RUNTIME;
    int T = c.block_size, V = c.vocab_size;
    size_t plen = strlen(prompt);
    if ((int64_t)plen > T)
        return cli_error("--prompt is %zu tokens, longer than the model's context (block_size %d)", plen, T), EXIT_USAGE;
    for (size_t i = 0; i < plen; i++)
        if ((unsigned char)prompt[i] >= V)
            return cli_error("--prompt byte %zu (%u) is outside the vocabulary [0, %d)", i, (unsigned char)prompt[i], V), EXIT_USAGE;
    dt_set_threads(c.threads);
    lm m = {0};
    if (dt_check_memory(&c, DT_MEM_SAMPLE, 1, 0, NULL) != DT_OK || lm_open(&m, &c, ckpt) != DT_OK) {
        cli_error("%s", dt_last_error());
        lm_close(&m);
        return EXIT_RUNTIME;
    }
    size_t total = plen + (size_t)n;
    int32_t *tok = malloc(sizeof(int32_t) * (total + 1));
    float *prob = malloc(sizeof(float) * V);
    if (!tok || !prob) {
        lm_close(&m);
        return cli_error("out of memory"), EXIT_RUNTIME;
    }
    // An empty prompt starts from a newline: the model needs one token.
    size_t len = 0;
    if (plen == 0) tok[len++] = '\n' < V ? '\n' : 0;
    for (size_t i = 0; i < plen; i++) tok[len++] = (unsigned char)prompt[i];
    fwrite(prompt, 1, plen, stdout);
    dt_rng rng;
    dt_rng_seed(&rng, seed);
    int rc = 0;
    for (size_t k = 0; k < (size_t)n; k++) {
        size_t ctx = len > (size_t)T ? (size_t)T : len;
        const int32_t *w = tok + len - ctx;
        const float *lg = lm_logits(&m, w, (int)ctx);
        if (!lg) {
            cli_error("%s", dt_last_error());
            rc = EXIT_RUNTIME;
            break;
        }
        lg += (ctx - 1) * V;
        int next = 0;
        if (temp == 0) {
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[next]) next = v;
        } else {
            float mx = lg[0];
            for (int v = 1; v < V; v++) mx = lg[v] > mx ? lg[v] : mx;
            // Top-k: the k-th largest logit is the cut (ties kept).
            float cut = -INFINITY;
            if (topk > 0 && topk < V) {
                for (int v = 0; v < V; v++) prob[v] = lg[v];
                for (int j = 0; j < (int)topk; j++) {  // partial selection
                    int best = j;
                    for (int v = j + 1; v < V; v++)
                        if (prob[v] > prob[best]) best = v;
                    float t = prob[j];
                    prob[j] = prob[best];
                    prob[best] = t;
                }
                cut = prob[(int)topk - 1];
            }
            double sum = 0;
            for (int v = 0; v < V; v++) sum += prob[v] = lg[v] >= cut ? expf((float)((lg[v] - mx) / temp)) : 0.0f;
            double u = dt_rng_uniform(&rng) * sum, acc = 0;
            next = V - 1;
            for (int v = 0; v < V; v++) {
                acc += prob[v];
                if (u < acc) {
                    next = v;
                    break;
                }
            }
        }
        tok[len++] = next;
        putchar(next);
        fflush(stdout);
    }
    putchar('\n');
    free(tok);
    free(prob);
    lm_close(&m);
    return rc;
}
