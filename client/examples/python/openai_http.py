#!/usr/bin/python3
"""The HTTP sibling of generate.py: one chat completion from dcformer-serve's OpenAI-compatible
front (--http-port), with only Python's standard library (http.client, json).

Prints the assistant's text (streamed as it arrives with --stream), then a line
"finish_reason=<reason> usage=<prompt>+<completion>".

  client/examples/python/openai_http.py --url http://127.0.0.1:8000 --stream "And God said"
  ... --api-key-file keys.txt --max-tokens 32 --temperature 0.8
"""
import argparse
import http.client
import json
import ssl
import sys
import urllib.parse

parser = argparse.ArgumentParser()
parser.add_argument("message", help="the user message")
parser.add_argument("--url", default="http://127.0.0.1:8000")
parser.add_argument("--model", help="default: the one /v1/models lists")
parser.add_argument("--max-tokens", type=int, default=32)
parser.add_argument("--temperature", type=float)
parser.add_argument("--stream", action="store_true")
parser.add_argument("--api-key-file", help="first line: the API key (sent as Bearer)")
parser.add_argument("--tls-ca", help="PEM CA of the server certificate (https URLs)")
args = parser.parse_args()

url = urllib.parse.urlsplit(args.url)
if url.scheme == "https":
    context = ssl.create_default_context(cafile=args.tls_ca)
    conn = http.client.HTTPSConnection(url.hostname, url.port or 443, context=context, timeout=60)
else:
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=60)
headers = {"Content-Type": "application/json"}
if args.api_key_file:
    with open(args.api_key_file) as f:
        headers["Authorization"] = "Bearer " + f.readline().strip()


def call(method, path, body=None):
    conn.request(method, path, body=json.dumps(body) if body is not None else None,
                 headers=headers)
    r = conn.getresponse()
    if r.status != 200:
        error = json.loads(r.read()).get("error", {})
        sys.exit(f"HTTP {r.status}: {error.get('message')} (param {error.get('param')})")
    return r


model = args.model or json.loads(call("GET", "/v1/models").read())["data"][0]["id"]
body = {"model": model, "max_tokens": args.max_tokens, "stream": args.stream,
        "messages": [{"role": "user", "content": args.message}]}
if args.temperature is not None:
    body["temperature"] = args.temperature
if args.stream:
    body["stream_options"] = {"include_usage": True}
r = call("POST", "/v1/chat/completions", body)
if not args.stream:
    answer = json.loads(r.read())
    choice = answer["choices"][0]
    print(choice["message"]["content"])
    finish, usage = choice["finish_reason"], answer["usage"]
else:
    finish, usage = None, None
    for line in r:  # SSE: "data: {json}" lines, a blank line after each, then "data: [DONE]"
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            sys.exit(f"stream error: {event['error']['message']}")
        for choice in event["choices"]:
            print(choice["delta"].get("content", ""), end="", flush=True)
            finish = choice["finish_reason"] or finish
        usage = event.get("usage") or usage
    print()
print(f"finish_reason={finish} usage={usage['prompt_tokens']}+{usage['completion_tokens']}")
