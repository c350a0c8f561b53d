// Trains the byte-level BPE tokenizer of models/dcformer-kjv and tokenizes the corpus.
//
//   node models/train/train_tokenizer.js --data models/train/data --out models/dcformer-kjv \
//        --cases tests/data/kjv/tokenizer_cases.jsonl --heldout-text tests/data/kjv/heldout.txt
//
// Reads DATA/corpus.json and DATA/train.txt (make_corpus.py). Hugging Face `tokenizers`
// (npm, pinned in package-lock.json) learns the merges on the training split only with the
// GPT-2 byte-level pre-tokenizer. Its Node binding has no trainer options, so it runs to
// completion and the vocabulary is cut to VOCAB_SIZE afterwards: BPE training is greedy, so
// the first M merges are exactly what a run stopped at M merges learns. The final vocabulary:
// id 0 <|endoftext|> (EOS, special), ids 1..256 the 256 byte symbols in byte order (so any
// UTF-8 input encodes), then one id per merge in merge order.
//
// Writes OUT/tokenizer.json; DATA/train.bin and DATA/heldout.bin (uint16 little-endian ids,
// every chapter followed by EOS); and CASES: {"text", "ids", "roundtrip"} per line (the
// held-out chapters and a few edge cases) as encoded by `tokenizers` itself, which the C++
// tokenizer test must reproduce; HELDOUT_TEXT: the held-out chapters, each followed by
// <|endoftext|>, which encodes to exactly the ids of heldout.bin (the engine's perplexity
// test scores this file).
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { Tokenizer, BPE, byteLevelPreTokenizer } = require("tokenizers");

const VOCAB_SIZE = 4096;
const EOS = "<|endoftext|>";

function parseArgs() {
  const args = {};
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith("--") || i + 1 >= argv.length) {
      throw new Error(`usage: --data DIR --out DIR --cases FILE --heldout-text FILE (bad argument ${argv[i]})`);
    }
    args[argv[i].slice(2)] = argv[i + 1];
  }
  for (const key of ["data", "out", "cases", "heldout-text"]) {
    if (!args[key]) throw new Error(`missing --${key}`);
  }
  return args;
}

// GPT-2's reversible byte -> printable character map (bytes_to_unicode).
function byteSymbols() {
  const printable = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  const symbols = new Array(256);
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    symbols[b] = printable.includes(b) ? String.fromCodePoint(b) : String.fromCodePoint(256 + extra++);
  }
  return symbols;
}

function learnMerges(trainTxt) {
  const raw = new Tokenizer(BPE.empty());
  raw.setPreTokenizer(byteLevelPreTokenizer(false, true));
  raw.train([trainTxt]);
  const tmp = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "kjv-bpe-")), "raw.json");
  raw.save(tmp);
  const merges = JSON.parse(fs.readFileSync(tmp, "utf8")).model.merges;
  fs.rmSync(path.dirname(tmp), { recursive: true });
  return merges.map((m) => (Array.isArray(m) ? m : m.split(" ")));
}

function buildTokenizerJson(allMerges) {
  const vocab = { [EOS]: 0 };
  byteSymbols().forEach((s, b) => (vocab[s] = 1 + b));
  let size = 257;
  const merges = [];
  for (const [a, b] of allMerges) {
    if (size >= VOCAB_SIZE) break;
    if (!(a in vocab) || !(b in vocab)) throw new Error(`merge ${a} ${b} uses an unknown token`);
    merges.push([a, b]);
    if (!(a + b in vocab)) vocab[a + b] = size++;
  }
  if (size !== VOCAB_SIZE) throw new Error(`only ${size} tokens learned, wanted ${VOCAB_SIZE}`);
  const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true };
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [{ id: 0, content: EOS, single_word: false, lstrip: false, rstrip: false,
                     normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: { ...byteLevel, trim_offsets: false },
    decoder: byteLevel,
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false,
             ignore_merges: false, vocab, merges },
  };
}

async function encodeAll(tok, texts) {
  const out = [];
  for (const text of texts) out.push((await tok.encode(text)).getIds());
  return out;
}

function writeIds(file, docs) {
  const total = docs.reduce((n, d) => n + d.length + 1, 0);
  const buf = Buffer.alloc(2 * total);
  let i = 0;
  for (const ids of docs) {
    for (const id of [...ids, 0]) buf.writeUInt16LE(id, 2 * i++);
  }
  fs.writeFileSync(file, buf);
  return total;
}

async function main() {
  const args = parseArgs();
  const corpus = JSON.parse(fs.readFileSync(path.join(args.data, "corpus.json"), "utf8"));
  const json = buildTokenizerJson(learnMerges(path.join(args.data, "train.txt")));
  fs.mkdirSync(args.out, { recursive: true });
  const tokPath = path.join(args.out, "tokenizer.json");
  fs.writeFileSync(tokPath, JSON.stringify(json) + "\n");

  // Everything below encodes with the file just written, exactly as a user would load it.
  const tok = Tokenizer.fromFile(tokPath);
  const train = await encodeAll(tok, corpus.train);
  const heldout = await encodeAll(tok, corpus.heldout);
  for (const [docs, ids] of [[corpus.train, train], [corpus.heldout, heldout]]) {
    for (let i = 0; i < docs.length; i++) {
      if ((await tok.decode(ids[i], false)) !== docs[i]) throw new Error(`document ${i} does not round-trip`);
    }
  }
  const nTrain = writeIds(path.join(args.data, "train.bin"), train);
  const nHeld = writeIds(path.join(args.data, "heldout.bin"), heldout);

  const heldText = corpus.heldout.map((d) => d + EOS).join("");
  const heldIds = (await tok.encode(heldText)).getIds();
  if (JSON.stringify(heldIds) !== JSON.stringify(heldout.flatMap((ids) => [...ids, 0]))) {
    throw new Error("the held-out text does not encode to the held-out chapters' ids");
  }
  fs.writeFileSync(args["heldout-text"], heldText);

  const edge = ["Once upon a time", "In the beginning", "And God said", "And it came to pass", " leading space and  two spaces  ",
                "Numbers 3.14 and 2024, caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \ud83d\ude00!",
                `end of one${EOS}start of the next`, "tabs\tand\r\nnewlines\n\n\n", "LORD, O LORD."];
  const lines = [];
  const texts = [...edge, ...corpus.heldout];
  const ids = await encodeAll(tok, texts);
  texts.forEach((text, i) => lines.push(JSON.stringify({ text, ids: ids[i], roundtrip: true })));
  fs.mkdirSync(path.dirname(args.cases), { recursive: true });
  fs.writeFileSync(args.cases, lines.join("\n") + "\n");
  console.log(`train_tokenizer: ${VOCAB_SIZE} tokens -> ${tokPath}; ${nTrain} training and ` +
              `${nHeld} held-out tokens (EOS included); ${texts.length} reference cases -> ${args.cases}`);
}

main().catch((e) => {
  console.error(`train_tokenizer: ${e.message}`);
  process.exit(1);
});
