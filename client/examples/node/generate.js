#!/usr/bin/env node
// Minimal Node.js client of dcformer-serve: streams one Generate call and prints the text (or
// token ids, comma-separated) to stdout as it arrives, then a summary line on stderr like
// dcformer-cli's: [FINISH_REASON_LENGTH prompt_tokens=3 generated_tokens=16]. With --json it
// prints a single JSON object {token_ids, text, finish_reason, usage} on stdout instead. A
// failed call prints "generate failed: CODE: message" on stderr and exits 1.
//
//   node generate.js --target 127.0.0.1:50051 --prompt "Hello" --max-new-tokens 16
//   node generate.js --prompt-ids 1,2,3 --temperature 0 --ignore-eos --json
//   node generate.js --wait-ready --prompt "Hello"    # first wait for the server (60 s)
// Options: --api-key-file F, --tls-ca F (TLS), --timeout-ms N, --proto DIR (default
// ../../../proto), --wait-ready[=SECONDS] (wait, default 60 s, until the server listens and
// its health service reports SERVING: a server still loading its model).
// Its packages (@grpc/grpc-js, @grpc/proto-loader) are what package-lock.json pins;
// scripts/setup.sh installs them into node_modules here (npm ci).
'use strict';
const fs = require('fs');
const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { parseArgs } = require('util');

const DEFAULT_WAIT_READY_S = 60;
// A bare --wait-ready means the default wait (parseArgs has no optional values); followed by
// a number of seconds ("--wait-ready 5"), that number.
const argv = [];
for (let i = 2; i < process.argv.length; ++i) {
  const a = process.argv[i];
  if (a !== '--wait-ready') {
    argv.push(a);
  } else if (i + 1 < process.argv.length && /^[0-9.]+s?$/.test(process.argv[i + 1])) {
    argv.push(`${a}=${process.argv[++i]}`);
  } else {
    argv.push(`${a}=${DEFAULT_WAIT_READY_S}`);
  }
}
const { values: opt } = parseArgs({
  args: argv,
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
    'wait-ready': { type: 'string' },
    proto: { type: 'string', default: path.join(__dirname, '..', '..', '..', 'proto') },
    json: { type: 'boolean', default: false },
  },
});

const def = protoLoader.loadSync(['dcformer/v1/dcformer.proto', 'grpc/health/v1/health.proto'], {
  includeDirs: [opt.proto], keepCase: true, longs: Number, enums: String, defaults: true,
  oneofs: true,
});
const pkg = grpc.loadPackageDefinition(def);
const creds = opt['tls-ca']
  ? grpc.credentials.createSsl(fs.readFileSync(opt['tls-ca']))
  : grpc.credentials.createInsecure();
// Reconnect within a second once the server listens (gRPC's default backoff grows to 120 s).
const channelOptions = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
};
const client = new pkg.dcformer.v1.TextGeneration(opt.target, creds, channelOptions);

function fail(message) {
  console.error(message);
  process.exitCode = 1;
  client.close();
}

// Watches the standard health service with wait-for-ready until the server reports
// TextGeneration SERVING, then calls `done`; fails after `seconds`. A watch that ends early
// (the server restarted or drained: UNAVAILABLE, or it ended without SERVING) is watched
// again until the deadline, as dcformer-cli does.
function waitReady(seconds, done) {
  const health = new pkg.grpc.health.v1.Health(opt.target, creds, channelOptions);
  const deadline = Date.now() + seconds * 1000;
  let last = 'no answer';
  let ready = false;
  const giveUp = (why) => {
    health.close();
    fail(`the server at ${opt.target} was not SERVING within ${seconds} s ` +
         `(${why}; last status: ${last})`);
  };
  const again = (why) => {
    if (Date.now() >= deadline) giveUp(why);
    else setTimeout(watch, 100);
  };
  function watch() {
    const metadata = new grpc.Metadata({ waitForReady: true });
    const call = health.Watch({ service: 'dcformer.v1.TextGeneration' }, metadata,
      { deadline });
    let ended = false;
    call.on('data', (msg) => {
      last = msg.status;
      if (msg.status === 'SERVING' && !ready) {
        ready = true;
        call.cancel();
        health.close();
        done();
      }
    });
    call.on('error', (err) => {
      if (ready || ended) return;  // our own cancel
      ended = true;
      const why = `${grpc.status[err.code]}: ${err.details}`;
      if (err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.CANCELLED) again(why);
      else giveUp(why);
    });
    call.on('end', () => {
      if (ready || ended) return;
      ended = true;
      again('the watch ended');
    });
  }
  watch();
}

function generate() {
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
  let printed = false;
  const call = client.Generate(request, metadata, callOptions);
  call.on('data', (msg) => {
    if (!opt.json) {
      // Text when the response carries it; else the ids, comma-separated across messages.
      const piece = msg.text || msg.token_ids.map((id, i) =>
        (result.token_ids.length + i > 0 ? ',' : '') + id).join('');
      if (piece) {
        process.stdout.write(piece);
        printed = true;
      }
    }
    result.token_ids.push(...msg.token_ids);
    result.text += msg.text;
    if (msg.finish_reason !== 'FINISH_REASON_UNSPECIFIED') {
      result.finish_reason = msg.finish_reason;
      result.usage = msg.usage;
    }
  });
  // The call is over once every message was read ('end', or 'error' for a failed call) and its
  // status arrived ('status' comes for every call); report it then, once.
  let ended = false;
  let status = null;
  let reported = false;
  const finish = () => {
    if (!ended || status === null || reported) return;
    reported = true;
    report(status);
  };
  call.on('end', () => { ended = true; finish(); });
  call.on('error', () => { ended = true; finish(); });
  call.on('status', (s) => { status = s; finish(); });
  const report = (status) => {
    if (!opt.json && printed) process.stdout.write('\n');
    if (status.code !== grpc.status.OK) {
      fail(`generate failed: ${grpc.status[status.code]}: ${status.details}`);
      return;
    }
    if (opt.json) {
      console.log(JSON.stringify(result));
    } else {
      const usage = result.usage || {};
      console.error(`[${result.finish_reason} prompt_tokens=${usage.prompt_tokens} ` +
                    `generated_tokens=${usage.generated_tokens}]`);
    }
    client.close();
  };
}

if (opt['wait-ready'] !== undefined) {
  const seconds = Number(opt['wait-ready'].replace(/s$/, ''));
  if (!(seconds > 0)) {
    console.error(`--wait-ready: '${opt['wait-ready']}' is not a number of seconds > 0`);
    process.exit(2);
  }
  waitReady(seconds, generate);
} else {
  generate();
}
