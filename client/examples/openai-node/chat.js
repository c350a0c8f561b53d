#!/usr/bin/env node
// The official openai SDK against dcformer-serve's OpenAI-compatible front (--http-port):
// streams one chat completion and prints its text, then "finish_reason=... usage=P+C".
//   node chat.js --url http://127.0.0.1:8000/v1 [--api-key KEY] [--max-tokens 32] "And God said"
const OpenAI = require("openai");

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args.splice(i, 2)[1] : fallback;
};
const baseURL = opt("url", "http://127.0.0.1:8000/v1");
const apiKey = opt("api-key", "unused");  // sent as Authorization: Bearer
const maxTokens = Number(opt("max-tokens", "32"));
const message = args.join(" ") || "And God said";

async function main() {
  const client = new OpenAI({ baseURL, apiKey });
  const model = (await client.models.list()).data[0].id;
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: message }], max_tokens: maxTokens,
    stream: true, stream_options: { include_usage: true } });
  let finish = null, usage = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      process.stdout.write(c.delta.content ?? "");
      finish = c.finish_reason ?? finish;
    }
    usage = chunk.usage ?? usage;
  }
  console.log(`\nfinish_reason=${finish} usage=${usage.prompt_tokens}+${usage.completion_tokens}`);
}

main().catch((e) => { console.error(e.message); process.exit(1); });
