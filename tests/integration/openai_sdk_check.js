// Drives dcformer-serve's OpenAI front with the official openai SDK (client/examples/openai-node,
// installed by scripts/setup.sh from its package-lock) and prints what it got as one JSON
// object, which test_openai.py checks. Usage: node openai_sdk_check.js BASE_URL API_KEY
const path = require("path");
const OpenAI = require(path.join(__dirname, "..", "..", "client", "examples", "openai-node",
                                 "node_modules", "openai"));

async function status(promise) {
  try {
    await promise;
    return 200;
  } catch (e) {
    return { status: e.status, type: e.error?.type ?? e.type, param: e.param ?? e.error?.param };
  }
}

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  const out = {};
  out.models = (await client.models.list()).data.map((m) => m.id);
  const model = out.models[0];
  out.completion = await client.completions.create({
    model, prompt: "In the beginning", max_tokens: 6, temperature: 0, logprobs: 2 });
  out.chat = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "And God said" }], max_tokens: 5,
    temperature: 0, logprobs: true, top_logprobs: 2, n: 2 });
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "And God said" }], max_tokens: 5,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  out.stream = [];
  for await (const chunk of stream) out.stream.push(chunk);
  out.stop = await client.completions.create({
    model, prompt: "And the LORD said unto", max_tokens: 30, temperature: 0, stop: ["LORD"] });
  const seeded = () => client.completions.create({
    model, prompt: "And", max_tokens: 8, temperature: 1, seed: 1234 });
  out.seeded = [(await seeded()).choices[0].text, (await seeded()).choices[0].text];
  out.errors = {
    model: await status(client.completions.create({ model: "gpt-4", prompt: "a" })),
    type: await status(client.completions.create({ model, prompt: "a", temperature: "x" })),
    tools: await status(client.chat.completions.create({
      model, messages: [{ role: "user", content: "x" }],
      tools: [{ type: "function", function: { name: "f" } }] })),
    key: await status(new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 }).models.list()),
  };
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e.stack || e.message); process.exit(1); });
