#!/usr/bin/env node
// Minimal Node.js client of dcformer-serve: streams one Generate call and prints the text (or
// token ids) as it arrives, then one JSON summary line on stderr... or, with --json, a single
// JSON object {token_ids, text, finish_reason, usage} on stdout.
//
//   npm ci   # once, in this folder
//   node generate.js --target 127.0.0.1:50051 --prompt "Hello" --max-new-tokens 16
//   node generate.js --prompt-ids 1,2,3 --temperature 0 --ignore-eos --json
// Options: --api-key-file F, --tls-ca F (TLS), --timeout-ms N, --proto DIR (default ../../../proto)
'use strict';
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { parseArgs } = require('util');

const { values: opt } = parseArgs({
  options: {
    target: { type: 'string', default: '127.0.0.1:50051' },
    prompt: { type: 'string' },
    'prompt-ids': { type: 'string' },
    'max-new-tokens': { type: 'string' },
    temperature: { type: 'string' },
    'ignore-eos': { type: 'boolean', default: false },
    'api-key-file': { type: 'string' },
    'tls-ca': { type: 'string' },
    'timeout-ms': { type: 'string' },
    proto: { type: 'string', default: path.join(__dirname, '..', '..', '..', 'proto') },
    json: { type: 'boolean', default: false },
  },
});

const def = protoLoader.loadSync('dcformer/v1/dcformer.proto', {
  includeDirs: [opt.proto], keepCase: true, longs: Number, enums: String, defaults: true,
  oneofs: true,
});
const { TextGeneration } = grpc.loadPackageDefinition(def).dcformer.v1;
const creds = opt['tls-ca']
  ? grpc.credentials.createSsl(fs.readFileSync(opt['tls-ca']))
  : grpc.credentials.createInsecure();
const client = new TextGeneration(opt.target, creds);

const request = { stopping: { ignore_eos: opt['ignore-eos'] }, sampling: {} };
if (opt['prompt-ids']) request.token_ids = { ids: opt['prompt-ids'].split(',').map(Number) };
else request.text = opt.prompt;
if (opt['max-new-tokens']) request.stopping.max_new_tokens = Number(opt['max-new-tokens']);
if (opt.temperature !== undefined) request.sampling.temperature = Number(opt.temperature);

const metadata = new grpc.Metadata();
if (opt['api-key-file']) {
  metadata.set('authorization', `Bearer ${fs.readFileSync(opt['api-key-file'], 'utf8').trim()}`);
}
const callOptions = opt['timeout-ms'] ? { deadline: Date.now() + Number(opt['timeout-ms']) } : {};

const result = { token_ids: [], text: '', finish_reason: null, usage: null };
const call = client.Generate(request, metadata, callOptions);
call.on('data', (msg) => {
  result.token_ids.push(...msg.token_ids);
  result.text += msg.text;
  if (!opt.json) process.stdout.write(msg.text || msg.token_ids.join(',') + ',');
  if (msg.finish_reason !== 'FINISH_REASON_UNSPECIFIED') {
    result.finish_reason = msg.finish_reason;
    result.usage = msg.usage;
  }
});
call.on('error', (err) => {
  console.error(`generate failed: ${grpc.status[err.code]}: ${err.details}`);
  process.exitCode = 1;
});
call.on('end', () => {
  if (opt.json) console.log(JSON.stringify(result));
  else console.error(`\n[${result.finish_reason}]`);
  client.close();
});
