// hf_tokenize.mjs — an independent reference tokenizer for kiln's tests and benchmarks: the npm
// package @huggingface/tokenizers (a pure-JS port of Hugging Face `tokenizers`), loading the
// tokenizer.json + tokenizer_config.json of a local directory (never downloads anything).
//
//   node scripts/hf_tokenize.mjs DIR STRINGS.json
//       STRINGS.json: a JSON array of strings. Prints a JSON array with the ids of each string
//       (no BOS/EOS added; special tokens in the text are recognised).
//   node scripts/hf_tokenize.mjs DIR --bench TEXTFILE [SECONDS]
//       Encodes the file's text repeatedly for about SECONDS (default 2) after one warm-up pass and
//       prints {"bytes": N, "tokens": N, "seconds": T, "mb_per_s": R}.
//
// Install the package with `npm ci` at the repository root (package.json / package-lock.json).
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";

function usage() {
    console.error("usage: node hf_tokenize.mjs DIR STRINGS.json | DIR --bench TEXTFILE [SECONDS]");
    process.exit(2);
}

const [dir, arg, benchFile, benchSeconds] = process.argv.slice(2);
if (!dir || !arg) usage();
const tokenizerJson = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const configPath = path.join(dir, "tokenizer_config.json");
const tokenizerConfig = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tok = new Tokenizer(tokenizerJson, tokenizerConfig);
const encode = (s) => tok.encode(s, { add_special_tokens: false }).ids;

if (arg === "--bench") {
    if (!benchFile) usage();
    const text = fs.readFileSync(benchFile, "utf8");
    const bytes = Buffer.byteLength(text, "utf8");
    const budget = Number(benchSeconds || 2);
    let tokens = encode(text).length; // warm-up (JIT, caches)
    let runs = 0;
    const t0 = process.hrtime.bigint();
    let dt = 0;
    do {
        tokens = encode(text).length;
        runs++;
        dt = Number(process.hrtime.bigint() - t0) / 1e9;
    } while (dt < budget);
    const seconds = dt / runs;
    console.log(JSON.stringify({ bytes, tokens, seconds, mb_per_s: bytes / seconds / 1e6 }));
} else {
    const strings = JSON.parse(fs.readFileSync(arg, "utf8"));
    if (!Array.isArray(strings)) usage();
    console.log(JSON.stringify(strings.map(encode)));
}
